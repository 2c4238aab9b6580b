"""``fbjax:FAKE_QUANT`` and ``fbjax:IDENTITY``: the ops that
:func:`fbjax.quantization.prepare` inserts in ``quantized="float"`` mode.

FAKE_QUANT rounds a float tensor to a quantization grid and back,
``(clip(round(x * (1 / scale) + offset) - round_away(offset) + zp, qmin, qmax) - zp) * scale``,
with a straight-through gradient (the backward pass is the identity), so
``jax.grad`` through a fake-quantized model gives useful gradients for
quantization-aware fine-tuning.

The rounding follows the integer kernel whose output it stands for
(attribute ``rounding``): ``"half_even"`` (builtin QUANTIZE: ``x * (1/s)``
rounded to nearest even), ``"half_away"`` (``RoundingDivideByPOT`` and the
lookup tables' ``std::round``), ``"half_up"`` (the x86 gemm output stage of
8-bit CONV_2D / FULLY_CONNECTED / optimized MEAN, ties toward +inf). Two
kernel details that move whole steps are modelled too:

* ``offset``: the optimized 8-bit MEAN over H, W rescales the *raw* code sum
  and subtracts a separately rounded zero-point term, so it rounds
  ``x/s + c`` and subtracts ``round_away(c)`` (``c = zp_in * s_in / s_out``);
* ``pre_shift`` (k > 0): ``MultiplyByQuantizedMultiplier`` with a right shift
  rounds twice, first to ``1/2^k`` of a step (SRDHM), then to the step
  (RoundingDivideByPOT or the gemm's half-up shift). With ``k = 1`` half of
  the results sit on a tie after the first rounding; multipliers in
  ``[0.25, 0.5)`` are common (per-channel 1x1 depthwise "batch norm"
  layers), and the generic integer MEAN folds ``1/n`` into the shift. A
  sequence gives one ``k`` per channel (last axis);
* ``gain``: the rescale's multiplier differs from the exact ratio of scales
  by this factor (16x8 kernels with int64 bias cut the multiplier to 15
  bits); per channel when a sequence;
* ``tail_away``: the last ``tail_away`` channels (last axis) round ties away
  from zero whatever ``rounding`` says (8-bit DEPTHWISE_CONV_2D: the scalar
  tail after the 8-channel vector body).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..registry import register

ROUNDINGS = ("half_even", "half_away", "half_up")


def round_mode(v, mode: str):
    """Round float ``v`` to an integer-valued float with ``mode`` (exact:
    the fraction ``v - trunc(v)`` is computed without rounding error)."""
    if mode == "half_even":
        return jnp.round(v)
    if mode == "half_up":
        f = jnp.floor(v)
        return f + (v - f >= 0.5).astype(v.dtype)
    t = jnp.trunc(v)
    frac = v - t
    return t + jnp.where(jnp.abs(frac) >= 0.5, jnp.sign(v), jnp.zeros_like(v))


def _round_away_py(c: float) -> int:
    return int(np.sign(c) * np.floor(abs(c) + 0.5))


def _fq(x, scale, zp, qmin, qmax, rounding="half_even", offset=0.0, pre_shift=0, gain=1.0, tail_away=0):
    v = x * (jnp.float32(1.0) / scale)
    if np.ndim(gain) or gain != 1.0:
        v = v * jnp.asarray(np.asarray(gain, np.float32))
    if offset:
        v = v + jnp.float32(offset)
    if np.ndim(pre_shift) or pre_shift > 0:
        # per channel (last axis) when a sequence; a 0 there makes the
        # SRDHM rounding the final one (no right shift follows)
        k = jnp.asarray(np.exp2(np.asarray(pre_shift, np.float64)).astype(np.float32))
        v = round_mode(v * k, "half_away") / k
    r = round_mode(v, rounding)
    if tail_away and rounding != "half_away":
        c = v.shape[-1]
        r = jnp.where(np.arange(c) >= c - tail_away, round_mode(v, "half_away"), r)
    q = r - jnp.float32(_round_away_py(offset))
    q = jnp.clip(q + zp, qmin, qmax)
    return ((q - zp) * scale).astype(x.dtype)


def fake_quant(x, scale, zp, qmin, qmax, rounding="half_even", offset=0.0, pre_shift=0, gain=1.0,
               tail_away=0):
    """Fake quantization with a straight-through gradient (w.r.t. ``x`` only;
    ``scale``/``zp``/``qmin``/``qmax`` get zero gradients). ``rounding``,
    ``offset``, ``pre_shift``, ``gain`` and ``tail_away`` are Python
    constants (see the module doc)."""
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    pre = tuple(int(k) for k in pre_shift) if np.ndim(pre_shift) else int(pre_shift)
    gain = tuple(float(g) for g in gain) if np.ndim(gain) else float(gain)

    @jax.custom_vjp
    def f(x, scale, zp, qmin, qmax):
        return _fq(x, scale, zp, qmin, qmax, rounding, float(offset), pre, gain, int(tail_away))

    def fwd(x, scale, zp, qmin, qmax):
        return f(x, scale, zp, qmin, qmax), (scale, zp, qmin, qmax)

    def bwd(res, g):
        return (g,) + tuple(jnp.zeros_like(r) for r in res)

    f.defvjp(fwd, bwd)
    return f(x, scale, zp, qmin, qmax)


@register("fbjax", "FAKE_QUANT")
def FAKE_QUANT(ctx, x, *, scale=1.0, zero_point=0, qmin=-128, qmax=127, rounding="half_even", offset=0.0,
               pre_shift=0, gain=1.0, tail_away=0):
    """Round ``x`` (float32) to the grid ``(q - zero_point) * scale``, ``q`` in
    ``[qmin, qmax]``, with the integer kernel's rounding (module doc);
    straight-through gradient. Per-tensor parameters.

    Raises:
        ModelFormatError: unknown ``rounding``.
    """
    if rounding not in ROUNDINGS:
        raise ctx.error(f"unknown rounding {rounding!r} (expected one of {ROUNDINGS})")
    x = jnp.asarray(x, jnp.float32)
    f = jnp.float32
    return fake_quant(x, f(np.float32(scale)), f(zero_point), f(qmin), f(qmax), rounding, offset, pre_shift, gain,
                      tail_away)


@jax.custom_vjp
def straight_through(a, b):
    """``b`` forward; the gradient goes to ``a`` (as if the result were ``a``)."""
    return b


def _st_fwd(a, b):
    return b, None


def _st_bwd(_, g):
    return g, jnp.zeros_like(g)


straight_through.defvjp(_st_fwd, _st_bwd)


@register("fbjax", "STRAIGHT_THROUGH")
def STRAIGHT_THROUGH(ctx, a, b):
    """Value of ``b``, gradient of ``a`` (same shapes, float32): float mode
    computes table-based quantized kernels (``b``: integer kernel,
    dequantized) with the float op's gradient (``a``)."""
    if jnp.shape(a) != jnp.shape(b):
        raise ctx.error(f"shapes differ: {jnp.shape(a)} and {jnp.shape(b)}")
    return straight_through(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32))


@register("fbjax", "IDENTITY")
def IDENTITY(ctx, x):
    """Pass ``x`` through (QUANTIZE/DEQUANTIZE of already dequantized tensors)."""
    return x
