"""ONNX normalizations and softmax.

Schema defaults (used when a field is absent): ``epsilon`` 0, LayerNormalization
``axis`` 0, Softmax ``axis`` 0 -- rten-convert writes ONNX's values (1e-5, -1)
whenever they differ. Softmax is over the single ``axis`` (opset-13 semantics).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ... import op_rules
from ..registry import register
from ._util import OP_SET, axis as norm_axis


def _chan(v, ndim):
    return jnp.reshape(v, (1, -1) + (1,) * (ndim - 2))


@register(OP_SET, "BatchNormalization", full_precision=True)
def BatchNormalization(ctx, X, scale, B, input_mean, input_var, *, epsilon=0.0):
    """ONNX ``BatchNormalization`` (inference): ``(x - mean) / sqrt(var + eps) * scale + B`` on axis 1."""
    X = jnp.asarray(X)
    nd = X.ndim
    inv = jax.lax.rsqrt(_chan(input_var, nd) + jnp.asarray(epsilon, X.dtype))
    return (X - _chan(input_mean, nd)) * inv * _chan(scale, nd) + _chan(B, nd)


@register(OP_SET, "InstanceNormalization", full_precision=True)
def InstanceNormalization(ctx, input, scale, B, *, epsilon=0.0):
    """ONNX ``InstanceNormalization``: per (N, C) mean/variance over spatial dims."""
    X = jnp.asarray(input)
    ax = tuple(range(2, X.ndim))
    mean = jnp.mean(X, axis=ax, keepdims=True)
    var = jnp.mean(jnp.square(X - mean), axis=ax, keepdims=True)
    y = (X - mean) * jax.lax.rsqrt(var + jnp.asarray(epsilon, X.dtype))
    return y * _chan(scale, X.ndim) + _chan(B, X.ndim)


@register(OP_SET, "LayerNormalization", batch=op_rules.axis_not_batch(0), full_precision=True)
def LayerNormalization(ctx, X, Scale, B=None, *, axis=0, epsilon=0.0):
    """ONNX ``LayerNormalization`` over dims ``axis..rank-1``.

    Returns ``(Y, Mean, InvStdDev)``; Mean and InvStdDev keep the reduced
    dims as size 1.
    """
    X = jnp.asarray(X)
    a = norm_axis(axis, X.ndim, ctx)
    ax = tuple(range(a, X.ndim))
    mean = jnp.mean(X, axis=ax, keepdims=True)
    var = jnp.mean(jnp.square(X - mean), axis=ax, keepdims=True)
    inv = jax.lax.rsqrt(var + jnp.asarray(epsilon, X.dtype))
    y = (X - mean) * inv * Scale
    if B is not None:
        y = y + B
    return y, mean, inv


def _shifted(x, a):
    """``(x - max(x), exp of it)`` along axis ``a``, the exponent clamped at 0.

    ``x - max`` is <= 0 in exact arithmetic, but XLA (CPU) may recompute
    ``x`` inside the exp fusion with another summation order than in the max
    reduction: with logits ~1e9 (light_squeezenet on a random input) the
    difference is hundreds, exp overflows and the softmax is NaN
    (jax.nn.softmax included). Clamping keeps the ONNX value.
    """
    d = x - jax.lax.stop_gradient(jnp.max(x, axis=a, keepdims=True))
    return d, jnp.exp(jnp.where(d > 0, jnp.zeros((), d.dtype), d))


@register(OP_SET, "Softmax", reads_input_twice=True, batch=op_rules.axis_not_batch(0), full_precision=True,
          squashing=True)
def Softmax(ctx, input, *, axis=0):
    """ONNX ``Softmax`` along ``axis`` (schema default 0; rten-convert 0.22 writes
    a missing ONNX axis as 0). float32 in and out; ``exp(x - max) / sum``."""
    x = jnp.asarray(input)
    _, e = _shifted(x, norm_axis(axis, x.ndim, ctx))
    return e / jnp.sum(e, axis=norm_axis(axis, x.ndim, ctx), keepdims=True)


@register(OP_SET, "LogSoftmax", reads_input_twice=True, batch=op_rules.axis_not_batch(0), full_precision=True)
def LogSoftmax(ctx, input, *, axis=0):
    """ONNX ``LogSoftmax`` along ``axis`` (schema default 0, as Softmax):
    ``x - max - log(sum(exp(x - max)))``."""
    x = jnp.asarray(input)
    a = norm_axis(axis, x.ndim, ctx)
    d, e = _shifted(x, a)
    return d - jnp.log(jnp.sum(e, axis=a, keepdims=True))
