"""ONNX ``Resize`` (nearest / linear, every coordinate and nearest mode in the
RTen schema) and ``GridSample`` (bilinear, zeros padding).

Resize coordinate maps are computed once in numpy (float64) from static
shapes and applied with :func:`fbjax.lower.kernels.resize_linear` /
:func:`~fbjax.lower.kernels.resize_nearest`.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ... import op_rules
from .. import kernels
from ..registry import register
from ._util import OP_SET


def source_coords(mode: str, out_size: int, in_size: int, scale: float) -> np.ndarray:
    """Source coordinate of every output position (ONNX
    ``coordinate_transformation_mode``), in float64 like the ONNX reference
    implementation: ``scale`` is ``out / in`` (float64) when sizes are given,
    else the float32 scale. Computing in float32 moves exact boundaries (e.g.
    align_corners 6 -> 4: the last output maps to 4.9999995, floor 4, not 5).
    """
    x = np.arange(out_size, dtype=np.float64)
    s = float(scale)
    if mode == "HalfPixel":
        return (x + 0.5) / s - 0.5
    if mode == "PytorchHalfPixel":
        return (x + 0.5) / s - 0.5 if out_size > 1 else np.zeros_like(x)
    if mode == "Asymmetric":
        return x / s
    if mode == "AlignCorners":
        # ONNX divides by the unrounded resized length ``in * scale`` (onnxruntime: by out - 1).
        length = in_size * s
        if out_size == 1 or length == 1:
            return np.zeros_like(x)
        return x * (in_size - 1) / (length - 1)
    raise ValueError(f"unknown coordinate transform mode {mode!r}")


def nearest_index(nearest_mode: str, src: np.ndarray, in_size: int) -> np.ndarray:
    """Index chosen by ONNX ``nearest_mode``, clamped to ``[0, in - 1]``."""
    if nearest_mode == "Floor":
        i = np.floor(src)
    elif nearest_mode == "Ceil":
        i = np.ceil(src)
    elif nearest_mode == "RoundPreferFloor":
        i = np.ceil(src - 0.5)
    elif nearest_mode == "RoundPreferCeil":
        i = np.floor(src + 0.5)
    else:
        raise ValueError(f"unknown nearest mode {nearest_mode!r}")
    return np.clip(i, 0, in_size - 1).astype(np.int32)


def linear_coords(src: np.ndarray, in_size: int):
    """(lo, hi, frac) for linear interpolation with edge clamping."""
    src = np.clip(src, 0, in_size - 1)
    lo = np.floor(src).astype(np.int32)
    hi = np.minimum(lo + 1, in_size - 1).astype(np.int32)
    return lo, hi, (src - lo).astype(np.float32)


def resize_plan(ctx, shape, scales, sizes):
    """Per-axis (out_size, scale) from the constant ``scales`` or ``sizes`` input."""
    r = len(shape)
    if sizes is not None and np.size(sizes):
        out = [int(v) for v in np.asarray(sizes).reshape(-1)]
        if len(out) == 2 and r == 4:  # ONNX axes=[2, 3] (the only axes rten-convert accepts)
            out = list(shape[:2]) + out
        if len(out) != r:
            raise ctx.error(f"sizes has {len(out)} values for rank {r}")
        sc = [1.0 if o is i or not i else o / i for o, i in zip(out, shape)]  # o is i: a copied (maybe symbolic) dim
    elif scales is not None and np.size(scales):
        sc = [float(v) for v in np.asarray(scales, np.float32).reshape(-1)]
        if not all(np.isfinite(v) and v >= 0 for v in sc):
            raise ctx.error(f"scales {sc} must be finite and >= 0")
        if len(sc) == 2 and r == 4:
            sc = [1.0, 1.0] + sc
        if len(sc) != r:
            raise ctx.error(f"scales has {len(sc)} values for rank {r}")
        # scale 1 keeps the dim (which may be a symbolic batch under jax.export)
        out = [i if s == 1.0 else int(np.floor(i * np.float32(s))) for i, s in zip(shape, sc)]
    else:
        raise ctx.error("Resize needs scales or sizes")
    if any(isinstance(o, int) and o < 0 for o in out):
        raise ctx.error(f"output sizes {out} must be >= 0")
    ctx.check_size(out, np.float32, what="resized output")
    return out, sc


def _resize_batch(node, carrying, batch) -> None:
    ins = node.inputs
    scales = op_rules.const(ins[2]) if len(ins) > 2 and ins[2] is not None else None
    if len(ins) > 3 and ins[3] is not None:
        raise op_rules.refusal(node, "resizes to fixed sizes, whose batch entry is the file's batch")
    if scales is None or (scales.size and float(scales.reshape(-1)[0]) != 1.0):
        raise op_rules.refusal(node, "scales the batch dimension (or takes computed scales)")


@register(OP_SET, "Resize", static_inputs=(2, 3), batch=_resize_batch)
def Resize(ctx, X, roi=None, scales=None, sizes=None, *, mode="Nearest", coord_mode="HalfPixel",
           nearest_mode="Floor"):
    """ONNX ``Resize`` of any axes whose size changes (RTen: the H, W axes).

    ``mode`` ``"Nearest"`` or ``"Linear"``; ``coord_mode`` HalfPixel,
    Asymmetric, AlignCorners, PytorchHalfPixel; ``nearest_mode`` Floor (the
    schema default), Ceil, RoundPreferFloor, RoundPreferCeil. ``roi`` is
    ignored (only used by tf_crop_and_resize, which RTen lacks).
    """
    x = jnp.asarray(X)
    out, sc = resize_plan(ctx, x.shape, scales, sizes)
    axes = [a for a in range(x.ndim) if out[a] != x.shape[a] or sc[a] != 1.0]
    if mode == "Nearest":
        idx = [nearest_index(nearest_mode, source_coords(coord_mode, out[a], x.shape[a], sc[a]), x.shape[a])
               for a in axes]
        return kernels.resize_nearest(x, axes, idx)
    if mode == "Linear":
        co = [linear_coords(source_coords(coord_mode, out[a], x.shape[a], sc[a]), x.shape[a]) for a in axes]
        return kernels.resize_linear(x, axes, co)
    raise ctx.error(f"unknown resize mode {mode!r}")


@register(OP_SET, "GridSample")
def GridSample(ctx, X, grid, *, align_corners=False):
    """ONNX ``GridSample``, bilinear with zeros padding (the only modes RTen keeps).

    Args:
        X: ``[N, C, H, W]``; grid: ``[N, Ho, Wo, 2]`` of (x, y) in [-1, 1].

    Returns:
        ``[N, C, Ho, Wo]``.
    """
    x = jnp.asarray(X)
    g = jnp.asarray(grid, x.dtype)
    n, c, h, w = x.shape
    gx, gy = g[..., 0], g[..., 1]
    if align_corners:
        fx = (gx + 1) / 2 * (w - 1)
        fy = (gy + 1) / 2 * (h - 1)
    else:
        fx = ((gx + 1) * w - 1) / 2
        fy = ((gy + 1) * h - 1) / 2
    x0 = jnp.floor(fx)
    y0 = jnp.floor(fy)
    wx1 = fx - x0
    wy1 = fy - y0
    flat = x.reshape(n, c, h * w)

    def tap(yi, xi):
        valid = (xi >= 0) & (xi < w) & (yi >= 0) & (yi < h)
        lin = (jnp.clip(yi, 0, h - 1) * w + jnp.clip(xi, 0, w - 1)).astype(jnp.int32)
        v = jnp.take_along_axis(flat, lin.reshape(n, 1, -1), axis=2).reshape(n, c, *lin.shape[1:])
        return v * valid[:, None].astype(x.dtype)

    out = (tap(y0, x0) * ((1 - wx1) * (1 - wy1))[:, None] + tap(y0, x0 + 1) * (wx1 * (1 - wy1))[:, None]
           + tap(y0 + 1, x0) * ((1 - wx1) * wy1)[:, None] + tap(y0 + 1, x0 + 1) * (wx1 * wy1)[:, None])
    return out
