"""Convert ONNX models to .rten with rten-convert, in process.

Does what ``rten-convert model.onnx out.rten`` does (shape inference with data
propagation, ``graph_from_onnx_graph``, ``serialize_model``, v2 header and
64-byte aligned tensor-data segment) without a subprocess per model, so the
~900 convertible node-suite cases convert in seconds. ``v1=True`` writes the
headerless v1 layout with inline data, like ``rten-convert --v1``.

:func:`make_defaults_explicit` is an optional ONNX-level pre-pass that states
attributes whose ONNX default rten-convert 0.22 does not carry over (see its
docstring); ``convert(model, explicit_defaults=True)`` applies it first.
"""

from __future__ import annotations

import contextlib
import io

import onnx
from rten_convert import converter as C
from rten_convert.errors import ConversionError
from rten_convert.tensor_data import TensorDataBuilder
from rten_convert.util import round_up


class ConvertError(Exception):
    """rten-convert refused the model (message: its error output)."""


#: Ops whose ``axis`` default rten-convert 0.22 replaces: its converter reads
#: ``get_attr("axis", "int", 0)`` for Softmax and LogSoftmax, i.e. the RTen
#: schema default 0, where ONNX says -1 (opset >= 13) or 1 with 2-D coercion
#: (opset < 13). Hardmax has the same ONNX default (not in the RTen schema).
_SOFTMAX_LIKE = ("Softmax", "LogSoftmax", "Hardmax")


def _opset(model: onnx.ModelProto) -> int:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return int(o.version)
    return 1


def _shapes(graph: onnx.GraphProto, outer: dict) -> dict:
    """name -> tuple of dims (int, or None when unknown) for every typed value of ``graph``."""
    shapes = dict(outer)
    for v in list(graph.input) + list(graph.value_info) + list(graph.output):
        t = v.type.tensor_type
        if v.type.HasField("tensor_type") and t.HasField("shape"):
            shapes[v.name] = tuple(d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim)
    for init in graph.initializer:
        shapes[init.name] = tuple(init.dims)
    return shapes


def make_defaults_explicit(model: onnx.ModelProto):
    """State the ONNX default ``axis`` of Softmax / LogSoftmax / Hardmax nodes
    that leave it out (semantics-preserving; applied before rten-convert).

    rten-convert 0.22 writes a missing ``axis`` as 0, which is not ONNX's
    default, so such a file computes something else than the ONNX model.
    This pass adds the attribute ONNX defines, so the converted file keeps
    the ONNX meaning:

    * opset >= 13: ``axis = -1`` (a single-axis softmax over the last axis).
    * opset < 13: ``axis = 1`` with the input *coerced to 2-D*
      ``[d0, d1 * d2 * ...]``; that is a single-axis softmax over axis 1 only
      when the input has rank 2, or every dim after axis 1 is 1 (then the
      flattened group holds only axis 1; e.g. ``[1, 1000, 1, 1]``). Then
      ``axis = 1`` is stated. Where the rank or those dims are unknown, or
      the coercion would flatten several axes of size > 1, the node is left
      unchanged (a single ``axis`` cannot express it) and noted.

    Nodes in subgraphs (If/Loop bodies) are handled the same way. Shapes come
    from ONNX shape inference with data propagation (as rten-convert runs it).

    Returns:
        ``(model, changed, left)``: a modified copy (``model`` itself when
        nothing changed), the changed nodes and the nodes left unchanged, each
        as ``"<op> <node name or output>: <what>"`` strings.
    """
    def candidates(graph):
        for node in graph.node:
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    yield from candidates(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for g in a.graphs:
                        yield from candidates(g)
            if node.domain in ("", "ai.onnx") and node.op_type in _SOFTMAX_LIKE \
                    and not any(a.name == "axis" for a in node.attribute):
                yield node

    if next(candidates(model.graph), None) is None:  # nothing to state: skip the copy and shape inference
        return model, [], []
    opset = _opset(model)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(out, data_prop=True)
    except Exception:  # noqa: BLE001 - shapes unknown: only opset >= 13 nodes change
        inferred = out
    changed, left = [], []

    def walk(graph, inferred_graph, outer):
        shapes = _shapes(inferred_graph, outer)
        for node, inode in zip(graph.node, inferred_graph.node):
            for a, ia in zip(node.attribute, inode.attribute):  # subgraphs first
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g, ia.g, shapes)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for g, ig in zip(a.graphs, ia.graphs):
                        walk(g, ig, shapes)
            if node.domain not in ("", "ai.onnx") or node.op_type not in _SOFTMAX_LIKE:
                continue
            if any(a.name == "axis" for a in node.attribute):
                continue
            where = f"{node.op_type} {node.name or node.output[0]}"
            if opset >= 13:
                node.attribute.append(onnx.helper.make_attribute("axis", -1))
                changed.append(f"{where}: axis=-1 (opset {opset} default)")
                continue
            shape = shapes.get(node.input[0])
            if shape is None:
                left.append(f"{where}: opset {opset}, input rank unknown; 2-D coercion not expressible")
            elif len(shape) == 2 or (len(shape) > 2 and all(d == 1 for d in shape[2:])):
                node.attribute.append(onnx.helper.make_attribute("axis", 1))
                changed.append(f"{where}: axis=1 (opset {opset} default; input {shape}, coercion is one axis)")
            else:
                left.append(f"{where}: opset {opset}, input {shape}: 2-D coercion flattens several axes")

    walk(out.graph, inferred.graph, {})
    return (out if changed else model), changed, left


def convert(model: onnx.ModelProto, *, v1: bool = False, infer_shapes: bool = True,
            explicit_defaults: bool = False) -> bytes:
    """The bytes of ``model`` converted to .rten by rten-convert.

    ``explicit_defaults=True`` runs :func:`make_defaults_explicit` first.

    Raises:
        ConvertError: rten-convert could not convert it.
    """
    if explicit_defaults:
        model = make_defaults_explicit(model)[0]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            if infer_shapes:
                model = onnx.shape_inference.infer_shapes(model, data_prop=True)
            graph = C.graph_from_onnx_graph(model.graph)
            tensor_data = None if v1 else TensorDataBuilder()
            data = C.serialize_model(graph, C.Metadata(description="fbjax test"), tensor_data)
    except (ConversionError, Exception) as e:  # rten-convert raises assorted errors
        raise ConvertError(f"{type(e).__name__}: {e}; {err.getvalue().strip()}") from None
    if v1:
        return bytes(data)
    out = io.BytesIO()
    header = 32
    toff = round_up(header + len(data), 64)
    C.write_header(out, header, len(data), toff)
    out.write(data)
    out.write(b"\0" * (toff - out.tell()))
    tensor_data.write(out)
    return out.getvalue()
