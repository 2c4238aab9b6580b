"""ONNX conformance of the RTen path: ONNX model -> rten-convert -> fbjax.

Two suites, both converted with rten-convert 0.22 (in process, see
``rten_convert_tools.py``):

* the ONNX backend **node** test suite
  (``onnx.backend.test.case.node.collect_testcases(None)``, ~1,880 cases;
  rten-convert converts ~900). Every converted case runs against the
  expected outputs stored with it, at the case's own tolerances (ONNX's
  runner defaults: ``rtol=1e-3``, ``atol=1e-7``). The suite runs in two
  modes, each rate over all converted cases:

  - **as converted**: the ``.onnx`` converted as it is. rten-convert 0.22
    writes a Softmax/LogSoftmax without ``axis`` with axis 0, not ONNX's
    default, so those cases compute something else (fbjax follows the file).
  - **with explicit ONNX defaults**: the semantics-preserving ONNX-level
    pre-pass :func:`rten_convert_tools.make_defaults_explicit` states the
    axis ONNX defines before converting. Only cases the pre-pass changes are
    re-converted and re-run; the others keep their as-converted result.

  Cases fbjax is known to fail are listed in ``onnx_excludes.py``, one reason
  each, tagged with the modes it applies to. A fixed fast subset runs by
  default; the whole suite and the pass-rate check run under ``-m slow``
  (>= 95% with explicit defaults, >= 90% as converted, no failure outside
  the exclude list in either mode). Inputs that fix output shapes (a Reshape
  shape fed as a graph input...) make a jitted call fail with a clear error;
  the harness then re-runs the data set with those inputs bound as
  load-time constants (:func:`load_pinned`), and reports how many needed it.
  ``nox -s conformance_onnx`` (or ``python tests/test_onnx_conformance.py``)
  prints both pass rates.
* the onnx wheel's **light** models (``onnx/backend/test/data/light``):
  six of nine convert (the others use LRN, which rten-convert rejects).
  Each is converted with explicit ONNX defaults (their opset-9 final Softmax
  on ``[1, 1000]`` or ``[1, 1000, 1, 1]`` gets ``axis=1``, which is what the
  2-D coercion means there) and its final output compared with onnxruntime
  on the ``.onnx`` at 1e-3 relative (max abs difference / max abs reference
  value) on the same random input. The logits (the final Softmax's input)
  are exposed and compared too: in these files all 1000 logits come out
  equal (onnxruntime's too), so the final output is exactly 1/1000 and says
  little on its own; ``test_make_defaults_explicit`` checks the opset-9
  ``[1, 1000, 1, 1]`` softmax on random logits against onnxruntime.
* random ops (RandomNormal/RandomUniform/...Like, training-mode Dropout) draw
  from the explicit JAX PRNG key in ``Model.state``; their node-suite cases
  are excluded (exact values come from numpy's stream) and their
  distributions are tested here (mean/std within 5 standard errors).

Dtype mapping for comparisons: RTen has only int32/float32/int8/uint8 at
runtime, so expected bool and int64 outputs are compared as int32, float64
and float16 as float32 (inputs are fed the same way).
"""

from __future__ import annotations

import functools
import sys
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import U32, assert_within, bilinear_bound, gamma, require, softmax_bound  # noqa: E402

if __name__ != "__main__":
    onnx = require("onnx")
    require("rten_convert")
else:
    import onnx

import fbjax  # noqa: E402
import fbjax.lower  # noqa: E402,F401
import fbjax.lower.onnx  # noqa: E402,F401  (registers the "onnx" op set)
from onnx_excludes import AS_CONVERTED, EXCLUDES, EXPLICIT, MODES, excluded, modes  # noqa: E402

TARGET_PASS_RATE = 0.95  # with explicit ONNX defaults, over all converted cases
AS_CONVERTED_MIN_RATE = 0.90  # as converted: a regression floor, not the target (the Softmax-axis
#                              cases fail by the file's meaning)
LIGHT_RTOL = 1e-3

#: A bounded default-run subset: one or two cases per op family.
FAST_SUBSET = [
    "test_add_bcast", "test_sub", "test_mul", "test_div", "test_pow", "test_mod_mixed_sign_float32",
    "test_relu", "test_sigmoid", "test_tanh", "test_leakyrelu", "test_elu", "test_hardswish", "test_gelu_tanh_1",
    "test_equal", "test_greater", "test_and2d", "test_not_2d", "test_where_example", "test_clip",
    "test_conv_with_strides_padding", "test_conv_with_autopad_same", "test_convtranspose",
    "test_convtranspose_pads", "test_matmul_3d", "test_gemm_all_attributes", "test_matmul_2d",
    "test_maxpool_2d_pads", "test_maxpool_2d_ceil", "test_averagepool_2d_pads_count_include_pad",
    "test_averagepool_1d_default", "test_globalaveragepool",
    "test_batchnorm_example", "test_instancenorm_example", "test_layer_normalization_4d_axis1",
    "test_softmax_axis_1", "test_logsoftmax_axis_1",
    "test_reduce_mean_do_not_keepdims_example", "test_reduce_sum_keepdims_random", "test_reduce_max_default_axes_keepdim_example",
    "test_argmax_keepdims_example", "test_top_k", "test_cumsum_2d_int32",
    "test_reshape_negative_dim", "test_flatten_axis1", "test_squeeze", "test_unsqueeze_two_axes",
    "test_transpose_default", "test_concat_2d_axis_0", "test_split_equal_parts_1d_opset18",
    "test_slice_neg_steps", "test_expand_dim_changed", "test_tile", "test_constant_pad", "test_edge_pad",
    "test_reflect_pad", "test_range_float_type_positive_delta", "test_tril", "test_onehot_with_axis",
    "test_depthtospace_crd_mode_example", "test_shape", "test_size",
    "test_gather_0", "test_gather_elements_1", "test_gathernd_example_int32_batch_dim1",
    "test_scatter_elements_with_reduction_max", "test_scatternd_add",
    "test_resize_upsample_scales_nearest", "test_resize_downsample_scales_linear",
    "test_resize_upsample_sizes_nearest_round_prefer_ceil_asymmetric", "test_gridsample_zeros_padding",
    "test_lstm_defaults", "test_gru_with_initial_bias", "test_if", "test_range_int32_type_negative_delta_expanded", "test_loop13_seq",
    "test_sequence_insert_at_back", "test_split_to_sequence_1",
    "test_quantizelinear", "test_dequantizelinear", "test_dynamicquantizelinear",
    "test_matmulinteger", "test_convinteger_with_padding", "test_stft",
]


class Case:
    """One node-suite case after conversion (``rten`` is None when rten-convert refused it).

    ``explicit_changed`` / ``explicit_left`` are the nodes
    :func:`~rten_convert_tools.make_defaults_explicit` changed / had to leave;
    ``rten_explicit`` is the conversion of the changed model (None when
    nothing changed, or when it did not convert: ``why_explicit``). They are
    computed on first use (the default run needs them for a few cases only).
    """

    def __init__(self, tc, rten: Optional[bytes], why: str = ""):
        self.name = tc.name
        self.tc = tc
        self.rten = rten
        self.why = why
        self._explicit = None

    def _explicit_conversion(self):
        if self._explicit is None:
            from rten_convert_tools import ConvertError, convert, make_defaults_explicit

            m, changed, left = make_defaults_explicit(self.tc.model)
            rten, why = None, ""
            if changed:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    try:
                        rten = convert(m)
                    except ConvertError as e:
                        why = str(e)[:200]
            self._explicit = (rten, why, changed, left)
        return self._explicit

    rten_explicit = property(lambda self: self._explicit_conversion()[0])
    why_explicit = property(lambda self: self._explicit_conversion()[1])
    explicit_changed = property(lambda self: self._explicit_conversion()[2])
    explicit_left = property(lambda self: self._explicit_conversion()[3])

    def file(self, mode: str = AS_CONVERTED) -> Optional[bytes]:
        """The ``.rten`` bytes run in ``mode``."""
        return self.rten_explicit if mode == EXPLICIT and self.explicit_changed else self.rten


@functools.lru_cache(maxsize=1)
def node_cases() -> dict:
    """name -> :class:`Case` for every node-suite case (converted as it is once per
    process; the explicit-defaults conversion on demand)."""
    from onnx.backend.test.case.node import collect_testcases

    from rten_convert_tools import ConvertError, convert

    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for tc in collect_testcases(None):
            try:
                out[tc.name] = Case(tc, convert(tc.model))
            except ConvertError as e:
                out[tc.name] = Case(tc, None, str(e)[:200])
    return out


def _to_numpy(x):
    """Test data as numpy (some cases store TensorProtos), lists kept as lists."""
    if isinstance(x, list):
        return [_to_numpy(v) for v in x]
    if isinstance(x, onnx.TensorProto):
        return onnx.numpy_helper.to_array(x)
    return x


def _runtime_array(x):
    """A test input or expected output as RTen's runtime type."""
    if isinstance(x, list):
        return [_runtime_array(v) for v in x]
    x = np.asarray(_to_numpy(x))
    if x.dtype == np.bool_ or x.dtype.kind in "iu" and x.dtype.itemsize > 4 or x.dtype in (np.int16, np.uint16):
        return x.astype(np.int32)
    if x.dtype.kind in "iu" and x.dtype == np.uint32:
        return x.astype(np.int32)
    if x.dtype.kind == "f" and x.dtype != np.float32:
        return x.astype(np.float32)
    return x


def compare(actual, expected, rtol: float, atol: float) -> Optional[str]:
    """None if ``actual`` matches ``expected`` (after dtype mapping), else why not."""
    expected = _to_numpy(expected)
    if isinstance(expected, list):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            return f"sequence of {len(expected)} expected, got {type(actual).__name__}"
        for a, e in zip(actual, expected):
            m = compare(a, e, rtol, atol)
            if m:
                return m
        return None
    e = _runtime_array(expected)
    a = np.asarray(actual)
    if a.shape != e.shape:
        return f"shape {a.shape} != expected {e.shape}"
    if e.dtype.kind == "f":
        if not np.allclose(a.astype(np.float32), e, rtol=rtol, atol=atol, equal_nan=True):
            d = np.nanmax(np.abs(a.astype(np.float64) - e)) if a.size else 0
            return f"values differ (max abs diff {d:.3g}, rtol {rtol}, atol {atol})"
        return None
    if not np.array_equal(a.astype(np.int64), e.astype(np.int64)):
        return f"integer values differ ({int((a.astype(np.int64) != e.astype(np.int64)).sum())} of {a.size})"
    return None


# Input positions whose values fix output shapes, beyond the registry's
# static_inputs: data-dependent ops that need their inputs at load time.
_VALUE_SHAPED = {"NonMaxSuppression": (0, 1), "TopK": (1,)}


def shape_determining_inputs(ir) -> list:
    """Main-graph inputs whose *values* fix shapes: the graph inputs upstream of
    a static input position (Reshape's shape, Slice's starts, ...), of a
    data-dependent op (NonZero), or of a Loop's trip count/condition. Paths through Shape/Size stop (they read shapes only)."""
    from fbjax.lower import LOWERINGS

    g = ir.main_graph
    producer = {id(o): n for n in g.nodes for o in n.outputs if o is not None}
    seeds = []
    for n in g.nodes:
        opdef = LOWERINGS.get(n.op_set, n.op_name)
        pos = set(opdef.static_inputs if opdef else ()) | set(_VALUE_SHAPED.get(n.op_name, ()))
        if n.op_name == "Loop":  # trip count and condition (needed when the loop is unrolled)
            pos |= {0, 1}
        seeds += [n.inputs[i] for i in pos if i < len(n.inputs) and n.inputs[i] is not None]
    inputs = {id(v) for v in g.inputs}
    found, seen, stack = [], set(), list(seeds)
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        if id(v) in inputs:
            found.append(v)
        elif id(v) in producer and producer[id(v)].op_name not in ("Shape", "Size"):
            stack += [x for x in producer[id(v)].inputs if x is not None]
    return found


def load_pinned(rten: bytes, xs: list):
    """Load with the shape-determining inputs bound to this data set's values as
    constants (what a caller does for a model whose shapes depend on values);
    returns ``(model, remaining inputs, pinned names)``."""
    from fbjax import loading
    from fbjax.lower.build import build
    from fbjax.model import Model

    ir = loading.read(rten)
    g = ir.main_graph
    pin = {id(v) for v in shape_determining_inputs(ir)}
    rest, names = [], []
    for v, x in zip(list(g.inputs), xs):
        if id(v) in pin:
            v.data = np.asarray(x, v.dtype)
            v.shape = v.data.shape
            names.append(v.name)
        else:
            rest.append(x)
    g.inputs = [v for v in g.inputs if id(v) not in pin]
    return Model(ir, build(ir)), rest, names


def _call(model, xs, sequences: bool):
    if sequences:  # the pure program keeps sequence (list) inputs and outputs as lists
        ys, _ = jax.jit(model.program.apply)(model.params, None, *xs)
        return list(ys)
    ys = model(*xs)
    return list(ys) if isinstance(ys, tuple) else [ys]


def run_case(case: Case, stats: Optional[Counter] = None, mode: str = AS_CONVERTED) -> Optional[str]:
    """Load the converted case (the file of ``mode``) with fbjax and check every
    data set; None when it passes.

    The model runs jitted as loaded. Where that fails because an output shape
    depends on input values, the case is re-run with those inputs pinned as
    load-time constants (:func:`load_pinned`), counted in ``stats["pinned"]``.
    """
    rten = case.file(mode)
    if rten is None:
        return f"not converted ({mode}): {case.why_explicit or case.why}"
    for inputs, outputs in case.tc.data_sets:
        xs = [_runtime_array(x) for x in inputs]
        sequences = any(isinstance(x, list) for x in xs) or any(isinstance(_to_numpy(e), list) for e in outputs)
        try:  # (load itself refuses static inputs computed from graph inputs since issue 15)
            model = fbjax.load(rten)
            if len(xs) != len(model.inputs):
                return f"model takes {len(model.inputs)} inputs, case has {len(xs)}"
            ys = _call(model, xs, sequences)
        except (fbjax.UnsupportedOperatorError, fbjax.ModelFormatError) as e:
            if "known at load time" not in str(e):
                raise
            model, rest, names = load_pinned(rten, xs)
            if not names:
                raise
            # Evaluated eagerly with the weights as numpy: everything that fixes a
            # shape is then a load-time constant (float constants included).
            with jax.disable_jit():
                if model.executor.stateful:  # random ops drawing from Model.state's PRNG key
                    ys, _ = model.apply(model.program.params, *rest)
                    ys = list(ys) if isinstance(ys, tuple) else [ys]
                else:
                    ys = list(model.program.apply(model.program.params, None, *rest)[0])
            if stats is not None:
                stats["pinned"] += 1
        if len(ys) != len(outputs):
            return f"{len(ys)} outputs, expected {len(outputs)}"
        for i, (y, e) in enumerate(zip(ys, outputs)):
            msg = compare(y, e, case.tc.rtol, case.tc.atol)
            if msg:
                return f"output {i}: {msg}"
    return None


def _safe_run(case: Case, stats=None, mode: str = AS_CONVERTED) -> Optional[str]:
    try:
        return run_case(case, stats, mode)
    except Exception as e:  # noqa: BLE001 - reported as the case's failure
        return f"{type(e).__name__}: {str(e)[:300]}"


def summarize(names=None, verbose: bool = True) -> dict:
    """Run every converted case (or ``names``) in both modes; print and return the pass rates.

    The explicit-defaults mode re-runs only the cases the pre-pass changed;
    the others keep their as-converted result. Both rates are over all cases
    converted as they are.
    """
    cases = node_cases()
    t0 = time.time()
    selected = [cases[n] for n in (names or sorted(cases))]
    converted = [c for c in selected if c.rten is not None]
    stats = Counter()
    result = {AS_CONVERTED: {c.name: _safe_run(c, stats, AS_CONVERTED) for c in converted}}
    result[EXPLICIT] = {c.name: (_safe_run(c, stats, EXPLICIT) if c.explicit_changed else result[AS_CONVERTED][c.name])
                        for c in converted}
    res = {"converted": len(converted), "selected": len(selected), "pinned": stats["pinned"],
           "changed": sorted(c.name for c in converted if c.explicit_changed),
           "left": {c.name: c.explicit_left for c in converted if c.explicit_left}}
    for mode in MODES:
        passed = [n for n, m in result[mode].items() if m is None]
        failures = [(n, m) for n, m in result[mode].items() if m is not None and not excluded(n, mode)]
        excl = [(n, m) for n, m in result[mode].items() if m is not None and excluded(n, mode)]
        excl_passing = [n for n in passed if excluded(n, mode)]
        res[mode] = {"passed": len(passed), "rate": len(passed) / max(len(converted), 1), "failures": failures,
                     "excluded": excl, "excluded_passing": excl_passing}
    if verbose:
        print(f"ONNX node suite via rten-convert 0.22: {len(selected)} cases, {len(converted)} converted, "
              f"{time.time() - t0:.0f}s; data sets run with shape-determining inputs pinned as load-time "
              f"constants: {stats['pinned']} (both modes)")
        print(f"  explicit ONNX defaults pre-pass changed {len(res['changed'])} converted cases; "
              f"left {len(res['left'])} with a default it cannot state" + "".join(
                  f"\n    left {n}: {'; '.join(v)}" for n, v in res["left"].items()))
        for mode, label in ((AS_CONVERTED, "as converted"), (EXPLICIT, "with explicit ONNX defaults")):
            r = res[mode]
            reasons = Counter(EXCLUDES[n].split(":")[0].split("] ")[-1] for n, _ in r["excluded"])
            goal = (f"issue target {100 * TARGET_PASS_RATE:.0f}%" if mode == EXPLICIT else
                    f"regression floor {100 * AS_CONVERTED_MIN_RATE:.0f}%; the issue's target is counted "
                    "with explicit defaults")
            print(f"  {label}: passed {r['passed']}/{len(converted)} = {100 * r['rate']:.1f}% ({goal}); "
                  f"excluded and failing {len(r['excluded'])} {dict(reasons)}; excluded yet passing "
                  f"{len(r['excluded_passing'])} {r['excluded_passing']}")
            for name, msg in r["failures"]:
                print(f"    FAIL ({label}) {name}: {msg}")
    return res


# --- node suite tests ------------------------------------------------------------

def test_excludes_have_reasons():
    for name, reason in EXCLUDES.items():
        assert name.startswith("test_") and isinstance(reason, str) and len(reason) > 30, name
        assert set(modes(reason)) <= set(MODES), name  # raises for a reason without a mode tag


#: Cases the pre-pass fixes (opset 13 default axis -1; opset < 13 rank-2 input, axis 1).
EXPLICIT_SUBSET = ["test_softmax_default_axis", "test_logsoftmax_example_1", "test_softmax_large_number"]


@pytest.mark.parametrize("name", EXPLICIT_SUBSET)
def test_node_subset_explicit_defaults(name):
    """As converted these fail (axis 0 in the file); with the ONNX default stated they pass."""
    case = node_cases()[name]
    assert case.explicit_changed, f"the pre-pass should state {name}'s Softmax axis"
    assert excluded(name, AS_CONVERTED) and not excluded(name, EXPLICIT)
    if name == "test_logsoftmax_example_1":  # its (1, 3) input: axis 0 has size 1, which load warns about
        with pytest.warns(UserWarning, match="normalize over an axis of size 1"):
            assert run_case(case, mode=AS_CONVERTED) is not None, "as converted the file says axis 0"
    else:
        assert run_case(case, mode=AS_CONVERTED) is not None, "as converted the file says axis 0"
    msg = run_case(case, mode=EXPLICIT)
    assert msg is None, f"{name} (explicit defaults): {msg}"


def _softmax_model(opset: int, shape, op: str = "Softmax", **attrs):
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, shape)
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)
    g = onnx.helper.make_graph([onnx.helper.make_node(op, ["x"], ["y"], **attrs)], "g", [x], [y])
    return onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", opset)])


@pytest.mark.parametrize("opset,shape,axis", [
    (13, [2, 3, 4], -1), (11, [2, 5], 1), (9, [1, 1000, 1, 1], 1), (11, [2, 3, 4], None), (9, None, None)])
def test_make_defaults_explicit(opset, shape, axis):
    """The pre-pass states the ONNX default only where one axis expresses it; the
    result is checked against onnxruntime on the unchanged .onnx (the ONNX meaning)."""
    from rten_convert_tools import convert, make_defaults_explicit

    m = _softmax_model(opset, shape)
    m2, changed, left = make_defaults_explicit(m)
    got = [a.i for a in m2.graph.node[0].attribute if a.name == "axis"]
    assert got == ([] if axis is None else [axis])
    assert (len(changed), len(left)) == ((1, 0) if axis is not None else (0, 1))
    assert not any(a.name == "axis" for a in m.graph.node[0].attribute), "the input model is not modified"
    if axis is None or shape is None:
        return
    ort = require("onnxruntime")
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    y = np.asarray(fbjax.load(convert(m, explicit_defaults=True))(x))
    # the same inputs: only each runtime's float32 exp, sum (over at most the trailing axes from `axis`:
    # the opset < 13 coercion to 2-D) and division differ
    assert_within(y, ref, softmax_bound(ref, 0.0, n=int(np.prod(shape[axis:]))), "Softmax vs onnxruntime")


@pytest.mark.parametrize("name", FAST_SUBSET)
def test_node_subset(name):
    case = node_cases().get(name)
    assert case is not None, f"{name} is not in this onnx's node suite"
    assert case.rten is not None, f"rten-convert should convert {name}: {case.why}"
    assert name not in EXCLUDES, "the fast subset must not hide excluded cases"
    msg = run_case(case)
    assert msg is None, f"{name}: {msg}"


def run_reference(case: Case, rten: Optional[bytes] = None) -> Optional[str]:
    """The numpy reference interpreter (``fbjax.reference``) on the converted case
    (or on ``rten``, e.g. ``case.file(EXPLICIT)``)."""
    import fbjax.reference
    import fbjax.reference.onnx  # noqa: F401

    for inputs, outputs in case.tc.data_sets:
        ys = fbjax.reference.run(rten or case.rten, *[_runtime_array(x) for x in inputs])
        for i, (y, e) in enumerate(zip(ys, outputs)):
            msg = compare(y, e, case.tc.rtol, case.tc.atol)
            if msg:
                return f"output {i}: {msg}"
    return None


@pytest.mark.parametrize("name", FAST_SUBSET)
def test_reference_subset(name):
    """The numpy twins against the suite's expected outputs (an oracle independent of the lowering)."""
    msg = run_reference(node_cases()[name])
    assert msg is None, f"{name} (numpy reference): {msg}"


def _all_converted() -> list:
    """Every node case rten-convert converted (raises what the conversion
    raises: a broken toolchain fails the run instead of collecting no case)."""
    return sorted(n for n, c in node_cases().items() if c.rten is not None)


def _all_changed() -> list:
    """The converted cases the explicit-defaults pre-pass changes."""
    return [n for n in _all_converted() if node_cases()[n].explicit_changed]


def _slow_selected(config) -> bool:
    """Whether this run selects ``slow`` tests (``-m slow``, ``nox -s slow``):
    read from pytest's own marker expression, not from ``sys.argv``."""
    expr = " ".join((config.getoption("markexpr", "") or "").split())
    return "slow" in expr and expr != "not slow"


#: slow tests parametrized over every converted case: how to list them, and the mode they run in
_FULL = {"test_node_full": (_all_converted, AS_CONVERTED),
         "test_node_full_explicit_defaults": (_all_changed, EXPLICIT)}


def _node_params(names, mode) -> list:
    """``names`` as pytest params; a case ``onnx_excludes.py`` excludes in
    ``mode`` runs as a strict xfail with its reason (it still runs: a fix shows
    as XPASS and fails until its exclusion goes)."""
    return [pytest.param(n, marks=pytest.mark.xfail(reason=excluded(n, mode), strict=True))
            if excluded(n, mode) else n for n in names]


def pytest_generate_tests(metafunc):
    """The full parametrisation converts all ~1,880 cases at collection
    (~15 s): only done when slow tests are selected, so the default run
    stays fast (the empty parameter set is deselected with its marker)."""
    full = _FULL.get(metafunc.function.__name__)
    if full is not None:
        make, mode = full
        metafunc.parametrize("name", _node_params(make(), mode) if _slow_selected(metafunc.config) else [])


def test_softmax_lowering_values_and_grads():
    """The Softmax/LogSoftmax lowerings (exponent clamped at 0 against XLA
    recomputation, see fbjax.lower.onnx.norm) equal jax.nn's values and
    gradients; light_squeezenet (logits ~7e9) covers the clamp itself."""
    from fbjax.lower.onnx import norm

    x = jnp.asarray(np.random.default_rng(0).standard_normal((3, 5)), jnp.float32)
    w = jnp.asarray(np.random.default_rng(1).standard_normal((3, 5)), jnp.float32)
    for ours, theirs in ((norm.Softmax, jax.nn.softmax), (norm.LogSoftmax, jax.nn.log_softmax)):
        def f(x, fn=ours):
            return jnp.sum(fn(None, x, axis=1) * w)

        def g(x, fn=theirs):
            return jnp.sum(fn(x, axis=1) * w)

        want, gwant = np.asarray(theirs(x, axis=1)), np.asarray(jax.grad(g)(x))
        value_bound, grad_bound = _softmax_family_bounds(ours is norm.Softmax, np.asarray(x), np.asarray(w))
        assert_within(ours(None, x, axis=1), want, value_bound, f"{ours.__name__} values vs jax.nn")
        assert_within(jax.grad(f)(x), gwant, grad_bound, f"{ours.__name__} grads vs jax.nn")


def _softmax_family_bounds(softmax: bool, x, w, exp_ulps: float = 4.0):
    """Bounds on two float32 evaluations (differently written formulas) of
    ``softmax(x)`` / ``log_softmax(x)`` along axis 1 (``n`` terms) and of the
    gradient of ``sum(f(x) * w)``. Per side, with ``y = softmax(x)``:
    softmax within ``r = (2 exp_ulps + n + 2) u`` relative
    (``conftest.softmax_bound``); log_softmax ``z - m - log S`` with ``S``
    in ``[1, n]`` within ``u (2|ls| + 3 log n + exp_ulps + n)``; the softmax
    gradient ``y (w - sum y w)`` within ``y ((r + 4u)(|w| + T) + gamma_n T)``,
    ``T = sum y |w|`` (at most 4 further roundings in any formula); the
    log_softmax gradient ``w - y sum w`` within
    ``(r + 2u) y |sum w| + u |w| + gamma_n sum |w|``. Twice each for two sides."""
    u, n = U32, x.shape[1]
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    y = np.exp(x64 - x64.max(axis=1, keepdims=True))
    y /= y.sum(axis=1, keepdims=True)
    r = (2 * exp_ulps + n + 2) * u
    if softmax:
        t = (y * np.abs(w64)).sum(axis=1, keepdims=True)
        return 2 * r * y, 2 * y * ((r + 4 * u) * (np.abs(w64) + t) + gamma(n) * t)
    ls = np.abs(np.log(y))
    sw = w64.sum(axis=1, keepdims=True)
    sabs = np.abs(w64).sum(axis=1, keepdims=True)
    return (2 * u * (2 * ls + 3 * np.log(n) + exp_ulps + n),
            2 * ((r + 2 * u) * y * np.abs(sw) + u * np.abs(w64) + gamma(n) * sabs))


def test_make_defaults_explicit_subgraphs():
    """Softmax nodes in If branches get the axis too; nodes that state one are kept."""
    from rten_convert_tools import make_defaults_explicit

    H, F = onnx.helper, onnx.TensorProto.FLOAT

    def branch(name, **attrs):
        return H.make_graph([H.make_node("LogSoftmax", ["x"], [name], **attrs)], name, [],
                            [H.make_tensor_value_info(name, F, [2, 3])])

    node = H.make_node("If", ["c"], ["y"], then_branch=branch("a"), else_branch=branch("b", axis=0))
    g = H.make_graph([node, H.make_node("Softmax", ["y"], ["z"])], "g",
                     [H.make_tensor_value_info("c", onnx.TensorProto.BOOL, []),
                      H.make_tensor_value_info("x", F, [2, 3])],
                     [H.make_tensor_value_info("z", F, [2, 3])])
    m = H.make_model(g, opset_imports=[H.make_opsetid("", 17)])
    m2, changed, left = make_defaults_explicit(m)
    assert len(changed) == 2 and not left, changed
    axes = {a.g.name: [b.i for b in a.g.node[0].attribute if b.name == "axis"] for a in m2.graph.node[0].attribute}
    assert axes == {"a": [-1], "b": [0]}
    assert [b.i for b in m2.graph.node[1].attribute if b.name == "axis"] == [-1]


@pytest.mark.slow
def test_node_full(name):
    """One converted node case (excluded ones: strict xfail, see :func:`_node_params`)."""
    msg = run_case(node_cases()[name])
    assert msg is None, f"{name}: {msg}"


@pytest.mark.slow
def test_node_full_explicit_defaults(name):
    """The cases the pre-pass changes, converted with explicit ONNX defaults
    (excluded ones: strict xfail, see :func:`_node_params`)."""
    msg = run_case(node_cases()[name], mode=EXPLICIT)
    assert msg is None, f"{name} (explicit defaults): {msg}"


@pytest.mark.slow
def test_node_pass_rate():
    res = summarize(verbose=True)
    assert res["converted"] > 800, "rten-convert 0.22 should convert ~900 node cases"
    # As converted, the Softmax/LogSoftmax cases without an axis fail by the file's
    # meaning (onnx_excludes.py "[as converted] converter:"); the pre-pass fixes them.
    assert res[AS_CONVERTED]["rate"] >= AS_CONVERTED_MIN_RATE
    assert res[EXPLICIT]["rate"] >= TARGET_PASS_RATE
    for mode in MODES:
        r = res[mode]
        assert not r["failures"], f"{mode}: failures missing from onnx_excludes.py: {r['failures']}"
        assert not r["excluded_passing"], f"{mode}: excluded cases now pass: {r['excluded_passing']}"


# --- registry coverage: every RTen operator has a lowering and a numpy twin ---------

def test_every_rten_op_has_lowering_and_twin():
    """Every RTen schema OperatorType (the Sequence ops, Dropout, random ops
    included) is registered in the "onnx" op set of both the lowerings and the
    numpy reference, with the same signature (inputs, attribute names and
    defaults), and both have docstrings."""
    import inspect

    import fbjax.reference
    import fbjax.reference.onnx  # noqa: F401
    from fbjax.formats.rten import OPERATOR_NAMES
    from fbjax.lower.registry import LOWERINGS
    from fbjax.reference.registry import REFERENCE

    schema = set(OPERATOR_NAMES.values())
    low = set(LOWERINGS.ops("onnx").get("onnx", []))
    ref = set(REFERENCE.ops("onnx").get("onnx", []))
    assert {"SequenceConstruct", "SequenceAt", "SequenceInsert", "SequenceErase", "SequenceLength",
            "SequenceEmpty", "ConcatFromSequence", "SplitToSequence"} <= schema
    assert schema - low == set(), f"RTen ops without a lowering: {sorted(schema - low)}"
    assert low - ref == set(), f"lowerings without a numpy twin: {sorted(low - ref)}"
    assert ref - low == set(), f"numpy twins without a lowering: {sorted(ref - low)}"
    for name in sorted(low):
        f, g = LOWERINGS.get("onnx", name).fn, REFERENCE.get("onnx", name).fn

        def sig(fn):
            return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]

        assert sig(f) == sig(g), f"{name}: lowering {inspect.signature(f)} != twin {inspect.signature(g)}"
        assert f.__doc__ and g.__doc__, f"{name}: missing docstring"


# --- random ops: explicit PRNG key, distributions ---------------------------------

def _onnx_model(nodes, inputs, outputs, opset=17, initializers=()):
    H = onnx.helper
    g = H.make_graph(nodes, "g", [H.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                     [H.make_tensor_value_info(n, t, s) for n, t, s in outputs], initializer=list(initializers))
    return H.make_model(g, opset_imports=[H.make_opsetid("", opset)])


def _within(sample, mean, std, what, k=5.0):
    """Assert the sample mean is within ``k`` standard errors (``std / sqrt(n)``) of
    ``mean``; returns the sample as float64 and its size. The std checks in the
    callers use SE(std) ~ sqrt((mu4 - std^4) / n) / (2 std)."""
    x, n = np.asarray(sample, np.float64).ravel(), np.size(sample)
    se_mean = std / np.sqrt(n)
    assert abs(x.mean() - mean) <= k * se_mean, f"{what}: mean {x.mean():.4f}, expected {mean} +- {k * se_mean:.4f}"
    return x, n


def _check_normal(sample, mean, scale, what):
    x, n = _within(sample, mean, scale, what)
    se_std = np.sqrt((3 * scale ** 4 - scale ** 4) / n) / (2 * scale)  # normal: mu4 = 3 sigma^4
    assert abs(x.std() - scale) <= 5 * se_std, f"{what}: std {x.std():.4f}, expected {scale} +- {5 * se_std:.4f}"


def _check_uniform(sample, low, high, what):
    sd = (high - low) / np.sqrt(12)
    x, n = _within(sample, (low + high) / 2, sd, what)
    se_std = np.sqrt((1.8 * sd ** 4 - sd ** 4) / n) / (2 * sd)  # uniform: mu4 = 1.8 sigma^4
    assert abs(x.std() - sd) <= 5 * se_std, f"{what}: std {x.std():.4f}, expected {sd:.4f} +- {5 * se_std:.4f}"
    assert x.min() >= low and x.max() < high, what


@functools.lru_cache(maxsize=1)
def _random_rten() -> bytes:
    from rten_convert_tools import convert

    F = onnx.TensorProto.FLOAT
    H = onnx.helper
    nodes = [H.make_node("RandomNormal", [], ["n"], shape=[64, 64], mean=2.0, scale=3.0, seed=7.0),
             H.make_node("RandomUniform", [], ["u"], shape=[64, 64], low=-1.0, high=3.0),
             H.make_node("RandomNormalLike", ["x"], ["nl"]),
             H.make_node("RandomUniformLike", ["x"], ["ul"], low=0.5, high=0.75),
             # the expanded Bernoulli (Bernoulli itself is not in the RTen schema)
             H.make_node("RandomUniformLike", ["p"], ["r"]),
             H.make_node("Less", ["r", "p"], ["b_"]),
             H.make_node("Cast", ["b_"], ["b"], to=F)]
    m = _onnx_model(nodes, [("x", F, [32, 128]), ("p", F, [4096])],
                    [(o, F, None) for o in ("n", "u", "nl", "ul", "b")])
    return convert(m)


def test_random_ops_distributions():
    """RandomNormal/RandomUniform/...Like and the expanded Bernoulli follow their
    distributions (mean and std within 5 standard errors: a false failure has
    probability < 1e-6 per check) from the key in ``Model.state``."""
    model = fbjax.load(_random_rten())
    key0 = np.asarray(model.state["prng_key"])
    np.testing.assert_array_equal(key0, np.asarray(jax.random.PRNGKey(7)))  # seed of the first drawing node
    x = np.zeros((32, 128), np.float32)
    p = np.linspace(0.05, 0.95, 4096, dtype=np.float32)
    n, u, nl, ul, b = (np.asarray(y) for y in model(x, p))
    _check_normal(n, 2.0, 3.0, "RandomNormal")
    _check_uniform(u, -1.0, 3.0, "RandomUniform")
    _check_normal(nl, 0.0, 1.0, "RandomNormalLike (ONNX default mean 0, scale 1)")
    _check_uniform(ul, 0.5, 0.75, "RandomUniformLike")
    assert n.dtype == u.dtype == np.float32 and nl.shape == ul.shape == (32, 128)
    # Bernoulli(p): sum of b - p has variance sum p(1-p)
    d, sd = float(np.sum(b - p)), float(np.sqrt(np.sum(p * (1 - p))))
    assert set(np.unique(b)) <= {0.0, 1.0} and abs(d) <= 5 * sd, f"Bernoulli: sum(b - p) = {d:.1f}, sd {sd:.1f}"
    # the key advances: a second call draws new numbers, and the state moved on
    assert not np.array_equal(np.asarray(model(x, p)[0]), n)
    assert not np.array_equal(np.asarray(model.state["prng_key"]), key0)


def test_random_ops_explicit_key():
    """Same file -> same first draws; ``apply`` is a pure function of the key."""
    a, b = fbjax.load(_random_rten()), fbjax.load(_random_rten())
    x, p = np.zeros((32, 128), np.float32), np.full(4096, 0.5, np.float32)
    np.testing.assert_array_equal(np.asarray(a(x, p)[0]), np.asarray(b(x, p)[0]))
    key = jax.random.PRNGKey(123)
    (y1, *_), s1 = a.apply(a.params, x, p, state={"prng_key": key})
    (y2, *_), s2 = a.apply(a.params, x, p, state={"prng_key": key})
    np.testing.assert_array_equal(np.asarray(y1), np.asarray(y2))
    np.testing.assert_array_equal(np.asarray(s1["prng_key"]), np.asarray(s2["prng_key"]))
    assert not np.array_equal(np.asarray(s1["prng_key"]), np.asarray(key))
    (y3, *_), _ = a.apply(a.params, x, p, state={"prng_key": jax.random.PRNGKey(124)})
    assert not np.array_equal(np.asarray(y1), np.asarray(y3))


def test_random_ops_reference_twin():
    """The numpy twins (numpy's generator) follow the same distributions."""
    import fbjax.reference

    x, p = np.zeros((32, 128), np.float32), np.linspace(0.05, 0.95, 4096, dtype=np.float32)
    n, u, nl, ul, b = fbjax.reference.run(_random_rten(), x, p)
    _check_normal(n, 2.0, 3.0, "RandomNormal twin")
    _check_uniform(u, -1.0, 3.0, "RandomUniform twin")
    _check_normal(nl, 0.0, 1.0, "RandomNormalLike twin")
    _check_uniform(ul, 0.5, 0.75, "RandomUniformLike twin")


@pytest.mark.parametrize("ratio", [0.3, 0.75])
def test_dropout_training_distribution(ratio):
    """Training-mode Dropout keeps each element with probability 1 - ratio (kept
    count within 5 standard errors) and scales kept ones by 1 / (1 - ratio); the
    mask matches the output; inference mode is the identity. Also the numpy twin."""
    import fbjax.reference
    from rten_convert_tools import convert

    F, H = onnx.TensorProto.FLOAT, onnx.helper
    inits = [H.make_tensor("r", F, [], [ratio]), H.make_tensor("t", onnx.TensorProto.BOOL, [], [True])]
    m = _onnx_model([H.make_node("Dropout", ["x", "r", "t"], ["y", "mask"], seed=3)], [("x", F, [100, 100])],
                    [("y", F, None), ("mask", onnx.TensorProto.BOOL, None)], initializers=inits)
    rten = convert(m)
    x = np.random.default_rng(0).uniform(1, 2, (100, 100)).astype(np.float32)
    model = fbjax.load(rten)
    assert model.state is not None and "prng_key" in model.state
    for y, mask in (model(x), fbjax.reference.run(rten, x)):
        y, mask = np.asarray(y), np.asarray(mask)
        kept, n = int(mask.sum()), mask.size
        se = np.sqrt(n * ratio * (1 - ratio))
        assert abs(kept - n * (1 - ratio)) <= 5 * se, f"kept {kept} of {n}, ratio {ratio}"
        np.testing.assert_allclose(y[mask == 1], x[mask == 1] / np.float32(1 - ratio), rtol=1e-6)
        assert np.all(y[mask == 0] == 0) and set(np.unique(mask)) <= {0, 1}
    assert not np.array_equal(np.asarray(model(x)[1]), np.asarray(model(x)[1])), "each call draws a new mask"
    inits[1] = H.make_tensor("t", onnx.TensorProto.BOOL, [], [False])
    m = _onnx_model([H.make_node("Dropout", ["x", "r", "t"], ["y"])], [("x", F, [100, 100])], [("y", F, None)],
                    initializers=inits)
    inf = fbjax.load(convert(m))
    assert inf.state is None, "inference-mode Dropout draws nothing: the model is not stateful"
    np.testing.assert_array_equal(np.asarray(inf(x)), x)


_TRAINING_DROPOUT = ["test_training_dropout", "test_training_dropout_default", "test_training_dropout_mask",
                     "test_training_dropout_default_mask"]


@pytest.mark.parametrize("name", _TRAINING_DROPOUT)
def test_training_dropout_cases_structure(name):
    """The excluded node-suite cases (exact values from numpy's stream), on their own
    inputs: every output is 0 or x / (1 - ratio), the mask agrees, and the kept
    count is within 5 standard errors of (1 - ratio) * size (60 elements)."""
    assert excluded(name, EXPLICIT) and EXCLUDES[name].startswith("[both modes] random:")
    case = node_cases()[name]
    (x, r, t), _ = case.tc.data_sets[0]
    model, rest, pinned = load_pinned(case.rten, [_runtime_array(v) for v in (x, r, t)])
    assert sorted(pinned) == ["r", "t"] and model.state is not None
    ys = model(*rest)
    ys = ys if isinstance(ys, tuple) else (ys,)
    y, ratio = np.asarray(ys[0]), float(r)
    kept = y != 0
    np.testing.assert_allclose(y[kept], x[kept] / np.float32(1 - ratio), rtol=1e-6)
    if len(ys) > 1:
        np.testing.assert_array_equal(np.asarray(ys[1]).astype(bool), kept)
    n = y.size
    assert abs(kept.sum() - n * (1 - ratio)) <= 5 * np.sqrt(n * ratio * (1 - ratio))


# --- Resize: every coordinate / nearest mode of the RTen schema vs onnxruntime -------

#: The RTen schema's CoordTransformMode and NearestMode (rten-convert refuses the ONNX
#: modes it lacks: tf_crop_and_resize, half_pixel_symmetric, cubic is mapped to linear).
RESIZE_COORD = ["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel"]
RESIZE_NEAREST = ["floor", "ceil", "round_prefer_floor", "round_prefer_ceil"]


def _resize_configs() -> list:
    """(label, attrs, scales or None, sizes or None) for an ``x`` of shape [1, 2, 6, 9].

    The scales (1.73, 2.37) put no source coordinate exactly on a rounding
    boundary, where onnxruntime's float32 arithmetic and the ONNX reference's
    float64 can pick different elements (with 1.7, half_pixel x = 8 maps to
    4.5). The sizes do hit exact values (align_corners 6 -> 4 maps the last
    output to 5.0), which fbjax's float64 coordinates keep exact.
    """
    up, down = [1.0, 1.0, 1.73, 2.37], [1, 2, 4, 5]
    cfg = []
    for c in RESIZE_COORD:
        for nm in RESIZE_NEAREST:
            a = dict(mode="nearest", coordinate_transformation_mode=c, nearest_mode=nm)
            cfg += [(f"nearest {c} {nm} up", a, up, None), (f"nearest {c} {nm} down", a, None, down)]
        a = dict(mode="linear", coordinate_transformation_mode=c)
        cfg += [(f"linear {c} up", a, up, None), (f"linear {c} down", a, None, down),
                (f"linear {c} to size 1", a, None, [1, 2, 1, 4])]
    # axes whose size does not change (only W resized; H kept by scale 1 or by size)
    for m in ("nearest", "linear"):
        cfg += [(f"{m} W only (scales)", dict(mode=m), [1.0, 1.0, 1.0, 2.5], None),
                (f"{m} W only (sizes)", dict(mode=m), None, [1, 2, 6, 11])]
    return cfg


def _ort_differs(label: str) -> bool:
    """onnxruntime's known departure from the ONNX reference: align_corners with
    a fractional ``in * scale`` divides by the integer output length - 1, where
    the ONNX reference implementation (and the node suite's expected values,
    e.g. test_resize_downsample_scales_linear_align_corners) use ``in * scale - 1``."""
    return "align_corners" in label and label.endswith(" up")


def test_resize_modes_vs_oracles():
    """One model with a Resize node per configuration; fbjax (jitted) and the numpy
    twin against the ONNX reference implementation (``onnx.reference``, which
    produced the node suite's expected values) and against onnxruntime (except
    :func:`_ort_differs`). Nearest picks elements, so it must be exact; linear
    within :func:`_linear_resize_bound` (float32 interpolation and float32
    coordinates, e.g. onnxruntime's, vs float64 ones)."""
    ort = require("onnxruntime")
    from onnx.reference import ReferenceEvaluator

    import fbjax.reference
    from rten_convert_tools import convert

    F, H = onnx.TensorProto.FLOAT, onnx.helper
    nodes, inits, outs = [], [], []
    cfg = _resize_configs()
    for i, (label, attrs, scales, sizes) in enumerate(cfg):
        if scales is not None:
            inits.append(H.make_tensor(f"s{i}", F, [4], scales))
            ins = ["x", "", f"s{i}"]
        else:
            inits.append(H.make_tensor(f"z{i}", onnx.TensorProto.INT64, [4], sizes))
            ins = ["x", "", "", f"z{i}"]
        nodes.append(H.make_node("Resize", ins, [f"y{i}"], **attrs))
        outs.append((f"y{i}", F, None))
    m = _onnx_model(nodes, [("x", F, [1, 2, 6, 9])], outs, opset=19, initializers=inits)
    rten = convert(m)
    x = np.random.default_rng(0).standard_normal((1, 2, 6, 9)).astype(np.float32)
    onnx_ref = ReferenceEvaluator(m).run(None, {"x": x})
    ort_ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = fbjax.load(rten)(x)
    twin = fbjax.reference.run(rten, x)
    for (label, attrs, _, _), y, t, r, r2 in zip(cfg, got, twin, onnx_ref, ort_ref):
        oracles = [("onnx.reference", r)] + ([] if _ort_differs(label) else [("onnxruntime", r2)])
        for who, v in (("fbjax", np.asarray(y)), ("numpy twin", np.asarray(t))):
            for oname, o in oracles:
                msg = f"{label}: {who} vs {oname}"
                assert v.shape == o.shape, f"{msg}: shape {v.shape} != {o.shape}"
                if attrs["mode"] == "nearest":
                    np.testing.assert_array_equal(v, o, err_msg=msg)
                else:
                    assert_within(v, o, _linear_resize_bound(x), msg)


def _linear_resize_bound(x) -> float:
    """2-D linear Resize of ``x`` by two implementations
    (``conftest.bilinear_bound``): the source coordinate takes the scale,
    + 0.5, a division, - 0.5 and a floor (5 roundings) of values up to the
    largest extent (+2 for output extents beyond the input's)."""
    return bilinear_bound(float(np.abs(x).max()), max(x.shape[2:]) + 2, coordinate_roundings=5)


@pytest.mark.parametrize("attrs", [dict(coordinate_transformation_mode="tf_crop_and_resize"),
                                   dict(coordinate_transformation_mode="half_pixel_symmetric"),
                                   dict(axes=[3, 2])])
def test_resize_modes_outside_schema_refused(attrs):
    """ONNX Resize options the RTen schema cannot hold are refused by rten-convert
    (so fbjax never sees them; tf_crop_and_resize's roi included)."""
    from rten_convert_tools import ConvertError, convert

    F, H = onnx.TensorProto.FLOAT, onnx.helper
    inits = [H.make_tensor("s", F, [2] if "axes" in attrs else [4], [2.0, 2.0] if "axes" in attrs else [1, 1, 2, 2]),
             H.make_tensor("roi", F, [8], [0, 0, 0, 0, 1, 1, 1, 1])]
    m = _onnx_model([H.make_node("Resize", ["x", "roi", "s"], ["y"], mode="linear", **attrs)],
                    [("x", F, [1, 1, 4, 4])], [("y", F, None)], opset=19, initializers=inits)
    with pytest.raises(ConvertError):
        convert(m)


# --- light models vs onnxruntime --------------------------------------------------

LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
LIGHT_CONVERTED = ["squeezenet", "shufflenet", "resnet50", "inception_v2", "densenet121", "vgg19"]
LIGHT_REFUSED = {"bvlc_alexnet": "LRN", "inception_v1": "LRN", "zfnet512": "LRN"}
LIGHT_FAST = ["squeezenet"]


def light_compare(name: str) -> dict:
    """Convert ``light_<name>.onnx`` with explicit ONNX defaults, run fbjax and
    onnxruntime (on the unchanged ``.onnx``) on one random input; returns the
    relative error (max abs difference / max abs reference) of every output."""
    ort = require("onnxruntime")
    from rten_convert_tools import convert, make_defaults_explicit

    m = onnx.load(str(LIGHT_DIR / f"light_{name}.onnx"))
    soft = [n for n in m.graph.node if n.op_type == "Softmax"]
    if soft:  # also expose the logits: on a random input the softmax often saturates (one-hot / uniform)
        m.graph.output.append(onnx.helper.make_tensor_value_info(soft[-1].input[0], onnx.TensorProto.FLOAT, None))
    m2, changed, left = make_defaults_explicit(m)
    model = fbjax.load(convert(m2))
    x = np.random.default_rng(0).standard_normal(model.inputs[0].shape).astype(np.float32)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    refs = sess.run(None, {model.inputs[0].name: x})
    ys = model(x)
    ys = [np.asarray(y) for y in (ys if isinstance(ys, tuple) else (ys,))]
    rel = [float(np.max(np.abs(y - r)) / np.max(np.abs(r))) for y, r in zip(ys, refs)]
    return {"rel": rel, "ys": ys, "refs": refs, "changed": changed, "left": left, "softmax": bool(soft)}


def _check_light(name: str):
    res = light_compare(name)
    # Every final Softmax of these opset-9 models is on [1, 1000] or [1, 1000, 1, 1]:
    # the pre-pass can state its axis (1), so the whole output keeps the ONNX meaning.
    assert not res["left"] and len(res["changed"]) == int(res["softmax"]), res
    for i, r in enumerate(res["rel"]):
        assert r <= LIGHT_RTOL, f"{name}: output {i} differs from onnxruntime by {r:.2e} (relative)"
    print(f"{name}: relative error vs onnxruntime (final output, logits) {res['rel']}")


@pytest.mark.parametrize("name", LIGHT_FAST)
def test_light_model_fast(name):
    _check_light(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", LIGHT_CONVERTED)
def test_light_model(name):
    _check_light(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(LIGHT_REFUSED))
def test_light_model_refused_by_converter(name):
    from rten_convert_tools import ConvertError, convert

    with pytest.raises(ConvertError, match=LIGHT_REFUSED[name]):
        convert(onnx.load(str(LIGHT_DIR / f"light_{name}.onnx")))


def summarize_reference(names=None) -> dict:
    """Pass rates of the numpy reference interpreter over the converted cases, in
    both modes (the explicit-defaults mode re-runs the cases the pre-pass changed)."""
    cases = node_cases()
    sel = [cases[n] for n in (names or sorted(cases)) if cases[n].rten is not None]
    res = {}
    for mode in MODES:
        fails = {}
        for c in sel:
            if mode == EXPLICIT and not c.explicit_changed:
                if c.name in res[AS_CONVERTED]["fails"]:
                    fails[c.name] = res[AS_CONVERTED]["fails"][c.name]
                continue
            rten = c.file(mode)
            try:
                msg = run_reference(c, rten)
            except Exception as e:  # noqa: BLE001 - counted as a failure
                msg = f"{type(e).__name__}: {str(e)[:200]}"
            if msg:
                fails[c.name] = msg
        unexpected = {n: m for n, m in fails.items() if not excluded(n, mode)}
        res[mode] = {"passed": len(sel) - len(fails), "fails": fails, "unexpected": unexpected}
        print(f"numpy reference (fbjax.reference), {mode}: {len(sel) - len(fails)}/{len(sel)} = "
              f"{100 * (len(sel) - len(fails)) / max(len(sel), 1):.1f}%; failures outside onnx_excludes.py: "
              f"{len(unexpected)}" + "".join(f"\n    {n}: {m}" for n, m in unexpected.items()))
    return res


@pytest.mark.slow
def test_reference_pass_rate():
    """The numpy twins on every converted case: no failure outside the exclude list."""
    res = summarize_reference()
    for mode in MODES:
        assert not res[mode]["unexpected"], f"{mode}: {res[mode]['unexpected']}"


if __name__ == "__main__":
    args = sys.argv[1:]
    if args and args[0] == "--reference":
        summarize_reference([n for n in sorted(node_cases()) if not args[1:] or any(
            __import__("fnmatch").fnmatch(n, a) for a in args[1:])])
        sys.exit(0)
    light = "--light" in args
    args = [a for a in args if a != "--light"]
    names = None
    if args:
        import fnmatch

        names = [n for n in sorted(node_cases()) if any(fnmatch.fnmatch(n, a) for a in args)]
    res = summarize(names)
    ok = res[EXPLICIT]["rate"] >= TARGET_PASS_RATE and not any(res[m]["failures"] for m in MODES)
    if light:  # the six light models vs onnxruntime (final outputs, explicit defaults)
        for name in LIGHT_CONVERTED:
            r = light_compare(name)
            y = r["ys"][0]
            print(f"light {name}: relative error vs onnxruntime: final output {r['rel'][0]:.2e}"
                  + (f", logits (Softmax input) {r['rel'][1]:.2e}; onnxruntime's logits span "
                     f"{np.ptp(r['refs'][1]):.3g} (0: all equal, the softmax is exactly uniform), "
                     f"final output max {y.max():.3g}" if r["softmax"] else "")
                  + f" (tolerance {LIGHT_RTOL:g}); pre-pass: {r['changed'] or 'no change'}")
            ok &= max(r["rel"]) <= LIGHT_RTOL
    sys.exit(0 if ok else 1)
