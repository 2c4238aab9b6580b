"""IR rewrites run by :func:`fbjax.load` before lowering.

:func:`set_batch_size` makes a model stored with batch 1 batch-polymorphic
(``batch_size=None``) or fixes another batch size (an int). Converters bake
the batch into the graph: every activation's shape starts with 1 and
RESHAPE targets are constants such as ``[1, 256, 4]``. The rewrite:

1. sets the leading dimension of every graph input to the batch; each must
   be 1 (or already unknown) in the file;
2. walks the nodes in order, following which tensors carry the batch (those
   computed from an input), and sets their leading dimension to the batch;
   each must be 1 (or unknown) in the file;
3. rewrites the shape constants that provably address the batch dimension:
   a RESHAPE target (shape input or ``new_shape``) whose leading entry is 1
   and whose other entries hold exactly the per-sample element count of the
   input gets ``-1`` as leading entry; a SLICE taking ``[0, 1)`` of the batch
   dimension takes all of it; a STRIDED_SLICE taking ``[0, 1)`` with stride 1
   gets its ``end_mask`` bit 0 set;
4. refuses, naming the node, what moves or mixes the batch: a RESHAPE that
   merges it with other dimensions, a TRANSPOSE that moves dimension 0,
   reductions, concatenations, packs, splits and gathers along axis 0,
   control flow (subgraphs), or any batch-carrying tensor whose leading
   dimension is not 1 in the file.

:func:`check_batch_size` then traces the lowered model abstractly
(``jax.eval_shape``, no compilation) at two batch sizes and checks that every
output's leading dimension follows the batch and the rest match the file.

Everything is rewritten on the IR :func:`fbjax.load` just read; new
constants are new :class:`~fbjax.ir.Value` objects, so the file's data and
:meth:`fbjax.Model.save` (which re-reads the file) are unaffected.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from .errors import InputError
from .ir import ModelIR, Node, Value

__all__ = ["set_batch_size", "check_batch_size"]

# ops that take an axis attribute / static axes input: refused when it is 0
_AXIS_ATTR_OPS = {"CONCATENATION", "PACK", "UNPACK", "GATHER", "SOFTMAX", "LOG_SOFTMAX", "CUMSUM",
                  "ARG_MAX", "ARG_MIN", "SPLIT", "SPLIT_V", "REVERSE_V2", "ONE_HOT"}
_REDUCE_OPS = {"MEAN", "SUM", "REDUCE_PROD", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_ANY", "REDUCE_ALL"}


def _err(node: Node, msg: str) -> InputError:
    return InputError(
        f"batch_size: cannot make the model batch-polymorphic: {node.location} ({node.op_name}) {msg}"
    )


def _const(v: Optional[Value]) -> Optional[np.ndarray]:
    return None if v is None or v.data is None else np.asarray(v.data)


def _new_const(v: Value, data: np.ndarray) -> Value:
    return Value(v.name, np.dtype(data.dtype), tuple(data.shape), None, data, v.index)


def _per_sample(v: Value) -> Optional[int]:
    if v.shape is None or any(d is None for d in v.shape[1:]):
        return None
    return int(np.prod(v.shape[1:], dtype=np.int64)) if len(v.shape) > 1 else 1


def _batch_target(node: Node, target: list, x: Value) -> list:
    """A RESHAPE target with its leading entry made -1, if it is the batch."""
    per = _per_sample(x)
    if not target:
        raise _err(node, "reshapes a batch-carrying tensor to a scalar")
    if target[0] == -1 and -1 not in target[1:]:
        return target  # already polymorphic
    if target[0] != 1:
        raise _err(node, f"reshapes to {target}, whose leading dimension is not the batch (1)")
    rest = list(target[1:])
    if per is None:
        raise _err(node, f"reshapes to {target}, but its input's per-sample size is unknown")
    if rest.count(-1) > 1 or any(d < -1 for d in rest):
        raise _err(node, f"has an invalid target shape {target}")
    known = int(np.prod([d for d in rest if d != -1], dtype=np.int64)) if rest else 1
    if -1 in rest:
        if known == 0 or per % known:
            raise _err(node, f"reshapes {per} per-sample values to {target}")
        rest[rest.index(-1)] = per // known
    elif known != per:
        raise _err(node, f"reshapes to {target}, which mixes the batch with the other dimensions "
                         f"({known} values per sample, the input has {per})")
    return [-1] + rest


def _rewrite(node: Node, carrying: set) -> None:
    op = node.op_name if node.op_set in ("tflite", "tflite.int") else None
    ins = node.inputs
    x = ins[0] if ins else None
    if op == "RESHAPE":
        shape = _const(ins[1]) if len(ins) > 1 else None
        if shape is not None and shape.ndim == 1:
            target = _batch_target(node, shape.astype(np.int64).tolist(), x)
            ins[1] = _new_const(ins[1], np.asarray(target, shape.dtype))
        elif len(ins) > 1 and ins[1] is not None and ins[1].data is None:
            raise _err(node, "takes its target shape from a computed tensor")
        new_shape = node.attrs.get("new_shape")
        if new_shape is not None and np.size(new_shape) > 0 and (shape is None or shape.ndim != 1):
            node.attrs = dict(node.attrs, new_shape=np.asarray(
                _batch_target(node, np.asarray(new_shape).reshape(-1).tolist(), x)))
    elif op == "TRANSPOSE":
        perm = _const(ins[1])
        if perm is None or int(np.asarray(perm).reshape(-1)[0]) != 0:
            raise _err(node, f"moves the batch dimension (perm {None if perm is None else perm.tolist()})")
    elif op == "SLICE":
        begin, size = _const(ins[1]), _const(ins[2])
        if begin is None or size is None:
            raise _err(node, "has computed begin/size")
        if int(begin[0]) != 0 or int(size[0]) not in (1, -1):
            raise _err(node, f"slices the batch dimension (begin {begin.tolist()}, size {size.tolist()})")
        new = size.copy()
        new[0] = -1
        ins[2] = _new_const(ins[2], new)
    elif op == "STRIDED_SLICE":
        a = node.attrs
        begin, end, strides = _const(ins[1]), _const(ins[2]), _const(ins[3]) if len(ins) > 3 else None
        if begin is None or end is None:
            raise _err(node, "has computed begin/end")
        if int(a.get("ellipsis_mask", 0) or 0) & 1:
            return  # dimension 0 is inside the ellipsis: taken whole
        if int(a.get("new_axis_mask", 0) or 0) & 1 or int(a.get("shrink_axis_mask", 0) or 0) & 1:
            raise _err(node, "adds or removes an axis in front of the batch")
        s0 = 1 if strides is None else int(strides[0])
        b_all = bool(int(a.get("begin_mask", 0) or 0) & 1) or int(begin[0]) == 0
        e_all = bool(int(a.get("end_mask", 0) or 0) & 1) or int(end[0]) >= 1
        if s0 != 1 or not b_all or not e_all:
            raise _err(node, f"slices the batch dimension (begin {begin.tolist()}, end {end.tolist()})")
        node.attrs = dict(a, end_mask=int(a.get("end_mask", 0) or 0) | 1, begin_mask=int(a.get("begin_mask", 0) or 0) | 1)
    elif op in _REDUCE_OPS:
        axes = _const(ins[1])
        rank = len(x.shape) if x is not None and x.shape is not None else None
        if axes is None or rank is None or any(int(ax) % rank == 0 for ax in np.asarray(axes).reshape(-1)):
            raise _err(node, "reduces over the batch dimension")
    elif op in _AXIS_ATTR_OPS:
        rank = len(x.shape) if x is not None and x.shape is not None else None
        axis = node.attrs.get("axis")
        if op in ("SPLIT",):
            axis = _const(ins[0])
            rank = len(ins[1].shape) if ins[1].shape is not None else None
        elif op == "SPLIT_V":
            axis = _const(ins[2])
        elif op in ("GATHER",):
            axis = node.attrs.get("axis", 0)
        if axis is not None and rank:
            if int(np.asarray(axis).reshape(-1)[0]) % rank == 0:
                raise _err(node, "works along the batch dimension (axis 0)")


def set_batch_size(ir: ModelIR, batch: Optional[int]) -> ModelIR:
    """Rewrite ``ir`` in place for batch ``batch`` (``None``: any batch).

    Raises:
        InputError: the model cannot be proven to carry its batch in the
            leading dimension (the message names the node and why).
    """
    if batch is not None and (not isinstance(batch, (int, np.integer)) or batch < 1):
        raise InputError(f"batch_size must be None, a positive int or 'file', got {batch!r}")
    g = ir.main_graph
    if len(ir.graphs) > 1:
        raise InputError(
            f"batch_size: the model has {len(ir.graphs)} subgraphs (control flow); the batch rewrite "
            "handles single-graph models only"
        )
    if not g.inputs:
        raise InputError("batch_size: the model has no inputs")
    carrying: set = set()
    for i, v in enumerate(g.inputs):
        if v.shape is None or len(v.shape) == 0 or v.shape[0] not in (1, None):
            raise InputError(
                f"batch_size: input {i} ({v.name!r}) has shape {v.shape}; the rewrite needs a leading "
                "batch dimension of 1 in the file"
            )
        v.shape = (batch,) + tuple(v.shape[1:])
        carrying.add(id(v))
    for node in g.nodes:
        if not any(v is not None and id(v) in carrying for v in node.inputs):
            continue
        _rewrite(node, carrying)
        for o in node.outputs:
            if o is None:
                continue
            if o.shape is None or len(o.shape) == 0 or o.shape[0] not in (1, None):
                raise _err(node, f"computes {o.name!r} of shape {o.shape} from the batch; its leading "
                                 "dimension is not the batch")
            o.shape = (batch,) + tuple(o.shape[1:])
            carrying.add(id(o))
    return ir


def check_batch_size(ir: ModelIR, program, batch: Optional[int]) -> None:
    """Trace ``program`` abstractly and check every output follows the batch.

    For ``batch=None`` two sizes (2 and 3) are traced, else ``batch``.

    Raises:
        InputError: an output's shape does not follow the batch (the model
            hides the batch somewhere the rewrite did not see).
    """
    import jax

    g = ir.main_graph
    params = {k: jax.ShapeDtypeStruct(np.shape(v), np.asarray(v).dtype) for k, v in program.params.items()}
    for n in ([2, 3] if batch is None else [batch]):
        ins = [jax.ShapeDtypeStruct((n,) + tuple(1 if d is None else d for d in v.shape[1:]), v.dtype)
               for v in g.inputs]
        try:
            outs = jax.eval_shape(program.apply, params, *ins)
        except InputError:
            raise
        except Exception as e:  # noqa: BLE001 - any trace failure means the rewrite is not valid
            raise InputError(f"batch_size: the rewritten model does not trace at batch {n}: "
                             f"{type(e).__name__}: {e}") from None
        for k, (o, v) in enumerate(zip(outs, g.outputs)):
            want = v.shape
            if want is None or len(o.shape) != len(want) or o.shape[0] != n or any(
                    w is not None and w != d for w, d in zip(want[1:], o.shape[1:])):
                raise InputError(
                    f"batch_size: output {k} ({v.name!r}) has shape {tuple(o.shape)} at batch {n}, "
                    f"expected ({n}, {', '.join(str(d) for d in want[1:])}); the model does not carry "
                    "its batch in the leading dimension everywhere"
                )
