"""Non-max suppression (numpy reference): TFLite's lazy priority-queue
algorithm (``internal/reference/non_max_suppression.h``) written as a Python
loop over a heap, float64 IoU."""

from __future__ import annotations

import heapq
import math

import numpy as np

from ..registry import register


def _iou(a, b):
    ay1, ay2 = sorted((a[0], a[2]))
    ax1, ax2 = sorted((a[1], a[3]))
    by1, by2 = sorted((b[0], b[2]))
    bx1, bx2 = sorted((b[1], b[3]))
    aa, ab = (ay2 - ay1) * (ax2 - ax1), (by2 - by1) * (bx2 - bx1)
    if aa <= 0 or ab <= 0:
        return 0.0
    inter = max(min(ay2, by2) - max(ay1, by1), 0) * max(min(ax2, bx2) - max(ax1, bx1), 0)
    return inter / (aa + ab - inter)


def nms(boxes, scores, max_out, iou_thr, score_thr, sigma, inclusive=False):
    boxes = np.asarray(boxes, np.float64)
    scores = np.asarray(scores, np.float64)
    scale = -0.5 / sigma if sigma > 0 else 0.0
    heap = [(-s, i, 0) for i, s in enumerate(scores) if (s >= score_thr if inclusive else s > score_thr)]
    heapq.heapify(heap)
    sel, sel_s = [], []
    while heap and len(sel) < max_out:
        neg, i, start = heapq.heappop(heap)
        s, orig = -neg, -neg
        for j in sel[start:]:
            o = _iou(boxes[i], boxes[j])
            s *= math.exp(scale * o * o) if o <= iou_thr else 0.0
            if s <= score_thr:
                break
        if s == orig:
            sel.append(i)
            sel_s.append(s)
        elif s > score_thr:
            heapq.heappush(heap, (-s, i, len(sel)))
    n = len(sel)
    idx = np.zeros(max_out, np.int32)
    sc = np.zeros(max_out, np.float32)
    idx[:n], sc[:n] = sel, sel_s
    return idx, sc, n


def _scalar(v):
    return np.asarray(v).reshape(-1)[0].item()


@register("tflite", "NON_MAX_SUPPRESSION_V4", static_inputs=(2, 3, 4))
def NON_MAX_SUPPRESSION_V4(ctx, boxes, scores, max_output_size, iou_threshold, score_threshold):
    """Hard NMS, padded indices and count."""
    idx, _, n = nms(boxes, scores, int(_scalar(max_output_size)), float(_scalar(iou_threshold)),
                    float(_scalar(score_threshold)), 0.0)
    return idx, np.asarray(n, np.int32).reshape(ctx.outputs[1].shape or ())


@register("tflite", "NON_MAX_SUPPRESSION_V5", static_inputs=(2, 3, 4, 5))
def NON_MAX_SUPPRESSION_V5(ctx, boxes, scores, max_output_size, iou_threshold, score_threshold,
                           soft_nms_sigma):
    """Soft NMS, padded indices, scores and count."""
    idx, sc, n = nms(boxes, scores, int(_scalar(max_output_size)), float(_scalar(iou_threshold)),
                     float(_scalar(score_threshold)), float(_scalar(soft_nms_sigma)))
    return idx, sc.astype(ctx.out_dtype(1)), np.asarray(n, np.int32).reshape(ctx.outputs[2].shape or ())


@register("tflite.custom", "TFLite_Detection_PostProcess")
def TFLite_Detection_PostProcess(ctx, box_encodings, class_predictions, anchors, *, max_detections=10,
                                 max_classes_per_detection=1, detections_per_class=100,
                                 use_regular_nms=False, nms_score_threshold=0.0, nms_iou_threshold=0.5,
                                 num_classes=90, y_scale=10.0, x_scale=10.0, h_scale=5.0, w_scale=5.0):
    """Decode, then fast or regular NMS with explicit Python loops."""
    enc = np.asarray(box_encodings, np.float64)[0, :, :4]
    a = np.asarray(anchors, np.float64)
    yc = enc[:, 0] / y_scale * a[:, 2] + a[:, 0]
    xc = enc[:, 1] / x_scale * a[:, 3] + a[:, 1]
    h = np.exp(enc[:, 2] / h_scale) * a[:, 2]
    w = np.exp(enc[:, 3] / w_scale) * a[:, 3]
    boxes = np.stack([yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2], -1)
    cls = np.asarray(class_predictions, np.float64)[0]
    nc = int(num_classes)
    scores = cls[:, cls.shape[-1] - nc:]
    md = int(max_detections)
    dets = []  # (box index, class, score)
    if use_regular_nms:
        for c in range(max(nc - 1, 1)):  # LiteRT's regular path skips the last class (observed)
            idx, sc, n = nms(boxes, scores[:, c], int(detections_per_class), float(nms_iou_threshold),
                             float(nms_score_threshold), 0.0, inclusive=True)
            dets += [(int(i), c, float(scores[i, c])) for i in idx[:n]]
        order = sorted(range(len(dets)), key=lambda k: -dets[k][2])  # stable: class order on ties
        dets = [dets[k] for k in order][:md]
    else:
        mc = int(max_classes_per_detection)
        best = np.argsort(-scores, axis=1, kind="stable")[:, :mc]
        idx, _, n = nms(boxes, scores[np.arange(len(scores)), best[:, 0]], md, float(nms_iou_threshold),
                        float(nms_score_threshold), 0.0, inclusive=True)
        for i in idx[:n]:
            dets += [(int(i), int(c), float(scores[i, c])) for c in best[i]]
        dets = dets[:md]
    ob = np.zeros((1, md, 4), np.float32)
    oc = np.zeros((1, md), np.float32)
    os_ = np.zeros((1, md), np.float32)
    for k, (i, c, s_) in enumerate(dets):
        ob[0, k], oc[0, k], os_[0, k] = boxes[i], c, s_
    return ob, oc, os_, np.asarray([len(dets)], np.float32)
