"""Write the per-builtin ``.tflite`` fixtures with the real TFLite converter.

Run with a Python that has ``tensorflow-cpu`` (never needed by the tests):

    python tests/data/tflite_builtins/generate.py

Each case is a tiny ``tf.function`` converted with
``tf.lite.TFLiteConverter.from_concrete_functions`` (builtin ops only). The
script writes ``<case>.tflite`` next to itself and ``manifest.json``, which
records, per case, the builtin under test, every op code in the converted
model (read back with LiteRT), the input specs (shape, dtype and value
"kind" the test draws from), the tolerance and the suite that tests it
(``builtins``, ``control``, ``state``, ``random``, ``detection``). A case
whose converted model does not contain the intended op is reported and not
written. ``python generate.py NAME...`` regenerates only those cases.

Ops the converter never emits (legacy RNN/LSTM/SVDF kernels, CALL, L2_POOL_2D,
EMBEDDING_LOOKUP(_SPARSE), DILATE, REDUCE_WINDOW, the detection post-processing
custom op...) are written with fbjax's own TFLite writer by

    PYTHONPATH=. /work/venv/bin/python tests/data/tflite_builtins/generate.py --builder

(no TensorFlow needed); those manifest entries carry ``made_by:
fbjax.formats.tflite_builder`` and are kept only when LiteRT can run them (except CALL,
which LiteRT lacks: its oracle is numpy, see tests/test_tflite_control.py).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

if sys.argv[1:2] != ["--builder"]:
    import tensorflow as tf
else:  # builder mode needs fbjax, not TF: the TF cases below are defined but never converted

    class _NoTF:
        def __getattr__(self, name):
            return self

        def __call__(self, *a, **k):
            return self

    tf = _NoTF()

F = "float32"
HERE = os.path.dirname(os.path.abspath(__file__))
EW, RED = 1e-5, 1e-4  # issue 3: element-wise ops / reductions and convolutions

CASES = []


def case(name, op, inputs, rtol=EW, **kw):
    """Register ``fn`` converted with ``inputs = [(shape, dtype, kind)]``."""
    def deco(fn):
        CASES.append(dict(name=name, op=op, inputs=inputs, rtol=rtol, fn=fn, **kw))
        return fn
    return deco


F = "float32"
X = [((2, 3, 4), F, "normal")]
XY = [((2, 3, 4), F, "normal"), ((3, 4), F, "normal")]


def unary(name, op, f, kind="normal", dtype=F, shape=(2, 3, 4), rtol=EW):
    case(name, op, [(shape, dtype, kind)], rtol)(f)


def binary(name, op, f, kind=("normal", "normal"), dtype=F, rtol=EW):
    case(name, op, [((2, 3, 4), dtype, kind[0]), ((3, 4), dtype, kind[1])], rtol)(f)


# --- element-wise math -------------------------------------------------------
unary("abs", "ABS", tf.abs)
unary("ceil", "CEIL", tf.math.ceil)
unary("floor", "FLOOR", tf.math.floor)
unary("round", "ROUND", tf.math.round, kind="halves")
unary("cos", "COS", tf.cos)
unary("sin", "SIN", tf.sin)
unary("exp", "EXP", tf.exp)
unary("log", "LOG", tf.math.log, kind="pos")
unary("sqrt", "SQRT", tf.sqrt, kind="pos")
unary("rsqrt", "RSQRT", tf.math.rsqrt, kind="pos")
unary("square", "SQUARE", tf.square)
unary("neg", "NEG", tf.negative)
unary("sign", "SIGN", tf.sign)
unary("elu", "ELU", tf.nn.elu)
unary("leaky_relu", "LEAKY_RELU", lambda x: tf.nn.leaky_relu(x, alpha=0.3))
unary("gelu", "GELU", lambda x: tf.nn.gelu(x, approximate=False))
unary("gelu_approx", "GELU", lambda x: tf.nn.gelu(x, approximate=True))
unary("softmax", "SOFTMAX", tf.nn.softmax)
unary("softmax_beta", "SOFTMAX", lambda x: tf.nn.softmax(x * 0.5))
unary("log_softmax", "LOG_SOFTMAX", tf.nn.log_softmax)
unary("relu", "RELU", tf.nn.relu)
unary("relu6", "RELU6", tf.nn.relu6)
unary("tanh", "TANH", tf.tanh)
unary("logistic", "LOGISTIC", tf.sigmoid)
unary("hard_swish", "HARD_SWISH", lambda x: x * tf.nn.relu6(x + 3) / 6)
unary("zeros_like", "ZEROS_LIKE", lambda x: tf.zeros_like(x) + 0 * x[..., :1] if False else tf.raw_ops.ZerosLike(x=x))
unary("cast_f2i", "CAST", lambda x: tf.cast(x * 3, tf.int32))
unary("cast_i2f", "CAST", lambda x: tf.cast(x, tf.float32), kind="int", dtype="int32")
unary("logical_not", "LOGICAL_NOT", tf.logical_not, kind="bool", dtype="bool")
unary("abs_int", "ABS", tf.abs, kind="int", dtype="int32")
unary("neg_int", "NEG", tf.negative, kind="int", dtype="int32")
binary("maximum", "MAXIMUM", tf.maximum)
binary("minimum", "MINIMUM", tf.minimum)
binary("pow", "POW", tf.pow, kind=("pos", "normal"))
binary("pow_int", "POW", tf.pow, kind=("int", "smallpos"), dtype="int32")
binary("squared_difference", "SQUARED_DIFFERENCE", tf.math.squared_difference)
binary("floor_div", "FLOOR_DIV", tf.math.floordiv, kind=("normal", "nonzero"))
binary("floor_div_int", "FLOOR_DIV", tf.math.floordiv, kind=("int", "nonzero_int"), dtype="int32")
binary("floor_mod", "FLOOR_MOD", tf.math.floormod, kind=("normal", "nonzero"))
binary("floor_mod_int", "FLOOR_MOD", tf.math.floormod, kind=("int", "nonzero_int"), dtype="int32")
case("atan2", "ATAN2", [((2, 3, 4), F, "normal")] * 2)(tf.atan2)
binary("add", "ADD", tf.add)
binary("sub", "SUB", tf.subtract)
binary("mul", "MUL", tf.multiply)
binary("div", "DIV", tf.divide, kind=("normal", "nonzero"))
binary("equal", "EQUAL", tf.equal, kind=("int", "int"), dtype="int32")
binary("not_equal", "NOT_EQUAL", tf.not_equal, kind=("int", "int"), dtype="int32")
binary("less", "LESS", tf.less)
binary("less_equal", "LESS_EQUAL", tf.less_equal, kind=("int", "int"), dtype="int32")
binary("greater", "GREATER", tf.greater)
binary("greater_equal", "GREATER_EQUAL", tf.greater_equal, kind=("int", "int"), dtype="int32")
binary("logical_and", "LOGICAL_AND", tf.logical_and, kind=("bool", "bool"), dtype="bool")
binary("logical_or", "LOGICAL_OR", tf.logical_or, kind=("bool", "bool"), dtype="bool")
binary("bitwise_xor", "BITWISE_XOR", tf.bitwise.bitwise_xor, kind=("int", "int"), dtype="int32")
binary("right_shift", "RIGHT_SHIFT", tf.bitwise.right_shift, kind=("int", "smallpos"), dtype="int32")
case("add_n", "ADD_N", [((2, 3), F, "normal")] * 3)(lambda a, b, c: tf.math.add_n([a, b, c]))
case("select_v2", "SELECT_V2", [((2, 3, 4), "bool", "bool"), ((2, 3, 4), F, "normal"), ((3, 4), F, "normal")])(
    lambda c, a, b: tf.where(c, a, b))
case("select", "SELECT", [((2, 3), "bool", "bool"), ((2, 3), F, "normal"), ((2, 3), F, "normal")])(
    lambda c, a, b: tf.raw_ops.Select(condition=c, x=a, y=b))
case("bitcast", "BITCAST", [((2, 3), F, "normal")])(lambda x: tf.bitcast(x, tf.int32))
case("complex", "COMPLEX_ABS", [((2, 8), F, "normal")], rtol=RED)(
    lambda x: tf.abs(tf.signal.rfft2d(x)))
case("real_imag", "REAL", [((2, 8), F, "normal")], rtol=RED)(
    lambda x: (tf.math.real(tf.signal.rfft2d(x)), tf.math.imag(tf.signal.rfft2d(x))))
case("rfft2d", "RFFT2D", [((3, 4, 8), F, "normal")], rtol=RED)(
    lambda x: tf.math.real(tf.signal.rfft2d(x)) + tf.math.imag(tf.signal.rfft2d(x)))

# --- reductions --------------------------------------------------------------
for nm, op, f in [("sum", "SUM", tf.reduce_sum), ("mean", "MEAN", tf.reduce_mean),
                  ("reduce_prod", "REDUCE_PROD", tf.reduce_prod), ("reduce_max", "REDUCE_MAX", tf.reduce_max),
                  ("reduce_min", "REDUCE_MIN", tf.reduce_min)]:
    case(nm, op, X, RED)(lambda x, f=f: f(x, axis=[1, -1]))
    case(nm + "_keep", op, X, RED)(lambda x, f=f: f(x, axis=1, keepdims=True))
case("reduce_any", "REDUCE_ANY", [((2, 3, 4), "bool", "bool")])(lambda x: tf.reduce_any(x, axis=2))
case("reduce_all", "REDUCE_ALL", [((2, 3, 4), "bool", "bool")])(lambda x: tf.reduce_all(x, axis=[0, 2], keepdims=True))
case("arg_max", "ARG_MAX", X)(lambda x: tf.argmax(x, axis=1))
case("arg_min", "ARG_MIN", X)(lambda x: tf.argmin(x, axis=-1, output_type=tf.int32))
case("cumsum", "CUMSUM", X, RED)(lambda x: tf.cumsum(x, axis=1))
case("cumsum_excl_rev", "CUMSUM", X, RED)(lambda x: tf.cumsum(x, axis=2, exclusive=True, reverse=True))

# --- array ops ---------------------------------------------------------------
case("tile", "TILE", X)(lambda x: tf.tile(x, [2, 1, 3]))
case("broadcast_to", "BROADCAST_TO", [((3, 1), F, "normal")])(lambda x: tf.broadcast_to(x, [2, 3, 4]))
case("shape", "SHAPE", [((2, 3, 4), F, "normal")], dyn=True)(lambda x: tf.shape(x))
case("fill", "FILL", [((1,), F, "normal")])(lambda v: tf.fill([2, 3], v[0]))
case("range", "RANGE", [((3, 2), F, "normal")], dyn=True)(
    lambda x: tf.cast(tf.range(1, tf.shape(x)[0] * 3, 2), tf.float32)[:, None] * x[:1])
case("pack", "PACK", [((2, 3), F, "normal")] * 2)(lambda a, b: tf.stack([a, b], axis=1))
case("unpack", "UNPACK", X)(lambda x: tf.unstack(x, axis=1))
case("split", "SPLIT", X)(lambda x: tf.split(x, 2, axis=2))
case("split_v", "SPLIT_V", X)(lambda x: tf.split(x, [1, 3], axis=-1))
case("squeeze", "SQUEEZE", [((2, 1, 4, 1), F, "normal")], dyn=True)(lambda x: tf.squeeze(x))
case("expand_dims", "EXPAND_DIMS", X, dyn=True)(lambda x: tf.expand_dims(x, -2))
case("transpose", "TRANSPOSE", X)(lambda x: tf.transpose(x, [2, 0, 1]))
case("slice", "SLICE", X)(lambda x: tf.slice(x, [1, 0, 1], [1, -1, 2]))
case("reverse_v2", "REVERSE_V2", X)(lambda x: tf.reverse(x, [1]))
case("reverse_sequence", "REVERSE_SEQUENCE", [((3, 5, 2), F, "normal")])(
    lambda x: tf.reverse_sequence(x, [2, 5, 0], seq_axis=1, batch_axis=0))
case("mirror_pad_reflect", "MIRROR_PAD", X)(lambda x: tf.pad(x, [[0, 1], [1, 2], [2, 0]], mode="REFLECT"))
case("mirror_pad_symmetric", "MIRROR_PAD", X)(lambda x: tf.pad(x, [[1, 0], [2, 1], [0, 3]], mode="SYMMETRIC"))
case("padv2", "PADV2", X)(lambda x: tf.pad(x, [[0, 1], [1, 2], [2, 0]], constant_values=1.5))
case("pad", "PAD", X)(lambda x: tf.pad(x, [[0, 1], [1, 2], [2, 0]]))
case("space_to_depth", "SPACE_TO_DEPTH", [((1, 4, 6, 3), F, "normal")])(lambda x: tf.nn.space_to_depth(x, 2))
case("depth_to_space", "DEPTH_TO_SPACE", [((1, 2, 3, 8), F, "normal")])(lambda x: tf.nn.depth_to_space(x, 2))
case("space_to_batch_nd", "SPACE_TO_BATCH_ND", [((2, 4, 5, 3), F, "normal")])(
    lambda x: tf.space_to_batch_nd(x, [2, 3], [[0, 0], [1, 0]]))
case("batch_to_space_nd", "BATCH_TO_SPACE_ND", [((12, 2, 2, 3), F, "normal")])(
    lambda x: tf.batch_to_space(x, [2, 3], [[0, 1], [1, 2]]))
case("matrix_diag", "MATRIX_DIAG", [((2, 3), F, "normal")])(lambda x: tf.linalg.diag(x))
case("matrix_set_diag", "MATRIX_SET_DIAG", [((2, 3, 4), F, "normal"), ((2, 3), F, "normal")])(
    lambda x, d: tf.linalg.set_diag(x, d))
case("concatenation", "CONCATENATION", [((2, 3), F, "normal")] * 2)(lambda a, b: tf.concat([a, b], 1))
case("reshape", "RESHAPE", X)(lambda x: tf.reshape(x, [4, -1]))
case("strided_slice", "STRIDED_SLICE", X)(lambda x: x[:, ::-2, 1:])

case("sparse_to_dense", "SPARSE_TO_DENSE", [((3,), F, "normal")])(
    lambda v: tf.raw_ops.SparseToDense(sparse_indices=tf.constant([[0, 1], [1, 3], [2, 0]]), output_shape=[3, 4],
                                       sparse_values=v, default_value=0.25))
# --- gather / scatter / segment ----------------------------------------------
case("gather", "GATHER", [((5, 3), F, "normal"), ((2, 4), "int32", "idx5")])(lambda p, i: tf.gather(p, i))
case("gather_axis", "GATHER", [((2, 5, 3), F, "normal"), ((4,), "int32", "idx5")])(
    lambda p, i: tf.gather(p, i, axis=1))
case("gather_batch", "GATHER", [((2, 5, 3), F, "normal"), ((2, 4), "int32", "idx5")])(
    lambda p, i: tf.gather(p, i, axis=1, batch_dims=1))
case("gather_nd", "GATHER_ND", [((4, 5, 3), F, "normal"), ((2, 2), "int32", "idx4")])(
    lambda p, i: tf.gather_nd(p, i))
case("scatter_nd", "SCATTER_ND", [((3, 1), "int32", "perm6"), ((3, 4), F, "normal")])(
    lambda i, u: tf.scatter_nd(i, u, [6, 4]))
case("one_hot", "ONE_HOT", [((2, 3), "int32", "idx5")])(lambda i: tf.one_hot(i, 5, 2.0, -1.0, axis=1))
case("topk_v2", "TOPK_V2", [((3, 7), F, "normal")])(lambda x: tf.math.top_k(x, 3))
case("segment_sum", "SEGMENT_SUM", [((5, 3), F, "normal")])(
    lambda x: tf.math.segment_sum(x, tf.constant([0, 0, 1, 2, 2])))
for nm, op, f in [("unsorted_segment_sum", "UNSORTED_SEGMENT_SUM", tf.math.unsorted_segment_sum),
                  ("unsorted_segment_prod", "UNSORTED_SEGMENT_PROD", tf.math.unsorted_segment_prod),
                  ("unsorted_segment_max", "UNSORTED_SEGMENT_MAX", tf.math.unsorted_segment_max),
                  ("unsorted_segment_min", "UNSORTED_SEGMENT_MIN", tf.math.unsorted_segment_min)]:
    case(nm, op, [((6, 2), F, "normal"), ((6,), "int32", "idx3")])(lambda x, i, f=f: f(x, i, 4))
case("bucketize", "BUCKETIZE", X)(lambda x: tf.raw_ops.Bucketize(input=x, boundaries=[-1.0, 0.0, 0.5, 2.0]))
case("dynamic_update_slice", "DYNAMIC_UPDATE_SLICE",
     [((4, 5), F, "normal"), ((2, 3), F, "normal"), ((2,), "int32", "idx3")])(
    lambda x, u, i: tf.raw_ops.XlaDynamicUpdateSlice(input=x, update=u, indices=i) if False else
    tf.compiler.tf2xla.experimental.xla.dynamic_update_slice(x, u, i) if False else
    _dus(x, u, i))


def _dus(x, u, i):
    from tensorflow.compiler.tf2xla.python import xla
    return xla.dynamic_update_slice(x, u, i)


_PRELU = tf.keras.layers.PReLU(alpha_initializer=tf.constant_initializer(np.linspace(0.1, 0.4, 4)), shared_axes=[1])


# --- nn ----------------------------------------------------------------------
NHWC = [((1, 5, 6, 3), F, "normal")]
case("batch_matmul", "BATCH_MATMUL", [((2, 3, 4), F, "normal"), ((2, 4, 5), F, "normal")], RED)(
    lambda a, b: tf.matmul(a, b))
case("batch_matmul_adj", "BATCH_MATMUL", [((2, 1, 4, 3), F, "normal"), ((3, 5, 4), F, "normal")], RED)(
    lambda a, b: tf.matmul(a, b, adjoint_a=True, adjoint_b=True))
case("l2_normalization", "L2_NORMALIZATION", X)(lambda x: tf.math.l2_normalize(x, axis=-1))
case("local_response_normalization", "LOCAL_RESPONSE_NORMALIZATION", NHWC, RED)(
    lambda x: tf.nn.local_response_normalization(x, depth_radius=1, bias=1.5, alpha=0.3, beta=0.6))
case("max_pool_2d", "MAX_POOL_2D", NHWC)(lambda x: tf.nn.max_pool2d(x, 3, 2, "SAME"))
case("average_pool_2d", "AVERAGE_POOL_2D", NHWC, RED)(lambda x: tf.nn.avg_pool2d(x, 3, 2, "VALID"))
_W = np.random.default_rng(0).standard_normal((3, 3, 4, 3)).astype(np.float32)  # HWOI for transpose
_B = np.random.default_rng(1).standard_normal((4,)).astype(np.float32)
case("transpose_conv_same", "TRANSPOSE_CONV", NHWC, RED)(
    lambda x: tf.nn.conv2d_transpose(x, _W, [1, 10, 12, 4], 2, "SAME"))
case("transpose_conv_valid_bias_relu", "TRANSPOSE_CONV", NHWC, RED)(
    lambda x: tf.nn.relu(tf.nn.conv2d_transpose(x, _W, [1, 11, 13, 4], 2, "VALID") + _B))
_W3 = np.random.default_rng(2).standard_normal((2, 3, 3, 3, 4)).astype(np.float32)
NDHWC = [((1, 4, 5, 6, 3), F, "normal")]
case("conv_3d", "CONV_3D", NDHWC, RED)(lambda x: tf.nn.conv3d(x, _W3, [1, 1, 2, 1, 1], "SAME"))
_W3T = np.random.default_rng(3).standard_normal((2, 3, 3, 4, 3)).astype(np.float32)
case("conv_3d_transpose", "CONV_3D_TRANSPOSE", NDHWC, RED)(
    lambda x: tf.nn.conv3d_transpose(x, _W3T, [1, 8, 10, 6, 4], [1, 2, 2, 1, 1], "SAME"))
_WC = np.random.default_rng(4).standard_normal((3, 3, 3, 5)).astype(np.float32)
case("conv_2d", "CONV_2D", NHWC, RED)(lambda x: tf.nn.relu6(tf.nn.conv2d(x, _WC, 2, "SAME")))
_WD = np.random.default_rng(5).standard_normal((3, 3, 3, 2)).astype(np.float32)
case("depthwise_conv_2d", "DEPTHWISE_CONV_2D", NHWC, RED)(lambda x: tf.nn.depthwise_conv2d(x, _WD, [1, 1, 1, 1], "VALID"))
_WF = np.random.default_rng(6).standard_normal((4, 5)).astype(np.float32)
case("fully_connected", "FULLY_CONNECTED", [((3, 4), F, "normal")], RED)(lambda x: tf.matmul(x, _WF))
case("resize_bilinear", "RESIZE_BILINEAR", NHWC)(lambda x: tf.image.resize(x, [7, 9], "bilinear"))
case("resize_nearest_neighbor", "RESIZE_NEAREST_NEIGHBOR", NHWC)(lambda x: tf.image.resize(x, [7, 9], "nearest"))
case("conv_2d_dynamic_batch", "CONV_2D", NHWC, RED, dyn=True)(lambda x: tf.nn.relu6(tf.nn.conv2d(x, _WC, 2, "SAME")))
case("softmax_dynamic_batch", "SOFTMAX", X, dyn=True)(tf.nn.softmax)
case("batch_matmul_dynamic_batch", "BATCH_MATMUL", [((2, 3, 4), F, "normal"), ((2, 4, 5), F, "normal")], RED,
     dyn=True)(lambda a, b: tf.matmul(a, b))
case("prelu", "PRELU", X)(lambda x: _PRELU(x))

# --- non max suppression -----------------------------------------------------
case("non_max_suppression_v4", "NON_MAX_SUPPRESSION_V4", [((6, 4), F, "boxes"), ((6,), F, "uniform")])(
    lambda b, s: tf.raw_ops.NonMaxSuppressionV4(boxes=b, scores=s, max_output_size=4, iou_threshold=0.5,
                                                 score_threshold=0.2, pad_to_max_output_size=True))
case("non_max_suppression_v5", "NON_MAX_SUPPRESSION_V5", [((6, 4), F, "boxes"), ((6,), F, "uniform")])(
    lambda b, s: tf.raw_ops.NonMaxSuppressionV5(boxes=b, scores=s, max_output_size=4, iou_threshold=0.5,
                                                 score_threshold=0.2, soft_nms_sigma=0.0,
                                                 pad_to_max_output_size=True))


case("non_max_suppression_v5_soft", "NON_MAX_SUPPRESSION_V5", [((8, 4), F, "boxes"), ((8,), F, "uniform")])(
    lambda b, s: tf.raw_ops.NonMaxSuppressionV5(boxes=b, scores=s, max_output_size=5, iou_threshold=0.6,
                                                 score_threshold=0.1, soft_nms_sigma=0.5,
                                                 pad_to_max_output_size=True))


# --- random ops (statistical tests) -----------------------------------------
case("random_standard_normal", "RANDOM_STANDARD_NORMAL", [((1,), F, "normal")], suite="random")(
    lambda x: tf.random.normal([64, 64], seed=7) + 0 * x)
case("random_uniform", "RANDOM_UNIFORM", [((1,), F, "normal")], suite="random")(
    lambda x: tf.random.uniform([64, 64], seed=8) + 0 * x)
case("multinomial", "MULTINOMIAL", [((2, 3), F, "normal")], suite="random")(
    lambda x: tf.random.categorical(x, 2000, seed=9))


# --- control flow (tests/test_tflite_control.py) -----------------------------
def _while(x, n):
    i = tf.constant(0)
    _, y = tf.while_loop(lambda i, y: i < n[0], lambda i, y: (i + 1, y * 0.9 + tf.sin(y)), (i, x))
    return y


case("while_input_trip_count", "WHILE", [((2, 3), F, "normal"), ((1,), "int32", "idx6")], suite="control")(_while)


def _while_cond_on_data(x):
    y = tf.while_loop(lambda y: tf.reduce_sum(tf.abs(y)) < 100.0, lambda y: y * 1.7 + 0.1, [x])
    return y[0] if isinstance(y, (list, tuple)) else y


case("while_data_dependent", "WHILE", [((4,), F, "normal")], suite="control")(_while_cond_on_data)


def _nested_if(x, p, q):
    def inner_true():
        return tf.cond(q[0], lambda: x * 2.0, lambda: tf.exp(x))

    return tf.cond(p[0], inner_true, lambda: x - 1.0)


case("nested_if", "IF", [((2, 3), F, "normal"), ((1,), "bool", "bool"), ((1,), "bool", "bool")],
     suite="control")(_nested_if)


_WFC = np.random.default_rng(7).standard_normal((8, 6)).astype(np.float32)
_WSP = _WFC * (np.random.default_rng(8).uniform(size=(8, 6)) < 0.15)
case("dequantize_fp16", "DEQUANTIZE", [((3, 8), F, "normal")], RED, fp16=True)(lambda x: tf.matmul(x, _WFC))
case("densify", "DENSIFY", [((3, 8), F, "normal")], RED, sparse=True)(lambda x: tf.matmul(x, _WSP))


# Keras recurrent layers: the converter turns them into WHILE loops
def _keras(layer_fn):
    def make():
        tf.keras.utils.set_random_seed(0)
        return layer_fn()
    return make


case("keras_lstm", "WHILE", [((2, 5, 3), F, "normal")], RED, suite="control", keras=True)(
    _keras(lambda: tf.keras.layers.LSTM(4, return_sequences=True)))
case("keras_gru", "WHILE", [((2, 5, 3), F, "normal")], RED, suite="control", keras=True)(
    _keras(lambda: tf.keras.layers.GRU(4)))
case("keras_bidirectional_lstm", "WHILE", [((2, 5, 3), F, "normal")], RED, suite="control", keras=True)(
    _keras(lambda: tf.keras.layers.Bidirectional(tf.keras.layers.LSTM(4, return_sequences=True))))
case("keras_simple_rnn", "WHILE", [((2, 5, 3), F, "normal")], RED, suite="control", keras=True)(
    _keras(lambda: tf.keras.layers.SimpleRNN(4, return_sequences=True)))


class _Acc(tf.Module if "Module" in dir(tf) else object):
    """A model with state: an accumulator and a step counter (resource variables)."""

    def __init__(self):
        super().__init__()
        self.total = tf.Variable(tf.fill([2, 3], 0.5))
        self.steps = tf.Variable(0.0)

    def __call__(self, x):
        self.total.assign(self.total * 0.5 + x)
        self.steps.assign_add(1.0)
        return self.total.read_value() * self.steps.read_value()


case("resource_variables", "ASSIGN_VARIABLE", [((2, 3), F, "normal")], suite="state", resource=True)(_Acc)


def convert(c):
    if c.get("resource"):
        mod = c["fn"]()
        sig = [tf.TensorSpec(s, getattr(tf, d)) for s, d, _ in c["inputs"]]
        fn = tf.function(mod.__call__, input_signature=sig, autograph=False)
        conv = tf.lite.TFLiteConverter.from_concrete_functions([fn.get_concrete_function()], mod)
        conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        conv.experimental_enable_resource_variables = True
        return conv.convert()
    if c.get("keras"):
        (shape, _, _), = c["inputs"]
        inp = tf.keras.Input(shape=shape[1:], batch_size=shape[0])
        conv = tf.lite.TFLiteConverter.from_keras_model(tf.keras.Model(inp, c["fn"]()(inp)))
        conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        return conv.convert()
    sig = [tf.TensorSpec((None,) + tuple(s[1:]) if c.get("dyn") and len(s) else s, getattr(tf, d))
           for s, d, _ in c["inputs"]]
    fn = tf.function(c["fn"], input_signature=sig, autograph=False)
    conc = fn.get_concrete_function()
    conv = tf.lite.TFLiteConverter.from_concrete_functions([conc], fn)
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    if c.get("fp16"):  # float16 weights + DEQUANTIZE
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.target_spec.supported_types = [tf.float16]
    if c.get("sparse"):  # sparse weights + DENSIFY
        conv.optimizations = [tf.lite.Optimize.EXPERIMENTAL_SPARSITY]
    return conv.convert()


def ops_of(model: bytes):
    from ai_edge_litert.interpreter import Interpreter
    it = Interpreter(model_content=model)
    return sorted({d["op_name"] for d in it._get_ops_details()})


def main(only=None):
    path = os.path.join(HERE, "manifest.json")
    manifest = json.load(open(path)) if os.path.exists(path) and only else {}
    bad = []
    for c in CASES:
        if only and c["name"] not in only:
            continue
        try:
            m = convert(c)
            ops = ops_of(m)
        except Exception as e:  # noqa: BLE001 - report and continue
            bad.append((c["name"], f"{type(e).__name__}: {str(e)[:200]}"))
            continue
        if c["op"] not in ops:
            bad.append((c["name"], f"converted ops {ops} lack {c['op']}"))
            continue
        with open(os.path.join(HERE, c["name"] + ".tflite"), "wb") as f:
            f.write(m)
        manifest[c["name"]] = dict(op=c["op"], ops=ops, rtol=c["rtol"], suite=c.get("suite", "builtins"),
                                   dynamic_batch=bool(c.get("dyn")),
                                   inputs=[[list(s), d, k] for s, d, k in c["inputs"]])
    with open(path, "w") as f:
        json.dump(dict(sorted(manifest.items())), f, indent=1)
    for n, why in bad:
        print("NOT WRITTEN", n, why)
    print(len(manifest), "cases in manifest")


# --- ops the converter never emits: models written with fbjax.formats.tflite_builder --------
# (run as `python generate.py --builder` with fbjax's environment; no TF needed)

def builder_cases():
    """``(name, op, model bytes, inputs spec)`` for ops the converter does not produce."""
    from fbjax.formats.tflite_builder import single_op_model as som

    i32 = np.int32
    yield "embedding_lookup", "EMBEDDING_LOOKUP", som(
        "EMBEDDING_LOOKUP", [(4,), (5, 3)], input_dtypes=[i32, np.float32], output_shapes=[(4, 3)]), \
        [((4,), "int32", "idx5"), ((5, 3), F, "normal")]
    yield "l2_pool_2d", "L2_POOL_2D", som(
        "L2_POOL_2D", [(1, 5, 6, 3)], dict(padding="SAME", stride_w=2, stride_h=2, filter_width=3,
                                          filter_height=2), output_shapes=[(1, 3, 3, 3)]), \
        [((1, 5, 6, 3), F, "normal")]
    yield "relu_n1_to_1", "RELU_N1_TO_1", som("RELU_N1_TO_1", [(2, 3, 4)]), [((2, 3, 4), F, "normal")]
    yield "relu_0_to_1", "RELU_0_TO_1", som("RELU_0_TO_1", [(2, 3, 4)]), [((2, 3, 4), F, "normal")]
    yield "rank", "RANK", som("RANK", [(2, 3, 4)], output_shapes=[()], output_dtypes=[i32]), \
        [((2, 3, 4), F, "normal")]
    yield "where", "WHERE", som("WHERE", [np.array([[True, False, True], [False, False, True]])],
                                output_shapes=[(3, 2)], output_dtypes=[np.int64]), []
    yield "broadcast_args", "BROADCAST_ARGS", som(
        "BROADCAST_ARGS", [np.array([2, 1, 4], i32), np.array([3, 1], i32)], output_shapes=[(3,)],
        output_dtypes=[i32]), []
    yield "dilate", "DILATE", som("DILATE", [(2, 3), np.array([2, 3], i32), np.array(-1.5, np.float32)],
                                  output_shapes=[(3, 7)]), [((2, 3), F, "normal")]
    yield "reduce_window_max", "REDUCE_WINDOW", som(
        "REDUCE_WINDOW", [(1, 6, 7, 2), np.array(-np.inf, np.float32), np.array([1, 2, 3, 1], np.int64),
                          np.array([1, 2, 1, 1], np.int64), np.array([1, 1, 2, 1], np.int64)],
        dict(reduce_function="MAXIMUM"), output_shapes=[(1, 3, 3, 2)]), [((1, 6, 7, 2), F, "normal")]
    yield "reduce_window_add", "REDUCE_WINDOW", som(
        "REDUCE_WINDOW", [(2, 5, 4), np.array(0.5, np.float32), np.array([1, 3, 2], np.int64),
                          np.array([1, 1, 2], np.int64), np.array([1, 1, 1], np.int64)],
        dict(reduce_function="ADD"), output_shapes=[(2, 3, 2)]), [((2, 5, 4), F, "normal")]


def more_builder_cases():
    from fbjax.formats.tflite_builder import single_op_model as som

    yield "fake_quant", "FAKE_QUANT", som("FAKE_QUANT", [(2, 3, 4)], dict(min=-1.3, max=2.1, num_bits=8)), \
        [((2, 3, 4), F, "normal")]
    yield "fake_quant_narrow", "FAKE_QUANT", som(
        "FAKE_QUANT", [(2, 3, 4)], dict(min=-0.7, max=1.1, num_bits=4, narrow_range=True)), \
        [((2, 3, 4), F, "normal")]
    for nm, reg in (("detection_postprocess_fast", False), ("detection_postprocess_regular", True)):
        m, ins = _detection_model(reg, 20 + reg)
        yield nm, "TFLite_Detection_PostProcess", m, ins
    for comb in ("SUM", "MEAN", "SQRTN"):
        yield f"embedding_lookup_sparse_{comb.lower()}", "EMBEDDING_LOOKUP_SPARSE", som(
            "EMBEDDING_LOOKUP_SPARSE",
            [np.array([1, 3, 0, 4, 2], np.int32), np.array([[0, 0], [0, 1], [2, 0], [2, 1], [2, 2]], np.int32),
             np.array([3, 3], np.int32), (5,), (6, 4)], dict(combiner=comb), output_shapes=[(3, 4)]), \
            [((5,), F, "pos"), ((6, 4), F, "normal")]
    seeds = np.random.default_rng(30).standard_normal((4, 3)).astype(np.float32)
    for typ in ("SPARSE", "DENSE"):
        yield f"lsh_projection_{typ.lower()}", "LSH_PROJECTION", som(
            "LSH_PROJECTION", [seeds, (5, 2), (5,)], dict(type=typ),
            output_shapes=[(4,) if typ == "SPARSE" else (12,)], output_dtypes=[np.int32],
            input_dtypes=[np.int32, np.float32]), [((5, 2), "int32", "int"), ((5,), F, "normal")]
    yield "lsh_projection_dense_20_byte_keys", "LSH_PROJECTION", som(
        "LSH_PROJECTION", [seeds, (3, 4)], dict(type="DENSE"), output_shapes=[(12,)], output_dtypes=[np.int32],
        input_dtypes=[np.int32]), [((3, 4), "int32", "int")]
    yield "unique", "UNIQUE", som("UNIQUE", [np.array([3.0, 1.0, 3.0, 2.0, 1.0, 5.0], np.float32)],
                                  output_shapes=[(4,), (6,)], output_dtypes=[np.float32, np.int32]), []


def _detection_model(regular, seed, n=12, classes=3, md=5):
    from fbjax.formats.tflite_builder import TFLiteBuilder

    rng = np.random.default_rng(seed)
    b = TFLiteBuilder()
    enc = b.add_input((1, n, 4))
    cls = b.add_input((1, n, classes + 1))
    yx = rng.uniform(0.2, 0.8, (n, 2))
    hw = rng.uniform(0.1, 0.4, (n, 2))
    anchors = b.add_constant(np.concatenate([yx, hw], 1).astype(np.float32))
    outs = [b.add_tensor((1, md, 4)), b.add_tensor((1, md)), b.add_tensor((1, md)), b.add_tensor((1,))]
    opts = dict(max_detections=md, max_classes_per_detection=1 if not regular else 1, detections_per_class=3,
                use_regular_nms=bool(regular), nms_score_threshold=0.3, nms_iou_threshold=0.4,
                num_classes=classes, y_scale=10.0, x_scale=10.0, h_scale=5.0, w_scale=5.0)
    b.add_op("TFLite_Detection_PostProcess", [enc, cls, anchors], outs, custom_options=opts, custom=True)
    for o in outs:
        b.add_output(o)
    return b.build(), [((1, n, 4), F, "normal"), ((1, n, classes + 1), F, "uniform")]


def _mediapipe_cases():
    import struct

    from fbjax.formats.tflite_builder import TFLiteBuilder

    def opts(pad, s, k):
        return struct.pack("<10i", 1 if pad == "SAME" else 2, s, s, k, k, 0, 0, 0, 0, 0)

    for name, pad, s, k, hw, ohw in (("max_pooling_with_argmax_2d_valid", "VALID", 2, 2, (4, 6), (2, 3)),
                                     ("max_pooling_with_argmax_2d_same", "SAME", 2, 2, (5, 7), (3, 4))):
        b = TFLiteBuilder()
        x = b.add_input((1,) + hw + (3,))
        y, i = b.add_tensor((1,) + ohw + (3,)), b.add_tensor((1,) + ohw + (3,))
        b.add_op("MaxPoolingWithArgmax2D", [x], [y, i], custom_options=opts(pad, s, k), custom=True)
        b.add_output(y)
        b.add_output(i)
        yield name, "MaxPoolingWithArgmax2D", b.build(), [((1,) + hw + (3,), F, "normal")]
    b = TFLiteBuilder()
    x, i = b.add_input((1, 2, 3, 3)), b.add_input((1, 2, 3, 3))
    y = b.add_tensor((1, 4, 6, 3))
    b.add_op("MaxUnpooling2D", [x, i], [y], custom_options=opts("VALID", 2, 2), custom=True)
    b.add_output(y)
    yield "max_unpooling_2d", "MaxUnpooling2D", b.build(), [((1, 2, 3, 3), F, "normal"), ((1, 2, 3, 3), F, "winidx4")]


def _call_model():
    from fbjax.formats.tflite_builder import TFLiteBuilder

    b = TFLiteBuilder()
    sub = b.add_subgraph("callee")
    b.set_subgraph(sub)
    a, c = b.add_input((2, 3), np.float32), b.add_input((2, 3), np.float32)
    s = b.add_tensor((2, 3), np.float32)
    b.add_op("MUL", [a, c], [s])
    b.add_output(s)
    b.set_subgraph(0)
    x, y = b.add_input((2, 3), np.float32), b.add_input((2, 3), np.float32)
    t, u = b.add_tensor((2, 3), np.float32), b.add_tensor((2, 3), np.float32)
    b.add_op("CALL", [x, y], [t], {"subgraph": sub})
    b.add_op("ADD", [t, x], [u])
    b.add_output(u)
    return b.build()


def _recurrent_model(op, seed, *, B=2, T=5, I=3, C=4, O=4, time_major=False, cifg=False, peephole=False,
                     proj=False, ln=False, act="TANH", cell_clip=0.0, proj_clip=0.0):
    """A one-op model of a fused recurrent op with random weights and
    variable state tensors (LiteRT zeroes them at allocation)."""
    from fbjax.formats.tflite_builder import TFLiteBuilder

    rng = np.random.default_rng(seed)
    b = TFLiteBuilder()
    seq = op.startswith(("UNIDIRECTIONAL", "BIDIRECTIONAL"))
    xshape = ((T, B, I) if time_major else (B, T, I)) if seq else (B, I)
    x = b.add_input(xshape)

    def w(*shape):
        return b.add_constant(rng.uniform(-0.6, 0.6, shape).astype(np.float32))

    if op.endswith("RNN"):
        ins = [x, w(C, I), w(C, C), w(C), b.add_tensor((B, C), is_variable=True)]
        oshape = xshape[:-1] + (C,)
        opts = dict(fused_activation_function=act)
        if seq:
            opts["time_major"] = time_major
    else:
        if not proj:
            O = C
        ins = [x] + [None if cifg else w(C, I)] + [w(C, I) for _ in range(3)]
        ins += [None if cifg else w(C, O)] + [w(C, O) for _ in range(3)]
        ins += [w(C) if peephole and not cifg else None, w(C) if peephole else None, w(C) if peephole else None]
        ins += [None if cifg else w(C)] + [w(C) for _ in range(3)]
        ins += [w(O, C) if proj else None, w(O) if proj else None]
        ins += [b.add_tensor((B, O), is_variable=True), b.add_tensor((B, C), is_variable=True)]
        if ln:
            ins += [None if cifg else w(C), w(C), w(C), w(C)]
        oshape = xshape[:-1] + (O,)
        opts = dict(fused_activation_function=act, cell_clip=cell_clip, proj_clip=proj_clip)
        if seq:
            opts["time_major"] = time_major
    out = b.add_tensor(oshape)
    b.add_op(op, ins, [out], opts)
    b.add_output(out)
    return b.build(), [[list(xshape), F, "normal"]]


def _bidi_rnn_model(seed, merge, time_major, B=2, T=4, I=3, U=5):
    from fbjax.formats.tflite_builder import TFLiteBuilder

    rng = np.random.default_rng(seed)
    b = TFLiteBuilder()
    xshape = (T, B, I) if time_major else (B, T, I)
    x = b.add_input(xshape)

    def w(*shape):
        return b.add_constant(rng.uniform(-0.6, 0.6, shape).astype(np.float32))

    ins = [x, w(U, I), w(U, U), w(U), b.add_tensor((B, U), is_variable=True),
           w(U, I), w(U, U), w(U), b.add_tensor((B, U), is_variable=True), None, None, None]
    oshape = xshape[:-1] + ((2 * U,) if merge else (U,))
    outs = [b.add_tensor(oshape)] + ([] if merge else [b.add_tensor(oshape)])
    b.add_op("BIDIRECTIONAL_SEQUENCE_RNN", ins, outs,
             dict(time_major=time_major, fused_activation_function="TANH", merge_outputs=merge))
    for o in outs:
        b.add_output(o)
    return b.build(), [[list(xshape), F, "normal"]]


def _svdf_model(seed, B=2, I=3, NF=6, M=4, rank=2):
    from fbjax.formats.tflite_builder import TFLiteBuilder

    rng = np.random.default_rng(seed)
    b = TFLiteBuilder()
    x = b.add_input((B, I))

    def w(*shape):
        return b.add_constant(rng.uniform(-0.6, 0.6, shape).astype(np.float32))

    ins = [x, w(NF, I), w(NF, M), w(NF // rank), b.add_tensor((B, NF * M), is_variable=True)]
    out = b.add_tensor((B, NF // rank))
    b.add_op("SVDF", ins, [out], dict(rank=rank, fused_activation_function="RELU"))
    b.add_output(out)
    return b.build(), [[[B, I], F, "normal"]]


def _bidi_lstm_model(seed, merge, time_major, B=2, T=4, I=3, C=4):
    from fbjax.formats.tflite_builder import TFLiteBuilder

    rng = np.random.default_rng(seed)
    b = TFLiteBuilder()
    xshape = (T, B, I) if time_major else (B, T, I)
    x = b.add_input(xshape)

    def w(*shape):
        return b.add_constant(rng.uniform(-0.6, 0.6, shape).astype(np.float32))

    def direction():
        return [w(C, I) for _ in range(4)] + [w(C, C) for _ in range(4)] + [w(C) for _ in range(3)] + \
            [w(C) for _ in range(4)] + [None, None]

    ins = [x] + direction() + direction()
    ins += [b.add_tensor((B, C), is_variable=True) for _ in range(4)] + [None] * 9
    oshape = xshape[:-1] + ((2 * C,) if merge else (C,))
    outs = [b.add_tensor(oshape)] + ([] if merge else [b.add_tensor(oshape)])
    b.add_op("BIDIRECTIONAL_SEQUENCE_LSTM", ins, outs,
             dict(time_major=time_major, fused_activation_function="TANH", merge_outputs=merge))
    for o in outs:
        b.add_output(o)
    return b.build(), [[list(xshape), F, "normal"]]


def recurrent_cases():
    yield "bidirectional_sequence_lstm", "BIDIRECTIONAL_SEQUENCE_LSTM", *_bidi_lstm_model(12, False, False)
    yield "bidirectional_sequence_lstm_merged_time_major", "BIDIRECTIONAL_SEQUENCE_LSTM", *_bidi_lstm_model(
        13, True, True)
    yield "bidirectional_sequence_rnn", "BIDIRECTIONAL_SEQUENCE_RNN", *_bidi_rnn_model(9, False, False)
    yield "bidirectional_sequence_rnn_merged_time_major", "BIDIRECTIONAL_SEQUENCE_RNN", *_bidi_rnn_model(
        10, True, True)
    yield "svdf", "SVDF", *_svdf_model(11)
    U = "UNIDIRECTIONAL_SEQUENCE_LSTM"
    yield "unidirectional_sequence_lstm", U, *_recurrent_model(U, 1)
    yield "unidirectional_sequence_lstm_time_major", U, *_recurrent_model(U, 2, time_major=True)
    yield "unidirectional_sequence_lstm_peephole_projection", U, *_recurrent_model(
        U, 3, peephole=True, proj=True, O=3, cell_clip=0.8, proj_clip=0.5)
    yield "unidirectional_sequence_lstm_cifg_layer_norm", U, *_recurrent_model(U, 4, cifg=True, ln=True)
    yield "lstm_step", "LSTM", *_recurrent_model("LSTM", 5, peephole=True)
    yield "rnn", "RNN", *_recurrent_model("RNN", 6, act="TANH")
    yield "unidirectional_sequence_rnn", "UNIDIRECTIONAL_SEQUENCE_RNN", *_recurrent_model(
        "UNIDIRECTIONAL_SEQUENCE_RNN", 7, act="RELU")
    yield "unidirectional_sequence_rnn_time_major", "UNIDIRECTIONAL_SEQUENCE_RNN", *_recurrent_model(
        "UNIDIRECTIONAL_SEQUENCE_RNN", 8, time_major=True, act="TANH")


def main_builder():
    from ai_edge_litert.interpreter import Interpreter

    path = os.path.join(HERE, "manifest.json")
    manifest = json.load(open(path))
    with open(os.path.join(HERE, "call.tflite"), "wb") as f:  # LiteRT has no CALL kernel: numpy oracle
        f.write(_call_model())
    manifest["call"] = dict(op="CALL", ops=["ADD", "CALL"], rtol=EW, suite="control", made_by="fbjax.testing",
                            oracle="numpy: x * y + x (tests/test_tflite_control.py)",
                            inputs=[[[2, 3], F, "normal"], [[2, 3], F, "normal"]])
    for name, op, model, inputs in list(builder_cases()) + list(more_builder_cases()) + [
            (n, o, m, [tuple(i) for i in ins]) for n, o, m, ins in recurrent_cases()] + list(_mediapipe_cases()):
        try:
            it = Interpreter(model_content=model)
            it.allocate_tensors()
            for d, (shp, dt, _) in zip(it.get_input_details(), inputs):
                it.set_tensor(d["index"], np.zeros(shp, dt))  # (window index 0 for winidx inputs)
            it.invoke()
        except Exception as e:  # noqa: BLE001
            print("NOT WRITTEN", name, f"LiteRT cannot run it: {str(e)[:200]}")
            continue
        with open(os.path.join(HERE, name + ".tflite"), "wb") as f:
            f.write(model)
        suite = "detection" if op == "TFLite_Detection_PostProcess" else \
            "mediapipe" if op in ("MaxPoolingWithArgmax2D", "MaxUnpooling2D") else "builtins"
        manifest[name] = dict(op=op, ops=[op], rtol=EW, suite=suite, made_by="fbjax.testing",
                              inputs=[[list(s), d, k] for s, d, k in inputs])
    with open(path, "w") as f:
        json.dump(dict(sorted(manifest.items())), f, indent=1)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--builder"]:
        main_builder()
    else:
        main(sys.argv[1:] or None)
