"""Conformance of the StableHLO lowering against the StableHLO project's
JAX-generated op tests (``../shared/stablehlo-testdata/*.mlir``).

Each file's ``@main`` calls ``@inputs()`` and ``@expected()`` (constant
functions), computes with StableHLO ops and checks the result with
``check.expect_eq`` / ``expect_close`` / ``expect_almost_eq``. For every
file whose computation the prototype ``stablehlo.flatbuf`` format can
express, the computation (without the check calls) is written as a model
with :class:`fbjax.export.StablehloFlatbufferWriter` (the inputs become
model inputs), loaded with :func:`fbjax.load`, run, and compared with the
file's expected values (the external oracle) at the file's own tolerance:

* ``expect_eq``: exact (NaN equals NaN);
* ``expect_close``: at most ``max_ulp_difference`` units in the last place
  (the attribute when present, else :data:`DEFAULT_MAX_ULP`);
* ``expect_almost_eq``: ``|actual - expected| <= tolerance`` (the attribute
  when present, else :data:`DEFAULT_ALMOST_EQ_TOL`).

The defaults are the check dialect's (``stablehlo/tests/CheckOps.td``) as we
know them; the attributes never appear in this data set (all checks use the
defaults).

Files the prototype format cannot express (an op outside its 25, or a
bool / bf16 / complex tensor) are written instead as a TFLite model of
``STABLEHLO_*`` builtins (:mod:`stablehlo_tflite_writer`: region bodies as
appended subgraphs, as TensorFlow's converter writes them with
``OpsSet.EXPERIMENTAL_STABLEHLO_OPS``) and run the same way. Files neither
encoding expresses (ops with no ``STABLEHLO_*`` code such as sqrt, sine,
xor, reverse, select_and_scatter, the chlo ops) are skipped with the
reason; expressible files that are known not to pass are listed with
reasons in ``stablehlo_excludes.py``.

The default run checks bounded subsets (:data:`FAST_SUBSET`,
:data:`FAST_SUBSET_TFLITE`); the full set
runs under ``-m slow`` (``nox -s conformance_stablehlo`` prints the pass
rate, also ``python tests/test_stablehlo_conformance.py``).
"""

from __future__ import annotations

import fnmatch
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from stablehlo_excludes import EXCLUDES  # noqa: E402

TESTDATA = ROOT.parent / "shared" / "stablehlo-testdata"
MISSING = f"the StableHLO test data folder {TESTDATA} is absent"

#: check.expect_close default (ULPs) and check.expect_almost_eq default.
DEFAULT_MAX_ULP = 1
DEFAULT_ALMOST_EQ_TOL = 1e-4
#: pass-rate target over the expressible, non-excluded cases.
TARGET_PASS_RATE = 0.95

#: a bounded, deterministic subset for the default run: one file per op
#: family of the prototype format (float32 unless the op is integer-only).
FAST_SUBSET = [
    "abs_float32_20_20.mlir",
    "add_float32_20_20_float32_20_20.mlir",
    "add_int8_20_20_int8_20_20.mlir",
    "sub_float32_20_20_float32_20_20.mlir",
    "mul_float32_20_20_float32_20_20.mlir",
    "div_float32_2_4_3_float32_2_1_3.mlir",
    "max_float32_20_20_float32_20_20.mlir",
    "min_int32_20_20_int32_20_20.mlir",
    "ceil_float32_20_20.mlir",
    "clamp_float32_float32_2_3_float32.mlir",
    "concatenate_float32_2_3_float32_2_3.mlir",
    "slice_float32_5_3.mlir",
    "broadcast_in_dim_float32_2.mlir",
    "dot_general_float32_4_3_float64_3_6.mlir",
    "conv_general_dilated_float32_2_3_9_10_float32_3_3_4_5_t2.mlir",
    "conv_general_dilated_float32_1_28_28_1_float32_3_3_1_16.mlir",
    "reduce_sum_float32_2_3.mlir",
    "reduce_max_float32_2_3.mlir",
    "reduce_window_max_float32_4_6.mlir",
    "reduce_window_add_float32_112_112.mlir",
    "gather_float32_10_10_10_int64_1_4_2.mlir",
    "reshape_float32_2_3.mlir",
    "convert_element_type_float32_100_100.mlir",
    "iota_.mlir",
    "reduce_float32_4_6_int32_4_6.mlir",
    "cumsum_float32_8_9.mlir",
    "dot_general_float16_4_3_float32_3_6.mlir",
    "div_int32_2_int32_2.mlir",
]

#: the same for files only a TFLite model of STABLEHLO_* builtins can express
#: (an op outside the prototype's 25, or a bool / bf16 / complex tensor).
FAST_SUBSET_TFLITE = [
    "scatter_add_float32_1_125_float32_1.mlir",
    "scatter_add_bfloat16_1_2_3_bfloat16_1_3.mlir",
    "scatter_max_int8_1_1_1_int8_1_1.mlir",
    "scatter_mul_float32_1_125_float32_1.mlir",
    "scatter_min_uint8_1_125_uint8_1.mlir",
    "eq_bool_bool.mlir",
    "pad_bool_2_3_bool.mlir",
    "sort_bfloat16_5_7.mlir",
    "select_and_gather_add_float16_4_6_float16_4_6.mlir",
    "rem_float16_2_float16_2.mlir",
    "shift_left_int16_20_20_int16_20_20.mlir",
    "and_bool_20_20_bool_20_20.mlir",
    "dynamic_slice_bfloat16_3_int64_1.mlir",
    "dynamic_update_slice_bool_3_bool_1_int64_1.mlir",
    "transpose_bool_2_3.mlir",
    "reduce_and_bool_2_3.mlir",
    "reduce_min_bool_2_3.mlir",
    "add_complex64_20_20_complex64_20_20.mlir",
    "rng_bit_generator_uint64_2.mlir",
]
#: files without a numpy twin (none: rng_bit_generator's twin reproduces XLA's bits).
NO_TWIN: set = set()


# --- reading a test file -------------------------------------------------------

@dataclass
class Case:
    """One test file: the model bytes and data, or why it is not expressible."""

    path: Path
    data: Optional[bytes] = None
    inputs: list = field(default_factory=list)
    expected: list = field(default_factory=list)
    checks: list = field(default_factory=list)  # (kind, attrs dict) per output
    reason: Optional[str] = None  # not expressible: why
    ops: list = field(default_factory=list)  # op names of the computation
    encoding: str = "stablehlo.flatbuf"  # or "tflite" (STABLEHLO_* builtins)
    flatbuf_reason: Optional[str] = None  # why the prototype format could not express it


def _funcs(module):
    from jaxlib.mlir import ir

    return {ir.StringAttr(op.attributes["sym_name"]).value: op
            for op in module.body.operations if op.operation.name == "func.func"}


def _const_returns(func) -> list:
    """numpy values of a function that returns constants (``@inputs``)."""
    from fbjax.export import dense_to_numpy

    env = {}
    for op in func.regions[0].blocks[0].operations:
        o = op.operation
        if o.name == "stablehlo.constant":
            env[o.results[0]] = dense_to_numpy(o.attributes["value"], o.results[0].type)
        elif o.name == "func.return":
            return [env[v] for v in o.operands]
        else:
            raise KeyError(o.name)
    raise KeyError("no return")


def _check_attrs(op) -> dict:
    from jaxlib.mlir import ir

    out = {}
    for k in ("max_ulp_difference", "tolerance"):
        if k in op.attributes:
            a = op.attributes[k]
            out[k] = a.value if isinstance(a, (ir.FloatAttr, ir.IntegerAttr)) else float(str(a).split(":")[0])
    return out


class _Skip(Exception):
    """A case the encoding cannot express; the message is the reason."""


def _split_main(case: Case, funcs: dict, read_consts) -> Optional[tuple]:
    """Walk ``@main``: ``(in_vals, ops, outputs)`` of the computation under test.

    Calls to ``@inputs``/``@expected`` are read with ``read_consts(call_op,
    func)`` (raising :class:`_Skip` for what the encoding cannot hold);
    ``check.*`` custom calls become outputs, expected values and checks.
    Returns None, with ``case.reason`` set, when the file cannot be used.
    """
    from jaxlib.mlir import ir

    body = list(funcs["main"].regions[0].blocks[0].operations)[:-1]
    in_vals, expected_of, outputs, ops = [], {}, [], []
    for op in body:
        o = op.operation
        if o.name == "func.call":
            callee = ir.FlatSymbolRefAttr(o.attributes["callee"]).value
            if callee in ("inputs", "expected"):
                try:
                    vals = read_consts(o, funcs[callee])
                except _Skip as e:
                    case.reason = str(e)
                    return None
                except KeyError as e:
                    case.reason = f"@{callee} is not a constant function ({e})"
                    return None
                if callee == "inputs":
                    in_vals += list(o.results)
                    case.inputs += vals
                else:
                    expected_of.update(zip(o.results, vals))
                continue
        if o.name == "stablehlo.custom_call":
            target = ir.StringAttr(o.attributes["call_target_name"]).value
            if target.startswith("check."):
                actual, exp = o.operands[0], o.operands[1]
                if exp not in expected_of:
                    case.reason = "expected value not from @expected"
                    return None
                outputs.append(actual)
                case.expected.append(expected_of[exp])
                case.checks.append((target[len("check."):], _check_attrs(o)))
                continue
        ops.append(op)
        case.ops.append(o.name)
    if not outputs:
        case.reason = "no check call"
        return None
    return in_vals, ops, outputs


def load_case(path: Path, encodings=("stablehlo.flatbuf", "tflite")) -> Case:
    """Parse a test file and write its computation as a model: the prototype
    ``stablehlo.flatbuf`` format where it can express it, else a TFLite
    model of ``STABLEHLO_*`` builtins (:func:`load_case_tflite`)."""
    try:
        case = load_case_flatbuf(path) if "stablehlo.flatbuf" in encodings else Case(path, reason="not tried")
    except (TypeError, ValueError) as e:  # constants the prototype's reader cannot decode (complex)
        case = Case(path, reason=f"type not expressible: {e}"[:120])
    if case.reason is None or "tflite" not in encodings:
        return case
    t = load_case_tflite(path)
    t.flatbuf_reason = case.reason
    return t


def load_case_tflite(path: Path) -> Case:
    """Parse a test file and write its computation as a TFLite model of
    ``STABLEHLO_*`` builtins (:mod:`stablehlo_tflite_writer`)."""
    from jax._src.interpreters import mlir as jax_mlir
    from jaxlib.mlir import ir

    from stablehlo_tflite_writer import NotExpressible, StablehloTfliteWriter, constant_value

    case = Case(path, encoding="tflite")
    with jax_mlir.make_ir_context():
        module = ir.Module.parse(path.read_text())
        funcs = _funcs(module)

        def read(call, func):  # the numpy values an @inputs/@expected function returns
            env = {}
            for op in func.regions[0].blocks[0].operations:
                o = op.operation
                if o.name == "stablehlo.constant":
                    try:
                        env[o.results[0]] = constant_value(o)
                    except NotExpressible as e:
                        raise _Skip(f"type not expressible: {e}") from None
                elif o.name == "func.return":
                    return [env[v] for v in o.operands]
                else:
                    raise KeyError(o.name)
            raise KeyError("no return")

        split = _split_main(case, funcs, read)
        if split is None:
            return case
        in_vals, ops, outputs = split
        w = StablehloTfliteWriter(module)
        try:
            w.add_graph(in_vals, ops, outputs)
            case.data = w.finish()
        except NotExpressible as e:
            keys = [k for k, _ in e.what.most_common()]
            ops_bad = [k for k in keys if not k.startswith("element type")]
            if ops_bad:
                case.reason = "op not expressible: " + ", ".join(ops_bad)
            else:
                case.reason = "type not expressible: " + ", ".join(k.split()[-1] for k in keys)
    return case


def load_case_flatbuf(path: Path) -> Case:
    """Parse a test file and write its computation as a stablehlo.flatbuf model."""
    from jax._src.interpreters import mlir as jax_mlir
    from jaxlib.mlir import ir

    from fbjax.export import ExportError, StablehloFlatbufferWriter, element_dtype

    case = Case(path)
    with jax_mlir.make_ir_context():
        module = ir.Module.parse(path.read_text())
        funcs = _funcs(module)

        def read(call, func):
            bad = sorted({str(ir.RankedTensorType(r.type).element_type) for r in call.results
                          if element_dtype(r.type) is None})
            if bad:
                raise _Skip("type not expressible: " + ", ".join(bad))
            return _const_returns(func)

        split = _split_main(case, funcs, read)
        if split is None:
            return case
        in_vals, ops, outputs = split
        w = StablehloFlatbufferWriter(module)
        bad_types = sorted({str(ir.RankedTensorType(v.type).element_type) for v in list(in_vals) + outputs
                            if element_dtype(v.type) is None})
        try:
            w.add_graph(in_vals, ops, outputs)
            case.data = w.finish()
        except ExportError as e:
            keys = sorted(e.ops)
            ops_bad = [k for k in keys if not k.startswith("element type")]
            types = sorted({k.split()[-1] for k in keys if k.startswith("element type")})
            if bad_types:  # the file's own inputs/outputs have no DataType
                case.reason = "type not expressible: " + ", ".join(bad_types)
            elif ops_bad:
                case.reason = "op not expressible: " + ", ".join(ops_bad)
            else:
                case.reason = "type not expressible: " + ", ".join(types)
        return case


def excluded(path: Path) -> Optional[str]:
    for pattern, reason in EXCLUDES.items():
        if fnmatch.fnmatch(path.name, pattern):
            return reason
    return None


# --- comparing -------------------------------------------------------------------

def _ordered(x: np.ndarray) -> np.ndarray:
    """Floats as integers in value order (adjacent floats differ by one)."""
    bits = {2: np.int16, 4: np.int32, 8: np.int64}[x.dtype.itemsize]
    i = x.view(bits).astype(np.int64) if x.dtype.itemsize < 8 else x.view(np.int64).astype(object)
    sign = np.int64(1) << (8 * x.dtype.itemsize - 1)
    if x.dtype.itemsize < 8:
        return np.where(i < 0, -(i & (sign - 1)), i)
    mag = np.array([int(v) & (int(sign) - 1) for v in i.reshape(-1)], dtype=object).reshape(i.shape)
    return np.where(i < 0, -mag, mag)


def compare(kind: str, attrs: dict, actual, expected) -> Optional[str]:
    """None if ``actual`` passes the check, else a short description."""
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    if actual.shape != expected.shape:
        return f"shape {actual.shape} != {expected.shape}"
    if actual.dtype != expected.dtype:
        return f"dtype {actual.dtype} != {expected.dtype}"
    if expected.dtype.kind == "c":  # each part at the check's tolerance
        for part in ("real", "imag"):
            msg = compare(kind, attrs, getattr(actual, part).copy(), getattr(expected, part).copy())
            if msg:
                return f"{part} part: {msg}"
        return None
    if not (np.issubdtype(expected.dtype, np.floating) or expected.dtype.name == "bfloat16"):
        bad = actual != expected
        return None if not bad.any() else f"{int(bad.sum())} of {bad.size} elements differ"
    nan_ok = np.isnan(actual) & np.isnan(expected)
    if kind == "expect_eq":
        bad = ~((actual == expected) | nan_ok)
    elif kind == "expect_close":
        ulp = int(attrs.get("max_ulp_difference", DEFAULT_MAX_ULP))
        d = np.abs(_ordered(actual) - _ordered(expected))
        bad = ~((d <= ulp) | nan_ok)
    elif kind == "expect_almost_eq":
        tol = float(attrs.get("tolerance", DEFAULT_ALMOST_EQ_TOL))
        with np.errstate(invalid="ignore"):
            bad = ~((np.abs(actual.astype(np.float64) - expected.astype(np.float64)) <= tol)
                    | nan_ok | (actual == expected))
    else:
        return f"unknown check {kind}"
    if bad.any():
        with np.errstate(invalid="ignore"):
            err = np.nanmax(np.abs(actual.astype(np.float64) - expected.astype(np.float64)))
        return f"{kind}: {int(bad.sum())} of {bad.size} elements off (max abs error {err:.3g})"
    return None


def run_case(case: Case) -> Optional[str]:
    """Load and run an expressible case; None when every check passes."""
    import fbjax

    model = fbjax.load(case.data)
    outs = model(*case.inputs)
    outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
    for i, ((kind, attrs), out, exp) in enumerate(zip(case.checks, outs, case.expected)):
        msg = compare(kind, attrs, out, exp)
        if msg:
            return f"output {i}: {msg}"
    return None


#: the numpy reference accumulates in float64, so it can be a few ULP *closer
#: to exact* than the XLA-computed expectations: it is held to a relative
#: tolerance per dtype, with an absolute part scaled by the result's magnitude
#: (cancellation in sums makes ULP distances near zero meaningless).
REFERENCE_RTOL = {np.dtype(np.float16): 4e-3, np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-12,
                  np.dtype(np.complex64): 1e-5, np.dtype(np.complex128): 1e-12}
try:  # bfloat16: 8 significant bits, two roundings apart
    import ml_dtypes

    REFERENCE_RTOL[np.dtype(ml_dtypes.bfloat16)] = 8e-3
except ImportError:  # pragma: no cover
    pass


def run_reference_case(case: Case) -> Optional[str]:
    """Run an expressible case with the numpy reference; None when it matches."""
    from fbjax.formats import read_model
    from fbjax.reference import run

    outs = run(read_model(case.data), *case.inputs)
    for i, (out, exp) in enumerate(zip(outs, case.expected)):
        out = np.asarray(out)
        if out.dtype != exp.dtype or out.shape != exp.shape:
            return f"output {i}: {out.dtype}{out.shape} != {exp.dtype}{exp.shape}"
        if exp.dtype in REFERENCE_RTOL:
            rtol = REFERENCE_RTOL[exp.dtype]
            wide = np.complex128 if exp.dtype.kind == "c" else np.float64
            scale = float(np.nanmax(np.abs(exp.astype(wide)))) if exp.size and np.isfinite(exp).any() else 1.0
            ok = np.isclose(out.astype(wide), exp.astype(wide), rtol=rtol, atol=rtol * scale, equal_nan=True)
        else:
            ok = out == exp
        if not ok.all():
            return f"output {i}: {int((~ok).sum())} of {ok.size} elements differ from the expected values"
    return None


# --- tests -------------------------------------------------------------------------

def _all_files() -> list:
    return sorted(TESTDATA.glob("*.mlir")) if TESTDATA.is_dir() else []


def _full_params(no_twin: bool = False) -> list:
    """Every test file as a pytest param; an excluded one (``EXCLUDES``; with
    ``no_twin``, also ``NO_TWIN``) runs as a strict xfail with its reason, so a
    fix shows as XPASS and fails until the exclusion goes."""
    out = []
    for p in _all_files():
        reason = excluded(p) or ("no numpy twin" if no_twin and p.name in NO_TWIN else None)
        marks = [pytest.mark.xfail(reason=f"excluded: {reason}", strict=True)] if reason else []
        out.append(pytest.param(p, id=p.stem, marks=marks))
    return out


def _check_file(path: Path) -> None:
    case = load_case(path)
    if case.reason:
        pytest.skip(f"not expressible in stablehlo.flatbuf nor as STABLEHLO_* TFLite: {case.reason}")
    msg = run_case(case)
    assert msg is None, f"{path.name}: {msg}"


@pytest.mark.skipif(not TESTDATA.is_dir(), reason=MISSING)
@pytest.mark.parametrize("name", FAST_SUBSET)
def test_conformance_subset(name):
    path = TESTDATA / name
    assert path.exists(), f"subset file {name} vanished from the test data"
    # the subset is chosen to be expressible: being skipped would hide a regression
    assert excluded(path) is None
    case = load_case(path)
    assert case.reason is None, f"{name} should be expressible: {case.reason}"
    msg = run_case(case)
    assert msg is None, f"{name}: {msg}"


@pytest.mark.skipif(not TESTDATA.is_dir(), reason=MISSING)
@pytest.mark.parametrize("name", FAST_SUBSET)
def test_reference_twins_subset(name):
    """The numpy reference twins against the test data's expected values."""
    case = load_case(TESTDATA / name)
    assert case.reason is None
    msg = run_reference_case(case)
    assert msg is None, f"{name} (reference): {msg}"


@pytest.mark.skipif(not TESTDATA.is_dir(), reason=MISSING)
@pytest.mark.parametrize("name", FAST_SUBSET_TFLITE)
def test_conformance_subset_tflite(name):
    """Files only the STABLEHLO_* TFLite encoding expresses: fbjax against the
    expected values, and the numpy twins too."""
    path = TESTDATA / name
    assert path.exists(), f"subset file {name} vanished from the test data"
    assert excluded(path) is None
    case = load_case(path)
    assert case.reason is None and case.encoding == "tflite", (case.reason, case.flatbuf_reason)
    assert case.flatbuf_reason, "expected the prototype format to refuse it"
    msg = run_case(case)
    assert msg is None, f"{name}: {msg}"
    if name not in NO_TWIN:
        msg = run_reference_case(case)
        assert msg is None, f"{name} (reference): {msg}"


@pytest.mark.skipif(not TESTDATA.is_dir(), reason=MISSING)
@pytest.mark.parametrize("strategy", ["shifted", "conv"])
def test_excluded_depthwise_case_differs_only_by_summation_order(strategy):
    """Keeps the depthwise exclusion honest: only the summation order differs.

    Each output of this grouped 1-D convolution is a float32 sum of k = 3
    products. Any summation order is within the standard bound
    ``|fl(sum) - sum| <= gamma_k * sum|x_i w_i|`` (``gamma_k = k u / (1 - k u)``,
    ``u = 2**-24``) of the exact float64 result, plus half an ULP for the final
    rounding. Both of fbjax's strategies (shifted multiply-adds, the CPU
    default, and XLA's grouped convolution, whose tiling is CPU-dependent)
    and the test data's own expectation must lie within it; a wrong tap or
    channel mapping would be off by whole products.
    """
    from fbjax.options import KernelOptions

    name = "conv_general_dilated_float32_2_3_9_float32_12_1_3.mlir"
    assert excluded(TESTDATA / name)
    case = load_case(TESTDATA / name)
    x, w = (np.asarray(a, np.float64) for a in case.inputs)  # x [b, f, 9], w [o, 1, 3]; 3 groups, rhs_dilate 2
    groups, k, dil = 3, w.shape[2], 2
    per_group = w.shape[0] // groups
    n_out = x.shape[2] - dil * (k - 1)
    taps = np.stack([x[:, o // per_group, t * dil:t * dil + n_out] * w[o, 0, t][None, None]
                     for o in range(w.shape[0]) for t in range(k)], axis=1).reshape(x.shape[0], w.shape[0], k, n_out)
    exact, magnitude = taps.sum(axis=2), np.abs(taps).sum(axis=2)
    u = 2.0 ** -24
    bound = k * u / (1 - k * u) * magnitude + u * np.abs(exact)
    expected = np.asarray(case.expected[0], np.float64)
    assert np.all(np.abs(expected - exact) <= bound), "the bound does not hold for the test data's own values"
    got = np.asarray(fbjax_load_and_run(case, kernel_options=KernelOptions(depthwise_strategy=strategy)), np.float64)
    err = np.abs(got - exact)
    assert np.all(err <= bound), f"{strategy}: max error {err.max():.3g}, {(err > bound).sum()} elements over the bound"


def fbjax_load_and_run(case: Case, **load_options):
    """The first output of a case run through ``fbjax.load`` (with ``load_options``)."""
    import fbjax

    outs = fbjax.load(case.data, **load_options)(*case.inputs)
    return outs[0] if isinstance(outs, (tuple, list)) else outs


@pytest.mark.slow
@pytest.mark.skipif(not TESTDATA.is_dir(), reason=MISSING)
@pytest.mark.parametrize("path", _full_params())
def test_conformance_full(path):
    _check_file(path)


@pytest.mark.slow
@pytest.mark.skipif(not TESTDATA.is_dir(), reason=MISSING)
@pytest.mark.parametrize("path", _full_params(no_twin=True))
def test_reference_twins_full(path):
    case = load_case(path)
    if case.reason:
        pytest.skip(f"not expressible in stablehlo.flatbuf nor as STABLEHLO_* TFLite: {case.reason}")
    msg = run_reference_case(case)
    assert msg is None, f"{path.name} (reference): {msg}"


def summarize(paths=None, verbose: bool = True) -> dict:
    """Run every file; returns counts and prints the pass rate."""
    paths = _all_files() if paths is None else paths
    stats = Counter()
    reasons = Counter()
    failures = []
    t0 = time.time()
    for p in paths:
        r = excluded(p)
        try:
            case = load_case(p)
        except Exception as e:  # noqa: BLE001 - a parse failure is reported, not fatal
            stats["unreadable"] += 1
            reasons[f"unreadable: {type(e).__name__}"] += 1
            continue
        if case.reason:
            stats["not expressible"] += 1
            key = case.reason.split(":")[0] + ": " + case.reason.split(": ", 1)[-1].split(", ")[0].split(" (x")[0]
            reasons[key] += 1
            continue
        stats["expressible"] += 1
        stats[f"expressible as {case.encoding}"] += 1
        try:
            msg = run_case(case)
        except Exception as e:  # noqa: BLE001
            msg = f"{type(e).__name__}: {str(e)[:200]}"
        if msg is None:
            stats["passed"] += 1
            stats[f"passed as {case.encoding}"] += 1
            if r:
                stats["excluded but passing"] += 1
        elif r:
            stats["excluded"] += 1
            reasons[f"excluded (expressible, fails): {r[:70]}..."] += 1
        else:
            failures.append((p.name, msg))
    rate = stats["passed"] / max(stats["expressible"], 1)
    if verbose:
        print(f"StableHLO test data: {len(paths)} files in {time.time() - t0:.0f}s")
        print(f"  expressible (stablehlo.flatbuf or STABLEHLO_* .tflite): {stats['expressible']}, "
              f"passed: {stats['passed']} ({100 * rate:.1f}%), failed (not excluded): {len(failures)}")
        for enc in ("stablehlo.flatbuf", "tflite"):
            print(f"    as {enc}: {stats[f'expressible as {enc}']} expressible, {stats[f'passed as {enc}']} passed")
        print(f"  excluded, expressible but failing (stablehlo_excludes.py): {stats['excluded']}"
              f" (excluded yet passing: {stats['excluded but passing']}); not expressible: "
              f"{stats['not expressible']}, unreadable: {stats['unreadable']}")
        for k, c in reasons.most_common():
            print(f"    {c:5d}  {k}")
        for name, msg in failures:
            print(f"  FAIL {name}: {msg}")
    return {"stats": stats, "rate": rate, "failures": failures, "reasons": reasons}


@pytest.mark.slow
@pytest.mark.skipif(not TESTDATA.is_dir(), reason=MISSING)
def test_conformance_pass_rate():
    res = summarize(verbose=True)
    assert res["stats"]["expressible"] > 0
    assert res["rate"] >= TARGET_PASS_RATE, res["failures"]
    assert not res["failures"], "failures not in stablehlo_excludes.py: " + str(res["failures"])


if __name__ == "__main__":
    args = sys.argv[1:]
    paths = None
    if args:
        paths = [p for p in _all_files() if any(fnmatch.fnmatch(p.name, a) for a in args)]
    res = summarize(paths)
    sys.exit(0 if res["rate"] >= TARGET_PASS_RATE else 1)
