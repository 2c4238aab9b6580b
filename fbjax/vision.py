"""Images in, pictures out: run a vision model on a photo the way its metadata says.

``fbjax run MODEL --image photo.jpg [--overlay out.png]`` is built from these
functions (Pillow reads and draws; ``pip install 'fbjax[image]'``):

* :func:`preprocess` resizes the image to the model's input and normalizes it
  as the file's TFLite metadata says (``(x - mean) / std`` per channel, RGB or
  grayscale; :mod:`fbjax.formats.tflite_metadata`). A float model without
  metadata needs ``mean``/``std`` from the caller (:class:`InputError` says so);
  a uint8 model takes the pixels as they are.
* :func:`interpret` names what the outputs are: class scores with labels
  (top-k), boxes (TFLite's post-processed detector layout, described by the
  metadata's ``BoundingBoxProperties``), MediaPipe single-shot detector
  tensors (decoded with :func:`ssd_anchors`, see below), a segmentation mask,
  landmarks.
* :func:`draw_overlay` draws boxes, keypoints, landmarks and a mask on the
  photo.

MediaPipe's detectors (face, palm, pose) output raw tensors: per anchor, box
offsets and keypoints (``[1, N, 4 + 2K]``) and a score logit (``[1, N, 1]``).
Their metadata calls them "raw boxes" and does not carry the anchors; the
anchors come from the ``SsdAnchorsCalculator`` options of MediaPipe's graphs
(``mediapipe/modules/{face,palm,pose}_detection/*.pbtxt``). Every one of
those graphs uses fixed-size anchors (width = height = 1) centred on the
feature-map cells (offset 0.5), boxes as (x centre, y centre, width, height)
scaled by the input size, sigmoid scores clipped to +-100 and weighted
non-maximum suppression at intersection over union 0.3. They differ in the
feature-map strides: :data:`SSD_LAYOUTS` lists them, and :func:`ssd_anchors`
picks the one whose anchor count equals the model's ``N`` at its input size
(a model matching none is reported as raw scores, not guessed at).

MediaPipe's landmark models (face mesh, hand, iris) output landmarks in the
input's pixels whatever the picture shows; the graph that runs them decides
from the model's own score whether there is anything there.
:data:`LANDMARK_LAYOUTS` lists them, recognised by their outputs' sizes in
the file's order (their metadata, where present, names the outputs in
another order or not at all): the face mesh's face flag is a logit (the
graph takes its sigmoid), the hand model's presence is a probability; the
graphs keep the landmarks when that score is above 0.5 and drop them
otherwise, and so does :func:`interpret` (with its ``threshold``). Each
expects a crop around one face, hand or eye, which the graph cuts from the
photo with a detector's box (or the face mesh's eye points); on a whole
photo they find nothing, or points that mean little.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Optional, Sequence

import numpy as np

from .errors import InputError

__all__ = ["load_image", "preprocess", "interpret", "draw_overlay", "ssd_anchors", "SSD_LAYOUTS", "Result",
           "decode_ssd", "LANDMARK_LAYOUTS", "LandmarkLayout"]

#: MediaPipe SSD anchor layouts: (strides of the anchor layers, anchors per cell per layer), from the
#: SsdAnchorsCalculator options of MediaPipe's detector graphs. Consecutive layers with one stride share a
#: feature map (their anchors are interleaved per cell).
SSD_LAYOUTS = {
    "strides 8, 16, 16, 16, 2 anchors per cell and layer (MediaPipe face_detection_short_range 128x128: 896 "
    "anchors; palm_detection 192x192: 2016)": ((8, 16, 16, 16), 2),
    "stride 4, 1 anchor per cell (MediaPipe face_detection_full_range 192x192: 2304 anchors)": ((4,), 1),
    "strides 16, 32, 32, 32, 2 anchors per cell and layer (MediaPipe face_detection_back 256x256: 896 anchors)":
        ((16, 32, 32, 32), 2),
    "strides 8, 16, 32, 32, 32, 2 anchors per cell and layer (MediaPipe pose_detection 224x224: 2254 anchors)":
        ((8, 16, 32, 32, 32), 2),
}


@dataclasses.dataclass(frozen=True)
class LandmarkLayout:
    """What the outputs of one MediaPipe landmark model mean, from the graph that runs it.

    Attributes:
        subject: what the model looks at (``"face"``, ``"hand"``, ``"eye"``).
        sizes: values per output, in the file's output order (how the model
            is recognised).
        landmarks: ``{output index: what its points are}``, points
            ``(x, y, z)`` in input pixels (drawn).
        presence: index of the presence output, or None (the model has no
            score: its points are always drawn).
        presence_is_logit: the graph applies a sigmoid to the presence
            output (else the model outputs a probability).
        handedness: index of the one-value handedness output (probability
            of ``labels[0]``), or None.
        labels: handedness labels.
        world: index of the world-landmark output (metres; not drawn), or None.
        crop: what the model expects as input.
        source: the MediaPipe graph files these facts come from.
    """

    subject: str
    sizes: tuple
    landmarks: dict
    presence: Optional[int] = None
    presence_is_logit: bool = False
    handedness: Optional[int] = None
    labels: tuple = ()
    world: Optional[int] = None
    crop: str = ""
    source: str = ""


#: MediaPipe landmark models, recognised by their outputs' sizes (see the module docstring). The presence
#: threshold of every graph is 0.5 (``ThresholdingCalculator``: present when the score is above it).
LANDMARK_LAYOUTS = (
    LandmarkLayout(
        "face", (468 * 3, 1), {0: "face mesh landmarks"}, presence=1, presence_is_logit=True,
        crop="a crop around one face: MediaPipe cuts the face detector's box enlarged 1.5x to a square "
             "(run mediapipe_face_detection_short_range on the photo first and crop its box)",
        source="mediapipe/modules/face_landmark/face_landmark_cpu.pbtxt: face presence = sigmoid(face flag), "
               "landmarks kept above 0.5"),
    LandmarkLayout(
        "hand", (21 * 3, 1, 1, 21 * 3), {0: "hand landmarks"}, presence=1, handedness=2, labels=("Left", "Right"),
        world=3,
        crop="a crop around one hand: MediaPipe cuts the palm detector's box enlarged 2.6x, moved up by half its "
             "height, to a square (run mediapipe_palm_detection_lite on the photo first and crop that)",
        source="mediapipe/modules/hand_landmark/hand_landmark_cpu.pbtxt: outputs landmarks, hand presence, "
               "handedness, world landmarks; landmarks and handedness kept above 0.5"),
    LandmarkLayout(
        "eye", (71 * 3, 5 * 3), {0: "eye contour and brow landmarks", 1: "iris landmarks"},
        crop="a 64x64 crop around one eye: MediaPipe cuts a square 2.3x the eye's width around the face mesh's "
             "eye corners, a right eye mirrored (this model has no score saying whether an eye is there)",
        source="mediapipe/modules/iris_landmark/iris_landmark_cpu.pbtxt, iris_landmark_landmarks_to_roi.pbtxt"),
)


def load_image(path):
    """The image at ``path`` as a Pillow image (EXIF orientation applied).

    Raises:
        InputError: Pillow is missing, or the file is not an image it reads.
    """
    try:
        from PIL import Image, ImageOps
    except ImportError:
        raise InputError("reading images needs Pillow: pip install 'fbjax[image]' (or pip install Pillow)") from None
    try:
        img = Image.open(path)
        img = ImageOps.exif_transpose(img)
        img.load()
    except FileNotFoundError:
        raise
    except Exception as e:  # Pillow's UnidentifiedImageError, truncated files...
        raise InputError(f"{path}: not an image Pillow can read ({type(e).__name__}: {e})") from None
    return img


def _image_spec(model):
    spec = model.inputs[0]
    shape = tuple(spec.shape)
    if len(shape) != 4 or shape[-1] not in (1, 3) or shape[1] is None or shape[2] is None:
        raise InputError(f"--image needs a model whose first input is an NHWC image [1, H, W, 1 or 3]; "
                         f"{spec.name!r} is {list(shape)} (give arrays with --input NAME=FILE.npy instead)")
    return spec, shape


def preprocess(model, image, *, mean: Optional[Sequence[float]] = None, std: Optional[Sequence[float]] = None):
    """The model's first input made from ``image``.

    The image is converted to the metadata's color space (RGB, or grayscale
    for a 1-channel input), resized to the input's height and width
    (bilinear, aspect ratio not kept: the picture is stretched, as MediaPipe's
    and TFLite Support's image preprocessing does for these models), and
    normalized ``(pixel - mean) / std`` per channel (pixels in 0..255).

    Args:
        model: a :class:`fbjax.Model` whose first input is NHWC
            ``[1, H, W, 1 or 3]``.
        image: a Pillow image (:func:`load_image`) or a path.
        mean, std: one value or one per channel; override the metadata's
            ``NormalizationOptions``. Required for a float input when the
            file has no metadata.

    Returns:
        ``(x, how)``: ``x`` the input array ``[1, H, W, C]`` in the input's
        dtype, ``how`` a one-line description of what was done.

    Raises:
        InputError: the model's input is not an image, or a float input with
            neither metadata nor ``mean``/``std`` (the message gives the
            flags to pass).
    """
    spec, shape = _image_spec(model)
    if not hasattr(image, "resize"):
        image = load_image(image)
    _, h, w, c = shape
    md = getattr(model, "metadata", None)
    tm = md.inputs[0] if md is not None and md.inputs else None
    img = image.convert("L" if c == 1 else "RGB").resize((int(w), int(h)), resample=_bilinear())
    px = np.asarray(img, np.float32).reshape(1, int(h), int(w), int(c))
    dtype = np.dtype(spec.dtype)
    src = "the file's metadata"
    if mean is None and std is None and tm is not None:
        mean, std = tm.mean, tm.std
    elif mean is not None or std is not None:
        src = "--mean/--std"
    if mean is None and std is None:
        if dtype == np.uint8:
            return px.astype(np.uint8), f"resized to {w}x{h}, uint8 pixels as they are (no normalization)"
        raise InputError(
            f"the model has no TFLite metadata saying how to normalize its {dtype.name} input "
            f"{spec.name!r}: pass --mean and --std (pixels are 0..255), e.g. `--mean 0 --std 255` for an input "
            "in [0, 1], `--mean 127.5 --std 127.5` for [-1, 1]")
    mean = np.asarray([0.0] if mean is None else mean, np.float32)
    std = np.asarray([1.0] if std is None else std, np.float32)
    for name, v in (("mean", mean), ("std", std)):
        if v.size not in (1, int(c)):
            raise InputError(f"{name} has {v.size} values; the input has {c} channels (give 1 or {c})")
    if np.any(std == 0):
        raise InputError("std must not be 0")
    x = (px - mean) / std
    how = f"resized to {w}x{h}, normalized (x - {_fmt(mean)}) / {_fmt(std)} from {src}"
    q = model.input_quantization[0] if getattr(model, "input_quantization", None) else None
    if dtype.kind in "iu":
        if q is None:
            return np.clip(np.round(x), np.iinfo(dtype).min, np.iinfo(dtype).max).astype(dtype), how
        info = np.iinfo(dtype)
        xq = np.round(x / float(q.scale[0])) + int(q.zero_point[0])
        return np.clip(xq, info.min, info.max).astype(dtype), how + ", quantized with the input's scale"
    return x.astype(dtype), how


def _bilinear():
    from PIL import Image

    return getattr(Image, "Resampling", Image).BILINEAR


def _fmt(v) -> str:
    v = np.asarray(v).ravel()
    if v.size == 1 or np.all(v == v[0]):
        return f"{float(v[0]):g}"
    return "[" + ", ".join(f"{float(x):g}" for x in v) + "]"


# --- what the outputs mean -----------------------------------------------------

@dataclasses.dataclass
class Result:
    """What :func:`interpret` found in a model's outputs.

    Attributes:
        lines: text to print (top-k classes, detections...).
        boxes: ``[(x0, y0, x1, y1, label, score)]`` in 0..1 of the image.
        keypoints: ``[(x, y)]`` in 0..1 (detector keypoints).
        landmarks: ``[(x, y)]`` in 0..1.
        mask: ``[H, W]`` float in 0..1 (foreground probability) or int class
            map, or None.
        kind: ``"classifier"``, ``"detector"``, ``"segmenter"``,
            ``"landmarks"`` or ``"unknown"`` (the main one found).
        classes: ``[(label, score)]``, the best classes of the first
            classifier output, best first (drawn as text).
        layout: the :class:`LandmarkLayout` the outputs were read with, or
            None.
        presence: that model's presence probability (None: it has none).
        found: whether the landmark model says its subject is there (None:
            not a landmark model with a presence score); when False,
            ``landmarks`` is empty.
    """

    lines: list = dataclasses.field(default_factory=list)
    boxes: list = dataclasses.field(default_factory=list)
    keypoints: list = dataclasses.field(default_factory=list)
    landmarks: list = dataclasses.field(default_factory=list)
    mask: Optional[np.ndarray] = None
    mask_labels: Optional[list] = None
    kind: str = "unknown"
    classes: list = dataclasses.field(default_factory=list)
    layout: Optional[LandmarkLayout] = None
    presence: Optional[float] = None
    found: Optional[bool] = None


def ssd_anchors(size: tuple, count: int):
    """The MediaPipe SSD anchor centres for an input of ``size = (H, W)``
    whose detector outputs ``count`` anchors, or None when no layout of
    :data:`SSD_LAYOUTS` gives that count.

    Returns:
        ``(name, anchors)``: the layout's name and ``[count, 2]`` float32
        anchor centres ``(x, y)`` in 0..1 (anchor width and height are 1).
    """
    h, w = size
    for name, (strides, per) in SSD_LAYOUTS.items():
        centres = []
        i = 0
        while i < len(strides):
            j = i
            while j < len(strides) and strides[j] == strides[i]:
                j += 1
            n_per = per * (j - i)
            fh, fw = math.ceil(h / strides[i]), math.ceil(w / strides[i])
            ys, xs = np.meshgrid((np.arange(fh) + 0.5) / fh, (np.arange(fw) + 0.5) / fw, indexing="ij")
            cell = np.stack([xs.ravel(), ys.ravel()], -1)
            centres.append(np.repeat(cell, n_per, axis=0))
            i = j
        a = np.concatenate(centres).astype(np.float32)
        if len(a) == count:
            return name, a
    return None


def decode_ssd(raw: np.ndarray, logits: np.ndarray, anchors: np.ndarray, size: tuple, *,
               threshold: float = 0.5, iou: float = 0.3):
    """Decode MediaPipe single-shot detector outputs (see the module docstring).

    Args:
        raw: ``[N, 4 + 2K]`` float: per anchor x/y centre offsets, width,
            height, then K keypoints (x, y), in input pixels.
        logits: ``[N]`` score logits.
        anchors: ``[N, 2]`` from :func:`ssd_anchors`.
        size: the input's ``(H, W)`` (the decoding scale).
        threshold: minimum score (after the sigmoid).
        iou: weighted non-maximum suppression overlap.

    Returns:
        list of ``(score, (x0, y0, x1, y1), [(kx, ky), ...])`` in 0..1,
        best first.
    """
    h, w = size
    scale = np.array([w, h], np.float32)
    scores = 1.0 / (1.0 + np.exp(-np.clip(logits.astype(np.float64), -100, 100)))
    centre = raw[:, :2] / scale + anchors
    wh = raw[:, 2:4] / scale
    boxes = np.concatenate([centre - wh / 2, centre + wh / 2], -1)
    kps = raw[:, 4:].reshape(len(raw), -1, 2) / scale + anchors[:, None, :]
    order = [i for i in np.argsort(-scores) if scores[i] >= threshold]
    out = []
    while order:
        best = order[0]
        ious = _iou(boxes[best], boxes[order])
        group = [order[k] for k in range(len(order)) if ious[k] > iou]
        wts = scores[group][:, None]
        box = (boxes[group] * wts).sum(0) / wts.sum()  # weighted: MediaPipe's WEIGHTED algorithm
        kp = (kps[group] * wts[:, :, None]).sum(0) / wts.sum()
        out.append((float(scores[best]), tuple(float(v) for v in box), [tuple(map(float, p)) for p in kp]))
        order = [i for i in order if i not in group]
    return out


def _iou(a, b):
    x0 = np.maximum(a[0], b[:, 0])
    y0 = np.maximum(a[1], b[:, 1])
    x1 = np.minimum(a[2], b[:, 2])
    y1 = np.minimum(a[3], b[:, 3])
    inter = np.clip(x1 - x0, 0, None) * np.clip(y1 - y0, 0, None)
    area = lambda r: np.clip(r[..., 2] - r[..., 0], 0, None) * np.clip(r[..., 3] - r[..., 1], 0, None)  # noqa: E731
    return inter / np.maximum(area(a) + area(b) - inter, 1e-12)


def interpret(model, outputs: Sequence[np.ndarray], *, top_k: int = 5, threshold: float = 0.5,
              locale: Optional[str] = None) -> Result:
    """Read a vision model's outputs as classes, boxes, a mask or landmarks.

    Per output, in this order of evidence: metadata labels whose count
    equals the output's size (class scores: the ``top_k`` best; a one-value
    output with two labels: a binary score); a metadata
    ``BoundingBoxProperties`` output (with the detector's class and score
    outputs beside it); a MediaPipe detector pair (``[1, N, 4 + 2K]`` and
    ``[1, N, 1]`` with ``N`` one of :data:`SSD_LAYOUTS`); an image-shaped
    output (``[1, H, W, C]`` with H, W at least a quarter of the input's:
    a mask, C = 1 probability or argmax over C classes); all outputs
    together matching one of :data:`LANDMARK_LAYOUTS` (a MediaPipe face
    mesh, hand or iris model: landmarks kept only when the model's presence
    score is above ``threshold``, the score printed as ``face presence
    0.0038``, and a line on the crop the model expects); a vector of 3K
    values (K >= 5) named neither "world" nor "score": landmarks (x, y, z)
    in input pixels.

    Args:
        model: the :class:`fbjax.Model` (its inputs' size and metadata).
        outputs: its outputs for one image (numpy, batch 1).
        top_k: classes printed per classifier output.
        threshold: minimum detection score; a landmark model's presence
            score must be above it (MediaPipe's graphs use 0.5).
        locale: label locale (default: the first label file).

    Returns:
        :class:`Result`.
    """
    res = Result()
    outs = [np.asarray(o) for o in outputs]
    md = getattr(model, "metadata", None)
    tms = md.outputs if md is not None and len(md.outputs) == len(outs) else [None] * len(outs)
    _, (_, ih, iw, _) = _image_spec(model)
    bad = next(((i, tm) for i, (tm, o) in enumerate(zip(tms, outs)) if tm is not None and not _fits(tm, o)), None)
    if bad is not None:  # e.g. MediaPipe's hand_landmark_lite lists its outputs in another order than the graph
        i, tm = bad
        res.lines.append(f"(the metadata's output list does not match the model's outputs: its output {i} "
                         f"{tm.name!r} cannot describe {model.outputs[i].name!r} of shape {list(outs[i].shape)}; "
                         "its names and labels are not used)")
        tms = [None] * len(outs)
    names = [(tm.name if tm is not None and tm.name else spec.name) or f"output {i}"
             for i, (tm, spec) in enumerate(zip(tms, model.outputs))]
    used = set()
    # post-processed detector (metadata BoundingBoxProperties)
    for i, tm in enumerate(tms):
        if tm is None or tm.bounding_box is None:
            continue
        res.kind = "detector"
        used.add(i)
        boxes = outs[i].reshape(-1, outs[i].shape[-1])
        idx = tm.bounding_box.index
        cls_i = next((j for j, t in enumerate(tms) if t is not None and t.value_labels and j != i), None)
        score_i = next((j for j, t in enumerate(tms) if j not in (i, cls_i) and t is not None
                        and t.name and "score" in t.name.lower()), None)
        cnt_i = next((j for j, t in enumerate(tms) if j not in (i, cls_i, score_i) and outs[j].size == 1), None)
        used.update(j for j in (cls_i, score_i, cnt_i) if j is not None)
        scores = outs[score_i].ravel() if score_i is not None else np.ones(len(boxes))
        n = int(outs[cnt_i].ravel()[0]) if cnt_i is not None else len(boxes)
        labels = tms[cls_i].value_labels.get(locale) or next(iter(tms[cls_i].value_labels.values())) \
            if cls_i is not None else None
        thr = tm.score_threshold if tm.score_threshold is not None else threshold
        for k in range(min(n, len(boxes))):
            if scores[k] < thr:
                continue
            v = boxes[k][list(idx)]
            if tm.bounding_box.type == "UPPER_LEFT":
                v = np.array([v[0], v[1], v[0] + v[2], v[1] + v[3]])
            elif tm.bounding_box.type == "CENTER":
                v = np.array([v[0] - v[2] / 2, v[1] - v[3] / 2, v[0] + v[2] / 2, v[1] + v[3] / 2])
            if tm.bounding_box.coordinate_type == "PIXEL":
                v = v / np.array([iw, ih, iw, ih], np.float32)
            c = int(outs[cls_i].ravel()[k]) if cls_i is not None else -1
            label = labels[c] if labels is not None and 0 <= c < len(labels) else (str(c) if c >= 0 else "")
            res.boxes.append((*map(float, v), label, float(scores[k])))
        res.lines.append(f"{names[i]}: {len(res.boxes)} box(es) with score >= {thr:g}")
        res.lines += [f"  {b[4] or 'box'} {b[5]:.3f} at x {b[0]:.3f}..{b[2]:.3f}, y {b[1]:.3f}..{b[3]:.3f} "
                      "(fractions of the image)" for b in res.boxes]
    # MediaPipe raw SSD outputs
    for i, o in enumerate(outs):
        if i in used or o.ndim != 3 or o.shape[0] != 1 or o.shape[2] < 4 or o.shape[2] % 2:
            continue
        j = next((j for j, s in enumerate(outs) if j != i and j not in used and s.shape == (1, o.shape[1], 1)), None)
        if j is None:
            continue
        found = ssd_anchors((ih, iw), o.shape[1])
        if found is None:
            res.lines.append(f"{names[i]}: {o.shape[1]} raw boxes, but no known MediaPipe anchor layout has "
                             f"{o.shape[1]} anchors at {iw}x{ih}; scores not decoded into boxes")
            continue
        layout, anchors = found
        used.update((i, j))
        dets = decode_ssd(o[0], outs[j][0, :, 0], anchors, (ih, iw), threshold=threshold)
        res.kind = "detector"
        # the layout's name lists every MediaPipe graph using it: name only the one of this size and count
        graph = next((g for g, gh, gw, n in re.findall(r"(\w+) (\d+)x(\d+): (\d+)", layout)
                      if (int(gh), int(gw), int(n)) == (ih, iw, o.shape[1])), None)
        how = (f"MediaPipe {graph}'s SSD anchors ({layout.split(' (')[0]})" if graph
               else f"the SSD anchors of {layout}")
        res.lines.append(f"{names[i]} + {names[j]}: {len(dets)} detection(s) with score >= {threshold:g} "
                         f"(decoded with {how}; weighted NMS at IoU 0.3)")
        for s, b, kps in dets:
            res.boxes.append((*b, "", s))
            res.keypoints += kps
            res.lines.append(f"  {s:.3f} at x {b[0]:.3f}..{b[2]:.3f}, y {b[1]:.3f}..{b[3]:.3f} "
                             f"(fractions of the image), {len(kps)} keypoints")
    # classifiers (labels from metadata)
    for i, (o, tm) in enumerate(zip(outs, tms)):
        if i in used or tm is None or not tm.labels:
            continue
        labels = tm.label_list(locale) or tm.label_list()
        if o.size == len(labels) and o.ndim <= 2:
            used.add(i)
            res.kind = "classifier" if res.kind == "unknown" else res.kind
            s = o.ravel().astype(np.float64)
            best = np.argsort(-s)[:top_k]
            res.lines.append(f"{names[i]}: top {len(best)} of {len(labels)}")
            res.lines += [f"  {s[k]:.4f}  {labels[k]}" for k in best]
            if not res.classes:
                res.classes = [(labels[k], float(s[k])) for k in best]
        elif o.size == 1 and len(labels) == 2:
            used.add(i)
            p = float(o.ravel()[0])
            # MediaPipe's binary classification (TensorsToClassificationCalculator): the one score is
            # the first label's, the second label gets 1 - score
            res.lines.append(f"{names[i]}: {labels[0]} {p:.4f}, {labels[1]} {1 - p:.4f} (one score for two "
                             f"labels, read as MediaPipe does: the first label's probability)")
            if not res.classes:
                res.classes = sorted([(labels[0], p), (labels[1], 1 - p)], key=lambda c: -c[1])
    # segmentation masks
    for i, o in enumerate(outs):
        if i in used or o.ndim != 4 or o.shape[0] != 1 or o.shape[1] * 4 < ih or o.shape[2] * 4 < iw:
            continue
        used.add(i)
        tm = tms[i]
        res.kind = "segmenter" if res.kind == "unknown" else res.kind
        if o.shape[3] == 1:
            res.mask = np.clip(o[0, :, :, 0].astype(np.float32), 0, 1)
            label = (tm.label_list(locale) or [None])[0] if tm is not None and tm.labels else None
            res.lines.append(f"{names[i]}: mask {o.shape[1]}x{o.shape[2]}, > 0.5 on {float((res.mask > 0.5).mean()):.1%} "
                             "of the image" + (f" ({label})" if label else ""))
        else:
            res.mask = np.argmax(o[0], -1)
            res.mask_labels = tm.label_list(locale) if tm is not None and tm.labels else None
            counts = np.bincount(res.mask.ravel(), minlength=o.shape[3]) / res.mask.size
            top = np.argsort(-counts)[:top_k]
            lab = res.mask_labels or [str(k) for k in range(o.shape[3])]
            res.lines.append(f"{names[i]}: {o.shape[3]}-class mask {o.shape[1]}x{o.shape[2]}: "
                             + ", ".join(f"{lab[k] if k < len(lab) else k} {counts[k]:.1%}" for k in top))
        break
    # MediaPipe landmark models: their own presence score says whether to keep the points
    layout = next((lay for lay in LANDMARK_LAYOUTS if tuple(o.size for o in outs) == lay.sizes), None)
    if layout is not None and not used:
        _read_landmark_layout(res, layout, outs, names, (ih, iw), threshold)
        used.update(range(len(outs)))
    # landmarks
    for i, o in enumerate(outs):
        name = names[i].lower()
        if i in used or o.size % 3 or o.size < 15 or "world" in name or "score" in name or o.ndim > 4:
            continue
        if o.ndim == 4 and (o.shape[1] > 1 or o.shape[2] > 1):
            continue
        if float(np.abs(o).max()) <= 2.0:  # not input pixels (world coordinates in metres, or normalized)
            res.lines.append(f"{names[i]}: {o.size // 3} points (x, y, z) within +-2: not input pixels "
                             "(world coordinates?), not drawn")
            used.add(i)
            continue
        pts = o.reshape(-1, 3)[:, :2] / np.array([iw, ih], np.float32)
        used.add(i)
        res.kind = "landmarks" if res.kind == "unknown" else res.kind
        res.landmarks += [tuple(map(float, p)) for p in pts]
        res.lines.append(f"{names[i]}: {len(pts)} landmarks (x, y, z in input pixels), x {pts[:, 0].min():.3f}.."
                         f"{pts[:, 0].max():.3f}, y {pts[:, 1].min():.3f}..{pts[:, 1].max():.3f} (fractions of the image)")
    for i, o in enumerate(outs):
        if i not in used and o.size <= 4:
            res.lines.append(f"{names[i]}: " + ", ".join(f"{float(v):.4f}" for v in o.ravel()))
    if not res.lines:
        res.lines.append("no classes, boxes, mask or landmarks recognised in the outputs (see the summaries above)")
    return res


def _read_landmark_layout(res: Result, layout: LandmarkLayout, outs, names, size, threshold: float) -> None:
    """Fill ``res`` from a MediaPipe landmark model's outputs read as ``layout`` says."""
    ih, iw = size
    res.kind, res.layout = "landmarks", layout
    n = {i: outs[i].size // 3 for i in layout.landmarks}
    if layout.presence is not None:
        raw = float(outs[layout.presence].ravel()[0])
        p = 1.0 / (1.0 + math.exp(-min(max(raw, -100.0), 100.0))) if layout.presence_is_logit else raw
        how = (f"sigmoid of {names[layout.presence]} = {raw:.4f}" if layout.presence_is_logit
               else names[layout.presence])
        res.presence, res.found = p, p > threshold
        verdict = (f"a {layout.subject} found" if res.found else
                   f"no {layout.subject} found: its {' and '.join(f'{n[i]} {w}' for i, w in layout.landmarks.items())}"
                   " are not drawn (MediaPipe drops them too)")
        res.lines.append(f"{layout.subject} presence {p:.4f} ({how}; present above {threshold:g}): {verdict}")
    if res.found is not False:
        if layout.handedness is not None:
            h = float(outs[layout.handedness].ravel()[0])
            a, b = layout.labels
            res.lines.append(f"handedness: {a} {h:.4f}, {b} {1 - h:.4f} ({names[layout.handedness]}: the first "
                             "label's probability; MediaPipe names the hand as seen in a mirrored, selfie-camera "
                             "picture)")
        for i, what in layout.landmarks.items():
            pts = outs[i].reshape(-1, 3)[:, :2] / np.array([iw, ih], np.float32)
            res.landmarks += [tuple(map(float, q)) for q in pts]
            res.lines.append(f"{what} ({names[i]}): {len(pts)} points (x, y, z in input pixels), x "
                             f"{pts[:, 0].min():.3f}..{pts[:, 0].max():.3f}, y {pts[:, 1].min():.3f}.."
                             f"{pts[:, 1].max():.3f} (fractions of the image)")
        if layout.world is not None:
            res.lines.append(f"world landmarks ({names[layout.world]}): {outs[layout.world].size // 3} points in "
                             f"metres around the {layout.subject}'s centre, not drawn")
    res.lines.append(f"this model expects {layout.crop}")
    res.lines.append(f"(outputs read as in MediaPipe's {layout.source})")


def _fits(tm, o) -> bool:
    """Whether metadata entry ``tm`` can describe output array ``o``."""
    labels = tm.label_list()
    if labels and not (o.size == len(labels) or (o.size == 1 and len(labels) == 2) or o.ndim == 4):
        return False
    if tm.content == "bounding_box" and o.shape[-1] < 4:
        return False
    return True


_PALETTE = [(255, 220, 0), (0, 230, 230), (255, 64, 255), (64, 255, 64), (255, 128, 0), (64, 128, 255),
            (255, 64, 64), (160, 160, 160)]


def draw_overlay(image, result: Result, path) -> None:
    """Write ``image`` with ``result`` drawn on it as a PNG at ``path``: the
    mask tinted (a probability mask green where > 0.5, blended by its value;
    a class map in one colour per class), boxes with their label and score,
    detector keypoints as dots, landmarks as small dots, the best classes
    as text in the top-left corner. Text is sized to the image (a line is
    about 1/20 of its shorter side, at least 12 pixels) on a dark
    half-transparent band. Nothing is drawn for a landmark model that found
    nothing (``result.found`` False).

    Raises:
        InputError: Pillow is missing.
    """
    try:
        from PIL import Image, ImageDraw
    except ImportError:
        raise InputError("drawing overlays needs Pillow: pip install 'fbjax[image]'") from None
    base = image.convert("RGB")
    W, H = base.size
    if result.mask is not None:
        m = result.mask
        if np.issubdtype(m.dtype, np.floating):
            alpha = Image.fromarray((np.clip(m, 0, 1) * 140).astype(np.uint8)).resize((W, H), _bilinear())
            tint = Image.new("RGB", (W, H), (40, 230, 120))
            base = Image.composite(tint, base, alpha)
        else:
            pal = np.array(_PALETTE, np.uint8)[m % len(_PALETTE)]
            col = Image.fromarray(pal).resize((W, H), Image.NEAREST)
            base = Image.blend(base, col, 0.45)
    d = ImageDraw.Draw(base)
    lw = max(2, round(min(W, H) / 150))
    texts = []  # (x, y, text, colour, above): drawn last, on their bands
    for k, (x0, y0, x1, y1, label, score) in enumerate(result.boxes):
        c = _PALETTE[k % len(_PALETTE)]
        d.rectangle([x0 * W, y0 * H, x1 * W, y1 * H], outline=c, width=lw)
        texts.append((x0 * W, y0 * H, f"{label} {score:.2f}".strip(), c, True))
    r = max(2, lw)
    for x, y in result.keypoints:
        d.ellipse([x * W - r, y * H - r, x * W + r, y * H + r], fill=(255, 255, 0), outline=(0, 0, 0))
    r2 = max(1, lw // 2)
    for x, y in result.landmarks:
        d.ellipse([x * W - r2, y * H - r2, x * W + r2, y * H + r2], fill=(0, 255, 120))
    if result.classes:
        texts.append((0, 0, "\n".join(f"{label} {score:.2f}" for label, score in result.classes), _PALETTE[0],
                      False))
    if texts:
        base = _draw_texts(base, texts)
    base.save(path, format="PNG")


def _font_size(size) -> int:
    """Text height in pixels for an image of ``size = (W, H)``: about 1/20 of its shorter side, at least 12."""
    return max(12, round(min(size) / 20))


def _draw_texts(base, texts):
    """``base`` with each ``(x, y, text, colour, above)`` written in the
    colour on a dark half-transparent band (Pillow's scalable default font)
    whose top-left corner is (x, y), or whose bottom-left corner is (x, y)
    when ``above`` and the band fits there (a box's label: above the box,
    not over what it boxes)."""
    from PIL import Image, ImageDraw, ImageFont

    size = _font_size(base.size)
    try:
        font = ImageFont.load_default(size=size)  # scalable since Pillow 10.1 (fbjax[image] requires it)
    except TypeError:  # an older Pillow: its one bitmap font, about 11 pixels high
        font = ImageFont.load_default()
    layer = Image.new("RGBA", base.size, (0, 0, 0, 0))
    d = ImageDraw.Draw(layer)
    pad = max(2, size // 4)
    for x, y, text, colour, above in texts:
        x, y = min(max(x, 0), base.size[0] - 1), min(max(y, 0), base.size[1] - 1)
        l, t, r, b = d.multiline_textbbox((x + pad, y + pad), text, font=font, spacing=pad)
        if above and y - (b + pad - y) >= 0:
            y -= b + pad - y
            l, t, r, b = d.multiline_textbbox((x + pad, y + pad), text, font=font, spacing=pad)
        d.rectangle([x, y, r + pad, b + pad], fill=(0, 0, 0, 170))
        d.multiline_text((x + pad, y + pad), text, font=font, fill=(*colour, 255), spacing=pad)
    return Image.alpha_composite(base.convert("RGBA"), layer).convert("RGB")
