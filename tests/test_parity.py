"""Lowering/twin parity for the TFLite and StableHLO op sets (issue 27 item 3).

Every op registered in :data:`fbjax.lower.LOWERINGS` has a numpy twin in
:data:`fbjax.reference.registry.REFERENCE` (and the reverse) with the same
static inputs and attribute names; the op sets ``"tflite"``,
``"tflite.custom"``, ``"tflite.int"``, ``"tflite.hybrid"``, ``"fbjax"``
(fake quantization), ``"stablehlo"``, ``"stablehlo.custom_call"`` and the
composite registries (:mod:`fbjax.lower.composites` /
:mod:`fbjax.reference.composites`). ONNX has its own check
(``tests/test_onnx_conformance.py``), the GPU op set too.

Then each registered op runs in at least one generated case
(:mod:`parity_cases`: a small model, seeded random inputs of a valid shape
and dtype) through ``fbjax.load`` and through ``fbjax.reference.run`` on the
loaded model, and the two agree:

* integer and bool outputs exactly; float outputs of the cases marked
  ``"exact"`` (the integer kernels ``tflite.int`` and ``tflite.hybrid``:
  TFLite's kernels bit for bit; data movement; edge values) bit for bit,
  signed zeros included (NaN where the twin has NaN);
* float outputs within the bound derived from what the op computes
  (:mod:`op_bounds`: 0 for moves and single correctly rounded operations,
  ulps of the result for transcendental functions, ``gamma(n)`` times the
  sum of magnitudes for sums; :func:`_float_bound`);
* random draws (``RANDOM_*``, ``MULTINOMIAL``): shapes, dtypes and support only
  (the lowering draws with JAX's PRNG, the twin with numpy's generator);
* ``quantized="float"`` (the ``"fbjax"`` fake-quantization ops): within one
  quantization step.

The quantized fixtures (``tflite.int``, ``tflite.hybrid``, ``fbjax``) run 3
more seeded inputs on the same compiled model.

The registries are read when this module is imported (at collection), so
custom ops and custom-call targets that other tests register while they run
are not counted.

The ops a case exercised are read from the loaded IR (every graph, region
bodies included), so the coverage assertion (:func:`test_every_op_has_a_case`)
counts what really ran: a newly registered op without a case fails it.
Exclusions carry their reason in :data:`NO_CASE`.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

import fbjax
import fbjax.formats
from fbjax import reference
from fbjax.lower import LOWERINGS
from fbjax.lower.composites import COMPOSITES as LOWER_COMPOSITES
from fbjax.reference.composites import COMPOSITES as REFERENCE_COMPOSITES
from fbjax.reference.registry import REFERENCE

from conftest import U32, assert_within, bilinear_bound
from op_bounds import TRANS_ULPS, fixture_bound, op_bound
import parity_cases as pc

#: the op sets checked here (ONNX and GPU have their own parity tests)
OP_SETS = ("tflite", "tflite.custom", "tflite.int", "tflite.hybrid", "fbjax", "stablehlo",
           "stablehlo.custom_call", "composite")
#: op sets whose lowering/twin parity is checked in another module
PARITY_ELSEWHERE = {
    "gpu_cl": "tests/test_parity_gpu.py",
    "onnx": "tests/test_onnx_conformance.py (test_every_rten_op_has_lowering_and_twin; the node suite runs both)",
}


def _registered(registry) -> dict:
    return {od.key: od for od in registry}


# fbjax's own registrations, taken when this module is imported (at collection, before any test
# registers a custom op or custom call of its own: tests/test_tflite_builtins.py, test_tflite_stablehlo.py)
_LOWER = {k: v for k, v in {**_registered(LOWERINGS), **_registered(LOWER_COMPOSITES)}.items() if k[0] in OP_SETS}
_TWIN = {k: v for k, v in {**_registered(REFERENCE), **_registered(REFERENCE_COMPOSITES)}.items() if k[0] in OP_SETS}

#: ops with a twin and no lowering, with the reason
TWIN_ONLY = {
    ("tflite", "QUANTIZE"): (
        "fbjax.load never lowers a float-set QUANTIZE: fbjax.passes.quantization.rewrite_quantized moves it to tflite.int "
        "(quantized='exact') or rewrites it to fbjax FAKE_QUANT (quantized='float'); the twin runs files read "
        "without those passes (fbjax.reference.run on a path)"),
}

#: ops whose lowering and twin declare different static inputs, with the reason. The reference
#: receives every input as a numpy array, so there the declaration changes nothing; the registration
#: lines should agree (helper `facts` owns them): an entry that no longer differs fails below.
STATIC_INPUTS_DIFFER = {
    ("tflite", "SLICE"): "the lowering takes begin traced (lax.dynamic_slice), the twin declares it static",
    **{("tflite.int", n): "the integer twins declare no static inputs"
       for n in ("MEAN", "SUM", "PAD", "PADV2", "RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR", "TRANSPOSE",
                 "TRANSPOSE_CONV")},
    ("tflite.hybrid", "TRANSPOSE_CONV"): "the hybrid twin declares no static inputs",
    ("fbjax", "QUANTIZE_WEIGHTS"): "the fake-quantization twin declares no static inputs",
}

#: registered ops without a generated case, with the reason (none today)
NO_CASE: dict = {}


# --- registry coverage ---------------------------------------------------------------------------

@pytest.mark.parametrize("op_set", OP_SETS)
def test_every_lowering_has_a_twin(op_set):
    """Same keys both ways (an op without a twin fails), the same attribute
    names and static inputs, and docstrings on both sides."""
    low = {k for k in _LOWER if k[0] == op_set}
    twin = {k for k in _TWIN if k[0] == op_set}
    assert low, f"no lowerings registered for {op_set!r}"
    assert sorted(low - twin) == [], f"{op_set}: lowerings without a numpy twin"
    assert sorted(twin - low - set(TWIN_ONLY)) == [], f"{op_set}: numpy twins without a lowering"
    stale = [k for k in TWIN_ONLY if k[0] == op_set and k in low]
    assert not stale, f"TWIN_ONLY lists ops that now have a lowering: {stale}"
    attr_diff, static_diff, no_doc = {}, {}, []
    for key in sorted(low & twin):
        f, g = _LOWER[key], _TWIN[key]
        if f.attr_names != g.attr_names or f.accepts_any_attr != g.accepts_any_attr:
            attr_diff[key] = (sorted(f.attr_names - g.attr_names), sorted(g.attr_names - f.attr_names))
        if (f.static_inputs != g.static_inputs) != (key in STATIC_INPUTS_DIFFER):
            static_diff[key] = (f.static_inputs, g.static_inputs)
        if not (f.fn.__doc__ and g.fn.__doc__):
            no_doc.append(key)
    assert not attr_diff, f"{op_set}: attribute names differ (lowering only, twin only): {attr_diff}"
    assert not static_diff, (f"{op_set}: static inputs (lowering, twin) differ, or an entry of "
                             f"STATIC_INPUTS_DIFFER no longer differs: {static_diff}")
    assert not no_doc, f"{op_set}: missing docstrings: {no_doc}"


# --- generated cases -------------------------------------------------------------------------------

ALL_CASES = list({c.id: c for s in OP_SETS for c in pc.CASES_BY_OP_SET[s]}.values())

#: case id -> registry keys it exercised (filled as the cases run; read by the coverage test)
COVERED: dict = {}


@pytest.fixture(autouse=True)
def _ir_reader(monkeypatch):
    monkeypatch.setitem(fbjax.formats.READERS, pc.IR_FORMAT, pc.read_ir_model)


def _as_list(out) -> list:
    return [np.asarray(o) for o in (out if isinstance(out, (list, tuple)) else [out])]


def _keys(model) -> set:
    keys = set()
    for node in model.ir.iter_nodes():
        keys.add(node.key)
        if node.key == ("stablehlo", "stablehlo.composite"):
            keys.add(("composite", str(node.attrs.get("name"))))
        if node.key == ("stablehlo", "stablehlo.custom_call"):
            keys.add(("stablehlo.custom_call", str(node.attrs.get("call_target_name"))))
    return keys


def _run(case: pc.ParityCase):
    """``(model, inputs, lowering outputs, twin outputs)``; records the keys it ran."""
    source, xs = case.make()
    m = fbjax.load(source, format=case.format, **case.load_kwargs)
    got = _as_list(m(*xs))
    ref_kwargs = {k: v for k, v in case.load_kwargs.items() if k == "composites"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        want = _as_list(reference.run(m, *xs, **ref_kwargs))
    for w in caught:
        if "the file's declared shape is wrong" in str(w.message):
            # a placeholder the file declares (TF's converter writes () for the output of a
            # dynamic-batch SQUEEZE): the twin says so only where the declared shape does not fit
            assert not all(_fits(o.shape, np.shape(y)) for o, y in zip(m.outputs, want)), str(w.message)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    COVERED[case.id] = _keys(m)
    return m, xs, got, want


def _fits(declared, shape) -> bool:
    """Whether a declared output shape (``None`` dimensions unknown) admits ``shape``."""
    return declared is None or (len(declared) == len(shape)
                                and all(d is None or d == s for d, s in zip(declared, shape)))


def _attrs_of(m, op) -> dict:
    return next((dict(n.attrs) for n in m.ir.iter_nodes() if n.op_name == op), {})


def _float_bound(case: pc.ParityCase, m, xs, want, k):
    """``(bound, reason)`` for float output ``k`` of a ``"bound"`` case."""
    e = np.abs(np.asarray(want[k], np.float64))
    rule = case.op
    if case.op_set == "stablehlo":
        rule = pc.STABLEHLO_RULES.get(case.op)
        if rule is None:
            return np.zeros_like(e), "exact: moves, selections, comparisons, single correctly rounded operations"
        x = np.abs(np.asarray(xs[0], np.float64)) if xs else 0
        if rule == "SUMS":
            return op_bound("SUM", m, xs, want, k)
        if rule in ("CBRT", "EXPM1", "LOG1P"):  # relative accuracy (expm1/log1p exist for it), + 2u absolute
            return 2 * (TRANS_ULPS * 2 * U32 * e + 2 * U32), f"{TRANS_ULPS:g} ulps + 2u absolute per side"
        if rule == "TAN":  # sin/cos reduction absolute in u max(1, |x|), amplified by tan' = 1 + tan^2
            return (2 * (TRANS_ULPS * 2 * U32 * e + 2 * U32 * np.maximum(1, x) * (1 + e * e)),
                    "tan: ulps + absolute reduction error times 1 + tan^2")
        if rule == "BATCH_NORM":
            ir = pc.read_ir_model(b"fbjax-parity-ir:stablehlo.batch_norm_inference")
            scale, offset, mean, var = (np.asarray(v.data, np.float64) for v in ir.main_graph.nodes[0].inputs[1:])
            shp = (1, -1, 1)
            terms = (np.abs(scale).reshape(shp) * (x + np.abs(mean).reshape(shp)) / np.sqrt(var + 1e-3).reshape(shp)
                     + np.abs(offset).reshape(shp))
            return 2 * 8 * U32 * terms, "x - mean, + eps, sqrt, /, *, + offset: 8 roundings of the terms per side"
        return op_bound(rule, m, xs, want, k)
    if rule == "MEDIAPIPE_GEOMETRY":
        # matrices from atan2/cos/sin of float32 values (TRANS_ULPS each) multiplied in chains of up to
        # 4 matrices of 4-term dot products: per side within (3 TRANS_ULPS + 3 gamma_4 / u) u of the terms,
        # whose magnitude is bounded by the largest input or output value (pixel sizes, landmarks)
        mag = max([float(np.abs(np.asarray(x, np.float64)).max()) for x in xs] + [float(e.max()), 60.0])
        n = 3 * TRANS_ULPS + 3 * 4
        return np.full_like(e, 2 * n * U32 * mag * 4), f"2 x {n:g} u x 4 terms x {mag:.3g}"
    if rule == "MEDIAPIPE_BILINEAR":
        mat = np.abs(np.asarray(xs[1], np.float64))[0]
        out_hw = max(want[k].shape[1:3])
        extent = float(mat[:2, :3].sum(1).max() * out_hw + mat[:2, 3].max() + max(xs[0].shape[1:3]))
        return (np.full_like(e, bilinear_bound(float(np.abs(xs[0]).max()), extent)),
                f"bilinear_bound, coordinates up to {extent:.3g}")
    if rule == "Convolution2DTransposeBias":
        return op_bound(rule, m, xs, want, k)
    if case.id in CONTROL_BOUNDS:
        return CONTROL_BOUNDS[case.id](m, xs, want, k)
    return fixture_bound(case.ops, rule, m, xs, want, k, _attrs_of(m, rule))


def _recurrent(m, xs, want, k):
    """Keras RNN/GRU/LSTM layers as WHILE loops: per time step a dot product
    and activations, errors adding over the steps (op_bounds' recurrent rule)."""
    return op_bound("UNIDIRECTIONAL_SEQUENCE_LSTM", m, xs, want, k)


def _call(m, xs, want, k):
    """``x * y + x`` in the called subgraph: two roundings (or one FMA) of
    the terms per side."""
    x, y = (np.asarray(v, np.float64) for v in xs)
    return 2 * 2 * U32 * (np.abs(x * y) + np.abs(x)), "x * y + x: 2 roundings of the terms per side"


def _nested_if(m, xs, want, k):
    """One branch of ``x * 2`` (exact), ``exp(x)`` (TRANS_ULPS) or ``x - 1``
    (one rounding)."""
    return 2 * TRANS_ULPS * 2 * U32 * np.abs(np.asarray(want[k], np.float64)), f"{TRANS_ULPS:g} ulps per side"


def _resource_variables(m, xs, want, k):
    """``total * 0.5 + x`` (the product exact, one rounding), times the step
    count 1 (exact): one rounding per side."""
    return 2 * 2 * U32 * np.abs(np.asarray(want[k], np.float64)), "1 ulp per side"


def _while_data_dependent(m, xs, want, k):
    """``y <- 1.7 y + 0.1`` while ``sum|y| < 100``: each step rounds twice
    (``2u (1.7|y| + 0.1)``) and multiplies the error so far by 1.7, as it
    multiplies ``y``: after ``T`` steps ``2u T (|y_T| + 1)`` per side. The trip
    count ``T`` is counted in float64 (the exit sums are far from 100 on this
    seed's input, or the two sides would not agree on it)."""
    y, steps = np.asarray(xs[0], np.float64), 0
    while np.abs(y).sum() < 100.0:
        y, steps = y * 1.7 + 0.1, steps + 1
    e = np.abs(np.asarray(want[k], np.float64))
    return 2 * 2 * U32 * steps * (e + 1), f"{steps} steps x 2 roundings of |y| + 1 per side"


def _while_input_trip_count(m, xs, want, k):
    """``y <- 0.9 y + sin(y)`` for ``n`` steps: per step ``TRANS_ULPS + 2``
    roundings of terms up to ``0.9|y| + 1``, the error so far multiplied by
    at most ``0.9 + |cos y| <= 1.9``; ``|y|`` grows by at most 1.9 per step."""
    n = int(np.asarray(xs[1]).reshape(-1)[0])
    ymax = float(np.abs(np.asarray(xs[0], np.float64)).max()) * 1.9 ** n + n
    per = sum(1.9 ** (n - t) * (TRANS_ULPS + 2) * 2 * U32 * (0.9 * ymax + 1) for t in range(1, n + 1))
    return np.full_like(np.asarray(want[k], np.float64), 2 * per), f"{n} steps, error gain <= 1.9 per step"


def _detection(m, xs, want, k):
    """TFLite_Detection_PostProcess: boxes decoded with a division, ``exp``
    and a few products and sums of anchor-sized terms (TRANS_ULPS + 6
    roundings per side); scores, classes and counts are selections (exact)."""
    e = np.abs(np.asarray(want[k], np.float64))
    if k != 0:
        return np.zeros_like(e), "selected values: exact"
    return np.full_like(e, 2 * (TRANS_ULPS + 6) * 2 * U32 * max(1.0, float(e.max()))), "box decoding"


#: fixture cases whose op runs other ops (control flow, state) or is a pipeline of its own
CONTROL_BOUNDS = {
    "builtin-call": _call,
    "builtin-nested_if": _nested_if,
    "builtin-resource_variables": _resource_variables,
    "builtin-while_data_dependent": _while_data_dependent,
    "builtin-while_input_trip_count": _while_input_trip_count,
    **{f"builtin-keras_{n}": _recurrent for n in ("gru", "lstm", "simple_rnn", "bidirectional_lstm")},
    "builtin-detection_postprocess_fast": _detection,
    "builtin-detection_postprocess_regular": _detection,
}


def _fq_step(m) -> float:
    """The largest quantization step (``scale``) of the model's FAKE_QUANT nodes."""
    steps = [float(np.max(np.abs(n.attrs["scale"]))) for n in m.ir.iter_nodes() if n.key == ("fbjax", "FAKE_QUANT")]
    assert steps, "a quantized='float' case without FAKE_QUANT"
    return max(steps)


def _compare(case: pc.ParityCase, m, xs, got, want) -> None:
    what = f"{case.id}: lowering vs numpy twin"
    assert len(got) == len(want), f"{what}: {len(got)} outputs, the twin gives {len(want)}"
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and g.dtype == w.dtype, \
            f"{what}, output {k}: {g.dtype}{g.shape} != twin {w.dtype}{w.shape}"
        if case.compare == "random":
            # RANDOM_STANDARD_NORMAL / RANDOM_UNIFORM / MULTINOMIAL: different generators, same support
            if w.dtype.kind == "f":
                assert np.isfinite(g).all() and np.isfinite(w).all(), what
                if case.op == "RANDOM_UNIFORM":
                    assert ((0 <= g) & (g < 1)).all() and ((0 <= w) & (w < 1)).all(), what
            else:
                assert g.min() >= 0 and w.min() >= 0 and g.max() == g.max(), what
                lim = max(int(np.asarray(xs[0]).shape[-1]), 1)
                assert g.max() < lim and w.max() < lim, f"{what}: class index out of range"
            continue
        if w.dtype.kind != "f":
            np.testing.assert_array_equal(g, w, err_msg=f"{what}, output {k}")
            continue
        if case.compare == "exact":  # the same bits (signed zeros too), NaN where the twin has NaN
            nan = np.isnan(w)
            assert np.array_equal(np.isnan(g), nan), f"{what}, output {k}: NaNs at other places"
            ib = np.dtype(f"u{w.dtype.itemsize}")
            diff = np.flatnonzero((g.view(ib) != w.view(ib)) & ~nan)
            assert diff.size == 0, (f"{what}, output {k}: {diff.size} of {w.size} elements differ in their bits, "
                                    f"first at {diff[0]}: {g.ravel()[diff[0]]!r} != {w.ravel()[diff[0]]!r}")
            continue
        if case.compare == "fq_step":
            assert_within(g, w, _fq_step(m) * (1 + 4 * U32), f"{what}, output {k} [one fake-quant step]")
        elif case.compare == "relative":
            err = float(np.max(np.abs(g.astype(np.float64) - w) / np.maximum(1.0, np.abs(w))))
            assert err <= case.tol, f"{what}, output {k}: relative error {err:.3g} > {case.tol:.3g}"
        else:
            bound, why = _float_bound(case, m, xs, want, k)
            assert bound is not None, f"{case.id}: {why}"
            assert_within(g, w, bound, f"{what}, output {k} [{why}]")


@pytest.mark.parametrize("case", [pytest.param(c, id=f"{c.op_set}:{c.id}", marks=[pytest.mark.slow] if c.slow else [])
                                  for c in ALL_CASES])
def test_lowering_matches_twin(case):
    m, xs, got, want = _run(case)
    _compare(case, m, xs, got, want)
    if case.more_inputs is not None:  # the quantized fixtures: 3 more seeds on the same compiled model
        ref_kwargs = {k: v for k, v in case.load_kwargs.items() if k == "composites"}
        for k in (1, 2, 3):
            xs = case.more_inputs(k)
            _compare(case, m, xs, _as_list(m(*xs)), _as_list(reference.run(m, *xs, **ref_kwargs)))


@pytest.mark.parametrize("op_set", OP_SETS)
def test_every_op_has_a_case(op_set):
    """The ops the default (not ``slow``) cases of ``op_set`` ran (read from
    the loaded IRs) are every registered op of the set but the
    :data:`NO_CASE` exclusions. Runs each case not run yet (a ``-k``
    selection) once more."""
    cases = [c for c in pc.CASES_BY_OP_SET[op_set] if not c.slow]  # the default run covers every op
    for case in cases:
        if case.id not in COVERED:
            _run(case)
    ran = set().union(*(COVERED[c.id] for c in cases))
    registered = {k for k in _LOWER if k[0] == op_set}
    excluded = {k for k in NO_CASE if k[0] == op_set}
    missing = sorted(registered - ran - excluded)
    assert missing == [], f"{op_set}: registered ops without a generated case: {missing}"
    assert not sorted(excluded & ran), f"NO_CASE lists ops that have a case now: {sorted(excluded & ran)}"
    with_case = registered & ran
    assert len(with_case) == len(registered) - len(excluded)
    print(f"[parity] {op_set}: {len(registered)} registered, {len(with_case)} with a generated case, "
          f"{len(excluded)} excluded")


def test_every_op_set_has_a_parity_test():
    """Each op set the lowering registers is checked here or in the module
    :data:`PARITY_ELSEWHERE` names, so a new op set cannot go unchecked."""
    sets = set(LOWERINGS.ops())
    missing = sorted(sets - set(OP_SETS) - set(PARITY_ELSEWHERE))
    assert not missing, f"op sets without a lowering/twin parity test: {missing}"
    for where in PARITY_ELSEWHERE.values():
        assert (Path(__file__).parent.parent / where.split()[0]).is_file(), where
