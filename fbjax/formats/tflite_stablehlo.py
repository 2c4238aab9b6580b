"""TFLite ``STABLEHLO_*`` builtins (codes 162 onwards) as StableHLO nodes.

TensorFlow's converter writes these with
``converter.target_spec.supported_ops = [tf.lite.OpsSet.EXPERIMENTAL_STABLEHLO_OPS]``;
LiteRT has kernels for a handful of them only. fbjax lowers all of them
through the shared StableHLO lowering (:mod:`fbjax.lower.stablehlo`):
:func:`translate` turns the frontend's ``("tflite", "STABLEHLO_ADD")`` node
into ``("stablehlo", "stablehlo.add")`` with the attribute conventions that
lowering documents. The TFLite operator name stays in ``node.location``
(``"subgraph 0, operator 3 (STABLEHLO_ADD)"``).

Attribute mapping (``builtin_options_2`` tables, snake_case field names):

* most fields already carry the spec's names (``window_strides``,
  ``broadcast_dimensions``, ``update_window_dims``...) and pass through;
* region bodies are appended subgraphs referenced by index: ``REDUCE`` /
  ``REDUCE_WINDOW``'s ``body_subgraph_index`` -> ``computation``;
  ``SCATTER``'s ``update_computation_subgraph_index`` -> ``update_computation``;
  ``SORT``'s ``comparator_subgraph_index`` -> ``comparator``; ``WHILE``'s
  ``cond_subgraph_index`` / ``body_subgraph_index`` -> ``cond`` / ``body``;
  ``CASE``'s ``branch_subgraph_indices`` -> ``branches``; ``COMPOSITE``'s
  ``decomposition_subgraph_index`` -> ``decomposition``;
* enum names lose their prefixes: ``STABLEHLO_COMPARISON_DIRECTION_LT`` ->
  ``"LT"``, ``STABLEHLO_COMPARISON_TYPE_FLOAT_TOTAL_ORDER`` -> ``"TOTALORDER"``,
  ``RngAlgorithm`` ``DEFAULT`` / ``PHILOX`` / ``THREEFRY``;
* ``PAD``'s three vectors stay as they are (``edge_padding_low``...);
* string fields (composite ``name``, custom call ``call_target_name``,
  ``backend_config``) become ``str`` / ``bytes``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from flatbuffers import flexbuffers

from ..errors import ModelFormatError
from ..ir import Node

PREFIX = "STABLEHLO_"
OP_SET = "stablehlo"

#: attribute renames per TFLite op (after snake_casing).
_RENAMES: dict[str, dict[str, str]] = {
    "STABLEHLO_REDUCE": {"body_subgraph_index": "computation"},
    "STABLEHLO_REDUCE_WINDOW": {"body_subgraph_index": "computation"},
    "STABLEHLO_SCATTER": {"update_computation_subgraph_index": "update_computation"},
    "STABLEHLO_SORT": {"comparator_subgraph_index": "comparator"},
    "STABLEHLO_WHILE": {"cond_subgraph_index": "cond", "body_subgraph_index": "body"},
    "STABLEHLO_CASE": {"branch_subgraph_indices": "branches"},
    "STABLEHLO_COMPOSITE": {"decomposition_subgraph_index": "decomposition"},
}

#: attributes with no meaning for the lowering (precision hints).
_DROP = {"precision_config"}

_COMPARE_TYPES = {"NOTYPE": "NOTYPE", "FLOAT": "FLOAT", "FLOAT_TOTAL_ORDER": "TOTALORDER",
                  "SIGNED": "SIGNED", "UNSIGNED": "UNSIGNED"}


def is_stablehlo(name: str) -> bool:
    """Whether a TFLite builtin name is one of the ``STABLEHLO_*`` ops."""
    return name.startswith(PREFIX)


def stablehlo_name(tflite_name: str) -> str:
    """``"STABLEHLO_DOT_GENERAL"`` -> ``"stablehlo.dot_general"``."""
    return "stablehlo." + tflite_name[len(PREFIX):].lower()


def _text(v) -> str:
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).decode("utf-8", "replace")
    if isinstance(v, np.ndarray):
        return bytes(v.astype(np.uint8)).decode("utf-8", "replace")
    return "" if v is None else str(v)


def translate_attrs(name: str, attrs: dict, loc: str) -> dict:
    """The lowering's attributes for a ``STABLEHLO_*`` op's options.

    Raises:
        ModelFormatError: an enum value the lowering does not know.
    """
    ren = _RENAMES.get(name, {})
    out = {}
    for k, v in attrs.items():
        if k in _DROP:
            continue
        k = ren.get(k, k)
        if k == "comparison_direction":
            v = str(v).replace("STABLEHLO_COMPARISON_DIRECTION_", "")
        elif k == "compare_type":
            key = str(v).replace("STABLEHLO_COMPARISON_TYPE_", "")
            if key not in _COMPARE_TYPES:
                raise ModelFormatError(f"{loc}: unknown compare_type {v!r}")
            v = _COMPARE_TYPES[key]
        elif k in ("name", "call_target_name"):
            v = _text(v)
        elif k == "backend_config":
            v = _text(v).encode()
        elif k in ("composite_attributes", "custom_attributes"):
            v = bytes(np.asarray(v, np.uint8)) if v is not None else b""
        elif isinstance(v, np.ndarray) and v.dtype == np.bool_:
            pass
        elif isinstance(v, np.ndarray) and np.issubdtype(v.dtype, np.integer):
            v = v.astype(np.int64)
        elif v is None and k in ("window_strides", "padding", "lhs_dilation", "rhs_dilation",
                                 "base_dilations", "window_dilations", "strides"):
            continue  # absent optional vector: the spec's default
        out[k] = v
    if name == "STABLEHLO_COMPOSITE":
        out.pop("composite_attributes_format", None)
    return out


def composite_attrs(blob, loc: str = "composite") -> dict:
    """A ``STABLEHLO_COMPOSITE``'s ``composite_attributes``: the FlexBuffer
    map LiteRT stores them in (``composite_attributes_format`` FLEXBUFFERS,
    the only format the schema names) as a ``dict``; empty bytes: ``{}``.

    Values as :mod:`flatbuffers.flexbuffers` decodes them: floats as Python
    floats (the float32 the converter wrote, widened exactly), ints, bools,
    strings and lists of them. Tensor-valued attributes, which the converter
    writes as ``_TENSOR_V1_<name>: {TENSOR_DATA, TENSOR_SHAPE, TENSOR_TYPE}``
    (litert-torch's group norm ``reduction_axes``), come back as ``<name>``:
    a numpy array of that shape and TFLite ``TensorType``.

    Raises:
        ModelFormatError: the bytes are not a FlexBuffer map, or a tensor
            attribute's data does not fill its shape.
    """
    if isinstance(blob, dict):  # already decoded
        return dict(blob)
    blob = bytes(blob or b"")
    if not blob:
        return {}
    try:
        out = flexbuffers.Loads(blob)
    except Exception as e:  # flexbuffers raises bare IndexError/struct.error on bad bytes
        raise ModelFormatError(f"{loc}: composite_attributes is not a FlexBuffer map ({e})") from None
    if not isinstance(out, dict):
        raise ModelFormatError(f"{loc}: composite_attributes is a FlexBuffer {type(out).__name__}, not a map")
    for k in [k for k in out if k.startswith(_TENSOR_ATTR)]:
        v = out.pop(k)
        name = k[len(_TENSOR_ATTR):]
        try:
            dt = _TENSOR_TYPES.get(int(v["TENSOR_TYPE"]))
            out[name] = np.asarray(v["TENSOR_DATA"], dt).reshape([int(d) for d in v["TENSOR_SHAPE"]])
        except (KeyError, TypeError, ValueError) as e:
            raise ModelFormatError(f"{loc}: composite attribute {k!r} is not a tensor ({e})") from None
    return out


#: the converter's prefix of a tensor-valued composite attribute.
_TENSOR_ATTR = "_TENSOR_V1_"
#: TFLite ``TensorType`` codes of tensor-valued attributes (others: numpy's own choice).
_TENSOR_TYPES = {0: np.float32, 1: np.float16, 2: np.int32, 3: np.uint8, 4: np.int64, 6: np.bool_, 7: np.int16,
                 9: np.int8, 10: np.float64}


def translate(node: Node) -> Node:
    """A frontend ``("tflite", "STABLEHLO_*")`` node as a ``("stablehlo",
    "stablehlo.*")`` node with the shared lowering's attributes; the TFLite
    name stays in ``location``."""
    name = node.op_name
    loc = node.location if f"({name})" in node.location else f"{node.location} ({name})"
    attrs = translate_attrs(name, dict(node.attrs), loc)
    ren = _RENAMES.get(name, {})
    regions = {ren.get(k, k): v for k, v in node.regions.items()}
    return dataclasses.replace(node, op_set=OP_SET, op_name=stablehlo_name(name), attrs=attrs, location=loc,
                               regions=regions)
