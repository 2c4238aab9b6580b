"""JAX lowerings of TFLite builtin ops (op set ``"tflite"``) and of the
MediaPipe custom ops seen in TFLite files (``"tflite.custom"``).

Importing this package registers every op in
:data:`fbjax.lower.registry.LOWERINGS`; the family modules are listed here
explicitly, nothing is discovered by side effect.
"""

from . import conv, custom, elementwise, pool, quant, reduce, resize, shape  # noqa: F401
from . import math, array, gather, nn, control, nms, rnn, state, random, mediapipe  # noqa: F401,E402  (a name registered twice raises)

__all__ = ["conv", "custom", "elementwise", "pool", "quant", "reduce", "resize", "shape"]
__all__ += ["math", "array", "gather", "nn", "control", "nms", "rnn", "state", "random", "mediapipe"]
