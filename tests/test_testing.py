"""The TFLite writer in :mod:`fbjax.formats.tflite_builder`: what it writes is a valid model
(LiteRT loads it, the generated bindings read back what was asked for)."""

from __future__ import annotations

import numpy as np
import pytest

from fbjax.formats._generated import tflite_generated as T
from fbjax.formats.tflite_builder import (
    BUILTIN_CODES,
    TFLiteBuilder,
    make_options,
    options_table_name,
    single_op_model,
    transpose_conv_bias_options,
)

from conftest import litert_run


def _read(model: bytes):
    return T.ModelT.InitFromObj(T.Model.GetRootAs(model, 0))


def test_header_version_and_sentinel_buffer():
    model = single_op_model("RELU", [(2, 3)])
    assert model[4:8] == b"TFL3"
    m = _read(model)
    assert m.version == 3
    assert m.buffers[0].data is None or len(m.buffers[0].data) == 0
    assert len(m.subgraphs) == 1


@pytest.mark.parametrize("op,table", [
    ("CONV_2D", "Conv2DOptions"), ("DEPTHWISE_CONV_2D", "DepthwiseConv2DOptions"),
    ("MAX_POOL_2D", "Pool2DOptions"), ("AVERAGE_POOL_2D", "Pool2DOptions"),
    ("MEAN", "ReducerOptions"), ("REDUCE_MAX", "ReducerOptions"), ("MAXIMUM", "MaximumMinimumOptions"),
    ("TOPK_V2", "TopKV2Options"), ("BATCH_TO_SPACE_ND", "BatchToSpaceNDOptions"),
    ("UNIDIRECTIONAL_SEQUENCE_RNN", "SequenceRNNOptions"), ("L2_NORMALIZATION", "L2NormOptions"),
    ("STABLEHLO_PAD", "StablehloPadOptions"), ("DILATE", "DilateOptions"),
    ("REDUCE_WINDOW", "ReduceWindowOptions"), ("RELU", None), ("LOGISTIC", None),
])
def test_options_table_name(op, table):
    assert options_table_name(op) == table


def test_every_options_table_is_reachable():
    """Every member of both options unions is the table of some builtin op."""
    used = {options_table_name(op) for op in BUILTIN_CODES} - {None}
    members = {k for k, v in vars(T.BuiltinOptions).items() if isinstance(v, int) and k != "NONE"}
    members |= {k for k, v in vars(T.BuiltinOptions2).items() if isinstance(v, int) and k != "NONE"}
    assert members - used == set()


def test_options_are_written():
    model = single_op_model(
        "CONV_2D", [(1, 5, 5, 2), np.ones((3, 3, 3, 2), np.float32), np.zeros(3, np.float32)],
        options=dict(padding="VALID", stride_w=2, stride_h=1, fused_activation_function="RELU6",
                     dilation_w_factor=2),
        output_shapes=[(1, 3, 1, 3)])
    m = _read(model)
    op = m.subgraphs[0].operators[0]
    assert op.builtinOptionsType == T.BuiltinOptions.Conv2DOptions
    o = op.builtinOptions
    assert (o.padding, o.strideW, o.strideH, o.fusedActivationFunction, o.dilationWFactor, o.dilationHFactor) == (
        T.Padding.VALID, 2, 1, T.ActivationFunctionType.RELU6, 2, 1)
    oc = m.operatorCodes[op.opcodeIndex]
    assert oc.builtinCode == oc.deprecatedBuiltinCode == T.BuiltinOperator.CONV_2D


def test_codes_above_127_use_options_2_and_placeholder():
    b = TFLiteBuilder()
    x = b.add_input((3, 4))
    y = b.add_tensor((5, 7))
    b.add_op("DILATE", [x, b.add_constant(np.array([2, 2], np.int32)), b.add_constant(np.float32(0))], [y])
    z = b.add_tensor((5, 7))
    b.add_op("STABLEHLO_PAD", [y, b.add_constant(np.float32(0))], [z],
             options=dict(edge_padding_low=[0, 0], edge_padding_high=[0, 0], interior_padding=[0, 0]))
    b.add_output(z)
    m = _read(b.build())
    codes = [m.operatorCodes[op.opcodeIndex] for op in m.subgraphs[0].operators]
    assert [c.builtinCode for c in codes] == [T.BuiltinOperator.DILATE, T.BuiltinOperator.STABLEHLO_PAD]
    assert [c.deprecatedBuiltinCode for c in codes] == [127, 127]
    pad_op = m.subgraphs[0].operators[1]
    assert pad_op.builtinOptionsType == 0 and pad_op.builtinOptions2Type == T.BuiltinOptions2.StablehloPadOptions
    assert list(pad_op.builtinOptions2.interiorPadding) == [0, 0]


def test_constants_are_aligned_and_exact():
    rng = np.random.default_rng(0)
    consts = [rng.standard_normal(n).astype(dt) for n, dt in
              [(3, np.float32), (5, np.float16), (7, np.int8), (2, np.int64)]]
    b = TFLiteBuilder()
    x = b.add_input((3,))
    for c in consts:
        b.add_constant(c)
    y = b.add_tensor((3,))
    b.add_op("RELU", [x], [y])
    b.add_output(y)
    data = b.build()
    root = T.Model.GetRootAs(data, 0)
    sg = root.Subgraphs(0)
    for i, c in enumerate(consts, start=1):
        t = sg.Tensors(i)
        assert t.Type() == {np.float32: T.TensorType.FLOAT32, np.float16: T.TensorType.FLOAT16,
                            np.int8: T.TensorType.INT8, np.int64: T.TensorType.INT64}[c.dtype.type]
        buf = root.Buffers(t.Buffer())
        start = buf._tab.Vector(buf._tab.Offset(4))
        assert start % 16 == 0
        np.testing.assert_array_equal(np.frombuffer(data, c.dtype, c.size, start), c)


def test_custom_op_options_and_litert_runs_it():
    opts = transpose_conv_bias_options("SAME", stride_w=2, stride_h=2)
    assert opts == np.array([1, 2, 2], "<i4").tobytes()
    rng = np.random.default_rng(1)
    model = single_op_model(
        "Convolution2DTransposeBias",
        [(1, 3, 3, 2), rng.standard_normal((4, 2, 2, 2)).astype(np.float32), np.zeros(4, np.float32)],
        custom=True, custom_options=opts, output_shapes=[(1, 6, 6, 4)])
    m = _read(model)
    oc = m.operatorCodes[0]
    assert oc.builtinCode == T.BuiltinOperator.CUSTOM
    name = oc.customCode.decode() if isinstance(oc.customCode, bytes) else oc.customCode
    assert name == "Convolution2DTransposeBias"
    assert bytes(np.asarray(m.subgraphs[0].operators[0].customOptions, np.uint8)) == opts
    (y,) = litert_run(model, [np.ones((1, 3, 3, 2), np.float32)])
    assert y.shape == (1, 6, 6, 4)


def test_litert_runs_a_built_graph():
    """A two-op graph built by hand computes what numpy does."""
    b = TFLiteBuilder()
    x = b.add_input((2, 3), name="x")
    c = b.add_constant(np.array([1.0, -2.0, 3.0], np.float32), name="c")
    s = b.add_tensor((2, 3), name="s")
    y = b.add_tensor((2, 3), name="y")
    b.add_op("ADD", [x, c], [s], options=dict(fused_activation_function="NONE"))
    b.add_op("RELU6", [s], [y])
    b.add_output(y)
    xv = np.array([[0.5, 1.0, 4.0], [-3.0, 9.0, 0.0]], np.float32)
    (out,) = litert_run(b.build(), [xv])
    np.testing.assert_array_equal(out, np.clip(xv + np.array([1, -2, 3], np.float32), 0, 6))


def test_shape_signature_is_written():
    b = TFLiteBuilder()
    x = b.add_input((1, 4), shape_signature=(-1, 4))
    y = b.add_tensor((1, 4), shape_signature=(-1, 4))
    b.add_op("RELU", [x], [y])
    b.add_output(y)
    t = _read(b.build()).subgraphs[0].tensors[0]
    assert list(t.shape) == [1, 4] and list(t.shapeSignature) == [-1, 4]


def test_quantization_is_written():
    b = TFLiteBuilder()
    x = b.add_input((2, 3), np.int8, quant=dict(scale=[0.5], zero_point=[-3]))
    w = b.add_constant(np.ones((4, 3), np.int8), quant=dict(scale=[0.1, 0.2, 0.3, 0.4], zero_point=0))
    y = b.add_tensor((2, 4), np.int8, quant=(0.25, 1))
    b.add_op("FULLY_CONNECTED", [x, w, -1], [y])
    b.add_output(y)
    ts = _read(b.build()).subgraphs[0].tensors
    assert list(ts[0].quantization.scale) == [0.5] and list(ts[0].quantization.zeroPoint) == [-3]
    np.testing.assert_allclose(ts[1].quantization.scale, [0.1, 0.2, 0.3, 0.4], rtol=1e-7)
    assert list(ts[1].quantization.zeroPoint) == [0, 0, 0, 0]
    assert list(ts[2].quantization.scale) == [0.25] and list(ts[2].quantization.zeroPoint) == [1]


@pytest.mark.parametrize("call,match", [
    (lambda b, x, y: b.add_op("CONV_2DD", [x], [y]), "not a TFLite builtin"),
    (lambda b, x, y: b.add_op("ADD", [x, x], [y], options=dict(stride_w=1)), "no field 'stride_w'"),
    (lambda b, x, y: b.add_op("ADD", [x, x], [y], options=dict(fused_activation_function="SWISH")), "expected one of"),
    (lambda b, x, y: b.add_op("RELU", [x], [y], options=dict(alpha=1)), "has no options table"),
    (lambda b, x, y: b.add_op("RELU", [x], [y], custom_options=b"\0"), "custom_options are for custom ops"),
    (lambda b, x, y: b.add_op("MyOp", [x], [y], custom=True, options=dict(a=1)), "use custom_options"),
    (lambda b, x, y: b.add_tensor((2, 3), data=np.zeros(5, np.float32)), "needs 6"),
    (lambda b, x, y: b.add_tensor(None), "shape is required"),
    (lambda b, x, y: b.add_tensor((2,), dtype=np.str_), "no TFLite TensorType"),
], ids=["unknown-op", "unknown-field", "unknown-enum", "options-on-optionless-op",
        "custom-options-on-builtin", "options-on-custom", "data-size", "no-shape", "bad-dtype"])
def test_writer_errors(call, match):
    b = TFLiteBuilder()
    x = b.add_input((2, 3))
    y = b.add_tensor((2, 3))
    with pytest.raises(ValueError, match=match):
        call(b, x, y)


def test_missing_tensor_and_missing_outputs():
    b = TFLiteBuilder()
    x = b.add_input((2, 3))
    with pytest.raises(IndexError):
        b.add_op("RELU", [x], [5])
    with pytest.raises(ValueError, match="no outputs"):
        b.build()


def test_make_options_accepts_object():
    o = T.Pool2DOptionsT()
    o.filterWidth = 3
    union, code, table = make_options("MAX_POOL_2D", o)
    assert (union, code, table) == (1, T.BuiltinOptions.Pool2DOptions, o)
