"""Lowerings of StableHLO ops (op set ``"stablehlo"``) to ``jax.lax``.

One lowering per op, named as the StableHLO spec spells it
(https://openxla.org/stablehlo/spec), shared by every carrier of StableHLO:
the prototype ``stablehlo.flatbuf`` format (:mod:`fbjax.formats.stablehlo`)
and TFLite's ``STABLEHLO_*`` builtins (:mod:`fbjax.formats.tflite_stablehlo`). A frontend emits nodes
``Node("stablehlo", "stablehlo.<op>", ...)`` whose attributes follow these
conventions:

* attribute names as in the spec (``window_strides``, ``lhs_dilation``,
  ``dimensions``, ``broadcast_dimensions``...), integer vectors as int64
  numpy arrays, with the spec's defaults filled in when the file omits them;
* ``padding`` is the N x 2 attribute flattened ``[lo0, hi0, lo1, hi1, ...]``;
* dimension-number structs are expanded into their fields
  (``input_batch_dimension``, ``lhs_contracting_dimensions``,
  ``offset_dims``...);
* region bodies are extra graphs of the model named by graph index; their
  inputs are the block arguments: ``computation`` (reduce, reduce_window),
  ``update_computation`` (scatter), ``comparator`` (sort), ``cond`` and
  ``body`` (while), ``branches`` (case; a list), ``decomposition``
  (composite); ``case`` branches and ``while`` bodies take the op's
  remaining operands as inputs (values a region captures are passed so);
* enums by name: ``comparison_direction`` ``"EQ"``...``"LT"``,
  ``compare_type`` ``"FLOAT"`` / ``"TOTALORDER"`` / ``"SIGNED"`` /
  ``"UNSIGNED"`` / ``"NOTYPE"``, rng ``algorithm`` ``"DEFAULT"`` /
  ``"THREEFRY"`` / ``"PHILOX"``;
* result types (CONVERT's target, RESHAPE's and IOTA's shapes) come from the
  node's output values.

Families: :mod:`.elementwise` (arithmetic, bitwise, shifts, compare,
select, transcendental), :mod:`.linalg`, :mod:`.conv`, :mod:`.reduce`,
:mod:`.shape` (data movement, gather, scatter, pad, dynamic slices),
:mod:`.control` (sort, while, case, composite, rng_bit_generator),
:mod:`.custom`.
"""

from ..registry import LOWERINGS

# The op set's fact table (:meth:`fbjax._registry.Registry.declare_facts`):
# layer_slices: input positions at which the lowering takes one block of a
#     layer scan's stacked array (:class:`fbjax.lower.layer_slice.LayerSlice`)
#     instead of an array, or ``fn(node) -> positions``: ``stablehlo.composite``
#     takes them where its composite's lowering does (the attention's key and
#     value caches, :func:`fbjax.lower.composites.layer_slices`).
LOWERINGS.declare_facts("stablehlo", layer_slices=())

from . import control, conv, custom, elementwise, linalg, reduce, shape  # noqa: F401,E402
from .custom import CUSTOM_CALL_OP_SET, register_custom_call

OP_SET = "stablehlo"

__all__ = ["OP_SET", "CUSTOM_CALL_OP_SET", "register_custom_call"]
