"""How each value-sized op pads its output in static-bound mode: the ``static_bound`` facts of the registry.

Some ops' output sizes depend on the values they read (ONNX ``NonZero``,
``NonMaxSuppression``, ``TopK`` with a computed ``k``, ``Loop`` scan
outputs; TFLite ``WHERE`` and ``UNIQUE``). With ``fbjax.load(...,
static_bounds=True)``, :func:`fbjax.passes.shapes.add_valid_counts` gives each such
node a trailing int32 ``":valid_count"`` output, and its lowering (and the
numpy reference) returns the output padded to a bound known at load time
plus that count.

A rule is ``rule(node) -> Value or None``, called by that pass for each node
of the main graph whose lowering was registered with it
(:class:`fbjax._registry.OpDef`). It sets the padded outputs' shapes to
their bounds (in place; the node's output :class:`~fbjax.ir.Value` objects)
and returns the output the count is named after, or None when the node
needs no count (its size is known at load: a stored ``k`` or input; or it
has nothing to pad).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from .ir import Node, Value


def _size(x: Value) -> int:
    return int(np.prod(x.shape, dtype=np.int64))


def onnx_nonzero(node: Node) -> Optional[Value]:
    """``[rank, X.size]`` indices: every element nonzero."""
    if len(node.outputs) != 1 or node.outputs[0] is None:
        return None
    out, x = node.outputs[0], node.inputs[0] if node.inputs else None
    if x is not None and x.static_shape:
        out.shape = (len(x.shape), _size(x))
    return out


def onnx_nonmaxsuppression(node: Node) -> Optional[Value]:
    """``[B * C * min(max_output_boxes_per_class, N), 3]`` selected indices,
    when the scores' shape and a stored ``max_output_boxes_per_class``
    (absent: 0) give it."""
    if len(node.outputs) != 1 or node.outputs[0] is None:
        return None
    out, boxes = node.outputs[0], node.inputs[0] if node.inputs else None
    if boxes is None or not boxes.static_shape:
        return out
    scores = node.inputs[1] if len(node.inputs) > 1 else None
    mx = node.inputs[2] if len(node.inputs) > 2 else None
    if scores is None or not scores.static_shape or len(scores.shape) != 3:
        return out
    if mx is not None and mx.data is None:
        return out
    per = 0 if mx is None else int(np.asarray(mx.data).reshape(-1)[0])
    b, c, n = scores.shape
    out.shape = (b * c * min(max(per, 0), n), 3)
    return out


def onnx_topk(node: Node) -> Optional[Value]:
    """Only a ``k`` the file does not store (computed by the graph): values
    and indices of the axis' full size."""
    k = node.inputs[1] if len(node.inputs) > 1 else None
    if k is None or k.data is not None or len(node.outputs) != 2:
        return None
    x = node.inputs[0]
    for o in node.outputs:
        if o is not None and x.shape is not None:
            o.shape = tuple(x.shape)  # the bound: the axis' full size
    return node.outputs[0] if node.outputs[0] is not None else node.outputs[1]


def onnx_loop(node: Node) -> Optional[Value]:
    """A loop with scan outputs: padded to the trip count by the lowering;
    the count is the iterations run, named after the first scan output."""
    n_state = len(node.inputs) - 2 - len(node.attrs.get("body_captures", ()))
    if len(node.outputs) <= n_state:
        return None
    return next((o for o in node.outputs[n_state:] if o is not None), None)


def _tflite_bounded(node: Node, n_out: int, bound) -> Optional[Value]:
    """WHERE/UNIQUE: only where the input is not stored in the file (a
    stored input's result size is known at load); the count named after
    the first output."""
    x = node.inputs[0] if node.inputs else None
    out = node.outputs[0] if node.outputs else None
    if x is None or x.data is not None or out is None or len(node.outputs) != n_out or not x.static_shape:
        return None
    out.shape = bound(x)
    return out


def tflite_where(node: Node) -> Optional[Value]:
    """``[condition size, rank]`` coordinates: one row per element."""
    return _tflite_bounded(node, 1, lambda x: (_size(x), len(x.shape)))


def tflite_unique(node: Node) -> Optional[Value]:
    """``[input size]`` values: every element distinct."""
    return _tflite_bounded(node, 2, lambda x: (_size(x),))
