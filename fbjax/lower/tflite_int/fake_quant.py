"""``fbjax:FAKE_QUANT`` and ``fbjax:IDENTITY``: the ops that
:func:`fbjax.passes.quantization.prepare` inserts in ``quantized="float"`` mode.

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

from ... import op_rules
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


def _broadcast_qparams(v, ndim, shape=None):
    """Scale (float32) and zero point (int64) of constant ``v``, shaped to
    broadcast along its ``quantized_dimension`` (rank ``ndim``); blockwise
    scales (``block_size``, 2-D ``[rows, blocks]``) expanded to ``shape``."""
    if getattr(v.quant, "block_size", 0):
        s = np.repeat(np.asarray(v.quant.scale, np.float32), v.quant.block_size, axis=-1)
        return s.reshape(shape), np.zeros((), np.int64)
    s = np.asarray(v.quant.scale, np.float32).reshape(-1)
    z = np.asarray(v.quant.zero_point).astype(np.int64).reshape(-1)
    if z.size == 0:
        z = np.zeros(1, np.int64)
    if s.size > 1:
        shape = [1] * ndim
        shape[v.quant.quantized_dimension] = s.size
        s = s.reshape(shape)
        z = z.reshape(shape) if z.size == s.size else z.reshape(())
    else:
        s, z = s.reshape(()), z.reshape(())
    return s, z


class _Range:
    def __init__(self, lo, hi):
        self.min, self.max = lo, hi


def _int_range(v):
    """The integer range of constant ``v``: its dtype's, or [-8, 7] for
    blockwise weights (TFLite's BlockwiseQuantization is for INT4, held as
    int8 here)."""
    if getattr(v.quant, "block_size", 0):
        return _Range(-8, 7)
    i = np.iinfo(np.dtype(v.dtype))
    return _Range(int(i.min), int(i.max))


@register("fbjax", "QUANTIZE_WEIGHTS", differentiable=False, static_inputs=(1,))
def QUANTIZE_WEIGHTS(ctx, w, file_values=None):
    """Quantize float weights ``w`` (a float mode param: the file's integer
    weights dequantized, possibly fine-tuned since) back onto the integer grid
    of the file: ``clip(rint(w * f32(1 / scale)) + zero_point)`` (ties to
    even) to the output's dtype (int8/uint8/int16 weights, int32/int64
    biases), per channel along ``quantized_dimension`` (blockwise int4
    weights: per row and block, clipped to [-8, 7]). Float mode feeds the
    result to the integer kernels (:func:`fbjax.passes.quantization.prepare`);
    :func:`fbjax.passes.quantization.requantize_weights` is the same definition in
    numpy, which :meth:`fbjax.Model.save` uses, so a saved file runs in
    LiteRT exactly as float mode ran it.

    ``file_values`` (optional, static): the file's integer values, for
    constants whose float32 dequantization does not give them back (int32 or
    int64 biases beyond ~2^21 steps); then the result is ``file_values +
    rint((w - dequantize(file_values)) * f32(1 / scale))``: exactly the
    file's values for unchanged weights, moved by whole steps otherwise.

    Raises:
        ModelFormatError: the output has no quantization parameters.
    """
    vo = ctx.outputs[0]
    if vo.quant is None or np.asarray(vo.quant.scale).size == 0:
        raise ctx.error(f"output {vo.name!r} has no quantization parameters")
    w = jnp.asarray(w, jnp.float32)
    s, z = _broadcast_qparams(vo, w.ndim, w.shape)
    with np.errstate(divide="ignore", over="ignore"):
        r = jnp.asarray((np.float32(1) / s).astype(np.float32))
    info = _int_range(vo)
    dt = np.dtype(vo.dtype)
    if file_values is not None:
        q0 = np.asarray(file_values).astype(np.int64)
        w0 = ((q0 - z).astype(np.float32) * s).astype(np.float32)
        step = jnp.round((w - jnp.asarray(w0)) * r)
        if dt.itemsize < 8:
            step = jnp.clip(step, -2.0 ** 31, 2.0 ** 31 - 128).astype(jnp.int32)
            q = jnp.clip(jnp.asarray(q0.astype(np.int32)) + step, info.min, info.max)
        else:
            q = jnp.asarray(q0) + step.astype(dt)
        return q.astype(dt)
    q = jnp.round(w * r)
    if dt.itemsize <= 4:  # (int32 biases have zero point 0 in TFLite)
        qi = jnp.clip(q, -2.0 ** 31, 2.0 ** 31 - 128).astype(jnp.int32) + jnp.asarray(z.astype(np.int32))
        return (jnp.clip(qi, info.min, info.max) if dt.itemsize < 4 else qi).astype(dt)
    return jnp.clip(q.astype(dt) + jnp.asarray(z), info.min, info.max).astype(dt)


@register("fbjax", "CLIP_WEIGHTS")
def CLIP_WEIGHTS(ctx, w, *, scale=(1.0,), zero_point=(0,), axis=0, qmin=-128, qmax=127):
    """Float mode's weights as the float ops see them: ``w`` (float32)
    clipped to the range its integer type can hold, ``[(qmin - zp) * scale,
    (qmax - zp) * scale]`` per channel along ``axis``, with gradient 1 inside
    the range (bounds included) and 0 outside -- the clipped straight-through
    estimator of quantization-aware training: the integer forward clips such
    weights, so moving them further changes nothing.
    """
    w = jnp.asarray(w, jnp.float32)
    s = np.asarray(scale, np.float32).reshape(-1)
    z = np.asarray(zero_point, np.float32).reshape(-1)
    shape = [1] * w.ndim
    if s.size > 1 and w.ndim:
        shape[axis] = s.size
    lo = ((np.float32(qmin) - z) * s).astype(np.float32).reshape(shape if s.size > 1 else ())
    hi = ((np.float32(qmax) - z) * s).astype(np.float32).reshape(shape if s.size > 1 else ())
    inside = (w >= lo) & (w <= hi)
    return jnp.where(inside, w, jax.lax.stop_gradient(jnp.clip(w, lo, hi)))


@register("fbjax", "IDENTITY", batch=op_rules.same_as_input)
def IDENTITY(ctx, x):
    """Pass ``x`` through (float mode: the float op of a requantizing
    QUANTIZE, DEQUANTIZE of an already float tensor)."""
    return x
