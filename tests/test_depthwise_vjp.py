"""The shifted depthwise convolution's custom backward (fbjax.lower.depthwise_vjp)
against an exact float64 numpy gradient.

The oracle below computes a depthwise convolution and both of its
gradients in float64 directly from the definition (a scatter of
``ct * w`` for the input, a sum of ``window * ct`` for the weights),
independently of fbjax's lowering. Inputs are float32 values, exact in
float64, so the oracle's own error (float64 sums of at most a few thousand
terms) is ~1e-13 relative: negligible against the float32 bounds.

Tolerance: every float32 gradient entry is a sum of products -- the input
gradient ``K * M`` of them (kernel taps times depth multiplier), a weight
gradient ``N * OH * OW`` -- computed in some order, so it lies within
``gamma(n) * sum|terms|`` of the exact value (Higham; tests/conftest.py),
with ``sum|terms|`` from the same oracle on absolute values.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_within, gamma
from fbjax.lower import kernels
from fbjax.lower import depthwise_vjp
from fbjax.options import KernelOptions


def _pads(in_sp, ksz, strides, dilation, padding):
    if padding == "VALID":
        return [(0, 0)] * len(in_sp)
    return [kernels.same_padding(n, k, s, d) for n, k, s, d in zip(in_sp, ksz, strides, dilation)]


def _oracle(x, w, ct, strides, dilation, pads):
    """float64 NHWC (N, *spatial, C) depthwise conv, kernel ``[*k, C*M]``:
    ``(y, dx, dw)`` for output cotangent ``ct`` (None: ``y`` only)."""
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    n_sp = x.ndim - 2
    c = x.shape[-1]
    mult = w.shape[-1] // c
    xr = np.repeat(x, mult, axis=-1)  # channel c*M+m reads input channel c
    xp = np.pad(xr, [(0, 0)] + list(pads) + [(0, 0)])
    ksz = w.shape[:n_sp]
    out_sp = [(xp.shape[1 + a] - (ksz[a] - 1) * dilation[a] - 1) // strides[a] + 1 for a in range(n_sp)]
    y = np.zeros((x.shape[0], *out_sp, w.shape[-1]))
    dxp = np.zeros_like(xp)
    dw = np.zeros_like(w)
    for tap in np.ndindex(*ksz):
        idx = (slice(None),) + tuple(
            slice(t * d, t * d + (o - 1) * s + 1, s) for t, d, o, s in zip(tap, dilation, out_sp, strides)
        ) + (slice(None),)
        y += xp[idx] * w[tap]
        if ct is not None:
            ctf = np.asarray(ct, np.float64)
            dxp[idx] += ctf * w[tap]
            dw[tap] = np.sum(xp[idx] * ctf, axis=tuple(range(x.ndim - 1)))
    if ct is None:
        return y
    crop = (slice(None),) + tuple(slice(lo, lo + n) for (lo, _), n in zip(pads, x.shape[1:-1])) + (slice(None),)
    dx = dxp[crop].reshape(x.shape[:-1] + (c, mult)).sum(-1)
    return y, dx, dw


# (batch, spatial, channels, kernel, strides, dilation, padding, multiplier)
CASES = [
    ("s1_same", 2, (9, 8), 3, (3, 3), (1, 1), (1, 1), "SAME", 1),
    ("s2_same_even", 1, (10, 8), 4, (3, 3), (2, 2), (1, 1), "SAME", 1),
    ("s2_same_odd_5x5", 2, (11, 9), 3, (5, 5), (2, 2), (1, 1), "SAME", 1),
    ("s1_valid_dilated", 2, (12, 10), 2, (3, 3), (1, 1), (2, 2), "VALID", 1),
    ("s2_same_dilated", 1, (13, 12), 3, (3, 2), (2, 1), (2, 3), "SAME", 1),
    ("mult2_s1", 2, (7, 9), 3, (3, 3), (1, 1), (1, 1), "SAME", 2),
    ("mult3_s2_valid", 2, (9, 10), 2, (3, 5), (2, 2), (1, 1), "VALID", 3),
    ("row_kernel_1x3", 1, (6, 7), 3, (1, 3), (1, 1), (1, 1), "SAME", 1),
    ("conv1d", 2, (17,), 4, (5,), (2,), (1,), "SAME", 2),
]


def _case(case, seed=0):
    _, n, sp, c, ksz, strides, dil, padding, mult = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, *sp, c)).astype(np.float32)
    w = rng.standard_normal((*ksz, c * mult)).astype(np.float32)
    pads = _pads(sp, ksz, strides, dil, padding)
    y = _oracle(x, w, None, strides, dil, pads)
    ct = rng.standard_normal(y.shape).astype(np.float32)
    return x, w, ct, pads


def _conv(x, w, strides, dil, pads, lhs_spec, options=None):
    return kernels.depthwise_conv(x, w, window_strides=strides, padding=pads, rhs_dilation=dil, lhs_spec=lhs_spec,
                                  strategy="shifted", options=options)


def _to_spec(a, lhs_spec):
    """NHWC-like (N, *spatial, C) -> channels-first when ``lhs_spec`` says so."""
    return np.moveaxis(a, -1, 1) if lhs_spec[1] == "C" else a


def _from_spec(a, lhs_spec):
    return np.moveaxis(np.asarray(a), 1, -1) if lhs_spec[1] == "C" else np.asarray(a)


def _loops(f, *args) -> bool:
    """Whether ``f``'s jaxpr has the custom backward's loops (the plain
    shifted code has none)."""
    text = str(jax.make_jaxpr(f)(*args))
    return "scan[" in text or "while[" in text


@pytest.mark.parametrize("lhs_spec", ["channels_last", "channels_first"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_custom_gradient_matches_float64_oracle(case, lhs_spec):
    x, w, ct, pads = _case(case)
    strides, dil, mult = case[5], case[6], case[8]
    n_sp = len(case[2])
    spec = ("N" + "C" + "HW"[:n_sp]) if lhs_spec == "channels_first" else ("N" + "HW"[:n_sp] + "C")
    if n_sp == 1:
        spec = spec.replace("H", "W")
    xs = _to_spec(x, spec)
    cts = _to_spec(ct, spec)
    y_ref, dx_ref, dw_ref = _oracle(x, w, ct, strides, dil, pads)
    _, dx_mag, dw_mag = _oracle(np.abs(x), np.abs(w), np.abs(ct), strides, dil, pads)
    y_mag = _oracle(np.abs(x), np.abs(w), None, strides, dil, pads)

    def loss(x_, w_):
        return jnp.sum(_conv(x_, w_, strides, dil, pads, spec) * cts)

    # the custom backward (loops over kernel rows) is what jax.grad runs
    assert _loops(jax.grad(loss, (0, 1)), xs, w), "jax.grad did not go through the custom backward"
    y, vjp = jax.vjp(lambda a, b: _conv(a, b, strides, dil, pads, spec), xs, w)
    dx, dw = vjp(jnp.asarray(cts))
    k = int(np.prod(w.shape[:-1]))
    assert_within(_from_spec(y, spec), y_ref, gamma(k) * y_mag, f"{case[0]} forward under vjp")
    assert_within(_from_spec(dx, spec), dx_ref, gamma(k * mult) * dx_mag, f"{case[0]} input gradient")
    n_out = int(np.prod(y_ref.shape[:-1]))
    assert_within(dw, dw_ref, gamma(n_out) * dw_mag, f"{case[0]} weight gradient")


def test_forward_mode_keeps_plain_autodiff():
    """jax.jvp (and jax.jacfwd) cannot go through a custom_vjp: the plain
    lax code runs there, and its tangent is the oracle's linear map."""
    case = CASES[2]
    x, w, ct, pads = _case(case, seed=1)
    strides, dil = case[5], case[6]
    rng = np.random.default_rng(2)
    vx = rng.standard_normal(x.shape).astype(np.float32)
    vw = rng.standard_normal(w.shape).astype(np.float32)
    f = lambda a, b: _conv(a, b, strides, dil, pads, "NHWC")  # noqa: E731
    assert not _loops(lambda a, b, c, d: jax.jvp(f, (a, b), (c, d)), x, w, vx, vw)
    _, t = jax.jvp(f, (x, w), (vx, vw))
    # bilinear: f'(x, w)(vx, vw) = f(vx, w) + f(x, vw)
    t_ref = _oracle(vx, w, None, strides, dil, pads) + _oracle(x, vw, None, strides, dil, pads)
    mag = _oracle(np.abs(vx), np.abs(w), None, strides, dil, pads) + _oracle(np.abs(x), np.abs(vw), None, strides,
                                                                             dil, pads)
    k = int(np.prod(w.shape[:-1]))
    assert_within(t, t_ref, gamma(2 * k + 1) * mag, "jvp tangent")


def test_forward_over_reverse():
    """jax.jvp of jax.grad (Hessian-vector products): the linearization
    sits under forward mode, so the plain path runs (a custom_vjp would
    raise). loss = sum(conv(x, w) * ct) is bilinear, so the derivative of
    its weight gradient along ``v`` (an input direction) is the weight
    gradient with ``v`` as input."""
    case = CASES[0]
    x, w, ct, pads = _case(case, seed=3)
    strides, dil = case[5], case[6]
    v = np.random.default_rng(4).standard_normal(x.shape).astype(np.float32)
    grad_w = jax.grad(lambda a, b: jnp.sum(_conv(a, b, strides, dil, pads, "NHWC") * ct), 1)
    _, t = jax.jvp(lambda a: grad_w(a, w), (x,), (v,))
    _, _, dw_ref = _oracle(v, w, ct, strides, dil, pads)
    _, _, dw_mag = _oracle(np.abs(v), np.abs(w), np.abs(ct), strides, dil, pads)
    assert_within(t, dw_ref, gamma(int(np.prod(ct.shape[:-1]))) * dw_mag, "jvp of grad")


def test_second_reverse_derivative():
    """jax.grad of jax.grad goes through the custom backward twice (its
    backward is itself lax code). d/dx of sum(grad_w(x) * u) for the bilinear
    loss is the input gradient of sum(conv(x, u) * ct)."""
    case = CASES[5]
    x, w, ct, pads = _case(case, seed=5)
    strides, dil = case[5], case[6]
    u = np.random.default_rng(6).standard_normal(w.shape).astype(np.float32)
    f = lambda a, b: _conv(a, b, strides, dil, pads, "NHWC")  # noqa: E731
    grad_w = jax.grad(lambda a, b: jnp.sum(f(a, b) * ct), 1)
    g2 = jax.grad(lambda a: jnp.sum(grad_w(a, w) * u))(x)
    _, dx_ref, _ = _oracle(x, u, ct, strides, dil, pads)
    _, dx_mag, _ = _oracle(np.abs(x), np.abs(u), np.abs(ct), strides, dil, pads)
    mult = case[8]
    # the weight gradient's sums (one per tap) then the input gradient's K*M
    n_terms = int(np.prod(ct.shape[:-1])) + int(np.prod(w.shape[:-1])) * mult
    assert_within(g2, dx_ref, gamma(n_terms) * dx_mag, "grad of grad")


def test_linearized_only_sees_the_modes():
    from fbjax.lower.autodiff import linearized_only

    seen = {}

    def probe(tag):
        def f(a):
            seen[tag] = linearized_only(a)
            return jnp.sum(a * a)
        return f

    a = jnp.ones(3)
    probe("plain")(a)
    jax.grad(probe("grad"))(a)
    jax.jit(jax.grad(probe("jit_grad")))(a)
    jax.jvp(probe("jvp"), (a,), (a,))
    jax.jvp(jax.grad(probe("jvp_of_grad")), (a,), (a,))
    jax.vmap(jax.grad(probe("vmap_grad")))(jnp.ones((2, 3)))
    assert seen == {"plain": False, "grad": True, "jit_grad": True, "jvp": False, "jvp_of_grad": False,
                    "vmap_grad": True}
    assert depthwise_vjp.linearized_only is linearized_only


def test_linearize_needs_jax_autodiff():
    """jax.linearize runs the linearized function in forward mode, which a
    custom_vjp refuses (JAX's TypeError); KernelOptions(compact_backward=False) gives
    JAX's own derivative, whose linear map is the oracle's."""
    case = CASES[1]
    x, w, _, pads = _case(case, seed=7)
    strides, dil = case[5], case[6]
    f = lambda a, b: _conv(a, b, strides, dil, pads, "NHWC")  # noqa: E731
    _, lin = jax.linearize(f, x, w)
    with pytest.raises(TypeError, match="custom_vjp"):
        lin(x, w)
    plain = KernelOptions(compact_backward=False)
    f = lambda a, b: _conv(a, b, strides, dil, pads, "NHWC", options=plain)  # noqa: E731
    _, lin = jax.linearize(f, x, w)
    k = int(np.prod(w.shape[:-1]))
    # f is bilinear: f'(x, w)(x, w) = 2 f(x, w)
    assert_within(lin(x, w), 2 * _oracle(x, w, None, strides, dil, pads),
                  2 * gamma(2 * k + 1) * _oracle(np.abs(x), np.abs(w), None, strides, dil, pads), "linearize")
