"""JAX lowerings of the TFLite GPU delegate's kernels (op set ``"gpu_cl"``).

The op set of :mod:`fbjax.formats.gpu_cl`: one op per GPU operation type as
the delegate names it (``convolution_2d``, ``depthwise_convolution``,
``fully_connected``, ``pooling_2d``, element-wise ops...), on ``[B, H, W, C]``
activations with the weights decoded to TFLite layouts. Linked element-wise
ops are separate nodes. Each kernel's own semantics (TF 2.5
``tensorflow/lite/delegates/gpu/common/tasks/*``) are noted per op.

The op set was named ``"gpu"`` before issue 36, the name of JAX's GPU
backend too; it now carries its format's name (``fbjax.supported_ops("gpu")``
still answers, with a ``DeprecationWarning``). The package (and its twin
:mod:`fbjax.reference.gpu`) keeps its module name: the folders of the op sets
are not op-set names (``tflite_int`` holds ``"tflite.int"``).
"""

from . import ops  # noqa: F401

__all__ = ["ops"]
