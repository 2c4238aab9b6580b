"""Model files shipped inside the package (see NOTICE for their licenses)."""

from __future__ import annotations

import os

_HERE = os.path.dirname(os.path.abspath(__file__))

#: The model ``fbjax run`` uses when no model is given: MediaPipe's selfie
#: segmentation (input 1x256x256x3 float32 RGB in [0, 1], output 1x256x256x1
#: person probability). Apache-2.0, see NOTICE.
DEFAULT_MODEL = os.path.join(_HERE, "mediapipe_selfie_segmentation.tflite")
