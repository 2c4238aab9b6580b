"""``fbjax run MODEL --image PHOTO [--overlay OUT.png]`` (issue 28 item 2).

Pictures are drawn here (fbjax.data.synthetic_person, flat colours), never
downloaded; expected values come from the fixtures' construction
(tools/record_tflite_metadata.py: the classifier's weights, the detector's
boxes) or from the drawn figure's geometry, not from fbjax's output.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fbjax
from fbjax.cli import main
from fbjax.data import DEFAULT_MODEL, synthetic_person
from fbjax.errors import InputError
from fbjax.formats.tflite_builder import single_op_model
from fbjax.vision import interpret, preprocess, ssd_anchors

from conftest import SHARED_MISSING_REASON, TFLITE_MODELS

DATA = Path(__file__).resolve().parent / "data" / "metadata"


def _flat(tmp_path, rgb, name="flat.png", size=(40, 30)):
    p = tmp_path / name
    Image.new("RGB", size, rgb).save(p)
    return p


def _person(tmp_path, size=512):
    img, figure = synthetic_person(size)
    p = tmp_path / "person.png"
    Image.fromarray(np.round(img * 255).astype(np.uint8)).save(p)
    return p, figure


def test_classifier_prints_top_labels(tmp_path, capsys):
    photo = _flat(tmp_path, (255, 0, 0))
    assert main(["run", str(DATA / "color_classifier.tflite"), "--image", str(photo), "--repeat", "0"]) == 0
    out = capsys.readouterr().out
    # the fixture: mean colour normalized (x - 127.5) / 127.5 = (1, -1, -1); logits (8 I - 2) m; softmax
    m = np.array([1.0, -1.0, -1.0])
    logits = (8 * np.eye(3) - 2) @ m
    p = np.exp(logits - logits.max())
    p /= p.sum()
    lines = out[out.index("probability: top 3 of 3"):].splitlines()
    assert lines[1].split() == [f"{p[0]:.4f}", "red"], out
    assert float(lines[2].split()[0]) == pytest.approx(p[1], abs=1e-4)
    assert main(["run", str(DATA / "color_classifier.tflite"), "--image", str(photo), "--repeat", "0",
                 "--locale", "fr", "--top-k", "1"]) == 0
    out = capsys.readouterr().out
    assert "top 1 of 3" in out and out.split("top 1 of 3")[1].split()[1] == "rouge"


def test_preprocess_follows_metadata_and_flags(tmp_path):
    m = fbjax.load(DATA / "color_classifier.tflite")
    img = Image.open(_flat(tmp_path, (255, 0, 51)))
    x, how = preprocess(m, img)
    assert x.shape == (1, 16, 16, 3) and x.dtype == np.float32
    np.testing.assert_allclose(x[0, 0, 0], (np.array([255, 0, 51]) - 127.5) / 127.5, rtol=1e-6)
    x, how = preprocess(m, img, mean=[0, 0, 0], std=[255, 1, 51])
    np.testing.assert_allclose(x[0, 3, 5], [1, 0, 1], rtol=1e-6)
    assert "--mean/--std" in how


def test_no_metadata_says_which_flags(tmp_path):
    model_path = tmp_path / "relu.tflite"
    model_path.write_bytes(single_op_model("RELU", [(1, 8, 8, 3)]))
    m = fbjax.load(model_path)
    with pytest.raises(InputError, match="--mean and --std"):
        preprocess(m, Image.open(_flat(tmp_path, (1, 2, 3))))
    with pytest.raises(SystemExit, match="--mean 0 --std 255"):
        main(["run", str(model_path), "--image", str(_flat(tmp_path, (1, 2, 3))), "--repeat", "0"])
    x, _ = preprocess(m, Image.open(_flat(tmp_path, (51, 102, 255))), mean=[0], std=[255])
    np.testing.assert_allclose(x[0, 0, 0], [0.2, 0.4, 1.0], rtol=1e-6)


def test_detector_overlay_boxes(tmp_path, capsys):
    """two_box_detector: boxes fixed at the left and right halves; the blue one scores sigmoid(12 - 6 - 6 * 0)."""
    photo = _flat(tmp_path, (0, 0, 255), size=(200, 100))
    out_png = tmp_path / "det.png"
    assert main(["run", str(DATA / "two_box_detector.tflite"), "--image", str(photo), "--overlay", str(out_png),
                 "--repeat", "0"]) == 0
    out = capsys.readouterr().out
    assert "1 box(es) with score >= 0.5" in out and "blue thing" in out and "red thing" not in out
    pic = np.asarray(Image.open(out_png).convert("RGB"))
    assert pic.shape == (100, 200, 3)
    # the right box (ymin 0.1, xmin 0.55, ymax 0.9, xmax 0.95) is outlined: its left edge is not the photo's blue
    assert tuple(pic[50, 111]) != (0, 0, 255)
    assert tuple(pic[50, 60]) == (0, 0, 255)  # inside the left half: no box drawn


def test_segmenter_overlay(tmp_path, capsys):
    photo, figure = _person(tmp_path, 256)
    out_png = tmp_path / "seg.png"
    assert main(["run", DEFAULT_MODEL, "--image", str(photo), "--overlay", str(out_png), "--repeat", "0"]) == 0
    out = capsys.readouterr().out
    assert "segmentation_masks: mask 256x256" in out and "(selfie)" in out
    before = np.asarray(Image.open(photo).convert("RGB")).astype(int)
    after = np.asarray(Image.open(out_png).convert("RGB")).astype(int)
    changed = np.abs(after - before).sum(-1) > 30  # tinted where the mask says person
    iou = (changed & figure).sum() / (changed | figure).sum()
    assert iou > 0.9, iou


def test_ssd_anchor_layouts():
    # counts from MediaPipe's graphs (num_boxes of their SsdAnchorsCalculator options)
    for size, n in (((128, 128), 896), ((192, 192), 2304), ((192, 192), 2016), ((224, 224), 2254),
                    ((256, 256), 896)):
        name, a = ssd_anchors(size, n)
        assert a.shape == (n, 2) and a.min() > 0 and a.max() < 1
    _, a = ssd_anchors((128, 128), 896)
    np.testing.assert_allclose(a[:2], [[0.5 / 16, 0.5 / 16]] * 2)  # first cell of the 16x16 map, 2 anchors
    np.testing.assert_allclose(a[512], [0.5 / 8, 0.5 / 8])  # the 8x8 map starts after 16 * 16 * 2
    assert ssd_anchors((128, 128), 897) is None


def test_face_detector_finds_the_drawn_face(tmp_path, capsys):
    path = TFLITE_MODELS / "mediapipe_face_detection_short_range.tflite"
    if not path.is_file():
        pytest.skip(SHARED_MISSING_REASON)
    photo, _ = _person(tmp_path, 512)
    m = fbjax.load(path)
    x, _ = preprocess(m, Image.open(photo))
    res = interpret(m, [np.asarray(o) for o in m(x)])
    assert res.kind == "detector" and len(res.boxes) == 1, res.lines
    x0, y0, x1, y1, _, score = res.boxes[0]
    # the drawn head: an ellipse centred (128, 80) of 256, half-axes 34 x 42
    assert x0 < 128 / 256 < x1 and y0 < 80 / 256 < y1
    assert 0.5 * 68 / 256 < x1 - x0 < 2 * 68 / 256
    eyes = res.keypoints[:2]  # MediaPipe's face keypoints start with the two eyes, drawn at (108, 78), (148, 78)
    for (kx, ky), ex in zip(sorted(eyes), (108, 148)):
        assert abs(kx * 256 - ex) < 12 and abs(ky * 256 - 78) < 12


def test_multiclass_segmenter_overlay(tmp_path, capsys):
    """color_segmenter: per pixel softmax of (12 I - 6) rgb; thirds of pure red, green, blue are classes 0, 1, 2."""
    from fbjax.vision import _PALETTE

    photo = tmp_path / "thirds.png"
    pic = np.zeros((32, 96, 3), np.uint8)
    for k in range(3):
        pic[:, 32 * k:32 * (k + 1), k] = 255
    Image.fromarray(pic).save(photo)
    out_png = tmp_path / "seg3.png"
    assert main(["run", str(DATA / "color_segmenter.tflite"), "--image", str(photo), "--overlay", str(out_png),
                 "--repeat", "0"]) == 0
    out = capsys.readouterr().out
    assert "3-class mask 32x32" in out and "red 3" in out and "blue 3" in out, out
    got = np.asarray(Image.open(out_png).convert("RGB")).astype(float)
    for k in range(3):  # the middle of each third: the photo blended 0.45 with class k's colour
        want = (1 - 0.45) * pic[16, 32 * k + 16] + 0.45 * np.array(_PALETTE[k])
        np.testing.assert_allclose(got[16, 32 * k + 16], want, atol=1.5)
