"""Lowerings of op set ``"gpu_cl"`` (see :mod:`fbjax.lower.gpu`).

Shapes are ``[B, H, W, C]``; a node's output shape (``ctx.outputs[0].shape``,
from the file's tensor descriptors) fixes padding and crop where the kernel
arguments give only the leading offset (``padding_x`` is minus the padding
before). Attributes are those :mod:`fbjax.formats.gpu_cl` reads from the
kernel's arguments and code.

Facts declared at the registrations (:class:`fbjax._registry.OpDef`): every op
keeps the batch in dimension 0 (no ``batch`` rule); ``convolution_2d`` and
``fully_connected`` declare their ``weights`` (OHWI / OI, as TFLite's CONV_2D
and FULLY_CONNECTED: the CPU executor relays the filters to HWIO); ``mean`` and
``pooling_2d`` compute in float32 under a reduced ``compute_dtype`` (as
TFLite's MEAN and AVERAGE_POOL_2D); ``sigmoid`` squashes its input (precision
comparisons read its logits, as TFLite's LOGISTIC); ``resize`` lowers
bilinear sampling only.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import kernels
from ..registry import register

OP_SET = "gpu_cl"

#: where the delegate's max pooling kernel starts its running maximum (TF ``tasks/pooling.cc``)
MAX_POOL_START = -10000.0


def _pads(in_hw, out_hw, kernel, strides, dilations, before):
    """Per spatial dim ``(before, after)`` giving exactly ``out_hw`` (after clipped at 0: the result is cropped)."""
    return [(int(b), max(0, (o - 1) * s + (k - 1) * d + 1 - i - b))
            for i, o, k, s, d, b in zip(in_hw, out_hw, kernel, strides, dilations, before)]


def _crop(y, out_shape):
    return y[:, :out_shape[1], :out_shape[2], :]


def _channels(x, c: int):
    """``x`` with its channel dim zero-padded or cut to ``c`` (GPU tensors hold whole slices, zero beyond C)."""
    have = x.shape[-1]
    if have == c or have == 1:
        return x
    if have > c:
        return x[..., :c]
    return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, c - have)])


@register(OP_SET, "convolution_2d", weights=((1, "OHWI"), (2, "O")))
def convolution_2d(ctx, x, w=None, b=None, *, kernel=(1, 1), strides=(1, 1), dilations=(1, 1), padding=(0, 0),
                   variant="general"):
    """Convolution (TF 2.5 ``ConvPowerVR`` / ``ConvBuffer1x1``): ``x [B,H,W,I]``, ``w [O,KH,KW,I]`` (OHWI),
    ``b [O]``, zero padding ``padding`` before, output size from the file. Returns ``[B,OH,OW,O]`` float32.

    ``variant="converter"`` (``ConverterToConvWeights``) passes a runtime OHWI filter through (the GPU
    reorders it for the convolution that reads it, ``variant="runtime_weights"``, as ``w``)."""
    if variant == "converter":
        return x
    out = ctx.outputs[0].shape
    pads = _pads(x.shape[1:3], out[1:3], kernel, strides, dilations, padding)
    rhs = kernels.weight_layout(ctx, 1, "OHWI")  # HWIO when relaid for XLA:CPU (fbjax.executors.planner)
    y = kernels.conv(x, w, window_strides=tuple(strides), padding=pads, rhs_dilation=tuple(dilations),
                     dimension_numbers=("NHWC", rhs, "NHWC"), backend=ctx.backend,
                     options=kernels.kernel_options(ctx))
    return _crop(y, out) + b


@register(OP_SET, "depthwise_convolution")
def depthwise_convolution(ctx, x, w, b, *, kernel=(3, 3), strides=(1, 1), dilations=(1, 1), padding=(0, 0),
                          variant="general"):
    """Depthwise convolution, multiplier 1 (``DepthwiseConv`` / ``DepthwiseConv3x3``): ``w [1,KH,KW,C]``, ``b [C]``."""
    out = ctx.outputs[0].shape
    pads = _pads(x.shape[1:3], out[1:3], kernel, strides, dilations, padding)
    y = kernels.depthwise_conv(x, w[0], window_strides=tuple(strides), padding=pads, rhs_dilation=tuple(dilations),
                               backend=ctx.backend, options=kernels.kernel_options(ctx))
    return _crop(y, out) + b


@register(OP_SET, "fully_connected", weights=((1, "OI"), (2, "O")))
def fully_connected(ctx, x, w, b):
    """``FullyConnected``: ``x [B,1,1,I]`` (flattened), ``w [O,I]``, ``b [O]`` -> ``[B,1,1,O]``."""
    y = jnp.dot(x.reshape(x.shape[0], -1), w.T, precision=kernels.precision(ctx)) + b
    return y.reshape(x.shape[0], *ctx.outputs[0].shape[1:])


@register(OP_SET, "convolution_transposed")
def convolution_transposed(ctx, x, w, b, *, kernel=(2, 2), strides=(2, 2), variant="thin"):
    """``ConvolutionTransposedThin`` with kernel == stride: each input pixel writes its own
    ``KH x KW`` output block, ``out[ky + s*y, kx + s*x, o] = sum_i x[y, x, i] w[o, ky, kx, i] + b[o]``."""
    kh, kw = kernel
    bsz, h, wd, _ = x.shape
    y = jnp.einsum("bhwi,oyxi->bhywxo", x, w, precision=kernels.precision(ctx))
    y = y.reshape(bsz, h * kh, wd * kw, w.shape[0]) + b
    out = ctx.outputs[0].shape
    return y[:, :out[1], :out[2], :]


@register(OP_SET, "pooling_2d", full_precision=True)
def pooling_2d(ctx, x, *, kind="max", kernel=(1, 1), strides=(1, 1), dilations=(1, 1), padding=(0, 0)):
    """``Pooling``: max (padded taps skipped) or average over the in-bounds taps. The max kernel starts from
    ``-10000`` (``FLT4 maximum = INIT_FLT4(-10000.0f)`` in its code), so its result is never below that."""
    out = ctx.outputs[0].shape
    pads = _pads(x.shape[1:3], out[1:3], kernel, strides, (1, 1), padding)
    if kind == "max":
        y = kernels.max_pool(x, window=kernel, strides=strides, padding=pads, spatial_axes=(1, 2))
        y = jnp.maximum(y, np.float32(MAX_POOL_START))
    else:
        y = kernels.avg_pool(x, window=kernel, strides=strides, padding=pads, spatial_axes=(1, 2))
    return _crop(y, out)


@register(OP_SET, "add")
def add(ctx, x, *ys):
    """Element-wise sum; inputs with fewer channels count as zero-padded (``Add`` of unequal channels)."""
    c = ctx.outputs[0].shape[3]
    r = _channels(x, c)
    for y in ys:
        r = r + _channels(y, c)
    return r


@register(OP_SET, "mul")
def mul(ctx, x, *ys):
    """Element-wise product with broadcasting."""
    c = ctx.outputs[0].shape[3]
    r = _channels(x, c)
    for y in ys:
        r = r * _channels(y, c)
    return r


@register(OP_SET, "subtract")
def subtract(ctx, x, y):
    """``x - y`` (TF 2.5 ``tasks/elementwise.cc``: ``in_out_value = in_out_value - second_val``), ``y``
    broadcast over H, W or channels (a tensor of 1 channel repeats its ``.x``)."""
    c = ctx.outputs[0].shape[3]
    return _channels(x, c) - _channels(y, c)


@register(OP_SET, "div")
def div(ctx, x, y):
    """``x / y``, one IEEE division per element (:func:`fbjax.lower.kernels.ieee_divide`: XLA would multiply
    by a broadcast divisor's reciprocal), ``y`` broadcast as for ``subtract``."""
    c = ctx.outputs[0].shape[3]
    return kernels.ieee_divide(_channels(x, c), _channels(y, c))


@register(OP_SET, "maximum")
def maximum(ctx, x, y):
    """``max(x, y)`` element-wise, ``y`` broadcast as for ``subtract``."""
    c = ctx.outputs[0].shape[3]
    return jnp.maximum(_channels(x, c), _channels(y, c))


@register(OP_SET, "minimum")
def minimum(ctx, x, y):
    """``min(x, y)`` element-wise, ``y`` broadcast as for ``subtract``."""
    c = ctx.outputs[0].shape[3]
    return jnp.minimum(_channels(x, c), _channels(y, c))


@register(OP_SET, "prelu")
def prelu(ctx, x, alpha):
    """``max(x, 0) + min(x, 0) * alpha``, ``alpha [1,1,C]``."""
    return jnp.maximum(x, 0) + jnp.minimum(x, 0) * alpha


@register(OP_SET, "relu")
def relu(ctx, x, *, clip=0.0, alpha=0.0):
    """``ReLU``: ``max(x, min(alpha * x, 0))``, then ``min(., clip)`` when ``clip`` is not 0."""
    lo = jnp.minimum(x * np.float32(alpha), 0) if alpha else 0
    y = jnp.maximum(x, lo)
    return jnp.minimum(y, np.float32(clip)) if clip else y


@register(OP_SET, "sigmoid", squashing=True)
def sigmoid(ctx, x):
    """``1 / (1 + exp(-x))``, as the kernel writes it."""
    return 1.0 / (1.0 + jnp.exp(-x))


@register(OP_SET, "hard_swish")
def hard_swish(ctx, x):
    """``x * clamp(x / 6 + 0.5, 0, 1)``."""
    return x * jnp.clip(x * np.float32(1 / 6) + np.float32(0.5), 0, 1)


@register(OP_SET, "concat")
def concat(ctx, *xs):
    """Concatenation along the one axis where the output is larger than the first input."""
    out = ctx.outputs[0].shape
    axis = next((a for a in (3, 2, 1) if out[a] != xs[0].shape[a]), 3)
    return jnp.concatenate(xs, axis=axis)


@register(OP_SET, "reshape")
def reshape(ctx, x):
    """Row-major reshape of ``[B,H,W,C]`` to the output shape (the kernel's linear HWC index), per batch."""
    return x.reshape(x.shape[0], *ctx.outputs[0].shape[1:])


@register(OP_SET, "mean", full_precision=True)
def mean(ctx, x):
    """Mean over H and W (``MeanStdDevNormalization``'s sibling ``Mean``): ``[B,1,1,C]``."""
    return jnp.mean(x, axis=(1, 2), keepdims=True)


@register(OP_SET, "pad")
def pad(ctx, x, *, prepended=(0, 0, 0)):
    """Zero padding: ``prepended`` (y, x, channels) before, the rest up to the output shape after."""
    out = ctx.outputs[0].shape
    widths = [(0, 0)] + [(int(p), int(o - i - p)) for p, i, o in zip(prepended, x.shape[1:], out[1:])]
    return jnp.pad(x, widths)


def _strided(x, axis: int, start: int, step: int, n: int):
    """``n`` entries of ``x`` along ``axis`` from ``start`` in steps of ``step`` (negative: backwards)."""
    if step > 0:
        return lax.slice_in_dim(x, start, start + (n - 1) * step + 1, step, axis=axis)
    return jnp.take(x, start + step * np.arange(n), axis=axis)


@register(OP_SET, "slice")
def slice_(ctx, x, *, offsets=(0, 0, 0), strides=(1, 1, 1)):
    """Strided slice (``StridedSlice``): ``out[b, y, x, c] = x[b, oy + y*sy, ox + x*sx, oc + c*sc]``, the
    start ``offsets`` (y, x, channel), steps ``strides`` (y, x, channel; negative steps go backwards), the
    size from the output."""
    out = ctx.outputs[0].shape
    for axis, start, step in zip((1, 2, 3), offsets, tuple(strides) + (1,) * (3 - len(strides))):
        x = _strided(x, axis, int(start), int(step), out[axis])
    return x


def _bilinear_only(node):
    """The ``check`` of ``resize``: only bilinear sampling has a kernel here (the reader refuses nearest)."""
    m = node.attrs.get("method", "bilinear")
    return None if m == "bilinear" else f"method {m!r}: only bilinear resize is lowered"


@register(OP_SET, "resize", check=_bilinear_only)
def resize(ctx, x, *, method="bilinear", half_pixel=True, scale=(1.0, 1.0)):
    """Bilinear resize as the kernel computes it: source coordinate ``(X + 0.5) * scale - 0.5`` (half pixel)
    or ``X * scale``, ``scale`` the file's float, low index clamped at 0, high at ``in - 1``."""
    out = ctx.outputs[0].shape
    for axis, sc in ((1, scale[0]), (2, scale[1])):
        n_in = x.shape[axis]
        pos = np.arange(out[axis], dtype=np.float32)
        f = (pos + np.float32(0.5)) * np.float32(sc) - np.float32(0.5) if half_pixel else pos * np.float32(sc)
        fl = np.floor(f)
        t = (f - fl).astype(np.float32)
        i0 = np.clip(fl.astype(np.int64), 0, n_in - 1)
        i1 = np.clip(fl.astype(np.int64) + 1, 0, n_in - 1)
        shape = [1, 1, 1, 1]
        shape[axis] = -1
        a = jnp.take(x, i0, axis=axis)
        b = jnp.take(x, i1, axis=axis)
        x = a + (b - a) * t.reshape(shape)
    return x
