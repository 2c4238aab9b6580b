"""Zero-element constants (issue 17 item 2, issue 20 item 6) in every reader.

A constant with a zero dimension (the int32 shape operand ``[0]`` of a
RESHAPE to a scalar, as litert-torch and onnx-tf write it; an empty ``[0, 3]``
block concatenated to an activation) has no bytes. TFLite and the StableHLO
flatbuffer then store an empty buffer, which once read as "an activation
nothing wrote" (``ModelFormatError: ... is read before it is written``).
"""

from __future__ import annotations

import numpy as np

import fbjax
import fbjax.reference
from fbjax.formats.tflite_builder import TFLiteBuilder
from conftest import require  # noqa: E402


def _tflite_model() -> bytes:
    """x[1, 1] -> RESHAPE(x, shape=int32[0]) (a scalar); y[2, 3] -> CONCATENATION(y, zeros[0, 3])."""
    b = TFLiteBuilder()
    x = b.add_input([1, 1], name="x")
    y = b.add_input([2, 3], name="y")
    shape = b.add_tensor([0], np.int32, data=np.zeros(0, np.int32), name="scalar_shape")
    empty = b.add_tensor([0, 3], np.float32, data=np.zeros((0, 3), np.float32), name="empty_rows")
    s = b.add_tensor([], name="s")
    c = b.add_tensor([2, 3], name="c")
    b.add_op("RESHAPE", [x, shape], [s])
    b.add_op("CONCATENATION", [y, empty], [c], options={"axis": 0})
    b.add_output(s)
    b.add_output(c)
    return b.build()


def test_tflite_zero_size_constants_match_litert():
    data = _tflite_model()
    model = fbjax.load(data)
    consts = {v.name: v for v in model.ir.main_graph.values if v.name in ("scalar_shape", "empty_rows")}
    assert consts["scalar_shape"].data.shape == (0,) and consts["scalar_shape"].data.dtype == np.int32
    assert consts["empty_rows"].data.shape == (0, 3)
    x = np.array([[2.5]], np.float32)
    y = np.arange(6, dtype=np.float32).reshape(2, 3)
    s, c = model(x, y)
    assert np.shape(s) == ()
    litert = require("ai_edge_litert.interpreter")
    interp = litert.Interpreter(model_content=data)
    interp.allocate_tensors()
    ins = interp.get_input_details()
    interp.set_tensor(ins[0]["index"], x)
    interp.set_tensor(ins[1]["index"], y)
    interp.invoke()
    want = [interp.get_tensor(o["index"]) for o in interp.get_output_details()]
    assert want[0].shape == () and want[1].shape == (2, 3)
    np.testing.assert_array_equal(np.asarray(s), want[0])  # copies: exact
    np.testing.assert_array_equal(np.asarray(c), want[1])
    ref = fbjax.reference.run(model, x, y)
    np.testing.assert_array_equal(ref[0], want[0])
    np.testing.assert_array_equal(ref[1], want[1])


def test_zero_size_activation_is_not_made_a_constant():
    """Only tensors nothing writes become constants: a zero-size op output stays an activation."""
    b = TFLiteBuilder()
    x = b.add_input([0, 3], name="x")
    y = b.add_tensor([0, 3], name="y")
    b.add_op("RELU", [x], [y])
    b.add_output(y)
    model = fbjax.load(b.build())
    g = model.ir.main_graph
    assert all(v.data is None for v in g.values)
    assert np.asarray(model(np.zeros((0, 3), np.float32))).shape == (0, 3)


def _stablehlo_concat_model() -> bytes:
    """stablehlo.concatenate(x[2, 3], zeros[0, 3]) along dim 0, the constant with an empty buffer."""
    import flatbuffers

    from fbjax.formats._generated import stablehlo_generated as S

    sg = S.SubGraphT()
    buffers = [S.BufferT(), S.BufferT()]
    buffers[1].data = np.zeros(0, np.uint8)
    tensors = []
    for name, shape, buf in (("x", [2, 3], 0), ("empty_rows", [0, 3], 1), ("out", [2, 3], 0)):
        t = S.TensorT()
        t.shape, t.type, t.name, t.buffer = shape, S.DataType.FLOAT32, name, buf
        tensors.append(t)
    sg.tensors, sg.inputs, sg.outputs, sg.name = tensors, [0], [2], "main"
    op = S.OperatorT()
    o = S.ConcatenateOptionsT()
    o.dimension = 0
    op.opcodeIndex, op.inputs, op.outputs = 0, [0, 1], [2]
    op.operatorOptionsType, op.operatorOptions = S.OperatorOptions.ConcatenateOptions, o
    sg.operators = [op]
    m = S.ModelT()
    m.version, m.operatorCodes, m.subgraphs, m.buffers = 0, [S.OperatorCode.CONCATENATE], [sg], buffers
    fb = flatbuffers.Builder(256)
    fb.Finish(m.Pack(fb))
    return bytes(fb.Output())


def test_stablehlo_zero_size_constant():
    model = fbjax.load(_stablehlo_concat_model(), format="stablehlo")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(np.asarray(model(x)), x)  # concatenating no rows is the identity
    np.testing.assert_array_equal(fbjax.reference.run(model, x)[0], x)


def test_rten_zero_size_constant_without_data():
    """An RTen ConstantNode of shape [0, 3] that carries no data at all (neither inline nor an offset)."""
    require("onnx")
    from fbjax.formats._generated import rten_generated as R
    import rten_builders as T

    empty = T.const_node("empty_rows", np.zeros((0, 3), np.float32))
    empty.data.data = None  # no inline table: zero elements need no bytes
    empty.data.dataType = R.ConstantData.NONE
    attrs = R.ConcatAttrsT()
    attrs.axis = 0
    data = T.rten_file([T.value_node("x", [2, 3]), empty, T.value_node("y", [2, 3]),
                        T.op_node(R.OperatorType.Concat, [0, 1], [2], R.OperatorAttrs.ConcatAttrs, attrs)],
                       [0], [2])
    model = fbjax.load(data, format="rten")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(np.asarray(model(x)), x)
    np.testing.assert_array_equal(fbjax.reference.run(model, x)[0], x)
