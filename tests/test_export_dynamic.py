"""``jax.export`` with a symbolic batch (``fbjax export --batch-size dynamic``).

:func:`fbjax.export.jax_export` with ``batch_size=None`` traces a model
loaded with ``fbjax.load(path, batch_size=None)`` at the symbolic batch
``b``; lowerings must not need ``b`` as a number (``int(d)``, ``d > 1``,
``np.zeros(shape)``). Each exported artifact is called at a batch other than
the file's and compared with an external oracle at that batch: LiteRT's
builtin kernels (input resized) for TFLite, onnxruntime (input dim made
symbolic) for ONNX->RTen, or two batch-1 runs of the bundled model. An
operator that cannot follow a symbolic batch raises
:class:`fbjax.export.DynamicBatchError` naming the node and suggesting a
fixed batch size.
"""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest

import fbjax
from fbjax import export as fbexport
from fbjax.formats.tflite_builder import single_op_model

from conftest import abs_magnitude, assert_within, gamma, require

F32 = np.float32
SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "models", "tflite")
SELFIE = os.path.join(SHARED, "mediapipe_selfie_segmentation.tflite")


def _tuple(y):
    return tuple(y) if isinstance(y, (tuple, list)) else (y,)


def _export_dynamic(source):
    """(model, exported) for ``source`` loaded and exported with a symbolic batch."""
    m = fbjax.load(source, batch_size=None)
    ex = fbexport.jax_export(m, batch_size=None)
    assert str(ex.in_avals[-1].shape[0]) == "b", ex.in_avals  # the batch really is symbolic
    return m, ex


# --- the bundled default model ------------------------------------------------------------

@pytest.mark.skipif(not os.path.exists(SELFIE), reason=f"{SELFIE} is absent (the shared model folder)")
def test_selfie_segmentation_cli_export_dynamic_batch_equals_two_batch1_runs(tmp_path, capsys):
    """The user report: ``fbjax export <selfie> --to stablehlo sel.jax
    --batch-size dynamic`` (the README's default model; HARD_SWISH on
    [b, 128, 128, 16]...) crashed with InconclusiveDimensionOperation. It
    now writes an artifact with a symbolic batch; called at batch 2 with the
    written params it equals two batch-1 runs of ``fbjax.load(path)``.
    Tolerance: XLA compiles the batch-2 and batch-1 programs separately and
    may tile the convolutions' float32 sums differently. Each program's
    logits z are within the shared-model bound ``1e-4 * max(1, max|z|)``
    (tests/test_tflite_models.py, ~100 layers of float32 sums) of the exact
    ones, so through the final sigmoid (slope ``p (1 - p)``) the two masks
    differ by at most ``2 p (1 - p) 1e-4 max(1, max|z|)`` plus an ULP of
    ``p`` per side. ``max|z|`` is read from LiteRT (the LOGISTIC's input)."""
    from fbjax import cli

    out = tmp_path / "sel.jax"
    assert cli.main(["export", SELFIE, "--to", "stablehlo", str(out), "--batch-size", "dynamic"]) == 0
    assert "wrote" in capsys.readouterr().out
    ex = jax.export.deserialize(out.read_bytes())
    assert str(ex.in_avals[-1].shape[0]) == "b", ex.in_avals
    params = dict(np.load(tmp_path / "sel.params.npz"))
    m1 = fbjax.load(SELFIE)
    x = np.random.default_rng(0).random((2,) + tuple(m1.inputs[0].shape[1:]), dtype=F32)
    y = _tuple(ex.call(params, x))
    ref = [_tuple(m1.apply(m1.params, x[i:i + 1])) for i in range(2)]
    assert len(y) == len(ref[0]) == 1
    z_max = max(float(np.abs(_selfie_logits(x[i:i + 1])).max()) for i in range(2))
    for k, a in enumerate(y):
        r = np.concatenate([np.asarray(rr[k]) for rr in ref])
        assert a.shape == r.shape == (2,) + tuple(m1.outputs[k].shape[1:])
        p = np.maximum(np.asarray(a, np.float64), r.astype(np.float64))
        bound = 2 * p * (1 - p) * 1e-4 * max(1.0, z_max) + 2 * np.spacing(p.astype(F32)).astype(np.float64)
        assert_within(a, r, bound, "batch-2 export vs two batch-1 runs (sigmoid mask)")


def _selfie_logits(x):
    """The logits (the final LOGISTIC's input) of the selfie model at ``x``, from LiteRT."""
    import warnings

    litert = require("ai_edge_litert.interpreter", reason="ai-edge-litert (the oracle) is not installed")
    from fbjax.formats import read_model

    graph = read_model(SELFIE).main_graph
    node = next(n for n in graph.nodes if any(o is graph.outputs[0] for o in n.outputs))
    assert node.op_name == "LOGISTIC", node.op_name
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # preserve_all_tensors "is for debugging": one tensor is read
        it = litert.Interpreter(model_path=SELFIE, experimental_preserve_all_tensors=True)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    return it.get_tensor({d["name"]: d["index"] for d in it.get_tensor_details()}[node.inputs[0].name])


# --- TFLite single-op models vs LiteRT at batch 3 --------------------------------------------

def _litert_at_batch(data: bytes, xs):
    """LiteRT builtin kernels (no XNNPACK: HARD_SWISH's optimized-kernel tail
    order) with every input resized to ``xs``' shapes."""
    litert = require("ai_edge_litert.interpreter", reason="ai-edge-litert (the oracle) is not installed")
    it = litert.Interpreter(model_content=data, experimental_op_resolver_type=
                            litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    for d, x in zip(it.get_input_details(), xs):
        it.resize_tensor_input(d["index"], list(x.shape))
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), xs):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]).copy() for d in it.get_output_details()]


TFLITE_CASES = {
    # per-sample size 15: the kernel's scalar tail (size % 4 elements of the
    # whole batch) sits at a batch-dependent place, located at run time
    "hard_swish_tail": lambda: single_op_model("HARD_SWISH", [[1, 3, 5]]),
    "hard_swish_no_tail": lambda: single_op_model("HARD_SWISH", [[1, 4, 4]]),
    # end 2**30 on the batch axis: clamping it against b was an inconclusive comparison
    "strided_slice_big_end": lambda: single_op_model(
        "STRIDED_SLICE", [[1, 4, 6], np.array([0, 1, 0], np.int32), np.array([2 ** 30, 3, 6], np.int32),
                          np.array([1, 1, 2], np.int32)], output_shapes=[[1, 2, 3]]),
    "reshape_minus1": lambda: single_op_model("RESHAPE", [[1, 3, 5], np.array([1, -1], np.int32)],
                                              output_shapes=[[1, 15]]),
    "fully_connected": lambda: single_op_model(
        "FULLY_CONNECTED", [[1, 3, 5], np.random.default_rng(1).standard_normal((7, 15)).astype(F32), None],
        output_shapes=[[1, 7]]),
}


@pytest.mark.parametrize("case", sorted(TFLITE_CASES))
def test_tflite_op_dynamic_batch_matches_litert(case):
    """Exported with a symbolic batch, called at batch 3, equals LiteRT's
    builtin kernel at batch 3 (HARD_SWISH/slices/reshape exactly: same float32
    elementwise operations in the same order, nothing summed; FULLY_CONNECTED
    within twice the float32 bound of a 15-term dot product)."""
    data = TFLITE_CASES[case]()
    m, ex = _export_dynamic(data)
    rng = np.random.default_rng(0)
    xs = [(rng.standard_normal((3,) + tuple(s.shape[1:])) * 4).astype(F32) for s in m.inputs]
    if case == "hard_swish_tail":
        # make the batch's last element (the kernel's scalar tail at batch 3:
        # 45 % 4 = 1) and the per-sample tails' elements ones whose two rounding
        # orders differ, so a tail at the wrong place fails the test
        x = xs[0].reshape(-1)
        r6 = np.clip(x + F32(3), F32(0), F32(6))
        differ = np.flatnonzero((x * (F32(1) / F32(6))) * r6 != (x * r6) * (F32(1) / F32(6)))
        assert differ.size, "no input value separates the two rounding orders"
        x[[12, 13, 14, 27, 28, 29, 42, 43, 44]] = x[differ[0]]
    y = _tuple(ex.call(m.params, *xs))
    if case == "reshape_minus1":
        # LiteRT keeps the file's [1, -1] (one row of 45 at batch 3); the batch
        # rewrite reads it as per-sample [-1, 15]: oracle = batch-1 runs stacked
        runs = [_litert_at_batch(data, [x[i:i + 1] for x in xs]) for i in range(3)]
        want = [np.concatenate([r[k] for r in runs]) for k in range(len(runs[0]))]
    else:
        want = _litert_at_batch(data, xs)
    for a, r in zip(y, want):
        assert a.shape == r.shape and a.shape[0] == 3
        if case == "fully_connected":
            # two orders of a 15-product float32 dot product: each within gamma_15 * |x| |W| of exact
            assert_within(a, r, 2 * gamma(15) * abs_magnitude(m, *xs), "FULLY_CONNECTED vs LiteRT")
        else:
            np.testing.assert_array_equal(np.asarray(a), r)


# --- ONNX -> RTen models vs onnxruntime at batch 3 ---------------------------------------------

def _onnx_model(nodes, inits, in_shape, out_shape):
    from onnx import TensorProto, helper

    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, in_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _onnx_cases():
    from onnx import helper as h
    from onnx import numpy_helper as nh

    rng = np.random.default_rng(2)
    w60 = nh.from_array(rng.standard_normal((60, 7)).astype(F32), "W")
    relu = h.make_node("Relu", ["x"], ["r"])
    i64 = lambda v, n: nh.from_array(np.array(v, np.int64), n)  # noqa: E731
    return {
        "flatten": ([relu, h.make_node("Flatten", ["r"], ["f"], axis=1), h.make_node("MatMul", ["f", "W"], ["y"])],
                    [w60], [1, 3, 4, 5], [1, 7]),
        "reshape_copy_dim": ([relu, h.make_node("Reshape", ["r", "s"], ["f"]),
                              h.make_node("MatMul", ["f", "W"], ["y"])],
                             [w60, i64([0, -1], "s")], [1, 3, 4, 5], [1, 7]),
        "resize_scales": ([h.make_node("Resize", ["x", "", "sc"], ["y"], mode="nearest")],
                          [nh.from_array(np.array([1, 1, 2, 2], F32), "sc")], [1, 2, 3, 4], [1, 2, 6, 8]),
        "conv_gap_gemm": ([h.make_node("Conv", ["x", "K"], ["c"], pads=[1, 1, 1, 1]),
                           h.make_node("GlobalAveragePool", ["c"], ["p"]),
                           h.make_node("Flatten", ["p"], ["f"], axis=1),
                           h.make_node("Gemm", ["f", "G", "gb"], ["y"], transB=1)],
                          [nh.from_array(rng.standard_normal((4, 3, 3, 3)).astype(F32), "K"),
                           nh.from_array(rng.standard_normal((5, 4)).astype(F32), "G"),
                           nh.from_array(rng.standard_normal(5).astype(F32), "gb")], [1, 3, 6, 6], [1, 5]),
        # the whole batch axis with an "end of the axis" of 2**62: clamping it against b was inconclusive
        "slice_batch_to_end": ([h.make_node("Slice", ["x", "st", "en", "ax"], ["y"])],
                               [i64([0, 1], "st"), i64([2 ** 62, 3], "en"), i64([0, 2], "ax")],
                               [1, 3, 4, 5], [1, 3, 2, 5]),
        "expand": ([h.make_node("Expand", ["x", "s"], ["y"])], [i64([3, 1, 1], "s")], [1, 1, 4, 5], [1, 3, 4, 5]),
        # Indices count over the whole batch (N*C*H*W), so ORT at batch 3 is the oracle
        "maxpool_indices": ([h.make_node("MaxPool", ["x"], ["a", "i"], kernel_shape=[2, 2], strides=[2, 2]),
                             h.make_node("Cast", ["i"], ["y"], to=1)], [], [1, 3, 4, 6], [1, 3, 2, 3]),
    }


@pytest.mark.parametrize("case", ["flatten", "reshape_copy_dim", "resize_scales", "conv_gap_gemm", "slice_batch_to_end",
                                  "expand", "maxpool_indices"])
def test_onnx_model_dynamic_batch_matches_onnxruntime(case):
    """A tiny ONNX model (converted with rten-convert) exported with a
    symbolic batch, called at batch 3, equals onnxruntime at batch 3 (the
    ONNX input's batch dim made symbolic). Tolerance: two float32
    summation orders of the chain's sums (``ONNX_SUM_LENGTHS``), each
    within ``gamma_n * sum|a_i b_i|`` of exact; exact where nothing is summed."""
    require("rten_convert", reason="rten-convert (ONNX -> .rten) is not installed")
    onnx = require("onnx")
    ort = require("onnxruntime")
    from fbjax import bench

    nodes, inits, in_shape, out_shape = _onnx_cases()[case]
    om = _onnx_model(nodes, inits, in_shape, out_shape)
    m, ex = _export_dynamic(bench._onnx_to_rten(om))
    x = np.random.default_rng(0).standard_normal((3,) + tuple(in_shape[1:])).astype(F32)
    y = _tuple(ex.call(m.params, x))[0]
    dyn = onnx.ModelProto()
    dyn.CopyFrom(om)
    dyn.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    dyn.graph.output[0].type.tensor_type.shape.ClearField("dim")
    want = ort.InferenceSession(dyn.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert y.shape == want.shape and y.shape[0] == 3
    n = ONNX_SUM_LENGTHS.get(case, 0)
    if n:
        assert_within(y, want, 2 * gamma(n) * abs_magnitude(m, x), f"{case} vs onnxruntime")
    else:  # copies, nearest resize, max-pool indices: no arithmetic on the values
        np.testing.assert_array_equal(np.asarray(y), want)


#: float32 terms summed along the longest chain of each case (ReLU and the reshapes add nothing):
#: MatMul over 60; Conv 3*3*3, GlobalAveragePool 36 and its division, Gemm 4 plus bias
ONNX_SUM_LENGTHS = {"flatten": 60, "reshape_copy_dim": 60, "conv_gap_gemm": 27 + 36 + 1 + 5}


# --- what cannot follow a symbolic batch -----------------------------------------------------

@pytest.fixture
def batch_as_number_op():
    """A custom op whose lowering needs the batch as a Python int (as a
    lowering using ``np.zeros(x.shape)`` or ``int(x.shape[0])`` does): it
    works at every concrete batch, so loading with ``batch_size=None``
    succeeds, but not at the symbolic ``b``."""
    import jax.numpy as jnp

    from fbjax.lower.registry import LOWERINGS

    name = "FbjaxTestBatchAsNumber"

    @fbjax.register_custom_op(name, replace=True)
    def lower(ctx, x, *, custom_options=b""):
        return jnp.asarray(x) + np.arange(int(x.shape[0]), dtype=F32).reshape((-1,) + (1,) * (x.ndim - 1))

    yield name
    LOWERINGS._ops.pop(("tflite.custom", name), None)


def test_non_polymorphic_op_raises_dynamic_batch_error(batch_as_number_op):
    """jax's shape-polymorphism failure inside a lowering becomes one
    DynamicBatchError naming the node and suggesting --batch-size N; the
    same model exports at a fixed batch."""
    data = single_op_model(batch_as_number_op, [[1, 4]], custom=True)
    m = fbjax.load(data, batch_size=None)
    with pytest.raises(fbexport.DynamicBatchError) as ei:
        fbexport.jax_export(m, batch_size=None)
    msg = str(ei.value)
    assert "subgraph 0, operator 0" in msg and batch_as_number_op in msg and "--batch-size N" in msg, msg
    assert "\n" not in msg
    assert ei.value.op_name == batch_as_number_op and isinstance(ei.value, fbjax.errors.FbjaxError)
    ex = fbexport.jax_export(fbjax.load(data, batch_size=2), batch_size=2)
    x = np.ones((2, 4), F32)
    np.testing.assert_array_equal(np.asarray(_tuple(ex.call({}, x))[0]), x + np.arange(2, dtype=F32)[:, None])


def test_cli_export_dynamic_prints_one_line(batch_as_number_op, tmp_path, capsys):
    """``fbjax export ... --batch-size dynamic`` on a model with such an op
    prints ``fbjax export: DynamicBatchError: ...`` (one line) and returns 1."""
    from fbjax import cli

    path = tmp_path / "m.tflite"
    path.write_bytes(single_op_model(batch_as_number_op, [[1, 4]], custom=True))
    rc = cli.main(["export", str(path), "--to", "mlir", str(tmp_path / "m.mlir"), "--batch-size", "dynamic"])
    err = capsys.readouterr().err.strip()
    assert rc == 1 and err.startswith("fbjax export: DynamicBatchError:") and "\n" not in err, err


# --- quantized TFLite models (integer-exact kernels, op set tflite.int) -----------------------

QUANT = os.path.join(os.path.dirname(__file__), "data", "quant")


def _quant_inputs(m, batch, seed=0):
    """Inputs at ``batch`` drawn as tests/test_tflite_quant.py draws them:
    float inputs uniform in [-1.2, 1.2], integer codes over their whole range."""
    rng = np.random.default_rng(seed)
    xs = []
    for s in m.inputs:
        shape = (batch,) + tuple(s.shape[1:])
        dt = np.dtype(s.dtype)
        if dt.kind == "f":
            xs.append(rng.uniform(-1.2, 1.2, shape).astype(dt))
        else:
            i = np.iinfo(dt)
            xs.append(rng.integers(i.min, i.max + 1, shape).astype(dt))
    return xs


def _export_dynamic_q(path, quantized):
    """_export_dynamic for a file loaded with ``quantized=...``."""
    m = fbjax.load(path, batch_size=None, quantized=quantized)
    ex = fbexport.jax_export(m, batch_size=None)
    assert str(ex.in_avals[-1].shape[0]) == "b", ex.in_avals
    return m, ex


def _call_exported(m, ex, xs):
    """The artifact called as a user would (no x64 needed: the int16x8
    kernels' int64 accumulators are inside the exported program)."""
    return [np.asarray(a) for a in _tuple(ex.call(m.params, *xs))]


@pytest.mark.parametrize("quantized", ["exact", "float"])
@pytest.mark.parametrize("name", ["models/ssd_head_int8", "models/ssd_head_uint8", "models/ssd_head_int16x8",
                                  "ops/add_int16x8", "ops/softmax_int16x8", "ops/conv_2d_fint8"])
def test_quantized_tflite_dynamic_batch_equals_batch1_runs(name, quantized):
    """Quantized converter fixtures (int8/uint8 whole models, int16x8, float
    in/out around QUANTIZE/DEQUANTIZE) loaded with ``batch_size=None``:
    QUANTIZE/DEQUANTIZE/int16 ADD located their kernels' vector tails with
    numpy arithmetic on the shape (``int(np.prod(x.shape))``,
    ``np.arange(x.size)``, ``np.broadcast_shapes``) and did not export; the
    int16x8 ones were refused at load (traced without x64). Now exported with
    a symbolic batch and called at batch 3 they equal three batch-1 runs of
    ``fbjax.load(path, quantized=...)``. Exact mode: bit for bit (integer
    kernels; every per-example size here is a multiple of the kernels' lane
    widths, 8 for DEQUANTIZE, 16 for QUANTIZE and int16 ADD, so batch 3 and
    batch 1 take the same rounding orders; other sizes: the next tests).
    Float mode runs float ops between fake quantizations, which two
    differently compiled programs may round differently: see
    :func:`_fake_quant_steps` for the bound."""
    path = os.path.join(QUANT, name + ".tflite")
    m, ex = _export_dynamic_q(path, quantized)
    m1 = fbjax.load(path, quantized=quantized)
    xs = _quant_inputs(m1, 3)
    if quantized == "float":
        xs = _off_grid_boundaries(m1, xs)
    y = _call_exported(m, ex, xs)
    runs = [_tuple(m1(*[x[i:i + 1] for x in xs])) for i in range(3)]
    assert len(y) == len(runs[0])
    steps = _fake_quant_steps(m1, xs) if quantized == "float" else None
    for k, a in enumerate(y):
        r = np.concatenate([np.asarray(rr[k]) for rr in runs])
        assert a.shape == r.shape and a.shape[0] == 3 and a.dtype == r.dtype
        if steps is None:
            np.testing.assert_array_equal(a, r)
        else:
            assert_within(a, r, steps[m1.outputs[k].name].reshape(a.shape), f"{name} float mode, output {k}")


def _off_grid_boundaries(m1, xs):
    """The inputs, each element whose input fake quantization's ``v = x /
    scale * gain + offset`` lies within ``2 x 4`` ulps of a half-integer
    (where two programs may round it apart: :func:`_fake_quant_steps`) moved
    by a quarter step away from it: inputs on which the equality argument
    holds (about 1 in 4000 int8 inputs, 6% of int16 ones, are that close)."""
    g = m1.ir.main_graph
    pos = {id(v): i for i, v in enumerate(g.inputs)}
    producer = {id(o): nd for nd in g.nodes for o in nd.outputs if o is not None}
    xs = [np.array(x, copy=True) for x in xs]
    for nd in g.nodes:
        if nd.op_set != "fbjax" or nd.op_name != "FAKE_QUANT":
            continue
        src = nd.inputs[0]
        while id(src) in producer and producer[id(src)].op_name == "IDENTITY":  # (an int16 input's identity)
            src = producer[id(src)].inputs[0]
        if id(src) not in pos:
            continue
        a = nd.attrs
        scale, gain, offset = float(a.get("scale", 1.0)), np.asarray(a.get("gain", 1.0)), float(a.get("offset", 0.0))
        assert np.ndim(scale) == 0 and not np.any(a.get("pre_shift", 0)), "per-channel input quantization: extend"
        x = xs[pos[id(src)]]
        v = x.astype(np.float64) / scale * gain + offset
        zp, lo, hi = float(a.get("zero_point", 0)), float(a.get("qmin", -128)), float(a.get("qmax", 127))
        near = (np.abs(np.abs(v - np.floor(v)) - 0.5) <= 2 * 4 * 2 * 2.0 ** -24 * (np.abs(v) + abs(offset)) + 1e-3) \
            & (v + zp > lo) & (v + zp < hi)  # (a boundary outside the range is clipped away)
        shift = np.where(v - np.floor(v) >= 0.5, 0.25, -0.25) * scale / gain
        x[...] = np.where(near, x + shift, x).astype(x.dtype)
    return xs


def _fake_quant_steps(m1, xs) -> dict:
    """Float mode: where two programs may differ, per output name.

    Float mode's forward values are the integer kernels' (``STRAIGHT_THROUGH``
    passes the integer path's dequantized result; the float op only gives the
    gradient), so the only float roundings the programs may take differently
    are each fake quantization's own ``v = x * f32(1/scale) * gain + offset``
    on an input, or on a dequantized integer result moved by RESHAPE/
    CONCATENATION (asserted: no other producer): at most 3 roundings, within
    ``4`` ulps of ``|v|`` per program (FMA contraction or not). Where ``v``
    is not within ``2 x 4`` ulps of a half-integer, both programs round to the
    same grid value, and by induction (integer kernels are exact) the outputs
    are equal. Checked on the batch-1 runs' pre-rounding values (numpy
    reference, float32 steps as the kernel): no fake quantization before an
    output is that close to a boundary (else the equality argument fails:
    asserted), and at an output's own fake quantization such elements may
    differ by one step (``scale``). Returns ``{output name: allowed
    |difference| [batch, ...]}``."""
    from dataclasses import replace

    from fbjax import reference
    from fbjax.reference.registry import REFERENCE

    g = m1.ir.main_graph
    producer = {id(o): nd for nd in g.nodes for o in nd.outputs if o is not None}
    moved = {"STRAIGHT_THROUGH", "RESHAPE", "CONCATENATION", "IDENTITY"}
    for nd in g.nodes:
        if nd.op_name == "FAKE_QUANT" and nd.op_set == "fbjax":
            p = producer.get(id(nd.inputs[0]))
            assert p is None or p.op_name in moved, f"{p.op_name} feeds {nd.outputs[0].name}: derive its bound"
    key = ("fbjax", "FAKE_QUANT")
    orig = REFERENCE._ops[key]
    seen = []

    def recording(ctx, x, *, scale=1.0, gain=1.0, offset=0.0, zero_point=0, qmin=-128, qmax=127, **kw):
        f = np.float32
        v = (np.asarray(x, f) * f(f(1.0) / f(scale))).astype(f)
        v = (v * np.asarray(gain, f)).astype(f) if (np.ndim(gain) or gain != 1.0) else v
        v = (v + f(offset)).astype(f) if offset else v
        room = 2 * 4 * 2 * 2.0 ** -24 * (np.abs(v) + abs(float(offset)))
        near = (np.abs(np.abs(v.astype(np.float64) - np.floor(v)) - 0.5) <= room) \
            & (v + np.asarray(zero_point, np.float64) > qmin) & (v + np.asarray(zero_point, np.float64) < qmax)
        seen.append((ctx.outputs[0].name, near, float(np.max(np.asarray(scale)))))
        return orig.fn(ctx, x, scale=scale, gain=gain, offset=offset, zero_point=zero_point, qmin=qmin, qmax=qmax,
                       **kw)

    REFERENCE._ops[key] = replace(orig, fn=recording)
    try:
        per_example = []
        for i in range(xs[0].shape[0]):
            seen.clear()
            reference.run(m1, *[x[i:i + 1] for x in xs])
            per_example.append(list(seen))
    finally:
        REFERENCE._ops[key] = orig
    outs = {o.name for o in m1.outputs}
    steps = {}
    for o in m1.outputs:
        rows = []
        for rec in per_example:
            inner = [nm for nm, near, _ in rec if nm not in outs and near.any()]
            assert not inner, f"pre-rounding values within rounding error of a grid boundary at {inner}: redraw"
            hit = [(near, sc) for nm, near, sc in rec if nm == o.name]
            rows.append(np.where(hit[-1][0], hit[-1][1], 0.0) if hit else 0.0)
        shape = tuple(o.shape[1:])
        steps[o.name] = np.stack([np.broadcast_to(np.asarray(r, np.float64).reshape(
            shape if np.size(r) > 1 else ()), shape) for r in rows])
    return steps


@pytest.mark.parametrize("name", ["ops/fully_connected_fint8", "ops/mean_fint8"])
def test_quantized_tflite_dynamic_batch_dequantize_tail_matches_litert(name):
    """DEQUANTIZE's 8-wide vector loop runs over the whole batch, its scalar
    tail (``(q - zp) * s`` instead of ``q * s - zp * s``, 1 ulp apart) is the
    last ``size % 8`` elements of the batch: per-example outputs of 7 and 6
    put it at a batch-dependent place, located at run time from the symbolic
    size. Exported with a symbolic batch, called at batch 3: equal bit for bit
    to LiteRT's builtin kernels at batch 3 (input resized) and to the model
    loaded with ``batch_size=3``; the three batch-1 runs differ from both (the
    test can see a misplaced tail)."""
    path = os.path.join(QUANT, name + ".tflite")
    m, ex = _export_dynamic_q(path, "exact")
    xs = _quant_inputs(m, 3)
    y = _call_exported(m, ex, xs)
    with open(path, "rb") as f:
        want = _litert_at_batch(f.read(), xs)
    m3 = fbjax.load(path, batch_size=3)
    static3 = _tuple(m3(*xs))
    m1 = fbjax.load(path)
    runs = [_tuple(m1(*[x[i:i + 1] for x in xs])) for i in range(3)]
    for k, (a, r) in enumerate(zip(y, want)):
        assert a.shape == r.shape and a.shape[0] == 3
        np.testing.assert_array_equal(a, r)
        np.testing.assert_array_equal(a, np.asarray(static3[k]))
        stacked = np.concatenate([np.asarray(rr[k]) for rr in runs])
        assert not np.array_equal(stacked, r), "batch-1 runs equal batch 3: the input misses the tail"


def test_int16_add_dynamic_batch_vector_tail_matches_litert():
    """int16 ADD on equal shapes (LiteRT 2.3.0): one rounding of the input
    rescale in the 16-lane vector body, two in the scalar tail (the last
    ``size % 16`` elements of the whole batch). Per-example size 7 and the
    tie input -2 of scales ``(3 * 2^-16, 1, 2^-14 * 1.0001)`` (from
    tests/test_tflite_int16_add.py): at batch 3 the body (16 elements) gives
    -1 and the tail (5) -2, while a batch-1 run (7 < 16, all tail) gives -2
    everywhere. The symbolic-batch export at batch 3 equals LiteRT at batch 3
    bit for bit."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "_int16_add_builder", os.path.join(os.path.dirname(__file__), "test_tflite_int16_add.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    data = mod.single_op_model("ADD", [1, 7], [1, 7], (3 * 2.0 ** -16, 1.0, 2.0 ** -14 * 1.0001))
    m, ex = _export_dynamic(data)
    a = np.full((3, 7), -2, np.int16)
    b = np.zeros((3, 7), np.int16)
    y = _call_exported(m, ex, [a, b])[0]
    want = _litert_at_batch(data, [a, b])[0]
    assert len(np.unique(want)) == 2, want  # body and tail differ: the input separates them
    np.testing.assert_array_equal(y, want)
    m1 = fbjax.load(data)
    assert not np.array_equal(np.concatenate([np.asarray(m1(a[i:i + 1], b[i:i + 1])) for i in range(3)]), want)


def test_jax_export_refuses_a_batch_the_loaded_model_cannot_take():
    """``jax_export(model, batch_size=None or N)`` of a model loaded with the
    file's fixed batch used to export batch 1 silently; it raises, naming the
    load to use. The batch the model has (and ``"file"``) still export."""
    data = single_op_model("HARD_SWISH", [[1, 4, 4]])
    m = fbjax.load(data)
    for bs in (None, 4):
        with pytest.raises(fbjax.InputError, match=r"fbjax.load\(path, batch_size=None\)"):
            fbexport.jax_export(m, batch_size=bs)
    assert fbexport.jax_export(m, batch_size=1).in_avals[-1].shape == (1, 4, 4)
    assert fbexport.jax_export(fbjax.load(data, batch_size=4), batch_size=4).in_avals[-1].shape == (4, 4, 4)
