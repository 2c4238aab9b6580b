"""Per-op tests on tiny models written with :mod:`fbjax.formats.tflite_builder`.

Each case (``tests/tflite_op_cases.py``) builds a one- or two-op ``.tflite`` model and random inputs; the
oracle is LiteRT (default resolver, XNNPACK applied). Every case is checked
twice, once for fbjax's JAX lowering (``fbjax.load(model)(*inputs)``) and once
for fbjax's numpy reference (``fbjax.reference.run``), so a failure names the
side that is wrong. Where the semantics are plain numpy (strided slices, depth
to space, pads, reshapes) the case also carries a numpy result, which checks
the test itself against LiteRT.

Tolerance (issue 15 item 1): derived from what the model's op computes
(:func:`op_bounds.op_bound`: 0 for moves, pads, max pools and other ops that
round nothing; ``gamma(n)`` times the sum of magnitudes for convolutions,
pools, means and matmuls; ulps of the result for element-wise arithmetic,
plus ``TRANS_ULPS`` for a fused tanh): the sum of the two implementations'
rounding errors. An indexing or padding mistake moves values by O(1).
"""

from __future__ import annotations

import re
from typing import Callable

import numpy as np
import pytest

import fbjax
from fbjax.formats.tflite_builder import single_op_model

from conftest import assert_within, declared_output_shapes, gamma, litert_run
from op_bounds import EXACT, op_bound
from tflite_op_cases import ACTIVATION_CASES, ALL_CASES, CONV_CASES, DEPTHWISE_CASES, Case

F32 = np.float32


# --- the checks --------------------------------------------------------------------------------

_ORACLE_CACHE: dict = {}


def _oracle(case: Case):
    """(model, inputs, LiteRT outputs), computed once per case and sanity-checked."""
    if case.id not in _ORACLE_CACHE:
        built = case.make()
        oracle_model = built.oracle_model or built.model
        expected = litert_run(oracle_model, built.inputs)
        # The test model itself must be right: LiteRT recomputes output shapes,
        # fbjax reads the declared ones.
        assert [e.shape for e in expected] == declared_output_shapes(built.model), \
            f"{case.id}: the test declares output shapes LiteRT does not produce"
        if built.numpy is not None:
            _within(case, built.model, built.inputs, list(built.numpy), expected, "LiteRT vs numpy")
        _ORACLE_CACHE[case.id] = (built.model, built.inputs, expected)
    return _ORACLE_CACHE[case.id]


def _as_list(out) -> list:
    return [np.asarray(o) for o in (out if isinstance(out, (tuple, list)) else [out])]


def run_fbjax(model, inputs) -> list:
    return _as_list(fbjax.load(model)(*inputs))


def run_reference(model, inputs) -> list:
    from fbjax import reference

    return _as_list(reference.run(model, *inputs))


def _main_op(model: bytes):
    """``(name, attrs)`` of the op that computes: the last one that is not a
    move or a DEQUANTIZE (fp16 weights widen exactly), else the last."""
    from fbjax.formats.tflite import read

    nodes = read(model).main_graph.nodes
    main = [n for n in nodes if n.op_name not in EXACT | {"DEQUANTIZE"}] or nodes
    return main[-1].op_name, dict(main[-1].attrs)


def _within(case: Case, model: bytes, inputs, got, expected, label: str) -> None:
    """Each output within its derived bound (integer outputs exactly)."""
    op, attrs = _main_op(model)
    m = fbjax.load(model)
    assert len(got) == len(expected), f"{case.id}: {len(got)} outputs, LiteRT gives {len(expected)}"
    for k, (g, e) in enumerate(zip(got, expected)):
        bound, why = op_bound(op, m, inputs, expected, k, attrs)
        assert bound is not None, f"{case.id}: {why}"
        assert_within(g, e, bound, f"{case.id}: {label}, output {k} [{op}: {why}]")


def _check(case: Case, impl: Callable, label: str) -> None:
    model, inputs, expected = _oracle(case)
    _within(case, model, inputs, impl(model, inputs), expected, f"{label} vs LiteRT")


@pytest.mark.parametrize("case", ALL_CASES, ids=lambda c: c.id)
def test_op_fbjax_matches_litert(case):
    _check(case, run_fbjax, "fbjax")


@pytest.mark.parametrize("case", ALL_CASES, ids=lambda c: c.id)
def test_op_reference_matches_litert(case):
    _check(case, run_reference, "fbjax.reference")


DEPTHWISE_STRATEGY_CASES = [c for c in DEPTHWISE_CASES if "s2-k3-7x7" in c.id or "dil" in c.id
                            or "mult" in c.id] + [ACTIVATION_CASES[-1]]


@pytest.mark.parametrize("case", DEPTHWISE_STRATEGY_CASES, ids=lambda c: c.id)
def test_depthwise_strategies_agree(case):
    """The two depthwise lowerings ("conv": a feature-grouped convolution;
    "shifted": multiply-adds of shifted slices) give the same result, and both
    match LiteRT."""
    import jax

    model, inputs, expected = _oracle(case)
    results = {}
    for strategy in ("conv", "shifted"):
        m = fbjax.load(model, kernel_options=fbjax.KernelOptions(depthwise_strategy=strategy))
        jaxpr = str(jax.make_jaxpr(m.apply)(m.params, *inputs))
        grouped = any(int(g) > 1 for g in re.findall(r"feature_group_count=(\d+)", jaxpr))
        # the strategy really switched: only "conv" emits a grouped convolution
        assert grouped == (strategy == "conv"), f"{case.id}: strategy {strategy} not applied"
        results[strategy] = _as_list(m(*inputs))
        _within(case, model, inputs, results[strategy][:1], expected[:1], f"strategy {strategy} vs LiteRT")
    assert_within(results["conv"][0], results["shifted"][0], _conv_strategy_bound(m, inputs, depthwise=True),
                  f"{case.id}: strategy conv vs shifted")


SMALL_CONV_CASES = [c for c in CONV_CASES if "grouped" not in c.id and "k1" not in c.id]


@pytest.mark.parametrize("case", SMALL_CONV_CASES, ids=lambda c: c.id)
def test_small_conv_strategies_agree(case):
    """CONV_2D with few input channels: XLA's convolution
    (``KernelOptions(small_conv_taps=0)``, every backend but CPU) and the CPU
    sum over kernel taps (:func:`fbjax.lower.kernels._taps_conv`, the CPU
    default for these 3-channel cases, 5x5 included at a raised limit) both
    match LiteRT and each other."""
    import jax

    model, inputs, expected = _oracle(case)
    results = {}
    for taps in (0, 75):
        m = fbjax.load(model, kernel_options=fbjax.KernelOptions(small_conv_taps=taps, small_conv_max_out=16))
        jaxpr = str(jax.make_jaxpr(m.apply)(m.params, *inputs))
        convs = "conv_general_dilated" in jaxpr
        # the setting really switched (on CPU): only taps=0 emits a convolution
        assert convs == (taps == 0 or jax.default_backend() != "cpu"), f"{case.id}: taps={taps} not applied"
        results[taps] = _as_list(m(*inputs))
        _within(case, model, inputs, results[taps][:1], expected[:1], f"taps={taps} vs LiteRT")
    assert_within(results[0][0], results[75][0], _conv_strategy_bound(m, inputs, depthwise=False),
                  f"{case.id}: convolution vs taps")


def _conv_strategy_bound(m, inputs, *, depthwise: bool) -> np.ndarray:
    """Two summation orders of one (depthwise) convolution: ``n`` = kernel taps
    (times input channels for CONV_2D) plus the bias, each order within
    ``gamma_n * (|x| * |w| + |b|)`` of exact; the fused activation is
    1-Lipschitz. The magnitude is the model on ``|x|`` and ``|params|`` with
    the input and bias scaled by ``2**-30`` (exact; small enough that no
    activation clips or bends), scaled back."""
    (w,) = [np.asarray(v) for v in m.params.values() if np.ndim(v) == 4]
    n = w.shape[1] * w.shape[2] * (1 if depthwise else w.shape[3]) + 1
    sc = 2.0 ** -30
    p = {k: np.abs(np.asarray(v)) * (sc if np.ndim(v) == 1 else 1) for k, v in m.params.items()}
    mag = np.asarray(_as_list(m.apply(p, *[np.abs(x) * np.float32(sc) for x in inputs]))[0], np.float64) / sc
    return 2 * gamma(n) * mag


def test_writer_models_round_trip_through_frontend():
    """What fbjax.formats.tflite_builder writes is what fbjax's frontend reads back."""
    from fbjax.formats.tflite import read

    x = np.arange(12, dtype=F32).reshape(3, 4)
    model = single_op_model("FULLY_CONNECTED", [(2, 4), x, None],
                            options=dict(keep_num_dims=True, fused_activation_function="RELU6"),
                            output_shapes=[(2, 3)])
    ir = read(model)
    g = ir.main_graph
    assert [n.op_name for n in g.nodes] == ["FULLY_CONNECTED"]
    node = g.nodes[0]
    assert node.attrs["keep_num_dims"] is True
    assert node.attrs["fused_activation_function"] == "RELU6"
    assert node.inputs[2] is None
    np.testing.assert_array_equal(node.inputs[1].data, x)
    assert [tuple(v.shape) for v in g.inputs] == [(2, 4)]
    assert [tuple(v.shape) for v in g.outputs] == [(2, 3)]


# --- edge values, bit for bit against LiteRT ------------------------------------------------------

def _edge_models():
    """``(id, model, inputs)``: ops whose float semantics show at edge values:
    MAXIMUM/MINIMUM (``a > b ? a : b``: NaN and signed zeros depend on the
    operand order), CAST float -> integer (saturating, NaN to the maximum),
    DIV by a broadcast divisor (one rounding per element, not ``x * (1/y)``),
    FLOOR_DIV (the floor of the exact quotient: LiteRT divides in double)."""
    edges = np.array([np.nan, 0.0, -0.0, np.inf, -np.inf, 1.5], F32)
    a, b = (v.reshape(-1).copy() for v in np.meshgrid(edges, edges))
    out = [(op, single_op_model(op, [(36,), (36,)], output_shapes=[(36,)]), [a, b]) for op in ("MAXIMUM", "MINIMUM")]
    x = np.array([np.nan, np.inf, -np.inf, 1e10, -1e10, 300.7, -300.7, -0.9, 2.5, -2.5, 255.9, 2147483520.0], F32)
    for dt in (np.uint8, np.int8, np.int32):
        out.append((f"CAST-{np.dtype(dt).name}", single_op_model("CAST", [x.shape], output_shapes=[x.shape],
                                                                  output_dtypes=[dt], input_dtypes=[F32]), [x]))
    rng = np.random.default_rng(0)
    num, den = rng.standard_normal((8, 3, 4)).astype(F32), rng.standard_normal((3, 4)).astype(F32)
    out.append(("DIV-broadcast", single_op_model("DIV", [num.shape, den.shape], output_shapes=[num.shape]),
                [num, den]))
    # exact multiples (quotients that round up to an integer in float32), signed zeros, infinities, NaN
    num = (rng.integers(-50, 50, (8, 3, 4)) * den).astype(F32)
    num.reshape(-1)[:8] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e30, -3e-38, 0.5]
    out.append(("FLOOR_DIV", single_op_model("FLOOR_DIV", [num.shape, den.shape], output_shapes=[num.shape]),
                [num, den]))
    return out


@pytest.mark.parametrize("name,model,inputs", [pytest.param(*m, id=m[0]) for m in _edge_models()])
def test_edge_values_match_litert_bits(name, model, inputs):
    """Both fbjax and its numpy reference give LiteRT's bits (NaN where
    LiteRT has NaN): each op here is one comparison, conversion or correctly
    rounded division per element, so any correct implementation agrees."""
    from fbjax import reference

    (want,) = litert_run(model, inputs)
    for label, got in (("fbjax", run_fbjax(model, inputs)[0]), ("reference", _as_list(reference.run(model, *inputs))[0])):
        assert got.dtype == want.dtype and got.shape == want.shape, f"{name}: {label} {got.dtype}{got.shape}"
        if want.dtype.kind == "f":
            nan = np.isnan(want)
            assert np.array_equal(np.isnan(got), nan), f"{name}: {label} NaNs differ from LiteRT"
            same = got.view(np.uint32) == want.view(np.uint32)
            assert (same | nan).all(), f"{name}: {label} {got[~(same | nan)]} != LiteRT {want[~(same | nan)]}"
        else:
            np.testing.assert_array_equal(got, want, err_msg=f"{name}: {label} vs LiteRT")
