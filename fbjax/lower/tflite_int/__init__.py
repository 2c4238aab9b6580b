"""Integer-exact lowerings of quantized TFLite ops: op set ``"tflite.int"``.

Op names are the TFLite builtin names. :func:`fbjax.quantization.prepare`
moves nodes with quantized integer activations into this op set when a model
is loaded with ``quantized="exact"``; each lowering reproduces the TFLite
builtin kernel (without XNNPACK) bit for bit in 32-bit ``jax.lax`` integer
arithmetic (int64 where TFLite's 16x8 kernels accumulate in int64). The
fixed-point primitives are in :mod:`.fixedpoint`.

The target is LiteRT's builtin x86 kernels, which differ from TFLite's
reference kernels in rounding details (QUANTIZE, DEQUANTIZE, the gemm and
depthwise output stages, MEAN, SOFTMAX); :mod:`fbjax.quantization` lists
them. :data:`.conv.GEMM_ROUNDING` switches CONV_2D/DEPTHWISE_CONV_2D/
FULLY_CONNECTED to the reference kernels' rounding.

Not implemented (fbjax.load reports them as unsupported or the call raises
ModelFormatError): int16 LOGISTIC, TANH, SOFTMAX, GELU, RSQRT and
SQUARED_DIFFERENCE; int16 ADD/SUB with power-of-two scales; TFLite's hybrid
kernels (hybrid models run in float with dequantized weights).
"""

from . import activations, conv, elementwise, fake_quant, fixedpoint, float_fallback, pool, shape  # noqa: F401

__all__ = ["activations", "conv", "elementwise", "fake_quant", "fixedpoint", "float_fallback", "pool", "shape"]
