"""numpy twins of :mod:`fbjax.lower.tflite_int.fake_quant` (``fbjax:FAKE_QUANT``,
``fbjax:IDENTITY``), forward only, written with scalar float64 rounding
helpers (float32 values are exactly representable in float64, so the
fraction tests are exact)."""

from __future__ import annotations

import numpy as np

from ..registry import register

F = np.float32


def _round(v: np.ndarray, mode: str) -> np.ndarray:
    """Round float32 ``v`` with ``mode`` (half_even / half_away / half_up)."""
    d = v.astype(np.float64)
    if mode == "half_even":
        return np.rint(d)
    if mode == "half_up":
        return np.floor(d + 0.5)  # exact in float64 for float32 inputs
    if mode == "half_away":
        return np.sign(d) * np.floor(np.abs(d) + 0.5)
    raise ValueError(f"unknown rounding {mode!r}")


@register("fbjax", "FAKE_QUANT")
def FAKE_QUANT(ctx, x, *, scale=1.0, zero_point=0, qmin=-128, qmax=127, rounding="half_even", offset=0.0,
               pre_shift=0, gain=1.0, tail_away=0):
    """Reference fake quantization: ``v = x * f32(1/scale) * gain + offset``
    (float32), optional pre-rounding to ``2^-pre_shift`` (half away), final
    rounding ``rounding`` (half away on the last ``tail_away`` channels),
    minus ``round_away(offset)``, clip, dequantize."""
    x = np.asarray(x, F)
    v = (x * F(F(1.0) / F(scale))).astype(F)
    if np.ndim(gain) or gain != 1.0:
        v = (v * np.asarray(gain, F)).astype(F)
    if offset:
        v = (v + F(offset)).astype(F)
    if np.ndim(pre_shift) or pre_shift > 0:
        k = np.exp2(np.asarray(pre_shift, np.float64)).astype(F)
        v = (_round((v * k).astype(F), "half_away").astype(F) / k).astype(F)
    c = float(np.sign(offset) * np.floor(abs(offset) + 0.5))
    r = _round(v, rounding)
    if tail_away:
        r[..., v.shape[-1] - tail_away:] = _round(v[..., v.shape[-1] - tail_away:], "half_away")
    q = np.clip(r - c + zero_point, qmin, qmax)
    return ((q - zero_point).astype(F) * F(scale)).astype(F)


@register("fbjax", "STRAIGHT_THROUGH")
def STRAIGHT_THROUGH(ctx, a, b):
    """Reference: the value of ``b`` (the gradient routing has no numpy counterpart)."""
    return np.asarray(b, F)


@register("fbjax", "QUANTIZE_WEIGHTS")
def QUANTIZE_WEIGHTS(ctx, w, file_values=None):
    """Reference: ``clip(rint(f32(w * f32(1/scale))) + zero_point)`` into the
    output value's integer dtype, scales broadcast along
    ``quantized_dimension``; with ``file_values``: ``file_values +
    rint(f32(f32(w - dequantized file values) * f32(1/scale)))``."""
    vo = ctx.outputs[0]
    w = np.asarray(w, F)
    s = np.asarray(vo.quant.scale, F).reshape(-1)
    z = np.asarray(vo.quant.zero_point).astype(np.int64).reshape(-1)
    z = z if z.size else np.zeros(1, np.int64)
    shape = [1] * w.ndim
    if s.size > 1:
        shape[vo.quant.quantized_dimension] = s.size
    s = s.reshape(shape if s.size > 1 else ())
    z = z.reshape(shape if z.size > 1 else ())
    lo, hi = np.iinfo(np.dtype(vo.dtype)).min, np.iinfo(np.dtype(vo.dtype)).max
    if getattr(vo.quant, "block_size", 0):  # blockwise int4: per row and block, [-8, 7]
        s = np.repeat(np.asarray(vo.quant.scale, F), vo.quant.block_size, axis=-1).reshape(w.shape)
        z, lo, hi = np.zeros((), np.int64), -8, 7
    r = (F(1) / s).astype(F)
    if file_values is not None:
        q0 = np.asarray(file_values).astype(np.int64)
        w0 = ((q0 - z).astype(F) * s).astype(F)
        q = q0 + np.rint(((w - w0).astype(F) * r).astype(F)).astype(np.int64)
    else:
        q = np.rint((w * r).astype(F)).astype(np.int64) + z
    return np.clip(q, lo, hi).astype(vo.dtype)


@register("fbjax", "CLIP_WEIGHTS")
def CLIP_WEIGHTS(ctx, w, *, scale=(1.0,), zero_point=(0,), axis=0, qmin=-128, qmax=127):
    """Reference: ``w`` clipped to ``[(qmin - zp) * scale, (qmax - zp) * scale]``
    per channel along ``axis`` (forward only)."""
    w = np.asarray(w, F)
    s = np.asarray(scale, F).reshape(-1)
    z = np.asarray(zero_point, F).reshape(-1)
    shape = [1] * w.ndim
    if s.size > 1:
        shape[axis] = s.size
    lo = ((F(qmin) - z) * s).astype(F).reshape(shape if s.size > 1 else ())
    hi = ((F(qmax) - z) * s).astype(F).reshape(shape if s.size > 1 else ())
    return np.minimum(np.maximum(w, lo), hi).astype(F)


@register("fbjax", "IDENTITY")
def IDENTITY(ctx, x):
    """Reference identity."""
    return np.asarray(x)
