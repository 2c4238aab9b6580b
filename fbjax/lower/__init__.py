"""IR -> JAX lowering.

:data:`LOWERINGS` maps ``(op_set, op_name)`` to lowering functions; it is
filled by the explicit imports of the op-set packages below (nothing is
discovered by side effect). Shared kernels (convolution, pooling, resize
coordinate maps, fused activations) live in :mod:`fbjax.lower.kernels`.
"""

from . import kernels  # noqa: F401
from .registry import LOWERINGS, register

# One package per op set; importing it registers its lowerings.
from . import tflite  # noqa: F401,E402  (registers the "tflite" and "tflite.custom" ops)
from . import tflite_int  # noqa: F401,E402  (registers the "tflite.int" and "fbjax" quantization ops)
from . import onnx  # noqa: F401,E402  (registers the "onnx" op set: RTen models)
from . import stablehlo  # noqa: F401,E402  (registers the "stablehlo" ops)
from . import gpu  # noqa: F401,E402  (registers the "gpu_cl" ops: TFLite GPU delegate .bin files)

__all__ = ["LOWERINGS", "register", "kernels", "tflite", "tflite_int", "onnx", "stablehlo", "gpu"]
