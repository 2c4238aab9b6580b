"""Issue 15 item 2: what can be known without running is refused at load.

* a kernel fbjax (and LiteRT) lacks -- int16 SQUARED_DIFFERENCE -- is an
  :class:`UnsupportedOperatorError` from ``fbjax.load``, from the numpy
  reference and from ``fbjax inspect``, not an error at the first call;
* a region body of the wrong arity -- a ``STABLEHLO_WHILE`` whose body index
  points at a ``STABLEHLO_REDUCE`` computation, as a TensorFlow-converted file
  had -- is a :class:`ModelFormatError` at load naming the op, the index, the
  arity found and expected, and the likely intended body; the reference,
  which used to return wrong numbers for it, refuses it too;
* reverse-mode ``jax.grad`` through a ``lax.while_loop`` WHILE points to
  ``while_max_iterations``;
* every lowering's own check (``ctx.error``) fires in ``fbjax.load``, which
  traces the model abstractly at its input shapes (the first call reuses
  that trace); ``fbjax inspect`` exits 1 on such files, and the numpy twins
  refuse the same files.

The fixtures are built here with :class:`fbjax.formats.tflite_builder.TFLiteBuilder`.
"""

from __future__ import annotations

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fbjax
import fbjax.reference
from fbjax import ModelFormatError, UnsupportedOperatorError
from fbjax.formats.tflite_builder import TFLiteBuilder, single_op_model

F32, I32, B = np.float32, np.int32, np.bool_


def int16_squared_difference() -> bytes:
    """SQUARED_DIFFERENCE on int16 tensors (16x8 quantization): LiteRT has no
    such kernel (squared_difference.cc: float32, int32, int8)."""
    q = dict(scale=[1 / 1024], zero_point=[0])
    b = TFLiteBuilder()
    x = b.add_input((4,), np.int16, name="x", quant=q)
    y = b.add_input((4,), np.int16, name="y", quant=q)
    o = b.add_tensor((4,), np.int16, name="out", quant=dict(scale=[1 / 256], zero_point=[0]))
    b.add_op("SQUARED_DIFFERENCE", [x, y], [o])
    b.add_output(o)
    return b.build()


def stablehlo_while(body_index: int) -> bytes:
    """``x -> (sum(x), WHILE i < n: x *= 1.5)`` with n = 4, the region bodies
    appended as TensorFlow's converter does: 1 ``STABLEHLO_WHILE2`` (cond,
    3 values -> bool), 2 ``STABLEHLO_REDUCE3`` (the REDUCE computation,
    2 scalars -> 1), 3 ``STABLEHLO_WHILE3`` (body, 3 values -> 3). The right
    ``body_index`` is 3; 2 reproduces the malformed converter output."""
    b = TFLiteBuilder()
    x = b.add_input((3,), F32, name="x")
    zero = b.add_tensor((), F32, data=np.array(0.0, F32), name="zero")
    s = b.add_tensor((), F32, name="sum")
    i0 = b.add_tensor((), I32, data=np.array(0, I32), name="i0")
    n = b.add_tensor((), I32, data=np.array(4, I32), name="n")
    outs = [b.add_tensor((), I32, name="i_end"), b.add_tensor((), I32, name="n_end"),
            b.add_tensor((3,), F32, name="x_end")]

    cond = b.add_subgraph("STABLEHLO_WHILE2")
    ci, cn, _ = b.add_input((), I32), b.add_input((), I32), b.add_input((3,), F32)
    c = b.add_tensor((), B)
    b.add_op("STABLEHLO_COMPARE", [ci, cn], [c], options=dict(
        comparison_direction="STABLEHLO_COMPARISON_DIRECTION_LT", compare_type="STABLEHLO_COMPARISON_TYPE_SIGNED"))
    b.add_output(c)

    red = b.add_subgraph("STABLEHLO_REDUCE3")
    lhs, rhs = b.add_input((), F32), b.add_input((), F32)
    r = b.add_tensor((), F32)
    b.add_op("STABLEHLO_ADD", [lhs, rhs], [r])
    b.add_output(r)

    body = b.add_subgraph("STABLEHLO_WHILE3")
    bi, bn, bx = b.add_input((), I32), b.add_input((), I32), b.add_input((3,), F32)
    one = b.add_tensor((), I32, data=np.array(1, I32))
    k = b.add_tensor((3,), F32, data=np.full(3, 1.5, F32))
    bi2, bx2 = b.add_tensor((), I32), b.add_tensor((3,), F32)
    b.add_op("STABLEHLO_ADD", [bi, one], [bi2])
    b.add_op("STABLEHLO_MULTIPLY", [bx, k], [bx2])
    for t in (bi2, bn, bx2):
        b.add_output(t)

    b.set_subgraph(0)
    b.add_op("STABLEHLO_REDUCE", [x, zero], [s], options=dict(dimensions=[0], body_subgraph_index=red))
    b.add_op("STABLEHLO_WHILE", [i0, n, x], outs, options=dict(cond_subgraph_index=cond,
                                                               body_subgraph_index=body_index))
    assert body == 3 and red == 2
    b.add_output(s)
    b.add_output(outs[2])
    return b.build()


def tflite_while(bad: str = "") -> bytes:
    """``x -> WHILE i < 3: x *= 1.5`` (TFLite WHILE, float loop value);
    ``bad="cond_out"``: the cond graph returns two values; ``"body_in"``: the
    body takes only the counter."""
    b = TFLiteBuilder()
    x = b.add_input((2,), F32, name="x")
    i0 = b.add_tensor((), I32, data=np.array(0, I32), name="i0")
    oi, ox = b.add_tensor((), I32, name="i_end"), b.add_tensor((2,), F32, name="x_end")
    cond = b.add_subgraph("cond")
    ci, _ = b.add_input((), I32), b.add_input((2,), F32)
    three = b.add_tensor((), I32, data=np.array(3, I32))
    c = b.add_tensor((), B)
    b.add_op("LESS", [ci, three], [c])
    b.add_output(c)
    if bad == "cond_out":
        b.add_output(c)
    body = b.add_subgraph("body")
    bi = b.add_input((), I32)
    bx = b.add_tensor((2,), F32) if bad == "body_in" else b.add_input((2,), F32)
    one = b.add_tensor((), I32, data=np.array(1, I32))
    k = b.add_tensor((2,), F32, data=np.full(2, 1.5, F32), name="k")
    bi2, bx2 = b.add_tensor((), I32), b.add_tensor((2,), F32)
    b.add_op("ADD", [bi, one], [bi2])
    b.add_op("MUL", [bx, k], [bx2])
    b.add_output(bi2)
    b.add_output(bx2)
    b.set_subgraph(0)
    b.add_op("WHILE", [i0, x], [oi, ox], options=dict(cond_subgraph_index=cond, body_subgraph_index=body))
    b.add_output(ox)
    return b.build()


# --- kernel dtypes ----------------------------------------------------------------

def test_int16_squared_difference_refused_at_load_by_both_executors():
    data = int16_squared_difference()
    with pytest.raises(UnsupportedOperatorError, match=r"tflite.int:SQUARED_DIFFERENCE.*"
                                                         r"subgraph 0, operator 0 \(SQUARED_DIFFERENCE\): int16"):
        fbjax.load(data)
    x = np.arange(4, dtype=np.int16)
    with pytest.raises(UnsupportedOperatorError, match=r"SQUARED_DIFFERENCE.*int16"):
        fbjax.reference.run(data, x, x)


def test_int8_squared_difference_still_loads():
    """The check refuses only what has no kernel: the 8-bit variant loads."""
    q = dict(scale=[0.05], zero_point=[0])
    b = TFLiteBuilder()
    x = b.add_input((4,), np.int8, quant=q)
    y = b.add_input((4,), np.int8, quant=q)
    o = b.add_tensor((4,), np.int8, quant=dict(scale=[0.1], zero_point=[-128]))
    b.add_op("SQUARED_DIFFERENCE", [x, y], [o])
    b.add_output(o)
    m = fbjax.load(b.build())
    a, c = np.array([0, 10, -10, 20], np.int8), np.zeros(4, np.int8)
    # (0.05 * a)^2 / 0.1 - 128: 0, 2.5, 2.5, 10 steps above the zero point (LiteRT rounds 2.5 up here
    # through its two fixed-point rescalings; accept either neighbour of the half step)
    got = np.asarray(m(a, c)).astype(int) + 128
    assert got[0] == 0 and got[3] == 10 and set(got[1:3]) <= {2, 3}


# --- region arities -----------------------------------------------------------------

def test_while_body_pointing_at_reduce_region_is_refused_with_the_likely_body():
    data = stablehlo_while(body_index=2)
    msg = (r"subgraph 0, operator 1 \(STABLEHLO_WHILE\): body is subgraph 2 \('STABLEHLO_REDUCE3'\), which "
           r"takes 2 inputs, the operator passes 3\. The file is malformed.* Subgraph 3 \('STABLEHLO_WHILE3'\) "
           r"has the right arity")
    with pytest.raises(ModelFormatError, match=msg):
        fbjax.load(data)
    x = np.array([1, 2, 3], F32)
    with pytest.raises(ModelFormatError, match=msg):  # used to return numbers off by 10
        fbjax.reference.run(data, x)


def test_valid_while_runs_in_both_executors():
    data = stablehlo_while(body_index=3)
    x = np.array([1, 2, 3], F32)
    want = x * np.float32(1.5) ** 4  # four iterations, exact in float32
    s, y = fbjax.load(data)(x)
    np.testing.assert_array_equal(np.asarray(y), want)
    assert float(s) == 6.0
    rs, ry = fbjax.reference.run(data, x)
    np.testing.assert_array_equal(ry, want)


@pytest.mark.parametrize("bad", ["cond_out", "body_in"])
def test_tflite_while_arity(bad):
    """The TFLite WHILE rules: cond returns one value, body takes N."""
    if bad == "cond_out":
        what = r"cond_subgraph_index is subgraph 1 \('cond'\), which returns 2 values, the operator expects 1"
    else:
        what = r"body_subgraph_index is subgraph 2 \('body'\), which takes 1 inputs, the operator passes 2"
    with pytest.raises(ModelFormatError, match=what):
        fbjax.load(tflite_while(bad))


# --- reverse mode through while_loop ------------------------------------------------

def test_grad_through_while_loop_points_to_while_max_iterations():
    data = tflite_while()
    x = np.array([1.0, 2.0], F32)
    m = fbjax.load(data)
    loss = lambda p, x: jnp.sum(m.apply(p, x))  # noqa: E731
    with pytest.raises(fbjax.InputError, match="while_max_iterations"):
        jax.grad(loss)(m.params, x)
    with pytest.raises(fbjax.InputError, match="while_max_iterations"):
        jax.jit(jax.grad(loss, argnums=1))(m.params, x)
    # forward mode still works, and the suggested option gives the gradient: d sum(x * 1.5^3) / dx = 3.375
    _, t = jax.jvp(lambda x: m.apply(m.params, x), (x,), (np.ones(2, F32),))
    np.testing.assert_allclose(np.asarray(t), 3.375, rtol=1e-6)
    mb = fbjax.load(data, while_max_iterations=5)
    g = jax.grad(lambda x: jnp.sum(mb.apply(mb.params, x)))(x)
    np.testing.assert_allclose(np.asarray(g), 3.375, rtol=1e-6)


# --- inspect tells the truth ------------------------------------------------------------

@pytest.mark.parametrize("case", ["int16_sqdiff", "while_reduce_body"])
def test_inspect_reports_what_load_refuses(tmp_path, case):
    p = tmp_path / "m.tflite"
    p.write_bytes(int16_squared_difference() if case == "int16_sqdiff" else stablehlo_while(2))
    proc = subprocess.run([sys.executable, "-m", "fbjax", "inspect", str(p)], capture_output=True, text=True,
                          timeout=300)
    out = proc.stdout + proc.stderr
    assert "fbjax can run this model" not in out, out
    assert "fbjax cannot run this model" in out, out
    assert ("int16 SQUARED_DIFFERENCE" if case == "int16_sqdiff" else "STABLEHLO_WHILE3") in out, out
    assert proc.returncode == 1, out


def test_inspect_says_can_run_when_load_succeeds(tmp_path):
    p = tmp_path / "m.tflite"
    p.write_bytes(single_op_model("ADD", [(4,), np.ones(4, F32)]))
    proc = subprocess.run([sys.executable, "-m", "fbjax", "inspect", str(p)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and "fbjax can run this model" in proc.stdout, proc.stdout + proc.stderr


# --- static inputs --------------------------------------------------------------------

@pytest.mark.parametrize("op,ins,out", [("PAD", [(2, 3), (2, 2)], (4, 5)), ("RESHAPE", [(2, 3), (2,)], (3, 2))])
def test_static_input_from_a_model_input_is_refused_at_load(op, ins, out):
    """A PAD's paddings or a RESHAPE's shape given as a model input: refused
    by fbjax.load (it was the first call that raised)."""
    data = single_op_model(op, ins, input_dtypes=[F32, I32], output_shapes=[out])
    with pytest.raises(UnsupportedOperatorError,
                       match=rf"operator 0: input 1 of {op} must be known at load time, but it depends on the "
                             "model's inputs"):
        fbjax.load(data)


def test_static_input_computed_from_an_input_shape_still_loads():
    """RESHAPE(x, SHAPE(x)): the shape is known at load (SHAPE reads only
    the static shape), so nothing is refused."""
    b = TFLiteBuilder()
    x = b.add_input((2, 3), F32, name="x")
    s = b.add_tensor((2,), I32, name="s")
    y = b.add_tensor((2, 3), F32, name="y")
    b.add_op("SHAPE", [x], [s], options=dict(out_type="INT32"))
    b.add_op("RESHAPE", [x, s], [y])
    b.add_output(y)
    m = fbjax.load(b.build())
    v = np.arange(6, dtype=F32).reshape(2, 3)
    np.testing.assert_array_equal(np.asarray(m(v)), v)


# --- lowering errors (ctx.error) raised by fbjax.load, not the first call ----------------
#
# fbjax.load traces the model abstractly at its input shapes (the executor's
# first-call trace, reused by the first call), so the lowerings' own checks
# fire there. One small bad file per op set that has such checks; each op is
# one a converter would never write this way.

def _tflite_tile_bad() -> bytes:
    """TILE of a rank-2 input with a 1-entry ``multiples``: array.py's
    "multiples has 1 entries for a rank-2 input"."""
    return single_op_model("TILE", [(2, 3), np.array([2], np.int32)], output_shapes=[(4, 3)])


def _stablehlo_reshape_bad() -> bytes:
    """STABLEHLO_RESHAPE of 6 elements to a declared (4, 2) output."""
    from fbjax.formats.tflite_builder import stablehlo_op_model

    return stablehlo_op_model("STABLEHLO_RESHAPE", [((2, 3), F32)], [((4, 2), F32)])


def _rten_reshape_bad() -> bytes:
    """An RTen (ONNX op set) Reshape of 6 elements to ``[4, -1]`` (6 is not
    a multiple of 4), written with the flatbuffers object API of the
    committed schema (rten-convert would refuse the ONNX graph)."""
    import flatbuffers

    from fbjax.formats._generated import rten_generated as R

    def node(name, kind, data):
        n = R.NodeT()
        n.name, n.dataType, n.data = name, kind, data
        return n

    x = R.ValueNodeT()
    x.shape, x.dtype = [R.DimT() for _ in range(2)], R.DataType.Float
    x.shape[0].value, x.shape[1].value = 2, 3
    y = R.ValueNodeT()
    y.dtype = R.DataType.Float
    c = R.ConstantNodeT()
    c.shape, c.dtype, c.dataType = [2], R.ConstantDataType.Int32, R.ConstantData.Int32Data
    c.data = R.Int32DataT()
    c.data.data = [4, -1]
    op = R.OperatorNodeT()
    op.type, op.attrsType, op.inputs, op.outputs = R.OperatorType.Reshape, R.OperatorAttrs.NONE, [0, 1], [2]
    g = R.GraphT()
    g.nodes = [node("x", R.NodeKind.ValueNode, x), node("shape", R.NodeKind.ConstantNode, c),
               node("y", R.NodeKind.ValueNode, y), node("reshape", R.NodeKind.OperatorNode, op)]
    g.inputs, g.outputs = [0], [2]
    m = R.ModelT()
    m.schemaVersion, m.graph = 1, g
    b = flatbuffers.Builder(1024)
    b.Finish(m.Pack(b))
    return bytes(b.Output())


def _int16_add_bad() -> bytes:
    """int16 ADD with zero points 5 (LiteRT's add.cc rejects non-zero int16
    zero points in Prepare): a ``tflite.int`` integer-kernel check."""
    q = dict(scale=[1 / 1024], zero_point=[5])
    b = TFLiteBuilder()
    x = b.add_input((2, 3), np.int16, name="x", quant=q)
    y = b.add_input((2, 3), np.int16, name="y", quant=q)
    o = b.add_tensor((2, 3), np.int16, name="out", quant=dict(scale=[1 / 512], zero_point=[5]))
    b.add_op("ADD", [x, y], [o])
    b.add_output(o)
    return b.build()


_LOWERING_ERRORS = {
    # case: (file maker, fbjax error, message naming the op and what is wrong, the numpy reference's error)
    "tflite:TILE": (_tflite_tile_bad, ModelFormatError, r"operator 0 \(TILE\): multiples has 1 entries for a rank-2",
                    ModelFormatError),
    "tflite.int:ADD": (_int16_add_bad, ModelFormatError, r"operator 0 \(ADD\): int16 ADD/SUB needs zero points 0",
                       UnsupportedOperatorError),  # the reference has no int16 ADD: refused before it runs
    "stablehlo:reshape": (_stablehlo_reshape_bad, ModelFormatError,
                          r"\(stablehlo.reshape\): cannot reshape \(2, 3\) to \(4, 2\)", ModelFormatError),
    "onnx:Reshape": (_rten_reshape_bad, ModelFormatError, r"\(Reshape\): cannot reshape \(2, 3\) to \[4, -1\]",
                     ModelFormatError),
}


@pytest.mark.parametrize("case", sorted(_LOWERING_ERRORS))
def test_lowering_error_raised_by_load(case):
    make, err, msg, _ = _LOWERING_ERRORS[case]
    with pytest.raises(err, match=msg):
        fbjax.load(make())


@pytest.mark.parametrize("case", sorted(_LOWERING_ERRORS))
def test_reference_refuses_what_the_lowering_refuses(case):
    """The numpy twin raises the same error at the node (TILE used to
    return np.tile's (2, 6) for the 1-entry multiples; the reshapes a raw
    numpy ValueError), or refuses the model before running (no int16 ADD)."""
    make, _, msg, ref_err = _LOWERING_ERRORS[case]
    from fbjax.formats import read_model

    data = make()
    xs = [np.ones(v.shape, v.dtype) for v in read_model(data).main_graph.inputs]
    with pytest.raises(ref_err, match=msg if ref_err is ModelFormatError else r"ADD.*int16"):
        fbjax.reference.run(data, *xs)


@pytest.mark.parametrize("case", sorted(_LOWERING_ERRORS))
def test_inspect_refuses_what_load_refuses(tmp_path, capsys, case):
    """``fbjax inspect`` exits 1 with load's error (in-process: the CLI's
    ``main``, no interpreter start per case)."""
    from fbjax.cli import main

    make, err, msg, _ = _LOWERING_ERRORS[case]
    p = tmp_path / ("m.rten" if case.startswith("onnx") else "m.tflite")
    p.write_bytes(make())
    rc = main(["inspect", str(p)])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert "fbjax can run this model" not in out and f"fbjax cannot run this model: {err.__name__}" in out, out


def test_load_traces_once_and_the_first_call_reuses_it(monkeypatch):
    """The load-time trace is the first call's: the graph is walked once
    (``Program.apply`` calls) across load, the first call and a second."""
    from fbjax.lower.build import Program

    calls = []
    orig = Program.apply
    monkeypatch.setattr(Program, "apply", lambda self, *a, **k: calls.append(1) or orig(self, *a, **k))
    m = fbjax.load(single_op_model("ADD", [(4,), np.ones(4, F32)]))
    assert len(calls) == 1
    x = np.arange(4, dtype=F32)
    np.testing.assert_array_equal(np.asarray(m(x)), x + 1)  # exact: one float32 add of small integers
    np.testing.assert_array_equal(np.asarray(m(x)), x + 1)
    assert len(calls) == 1
    assert [s.shape for s in m.outputs] == [(4,)] and len(calls) == 1  # the traced shapes, no new trace


def test_dynamic_input_dims_are_checked_at_the_first_call():
    """With a dynamic (``-1``) input dimension there is no shape to trace at
    load (documented in fbjax.load): the same bad TILE loads, and its first
    call raises the lowering's error."""
    b = TFLiteBuilder()
    x = b.add_input((1, 3), F32, name="x", shape_signature=(-1, 3))
    m_ = b.add_tensor((1,), I32, data=np.array([2], I32), name="multiples")
    o = b.add_tensor((2, 3), F32, name="y", shape_signature=(-1, 3))
    b.add_op("TILE", [x, m_], [o])
    b.add_output(o)
    m = fbjax.load(b.build())
    assert m.inputs[0].shape == (None, 3)
    with pytest.raises(ModelFormatError, match=r"\(TILE\): multiples has 1 entries for a rank-2 input"):
        m(np.ones((2, 3), F32))


def test_jax_refusal_of_operands_is_a_format_error_naming_the_node():
    """Operands an op cannot take by its own rules (``jax.lax`` raising a raw
    ``TypeError``) are a ModelFormatError at load naming the node: here the
    TF converter's defective ``while_loop`` fixture (a STABLEHLO_MULTIPLY of
    float32 by int32 in its body, which StableHLO forbids); before, load
    raised JAX's bare ``TypeError``. A caller feeding its own dtypes at
    call time still gets JAX's ``TypeError`` (labelled with the node)."""
    from pathlib import Path

    path = Path(__file__).parent / "data" / "stablehlo_tflite" / "while_loop.tflite"
    with pytest.raises(ModelFormatError, match=r"operator 1 \(STABLEHLO_MULTIPLY\): stablehlo.multiply "
                                               r"\(operands float32\[4\], int32\[\]\) cannot be lowered"):
        fbjax.load(path)


def test_callers_own_dtypes_keep_jax_type_error():
    """Only the load-time trace (the file's own dtypes) turns ``jax.lax``'s
    refusal into a ModelFormatError: ``model.apply`` traced with float64
    inputs against float32 weights raises JAX's ``TypeError``, labelled with
    the node (tests and users catch it to fall back to float32)."""
    from pathlib import Path

    m = fbjax.load(Path(__file__).parent / "data" / "tflite_builtins" / "transpose_conv_same.tflite")
    with jax.enable_x64(True):
        x = jnp.ones(m.inputs[-1].shape, jnp.float64)
        with pytest.raises(TypeError, match="same dtypes") as info:
            jax.make_jaxpr(m.apply)(m.params, x)
    assert "TRANSPOSE_CONV" in info.value.fbjax_node
