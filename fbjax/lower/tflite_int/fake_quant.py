"""``fbjax:FAKE_QUANT`` and ``fbjax:IDENTITY``: the ops that
:func:`fbjax.quantization.prepare` inserts in ``quantized="float"`` mode.

FAKE_QUANT rounds a float tensor to a quantization grid and back,
``(clip(round_half_even(x * (1 / scale)) + zp, qmin, qmax) - zp) * scale``, with a
straight-through gradient (the backward pass is the identity), so
``jax.grad`` through a fake-quantized model gives useful gradients for
quantization-aware fine-tuning.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..registry import register


def _fq(x, scale, zp, qmin, qmax):
    # as TFLite's builtin QUANTIZE: multiply by the reciprocal, round half to even
    q = jnp.clip(jnp.round(x * (jnp.float32(1.0) / scale)) + zp, qmin, qmax)
    return ((q - zp) * scale).astype(x.dtype)


@jax.custom_vjp
def fake_quant(x, scale, zp, qmin, qmax):
    """Fake quantization with a straight-through gradient (w.r.t. ``x`` only)."""
    return _fq(x, scale, zp, qmin, qmax)


def _fwd(x, scale, zp, qmin, qmax):
    return _fq(x, scale, zp, qmin, qmax), (scale, zp, qmin, qmax)


def _bwd(res, g):
    scale, zp, qmin, qmax = res
    return (g, jnp.zeros_like(scale), jnp.zeros_like(zp), jnp.zeros_like(qmin), jnp.zeros_like(qmax))


fake_quant.defvjp(_fwd, _bwd)


@register("fbjax", "FAKE_QUANT")
def FAKE_QUANT(ctx, x, *, scale=1.0, zero_point=0, qmin=-128, qmax=127):
    """Round ``x`` (float32) to the grid ``(q - zero_point) * scale``, ``q`` in
    ``[qmin, qmax]``; straight-through gradient. Per-tensor parameters."""
    x = jnp.asarray(x, jnp.float32)
    f = jnp.float32
    return fake_quant(x, f(np.float32(scale)), f(zero_point), f(qmin), f(qmax))


@register("fbjax", "IDENTITY")
def IDENTITY(ctx, x):
    """Pass ``x`` through (QUANTIZE/DEQUANTIZE of already dequantized tensors)."""
    return x
