"""ONNX ``STFT`` and ``NonMaxSuppression``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ... import op_rules
from .. import kernels
from ..registry import register
from ._util import OP_SET, ints, require_concrete


@register(OP_SET, "STFT", out_dtype=op_rules.float32_out, static_inputs=(1, 3))
def STFT(ctx, signal, frame_step, window=None, frame_length=None, *, onesided=True):
    """ONNX ``STFT``: ``[batch, frames, bins, 2]`` (real, imaginary) of the windowed
    frames, as a DFT matrix product.

    Args:
        signal: ``[batch, length, 1]`` real (or ``[..., 2]`` complex).
        frame_step: constant hop; window: ``[frame_length]``;
        frame_length: constant (default: the window's length).
    """
    x = jnp.asarray(signal)
    step = ints(frame_step)[0]
    if frame_length is not None:
        n = ints(frame_length)[0]
    elif window is not None:
        n = int(np.shape(window)[0])
    else:
        raise ctx.error("STFT needs a window or a frame_length")
    L = x.shape[1]
    if step < 1 or n < 1:
        raise ctx.error(f"frame_step {step} and frame_length {n} must be >= 1")
    frames = (L - n) // step + 1
    ctx.check_size((frames, n), np.int64, what="frame indices")
    idx = np.arange(frames)[:, None] * step + np.arange(n)[None, :]
    fr = x[:, idx]  # [B, F, n, c]
    if window is not None:
        fr = fr * jnp.asarray(window, x.dtype)[None, None, :, None]
    bins = n // 2 + 1 if onesided else n
    k = np.arange(bins)[None, :]
    t = np.arange(n)[:, None]
    ang = -2 * np.pi * t * k / n
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    re_in = fr[..., 0]
    im_in = fr[..., 1] if x.shape[-1] == 2 else None
    mm = lambda a, b: jnp.matmul(a, b, precision=kernels.precision(ctx))
    re = mm(re_in, cos)
    im = mm(re_in, sin)
    if im_in is not None:
        re = re - mm(im_in, sin)
        im = im + mm(im_in, cos)
    return jnp.stack([re, im], -1)


def _iou(a, b):
    y1 = np.maximum(a[0], b[0]); x1 = np.maximum(a[1], b[1])
    y2 = np.minimum(a[2], b[2]); x2 = np.minimum(a[3], b[3])
    inter = max(y2 - y1, 0) * max(x2 - x1, 0)
    ua = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / ua if ua > 0 else 0.0


def _nonmaxsuppression_bound(node):
    """``[B * C * min(max_output_boxes_per_class, N), 3]`` selected indices,
    when the scores' shape and a stored ``max_output_boxes_per_class``
    (absent: 0) give it."""
    if len(node.outputs) != 1 or node.outputs[0] is None:
        return None
    out, boxes = node.outputs[0], node.inputs[0] if node.inputs else None
    if boxes is None or not boxes.static_shape:
        return out
    scores = node.inputs[1] if len(node.inputs) > 1 else None
    mx = node.inputs[2] if len(node.inputs) > 2 else None
    if scores is None or not scores.static_shape or len(scores.shape) != 3:
        return out
    if mx is not None and mx.data is None:
        return out
    per = 0 if mx is None else int(np.asarray(mx.data).reshape(-1)[0])
    b, c, n = scores.shape
    out.shape = (b * c * min(max(per, 0), n), 3)
    return out


@register(OP_SET, "NonMaxSuppression", out_dtype=op_rules.int32_out, static_inputs=(2, 3, 4), differentiable=False,
          static_bound=_nonmaxsuppression_bound)
def NonMaxSuppression(ctx, boxes, scores, max_output_boxes_per_class=None, iou_threshold=None,
                      score_threshold=None, *, box_order="TopLeftBottomRight"):
    """ONNX ``NonMaxSuppression``: int32 ``[selected, 3]`` (batch, class, box).

    The output length depends on the values: as loaded, boxes and scores
    must be known at load time (constants; else this raises). In
    static-bound mode (``fbjax.load(..., static_bounds=True)``: the node has
    a second, count output) boxes and scores may be computed by the graph:
    returns ``([batches * classes * min(max_output_boxes_per_class, boxes),
    3]`` with the selected triples first, in ONNX's order (batch, class,
    descending score), the rest -1, and the int32 number of selected
    triples)``, jittable and vmappable (a greedy selection per batch and
    class, :func:`fbjax.lower.kernels.nms`).
    """
    if len(ctx.outputs) == 2:
        return _nms_padded(boxes, scores, max_output_boxes_per_class, iou_threshold, score_threshold, box_order)
    b = require_concrete(ctx, boxes, "NonMaxSuppression's boxes").astype(np.float32)
    s = require_concrete(ctx, scores, "NonMaxSuppression's scores").astype(np.float32)
    mx = ints(max_output_boxes_per_class)[0] if max_output_boxes_per_class is not None else 0
    thr = float(np.asarray(iou_threshold).reshape(-1)[0]) if iou_threshold is not None else 0.0
    sth = float(np.asarray(score_threshold).reshape(-1)[0]) if score_threshold is not None else None
    if box_order == "CenterWidthHeight":
        cx, cy, w, h = b[..., 0], b[..., 1], b[..., 2], b[..., 3]
        b = np.stack([cy - h / 2, cx - w / 2, cy + h / 2, cx + w / 2], -1)
    else:
        b = np.stack([np.minimum(b[..., 0], b[..., 2]), np.minimum(b[..., 1], b[..., 3]),
                      np.maximum(b[..., 0], b[..., 2]), np.maximum(b[..., 1], b[..., 3])], -1)
    out = []
    for n in range(s.shape[0]):
        for c in range(s.shape[1]):
            order = np.argsort(-s[n, c], kind="stable")
            keep = []
            for i in order:
                if len(keep) >= mx:
                    break
                if sth is not None and s[n, c, i] <= sth:
                    continue
                if all(_iou(b[n, i], b[n, j]) <= thr for j in keep):
                    keep.append(i)
            out += [[n, c, i] for i in keep]
    return np.asarray(out, np.int32).reshape(-1, 3)


def _nms_padded(boxes, scores, max_output_boxes_per_class, iou_threshold, score_threshold, box_order):
    """Static-bound ``NonMaxSuppression``: (padded triples, count), see above."""
    b = jnp.asarray(boxes, jnp.float32)
    s = jnp.asarray(scores, jnp.float32)
    nb, nc, n = s.shape
    mx = ints(max_output_boxes_per_class)[0] if max_output_boxes_per_class is not None else 0
    per = min(max(mx, 0), n)
    thr = float(np.asarray(iou_threshold).reshape(-1)[0]) if iou_threshold is not None else 0.0
    sth = float(np.asarray(score_threshold).reshape(-1)[0]) if score_threshold is not None else -np.inf
    if box_order == "CenterWidthHeight":  # [x_center, y_center, width, height] -> [y1, x1, y2, x2]
        cx, cy, w, h = b[..., 0], b[..., 1], b[..., 2], b[..., 3]
        b = jnp.stack([cy - h / 2, cx - w / 2, cy + h / 2, cx + w / 2], -1)
    total = nb * nc * per
    if total == 0:
        return jnp.full((0, 3), -1, jnp.int32), jnp.zeros((), jnp.int32)

    def one(bx, sc):  # one batch and class: indices [per], count
        idx, _, cnt = kernels.nms(bx, sc, per, thr, sth, 0.0)
        return idx, cnt

    idx, cnt = jax.vmap(lambda bx, sc: jax.vmap(lambda c: one(bx, c))(sc))(b, s)  # [B, C, per], [B, C]
    bi = jnp.broadcast_to(jnp.arange(nb, dtype=jnp.int32)[:, None, None], idx.shape)
    ci = jnp.broadcast_to(jnp.arange(nc, dtype=jnp.int32)[None, :, None], idx.shape)
    rows = jnp.stack([bi, ci, idx], -1).reshape(total, 3)
    valid = (jnp.arange(per)[None, None, :] < cnt[..., None]).reshape(total)
    pos = jnp.where(valid, jnp.cumsum(valid) - 1, total)  # selected rows packed to the front
    out = jnp.full((total, 3), -1, jnp.int32).at[pos].set(rows, mode="drop")
    return out, jnp.sum(valid, dtype=jnp.int32)
