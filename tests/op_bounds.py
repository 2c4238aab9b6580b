"""Error bounds derived from what an op computes, for comparing fbjax (XLA,
and its float64-or-float32 numpy reference) with LiteRT on one op in float32.

Each implementation's result lies within its own rounding error of the
exact result, so two of them differ by at most the sum of the two: every
bound below is ``2 x`` a per-implementation bound (:func:`op_bound`), in
terms of the oracle's output ``e`` (``|e|`` stands for ``|exact|``, a
relative difference of a few ``u`` that the factors absorb) and the inputs:

- ``EXACT``: the result is an input element, or an exactly representable
  function of them (moves, selections, max/min, abs/neg, floor/ceil/round,
  comparisons, casts to integers): any correct implementation returns it
  bit for bit, so the bound is 0 -- a property of the op, not of two
  compilations agreeing.
- ``ULPS``: a few correctly rounded float32 operations (``+ - * /``,
  ``sqrt``) or a libm/approximate function, each within ``k`` ulps of the
  exact result, plus, for functions whose accuracy is absolute rather than
  relative (``sin``/``cos`` after range reduction: ``u * max(1, |x|)``;
  ``exp(x) - 1``, ``log`` near 1, ``x - max - log(sum)``: cancellation), an
  absolute term in units of ``u``. Transcendental functions: XLA's CPU
  ``exp``/``log``/``tanh``/``logistic``/``erf`` are polynomial or rational
  approximations documented to a few ulps, glibc's ``expf``/``logf``/
  ``sinf``/``cosf``/``atan2f``/``powf`` are within 1 ulp, XNNPACK's vector
  approximations within a few ulps: ``TRANS_ULPS = 4`` per implementation.
- ``SUMS``: sums and dot products (convolutions, matmuls, pools, means,
  cumsums, segment sums): a float32 sum of ``n`` terms in any order is within
  ``gamma(n) * sum|terms|`` of exact (Higham); ``sum|terms|`` is the model
  on ``|inputs|`` and ``|weights|`` (:func:`magnitude`, valid for linear ops
  and monotone 1-Lipschitz fused activations); ``n`` is bounded by the
  largest operand's size plus 2 (bias, the mean's division).
- products (``REDUCE_PROD``): ``gamma(n) * |e|``.
- recurrent cells (``*RNN``, ``*LSTM``, ``SVDF``): per time step a dot
  product of ``n`` terms (``gamma(n) * S``, ``S`` = the largest row sums of
  ``|W|`` times ``max(1, max|x|)``, states bounded by 1 through tanh/sigmoid,
  which do not amplify an error: slopes <= 1) and activations within
  ``TRANS_ULPS`` of values <= 1; errors add over the ``T`` steps (the LSTM
  cell keeps at most ``f <= 1`` of its previous error).

``catch_factor`` reports how far a 1% perturbation of the output lands
outside a bound, so a bound can be seen not to be vacuous.
"""

from __future__ import annotations

import numpy as np

from conftest import U32, gamma

TRANS_ULPS = 4.0

EXACT = frozenset("""
ABS NEG CEIL FLOOR ROUND SIGN RELU RELU6 RELU_N1_TO_1 RELU_0_TO_1 MAXIMUM MINIMUM MAX_POOL_2D REDUCE_MAX
REDUCE_MIN UNSORTED_SEGMENT_MAX UNSORTED_SEGMENT_MIN BATCH_TO_SPACE_ND BROADCAST_TO CONCATENATION DEPTH_TO_SPACE
EXPAND_DIMS GATHER GATHER_ND MIRROR_PAD PACK PAD PADV2 RESHAPE REVERSE_SEQUENCE REVERSE_V2 SELECT SELECT_V2 SLICE
SPACE_TO_BATCH_ND SPACE_TO_DEPTH SPLIT SPLIT_V SQUEEZE STRIDED_SLICE TILE TRANSPOSE UNPACK MATRIX_DIAG
MATRIX_SET_DIAG DYNAMIC_UPDATE_SLICE EMBEDDING_LOOKUP FILL ZEROS_LIKE SPARSE_TO_DENSE TOPK_V2
RESIZE_NEAREST_NEIGHBOR DILATE REAL IMAG DENSIFY CAST BITCAST UNIQUE WHERE NON_MAX_SUPPRESSION_V4 FLOOR_DIV
MaxPoolingWithArgmax2D MaxUnpooling2D ONE_HOT RANGE
""".split())

SUMS = frozenset("""
ADD_N AVERAGE_POOL_2D BATCH_MATMUL CONV_2D CONV_3D CONV_3D_TRANSPOSE CUMSUM DEPTHWISE_CONV_2D FULLY_CONNECTED MEAN
SUM SEGMENT_SUM UNSORTED_SEGMENT_SUM EMBEDDING_LOOKUP_SPARSE SCATTER_ND TRANSPOSE_CONV Convolution2DTransposeBias
""".split())

RECURRENT = frozenset("""
RNN LSTM SVDF UNIDIRECTIONAL_SEQUENCE_RNN UNIDIRECTIONAL_SEQUENCE_LSTM BIDIRECTIONAL_SEQUENCE_RNN
BIDIRECTIONAL_SEQUENCE_LSTM
""".split())


#: op -> (ulps of |e| per implementation, absolute term in units of u per
#: implementation: fn(inputs as float64, e) -> array), with the reason.
ULPS = {
    # one correctly rounded operation
    "ADD": (1, None), "SUB": (1, None), "MUL": (1, None), "DIV": (1, None), "SQRT": (1, None),
    "SQUARE": (1, None), "LEAKY_RELU": (1, None), "PRELU": (1, None), "DEQUANTIZE": (1, None),
    "FLOOR_MOD": (1, None),  # fmod is exact; the sign fix-up adds one rounding
    # two or three roundings: (a - b)^2; 1/sqrt; x * relu6(x + 3) / 6 (the x + 3 rounding is absolute: u * 3 |x| / 6)
    "SQUARED_DIFFERENCE": (3, None), "RSQRT": (3, None),
    "HARD_SWISH": (3, lambda xs, e: 0.5 * np.abs(xs[0]) + 1),
    # transcendental (TRANS_ULPS each), plus the absolute part where the function's accuracy is absolute
    "EXP": (TRANS_ULPS, None), "TANH": (TRANS_ULPS, None), "LOGISTIC": (TRANS_ULPS + 2, None),
    "LOG": (TRANS_ULPS, lambda xs, e: 2 + 0 * e),
    "SIN": (TRANS_ULPS, lambda xs, e: 2 * np.maximum(1, np.abs(xs[0]))),
    "COS": (TRANS_ULPS, lambda xs, e: 2 * np.maximum(1, np.abs(xs[0]))),
    "ATAN2": (TRANS_ULPS, lambda xs, e: 4 + 0 * e),
    "ELU": (TRANS_ULPS + 1, lambda xs, e: 2 + 0 * e),  # exp(x) - 1: cancellation near 0
    "GELU": (TRANS_ULPS + 4, lambda xs, e: (TRANS_ULPS + 4) * np.abs(xs[0])),  # 0.5 x (1 + erf|tanh(...))
    "POW": (TRANS_ULPS, lambda xs, e: 0 * e),  # + the amplification below
    "COMPLEX_ABS": (TRANS_ULPS, None),  # hypot, or sqrt(re^2 + im^2): 4 roundings
    "L2_NORMALIZATION": (4, None),  # + gamma(n) of the sum of squares, below
    "L2_POOL_2D": (3, None),  # + gamma(n) of the window's squares, below
    "LOCAL_RESPONSE_NORMALIZATION": (2 * TRANS_ULPS, None),  # + gamma(n) of the squares, times beta, below
    "NON_MAX_SUPPRESSION_V5": (2 * TRANS_ULPS, None),  # soft scores: s * exp(-iou^2 / 2 sigma)
}


def magnitude(model, xs):
    """``model.apply`` on ``|params|`` and ``|inputs|`` (integer inputs as
    they are): for linear ops, each output's ``sum |terms|``."""
    p = {k: np.abs(np.asarray(v)) for k, v in model.params.items()}
    ins = [np.abs(x) if np.asarray(x).dtype.kind == "f" else x for x in xs]
    out = model.apply(p, *ins)
    out = out if isinstance(out, (list, tuple)) else [out]
    return [np.asarray(o, np.float64) for o in out]


def _n(model, xs) -> int:
    sizes = [np.size(x) for x in xs] + [np.size(v) for v in model.params.values()] + [1]
    return int(max(sizes)) + 2


def fake_quant_bound(x, e, *, min=0.0, max=0.0, num_bits=8, narrow_range=False, **_):  # noqa: A002
    """FAKE_QUANT (TF's nudged grid): ``q * scale + nudged_min`` with ``q =
    floor((clamp(x) - nudged_min) / scale + 0.5)``. Both sides round to the
    same grid point except where the pre-rounding value ``(clamp(x) -
    nudged_min) / scale`` lies within its own float32 rounding error (a
    subtraction, a multiply by ``1/scale`` or a division: ``3 u`` of the
    terms, per side) of a half-integer: there one step (``scale``) apart.
    Elsewhere the final ``q * scale + nudged_min`` (two roundings, or one
    FMA) differs by at most ``2 x 2 ulp(|e|)`` plus ``u |nudged_min|``."""
    qmin, qmax = (1 if narrow_range else 0), (1 << int(num_bits)) - 1
    scale = (float(max) - float(min)) / (qmax - qmin)
    zf = qmin - float(min) / scale
    zp = np.clip(np.sign(zf) * np.floor(abs(zf) + 0.5), qmin, qmax)
    nmin, nmax = (qmin - zp) * scale, (qmax - zp) * scale
    x = np.asarray(x, np.float64)
    pre = (np.clip(x, nmin, nmax) - nmin) / scale
    room = 2 * 3 * U32 * (np.abs(np.clip(x, nmin, nmax)) + abs(nmin)) / scale + 2 * 4 * U32 * np.abs(pre)
    near = np.abs(pre - np.floor(pre) - 0.5) <= room
    return np.where(near, scale * (1 + 4 * U32), 0) + 2 * (2 * 2 * U32 * np.abs(e) + U32 * abs(nmin))


def fixture_bound(ops, op: str, model, xs, expected, k: int, attrs=None):
    """:func:`op_bound` for a fixture whose model holds ``ops`` around the
    op under test: where another op computes (an RFFT2D feeding REAL/IMAG/
    COMPLEX_ABS, a FULLY_CONNECTED after DENSIFY or DEQUANTIZE), its error
    propagates: a DFT's ``2 gamma(n) sum|x|`` per real or imaginary part
    (twice that through the sum of both or the modulus), plus the last
    op's own ulps."""
    e = np.abs(np.asarray(expected[k], np.float64))
    if "RFFT2D" in ops and op != "RFFT2D":
        b, why = op_bound("RFFT2D", model, xs, expected, k)
        return 2 * b + 2 * TRANS_ULPS * 2 * U32 * e, f"2 x ({why}) + {TRANS_ULPS:g} ulps"
    if "FULLY_CONNECTED" in ops and op in EXACT | {"DEQUANTIZE"}:
        return op_bound("FULLY_CONNECTED", model, xs, expected, k)
    return op_bound(op, model, xs, expected, k, attrs)


def op_bound(op: str, model, xs, expected, k: int, attrs=None):
    """:func:`_op_bound`, plus ``TRANS_ULPS`` of the result per side for a
    fused TANH activation (slope <= 1: the input's error passes through)."""
    b, why = _op_bound(op, model, xs, expected, k, attrs)
    if b is not None and str((attrs or {}).get("fused_activation_function", "")).upper().endswith("TANH"):
        b = b + 2 * TRANS_ULPS * 2 * U32 * np.abs(np.asarray(expected[k], np.float64))
        why += " + fused tanh"
    return b, why


def _op_bound(op: str, model, xs, expected, k: int, attrs=None):
    """``(bound, reason)``: the elementwise bound on ``|fbjax - LiteRT|`` for
    output ``k`` of a one-op float32 model (``model``: it loaded with
    fbjax, ``xs``: its inputs, ``expected``: LiteRT's outputs). None when
    no rule covers ``op`` (the caller fails loudly)."""
    if op == "REDUCE_WINDOW":
        fn = str((attrs or {}).get("reduce_function", "")).upper()
        if fn.endswith("ADD"):
            op = "SUM"
        elif fn.endswith(("MUL", "PROD")):
            op = "REDUCE_PROD"
        elif fn.endswith(("MAXIMUM", "MINIMUM")):
            op = "MAXIMUM"
        else:
            return None, f"no error rule for REDUCE_WINDOW {fn!r}"
    e = np.asarray(expected[k], np.float64)
    ae = np.abs(e)
    f64 = [np.asarray(x, np.float64) for x in xs]
    if op in EXACT:
        return np.zeros_like(e), "exact: the result is representable and any correct kernel returns it"
    if op == "FAKE_QUANT":
        b = fake_quant_bound(f64[0], e, **(attrs or {}))
        return b, f"grid rounding; one step at {int(np.sum(b > 0.5 * b.max()))} near-boundary values"
    if op in SUMS:
        n = _n(model, xs)
        return 2 * gamma(n) * magnitude(model, xs)[k], f"2 gamma({n}) sum|terms|"
    if op in ("REDUCE_PROD", "UNSORTED_SEGMENT_PROD"):
        n = _n(model, xs)
        return 2 * gamma(n) * ae, f"2 gamma({n}) |product|"
    if op == "SOFTMAX":
        n = int(np.shape(e)[-1])
        from conftest import softmax_bound

        return softmax_bound(e, 0.0, n, TRANS_ULPS), f"softmax_bound(n={n}, exp {TRANS_ULPS} ulps)"
    if op == "LOG_SOFTMAX":
        n = int(np.shape(e)[-1])
        x = f64[0]
        scale = np.abs(x).max(-1, keepdims=True) * 2 + np.log(n) + 1
        return 2 * (gamma(n + 2) + TRANS_ULPS * U32) * (ae + scale), "x - max - log(sum exp): absolute in |x| + log n"
    if op == "RESIZE_BILINEAR":
        from conftest import bilinear_bound

        ext = float(max(np.shape(xs[0])[1:3]) + max(np.shape(e)[1:3]))
        return np.full_like(e, bilinear_bound(float(np.abs(f64[0]).max()), ext)), "bilinear_bound"
    if op == "RFFT2D":
        x = f64[0]
        n = int(x.shape[-1] * x.shape[-2])
        s = np.abs(x).sum((-2, -1)).reshape(x.shape[:-2] + (1,) * (e.ndim - x.ndim + 2))
        return np.broadcast_to(2 * gamma(n + 3) * s, e.shape), f"a DFT: 2 gamma({n + 3}) sum|x| (twiddles within u)"
    if op in RECURRENT:
        mats = [np.abs(np.asarray(v, np.float64)) for v in model.params.values() if np.ndim(v) == 2]
        vecs = [np.abs(np.asarray(v, np.float64)) for v in model.params.values() if np.ndim(v) == 1]
        xmax = max(1.0, float(np.abs(f64[0]).max()))
        s = xmax * sum(float(m.sum(1).max()) for m in mats) + sum(float(v.max()) for v in vecs) + 1
        n = max([m.shape[1] for m in mats] + [1]) * 2 + 2
        t = int(np.prod(np.shape(xs[0])[:-1]))
        per_step = gamma(n) * s + 3 * TRANS_ULPS * U32 * (1 + s * 0.25)
        return np.full_like(e, 2 * t * per_step), f"{t} steps x (gamma({n}) * {s:.3g} + activations)"
    if op in ULPS:
        ulps, absolute = ULPS[op]
        per = ulps * 2 * U32 * ae + (0 if absolute is None else U32 * absolute(f64, e))
        if op == "POW":  # x^y = exp(y ln x): an input's u moves it by |y| u relative
            per = per + (2 + np.abs(f64[1] * np.log(np.abs(f64[0])))) * 2 * U32 * ae
        if op in ("L2_NORMALIZATION", "L2_POOL_2D", "LOCAL_RESPONSE_NORMALIZATION"):
            per = per + gamma(_n(model, xs)) * ae  # a sum of squares, relative (all terms >= 0)
        return 2 * per, f"{ulps} ulps per side" + ("" if absolute is None else " + an absolute term")
    return None, f"no error rule for {op}"


def catch_factor(expected, bound) -> float:
    """How far a 1% error of the output lands outside the bound: ``max``
    over elements of ``0.01 |e| / bound`` (what :func:`conftest.assert_within`
    would report as err/bound; inf where the bound is 0 and ``e != 0``)."""
    e = np.abs(np.asarray(expected, np.float64))
    b = np.broadcast_to(np.asarray(bound, np.float64), e.shape)
    m = e > 0
    if not m.any():
        return float("nan")
    with np.errstate(divide="ignore"):
        return float(np.max(np.where(b[m] > 0, 0.01 * e[m] / np.where(b[m] > 0, b[m], 1), np.inf)))
