"""Helpers the ops' facts are written with; the facts themselves live at each op's registration.

An op's ``batch`` rule (how it treats a leading batch dimension,
:func:`fbjax.passes.shapes.set_batch_size`), ``static_bound`` rule (how static-bound
mode pads its value-sized outputs, :func:`fbjax.passes.shapes.add_valid_counts`),
``regions`` (the arities of the graphs it runs, :func:`fbjax.passes.reading.check_regions`)
and ``out_dtype`` (``fn(node, k, graphs) -> dtype or None``: its output
dtypes where a file leaves them open,
:func:`fbjax.passes.reading.fill_dtypes`) are declared with the op in its family
file (``fbjax/lower/<op set>/<family>.py``, and for the facts the numpy
reference needs too, ``fbjax/reference/<op set>/<family>.py``;
:class:`fbjax._registry.OpDef`). This module holds only what many of those
rules share: reading constants, the refusal error, the RESHAPE target
rewrite, the "same as input 0" and "axis attribute" rules, and the
:class:`Region` record. It names no op.

Batch rules are ``rule(node, carrying, batch)``: they raise
:class:`~fbjax.errors.InputError` (through :func:`refusal`, naming the node)
when the op moves or mixes the batch, and may rewrite the node's shape
constants so that they follow it. ``carrying`` is the set of ``id(Value)``
that carry the batch, ``batch`` the target size (``None``: any). New
constants are new :class:`~fbjax.ir.Value` objects (:func:`new_const`), so
the file's data is never modified.

Bound rules are ``rule(node) -> Value or None``: they set the padded
outputs' shapes to their bounds (in place) and return the output the valid
count is named after, or None when the node needs no count.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import numpy as np

from .errors import InputError
from .ir import Node, Value

# --- reading a node ---------------------------------------------------------------


def const(v: Optional[Value]) -> Optional[np.ndarray]:
    """The value's data as an array, None when the file does not store it."""
    return None if v is None or v.data is None else np.asarray(v.data)


def new_const(v: Value, data: np.ndarray) -> Value:
    """A new constant standing in for ``v`` (same name and index), holding ``data``."""
    return Value(v.name, np.dtype(data.dtype), tuple(data.shape), None, data, v.index)


def ints(v) -> list:
    """An attribute or array as a flat list of Python ints (None: ``[]``)."""
    return [] if v is None else [int(x) for x in np.asarray(v).reshape(-1)]


def rank(v: Optional[Value]) -> Optional[int]:
    """The value's rank, None when its shape is unknown."""
    return None if v is None or v.shape is None else len(v.shape)


def size(x: Value) -> int:
    """Element count of a value of static shape."""
    return int(np.prod(x.shape, dtype=np.int64))


def per_sample(v: Value) -> Optional[int]:
    """Elements per sample (all dimensions after the first), None when unknown."""
    if v.shape is None or any(d is None for d in v.shape[1:]):
        return None
    return int(np.prod(v.shape[1:], dtype=np.int64)) if len(v.shape) > 1 else 1


def carries(node: Node, carrying: set) -> list:
    """Per input of ``node``: whether it carries the batch."""
    return [v is not None and id(v) in carrying for v in node.inputs]


def axis_is_batch(axis, rank_: Optional[int]) -> bool:
    """Whether ``axis`` (possibly negative) is dimension 0 of a rank-``rank_`` value."""
    return rank_ is not None and rank_ > 0 and int(np.asarray(axis).reshape(-1)[0]) % rank_ == 0


# --- batch rules --------------------------------------------------------------------


def refusal(node: Node, msg: str) -> InputError:
    """The error a batch rule raises: the node cannot follow a batch."""
    return InputError(
        f"batch_size: cannot make the model batch-polymorphic: {node.location} ({node.op_name}) {msg}"
    )


def refuse_axis0(node: Node, axis, rank_: Optional[int]) -> None:
    """Refuse when ``axis`` (None: no axis) is the batch dimension."""
    if axis is not None and axis_is_batch(axis, rank_):
        raise refusal(node, f"works along the batch dimension (axis {int(np.asarray(axis).reshape(-1)[0])})")


def axis_not_batch(default=None) -> Callable:
    """The rule of ops with an ``axis`` attribute (concatenations, packs,
    softmax, arg-max...): the axis (absent: ``default``; None: no check) is
    not dimension 0 of input 0."""
    def rule(node: Node, carrying: set, batch) -> None:
        refuse_axis0(node, node.attrs.get("axis", default), rank(node.inputs[0] if node.inputs else None))
    rule.__doc__ = f"``axis`` (default {default}) is not the batch dimension."
    return rule


def same_as_input(node: Node, carrying: set, batch) -> None:
    """Output 0 is input 0 at inference (any further output, such as ONNX
    Dropout's mask, has the same shape): outputs whose shape the file leaves
    unknown take input 0's."""
    if node.inputs and node.inputs[0] is not None:
        for o in node.outputs:
            if o is not None and o.shape is None and node.inputs[0].shape:
                o.shape = (None,) + tuple(node.inputs[0].shape[1:])


def batch_target(node: Node, target: list, x: Value) -> list:
    """A reshape target with its leading entry made -1, if it provably is
    the batch (TFLite RESHAPE, ONNX Reshape).

    Raises:
        InputError: the target mixes the batch with other dimensions.
    """
    per = per_sample(x)
    if not target:
        raise refusal(node, "reshapes a batch-carrying tensor to a scalar")
    if target[0] == -1 and -1 not in target[1:]:
        return target  # already polymorphic
    if target[0] != 1:
        raise refusal(node, f"reshapes to {target}, whose leading dimension is not the batch (1)")
    rest = list(target[1:])
    if per is None:
        raise refusal(node, f"reshapes to {target}, but its input's per-sample size is unknown")
    if rest.count(-1) > 1 or any(d < -1 for d in rest):
        raise refusal(node, f"has an invalid target shape {target}")
    known = int(np.prod([d for d in rest if d != -1], dtype=np.int64)) if rest else 1
    if -1 in rest:
        if known == 0 or per % known:
            raise refusal(node, f"reshapes {per} per-sample values to {target}")
        rest[rest.index(-1)] = per // known
    elif known != per:
        raise refusal(node, f"reshapes to {target}, which mixes the batch with the other dimensions "
                            f"({known} values per sample, the input has {per})")
    return [-1] + rest


# --- regions ------------------------------------------------------------------------


class Region(NamedTuple):
    """One region attribute of an op (a graph it runs: a WHILE body, a
    reduction computation), declared at the op's registration as
    ``regions={attribute: Region(...)}``."""

    #: ``arity(node) -> (inputs, outputs)``: what the body takes and returns
    #: given the node (None: not checked)
    arity: Callable[[Node], tuple]
    #: a scalar computation (reduction body, sort comparator, scatter
    #: update): it never sees a batch dimension
    scalar: bool = False
    #: the node must name this graph (a file without it is malformed)
    required: bool = False


def n_in(node: Node) -> int:
    """The node's input count (for :attr:`Region.arity`)."""
    return len(node.inputs)


def n_out(node: Node) -> int:
    """The node's output count (for :attr:`Region.arity`)."""
    return len(node.outputs)


def any_arity(node: Node) -> tuple:
    """:attr:`Region.arity` of a region whose arity is not checked."""
    return (None, None)


# --- output dtypes --------------------------------------------------------------------


def int32_out(node: Node, k: int, graphs) -> np.dtype:
    """``out_dtype`` of ops whose outputs are int32 (indices, shapes, and
    booleans, which RTen runs as int32)."""
    return np.dtype(np.int32)


def float32_out(node: Node, k: int, graphs) -> np.dtype:
    """``out_dtype`` of ops whose outputs are float32 (random draws, dequantized values)."""
    return np.dtype(np.float32)
