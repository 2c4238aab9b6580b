"""fbjax's CPU attention kernel (fbjax/lower/cpu_attention.cc) against a float64 numpy attention.

The kernel computes float32 sums in its own order (stated in its source), so it is checked against
the exact attention of the same float32 inputs, computed in float64, within a bound derived from the
lengths of its sums (u = 2**-24, per output element ``(b, t, n, h)``):

* each logit ``x_s = scale * sum_h q_h k_sh (+ mask)`` is off by at most
  ``e_s = (H + 2) u A_s + 2 u |x_s|`` with ``A_s = |scale| sum_h |q_h k_sh|`` (H rounded products and
  sums, the scale, the mask's sum; a soft cap adds ``4 u |x_s|``: its division, tanh and product);
* ``exp(x_s - m)`` then has relative error at most ``eps_s = e_s + e_max + u |x_s - m| + 4 u`` (the
  error of the row's maximum ``m``, the subtraction's rounding, the polynomial exp's 2 ulp);
* the weighted sum of ``S`` values and the sum of the ``S`` weights are sequential / eight-lane sums
  (at most ``(S + 4) u`` relative each), and one division.

So ``|out - ref| <= 2 [sum_s p_s |v_sh| (eps_s + (S + 1) u) + |ref| (sum_s p_s eps_s + (S + 6) u)]``
(``p`` the exact softmax; the factor 2 covers second-order terms). The lowering's routes (kernel,
XLA) must both be within it; masked keys must not be read; stacked caches must be read at their
block, and rows mapped by ``jax.vmap`` must join the batch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fbjax
from fbjax.lower import composites, cpu_kernels
from fbjax.lower.layer_slice import LayerSlice

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="CPU kernels: the CPU backend only")

U = 2.0 ** -24
LOWEST = np.finfo(np.float32).min  # what litert-torch's masks hold where a key is hidden


@pytest.fixture(scope="module", autouse=True)
def built():
    assert cpu_kernels.available(), f"the kernels did not build: {cpu_kernels._state['why']}"


def _reference(q, k, v, mask, scale, cap=None):
    """(out, bound): the attention of the float32 inputs in float64, and the bound of the docstring."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    b, t, n, h = q.shape
    s_len, kh = k.shape[1], k.shape[2]
    kk, vv = np.repeat(k, n // kh, axis=2), np.repeat(v, n // kh, axis=2)
    x = np.einsum("btnh,bsnh->bnts", q, kk) * scale
    a = np.einsum("btnh,bsnh->bnts", np.abs(q), np.abs(kk)) * abs(scale)
    e = (h + 2) * U * a
    if cap is not None:
        x = cap * np.tanh(x / cap)
        e = e + 4 * U * np.abs(x)
    if mask is not None:
        x = x + np.broadcast_to(np.asarray(mask, np.float64), x.shape)
    m = x.max(-1, keepdims=True)
    w = np.exp(x - m)
    p = w / w.sum(-1, keepdims=True)
    live = p > 0
    e = np.where(live, e + 2 * U * np.abs(np.where(live, x, 0)), 0)
    e_max = np.take_along_axis(e, np.argmax(x, -1)[..., None], -1)
    eps = np.where(live, e + e_max + U * np.abs(np.where(live, x - m, 0)) + 4 * U, 0)
    out = np.einsum("bnts,bsnh->btnh", p, vv)
    spread = np.einsum("bnts,bsnh->btnh", p * (eps + (s_len + 1) * U), np.abs(vv))
    total = np.einsum("bnts->btn", p * eps)[..., None]
    bound = 2 * (spread + np.abs(out) * (total + (s_len + 6) * U))
    return out, bound


def _causal(t, s, first, rows=1):
    """litert-torch's causal mask ``[rows, 1, t, s]``: query ``i`` (position ``first[r] + i``) sees keys <= its position."""
    first = np.broadcast_to(np.asarray(first), (rows,))
    pos = first[:, None, None] + np.arange(t)[None, :, None]
    return np.where(np.arange(s)[None, None, :] <= pos, 0.0, LOWEST).astype(np.float32)[:, None]


def _inputs(seed, b, t, n, kh, h, s):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, t, n, h)).astype(np.float32)
    k = rng.standard_normal((b, s, kh, h)).astype(np.float32)
    v = rng.standard_normal((b, s, kh, h)).astype(np.float32)
    return q, k, v


def _within(got, want, bound):
    got = np.asarray(got, np.float64)
    assert got.shape == want.shape
    worst = np.max(np.abs(got - want) - bound)
    assert worst <= 0, f"off by {np.max(np.abs(got - want)):.3g}, beyond the bound by {worst:.3g}"


def _kernel(q, k, v, mask, scale, cap=None):
    return jax.jit(lambda q, k, v, m: cpu_kernels.attention(q, k[None, None], v[None, None], m, [0, 0], scale, cap))(
        q, k, v, mask)


CASES = [  # b, t, n, kv heads, h, s, mask kind, cap
    (1, 1, 9, 3, 64, 256, "causal", None),     # SmolLM2's decode step
    (3, 1, 9, 3, 64, 256, "causal", None),     # a batch of rows at different positions
    (1, 37, 9, 3, 64, 256, "causal", None),    # prefill
    (2, 5, 4, 2, 64, 37, None, None),          # no mask, keys not a multiple of 8
    (2, 7, 6, 3, 24, 19, "full", 5.0),         # a mask per batch row and head, soft cap, H % 16 != 0
    (1, 6, 4, 1, 20, 11, "row", None),         # multi-query, H % 8 != 0 (the scalar order)
    (2, 70, 4, 4, 16, 80, "causal", 30.0),     # multi-head, many query rows, several work items
]


@pytest.mark.parametrize("b,t,n,kh,h,s,kind,cap", CASES)
def test_kernel_within_derived_bound_of_float64(b, t, n, kh, h, s, kind, cap):
    q, k, v = _inputs(b * 100 + t + s, b, t, n, kh, h, s)
    rng = np.random.default_rng(s)
    mask = None
    if kind == "causal":
        mask = _causal(t, s, rng.integers(0, s - t + 1, b), rows=b)
    elif kind == "full":
        mask = rng.standard_normal((b, n, t, s)).astype(np.float32)
    elif kind == "row":
        mask = rng.standard_normal((1, 1, t, s)).astype(np.float32)
    scale = float(np.float32(1 / np.sqrt(h)))
    want, bound = _reference(q, k, v, mask, scale, cap)
    _within(_kernel(q, k, v, mask, scale, cap), want, bound)


def test_masked_keys_are_not_read():
    """Keys the mask hides (float32's lowest, or -inf) get weight 0 without being read: NaN keys and
    values there leave the result as it is without them."""
    q, k, v = _inputs(1, 2, 3, 6, 2, 64, 40)
    mask = _causal(3, 40, [5, 20], rows=2)
    mask[1, :, :, 0] = -np.inf
    hidden = np.broadcast_to(mask[:, 0, -1, :] < -1e38, (2, 40))  # hidden from every query row
    kn, vn = k.copy(), v.copy()
    kn[hidden], vn[hidden] = np.nan, np.nan
    want, bound = _reference(q, k, v, mask, 0.125)
    got = np.asarray(_kernel(q, kn, vn, mask, 0.125))
    assert np.all(np.isfinite(got))
    _within(got, want, bound)


def test_fully_masked_row_is_computed_over_every_key():
    """A row whose every key is masked is computed in full (as the float32 computation does: the
    masked logits round to one value, so the weights are equal): the values' mean."""
    q, k, v = _inputs(2, 1, 2, 2, 2, 16, 12)
    mask = np.zeros((1, 1, 2, 12), np.float32)
    mask[..., 1, :] = LOWEST
    got = np.asarray(_kernel(q, k, v, mask, 0.25))
    np.testing.assert_allclose(got[0, 1], v[0].mean(0), rtol=0, atol=12 * 4 * U * np.abs(v).max())


def test_stacked_blocks_and_rows_are_read_in_place():
    """k and v as stacked ``[R, L, B0, S, K, H]`` with their own block indices: batch row
    ``r * B0 + b0`` reads ``k[r, lk, b0]`` and ``v[r, lv, b0]``; the mask's rows cover consecutive batch rows."""
    r, lk, lv, b0, t, n, kh, h, s = 3, 4, 5, 2, 2, 6, 3, 32, 24
    rng = np.random.default_rng(3)
    q = rng.standard_normal((r * b0, t, n, h)).astype(np.float32)
    ks = rng.standard_normal((r, lk, b0, s, kh, h)).astype(np.float32)
    vs = rng.standard_normal((r, lv, b0, s, kh, h)).astype(np.float32)
    mask = _causal(t, s, [3, 9, 15], rows=3)  # one mask row per r: batch rows b // (6 / 3)
    got = jax.jit(lambda q, k, v, m, l: cpu_kernels.attention(q, k, v, m, l, 0.2))(q, ks, vs, mask, np.array([2, 4]))
    k = ks[:, 2].reshape(r * b0, s, kh, h)
    v = vs[:, 4].reshape(r * b0, s, kh, h)
    want, bound = _reference(q, k, v, np.repeat(mask, b0, axis=0), 0.2)
    _within(got, want, bound)


class _Ctx:
    """The little of a lowering context the attention lowering reads."""

    backend = "cpu"

    def __init__(self, native: bool):
        self.options = {"kernel_options": fbjax.KernelOptions(native_attention=native)}


@pytest.mark.parametrize("mask_batched", [True, False])
def test_lowering_under_vmap_joins_rows_and_matches_xla(mask_batched):
    """The composite lowering on a layer scan's blocks (``LayerSlice`` of stacked caches), mapped over
    rows as the LLM runner maps them (caches ``[rows, L, 1, S, K, H]``): the kernel's route and XLA's
    are both within the bound of the float64 attention, and the kernel's sees no copy of the caches."""
    rows, layers, t, n, kh, h, s = 4, 3, 1, 9, 3, 64, 48
    rng = np.random.default_rng(4)
    q = rng.standard_normal((rows, 1, t, n, h)).astype(np.float32)
    kc = rng.standard_normal((rows, layers, 1, s, kh, h)).astype(np.float32)
    vc = rng.standard_normal((rows, layers, 1, s, kh, h)).astype(np.float32)
    first = np.array([0, 7, 30, 47])
    mask = _causal(t, s, first, rows=rows)[:, None] if mask_batched else _causal(t, s, 20)
    outs = {}
    for native in (True, False):
        def row(q, kc, vc, m, native=native):
            return composites.scaled_dot_product_attention(_Ctx(native), q, LayerSlice(kc, 1), LayerSlice(vc, 2), m,
                                                           scale=0.125)
        fn = jax.jit(jax.vmap(row, in_axes=(0, 0, 0, 0 if mask_batched else None)))
        outs[native] = np.asarray(fn(q, kc, vc, mask))
        if native:
            hlo = fn.lower(q, kc, vc, mask).as_text()
            assert "fbjax_attention" in hlo and "transpose" not in hlo and "dynamic_slice" not in hlo
    for r_ in range(rows):
        m = mask[r_] if mask_batched else mask
        want, bound = _reference(q[r_], kc[r_, 1], vc[r_, 2], m, 0.125)
        for native in (True, False):
            _within(outs[native][r_], want, bound)


def test_lowering_gradient_is_xla_routes():
    """Derivatives through the kernel's route are those of XLA's attention (its JVP rule)."""
    q, k, v = _inputs(5, 2, 3, 4, 2, 16, 10)
    mask = _causal(3, 10, [4, 7], rows=2)
    grads = {}
    for native in (True, False):
        def loss(q, k, v, native=native):
            out = composites.scaled_dot_product_attention(_Ctx(native), q, k, v, mask, scale=0.25, logit_cap=3.0)
            return jnp.sum(out * jnp.arange(out.size, dtype=jnp.float32).reshape(out.shape) / out.size)
        grads[native] = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    for a, b in zip(grads[True], grads[False]):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6)


@pytest.mark.parametrize("native", [True, False])
def test_llm_decode_program_calls_the_kernel_by_default(native):
    """A float LLM fixture's decode program runs its attention composites in the kernel on CPU (so
    tests/test_llm*.py's comparisons with LiteRT cover it), and not with native_attention=False."""
    from pathlib import Path

    path = Path(__file__).resolve().parent / "data" / "llm" / "llama_f32.tflite"
    m = fbjax.load(path, kernel_options=fbjax.KernelOptions(native_attention=native))
    dec = m.signature("decode")
    ins = {s.name: np.zeros(s.shape, s.dtype) for s in dec.inputs}
    text = jax.jit(lambda p, b, i: dec.apply(p, buffers=b, **i)).lower(m.params, m.buffers, ins).as_text()
    assert ("fbjax_attention" in text) == native


def test_vmap_rule_other_mappings():
    """The kernel's vmap rule beyond the LLM runner's mapping: values shared by every example while
    the keys are mapped (example by example), two nested maps (both join the batch), and a per-row
    mask shared by every example: each example within the bound of its float64 attention."""
    a_, b, t, n, kh, h, s = 3, 2, 2, 4, 2, 16, 10
    rng = np.random.default_rng(6)
    q = rng.standard_normal((2, a_, b, t, n, h)).astype(np.float32)
    k = rng.standard_normal((2, a_, b, s, kh, h)).astype(np.float32)
    v = rng.standard_normal((2, a_, b, s, kh, h)).astype(np.float32)
    mask = rng.standard_normal((b, n, t, s)).astype(np.float32)

    def attend(q, k, v, m):
        return composites._attention_native(q, k[None, None], v[None, None], m, jnp.array([0, 0], jnp.int32), 0.3,
                                            None)

    shared_v = jax.jit(jax.vmap(attend, in_axes=(0, 0, None, None)))(q[0], k[0], v[0, 0], mask)
    nested = jax.jit(jax.vmap(jax.vmap(attend, in_axes=(0, 0, 0, None)), in_axes=(0, 0, 0, None)))(q, k, v, mask)
    for i in range(a_):
        want, bound = _reference(q[0, i], k[0, i], v[0, 0], mask, 0.3)
        _within(np.asarray(shared_v)[i], want, bound)
        for j in range(2):
            want, bound = _reference(q[j, i], k[j, i], v[j, i], mask, 0.3)
            _within(np.asarray(nested)[j, i], want, bound)


def test_reduced_compute_dtype_with_layer_scan_runs():
    """Under a reduced compute dtype the lowerings' float32 operands are cast, a layer scan's blocks
    (the caches the attention and DYNAMIC_UPDATE_SLICE take in place) included: the decode step runs
    and gives the outputs of the unrolled program (the same ops on the same operands; bfloat16 sums
    fused differently: compared to the largest entry within 2**-6, a few bfloat16 ulps)."""
    from pathlib import Path

    path = Path(__file__).resolve().parent / "data" / "llm" / "llama_f32.tflite"
    outs = {}
    for scan in (True, False):
        m = fbjax.load(path, compute_dtype="bfloat16", kernel_options=fbjax.KernelOptions(layer_scan=scan))
        dec = m.signature("decode")
        ins = {s.name: np.full(s.shape, 1, s.dtype) for s in dec.inputs}
        outs[scan] = {k: np.asarray(v, np.float32) for k, v in dec(**ins).items()}
    for k in outs[False]:
        top = max(1.0, float(np.abs(outs[False][k]).max()))
        assert np.all(np.isfinite(outs[True][k])), k
        assert float(np.abs(outs[True][k] - outs[False][k]).max()) <= top * 2.0 ** -6, k
