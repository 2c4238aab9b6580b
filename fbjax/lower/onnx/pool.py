"""ONNX pooling in NCHW via :mod:`fbjax.lower.kernels` (``lax.reduce_window``).

``ceil_mode`` adds end padding so the last partial window is kept, dropping a
window that would start in the end padding (ONNX rule). AveragePool divides
by the in-bounds tap count, or with ``count_include_pad`` by the taps inside
the explicitly padded extent (ceil-mode extra padding is never counted).

On CPU (:func:`fbjax.lower.kernels.use_shifted_window`), windows of up to
``KernelOptions.shifted_max_taps`` (16) taps are computed as max/sum over strided slices of the padded input
(:func:`fbjax.lower.kernels.shifted_window_reduce`), not ``reduce_window``:
XLA:CPU gives a reduce-window the row-major layout of its NCHW shape, so
between its channels-last convolutions each pool copied its input and output
to and from NCHW; slices take the layout of their producer and fuse into it
(light squeezenet, min of 100 interleaved runs: 9.3 -> 7.1 ms).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import kernels
from ..registry import register
from ._util import OP_SET, ints
from .conv import conv_padding


def pool_geometry(ctx, shape, kernel_size, auto_pad, pads, strides, ceil_mode):
    """(window, strides, explicit pads, ceil-mode extra end pads) per spatial dim."""
    n = len(shape) - 2
    k = ints(kernel_size)
    if len(k) != n:
        raise ctx.error(f"kernel_size has {len(k)} values for {n} spatial dimensions")
    s = ints(strides) or [1] * n
    if (len(s) == 1 and n > 1) or (len(s) != n and all(x == 1 for x in s)):
        s = [s[0]] * n
    if any(x < 1 for x in list(k) + list(s)):
        raise ctx.error(f"kernel_size {k} and strides {s} must be >= 1")
    pad = conv_padding(ctx, auto_pad, pads, shape[2:], k, s, [1] * n)
    extra = []
    for i, kk, ss, (a, b) in zip(shape[2:], k, s, pad):
        span = i + a + b - kk
        out = (-(-span // ss) if ceil_mode else span // ss) + 1
        if ceil_mode and (out - 1) * ss >= i + a:
            out -= 1
        extra.append(max((out - 1) * ss + kk - (i + a + b), 0))
    return k, s, pad, extra


@register(OP_SET, "MaxPool")
def MaxPool(ctx, X, *, kernel_size=(), auto_pad="Same", pads=None, strides=None, ceil_mode=False):
    """ONNX ``MaxPool`` (1-D/2-D; dilations 1). Padding never wins the max.

    The optional ``Indices`` output (int32) is the row-major flat index into
    the whole input of each window's first maximum (``storage_order`` 0; the
    converter rejects 1).
    """
    X = jnp.asarray(X)
    k, s, pad, extra = pool_geometry(ctx, X.shape, kernel_size, auto_pad, pads, strides, ceil_mode)
    full = [(a, b + e) for (a, b), e in zip(pad, extra)]
    if not (len(ctx.outputs) > 1 and ctx.outputs[1] is not None):
        if kernels.use_shifted_window(getattr(ctx, "backend", None), k, kernels.kernel_options(ctx)):
            dt = np.dtype(X.dtype)
            lowest = np.array(-np.inf if jnp.issubdtype(dt, jnp.floating) else np.iinfo(dt).min, dt)
            return kernels.shifted_window_reduce(X, lowest, jnp.maximum, window=k, strides=s, padding=full,
                                                 spatial_axes=range(2, X.ndim))
        return kernels.max_pool(X, window=k, strides=s, padding=full, spatial_axes=range(2, X.ndim))
    idx = jnp.arange(X.size, dtype=jnp.int32).reshape(X.shape)
    dt = np.dtype(X.dtype)
    lowest = np.array(-np.inf if jnp.issubdtype(dt, jnp.floating) else np.iinfo(dt).min, dt)

    def pick(a, b):
        (av, ai), (bv, bi) = a, b
        take_b = (bv > av) | ((bv == av) & (bi < ai))
        return jnp.where(take_b, bv, av), jnp.where(take_b, bi, ai)

    vals, inds = lax.reduce_window((X, idx), (lowest, np.array(np.iinfo(np.int32).max, np.int32)), pick,
                                   (1, 1) + tuple(k), (1, 1) + tuple(s), ((0, 0), (0, 0)) + tuple(full))
    return vals, inds


@register(OP_SET, "AveragePool", full_precision=True)
def AveragePool(ctx, X, *, kernel_size=(), auto_pad="Same", pads=None, strides=None, count_include_pad=False,
                ceil_mode=False):
    """ONNX ``AveragePool`` (1-D/2-D). See the module docstring for the divisor."""
    X = jnp.asarray(X)
    k, s, pad, extra = pool_geometry(ctx, X.shape, kernel_size, auto_pad, pads, strides, ceil_mode)
    full = [(a, b + e) for (a, b), e in zip(pad, extra)]
    dt = X.dtype
    if kernels.use_shifted_window(getattr(ctx, "backend", None), k, kernels.kernel_options(ctx)):
        total = kernels.shifted_window_reduce(X, np.array(0, dt), jnp.add, window=k, strides=s, padding=full,
                                              spatial_axes=range(2, X.ndim))
    else:
        total = lax.reduce_window(X, np.array(0, dt), lax.add, (1, 1) + tuple(k), (1, 1) + tuple(s),
                                  ((0, 0), (0, 0)) + tuple(full))
    count = np.ones((), np.float64)
    for ax, (i, kk, ss, (a, b), e) in enumerate(zip(X.shape[2:], k, s, pad, extra)):
        n_out = total.shape[2 + ax]
        pos = np.arange(n_out)[:, None] * ss - a + np.arange(kk)[None, :]
        lo, hi = (-a, i + b) if count_include_pad else (0, i)
        c = ((pos >= lo) & (pos < hi)).sum(1)
        shape = [1] * X.ndim
        shape[2 + ax] = n_out
        count = count * c.reshape(shape)
    return total / np.maximum(count, 1).astype(dt)


@register(OP_SET, "GlobalAveragePool", full_precision=True)
def GlobalAveragePool(ctx, X):
    """ONNX ``GlobalAveragePool``: mean over all spatial dims, kept as size 1."""
    X = jnp.asarray(X)
    return jnp.mean(X, axis=tuple(range(2, X.ndim)), keepdims=True)
