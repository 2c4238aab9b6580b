"""Generate the hybrid (dynamic-range) TFLite fixtures of tests/test_tflite_hybrid.py.

Run with a TensorFlow environment (the tests themselves do not need it)::

    /work/venv-tf/bin/python tests/data/hybrid/generate.py

Each model is one small Keras/TF function with seeded random weights,
converted by the real TFLite converter with
``optimizations = [tf.lite.Optimize.DEFAULT]`` and no representative dataset:
int8 weights (the converter only quantizes weights of at least 1024
elements), float activations, i.e. TFLite's hybrid kernels. The converter
(TF 2.21) writes ``asymmetric_quantize_inputs = True`` on FULLY_CONNECTED
and BATCH_MATMUL (CONV_2D and DEPTHWISE_CONV_2D have no such option); the
``*_sym`` variants are the same files with that option flipped to False by
editing the flatbuffer (object API of the generated schema bindings), so both
input quantization schemes are covered (``*_pt_sym``: both edits).
``*_pt`` variants rewrite per-channel weight scales of a converted model into
one per-tensor scale (weights requantized), because the converter writes
per-channel scales (per-tensor CONV_2D takes TFLite's symmetric hybrid path).
``conv_2d_eqpc`` writes that per-tensor scale once per channel (all equal).
(The ``transpose_conv*_pt`` variants show that TRANSPOSE_CONV quantizes its
input asymmetrically with per-tensor weights too.) There is no per-tensor
DEPTHWISE_CONV_2D variant: LiteRT 2.3.0's hybrid
depthwise kernel reads one weight scale per output channel regardless
(out of bounds for a per-tensor scale) and outputs garbage.

``quantize_per_channel.tflite`` is built directly with the schema bindings: a
float -> int8 QUANTIZE whose output has per-channel scales along dimension
2 with nonzero zero points (a layout the converter does not produce here;
LiteRT runs it with its per-channel kernel).
"""

from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
_spec = importlib.util.spec_from_file_location(
    "tflite_generated", os.path.join(ROOT, "fbjax", "formats", "_generated", "tflite_generated.py"))
schema = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(schema)
import flatbuffers  # noqa: E402


def _w(rng, *shape, scale=0.2):
    return tf.constant(rng.normal(0.0, scale, shape).astype(np.float32))


def convert(fn, input_shapes):
    specs = [tf.TensorSpec(s, tf.float32) for s in input_shapes]
    cf = tf.function(fn).get_concrete_function(*specs)
    conv = tf.lite.TFLiteConverter.from_concrete_functions([cf], tf.function(fn))
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    return conv.convert()


def models():
    """name -> (function, input shapes)."""
    rng = np.random.default_rng(0)
    out = {}

    w, b = _w(rng, 48, 40), _w(rng, 40, scale=0.5)
    out["fully_connected"] = (lambda x: tf.nn.relu(tf.matmul(x, w) + b), [(5, 48)])
    w2, b2 = _w(rng, 64, 24), _w(rng, 24, scale=0.5)
    out["fully_connected_3d"] = (lambda x: tf.matmul(x, w2) + b2, [(2, 3, 64)])

    k, kb = _w(rng, 3, 3, 16, 12), _w(rng, 12, scale=0.5)
    out["conv_2d"] = (lambda x: tf.nn.relu6(tf.nn.conv2d(x, k, 1, "SAME") + kb), [(2, 7, 7, 16)])
    k2 = _w(rng, 3, 3, 16, 8)
    out["conv_2d_stride2"] = (
        lambda x: tf.nn.conv2d(x, k2, 2, "SAME"), [(1, 9, 8, 16)])
    k3 = _w(rng, 3, 3, 16, 8)
    out["conv_2d_dilated"] = (
        lambda x: tf.nn.conv2d(x, k3, 1, "VALID", dilations=2), [(2, 9, 9, 16)])
    k4 = _w(rng, 1, 1, 64, 32)
    out["conv_2d_1x1"] = (lambda x: tf.nn.conv2d(x, k4, 1, "VALID"), [(2, 4, 5, 64)])

    d, db = _w(rng, 3, 3, 64, 2), _w(rng, 128, scale=0.5)
    out["depthwise_conv_2d"] = (
        lambda x: tf.nn.relu(tf.nn.depthwise_conv2d(x, d, [1, 1, 1, 1], "SAME") + db), [(2, 6, 6, 64)])
    d2 = _w(rng, 3, 3, 128, 1)
    out["depthwise_conv_2d_stride2"] = (
        lambda x: tf.nn.depthwise_conv2d(x, d2, [1, 2, 2, 1], "SAME"), [(1, 7, 8, 128)])

    t, tb = _w(rng, 3, 3, 12, 16), _w(rng, 12, scale=0.5)
    out["transpose_conv"] = (
        lambda x: tf.nn.relu(tf.nn.conv2d_transpose(x, t, [2, 10, 10, 12], 2, "SAME") + tb), [(2, 5, 5, 16)])
    t2 = _w(rng, 4, 4, 8, 16)
    out["transpose_conv_valid"] = (
        lambda x: tf.nn.conv2d_transpose(x, t2, [1, 10, 10, 8], 2, "VALID"), [(1, 4, 4, 16)])

    m = _w(rng, 2, 32, 40)
    out["batch_matmul"] = (lambda x: tf.matmul(x, m), [(2, 3, 32)])
    return out


# --- flatbuffer edits ------------------------------------------------------------------

def _load(buf):
    return schema.ModelT.InitFromObj(schema.Model.GetRootAsModel(buf, 0))


def _save(model):
    b = flatbuffers.Builder(1024)
    b.Finish(model.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def _op_name(model, op):
    code = model.operatorCodes[op.opcodeIndex]
    c = max(code.builtinCode, code.deprecatedBuiltinCode)
    return {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}[c]


def describe(buf):
    model = _load(buf)
    lines = []
    for op in model.subgraphs[0].operators:
        opts = op.builtinOptions
        asym = getattr(opts, "asymmetricQuantizeInputs", None)
        ws = []
        for i in op.inputs:
            if i < 0:
                continue
            t = model.subgraphs[0].tensors[i]
            if t.type == schema.TensorType.INT8 and t.quantization is not None:
                ws.append(f"int8 w {len(t.quantization.scale)} scales")
        lines.append(f"{_op_name(model, op)} asym={asym} {' '.join(ws)}")
    return "; ".join(lines)


def set_asymmetric(buf, value):
    model = _load(buf)
    n = 0
    for op in model.subgraphs[0].operators:
        if hasattr(op.builtinOptions, "asymmetricQuantizeInputs"):
            op.builtinOptions.asymmetricQuantizeInputs = bool(value)
            n += 1
    assert n, "no op with asymmetric_quantize_inputs"
    return _save(model)


def per_tensor(buf):
    """Requantize per-channel int8 weights to one symmetric per-tensor scale."""
    model = _load(buf)
    sg = model.subgraphs[0]
    n = 0
    for t in sg.tensors:
        q = t.quantization
        if t.type != schema.TensorType.INT8 or q is None or q.scale is None or len(q.scale) < 2:
            continue
        data = np.frombuffer(bytes(bytearray(model.buffers[t.buffer].data)), np.int8).reshape(t.shape)
        sc = np.asarray(q.scale, np.float32)
        shape = [1] * data.ndim
        shape[q.quantizedDimension] = sc.size
        real = data.astype(np.float32) * sc.reshape(shape)
        s = np.float32(np.abs(real).max() / 127.0)
        qd = np.clip(np.round(real / s), -127, 127).astype(np.int8)
        model.buffers[t.buffer].data = np.frombuffer(qd.tobytes(), np.uint8)
        q.scale, q.zeroPoint, q.quantizedDimension = [float(s)], [0], 0
        n += 1
    assert n, "no per-channel weights"
    return _save(model)


def equal_channel_scales(buf):
    """The per-tensor weights of ``buf`` written as per-channel scales that
    are all equal (TFLite's CONV_2D then takes its per-tensor, symmetric
    hybrid path)."""
    model = _load(buf)
    for op in model.subgraphs[0].operators:
        t = model.subgraphs[0].tensors[op.inputs[1]]
        q = t.quantization
        n = t.shape[0]
        q.scale, q.zeroPoint, q.quantizedDimension = [q.scale[0]] * n, [0] * n, 0
    return _save(model)


def quantize_per_channel():
    """float32 [2, 3, 4, 5] -> int8 QUANTIZE with 4 scales along dimension 2."""
    m = schema.ModelT()
    m.version = 3
    code = schema.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.QUANTIZE
    m.operatorCodes = [code]
    m.buffers = [schema.BufferT(), schema.BufferT(), schema.BufferT()]
    x = schema.TensorT()
    x.shape, x.type, x.buffer, x.name = [2, 3, 4, 5], schema.TensorType.FLOAT32, 1, "input"
    y = schema.TensorT()
    y.shape, y.type, y.buffer, y.name = [2, 3, 4, 5], schema.TensorType.INT8, 2, "output"
    q = schema.QuantizationParametersT()
    q.scale = [0.01, 0.0173, 0.05, 0.003]
    q.zeroPoint = [0, 3, -7, 0]
    q.quantizedDimension = 2
    y.quantization = q
    op = schema.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = 0, [0], [1]
    op.builtinOptionsType = schema.BuiltinOptions.QuantizeOptions
    op.builtinOptions = schema.QuantizeOptionsT()
    sg = schema.SubGraphT()
    sg.tensors, sg.inputs, sg.outputs, sg.operators, sg.name = [x, y], [0], [1], [op], "main"
    m.subgraphs = [sg]
    m.description = "tests/data/hybrid/generate.py: per-channel QUANTIZE"
    return _save(m)


def main():
    written = {}
    for name, (fn, shapes) in models().items():
        buf = convert(fn, shapes)
        written[name] = buf
        info = describe(buf)
        if "asym=True" in info:
            written[name + "_sym"] = set_asymmetric(buf, False)
        elif "asym=False" in info:
            written[name + "_asym"] = set_asymmetric(buf, True)
        if not name.startswith("depthwise") and any(f"{k} scales" in info for k in range(2, 1000)):
            written[name + "_pt"] = per_tensor(buf)
            if "asym=True" in info:
                written[name + "_pt_sym"] = set_asymmetric(written[name + "_pt"], False)
            if name == "conv_2d":
                written[name + "_eqpc"] = equal_channel_scales(written[name + "_pt"])
    written["quantize_per_channel"] = quantize_per_channel()
    for name, buf in written.items():
        with open(os.path.join(HERE, name + ".tflite"), "wb") as f:
            f.write(buf)
        print(f"{name}: {len(buf)} bytes: {describe(buf)}")


if __name__ == "__main__":
    sys.exit(main())
