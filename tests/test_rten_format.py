"""The RTen frontend (``fbjax.formats.rten``): v1/v2 layout, zero-copy constants,
schema defaults, unknown values, nested graphs with captures, symbolic dims.

Models are written at test time by rten-convert 0.22 (from small ONNX graphs
built with ``onnx.helper``) or, for cases a converter never writes (unknown
operator codes, absent attribute tables), with the flatbuffers object API of
the committed schema. Oracles: onnxruntime on the source ``.onnx`` and the
numpy reference interpreter.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conftest import assert_within, gamma, softmax_bound, require  # noqa: E402
onnx = require("onnx")
require("rten_convert")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import fbjax  # noqa: E402
import fbjax.lower  # noqa: E402,F401
import fbjax.lower.onnx  # noqa: E402,F401
import fbjax.reference  # noqa: E402
import fbjax.reference.onnx  # noqa: E402,F401
from fbjax.formats import detect_format, rten  # noqa: E402
from fbjax.formats._generated import rten_generated as R  # noqa: E402
from rten_convert_tools import convert  # noqa: E402
from rten_builders import const_node as _const, op_node as _op, rten_file as _file, value_node as _value  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _conv_model(dim_param=None, opset=17):
    """Conv(3x3, pads 1) + bias + Relu + Softmax(axis=1); weights large enough to be
    stored in the v2 tensor-data segment (> 16 elements)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    n = dim_param or 1
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["r"]),
         helper.make_node("Softmax", ["r"], ["y"], axis=1)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, 3, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, 4, 5, 5])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _ort(model, *xs):
    ort = require("onnxruntime")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {i.name: x for i, x in zip(sess.get_inputs(), xs)})


X = np.random.default_rng(1).standard_normal((1, 3, 5, 5)).astype(np.float32)


def _conv_model_bound(x):
    """Elementwise bound on fbjax vs onnxruntime for ``_conv_model`` at ``x``:
    each Conv output sums 3*3*3 products and the bias in float32, within
    ``gamma_28 * (|x| * |w| + |b|)`` of exact in any order (twice that between
    the two runtimes); ReLU adds nothing; the Softmax over the 4 channels
    carries it through its slope (``conftest.softmax_bound``)."""
    import jax

    init = {t.name: numpy_helper.to_array(t) for t in _conv_model().graph.initializer}
    mag = np.asarray(jax.lax.conv_general_dilated(np.abs(x), np.abs(init["w"]), (1, 1), [(1, 1), (1, 1)]),
                     np.float64) + np.abs(init["b"]).reshape(1, -1, 1, 1)
    y = _ort(_conv_model(dim_param="batch"), x)[0]
    return y, softmax_bound(y, 2 * gamma(28) * mag.max(axis=1, keepdims=True), n=4)


# --- v2 / v1 layout -----------------------------------------------------------------

def test_v2_header_and_zero_copy(tmp_path):
    data = convert(_conv_model())
    assert data[:4] == b"RTEN"
    version, moff, mlen, toff = rten.parse_header(data)
    assert (version, moff) == (2, 32) and toff % 64 == 0
    path = tmp_path / "m.rten"
    path.write_bytes(data)
    assert detect_format(path) == "rten"
    ir = rten.read(path)
    assert ir.metadata["version"] == 2
    w = next(v for v in ir.main_graph.values if v.name == "w")
    base = np.frombuffer(ir.buffer, np.uint8)
    lo, hi = base.ctypes.data, base.ctypes.data + base.size
    # External weights are views on the mapped file, inside the tensor-data segment.
    assert lo + toff <= w.data.ctypes.data < hi and not w.data.flags.owndata
    np.testing.assert_array_equal(w.data, numpy_helper.to_array(_conv_model().graph.initializer[0]))
    y = fbjax.load(path)(X)
    assert_within(y, *_conv_model_bound(X), "v2 file vs onnxruntime")


def test_v2_unaligned_tensor_data_is_copied():
    data = bytearray(convert(_conv_model()))
    version, moff, mlen, toff = rten.parse_header(data)
    # Shift the tensor-data segment by one byte: every external float32 is misaligned.
    data[toff:toff] = b"\0"
    data[24:32] = struct.pack("<Q", toff + 1)
    ir = rten.read(bytes(data))
    w = next(v for v in ir.main_graph.values if v.name == "w")
    assert w.data.flags.aligned and w.data.ctypes.data % 4 == 0
    assert not np.shares_memory(w.data, np.frombuffer(ir.buffer, np.uint8))  # copied once
    np.testing.assert_array_equal(w.data, numpy_helper.to_array(_conv_model().graph.initializer[0]))
    assert_within(fbjax.load(bytes(data))(X), *_conv_model_bound(X), "unaligned v2 file vs onnxruntime")


def test_v1_file_matches_v2(tmp_path):
    v1 = convert(_conv_model(), v1=True)
    assert v1[:4] != b"RTEN"
    assert detect_format(v1) == "rten"
    ir1, ir2 = rten.read(v1), rten.read(convert(_conv_model()))
    assert ir1.metadata["version"] == 1
    for a, b in zip(ir1.main_graph.values, ir2.main_graph.values):
        assert a.name == b.name and a.shape == b.shape and a.dtype == b.dtype
        if a.data is not None:
            np.testing.assert_array_equal(a.data, b.data)
    # the same graph and weights: the same program, so the same bits
    np.testing.assert_array_equal(np.asarray(fbjax.load(v1)(X)), np.asarray(fbjax.load(convert(_conv_model()))(X)))


def test_tflite_is_not_probed_as_rten_v1():
    tfl = (ROOT / "fbjax" / "data" / "mediapipe_selfie_segmentation.tflite").read_bytes()
    assert not rten.probe_v1(tfl, tfl[:8])
    # even without its identifier, TFLite's root table does not pass as an RTen Model
    anon = tfl[:4] + b"\0\0\0\0" + tfl[8:]
    assert not rten.probe_v1(anon, anon[:8])
    assert detect_format(tfl) == "tflite"


@pytest.mark.parametrize("mutate, match", [
    (lambda d: d[:20], "too short"),
    (lambda d: d[:4] + struct.pack("<I", 3) + d[8:], "version 3"),
    (lambda d: d[:8] + struct.pack("<Q", 1 << 40) + d[16:], "outside the file"),
    (lambda d: d[:24] + struct.pack("<Q", len(d) + 5) + d[32:], "past the end"),
])
def test_bad_headers_raise_model_format_error(mutate, match):
    with pytest.raises(fbjax.ModelFormatError, match=match):
        rten.read(mutate(convert(_conv_model())))


def test_truncated_tensor_data_names_the_node():
    data = convert(_conv_model())
    with pytest.raises(fbjax.ModelFormatError, match="node .*past the end of the file"):
        rten.read(data[:-64])


# --- hand-built files: unknown values, schema defaults ------------------------------

def test_unknown_operator_value_is_named():
    data = _file([_value("x", [2]), _value("y", [2]), _op(200, [0], [1])], [0], [1])
    with pytest.raises(fbjax.ModelFormatError, match="unknown OperatorType value 200"):
        rten.read(data)


def test_unknown_enum_value_is_named():
    a = R.ConvAttrsT()
    a.autoPad = 7
    w = np.ones((1, 1, 1, 1), np.float32)
    data = _file([_value("x", [1, 1, 2, 2]), _const("w", w), _value("y", [1, 1, 2, 2]),
                  _op(R.OperatorType.Conv, [0, 1], [2], R.OperatorAttrs.ConvAttrs, a)], [0], [2])
    with pytest.raises(fbjax.ModelFormatError, match="auto_pad.* unknown AutoPad value 7"):
        rten.read(data)


def test_missing_attrs_take_schema_defaults():
    """Gemm without its attribute table: schema alpha = beta = 0 (ONNX would use 1)."""
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.ones((3, 2), np.float32)
    c = np.full((2,), 5, np.float32)
    data = _file([_value("x", [2, 3]), _const("b", b), _const("c", c), _value("y", [2, 2]),
                  _op(R.OperatorType.Gemm, [0, 1, 2], [3])], [0], [3])
    node = rten.read(data).main_graph.nodes[0]
    assert node.op_name == "Gemm" and node.attrs == {}
    y = np.asarray(fbjax.load(data)(a))
    np.testing.assert_array_equal(y, np.zeros((2, 2), np.float32))  # alpha 0, beta 0
    np.testing.assert_array_equal(fbjax.reference.run(data, a)[0], y)


def test_conv_absent_fields_mean_same_padding_one_group():
    """ConvAttrs absent: auto_pad Same (SAME_UPPER), groups 0 read as 1, unit strides."""
    w = np.ones((1, 1, 2, 2), np.float32)
    data = _file([_value("x", [1, 1, 3, 3]), _const("w", w), _value("y", [1, 1, 3, 3]),
                  _op(R.OperatorType.Conv, [0, 1], [2])], [0], [2])
    x = np.arange(9, dtype=np.float32).reshape(1, 1, 3, 3)
    y = np.asarray(fbjax.load(data)(x))
    xp = np.pad(x[0, 0], ((0, 1), (0, 1)))  # SAME_UPPER: the extra row/col at the end
    expect = xp[:-1, :-1] + xp[1:, :-1] + xp[:-1, 1:] + xp[1:, 1:]
    np.testing.assert_array_equal(y[0, 0], expect)
    np.testing.assert_array_equal(fbjax.reference.run(data, x)[0], y)


def test_symbolic_dims_are_dynamic():
    ir = rten.read(convert(_conv_model(dim_param="batch")))
    x = ir.main_graph.inputs[0]
    assert x.shape == (None, 3, 5, 5)
    m = fbjax.load(convert(_conv_model(dim_param="batch")))
    assert m.inputs[0].shape == (None, 3, 5, 5)
    x2 = np.concatenate([X, X * 2])
    assert_within(m(x2), *_conv_model_bound(x2), "batch 2 vs onnxruntime")


def test_every_schema_operator_has_a_lowering_and_a_reference():
    from fbjax.lower import LOWERINGS
    from fbjax.reference import REFERENCE

    names = set(rten.OPERATOR_NAMES.values())
    assert len(names) == 128  # operators 0-127 of rten-convert 0.22
    assert names <= set(LOWERINGS.ops("onnx")["onnx"])
    assert names <= set(REFERENCE.ops("onnx")["onnx"])


# --- nested graphs and captures --------------------------------------------------------

def _if_model():
    """If(cond) whose branches read the outer ``a`` and ``b`` by name (captures)."""
    then_g = helper.make_graph([helper.make_node("Add", ["a", "b"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, [3])])
    else_g = helper.make_graph([helper.make_node("Mul", ["a", "b"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", TensorProto.FLOAT, [3])])
    g = helper.make_graph(
        [helper.make_node("Sum", ["x", "x"], ["a"]),
         helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g)],
        "g", [helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
              helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]),
              helper.make_tensor_value_info("b", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_if_with_captures():
    data = convert(_if_model())
    ir = rten.read(data)
    assert len(ir.graphs) == 3
    node = next(n for n in ir.main_graph.nodes if n.op_name == "If")
    caps = [node.inputs[p].name for p in node.attrs["then_branch_captures"]]
    assert sorted(caps) == ["a", "b"]
    body = ir.graphs[node.attrs["then_branch"]]
    assert sorted(v.name for v in body.inputs) == ["a", "b"]
    m = fbjax.load(data)
    x = np.array([1, 2, 3], np.float32)
    b = np.array([10, 20, 30], np.float32)
    for cond in (True, False):
        want = _ort(_if_model(), np.array(cond), x, b)[0]
        np.testing.assert_allclose(np.asarray(m(np.int32(cond), x, b)), want)
        np.testing.assert_allclose(fbjax.reference.run(data, np.int32(cond), x, b)[0], want)


# --- value-dependent shapes, gradients ------------------------------------------------

def _single(op, ins, outs, **attrs):
    g = helper.make_graph([helper.make_node(op, [i[0] for i in ins], [o[0] for o in outs], **attrs)], "g",
                          [helper.make_tensor_value_info(n, t, s) for n, t, s in ins],
                          [helper.make_tensor_value_info(n, t, s) for n, t, s in outs])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_value_dependent_shapes_raise_clear_errors():
    nz = convert(_single("NonZero", [("x", TensorProto.FLOAT, [4])], [("y", TensorProto.INT64, [1, None])]))
    # refused at load, in the same terms as every other operand needed at load time, naming static_bounds
    with pytest.raises(fbjax.UnsupportedOperatorError, match=r"input 0 of NonZero must be known at load time.*"
                       r"static_bounds=True"):
        fbjax.load(nz)
    rs = convert(_single("Reshape", [("x", TensorProto.FLOAT, [2, 3]), ("s", TensorProto.INT64, [2])],
                         [("y", TensorProto.FLOAT, None)]))
    with pytest.raises(fbjax.UnsupportedOperatorError, match=r"input 1 of Reshape must be known at load time"):
        fbjax.load(rs)(np.zeros((2, 3), np.float32), np.array([3, 2], np.int32))
    # the numpy reference has concrete values and runs it
    y = fbjax.reference.run(nz, np.array([0, 1, 0, 2], np.float32))[0]
    np.testing.assert_array_equal(y, [[1, 3]])


def test_gradients_flow_to_rten_weights():
    import jax
    import jax.numpy as jnp

    m = fbjax.load(convert(_conv_model()))
    assert set(m.params) == {"w", "b"}
    g = jax.grad(lambda p: jnp.sum(m.apply(p, X) ** 2))(m.params)
    assert all(np.isfinite(np.asarray(v)).all() and np.abs(np.asarray(v)).sum() > 0 for v in g.values())


# --- rten-convert's Softmax axis --------------------------------------------------------

def test_softmax_over_a_size_one_axis_warns_and_the_prepass_fixes_it():
    """An opset-11 classifier head ``Softmax`` without ``axis`` on ``[1, 10]``
    logits: rten-convert 0.22 writes axis 0, so the .rten's output is all ones
    (fbjax runs what the file says, as RTen does) and ``fbjax.load`` warns,
    naming the node. After ``make_defaults_explicit`` (fbjax.convert)
    the converted file equals onnxruntime on the original ONNX model and
    loads without the warning."""
    import warnings

    from fbjax.convert import make_defaults_explicit

    g = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 10])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])])
    onnx_model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)])
    x = np.random.default_rng(2).standard_normal((1, 10)).astype(np.float32)
    with pytest.warns(UserWarning, match=r"Softmax over axis 0 of \(1, 10\).*make_defaults_explicit"):
        raw = fbjax.load(convert(onnx_model))
    np.testing.assert_array_equal(np.asarray(raw(x)), np.ones((1, 10), np.float32))  # what the file says
    fixed, changed, left = make_defaults_explicit(onnx_model)
    assert len(changed) == 1 and not left
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = fbjax.load(convert(fixed))
    # the same logits on both sides: only each runtime's float32 exp, 10-term sum and division differ
    ref = _ort(onnx_model, x)[0]
    assert_within(m(x), ref, softmax_bound(ref, 0.0, n=10), "Softmax vs onnxruntime")
