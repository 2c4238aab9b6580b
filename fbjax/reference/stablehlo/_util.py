"""Helpers shared by the StableHLO reference families (numpy only). The attribute
helpers (:func:`ints`, :func:`pairs`) are the readers' own
(:mod:`fbjax.formats.stablehlo_attrs`), shared with the lowering."""

from __future__ import annotations

import numpy as np

from ...formats.stablehlo_attrs import ints, pairs  # noqa: F401 (re-exported to the families)


def out_shape(ctx, i: int = 0) -> tuple:
    v = ctx.outputs[i]
    if v is None or v.shape is None or any(d is None for d in v.shape):
        raise ctx.error(f"output {i} needs a static shape")
    return tuple(int(d) for d in v.shape)


def pad_dilate(x: np.ndarray, fill, pads, interior) -> np.ndarray:
    """StableHLO ``pad``: ``interior`` fill cells between elements, then
    ``lo``/``hi`` cells at the edges (negative values crop)."""
    x = np.asarray(x)
    for ax, ((lo, hi), it) in enumerate(zip(pads, interior)):
        n = x.shape[ax]
        if it > 0 and n > 0:
            shape = list(x.shape)
            shape[ax] = n + (n - 1) * it
            y = np.full(shape, fill, x.dtype)
            idx = [slice(None)] * x.ndim
            idx[ax] = slice(None, None, it + 1)
            y[tuple(idx)] = x
            x = y
        shape = list(x.shape)
        shape[ax] = x.shape[ax] + max(lo, 0) + max(hi, 0)
        y = np.full(shape, fill, x.dtype)
        idx = [slice(None)] * x.ndim
        idx[ax] = slice(max(lo, 0), max(lo, 0) + x.shape[ax])
        y[tuple(idx)] = x
        crop = [slice(None)] * x.ndim
        crop[ax] = slice(max(-lo, 0), y.shape[ax] - max(-hi, 0))
        x = y[tuple(crop)]
    return x
