"""numpy twins of :mod:`fbjax.lower.onnx.misc` and :mod:`fbjax.lower.onnx.random`."""

from __future__ import annotations

import numpy as np

from ... import op_rules
from ..registry import register
from ._util import OP_SET, ints, out


@register(OP_SET, "STFT", out_dtype=op_rules.float32_out)
def STFT(ctx, signal, frame_step, window=None, frame_length=None, *, onesided=True):
    """numpy ONNX ``STFT`` via ``np.fft.fft`` of each windowed frame."""
    x = np.asarray(signal, np.float64)
    step = ints(frame_step)[0]
    n = ints(frame_length)[0] if frame_length is not None else int(np.shape(window)[0])
    sig = x[..., 0] + (1j * x[..., 1] if x.shape[-1] == 2 else 0)
    frames = (x.shape[1] - n) // step + 1
    w = np.asarray(window, np.float64) if window is not None else np.ones(n)
    spec = np.stack([np.fft.fft(sig[:, f * step:f * step + n] * w, axis=-1) for f in range(frames)], 1)
    if onesided:
        spec = spec[..., :n // 2 + 1]
    return out(ctx, np.stack([spec.real, spec.imag], -1))


@register(OP_SET, "NonMaxSuppression", out_dtype=op_rules.int32_out)
def NonMaxSuppression(ctx, boxes, scores, max_output_boxes_per_class=None, iou_threshold=None,
                      score_threshold=None, *, box_order="TopLeftBottomRight"):
    """numpy ONNX ``NonMaxSuppression`` (greedy, per batch and class)."""
    b = np.asarray(boxes, np.float64)
    s = np.asarray(scores, np.float64)
    mx = ints(max_output_boxes_per_class)[0] if max_output_boxes_per_class is not None else 0
    thr = float(np.asarray(iou_threshold).reshape(-1)[0]) if iou_threshold is not None else 0.0
    sth = float(np.asarray(score_threshold).reshape(-1)[0]) if score_threshold is not None else None
    if box_order == "CenterWidthHeight":
        b = np.stack([b[..., 1] - b[..., 3] / 2, b[..., 0] - b[..., 2] / 2,
                      b[..., 1] + b[..., 3] / 2, b[..., 0] + b[..., 2] / 2], -1)
    y1, x1 = np.minimum(b[..., 0], b[..., 2]), np.minimum(b[..., 1], b[..., 3])
    y2, x2 = np.maximum(b[..., 0], b[..., 2]), np.maximum(b[..., 1], b[..., 3])

    def iou(n, i, j):
        ih = max(min(y2[n, i], y2[n, j]) - max(y1[n, i], y1[n, j]), 0)
        iw = max(min(x2[n, i], x2[n, j]) - max(x1[n, i], x1[n, j]), 0)
        inter = ih * iw
        u = (y2[n, i] - y1[n, i]) * (x2[n, i] - x1[n, i]) + (y2[n, j] - y1[n, j]) * (x2[n, j] - x1[n, j]) - inter
        return inter / u if u > 0 else 0.0

    res = []
    for n in range(s.shape[0]):
        for c in range(s.shape[1]):
            keep = []
            for i in np.argsort(-s[n, c], kind="stable"):
                if len(keep) >= mx or (sth is not None and s[n, c, i] <= sth):
                    continue
                if all(iou(n, i, j) <= thr for j in keep):
                    keep.append(i)
            res += [[n, c, i] for i in keep]
    res = np.array(res, np.int64).reshape(-1, 3)
    if len(ctx.outputs) == 2:  # static-bound mode: padded with -1 rows to the bound, and the count
        bound = s.shape[0] * s.shape[1] * min(max(mx, 0), s.shape[2])
        padded = np.full((bound, 3), -1, np.int64)
        padded[:len(res)] = res
        return out(ctx, padded), out(ctx, np.int32(len(res)), 1)
    return out(ctx, res)


def _rng(ctx, seed):
    return np.random.default_rng(None if seed is None else int(seed))


@register(OP_SET, "RandomUniform", out_dtype=op_rules.float32_out)
def RandomUniform(ctx, *, shape=(), high=0.0, low=0.0, seed=None):
    """numpy ONNX ``RandomUniform`` (numpy's generator: distribution twin, not bit twin)."""
    return out(ctx, _rng(ctx, seed).uniform(low, high, tuple(shape)))


@register(OP_SET, "RandomUniformLike", out_dtype=op_rules.float32_out)
def RandomUniformLike(ctx, input, *, high=0.0, low=0.0, seed=None):
    """numpy ONNX ``RandomUniformLike``."""
    return out(ctx, _rng(ctx, seed).uniform(low, high, np.shape(input)))


@register(OP_SET, "RandomNormal", out_dtype=op_rules.float32_out)
def RandomNormal(ctx, *, mean=0.0, scale=0.0, seed=None, shape=()):
    """numpy ONNX ``RandomNormal``."""
    return out(ctx, _rng(ctx, seed).normal(mean, scale, tuple(shape)))


@register(OP_SET, "RandomNormalLike", out_dtype=op_rules.float32_out)
def RandomNormalLike(ctx, input, *, mean=0.0, scale=0.0, seed=None):
    """numpy ONNX ``RandomNormalLike``."""
    return out(ctx, _rng(ctx, seed).normal(mean, scale, np.shape(input)))
