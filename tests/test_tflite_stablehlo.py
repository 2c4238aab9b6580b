"""TFLite files with ``STABLEHLO_*`` builtins (codes 162 onwards).

* the schema: ``schemas/tflite.fbs`` extends the v2.15 schema, appending
  only, to the layout of LiteRT's own generated bindings (every enum value
  and every table field slot equal);
* one model per ``STABLEHLO_*`` op (:func:`fbjax.formats.tflite_builder.stablehlo_op_model`,
  region bodies as appended subgraphs): fbjax's JAX lowering against the
  independent numpy reference twins, and against LiteRT where LiteRT has a
  kernel (scatter, gather, reduce_window, pad, composite, case, add,
  multiply, maximum, minimum, and, shift_left, rng_bit_generator);
* TensorFlow-converted models (``OpsSet.EXPERIMENTAL_STABLEHLO_OPS``) in
  ``tests/data/stablehlo_tflite`` (written by its ``generate.py``) against
  TensorFlow's own outputs stored with them.

Tolerances (:func:`_case_bound`): single correctly rounded IEEE operations
(add, multiply, divide, remainder, max...), repeated ones in the same order
(the WHILE's multiplications), integer, boolean and data-movement results are
exact; transcendental functions within ``TRANSCENDENTAL_ULPS`` ULP (XLA's
float32 approximations; the numpy twins compute in float64 and round once);
ops that sum ``n`` terms (dot, convolution, reduce, scatter-add) within
``gamma_n`` times the op on absolute values per side (``conftest.gamma``).
TensorFlow fixtures: ``1e-4`` relative to the largest expected magnitude
(XLA CPU and TensorFlow CPU sum convolutions and reductions in different
orders; not yet derived per fixture).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fbjax  # noqa: E402
from fbjax.formats import read_model  # noqa: E402
from fbjax.formats._generated import tflite_generated as T  # noqa: E402
from fbjax.formats.tflite_builder import stablehlo_op_model  # noqa: E402
from conftest import abs_magnitude, assert_within, gamma, require  # noqa: E402
from stablehlo_op_cases import _IDX, CASES, build as _build  # noqa: E402


HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "data" / "stablehlo_tflite"
F32, I32, B = np.float32, np.int32, np.bool_
RNG = np.random.RandomState(7)

STABLEHLO_OPS = sorted(k for k, v in vars(T.BuiltinOperator).items() if k.startswith("STABLEHLO_"))


# --- schema --------------------------------------------------------------------------

def _litert_schema():
    return require("ai_edge_litert.schema_py_generated")


def _enums(mod) -> dict:
    out = {}
    for name, cls in vars(mod).items():
        if isinstance(cls, type) and name[:1].isupper() and not name.endswith("T"):
            vals = {k: v for k, v in vars(cls).items() if not k.startswith("_") and isinstance(v, int)}
            if vals and not any(callable(v) for v in vars(cls).values() if not isinstance(v, (int, classmethod)))\
                    and not hasattr(cls, "Init"):
                out[name] = vals
    return out


def _slots(mod) -> dict:
    """``<Table>Add<Field>`` builder functions -> (slot, default) of every field."""
    import inspect
    import re

    out = {}
    for name, fn in vars(mod).items():
        if callable(fn) and re.match(r"^[A-Z]\w*Add[A-Z]\w*$", name) and not isinstance(fn, type):
            src = inspect.getsource(fn)
            m = re.search(r"Prepend(\w+)Slot\((\d+),[^,]+,\s*([^)]*)\)", src)
            if m:
                out[name] = (m.group(1), int(m.group(2)), m.group(3).strip())
    return out


def test_schema_layout_matches_litert():
    lit = _litert_schema()
    ours, theirs = _slots(T), _slots(lit)
    assert len(theirs) > 300
    missing = sorted(set(theirs) - set(ours))
    assert not missing, f"fields LiteRT has and schemas/tflite.fbs lacks: {missing}"
    differ = {k: (ours[k], theirs[k]) for k in theirs if ours[k] != theirs[k]}
    assert not differ, f"field slots / types / defaults differ from LiteRT's: {differ}"
    e_ours, e_theirs = _enums(T), _enums(lit)
    for name, vals in e_theirs.items():
        assert e_ours.get(name) == vals, f"enum/union {name} differs from LiteRT's"


def test_schema_has_the_later_stablehlo_codes():
    codes = {k: getattr(T.BuiltinOperator, k) for k in STABLEHLO_OPS}
    assert codes["STABLEHLO_COMPOSITE"] == 206 and codes["STABLEHLO_SHIFT_LEFT"] == 207
    assert codes["STABLEHLO_CBRT"] == 208 and codes["STABLEHLO_CASE"] == 209
    assert T.BuiltinOptions2.StablehloCaseOptions == 23 and T.BuiltinOptions2.StableHLOCompositeOptions == 21


def test_every_stablehlo_op_is_lowered_with_a_twin():
    from fbjax.formats.tflite_stablehlo import stablehlo_name
    from fbjax.lower.registry import LOWERINGS
    from fbjax.reference.registry import REFERENCE

    names = [stablehlo_name(k) for k in STABLEHLO_OPS]
    assert len(names) == 46  # codes 162-202, 204, 206-209
    assert not [n for n in names if ("stablehlo", n) not in LOWERINGS], "ops without a lowering"
    no_twin = [n for n in names if ("stablehlo", n) not in REFERENCE]
    assert no_twin == [], no_twin


# --- one-op models ---------------------------------------------------------------------

#: ops LiteRT 2.3.0 has kernels for (FACTS.md), checked against it too.
LITERT_KERNELS = {"STABLEHLO_SCATTER", "STABLEHLO_GATHER", "STABLEHLO_REDUCE_WINDOW", "STABLEHLO_PAD",
                  "STABLEHLO_COMPOSITE", "STABLEHLO_CASE", "STABLEHLO_ADD", "STABLEHLO_MULTIPLY",
                  "STABLEHLO_MAXIMUM", "STABLEHLO_MINIMUM", "STABLEHLO_AND", "STABLEHLO_SHIFT_LEFT",
                  "STABLEHLO_RNG_BIT_GENERATOR"}
#: cases whose LiteRT result is not comparable, with the reason.
LITERT_SKIP = {
    "STABLEHLO_SHIFT_LEFT-out-of-range": "shift amounts outside [0, 32) give 0 in the spec; LiteRT's kernel "
                                         "shifts in C++ (undefined behaviour there, INT_MIN for 34 on x86)",
    "STABLEHLO_SCATTER": "the update for row 9 is out of bounds: the spec leaves it implementation-defined "
                         "(XLA and fbjax skip it)",
}


@pytest.fixture(scope="module", autouse=True)
def _custom_call_handler():
    from fbjax.reference.stablehlo.custom import register_reference_custom_call

    fbjax.register_custom_call("fbjax_test.double", lambda x, backend_config=b"": x * 2, replace=True)
    register_reference_custom_call("fbjax_test.double", lambda x, backend_config=b"": np.asarray(x) * 2)
    yield


def _litert(data: bytes, values) -> list:
    """LiteRT's outputs (default resolver). Unlike conftest.litert_run it
    keeps 0-d inputs 0-d (``case``'s index)."""
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_content=data, num_threads=1)
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), values):
        it.set_tensor(d["index"], np.array(x, dtype=d["dtype"]))
    it.invoke()
    return [np.array(it.get_tensor(d["index"])) for d in it.get_output_details()]


#: ULPs within which XLA's float32 exp/log/tanh/logistic/cos/cbrt/rsqrt/pow approximations round
#: (measured here: at most 2)
TRANSCENDENTAL_ULPS = 4
TRANSCENDENTAL = {"STABLEHLO_CBRT", "STABLEHLO_COSINE", "STABLEHLO_EXPONENTIAL", "STABLEHLO_LOG",
                  "STABLEHLO_LOGISTIC", "STABLEHLO_POWER", "STABLEHLO_RSQRT", "STABLEHLO_TANH"}
#: terms summed per output element: contracted products, reduced elements plus the init value, the
#: scatter-add rows (row 2 of _IDX takes two updates)
SUM_TERMS = {"STABLEHLO_DOT_GENERAL": 4, "STABLEHLO_CONVOLUTION": 3 * 3 * 2, "STABLEHLO_REDUCE": 4 + 1,
             "STABLEHLO_SCATTER": 3}


def _case_bound(name, data, values, expected):
    """Elementwise bound on fbjax vs an oracle for case ``name`` (``None``: exact)."""
    e = np.asarray(expected)
    if e.dtype.kind != "f":
        return None
    if name in TRANSCENDENTAL:  # XLA's ULPs plus the twin's (or the other side's) half ULP
        return (TRANSCENDENTAL_ULPS + 0.5) * np.spacing(np.abs(e)).astype(np.float64)
    if name in SUM_TERMS:
        mag = abs_magnitude(fbjax.load(data), *values)
        return 2 * gamma(SUM_TERMS[name]) * (mag[0] if isinstance(mag, list) else mag)
    return None


def _check(actual, expected, what, bound=None):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, \
        f"{what}: {actual.dtype}{actual.shape} != {expected.dtype}{expected.shape}"
    if bound is not None:
        assert_within(actual, expected, bound, what)
    else:
        np.testing.assert_array_equal(actual, expected, err_msg=what)


@pytest.mark.parametrize("name", sorted(CASES))
def test_one_op_model(name):
    data, values = _build(name)
    m = read_model(data)
    node = m.graphs[0].nodes[0]
    assert node.op_set == "stablehlo" and CASES[name][0] in node.location
    outs = fbjax.load(data)(*values)
    outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
    assert len(outs) == len(CASES[name][2])
    for o, (shape, dt) in zip(outs, CASES[name][2]):
        assert np.asarray(o).shape == tuple(shape) and np.asarray(o).dtype == np.dtype(dt)
    from fbjax.reference import run

    ref = run(m, *values)
    for i, (o, r) in enumerate(zip(outs, ref)):
        _check(o, r, f"{name} output {i} vs the numpy twin", _case_bound(name, data, values, r))
    if CASES[name][0] in LITERT_KERNELS and name not in LITERT_SKIP:
        lit = _litert(data, values)
        for i, (o, r) in enumerate(zip(outs, lit)):
            _check(o, r, f"{name} output {i} vs LiteRT", _case_bound(name, data, values, r))


def test_scatter_out_of_bounds_update_is_skipped():
    """The excluded LiteRT comparison above, checked by hand instead."""
    data, values = _build("STABLEHLO_SCATTER")
    x, u = values
    out = np.asarray(fbjax.load(data)(x, u))
    want, mag = x.astype(np.float64), np.abs(x).astype(np.float64)
    for row, upd in zip(_IDX[:, 0], u):
        if row < len(x):
            want[row] += upd
            mag[row] += np.abs(upd)
    # row 2 takes two updates, summed with x in any order: within gamma_3 * (|x| + sum|u|) per side
    # (the float64 sum is within a float32 rounding of exact, counted in gamma_3)
    assert_within(out, want, 2 * gamma(3) * mag, "scatter vs numpy")


def test_case_out_of_range_index_takes_the_last_branch():
    data, values = _build("STABLEHLO_CASE-out-of-range")
    # one correctly rounded multiplication: exact in any program
    np.testing.assert_array_equal(np.asarray(fbjax.load(data)(*values)), values[1] * values[1])


def test_tflite_op_name_and_attributes_after_translation():
    data, _ = _build("STABLEHLO_SORT")
    g = read_model(data).graphs[0]
    node = g.nodes[0]
    assert node.op_name == "stablehlo.sort" and "(STABLEHLO_SORT)" in node.location
    assert node.attrs["comparator"] == 1 and node.attrs["dimension"] == 1 and node.attrs["is_stable"]
    data, _ = _build("STABLEHLO_COMPARE")
    attrs = read_model(data).graphs[0].nodes[0].attrs
    assert attrs["comparison_direction"] == "LT" and attrs["compare_type"] == "TOTALORDER"


# --- TensorFlow-converted models ------------------------------------------------------------

def _fixtures():
    path = FIXTURES / "manifest.json"
    if not path.exists():
        return []
    return sorted(json.loads(path.read_text())["fixtures"])


def _defective() -> dict:
    path = FIXTURES / "manifest.json"
    return json.loads(path.read_text()).get("defective", {}) if path.exists() else {}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(
    reason=f"TensorFlow 2.21 converter defect: {_defective()[n]}", strict=True)) if n in _defective() else n
    for n in _fixtures()])
def test_tf_converted_model(name):
    data = np.load(FIXTURES / f"{name}.npz")
    inputs = [data[f"input_{i}"] for i in range(sum(k.startswith("input_") for k in data.files))]
    expected = [data[f"expected_{i}"] for i in range(sum(k.startswith("expected_") for k in data.files))]
    m = read_model(str(FIXTURES / f"{name}.tflite"))
    assert all(n.op_set == "stablehlo" for g in m.graphs for n in g.nodes), \
        sorted({(n.op_set, n.op_name) for g in m.graphs for n in g.nodes if n.op_set != "stablehlo"})
    outs = fbjax.load(str(FIXTURES / f"{name}.tflite"))(*inputs)
    outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
    assert len(outs) == len(expected)
    for i, (o, e) in enumerate(zip(outs, expected)):
        o = np.asarray(o)
        assert o.shape == e.shape, f"{name} output {i}: shape {o.shape} != TF's {e.shape}"
        if np.issubdtype(e.dtype, np.floating):
            scale = max(1.0, float(np.max(np.abs(e)))) if e.size else 1.0
            np.testing.assert_allclose(o.astype(np.float64), e, rtol=1e-4, atol=1e-4 * scale,
                                       err_msg=f"{name} output {i} vs TensorFlow")
        else:
            np.testing.assert_array_equal(o.astype(e.dtype), e, err_msg=f"{name} output {i} vs TensorFlow")


def test_tf_fixtures_present():
    """The fixtures are committed; an empty manifest would silently test nothing."""
    names = _fixtures()
    assert len(names) >= 10, names


# --- malformed files ---------------------------------------------------------------------

def test_body_index_out_of_range_is_a_format_error():
    from fbjax.errors import ModelFormatError

    data = stablehlo_op_model("STABLEHLO_REDUCE", [((3, 4), F32), np.array(0.0, F32)], [((3,), F32)],
                              options=dict(dimensions=[1], body_subgraph_index=5))
    with pytest.raises(ModelFormatError, match=r"operator 0 \(STABLEHLO_REDUCE\): body_subgraph_index.*subgraph 5"):
        read_model(data)


def test_unknown_comparison_enum_is_a_format_error():
    from fbjax.errors import ModelFormatError

    data = stablehlo_op_model("STABLEHLO_COMPARE", [((3,), F32), ((3,), F32)], [((3,), B)],
                              options=dict(comparison_direction=9))
    with pytest.raises(ModelFormatError, match=r"StablehloCompareOptions.*comparison_direction.*value 9"):
        read_model(data)


#: (algorithm, state type, output shape, output type): both state encodings,
#: every output width the lowering takes, 32-bit shapes that exercise XLA's
#: choice of split dimension (first even one, else the first largest), and a
#: counter about to wrap around.
RNG_CASES = [
    ("THREEFRY", np.uint64, (3, 4), np.uint32), ("THREEFRY", np.uint32, (7, 3), np.uint32),
    ("THREEFRY", np.uint64, (3, 3, 2), np.uint32), ("THREEFRY", np.uint64, (), np.uint32),
    ("THREEFRY", np.uint32, (5, 3), np.uint64), ("THREEFRY", np.uint64, (2, 5), np.uint8),
    ("PHILOX", np.uint64, (7,), np.uint32), ("PHILOX", np.uint32, (3, 3), np.uint64),
    ("PHILOX", np.uint64, (2, 3), np.uint16), ("DEFAULT", np.uint64, (4, 5), np.uint32),
]


@pytest.mark.parametrize("alg,sdt,shape,odt", RNG_CASES, ids=lambda v: getattr(v, "__name__", str(v)))
def test_rng_bit_generator_twin_matches_the_lowering(alg, sdt, shape, odt):
    """The numpy twin reproduces XLA's (the lowering's) bits and new state
    exactly; the counter starts 3 below the 64-bit wrap-around."""
    from fbjax.reference import run

    state = np.array([0x0123456789ABCDEF, 2**64 - 3], np.uint64).view(sdt)
    data = stablehlo_op_model("STABLEHLO_RNG_BIT_GENERATOR", [(state.shape, state.dtype)],
                              [(state.shape, state.dtype), (shape, odt)], options=dict(algorithm=alg))
    outs = fbjax.load(data)(state)
    ref = run(read_model(data), state)
    for i, (o, r) in enumerate(zip(outs, ref)):
        _check(o, r, f"rng_bit_generator {alg} output {i} vs the numpy twin")
    assert np.asarray(outs[0]).view(np.uint64)[1] != np.uint64(2**64 - 3)  # the counter moved on


def test_rng_bit_generator_twin_rejects_a_wrong_state_size():
    from fbjax.errors import ModelFormatError
    from fbjax.reference import run

    state = np.zeros(3, np.uint64)  # 192 bits: PHILOX only
    data = stablehlo_op_model("STABLEHLO_RNG_BIT_GENERATOR", [(state.shape, state.dtype)],
                              [(state.shape, state.dtype), ((2,), np.uint32)], options=dict(algorithm="THREEFRY"))
    with pytest.raises(ModelFormatError, match="128-bit"):
        run(read_model(data), state)
