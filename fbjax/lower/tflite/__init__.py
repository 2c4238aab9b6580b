"""JAX lowerings of TFLite builtin ops (op set ``"tflite"``) and of the
MediaPipe custom ops seen in TFLite files (``"tflite.custom"``).

Importing this package registers every op in
:data:`fbjax.lower.registry.LOWERINGS`; the family modules are listed here
explicitly, nothing is discovered by side effect.
"""

from ..registry import LOWERINGS

# The facts only TFLite ops have (``OpDef.fact``; the shared ones are
# :class:`fbjax._registry.OpDef` fields), with their defaults:
#
# int_passthrough: the builtin's integer version only moves values (input
#     and output share quantization parameters), so a quantized node keeps
#     its ``"tflite"`` lowering.
# layout_passthrough: ``fn(node) -> bool``: the node keeps whatever layout
#     its single input has (an elementwise cast of a float16 weight, an
#     identity), so the inference planner may relay a convolution weight
#     through it to its param.
# table_lookup: the op reads a constant table at computed indices
#     (EMBEDDING_LOOKUP): with a float output, it is a float consumer of a
#     quantized table (dynamic-range quantization dequantizes it or runs the
#     hybrid kernel).
# bias_scale: ``(weight input, bias input, activation input)`` for ops whose
#     int32 bias scale is activation scale times weight scale: when the
#     weights are re-quantized the bias is too (:meth:`fbjax.Model.save`,
#     :mod:`fbjax.formats.tflite_writer`).
# layer_slices: input positions at which the lowering takes one block of a
#     layer scan's stacked array (:class:`fbjax.lower.layer_slice.LayerSlice`)
#     instead of an array: DYNAMIC_UPDATE_SLICE writes a KV cache's update into
#     the stacked caches in place.
# updates_in_place: of those, the positions whose block the op's result is,
#     updated (a LayerSlice of the updated stacked array): the layer scan
#     carries such a per-layer input and output as one stacked array.
LOWERINGS.declare_facts(("tflite", "tflite.custom"), int_passthrough=False, layout_passthrough=None,
                        table_lookup=False, bias_scale=None, layer_slices=(), updates_in_place=())

from . import conv, custom, elementwise, pool, quant, reduce, resize, shape  # noqa: F401,E402
from . import math, array, gather, nn, control, nms, rnn, state, random, mediapipe  # noqa: F401,E402  (a name registered twice raises)

__all__ = ["conv", "custom", "elementwise", "pool", "quant", "reduce", "resize", "shape"]
__all__ += ["math", "array", "gather", "nn", "control", "nms", "rnn", "state", "random", "mediapipe"]
