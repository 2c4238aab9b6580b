"""Op set ``"gpu_cl"`` (TFLite GPU delegate kernels): every lowering has its numpy twin, and both agree.

* Registry parity: the keys of op set ``"gpu_cl"`` in :data:`fbjax.lower.LOWERINGS`,
  :data:`fbjax.reference.registry.REFERENCE` and the reader's op table
  (:data:`fbjax.formats.gpu_cl.KERNELS`) are the same, with the same static
  inputs and attribute names, and every attribute the cases set is one the op takes.
* Agreement: each op runs as a one-op IR graph on seeded random inputs of small
  shapes, through its JAX lowering (:func:`fbjax.lower.build.build`) and its twin
  (:func:`fbjax.reference.run`, float64 accumulation rounded once to float32).
  Tolerances follow what is computed (``EPS`` = float32 machine epsilon):

  - ``"exact"``: data movement, max, ReLU/PReLU selects, one product: the same
    float32 operations, equal bits;
  - ``("sum", K)``: a float32 sum of K products (plus a bias) against the exact sum:
    ``(K + 1) * EPS * S`` elementwise, ``S`` being the twin run on the absolute values
    of every input and weight (``sum |x| |w| + |b|``, for a mean ``mean |x|``);
  - ``("lerp", n)``: n axes of 2-point interpolation ``a + (b - a) * t``: three roundings
    per axis of values at most ``max |x|``: ``3 n EPS max |x|``;
  - ``("ulp", n)``: an element-wise formula of n float32 roundings (``exp`` counted as 2):
    ``n * EPS * (|want| + M)``, ``M`` the magnitude of the formula's intermediate terms.

  The same cases run again with ``compute_dtype="float16"`` (the delegate's F16
  storage: inputs, weights and results rounded to float16, sums accumulated in
  float32; ``mean`` and ``pooling_2d`` stay float32, their ``full_precision`` fact)
  against the float32 twin, each value allowed its own float16 roundings on top
  (:func:`test_float16_lowering_agrees_with_twin`). Whole models in float16 are
  checked against the delegate's outputs in tests/test_gpu_cl_format.py.

A new op registered without a case fails :func:`test_every_op_has_a_case`; an op
without a case needs an entry in :data:`EXCLUDED` with its reason (none today).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np
import pytest

import fbjax.reference
from fbjax import loading
from fbjax.formats.gpu_cl import KERNELS
from fbjax.ir import Graph, ModelIR, Node, Value
from fbjax.lower import LOWERINGS
from fbjax.lower.build import build
from fbjax.reference.registry import REFERENCE

OP_SET = "gpu_cl"
EPS = float(np.finfo(np.float32).eps)

#: ops without a generated case, with the reason (a registered op in neither cases nor here fails)
EXCLUDED: dict[str, str] = {}

#: the variants each op's reader produces (``variant`` / ``kind`` attributes): every one needs a case
VARIANTS = {"convolution_2d": {"general", "1x1", "runtime_weights", "converter"},
            "depthwise_convolution": {"general", "3x3"}, "convolution_transposed": {"thin"},
            "pooling_2d": {"max", "average"}}


def _keys(registry) -> set:
    return {name for (s, name) in (od.key for od in registry) if s == OP_SET}


def test_registries_and_op_table_name_the_same_ops():
    low, ref = _keys(LOWERINGS), _keys(REFERENCE)
    assert low, "no gpu lowerings registered"
    assert low - ref == set(), f"lowerings without a numpy twin: {sorted(low - ref)}"
    assert ref - low == set(), f"numpy twins without a lowering: {sorted(ref - low)}"
    assert set(KERNELS) == low, ("the reader's op table and the lowerings differ: "
                                 f"{sorted(set(KERNELS) ^ low)}")


@pytest.mark.parametrize("op", sorted(_keys(LOWERINGS)))
def test_twin_declares_the_same_signature(op):
    a, b = LOWERINGS.get(OP_SET, op), REFERENCE.get(OP_SET, op)
    assert a.static_inputs == b.static_inputs, (op, a.static_inputs, b.static_inputs)
    assert a.attr_names == b.attr_names, (op, sorted(a.attr_names ^ b.attr_names))
    assert a.accepts_any_attr == b.accepts_any_attr


# --- cases ----------------------------------------------------------------------------------

@dataclass
class Case:
    """One node: runtime inputs (shapes), constant inputs (arrays), output shape, attributes, tolerance."""

    op: str
    ins: list  # shapes of the runtime inputs
    out: tuple
    attrs: dict = field(default_factory=dict)
    consts: list = field(default_factory=list)  # arrays after the runtime inputs
    tol: object = "exact"
    scale: float = 1.0  # inputs are normal(0, scale)
    label: str = ""

    @property
    def id(self) -> str:
        return f"{self.op}[{self.label}]"


def _w(rng, *shape):
    return rng.normal(size=shape).astype(np.float32)


def _out(n, k, s, d, before, after=None):
    """Output size of a window op: input n, kernel k, stride s, dilation d, padding before (and after)."""
    after = before if after is None else after
    return (n + before + after - d * (k - 1) - 1) // s + 1


def _cases() -> list:
    rng = np.random.default_rng(0)
    cs = []
    # convolution_2d: general (3x3, stride 2, padding 1), dilated, 1x1, runtime filter, converter
    for label, (k, s, d, p), (h, w_), (ci, co) in (
            ("general", (3, 2, 1, 1), (7, 6), (5, 6)), ("general", (3, 1, 2, 2), (6, 6), (4, 3)),
            ("general", (2, 2, 1, 0), (5, 5), (3, 9)), ("1x1", (1, 1, 1, 0), (4, 5), (7, 5))):
        out = (2, _out(h, k, s, d, p), _out(w_, k, s, d, p), co)
        attrs = {"kernel": (k, k), "strides": (s, s), "dilations": (d, d), "padding": (p, p), "variant": label}
        cs.append(Case("convolution_2d", [(2, h, w_, ci)], out, attrs, [_w(rng, co, k, k, ci), _w(rng, co)],
                       ("sum", k * k * ci), label=f"{label} k{k} s{s} d{d} p{p}"))
    # asymmetric: kernel, stride, dilation and padding differ between y and x
    (kh, kw), (sy, sx), (dy, dx), (py, px), (h, w_) = (3, 2), (2, 1), (1, 2), (1, 0), (7, 6)
    out = (1, _out(h, kh, sy, dy, py), _out(w_, kw, sx, dx, px), 4)
    cs.append(Case("convolution_2d", [(1, h, w_, 3)], out,
                   {"kernel": (kh, kw), "strides": (sy, sx), "dilations": (dy, dx), "padding": (py, px),
                    "variant": "general"}, [_w(rng, 4, kh, kw, 3), _w(rng, 4)], ("sum", kh * kw * 3),
                   label="general asymmetric"))
    cs.append(Case("depthwise_convolution", [(1, h, w_, 5)], (out[0], out[1], out[2], 5),
                   {"kernel": (kh, kw), "strides": (sy, sx), "dilations": (dy, dx), "padding": (py, px),
                    "variant": "general"}, [_w(rng, 1, kh, kw, 5), _w(rng, 5)], ("sum", kh * kw),
                   label="general asymmetric"))
    for kind in ("max", "average"):
        cs.append(Case("pooling_2d", [(1, h, w_, 2)], (1, _out(h, kh, sy, 1, py), _out(w_, kw, sx, 1, px), 2),
                       {"kind": kind, "kernel": (kh, kw), "strides": (sy, sx), "padding": (py, px)},
                       tol="exact" if kind == "max" else ("sum", kh * kw), label=f"{kind} asymmetric"))
    cs.append(Case("convolution_2d", [(1, 6, 6, 4), (5, 3, 3, 4)], (1, 6, 6, 5),
                   {"kernel": (3, 3), "strides": (1, 1), "dilations": (1, 1), "padding": (1, 1),
                    "variant": "runtime_weights"}, [_w(rng, 5)], ("sum", 9 * 4), label="runtime_weights"))
    cs.append(Case("convolution_2d", [(5, 3, 3, 4)], (5, 3, 3, 4), {"variant": "converter"}, label="converter"))
    # depthwise_convolution, multiplier 1
    for label, (k, s, d, p), (h, w_), c in (("general", (3, 2, 1, 1), (7, 7), 6), ("general", (5, 1, 1, 2), (6, 5), 4),
                                            ("general", (3, 1, 2, 2), (6, 6), 3), ("3x3", (3, 1, 1, 1), (5, 4), 5)):
        out = (2, _out(h, k, s, d, p), _out(w_, k, s, d, p), c)
        attrs = {"kernel": (k, k), "strides": (s, s), "dilations": (d, d), "padding": (p, p), "variant": label}
        cs.append(Case("depthwise_convolution", [(2, h, w_, c)], out, attrs, [_w(rng, 1, k, k, c), _w(rng, c)],
                       ("sum", k * k), label=f"{label} k{k} s{s} d{d} p{p}"))
    cs.append(Case("fully_connected", [(3, 1, 1, 10)], (3, 1, 1, 7), {}, [_w(rng, 7, 10), _w(rng, 7)], ("sum", 10),
                   label="10->7"))
    for (kh, kw), (h, w_), (oh, ow) in (((2, 2), (3, 4), (6, 8)), ((3, 3), (3, 3), (8, 9))):
        cs.append(Case("convolution_transposed", [(1, h, w_, 6)], (1, oh, ow, 1),
                       {"kernel": (kh, kw), "strides": (kh, kw), "variant": "thin"},
                       [_w(rng, 1, kh, kw, 6), _w(rng, 1)], ("sum", 6), label=f"thin k{kh} out{oh}x{ow}"))
    for kind in ("max", "average"):
        for k, s, p, (h, w_) in ((3, 2, 1, (7, 6)), (2, 2, 0, (6, 6)), (3, 1, 1, (4, 5))):
            out = (2, _out(h, k, s, 1, p), _out(w_, k, s, 1, p), 3)
            cs.append(Case("pooling_2d", [(2, h, w_, 3)], out,
                           {"kind": kind, "kernel": (k, k), "strides": (s, s), "padding": (p, p)},
                           tol="exact" if kind == "max" else ("sum", k * k), label=f"{kind} k{k} s{s} p{p}"))
    # element-wise
    cs.append(Case("add", [(2, 3, 4, 5), (2, 3, 4, 5)], (2, 3, 4, 5), label="2 inputs"))
    cs.append(Case("add", [(1, 3, 4, 5), (1, 3, 4, 5), (1, 3, 4, 5)], (1, 3, 4, 5), label="3 inputs"))
    cs.append(Case("add", [(1, 3, 4, 6), (1, 3, 4, 4)], (1, 3, 4, 6), label="fewer channels"))
    cs.append(Case("mul", [(2, 3, 4, 5), (2, 3, 4, 5)], (2, 3, 4, 5), label="2 inputs"))
    cs.append(Case("mul", [(1, 3, 4, 5), (1, 1, 1, 5)], (1, 3, 4, 5), label="per channel"))
    cs.append(Case("mul", [(1, 3, 4, 5), (1, 3, 4, 1)], (1, 3, 4, 5), label="per pixel"))
    for op in ("subtract", "div", "maximum", "minimum"):  # the other two-input kernels of tasks/elementwise.cc
        cs.append(Case(op, [(2, 3, 4, 5), (2, 3, 4, 5)], (2, 3, 4, 5), label="2 inputs"))
        cs.append(Case(op, [(1, 3, 4, 5), (1, 3, 4, 1)], (1, 3, 4, 5), label="per pixel"))
        cs.append(Case(op, [(1, 3, 4, 5), (1, 1, 1, 5)], (1, 3, 4, 5), label="per channel"))
    cs.append(Case("prelu", [(2, 3, 4, 5)], (2, 3, 4, 5), {}, [_w(rng, 1, 1, 5)]))
    for clip, alpha in ((0.0, 0.0), (6.0, 0.0), (0.0, 0.1), (1.0, 0.2), (0.0, -0.5), (0.0, 1.5), (2.0, 1.5)):
        cs.append(Case("relu", [(2, 3, 4, 5)], (2, 3, 4, 5), {"clip": clip, "alpha": alpha}, scale=3.0,
                       label=f"clip{clip} alpha{alpha}"))
    cs.append(Case("sigmoid", [(2, 3, 4, 5)], (2, 3, 4, 5), tol=("ulp", 4), scale=8.0))
    cs.append(Case("hard_swish", [(2, 3, 4, 5)], (2, 3, 4, 5), tol=("ulp", 3), scale=4.0))
    # data movement
    cs.append(Case("concat", [(1, 3, 4, 2), (1, 3, 4, 5)], (1, 3, 4, 7), label="channels"))
    cs.append(Case("concat", [(2, 2, 4, 3), (2, 3, 4, 3), (2, 1, 4, 3)], (2, 6, 4, 3), label="height"))
    cs.append(Case("concat", [(1, 3, 1, 3), (1, 3, 2, 3)], (1, 3, 3, 3), label="width"))
    cs.append(Case("reshape", [(2, 2, 3, 4)], (2, 4, 3, 2), label="hwc"))
    cs.append(Case("reshape", [(1, 2, 3, 4)], (1, 1, 1, 24), label="flatten"))
    cs.append(Case("mean", [(2, 5, 7, 3)], (2, 1, 1, 3), tol=("sum", 35)))
    cs.append(Case("pad", [(1, 3, 4, 2)], (1, 6, 5, 2), {"prepended": (1, 0, 0)}, label="spatial"))
    cs.append(Case("pad", [(2, 3, 4, 2)], (2, 3, 4, 7), {"prepended": (0, 0, 2)}, label="channels"))
    cs.append(Case("slice", [(1, 7, 6, 5)], (1, 3, 5, 3), {"offsets": (1, 1, 2), "strides": (2, 1, 1)},
                   label="strided"))
    cs.append(Case("slice", [(2, 4, 4, 3)], (2, 2, 2, 3), {"offsets": (0, 2, 0), "strides": (1, 1, 1)}, label="crop"))
    cs.append(Case("slice", [(1, 6, 5, 9)], (1, 3, 5, 4), {"offsets": (5, 4, 1), "strides": (-2, -1, 2)},
                   label="backwards, channel stride"))
    cs.append(Case("slice", [(1, 3, 3, 12)], (1, 3, 3, 4), {"offsets": (0, 0, 8), "strides": (1, 1, 1)},
                   label="whole slices"))
    for (h, w_), (oh, ow), half in (((3, 4), (6, 8), True), ((3, 4), (6, 8), False), ((6, 5), (3, 4), True)):
        scale = (h / oh, w_ / ow)
        cs.append(Case("resize", [(1, h, w_, 3)], (1, oh, ow, 3),
                       {"method": "bilinear", "half_pixel": half, "scale": scale}, tol=("lerp", 2),
                       label=f"{h}x{w_}->{oh}x{ow} half_pixel={half}"))
    return cs


CASES = _cases()


def test_max_pooling_starts_at_minus_10000():
    """The delegate's max pooling code (TF 2.5 ``tasks/pooling.cc``, as the shared files hold it:
    ``FLT4 maximum = INIT_FLT4(-10000.0f);``) never returns less than -10000, nor -inf for a window of padding
    only; both sides follow it."""
    x = np.full((1, 2, 2, 1), -3e4, np.float32)
    x[0, 0, 0, 0] = -2e4
    case = Case("pooling_2d", [x.shape], (1, 2, 2, 1), {"kind": "max", "kernel": (2, 2), "strides": (1, 1),
                                                        "padding": (0, 0)})
    ir = loading.read(_graph(case, []))
    prog = build(ir)
    want = np.full((1, 2, 2, 1), -10000.0, np.float32)
    got, _ = prog.apply(prog.params, None, x)
    got = np.asarray(got[0] if isinstance(got, (list, tuple)) else got)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(fbjax.reference.run(ir, x)[0], want)


def test_every_op_has_a_case():
    registered = _keys(LOWERINGS)
    covered = {c.op for c in CASES}
    assert covered <= registered, f"cases for ops not registered: {sorted(covered - registered)}"
    assert set(EXCLUDED) <= registered, f"exclusions of ops not registered: {sorted(set(EXCLUDED) - registered)}"
    assert not covered & set(EXCLUDED), f"excluded ops that have cases: {sorted(covered & set(EXCLUDED))}"
    assert len(covered) == len(registered) - len(EXCLUDED), \
        f"ops with neither a case nor an excluding reason: {sorted(registered - covered - set(EXCLUDED))}"
    for op, want in VARIANTS.items():
        have = {c.attrs.get("variant") or c.attrs.get("kind") for c in CASES if c.op == op}
        assert have == want, (op, sorted(want - have), sorted(have - want))


def _graph(case: Case, consts: list) -> ModelIR:
    ins = [Value(f"x{i}", np.dtype(np.float32), tuple(s)) for i, s in enumerate(case.ins)]
    cvals = [Value(f"c{i}", np.dtype(np.float32), c.shape, data=c) for i, c in enumerate(consts)]
    out = Value("y", np.dtype(np.float32), tuple(case.out))
    node = Node(OP_SET, case.op, [*ins, *cvals], [out], dict(case.attrs), location=case.id)
    return ModelIR("gpu_cl", [Graph("op", ins, [out], [node], ins + cvals + [out])])


def _run(case: Case, compute_dtype=None):
    """``(inputs, lowering's output as float64, twin's output)`` of a case on its seeded inputs."""
    rng = np.random.default_rng(zlib.crc32(case.id.encode()))
    xs = [(rng.normal(size=s) * case.scale).astype(np.float32) for s in case.ins]
    ir = loading.read(_graph(case, case.consts))
    prog = build(ir, options={"compute_dtype": compute_dtype} if compute_dtype else None)
    got, _ = prog.apply(prog.params, None, *xs)
    got = np.asarray(got[0] if isinstance(got, (list, tuple)) else got)
    want = fbjax.reference.run(ir, *xs)[0]
    assert got.shape == want.shape == tuple(case.out), (got.shape, want.shape, case.out)
    return xs, got, want


#: ops whose result can be far larger than the twin on absolute values (``|x| - |y|`` for ``x - y``, ``min(|x|,
#: |y|)`` for ``min(x, y)``): their magnitude is ``|x| + |y|``, which bounds each operand
_OPERAND_MAGNITUDE = frozenset({"subtract", "maximum", "minimum"})


def _abs_twin(case: Case, xs: list) -> np.ndarray:
    """The twin on the absolute values of every input and weight: ``sum |x| |w| + |b|`` for a sum (for
    :data:`_OPERAND_MAGNITUDE` ops ``|x| + |y|``)."""
    if case.op in _OPERAND_MAGNITUDE:
        return np.abs(xs[0]).astype(np.float64) + np.abs(xs[1]).astype(np.float64)
    return np.asarray(fbjax.reference.run(_graph(case, [np.abs(c) for c in case.consts]),
                                          *[np.abs(x) for x in xs])[0], np.float64)


def _bound(case: Case, xs: list, want: np.ndarray, eps: float, sum_eps: float) -> np.ndarray:
    """The case's tolerance with ``eps`` the rounding of each element-wise step and ``sum_eps`` that of each
    accumulated term (both float32's in float32; in float16 mode sums still accumulate in float32)."""
    kind, n = case.tol
    if kind == "sum":
        return (n + 1) * sum_eps * _abs_twin(case, xs)
    if kind == "lerp":
        return np.full(want.shape, 3 * n * eps * max(float(np.abs(x).max()) for x in xs))
    # "ulp": |x| bounds the intermediate terms of sigmoid (1 + exp(-x) >= 1) and hard_swish (|x| * clip <= |x|)
    x = np.abs(xs[0]).astype(np.float64)
    return n * eps * (np.abs(want) + (x * (x / 6 + 0.5) if case.op == "hard_swish" else 0))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_lowering_agrees_with_twin(case):
    od = LOWERINGS.get(OP_SET, case.op)
    assert set(case.attrs) <= od.attr_names, (case.id, sorted(set(case.attrs) - od.attr_names))
    xs, got, want = _run(case)
    assert got.dtype == want.dtype == np.float32
    if case.tol == "exact":
        np.testing.assert_array_equal(got, want, err_msg=case.id)
        return
    err = np.abs(got.astype(np.float64) - want)
    bound = _bound(case, xs, want, EPS, EPS)
    assert float(np.max(err - bound)) <= 0, (case.id, float(err.max()))


#: float16's unit roundoff (half its machine epsilon)
U16 = float(np.finfo(np.float16).eps) / 2


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_float16_lowering_agrees_with_twin(case):
    """``compute_dtype="float16"`` (the delegate's F16 storage): inputs, weights and every stored result are
    rounded to float16, sums still accumulate in float32. Against the float32 twin: each value is off by its
    own float16 rounding, at most 3 of them (inputs, constant, result: ``3 U16 S``, S the twin on absolute
    values; 1.5 S for a slope up to 1.5) on top of the float32 case's bound, element-wise steps taken at
    float16's precision."""
    xs, got, want = _run(case, "float16")
    err = np.abs(got.astype(np.float64) - want)
    s = _abs_twin(case, xs)
    bound = 3 * U16 * 1.5 * s
    if case.tol != "exact":
        kind, _ = case.tol
        bound = bound + _bound(case, xs, want, 2 * U16 if kind in ("lerp", "ulp") else EPS, EPS)
        if kind == "ulp":  # the input's own rounding, through a slope of at most 1.5 (hard_swish; sigmoid 1/4)
            bound = bound + 1.5 * U16 * np.abs(xs[0]).astype(np.float64)
    assert float(np.max(err - bound)) <= 0, (case.id, float(err.max()))
