"""MediaPipe Tasks vision bundles (``.task``; issue 28 item 3).

``tests/data/tasks/*.task`` were made by MediaPipe's own bundling code
(``model_asset_bundle_utils.create_model_asset_bundle``, mediapipe wheel) in
``tools/make_task_fixtures.py``; ``bundles.json`` records their members as
:mod:`zipfile` read them there.
"""

from __future__ import annotations

import hashlib
import io
import json
import struct
import zipfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fbjax
from fbjax.cli import main
from fbjax.errors import InputError, ModelFormatError
from fbjax.formats.vision_task import VisionTaskBundle, is_vision_task, write_vision_task

from conftest import SHARED_MISSING_REASON, TFLITE_MODELS

HERE = Path(__file__).resolve().parent
TASKS = HERE / "data" / "tasks"
META = HERE / "data" / "metadata"
RECORD = json.loads((TASKS / "bundles.json").read_text())


def _data_offsets(data: bytes) -> dict:
    """member -> offset of its stored bytes, from the local headers."""
    out = {}
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        for i in z.infolist():
            nlen, elen = struct.unpack("<HH", data[i.header_offset + 26:i.header_offset + 30])
            out[i.filename] = i.header_offset + 30 + nlen + elen
    return out


@pytest.mark.parametrize("name", sorted(RECORD))
def test_members_as_mediapipe_wrote_them(name):
    b = fbjax.load(TASKS / name)
    assert isinstance(b, VisionTaskBundle)
    rec = RECORD[name]
    assert b.names == rec["members"]
    for m in b.names:
        assert hashlib.sha256(b.member_bytes(m)).hexdigest() == rec["sha256"][m], m


def test_member_is_a_normal_model():
    b = fbjax.load(TASKS / "tiny_vision.task")
    m = b["classifier.tflite"]
    ref = fbjax.load(META / "color_classifier.tflite")  # the file MediaPipe bundled
    x = np.random.default_rng(0).uniform(-1, 1, (1, 16, 16, 3)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(m(x)), np.asarray(ref(x)))  # same file, same program: same bits
    assert m.metadata.outputs[0].labels["fr"] == ["rouge", "vert", "bleu"]
    assert b.metadata("detector.tflite").outputs[0].bounding_box.type == "BOUNDARIES"
    with pytest.raises(KeyError, match="classifier.tflite, detector.tflite"):
        b["nope.tflite"]


def test_fine_tune_and_save_back(tmp_path):
    b = fbjax.load(TASKS / "tiny_vision.task")
    m = b["classifier.tflite"]
    x = np.zeros((1, 16, 16, 3), np.float32)
    x[..., 2] = 1.0  # blue
    target = np.array([[0.0, 1.0, 0.0]], np.float32)  # teach it to call blue "green"

    def loss(p):  # cross-entropy towards the target
        return -(target * jnp.log(m.apply(p, x) + 1e-9)).sum()

    before = float(loss(m.params))
    g = jax.grad(loss)(m.params)
    new_params = jax.tree_util.tree_map(lambda p, d: p - 0.5 * d, m.params, g)
    assert float(loss(new_params)) < before
    out = tmp_path / "tuned.task"
    b.save(out, {"classifier.tflite": m.save(params=new_params)})
    b2 = fbjax.load(out)
    assert b2.names == b.names
    assert b2.member_bytes("detector.tflite") == b.member_bytes("detector.tflite")  # the other member untouched
    m2 = b2["classifier.tflite"]
    assert float(loss(m2.params)) == pytest.approx(float(loss(new_params)), rel=1e-6)
    assert m2.metadata.outputs[0].labels == m.metadata.outputs[0].labels  # metadata and label zip kept
    data = out.read_bytes()
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        assert {i.compress_type for i in z.infolist()} == {zipfile.ZIP_STORED}
        old = {i.filename: i.date_time for i in zipfile.ZipFile(TASKS / "tiny_vision.task").infolist()}
        assert {i.filename: i.date_time for i in z.infolist()} == old
    assert all(off % 4 == 0 for off in _data_offsets(data).values())  # aligned as MediaPipe's writer aligns


def test_save_unchanged_keeps_every_member():
    b = fbjax.load(TASKS / "nested.task")
    data = b.save()
    b2 = VisionTaskBundle(data)
    assert b2.names == b.names and all(b2.member_bytes(n) == b.member_bytes(n) for n in b.names)


def test_nested_bundle():
    outer = fbjax.load(TASKS / "nested.task")
    inner = outer["tiny_vision.task"]
    assert isinstance(inner, VisionTaskBundle) and inner.names == ["classifier.tflite", "detector.tflite"]
    det = inner["detector.tflite"]
    boxes, cats, scores, count = (np.asarray(o) for o in det(np.ones((1, 16, 16, 3), np.float32)))
    # the fixture's constant boxes (tools/record_tflite_metadata.py)
    np.testing.assert_array_equal(boxes, np.array([[[0.1, 0.05, 0.9, 0.45], [0.1, 0.55, 0.9, 0.95]]], np.float32))
    assert count.tolist() == [2.0]


def test_detection_is_specific(tmp_path):
    assert is_vision_task(TASKS / "tiny_vision.task")
    assert not is_vision_task(META / "color_classifier.tflite")  # a .tflite ending with a zip of label files
    llm = io.BytesIO()
    with zipfile.ZipFile(llm, "w") as z:  # MediaPipe LLM bundle layout: not a vision bundle
        z.writestr("TF_LITE_PREFILL_DECODE", b"x")
        z.writestr("TOKENIZER_MODEL", b"y")
        z.writestr("extra.tflite", b"z")
    assert not is_vision_task(llm.getvalue())
    plain = io.BytesIO()
    with zipfile.ZipFile(plain, "w") as z:
        z.writestr("readme.txt", b"hello")
    assert not is_vision_task(plain.getvalue())
    assert not is_vision_task(b"")
    (tmp_path / "d").mkdir()
    assert not is_vision_task(tmp_path / "d")


def test_damaged_members_and_bad_saves(tmp_path):
    data = write_vision_task([("a.tflite", b"not a model at all"), ("b.tflite", (META / "color_classifier.tflite").read_bytes())])
    b = fbjax.load(data)
    with pytest.raises(ModelFormatError):
        b["a.tflite"]
    assert b["b.tflite"].metadata.name == "Colour classifier"
    with pytest.raises(InputError, match="not a member"):
        b.save(None, {"c.tflite": b""})
    with pytest.raises(InputError, match="does not exist"):
        b.save(tmp_path / "no" / "x.task")


def test_cli_inspect_and_run(tmp_path, capsys):
    assert main(["inspect", str(TASKS / "tiny_vision.task")]) == 0
    out = capsys.readouterr().out
    assert "MediaPipe Tasks bundle: 2 member(s)" in out and "metadata: ObjectDetector" in out
    with pytest.raises(SystemExit, match="pick one with --member NAME"):
        main(["run", str(TASKS / "tiny_vision.task"), "--repeat", "0"])
    from PIL import Image

    Image.new("RGB", (20, 20), (0, 255, 0)).save(tmp_path / "g.png")
    assert main(["run", str(TASKS / "nested.task"), "--member", "tiny_vision.task/classifier.tflite",
                 "--image", str(tmp_path / "g.png"), "--repeat", "0"]) == 0
    out = capsys.readouterr().out
    assert out.split("top 3 of 3")[1].split()[1] == "green"


def test_face_bundle_from_shared_models(tmp_path):
    """The layout of MediaPipe's face_landmarker.task, built from ../shared: both members run as on their own."""
    det_p = TFLITE_MODELS / "mediapipe_face_detection_short_range.tflite"
    lm_p = TFLITE_MODELS / "mediapipe_face_landmark.tflite"
    if not (det_p.is_file() and lm_p.is_file()):
        pytest.skip(SHARED_MISSING_REASON)
    path = tmp_path / "face_landmarker.task"
    path.write_bytes(write_vision_task([("face_detector.tflite", det_p.read_bytes()),
                                   ("face_landmarks_detector.tflite", lm_p.read_bytes())]))
    b = fbjax.load(path)
    assert b.names == ["face_detector.tflite", "face_landmarks_detector.tflite"]
    assert b.metadata("face_detector.tflite").name == "Short Range Face Detection"
    for name, p in (("face_detector.tflite", det_p), ("face_landmarks_detector.tflite", lm_p)):
        m, ref = b[name], fbjax.load(p)
        x = np.random.default_rng(1).uniform(-1, 1, ref.inputs[0].shape).astype(np.float32)
        for a, r in zip(m(x), ref(x)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(r))
