"""numpy twins of the integer-exact TFLite kernels (op set ``"tflite.int"``)
and of the fake-quantization ops (``"fbjax"``), written independently of
:mod:`fbjax.lower.tflite_int` (int64 numpy arithmetic, scalar loops where
TFLite loops)."""

from . import activations, conv, elementwise, fake_quant, fixedpoint, hybrid, pool, shape  # noqa: F401

__all__ = ["activations", "conv", "elementwise", "fake_quant", "fixedpoint", "hybrid", "pool", "shape"]
