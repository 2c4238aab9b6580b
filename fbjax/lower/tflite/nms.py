"""TFLite non-max suppression (``kernels/non_max_suppression.cc``,
``internal/reference/non_max_suppression.h``), float boxes ``[N, 4]`` as
``[y1, x1, y2, x2]`` (either corner order) and scores ``[N]``.

Greedy selection of at most ``max_output_size`` boxes: the highest remaining
score is taken while it exceeds ``score_threshold``; every other candidate's
score is then multiplied by ``exp(-0.5 * iou^2 / soft_nms_sigma)`` (1 when the
sigma is 0) or zeroed when ``iou > iou_threshold``. This is the eager form of
TFLite's lazy priority-queue loop, which it equals. Outputs are padded to
``max_output_size`` with index 0 and score 0, as TFLite does.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ..kernels import nms
from ..registry import register


def _scalar(v):
    return np.asarray(v).reshape(-1)[0].item()


@register("tflite", "NON_MAX_SUPPRESSION_V4", static_inputs=(2, 3, 4), differentiable=False)
def NON_MAX_SUPPRESSION_V4(ctx, boxes, scores, max_output_size, iou_threshold, score_threshold):
    """TFLite NON_MAX_SUPPRESSION_V4: hard NMS; outputs the padded int32
    ``selected_indices [max_output_size]`` and ``num_selected``. The three
    scalars must be static."""
    idx, _, n = nms(boxes, scores, int(_scalar(max_output_size)), float(_scalar(iou_threshold)),
                    float(_scalar(score_threshold)), 0.0)
    return idx, n.reshape(ctx.outputs[1].shape or ())


@register("tflite", "NON_MAX_SUPPRESSION_V5", static_inputs=(2, 3, 4, 5), differentiable=False)
def NON_MAX_SUPPRESSION_V5(ctx, boxes, scores, max_output_size, iou_threshold, score_threshold,
                           soft_nms_sigma):
    """TFLite NON_MAX_SUPPRESSION_V5: soft NMS (Gaussian, ``soft_nms_sigma``;
    0 means hard); outputs padded ``selected_indices``, ``selected_scores``
    (the decayed scores at selection) and ``num_selected``."""
    idx, sc, n = nms(boxes, scores, int(_scalar(max_output_size)), float(_scalar(iou_threshold)),
                     float(_scalar(score_threshold)), float(_scalar(soft_nms_sigma)))
    return idx, sc, n.reshape(ctx.outputs[2].shape or ())


# --- TFLite_Detection_PostProcess (kernels/detection_postprocess.cc) --------

def decode_boxes(enc, anchors, y_scale, x_scale, h_scale, w_scale):
    """Centre-size box encodings ``[N, 4]`` (ty, tx, th, tw) against anchors
    ``[N, 4]`` (yc, xc, h, w) -> corners ``[N, 4]`` (ymin, xmin, ymax, xmax)."""
    ya, xa, ha, wa = (anchors[:, k] for k in range(4))
    yc = enc[:, 0] / y_scale * ha + ya
    xc = enc[:, 1] / x_scale * wa + xa
    h = jnp.exp(enc[:, 2] / h_scale) * ha
    w = jnp.exp(enc[:, 3] / w_scale) * wa
    return jnp.stack([yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2], axis=-1)


@register("tflite.custom", "TFLite_Detection_PostProcess", differentiable=False)
def TFLite_Detection_PostProcess(ctx, box_encodings, class_predictions, anchors, *, max_detections=10,
                                 max_classes_per_detection=1, detections_per_class=100,
                                 use_regular_nms=False, nms_score_threshold=0.0, nms_iou_threshold=0.5,
                                 num_classes=90, y_scale=10.0, x_scale=10.0, h_scale=5.0, w_scale=5.0):
    """The SSD detection post-processing custom op (options from its
    flexbuffer map): decode boxes against the anchors, then either fast NMS
    (one NMS over each box's best ``max_classes_per_detection`` class
    scores) or regular NMS (per class, ``detections_per_class`` each, then
    the best ``max_detections`` overall). Scores at or above
    ``nms_score_threshold`` are candidates. Outputs ``boxes [1, D, 4]``,
    ``classes [1, D]`` (float), ``scores [1, D]``, ``num_detections [1]``
    (float), zero-padded; batch 1 only, as LiteRT. Regular NMS skips the
    last class, as LiteRT does."""
    enc = jnp.asarray(box_encodings)
    if enc.ndim != 3 or enc.shape[0] != 1:
        raise ctx.error(f"box_encodings must be [1, N, 4+], got {tuple(enc.shape)}")
    boxes = decode_boxes(enc[0, :, :4], jnp.asarray(anchors), float(y_scale), float(x_scale),
                         float(h_scale), float(w_scale))
    cls = jnp.asarray(class_predictions)[0]
    nc = int(num_classes)
    scores = cls[:, cls.shape[-1] - nc:]  # drop the background column(s)
    md, iou, thr = int(max_detections), float(nms_iou_threshold), float(nms_score_threshold)
    if use_regular_nms:
        dpc = int(detections_per_class)
        idx, sc, cnt = [], [], []
        # LiteRT's regular path never considers the last class (observed with
        # ai-edge-litert: a score only in the last class column yields no
        # detection); mirrored so that results match the runtime.
        for c in range(max(nc - 1, 1)):
            i, s_, n = nms(boxes, scores[:, c], min(dpc, boxes.shape[0]), iou, thr, 0.0, inclusive=True)
            idx.append(i)
            sc.append(jnp.where(jnp.arange(i.shape[0]) < n, s_, -jnp.inf))
            cnt.append(n)
        all_i, all_s = jnp.concatenate(idx), jnp.concatenate(sc)
        all_c = jnp.concatenate([jnp.full(i.shape, c, jnp.int32) for c, i in enumerate(idx)])
        k = min(md, all_s.shape[0])
        top_s, top = lax.top_k(all_s, k)
        valid = jnp.isfinite(top_s)
        out_boxes = jnp.where(valid[:, None], boxes[all_i[top]], 0)
        out_cls = jnp.where(valid, all_c[top], 0).astype(jnp.float32)
        out_sc = jnp.where(valid, top_s, 0)
        n = valid.sum()
        pad = md - k
        out_boxes = jnp.pad(out_boxes, ((0, pad), (0, 0)))
        out_cls, out_sc = jnp.pad(out_cls, (0, pad)), jnp.pad(out_sc, (0, pad))
    else:
        mc = int(max_classes_per_detection)
        top_s, top_c = lax.top_k(scores, mc)  # per box, best classes first
        i, s_, n_boxes = nms(boxes, top_s[:, 0], md, iou, thr, 0.0, inclusive=True)
        # each selected box contributes its mc best classes, in order
        sel_valid = jnp.arange(md) < n_boxes
        b = jnp.repeat(boxes[i], mc, axis=0)
        c = top_c[i].reshape(-1)
        s2 = top_s[i].reshape(-1)
        v = jnp.repeat(sel_valid, mc)
        k = md
        out_boxes = jnp.where(v[:k, None], b[:k], 0)
        out_cls = jnp.where(v[:k], c[:k], 0).astype(jnp.float32)
        out_sc = jnp.where(v[:k], s2[:k], 0)
        n = jnp.minimum(n_boxes * mc, md)
    return (out_boxes[None].astype(ctx.out_dtype(0)), out_cls[None], out_sc[None].astype(ctx.out_dtype(2)),
            n.reshape(1).astype(jnp.float32))
