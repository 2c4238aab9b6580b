"""Make the MediaPipe Tasks bundle fixtures with MediaPipe's own bundling code.

Run in a generator environment with the ``mediapipe`` wheel (tests never need it)::

    /tmp/genenv/bin/pip install mediapipe
    /tmp/genenv/bin/python tools/make_task_fixtures.py [--shared ../shared/models/tflite --out /tmp]

Writes, with ``mediapipe.tasks.python.metadata.metadata_writers.model_asset_bundle_utils.
create_model_asset_bundle`` (the function MediaPipe's model makers bundle with):

* ``tests/data/tasks/tiny_vision.task``: ``classifier.tflite`` and
  ``detector.tflite`` (the metadata fixtures ``tests/data/metadata/color_classifier.tflite``
  and ``two_box_detector.tflite``);
* ``tests/data/tasks/nested.task``: ``tiny_vision.task`` (the bundle above)
  and ``classifier.tflite``, as composite tasks (gesture recognizer) nest bundles;
* ``tests/data/tasks/bundles.json``: each bundle's member names in order and
  each member's sha256, read back with :mod:`zipfile`;
* with ``--shared``: ``face_landmarker_like.task`` in ``--out`` from the
  shared face detector and face landmark models (the layout of MediaPipe's
  face_landmarker.task: ``face_detector.tflite``,
  ``face_landmarks_detector.tflite``), for trying by hand; not committed
  (1.4 MB): tests/test_vision_tasks.py builds the same from ../shared.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
META = os.path.join(ROOT, "tests", "data", "metadata")
OUT = os.path.join(ROOT, "tests", "data", "tasks")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shared", default=None, help="../shared/models/tflite, for the face_landmarker-like bundle")
    ap.add_argument("--out", default="/tmp", help="where the face_landmarker-like bundle goes")
    args = ap.parse_args()
    from mediapipe.tasks.python.metadata.metadata_writers import model_asset_bundle_utils as mab

    read = lambda p: open(p, "rb").read()  # noqa: E731
    os.makedirs(OUT, exist_ok=True)
    tiny = os.path.join(OUT, "tiny_vision.task")
    mab.create_model_asset_bundle({"classifier.tflite": read(os.path.join(META, "color_classifier.tflite")),
                                   "detector.tflite": read(os.path.join(META, "two_box_detector.tflite"))}, tiny)
    nested = os.path.join(OUT, "nested.task")
    mab.create_model_asset_bundle({"tiny_vision.task": read(tiny),
                                   "classifier.tflite": read(os.path.join(META, "color_classifier.tflite"))}, nested)
    record = {}
    for path in (tiny, nested):
        with zipfile.ZipFile(path) as z:
            record[os.path.basename(path)] = {
                "made_with": "mediapipe model_asset_bundle_utils.create_model_asset_bundle",
                "members": [i.filename for i in z.infolist()],
                "sha256": {i.filename: hashlib.sha256(z.read(i.filename)).hexdigest() for i in z.infolist()},
                "compress_type": sorted({i.compress_type for i in z.infolist()}),
            }
    with open(os.path.join(OUT, "bundles.json"), "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
        f.write("\n")
    if args.shared:
        face = os.path.join(args.out, "face_landmarker_like.task")
        mab.create_model_asset_bundle(
            {"face_detector.tflite": read(os.path.join(args.shared, "mediapipe_face_detection_short_range.tflite")),
             "face_landmarks_detector.tflite": read(os.path.join(args.shared, "mediapipe_face_landmark.tflite"))},
            face)
        print(f"wrote {face}")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
