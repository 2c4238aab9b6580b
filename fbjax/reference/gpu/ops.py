"""numpy twins of op set ``"gpu_cl"``: written from the kernels' semantics, not from the JAX lowering.

``[B, H, W, C]`` float32 activations, float64 accumulation one kernel tap at
a time, rounded once to float32; output sizes come from the node's output
value, padding before from the attributes (as the kernels compute them).
"""

from __future__ import annotations

import numpy as np

from ..registry import register

OP_SET = "gpu_cl"


def _f32(x):
    return np.asarray(x, np.float64).astype(np.float32)


def _taps(x, out_hw, kernel, strides, dilations, before):
    """Yield ``(ky, kx, patch)``: the input under tap (ky, kx) for every output pixel, zero outside."""
    b, h, w, c = x.shape
    oh, ow = out_hw
    for ky in range(kernel[0]):
        ys = np.arange(oh) * strides[0] - before[0] + ky * dilations[0]
        for kx in range(kernel[1]):
            xs = np.arange(ow) * strides[1] - before[1] + kx * dilations[1]
            inside = ((ys >= 0) & (ys < h))[:, None] & ((xs >= 0) & (xs < w))[None, :]
            patch = x[:, np.clip(ys, 0, h - 1)][:, :, np.clip(xs, 0, w - 1)]
            yield ky, kx, patch * inside[None, :, :, None], inside


@register(OP_SET, "convolution_2d")
def convolution_2d(ctx, x, w=None, b=None, *, kernel=(1, 1), strides=(1, 1), dilations=(1, 1), padding=(0, 0),
                   variant="general"):
    """Convolution, ``w`` OHWI, ``b [O]``: ``sum_taps patch @ w[:, ky, kx, :].T + b``; the converter
    variant passes its runtime filter through."""
    if variant == "converter":
        return x
    out = ctx.outputs[0].shape
    acc = np.zeros((x.shape[0], out[1], out[2], w.shape[0]))
    for ky, kx, patch, _ in _taps(x.astype(np.float64), out[1:3], kernel, strides, dilations, padding):
        acc += patch @ w[:, ky, kx, :].astype(np.float64).T
    return _f32(acc + b)


@register(OP_SET, "depthwise_convolution")
def depthwise_convolution(ctx, x, w, b, *, kernel=(3, 3), strides=(1, 1), dilations=(1, 1), padding=(0, 0),
                          variant="general"):
    """Depthwise convolution, multiplier 1, ``w [1,KH,KW,C]``."""
    out = ctx.outputs[0].shape
    acc = np.zeros((x.shape[0], out[1], out[2], x.shape[3]))
    for ky, kx, patch, _ in _taps(x.astype(np.float64), out[1:3], kernel, strides, dilations, padding):
        acc += patch * w[0, ky, kx].astype(np.float64)
    return _f32(acc + b)


@register(OP_SET, "fully_connected")
def fully_connected(ctx, x, w, b):
    """``x.reshape(B, I) @ w.T + b`` as ``[B,1,1,O]``."""
    y = x.reshape(x.shape[0], -1).astype(np.float64) @ w.astype(np.float64).T + b
    return _f32(y).reshape(x.shape[0], *ctx.outputs[0].shape[1:])


@register(OP_SET, "convolution_transposed")
def convolution_transposed(ctx, x, w, b, *, kernel=(2, 2), strides=(2, 2), variant="thin"):
    """Kernel == stride transposed convolution: each input pixel writes one output block."""
    out = ctx.outputs[0].shape
    y = np.zeros((x.shape[0], x.shape[1] * strides[0], x.shape[2] * strides[1], w.shape[0]))
    for ky in range(kernel[0]):
        for kx in range(kernel[1]):
            y[:, ky::strides[0], kx::strides[1], :] += x.astype(np.float64) @ w[:, ky, kx, :].astype(np.float64).T
    return _f32(y + b)[:, :out[1], :out[2]]


@register(OP_SET, "pooling_2d")
def pooling_2d(ctx, x, *, kind="max", kernel=(1, 1), strides=(1, 1), dilations=(1, 1), padding=(0, 0)):
    """Max over in-bounds taps, or their mean (the count of in-bounds taps divides). The delegate's max kernel
    (TF ``gpu/common/tasks/pooling.cc``) starts its running maximum at -10000, not at the first tap."""
    out = ctx.outputs[0].shape
    best = np.full((x.shape[0], out[1], out[2], x.shape[3]), -10000.0)
    total = np.zeros_like(best)
    count = np.zeros((out[1], out[2]))
    for _, _, patch, inside in _taps(x.astype(np.float64), out[1:3], kernel, strides, (1, 1), padding):
        best = np.where(inside[None, :, :, None], np.maximum(best, patch), best)
        total += patch
        count += inside
    return _f32(best if kind == "max" else total / count[None, :, :, None])


def _fit(x, c):
    if x.shape[-1] in (c, 1):
        return x
    if x.shape[-1] > c:
        return x[..., :c]
    return np.concatenate([x, np.zeros(x.shape[:-1] + (c - x.shape[-1],), x.dtype)], axis=-1)


@register(OP_SET, "add")
def add(ctx, x, *ys):
    """Sum; missing channels count as 0."""
    c = ctx.outputs[0].shape[3]
    r = _fit(x, c)
    for y in ys:
        r = r + _fit(y, c)
    return r.astype(np.float32)


@register(OP_SET, "mul")
def mul(ctx, x, *ys):
    """Product with broadcasting."""
    c = ctx.outputs[0].shape[3]
    r = _fit(x, c)
    for y in ys:
        r = r * _fit(y, c)
    return r.astype(np.float32)


@register(OP_SET, "subtract")
def subtract(ctx, x, y):
    """Difference, the running value minus the second tensor; a 1-channel tensor repeats over channels."""
    c = ctx.outputs[0].shape[3]
    return (_fit(x, c) - _fit(y, c)).astype(np.float32)


@register(OP_SET, "div")
def div(ctx, x, y):
    """Quotient: one correctly rounded float32 division per element."""
    c = ctx.outputs[0].shape[3]
    return np.divide(_fit(x, c).astype(np.float32), _fit(y, c).astype(np.float32))


@register(OP_SET, "maximum")
def maximum(ctx, x, y):
    """Larger of the two, element-wise."""
    c = ctx.outputs[0].shape[3]
    return np.maximum(_fit(x, c), _fit(y, c)).astype(np.float32)


@register(OP_SET, "minimum")
def minimum(ctx, x, y):
    """Smaller of the two, element-wise."""
    c = ctx.outputs[0].shape[3]
    return np.minimum(_fit(x, c), _fit(y, c)).astype(np.float32)


@register(OP_SET, "prelu")
def prelu(ctx, x, alpha):
    """``x`` where positive, ``alpha * x`` elsewhere."""
    return np.where(x >= 0, x, x * alpha).astype(np.float32)


@register(OP_SET, "relu")
def relu(ctx, x, *, clip=0.0, alpha=0.0):
    """The delegate's ``CreateReLU`` (``gpu/common/tasks/relu.cc``): the lower bound is
    ``min(alpha * x, 0)`` (0 when ``alpha`` is 0), so ``clamp(x, lower, clip)`` when ``clip`` is not 0, else
    ``max(x, lower)``: a negative ``alpha`` gives 0 below zero and an ``alpha`` above 1 gives ``x``, not
    ``alpha * x``."""
    x = np.asarray(x, np.float32)
    lower = np.minimum(x * np.float32(alpha), np.float32(0)) if alpha else np.zeros_like(x)
    y = np.maximum(x, lower)
    if clip:
        y = np.minimum(y, np.float32(clip))
    return y.astype(np.float32)


@register(OP_SET, "sigmoid")
def sigmoid(ctx, x):
    """Logistic function, evaluated in float64."""
    with np.errstate(over="ignore"):  # exp(-x) -> inf gives the right 0
        return _f32(1.0 / (1.0 + np.exp(-x.astype(np.float64))))


@register(OP_SET, "hard_swish")
def hard_swish(ctx, x):
    """``x * relu6(x + 3) / 6`` in float64."""
    x = x.astype(np.float64)
    return _f32(x * np.clip(x + 3.0, 0.0, 6.0) / 6.0)


@register(OP_SET, "concat")
def concat(ctx, *xs):
    """Concatenation along the axis whose size grows."""
    out = ctx.outputs[0].shape
    axis = [a for a in (1, 2, 3) if out[a] != xs[0].shape[a]]
    return np.concatenate(xs, axis=axis[0] if axis else 3)


@register(OP_SET, "reshape")
def reshape(ctx, x):
    """Row-major HWC reshape."""
    return np.reshape(x, (x.shape[0], *ctx.outputs[0].shape[1:]))


@register(OP_SET, "mean")
def mean(ctx, x):
    """Mean over H and W in float64."""
    return _f32(x.astype(np.float64).mean(axis=(1, 2), keepdims=True))


@register(OP_SET, "pad")
def pad(ctx, x, *, prepended=(0, 0, 0)):
    """Place ``x`` at offset ``prepended`` (y, x, c) in zeros of the output shape."""
    out = np.zeros((x.shape[0], *ctx.outputs[0].shape[1:]), np.float32)
    py, px, pc = prepended
    out[:, py:py + x.shape[1], px:px + x.shape[2], pc:pc + x.shape[3]] = x
    return out


@register(OP_SET, "slice")
def slice(ctx, x, *, offsets=(0, 0, 0), strides=(1, 1, 1)):
    """``out[b, y, x, c] = x[b, oy + y*sy, ox + x*sx, oc + c*sc]`` (the kernel's source index per axis)."""
    _, oh, ow, oc_n = ctx.outputs[0].shape
    oy, ox, oc = offsets
    sy, sx, sc = tuple(strides) + (1,) * (3 - len(strides))
    ys = oy + np.arange(oh) * sy
    xs = ox + np.arange(ow) * sx
    cs = oc + np.arange(oc_n) * sc
    return x[:, ys][:, :, xs][..., cs]


@register(OP_SET, "resize")
def resize(ctx, x, *, method="bilinear", half_pixel=True, scale=(1.0, 1.0)):
    """Bilinear interpolation, separable, source coordinates as the kernel computes them in float32."""
    out = ctx.outputs[0].shape
    y = x.astype(np.float64)
    for axis, sc in ((1, scale[0]), (2, scale[1])):
        n_in = y.shape[axis]
        pos = np.arange(out[axis], dtype=np.float32)
        f = (pos + np.float32(0.5)) * np.float32(sc) - np.float32(0.5) if half_pixel else pos * np.float32(sc)
        lo = np.floor(f)
        t = (f - lo).astype(np.float64)
        i0 = np.clip(lo.astype(int), 0, n_in - 1)
        i1 = np.clip(lo.astype(int) + 1, 0, n_in - 1)
        shp = [1, 1, 1, 1]
        shp[axis] = -1
        y = np.take(y, i0, axis=axis) * (1 - t.reshape(shp)) + np.take(y, i1, axis=axis) * t.reshape(shp)
    return _f32(y)
