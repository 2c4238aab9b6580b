"""Quantization arithmetic that needs no JAX: numpy and Python floats only.

Shared by the quantization pass (:mod:`fbjax.passes.quantization`), the model
writers (:mod:`fbjax.formats.tflite_writer`) and the integer kernels
(:mod:`fbjax.lower.tflite_int`), so that none of them imports another's
layer for a formula.

Semantics follow TFLite's reference kernels (``kernels/internal/
quantization_util.cc``: ``QuantizeMultiplier``; ``Dequantize``) and its
builtin ``QUANTIZE`` kernel (reciprocal multiply, ties to even).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
from typing import Optional

import numpy as np

from .ir import QuantParams

__all__ = ["round_half_away", "quantize_multiplier", "quantize_multipliers", "quantize_multiplier_smaller_than_one",
           "quantize_multiplier_greater_than_one", "dequantize_array", "requantize_weights", "weights_roundtrip"]


def round_half_away(x: float) -> float:
    """``TfLiteRound``/``std::round``: half away from zero."""
    return math.copysign(math.floor(abs(x) + 0.5), x)


def quantize_multiplier(real: float) -> tuple[int, int]:
    """``QuantizeMultiplier``: ``real ~= q * 2^(shift - 31)`` with ``q`` in
    ``[2^30, 2^31)`` (or 0). Returns ``(q, shift)``."""
    real = float(real)
    if real == 0.0:
        return 0, 0
    frac, shift = math.frexp(real)
    q = int(round_half_away(frac * (1 << 31)))
    if q == (1 << 31):
        q //= 2
        shift += 1
    if shift < -31:
        return 0, 0
    return q, shift


def quantize_multipliers(reals) -> tuple[np.ndarray, np.ndarray]:
    """:func:`quantize_multiplier` over an iterable; int32 arrays."""
    qs, ss = zip(*(quantize_multiplier(r) for r in np.asarray(reals, np.float64).reshape(-1)))
    return np.asarray(qs, np.int32), np.asarray(ss, np.int32)


def quantize_multiplier_smaller_than_one(real: float) -> tuple[int, int]:
    """``QuantizeMultiplierSmallerThanOneExp`` (real in (0, 1)): same
    numbers as :func:`quantize_multiplier`, shift <= 0."""
    return quantize_multiplier(real)


def quantize_multiplier_greater_than_one(real: float) -> tuple[int, int]:
    """``QuantizeMultiplierGreaterThanOne`` (real > 1): ``(q, left_shift)``."""
    return quantize_multiplier(real)


def dequantize_array(data: np.ndarray, q: QuantParams) -> np.ndarray:
    """``(q - zero_point) * scale`` in float32, per-channel along
    ``quantized_dimension`` (TFLite ``Dequantize``); blockwise parameters
    (``q.block_size``): scales ``[rows, blocks]`` along the last axis, zero
    points 0."""
    data = np.asarray(data)
    if getattr(q, "block_size", 0):
        scale = np.repeat(np.asarray(q.scale, np.float32), q.block_size, axis=-1).reshape(data.shape)
        return (data.astype(np.float32) * scale).astype(np.float32)
    scale = np.asarray(q.scale, np.float32).reshape(-1)
    zp = np.asarray(q.zero_point).astype(np.int64).reshape(-1)
    if zp.size == 0:
        zp = np.zeros(1, np.int64)
    if scale.size > 1:
        shape = [1] * data.ndim
        shape[q.quantized_dimension] = scale.size
        scale = scale.reshape(shape)
        zp = zp.reshape(shape) if zp.size == scale.size else zp.reshape(())
    else:
        scale, zp = scale.reshape(()), zp.reshape(())
    return ((data.astype(np.int64) - zp).astype(np.float32) * scale).astype(np.float32)


def _bcast_qparams(q: QuantParams, ndim: int) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(q.scale, np.float32).reshape(-1)
    z = np.asarray(q.zero_point).astype(np.int64).reshape(-1)
    z = z if z.size else np.zeros(1, np.int64)
    shape = [1] * ndim
    if s.size > 1:
        shape[q.quantized_dimension] = s.size
    return s.reshape(shape if s.size > 1 else ()), z.reshape(shape if z.size > 1 else ())


def requantize_weights(w: np.ndarray, q: QuantParams, dtype, file_values: Optional[np.ndarray] = None
                       ) -> np.ndarray:
    """Float mode's weight quantization (the numpy definition that
    ``fbjax:QUANTIZE_WEIGHTS`` computes in the forward pass, and that
    :meth:`fbjax.Model.save` uses to write float weights back with the file's
    scales, so that LiteRT runs the saved file exactly as float mode ran it).

    ``q = clip(rint(f32(w) * f32(1 / scale)) + zero_point)`` in ``dtype``,
    ties to even, per channel along ``quantized_dimension`` (blockwise int4
    weights: per row and block, clipped to [-8, 7]) (the reciprocal
    multiply of TFLite's builtin QUANTIZE; XLA turns a division by a constant
    into this multiply anyway). ``file_values``: the file's integers, for
    constants whose float32 dequantization does not give them back
    (:func:`weights_roundtrip` false: int32/int64 biases beyond ~2^21 steps);
    then ``q = file_values + rint(f32(w - dequantize(file_values)) * f32(1 / scale))``,
    the file's values for unchanged weights.
    """
    w = np.asarray(w, np.float32)
    lo, hi = np.iinfo(np.dtype(dtype)).min, np.iinfo(np.dtype(dtype)).max
    if getattr(q, "block_size", 0):  # blockwise int4 (held as int8): per row and block, [-8, 7]
        s = np.repeat(np.asarray(q.scale, np.float32), q.block_size, axis=-1).reshape(w.shape)
        z, lo, hi = np.zeros((), np.int64), -8, 7
    else:
        s, z = _bcast_qparams(q, w.ndim)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        r = (np.float32(1) / s).astype(np.float32)
        if file_values is not None:
            q0 = np.asarray(file_values).astype(np.int64)
            w0 = ((q0 - z).astype(np.float32) * s).astype(np.float32)
            out = q0 + np.rint(((w - w0).astype(np.float32) * r).astype(np.float32)).astype(np.int64)
        else:
            out = np.rint((w * r).astype(np.float32)).astype(np.int64) + z
    return np.clip(out, lo, hi).astype(dtype)


def weights_roundtrip(data: np.ndarray, q: QuantParams) -> bool:
    """Whether :func:`requantize_weights` gives back the integer constant
    ``data`` from its float32 dequantization (:func:`dequantize_array`);
    false for int32/int64 biases beyond ~2^21 steps, where float32 cannot
    hold the value or the reciprocal multiply moves it."""
    data = np.asarray(data)
    return bool(np.array_equal(requantize_weights(dequantize_array(data, q), q, data.dtype), data))


def libm_f32(name, fallback):
    """The C math library's float32 ``name`` (``tanhf``, ``erfcf``), which
    LiteRT's int16 GELU table calls: glibc's is not correctly rounded (its
    ``tanhf`` is one ulp off the rounded double ``tanh`` for some inputs,
    which moves an entry of the table by one step); the integer kernels and
    their numpy twins build their tables with the same functions. Falls back to
    ``float32(fallback(double))`` where no C math library loads."""
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float]
        return lambda v: np.float32(fn(float(v)))
    except (OSError, AttributeError):
        return lambda v: np.float32(fallback(float(v)))


tanhf = libm_f32("tanhf", math.tanh)
erfcf = libm_f32("erfcf", math.erfc)
