"""Integer-exact lowerings of quantized TFLite ops: op set ``"tflite.int"``.

Op names are the TFLite builtin names. :func:`fbjax.passes.quantization.rewrite_quantized`
moves nodes with quantized integer activations into this op set when a model
is loaded with ``quantized="exact"``; each lowering reproduces the TFLite
builtin kernel (without XNNPACK) bit for bit in 32-bit ``jax.lax`` integer
arithmetic (int64 where TFLite's 16x8 kernels accumulate in int64). The
fixed-point primitives are in :mod:`.fixedpoint`.

The target is LiteRT's builtin x86 kernels, which differ from TFLite's
reference kernels in rounding details (QUANTIZE, DEQUANTIZE, the gemm and
depthwise output stages, MEAN, SOFTMAX); :mod:`fbjax.passes.quantization` lists
them. :data:`.conv.GEMM_ROUNDING` switches CONV_2D/DEPTHWISE_CONV_2D/
FULLY_CONNECTED to the reference kernels' rounding.

16x8 (int16 activation) kernels: LOGISTIC/TANH interpolate TFLite's
256-entry sigmoid table, or with a power-of-two input scale (2^-12; TANH also
2^-11) run gemmlowp's int16 fixed-point logistic/tanh; SOFTMAX, GELU and
RSQRT use 513-entry int16 tables (``LUTPopulate<int16_t>``) read with 7-bit interpolation; ADD/SUB take the
power-of-two path when ``pot_scale_int16`` is set and all scales are powers
of two.

Not implemented (fbjax.load reports them as unsupported or the call raises
ModelFormatError): int16 SQUARED_DIFFERENCE and HARD_SWISH (LiteRT 2.3.0 has
no such kernels). TFLite's hybrid
kernels (float activations, int8 weights) are the op set ``"tflite.hybrid"``
in :mod:`.hybrid`.
"""

from ..registry import LOWERINGS

# The facts only the integer and hybrid kernels have (``OpDef.fact``), with
# their defaults; :func:`fbjax.passes.quantization.rewrite_quantized` reads them:
#
# "tflite.int":
#   fq_rounding: ``fn(node, orig) -> dict``, the ``fbjax:FAKE_QUANT``
#       attributes that make float mode round the op's output as the kernel
#       does.
#   quant_conversion: ``"quantize"`` (QUANTIZE) or ``"dequantize"``
#       (DEQUANTIZE), the ops that convert between quantized integers and
#       float (with a quantized input, a constant too, they run their integer
#       kernel; in float mode a quantize becomes ``fbjax:FAKE_QUANT`` and a
#       dequantize of a float32 value the identity; a dequantize is never a
#       float consumer of hybrid weights).
# "tflite.hybrid":
#   traced_weights: the lowering also takes its integer weights as traced
#       arrays, so float mode can feed it re-quantized params.
#   hybrid_eligible: ``fn(node, weight) -> bool``, whether the kernel serves
#       the ``"tflite"`` node ``node`` with the quantized constant ``weight``
#       kept in its integer type (``quantized="exact"``); hybrid ops without
#       it are never chosen.
#   layer_quant: input positions whose quantization scales the lowering
#       reads through ``ctx.quant_scale(i)`` (traced inside a layer scan's
#       body, :mod:`fbjax.lower.layer_scan`), so that blocks whose weights
#       have different scales run as one scan body.
#   layer_slices: input positions at which the lowering takes a
#       :class:`fbjax.lower.layer_slice.LayerSlice` (one block of a layer
#       scan's stacked weights, read in place by fbjax's CPU kernels) instead
#       of an array.
LOWERINGS.declare_facts("tflite.int", fq_rounding=None, quant_conversion=None)
LOWERINGS.declare_facts("tflite.hybrid", traced_weights=False, hybrid_eligible=None, layer_quant=(),
                        layer_slices=())

from . import activations, conv, elementwise, fake_quant, fixedpoint, hybrid, pool, shape  # noqa: F401,E402

__all__ = ["activations", "conv", "elementwise", "fake_quant", "fixedpoint", "hybrid", "pool", "shape"]
