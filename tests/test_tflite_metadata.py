"""TFLite metadata (issue 28 item 1): fbjax's reading equals TFLite Support's.

``tests/data/metadata/*.json`` were recorded by ``tools/record_tflite_metadata.py``
with TFLite Support 0.4.4's ``MetadataDisplayer`` (an independent reader: its
own generated bindings and flatc's JSON printer) for every ``../shared``
model that has metadata and for the committed fixtures (two models whose
metadata TFLite Support's writers wrote, and a MediaPipe wheel model).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
import io
from pathlib import Path

import numpy as np
import pytest

import fbjax
from fbjax.cli import main
from fbjax.errors import ModelFormatError
from fbjax.formats import read_model
from fbjax.formats.tflite_metadata import associated_zip_range

from conftest import SHARED_MISSING_REASON, TFLITE_MODELS

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "metadata"
RECORDS = sorted(DATA.glob("*.json"))
#: the recordings of ../shared models: every shared model with metadata (docs: shared/formats/tflite-metadata.md)
SHARED_WITH_METADATA = {"mediapipe_face_detection_full_range_sparse", "mediapipe_face_detection_short_range",
                        "mediapipe_face_landmark", "mediapipe_hand_landmark_lite", "mediapipe_pose_detection",
                        "mediapipe_selfie_segmentation"}
#: committed fixtures (missing = failure)
FIXTURES = {"color_classifier", "two_box_detector", "color_segmenter", "selfie_segmentation_landscape"}


def test_every_fixture_is_recorded():
    names = {p.stem for p in RECORDS}
    assert FIXTURES | SHARED_WITH_METADATA <= names, sorted(FIXTURES | SHARED_WITH_METADATA - names)
    for f in FIXTURES:
        assert (DATA / f"{f}.tflite").is_file(), f


def _model_path(rec: dict) -> Path:
    local = DATA / rec["model"]
    if local.is_file():
        return local
    if Path(rec["model"]).stem in FIXTURES:
        pytest.fail(f"fixture {local} is missing (tools/record_tflite_metadata.py makes it)")
    shared = TFLITE_MODELS / rec["model"]
    if not shared.is_file():
        pytest.skip(SHARED_MISSING_REASON)
    return shared


def _same(a, b, where="metadata"):
    """Equal trees; floats to the 6 significant digits flatc prints (its default precision)."""
    if isinstance(b, float) or isinstance(a, float):
        assert isinstance(a, (int, float)) and isinstance(b, (int, float)), where
        assert abs(a - b) <= 1e-6 * max(1.0, abs(b)), (where, a, b)
    elif isinstance(b, dict):
        assert isinstance(a, dict) and sorted(a) == sorted(b), (where, sorted(a), sorted(b))
        for k in b:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(b, list):
        assert isinstance(a, list) and len(a) == len(b), (where, a, b)
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


@pytest.mark.parametrize("record", RECORDS, ids=[p.stem for p in RECORDS])
def test_metadata_equals_tflite_support(record, capsys):
    rec = json.loads(record.read_text())
    path = _model_path(rec)
    data = path.read_bytes()
    assert hashlib.sha256(data).hexdigest() == rec["sha256"], f"{path} is not the file that was recorded"
    md = read_model(str(path)).metadata["tflite_metadata"]
    assert md is not None
    _same(md.as_dict(), rec["metadata"])
    assert main(["inspect", str(path), "--metadata-json"]) == 0  # what `fbjax inspect` shows
    _same(json.loads(capsys.readouterr().out), rec["metadata"])
    assert sorted(md.packed_files) == rec["packed_files"]
    for name, text in rec["files"].items():
        assert md.file(name) == text.encode("utf-8")
    # the convenience view agrees with the table
    sub = rec["metadata"]["subgraph_metadata"][0]
    for side, tensors in (("input_tensor_metadata", md.inputs), ("output_tensor_metadata", md.outputs)):
        assert [t.name for t in tensors] == [t.get("name") for t in sub.get(side, [])]
        for t, r in zip(tensors, sub.get(side, [])):
            for pu in r.get("process_units", []):
                if pu["options_type"] == "NormalizationOptions":
                    np.testing.assert_allclose(t.mean, pu["options"]["mean"], rtol=1e-6)
                    np.testing.assert_allclose(t.std, pu["options"]["std"], rtol=1e-6)
            for f in r.get("associated_files", []):
                if f["type"] == "TENSOR_AXIS_LABELS":
                    want = [ln for ln in rec["files"][f["name"]].split("\n")]
                    while want and not want[-1]:
                        want.pop()
                    assert t.labels[f.get("locale")] == want
    for key in ("name", "description", "version", "author", "license"):
        assert getattr(md, key) == rec["metadata"].get(key), key


WHEEL_RECORDS = sorted((DATA / "wheel").glob("*.json"))
WHEEL_DIR = os.environ.get("FBJAX_MEDIAPIPE_MODULES")


def test_wheel_records_present():
    assert len(WHEEL_RECORDS) == 10, [p.stem for p in WHEEL_RECORDS]  # the 0.10.14 wheel's models with metadata


@pytest.mark.parametrize("record", WHEEL_RECORDS, ids=[p.stem for p in WHEEL_RECORDS])
def test_wheel_model_metadata(record):
    """The mediapipe 0.10.14 wheel's models (not committed; up to 5 MB each):
    FBJAX_MEDIAPIPE_MODULES=<unzipped wheel>/mediapipe/modules runs these."""
    if not WHEEL_DIR:
        pytest.skip("set FBJAX_MEDIAPIPE_MODULES to the mediapipe 0.10.14 wheel's mediapipe/modules folder "
                    "(pip download mediapipe==0.10.14 --no-deps, unzip) to check its models' metadata")
    rec = json.loads(record.read_text())
    path = Path(WHEEL_DIR) / rec["model"]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == rec["sha256"], f"{path} is not the file recorded"
    md = read_model(str(path)).metadata["tflite_metadata"]
    _same(md.as_dict(), rec["metadata"])
    assert sorted(md.packed_files) == rec["packed_files"]
    for name, text in rec["files"].items():
        assert md.file(name) == text.encode("utf-8")


def test_classifier_fields():
    """The fields a user reads, on the fixture TFLite Support's writer made (values from the writer's call)."""
    m = fbjax.load(DATA / "color_classifier.tflite")
    md = m.metadata
    assert (md.name, md.version, md.author) == ("Colour classifier", "v1.2", "fbjax tests")
    (inp,) = md.inputs
    assert (inp.content, inp.color_space, inp.mean, inp.std) == ("image", "RGB", (127.5,), (127.5,))
    assert (inp.min, inp.max) == ((-1.0,), (1.0,))
    (out,) = md.outputs
    assert out.labels == {"en": ["red", "green", "blue"], "fr": ["rouge", "vert", "bleu"]}
    assert out.label_list() == ["red", "green", "blue"] and out.label_list("fr")[0] == "rouge"
    assert out.score_calibration == {"score_transformation": "LOG", "default_score": pytest.approx(0.2)}


def test_detector_bounding_box_semantics():
    md = fbjax.load(DATA / "two_box_detector.tflite").metadata
    loc = md.outputs[0]
    assert loc.content == "bounding_box" and loc.range == (2, 2)
    assert (loc.bounding_box.type, loc.bounding_box.index, loc.bounding_box.coordinate_type) == \
        ("BOUNDARIES", (1, 0, 3, 2), "RATIO")
    assert md.outputs[1].value_labels == {None: ["red thing", "blue thing"]}


def test_no_metadata_is_none():
    from fbjax.formats.tflite_builder import single_op_model

    m = fbjax.load(single_op_model("RELU", [(1, 4)]))
    assert m.metadata is None


def test_save_keeps_metadata_and_associated_files():
    path = DATA / "color_classifier.tflite"
    raw = path.read_bytes()
    m = fbjax.load(path)
    assert m.save() == raw  # unchanged: byte for byte
    new = m.save(params={"dense/kernel": np.asarray(m.params["dense/kernel"]) * 0.5})
    assert new != raw
    a, b = associated_zip_range(raw), associated_zip_range(new)
    assert raw[a[0]:] == new[b[0]:]  # the appended archive, byte for byte
    m2 = fbjax.load(new)
    assert m2.metadata.raw == m.metadata.raw
    assert m2.metadata.outputs[0].labels == m.metadata.outputs[0].labels
    with zipfile.ZipFile(io.BytesIO(new)) as z:  # what TFLite Support's readers do
        assert z.read("labels_fr.txt") == b"rouge\nvert\nbleu\n"
    np.testing.assert_allclose(np.asarray(m2.params["dense/kernel"]), np.asarray(m.params["dense/kernel"]) * 0.5)


def test_damaged_metadata_is_model_format_error():
    raw = bytearray((DATA / "color_classifier.tflite").read_bytes())
    md = read_model(bytes(raw)).metadata["tflite_metadata"].raw
    at = bytes(raw).find(md)
    assert at > 0
    raw[at + 4:at + 8] = b"\xff\xff\xff\x7f"  # an offset far outside the buffer
    raw[at:at + 4] = b"\xf0\xff\xff\x7f"  # the root offset too
    with pytest.raises(ModelFormatError, match="TFLITE_METADATA"):
        read_model(bytes(raw))


def test_inspect_prints_metadata():
    out = subprocess.run([sys.executable, "-m", "fbjax", "inspect", str(DATA / "color_classifier.tflite")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "metadata: Colour classifier" in out.stdout
    assert "normalize (x - 127.5) / 127.5" in out.stdout
    assert "3 labels (fr): rouge, vert, bleu" in out.stdout


def test_unreadable_archive_reads_as_missing_files():
    """A zip zipfile refuses (here: a 'version needed' of 25.5 in the central directory) is no archive:
    the model loads, and the metadata names the label files it lacks."""
    raw = bytearray((DATA / "color_classifier.tflite").read_bytes())
    cd = bytes(raw).find(b"PK\x01\x02")
    assert cd > 0
    raw[cd + 6:cd + 8] = (255).to_bytes(2, "little")
    md = read_model(bytes(raw)).metadata["tflite_metadata"]
    assert md.packed_files == [] and md.outputs[0].labels == {}
    assert md.missing_files == ["labels_en.txt", "labels_fr.txt", "score_calibration.txt"]
    assert any("not packed" in line for line in md.summary())
