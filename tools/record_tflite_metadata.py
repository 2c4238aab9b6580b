"""Make the TFLite-metadata test fixtures and record an independent reader's view of them.

Run in a generator environment, not fbjax's (tests never need it)::

    python3.11 -m venv /tmp/genenv && /tmp/genenv/bin/pip install tflite-support==0.4.4 mediapipe==0.10.14 -e .
    apt-get install libusb-1.0-0   # tflite-support's native module links it
    /tmp/genenv/bin/python tools/record_tflite_metadata.py [--wheel-models DIR] [--remake-fixtures]

What it writes, under ``tests/data/metadata/``:

* ``color_classifier.tflite``: a 3-class colour classifier built with
  :class:`fbjax.formats.tflite_builder.TFLiteBuilder` (MEAN over the image, FULLY_CONNECTED,
  SOFTMAX: red, green, blue), its metadata written by TFLite Support's
  ``MetadataWriter`` (image input normalized with mean 127.5 / std 127.5,
  labels in English and French, a score-calibration file and a score
  threshold), so the fixture's metadata comes from TFLite Support's writer,
  not fbjax's.
* ``two_box_detector.tflite``: a detector in TFLite's post-processed
  layout (locations, categories, scores, count; boxes fixed to the image's
  two halves, scores from its colour), metadata by TFLite Support's
  ``ObjectDetector`` writer (``BoundingBoxProperties``: BOUNDARIES, index
  1, 0, 3, 2, RATIO; a ``TENSOR_VALUE_LABELS`` label map).
* ``color_segmenter.tflite``: a 3-class per-pixel colour segmenter
  (1x1 CONV_2D, SOFTMAX), metadata by TFLite Support's ``ImageSegmenter``
  writer (labels red, green, blue).
* ``selfie_segmentation_landscape.tflite``: copied from the ``mediapipe``
  0.10.14 wheel (``mediapipe/modules/selfie_segmentation/``; Apache-2.0), a
  model with metadata and a label file that ``../shared`` lacks.
* ``wheel/<model>.json`` for every model of the mediapipe 0.10.14 wheel's
  ``mediapipe/modules`` that has metadata (``--wheel-models``; the models are
  not committed: ``FBJAX_MEDIAPIPE_MODULES=DIR pytest tests/test_tflite_metadata.py``
  checks them);
* ``<model>.json`` for each of those and for every ``../shared/models/tflite``
  model with metadata: TFLite Support's ``MetadataDisplayer`` output
  (``metadata``: ``get_metadata_json()``; ``packed_files``:
  ``get_packed_associated_file_list()``; ``files``: each packed file's text
  from ``get_associated_file_buffer``) and the model's sha256.

``tests/test_tflite_metadata.py`` compares fbjax's reading with these records.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import shutil
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "metadata")
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "models", "tflite")


def classifier_base() -> bytes:
    """input [1, 16, 16, 3] float32 in [-1, 1] -> softmax [1, 3] over (red, green, blue)."""
    from fbjax.formats.tflite_builder import TFLiteBuilder

    b = TFLiteBuilder("colour classifier made by tools/record_tflite_metadata.py")
    x = b.add_input((1, 16, 16, 3), name="image")
    axes = b.add_tensor(data=np.array([1, 2], np.int32), name="axes")
    m = b.add_tensor((1, 3), name="mean_rgb")
    b.add_op("MEAN", [x, axes], [m], options=dict(keep_dims=False))
    w = b.add_tensor(data=(8.0 * np.eye(3) - 2.0).astype(np.float32), name="dense/kernel")  # [out, in]
    bias = b.add_tensor(data=np.zeros(3, np.float32), name="dense/bias")
    logits = b.add_tensor((1, 3), name="logits")
    b.add_op("FULLY_CONNECTED", [m, w, bias], [logits])
    probs = b.add_tensor((1, 3), name="probabilities")
    b.add_op("SOFTMAX", [logits], [probs], options=dict(beta=1.0))
    b.add_output(probs)
    return b.build()


def detector_base() -> bytes:
    """input [1, 16, 16, 3] float32 in [0, 1] -> TFLite's detection post-processing layout:
    locations [1, 2, 4] (ymin, xmin, ymax, xmax as ratios: the left and the right half),
    categories [1, 2] (0, 1), scores [1, 2] (sigmoid of how red / how blue the image is), count [1]."""
    from fbjax.formats.tflite_builder import TFLiteBuilder

    b = TFLiteBuilder("two-box detector made by tools/record_tflite_metadata.py")
    x = b.add_input((1, 16, 16, 3), name="image")
    # output tensors first: the writer pairs its metadata with the outputs in tensor-index order
    loc = b.add_tensor((1, 2, 4), name="locations")
    cat = b.add_tensor((1, 2), name="categories")
    score = b.add_tensor((1, 2), name="scores")
    count = b.add_tensor((1,), name="count")
    axes = b.add_tensor(data=np.array([1, 2], np.int32), name="axes")
    m = b.add_tensor((1, 3), name="mean_rgb")
    b.add_op("MEAN", [x, axes], [m], options=dict(keep_dims=False))
    w = b.add_tensor(data=np.array([[12, -6, -6], [-6, -6, 12]], np.float32), name="dense/kernel")
    bias = b.add_tensor(data=np.zeros(2, np.float32), name="dense/bias")
    logits = b.add_tensor((1, 2), name="logits")
    b.add_op("FULLY_CONNECTED", [m, w, bias], [logits])
    b.add_op("LOGISTIC", [logits], [score])
    zero = b.add_tensor((1, 2), name="zero")
    b.add_op("MUL", [score, b.add_tensor(data=np.zeros((1, 2), np.float32), name="zeros")], [zero])
    zero3 = b.add_tensor((1, 2, 1), name="zero3")
    b.add_op("RESHAPE", [zero, b.add_tensor(data=np.array([1, 2, 1], np.int32), name="shape")], [zero3])
    boxes = np.array([[[0.1, 0.05, 0.9, 0.45], [0.1, 0.55, 0.9, 0.95]]], np.float32)
    b.add_op("ADD", [zero3, b.add_tensor(data=boxes, name="anchors")], [loc])
    b.add_op("ADD", [zero, b.add_tensor(data=np.array([[0, 1]], np.float32), name="class_ids")], [cat])
    ones = b.add_tensor((1, 2), name="ones")
    b.add_op("ADD", [zero, b.add_tensor(data=np.ones((1, 2), np.float32), name="one")], [ones])
    b.add_op("SUM", [ones, b.add_tensor(data=np.array([1], np.int32), name="axis1")], [count],
             options=dict(keep_dims=False))
    for t in (loc, cat, score, count):
        b.add_output(t)
    return b.build()


def _write_with_labels(path: str, writer_module, base: bytes, labels: str, label_file: str) -> None:
    """``base`` with TFLite Support's metadata writer ``writer_module``
    (``object_detector``, ``image_segmenter``): input normalization mean 0,
    std 255, and ``labels`` packed as the associated file ``label_file``."""
    with tempfile.TemporaryDirectory() as tmp:
        label_path = os.path.join(tmp, label_file)
        with open(label_path, "w") as f:
            f.write(labels)
        writer = writer_module.MetadataWriter.create_for_inference(
            bytearray(base), input_norm_mean=[0.0], input_norm_std=[255.0], label_file_paths=[label_path])
        data = writer.populate()
    with open(path, "wb") as f:
        f.write(data)


def write_detector(path: str) -> None:
    from tflite_support.metadata_writers import object_detector

    _write_with_labels(path, object_detector, detector_base(), "red thing\nblue thing\n", "labelmap.txt")


def segmenter_base() -> bytes:
    """input [1, 32, 32, 3] float32 in [0, 1] -> per-pixel softmax [1, 32, 32, 3] over (red, green, blue):
    a 1x1 CONV_2D with weights 12 I - 6, then SOFTMAX over the channels."""
    from fbjax.formats.tflite_builder import TFLiteBuilder

    b = TFLiteBuilder("colour segmenter made by tools/record_tflite_metadata.py")
    x = b.add_input((1, 32, 32, 3), name="image")
    w = b.add_tensor(data=(12.0 * np.eye(3) - 6.0).astype(np.float32).reshape(3, 1, 1, 3), name="conv/kernel")
    bias = b.add_tensor(data=np.zeros(3, np.float32), name="conv/bias")
    logits = b.add_tensor((1, 32, 32, 3), name="logits")
    b.add_op("CONV_2D", [x, w, bias], [logits], options=dict(padding="SAME", stride_w=1, stride_h=1))
    probs = b.add_tensor((1, 32, 32, 3), name="segmentation")
    b.add_op("SOFTMAX", [logits], [probs], options=dict(beta=1.0))
    b.add_output(probs)
    return b.build()


def write_segmenter(path: str) -> None:
    from tflite_support.metadata_writers import image_segmenter

    _write_with_labels(path, image_segmenter, segmenter_base(), "red\ngreen\nblue\n", "labels.txt")


def write_classifier(path: str) -> None:
    from tflite_support.metadata_writers import image_classifier, metadata_info
    from tflite_support import metadata_schema_py_generated as mfb

    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for name, text in (("labels_en.txt", "red\ngreen\nblue\n"), ("labels_fr.txt", "rouge\nvert\nbleu\n"),
                           ("score_calibration.txt", "1.0,1.0,0.0\n1.0,1.0,0.0,0.2\n\n")):
            files[name] = os.path.join(tmp, name)
            with open(files[name], "w") as f:
                f.write(text)
        general = metadata_info.GeneralMd(name="Colour classifier", version="v1.2",
                                          description="Names the dominant colour of an image (test fixture).",
                                          author="fbjax tests", licenses="Apache License. Version 2.0")
        inp = metadata_info.InputImageTensorMd(name="image", description="RGB image scaled to [-1, 1].",
                                               norm_mean=[127.5], norm_std=[127.5],
                                               color_space_type=mfb.ColorSpaceType.RGB,
                                               tensor_type=0)  # FLOAT32
        calib = metadata_info.ScoreCalibrationMd(mfb.ScoreTransformationType.LOG, 0.2,
                                                 files["score_calibration.txt"])
        out = metadata_info.ClassificationTensorMd(
            name="probability", description="Probability of each colour.",
            label_files=[metadata_info.LabelFileMd(files["labels_en.txt"], locale="en"),
                         metadata_info.LabelFileMd(files["labels_fr.txt"], locale="fr")],
            tensor_type=0, score_calibration_md=calib)
        writer = image_classifier.MetadataWriter.create_from_metadata_info(
            bytearray(classifier_base()), general, inp, out)
        data = writer.populate()
    with open(path, "wb") as f:
        f.write(data)


def record(path: str) -> dict:
    from tflite_support import metadata as md

    d = md.MetadataDisplayer.with_model_file(path)
    packed = d.get_packed_associated_file_list()
    return {
        "model": os.path.basename(path),
        "sha256": hashlib.sha256(open(path, "rb").read()).hexdigest(),
        "recorded_with": "tflite-support 0.4.4 MetadataDisplayer",
        "metadata": json.loads(d.get_metadata_json()),
        "packed_files": sorted(packed),
        "files": {n: d.get_associated_file_buffer(n).decode("utf-8") for n in sorted(packed)},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wheel-models", default=None,
                    help="the mediapipe 0.10.14 wheel's mediapipe/modules folder (unzipped)")
    ap.add_argument("--remake-fixtures", action="store_true",
                    help="write the fixture models again (then run tools/make_task_fixtures.py too: the bundles "
                         "hold them); without it only the JSON records are written")
    args = ap.parse_args()
    from tflite_support import metadata as md

    os.makedirs(OUT, exist_ok=True)
    if args.remake_fixtures:  # new bytes each time (the writer's zip has timestamps): the .task fixtures then too
        write_classifier(os.path.join(OUT, "color_classifier.tflite"))
        write_detector(os.path.join(OUT, "two_box_detector.tflite"))
    seg = os.path.join(OUT, "color_segmenter.tflite")
    if args.remake_fixtures or not os.path.exists(seg):  # in no .task bundle: made when missing
        write_segmenter(seg)
    if args.wheel_models and args.remake_fixtures:
        shutil.copy(os.path.join(args.wheel_models, "selfie_segmentation", "selfie_segmentation_landscape.tflite"),
                    os.path.join(OUT, "selfie_segmentation_landscape.tflite"))
    models = sorted(glob.glob(os.path.join(OUT, "*.tflite"))) + sorted(glob.glob(os.path.join(SHARED, "*.tflite")))
    for path in models:
        try:
            rec = record(path)
        except ValueError as e:  # "The model does not have metadata."
            print(f"{os.path.basename(path)}: {e}")
            continue
        name = os.path.splitext(os.path.basename(path))[0]
        with open(os.path.join(OUT, f"{name}.json"), "w") as f:
            json.dump(rec, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"{name}: recorded ({len(rec['packed_files'])} packed files)")
    if args.wheel_models:  # every wheel model with metadata, recorded (models not committed: up to 5 MB each)
        wheel_out = os.path.join(OUT, "wheel")
        os.makedirs(wheel_out, exist_ok=True)
        for path in sorted(glob.glob(os.path.join(args.wheel_models, "*", "*.tflite"))):
            try:
                rec = record(path)
            except ValueError as e:
                print(f"wheel {os.path.basename(path)}: {e}")
                continue
            rec["model"] = os.path.relpath(path, args.wheel_models)
            name = os.path.splitext(os.path.basename(path))[0]
            with open(os.path.join(wheel_out, f"{name}.json"), "w") as f:
                json.dump(rec, f, indent=1, sort_keys=True)
                f.write("\n")
            print(f"wheel {name}: recorded")
    del md


if __name__ == "__main__":
    main()
