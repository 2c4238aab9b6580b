"""Model files shipped inside the package (see NOTICE for their licenses)."""

from __future__ import annotations

import os

_HERE = os.path.dirname(os.path.abspath(__file__))

#: The model ``fbjax run`` uses when no model is given: MediaPipe's selfie
#: segmentation (input 1x256x256x3 float32 RGB in [0, 1], output 1x256x256x1
#: person probability). Apache-2.0, see NOTICE.
DEFAULT_MODEL = os.path.join(_HERE, "mediapipe_selfie_segmentation.tflite")

#: A TFLite GPU delegate (OpenCL) serialized model: TFLite Micro's sine model
#: (input x, output about sin(x) for x in [0, 2 pi]) as TensorFlow 2.5.0's
#: delegate wrote it (F32, BUFFER storage; 17 KiB). Apache-2.0, see NOTICE.
SINE_GPU_CL = os.path.join(_HERE, "tflm_sine_float.gpu_cl.bin")


def synthetic_person(size: int = 256):
    """A drawn head-and-shoulders figure for :data:`DEFAULT_MODEL`: an input
    with a clear foreground, so its output means something (random noise
    gives an all-background mask).

    A skin-coloured head with eyes and a mouth, a neck and a red torso on a
    light-blue backdrop that darkens downwards; made in code, no file.

    Args:
        size: image height and width in pixels (the model takes 256).

    Returns:
        ``(image, figure)``: ``image`` float32 ``(size, size, 3)`` RGB in
        ``[0, 1]`` (add a batch axis for the model: ``image[None]``);
        ``figure`` bool ``(size, size)``, True on the drawn person, the mask
        the model should find (at 256 x 256 its output > 0.5 overlaps it with
        an intersection-over-union of about 0.99).
    """
    import numpy as np

    s = size / 256.0
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / s
    img = np.empty((size, size, 3), np.float32)
    img[...] = np.array([0.55, 0.7, 0.9], np.float32) * (0.8 + 0.2 * yy[..., None] / 256.0)
    head = ((xx - 128) / 34) ** 2 + ((yy - 80) / 42) ** 2 <= 1
    torso = ((xx - 128) / 80) ** 2 + ((yy - 250) / 120) ** 2 <= 1
    neck = (np.abs(xx - 128) < 16) & (yy > 110) & (yy < 140)
    img[torso] = (0.75, 0.15, 0.15)
    img[neck | head] = (0.87, 0.68, 0.55)
    for ex in (108, 148):
        img[((xx - ex) / 6) ** 2 + ((yy - 78) / 4) ** 2 <= 1] = (0.1, 0.08, 0.08)
    img[((xx - 128) / 12) ** 2 + ((yy - 102) / 3) ** 2 <= 1] = (0.6, 0.25, 0.25)
    return img, head | torso | neck
