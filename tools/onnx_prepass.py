"""ONNX-level pre-pass for models to be converted to ``.rten`` by rten-convert.

rten-convert 0.22 writes a Softmax / LogSoftmax whose ONNX node leaves out
``axis`` with ``axis=0`` (the RTen schema's default), where ONNX means -1
(opset >= 13) or 1 with 2-D coercion (opset < 13); fbjax, like RTen, runs
what the ``.rten`` file says, so such a file computes something else than
the ONNX model (:func:`fbjax.formats.rten.read` warns where the result is
constant). :func:`make_defaults_explicit` states the ONNX axis in the
``.onnx`` before converting. A tool of the repository (not part of the
installed package: it edits ONNX files, it reads no model format of
fbjax's)::

    python tools/onnx_prepass.py model.onnx model.explicit.onnx
    rten-convert model.explicit.onnx model.rten

or from Python, with ``tools/`` on ``sys.path``::

    import onnx
    from onnx_prepass import make_defaults_explicit

    m, changed, left = make_defaults_explicit(onnx.load("model.onnx"))
    onnx.save(m, "model.explicit.onnx")

Needs the ``onnx`` package (not a dependency of fbjax's runtime; it comes
with ``'.[test]'``).
"""

from __future__ import annotations

import argparse
import sys

try:
    import onnx
except ImportError as e:  # pragma: no cover - the package is optional
    raise ImportError("tools/onnx_prepass.py works on ONNX models: pip install onnx") from e

__all__ = ["make_defaults_explicit"]


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


def main(argv=None) -> int:
    """``python tools/onnx_prepass.py IN.onnx OUT.onnx``: write ``IN`` with
    the defaults stated (:func:`make_defaults_explicit`) and list what
    changed and what could not be. Exit status 0; 1 when some node was left
    unchanged (its converted file will still differ from the ONNX model)."""
    p = argparse.ArgumentParser(
        prog="python tools/onnx_prepass.py",
        description="State the ONNX default axis of Softmax/LogSoftmax/Hardmax nodes that leave it out, "
                    "before converting with rten-convert (which would write axis=0).")
    p.add_argument("src", help="the .onnx model to read")
    p.add_argument("dst", help="where to write the model with the axes stated")
    args = p.parse_args(argv)
    model, changed, left = make_defaults_explicit(onnx.load(args.src))
    onnx.save(model, args.dst)
    for line in changed:
        print(f"stated  {line}")
    for line in left:
        print(f"LEFT    {line}", file=sys.stderr)
    print(f"{args.dst}: {len(changed)} node(s) changed, {len(left)} left; next: rten-convert {args.dst} OUT.rten")
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
