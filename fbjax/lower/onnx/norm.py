"""ONNX normalizations and softmax.

Schema defaults (used when a field is absent): ``epsilon`` 0, LayerNormalization
``axis`` 0, Softmax ``axis`` 0 -- rten-convert writes ONNX's values (1e-5, -1)
whenever they differ. Softmax is over the single ``axis`` (opset-13 semantics).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..registry import register
from ._util import OP_SET, axis as norm_axis


def _chan(v, ndim):
    return jnp.reshape(v, (1, -1) + (1,) * (ndim - 2))


@register(OP_SET, "BatchNormalization")
def BatchNormalization(ctx, X, scale, B, input_mean, input_var, *, epsilon=0.0):
    """ONNX ``BatchNormalization`` (inference): ``(x - mean) / sqrt(var + eps) * scale + B`` on axis 1."""
    X = jnp.asarray(X)
    nd = X.ndim
    inv = jax.lax.rsqrt(_chan(input_var, nd) + jnp.asarray(epsilon, X.dtype))
    return (X - _chan(input_mean, nd)) * inv * _chan(scale, nd) + _chan(B, nd)


@register(OP_SET, "InstanceNormalization")
def InstanceNormalization(ctx, input, scale, B, *, epsilon=0.0):
    """ONNX ``InstanceNormalization``: per (N, C) mean/variance over spatial dims."""
    X = jnp.asarray(input)
    ax = tuple(range(2, X.ndim))
    mean = jnp.mean(X, axis=ax, keepdims=True)
    var = jnp.mean(jnp.square(X - mean), axis=ax, keepdims=True)
    y = (X - mean) * jax.lax.rsqrt(var + jnp.asarray(epsilon, X.dtype))
    return y * _chan(scale, X.ndim) + _chan(B, X.ndim)


@register(OP_SET, "LayerNormalization")
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


@register(OP_SET, "Softmax")
def Softmax(ctx, input, *, axis=0):
    """ONNX ``Softmax`` along ``axis`` (schema default 0)."""
    x = jnp.asarray(input)
    return jax.nn.softmax(x, axis=norm_axis(axis, x.ndim, ctx))


@register(OP_SET, "LogSoftmax")
def LogSoftmax(ctx, input, *, axis=0):
    """ONNX ``LogSoftmax`` along ``axis`` (schema default 0)."""
    x = jnp.asarray(input)
    return jax.nn.log_softmax(x, axis=norm_axis(axis, x.ndim, ctx))
