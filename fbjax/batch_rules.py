"""How each op treats a leading batch dimension: the ``batch`` facts of the registry.

:func:`fbjax.passes.shapes.set_batch_size` walks a graph following the values that
carry the batch; for each node that reads one it calls the ``batch`` rule its
lowering was registered with (:class:`fbjax._registry.OpDef`). A rule is
``rule(node, carrying, batch)``: it raises :class:`~fbjax.errors.InputError`
(through :func:`refusal`, naming the node) when the op moves or mixes the
batch, and may rewrite the node's shape constants so that they follow the
batch (a RESHAPE target's leading 1 becomes -1). ``carrying`` is the set of
``id(Value)`` that carry the batch, ``batch`` the target size (``None``:
any). Ops registered without a rule keep dimension 0 as dimension 0 of their
outputs; the walk checks that on their shapes.

Attribute defaults here are the lowerings' (RTen's schema for the ``"onnx"``
op set). New constants are new :class:`~fbjax.ir.Value` objects, so the
file's data is never modified.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from .errors import InputError
from .ir import Node, Value


def refusal(node: Node, msg: str) -> InputError:
    """The error a rule raises: the node cannot follow a batch."""
    return InputError(
        f"batch_size: cannot make the model batch-polymorphic: {node.location} ({node.op_name}) {msg}"
    )


_err = refusal


def _const(v: Optional[Value]) -> Optional[np.ndarray]:
    return None if v is None or v.data is None else np.asarray(v.data)


def _new_const(v: Value, data: np.ndarray) -> Value:
    return Value(v.name, np.dtype(data.dtype), tuple(data.shape), None, data, v.index)


def _per_sample(v: Value) -> Optional[int]:
    if v.shape is None or any(d is None for d in v.shape[1:]):
        return None
    return int(np.prod(v.shape[1:], dtype=np.int64)) if len(v.shape) > 1 else 1


def _ints(v) -> list:
    return [] if v is None else [int(x) for x in np.asarray(v).reshape(-1)]


def _rank(v: Optional[Value]) -> Optional[int]:
    return None if v is None or v.shape is None else len(v.shape)


def _axis_is_batch(axis, rank: Optional[int]) -> bool:
    return rank is not None and rank > 0 and int(np.asarray(axis).reshape(-1)[0]) % rank == 0


def _carries(node: Node, carrying: set) -> list:
    return [v is not None and id(v) in carrying for v in node.inputs]


def batch_target(node: Node, target: list, x: Value) -> list:
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


def same_as_input(node: Node, carrying: set, batch) -> None:
    """Output 0 is input 0 at inference (any further output, such as ONNX
    Dropout's mask, has the same shape): outputs whose shape the file leaves
    unknown take input 0's."""
    if node.inputs and node.inputs[0] is not None:
        for o in node.outputs:
            if o is not None and o.shape is None and node.inputs[0].shape:
                o.shape = (None,) + tuple(node.inputs[0].shape[1:])


# --- TFLite builtins ("tflite"; their integer kernels "tflite.int" follow the same rules) ---

def tflite_reshape(node: Node, carrying: set, batch) -> None:
    """RESHAPE: a constant target (shape input or ``new_shape``) gets -1 as
    its leading entry when it provably addresses the batch."""
    ins = node.inputs
    x = ins[0] if ins else None
    shape = _const(ins[1]) if len(ins) > 1 else None
    if shape is not None and shape.ndim == 1:
        target = batch_target(node, shape.astype(np.int64).tolist(), x)
        ins[1] = _new_const(ins[1], np.asarray(target, shape.dtype))
    elif len(ins) > 1 and ins[1] is not None and ins[1].data is None:
        raise _err(node, "takes its target shape from a computed tensor")
    new_shape = node.attrs.get("new_shape")
    if new_shape is not None and np.size(new_shape) > 0 and (shape is None or shape.ndim != 1):
        node.attrs = dict(node.attrs, new_shape=np.asarray(
            batch_target(node, np.asarray(new_shape).reshape(-1).tolist(), x)))


def tflite_transpose(node: Node, carrying: set, batch) -> None:
    """TRANSPOSE: dimension 0 must stay first."""
    perm = _const(node.inputs[1])
    if perm is None or int(np.asarray(perm).reshape(-1)[0]) != 0:
        raise _err(node, f"moves the batch dimension (perm {None if perm is None else perm.tolist()})")


def tflite_slice(node: Node, carrying: set, batch) -> None:
    """SLICE: taking ``[0, 1)`` of the batch dimension takes all of it."""
    ins = node.inputs
    begin, size = _const(ins[1]), _const(ins[2])
    if begin is None or size is None:
        raise _err(node, "has computed begin/size")
    if int(begin[0]) != 0 or int(size[0]) not in (1, -1):
        raise _err(node, f"slices the batch dimension (begin {begin.tolist()}, size {size.tolist()})")
    new = size.copy()
    new[0] = -1
    ins[2] = _new_const(ins[2], new)


def tflite_strided_slice(node: Node, carrying: set, batch) -> None:
    """STRIDED_SLICE: ``[0, 1)`` with stride 1 gets ``end_mask`` bit 0 set."""
    a, ins = node.attrs, node.inputs
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


def tflite_reduce(node: Node, carrying: set, batch) -> None:
    """MEAN, SUM, REDUCE_*: constant axes (input 1) that leave dimension 0."""
    x = node.inputs[0] if node.inputs else None
    axes = _const(node.inputs[1])
    rank = _rank(x)
    if axes is None or rank is None or any(int(ax) % rank == 0 for ax in np.asarray(axes).reshape(-1)):
        raise _err(node, "reduces over the batch dimension")


def _refuse_axis0(node: Node, axis, rank) -> None:
    if axis is not None and rank:
        if int(np.asarray(axis).reshape(-1)[0]) % rank == 0:
            raise _err(node, "works along the batch dimension (axis 0)")


def tflite_axis_attr(node: Node, carrying: set, batch) -> None:
    """Ops with an ``axis`` attribute (CONCATENATION, PACK, SOFTMAX...): not 0."""
    _refuse_axis0(node, node.attrs.get("axis"), _rank(node.inputs[0] if node.inputs else None))


def tflite_gather(node: Node, carrying: set, batch) -> None:
    """GATHER: ``axis`` (default 0) is not the batch."""
    _refuse_axis0(node, node.attrs.get("axis", 0), _rank(node.inputs[0] if node.inputs else None))


def tflite_split(node: Node, carrying: set, batch) -> None:
    """SPLIT (axis, x): the constant axis is not 0."""
    _refuse_axis0(node, _const(node.inputs[0]), _rank(node.inputs[1]))


def tflite_split_v(node: Node, carrying: set, batch) -> None:
    """SPLIT_V (x, sizes, axis): the constant axis is not 0."""
    _refuse_axis0(node, _const(node.inputs[2]), _rank(node.inputs[0] if node.inputs else None))


# --- StableHLO ("stablehlo": stablehlo.flatbuf files and TFLite STABLEHLO_* builtins) ---

def hlo_not_followed(node: Node, carrying: set, batch) -> None:
    """gather, scatter, dynamic slices, custom_call, while, case...: refused."""
    raise _err(node, "reads a batch-carrying value; the batch rewrite does not follow the batch through it")


def hlo_transpose(node: Node, carrying: set, batch) -> None:
    perm = _ints(node.attrs.get("permutation"))
    if perm and perm[0] != 0:
        raise _err(node, f"moves the batch dimension (permutation {perm})")


def hlo_broadcast_in_dim(node: Node, carrying: set, batch) -> None:
    dims = _ints(node.attrs.get("broadcast_dimensions"))
    if not dims or dims[0] != 0:
        raise _err(node, f"moves the batch dimension (broadcast_dimensions {dims})")


def hlo_dimensions(node: Node, carrying: set, batch) -> None:
    """reduce, reverse: ``dimensions`` leave 0 alone."""
    dims = _ints(node.attrs.get("dimensions"))
    if 0 in dims:
        raise _err(node, f"works along the batch dimension (dimensions {dims})")


def hlo_reduce_window(node: Node, carrying: set, batch) -> None:
    a = node.attrs
    wd, ws = _ints(a.get("window_dimensions")), _ints(a.get("window_strides"))
    bd, pad = _ints(a.get("base_dilations")), _ints(a.get("padding"))
    if (wd[:1] or [1])[0] != 1 or (ws[:1] or [1])[0] != 1 or (bd[:1] or [1])[0] != 1 or any(pad[:2]):
        raise _err(node, f"windows the batch dimension (window_dimensions {wd}, window_strides {ws}, "
                         f"base_dilations {bd}, padding {pad[:2]})")


def _hlo_dimension(default: int):
    def rule(node: Node, carrying: set, batch) -> None:
        d = node.attrs.get("dimension")
        d = default if d is None else int(d)  # the lowerings' defaults
        rank = _rank(node.inputs[0] if node.inputs else None)
        if rank and d % rank == 0:
            raise _err(node, "works along the batch dimension (dimension 0)")
    rule.__doc__ = f"``dimension`` (default {default}) is not the batch."
    return rule


hlo_concatenate = _hlo_dimension(0)
hlo_sort = _hlo_dimension(-1)


def hlo_batch_norm_inference(node: Node, carrying: set, batch) -> None:
    if int(node.attrs.get("feature_index", 0) or 0) == 0:
        raise _err(node, "normalises along the batch dimension (feature_index 0)")


def hlo_pad(node: Node, carrying: set, batch) -> None:
    a = node.attrs
    for key in ("edge_padding_low", "edge_padding_high", "interior_padding"):
        if (_ints(a.get(key))[:1] or [0])[0] != 0:
            raise _err(node, f"pads the batch dimension ({key} {_ints(a.get(key))})")


def hlo_slice(node: Node, carrying: set, batch) -> None:
    """slice: ``[0, 1)`` of the batch takes all of it (an int batch only)."""
    a = node.attrs
    st, li = _ints(a.get("start_indices")), _ints(a.get("limit_indices"))
    if not st or st[0] != 0 or li[0] != 1:
        raise _err(node, f"slices the batch dimension (start_indices {st}, limit_indices {li})")
    if batch is None:
        raise _err(node, "slices with static bounds; with batch_size=None its limit on the batch "
                         "dimension is unknown (load with an int batch_size)")
    node.attrs = dict(a, limit_indices=np.asarray([batch] + li[1:], np.int64),
                      strides=np.asarray([1] + (_ints(a.get("strides")) or [1] * len(st))[1:], np.int64))


def hlo_convolution(node: Node, carrying: set, batch) -> None:
    a = node.attrs
    if _carries(node, carrying)[1:2] == [True]:
        raise _err(node, "takes a batch-carrying kernel")
    if int(a.get("input_batch_dimension", 0)) != 0 or int(a.get("output_batch_dimension", 0)) != 0 \
            or int(a.get("batch_group_count", 1) or 1) != 1:
        raise _err(node, "does not keep the batch as dimension 0 (input/output_batch_dimension, "
                         "batch_group_count)")


def hlo_dot(node: Node, carrying: set, batch) -> None:
    if _carries(node, carrying)[1:2] == [True]:
        raise _err(node, "contracts a batch-carrying right operand")


def hlo_dot_general(node: Node, carrying: set, batch) -> None:
    a = node.attrs
    carries = _carries(node, carrying)
    lb, rb = _ints(a.get("lhs_batching_dimensions")), _ints(a.get("rhs_batching_dimensions"))
    lc, rc = _ints(a.get("lhs_contracting_dimensions")), _ints(a.get("rhs_contracting_dimensions"))
    lhs_c, rhs_c = carries[0], carries[1] if len(carries) > 1 else False
    if lhs_c and rhs_c:
        ok = lb[:1] == [0] and rb[:1] == [0]
    elif lhs_c:
        ok = not lb and 0 not in lc
    else:
        ok = False
    if not ok:
        raise _err(node, f"does not keep the batch as dimension 0 (lhs batching {lb}, contracting {lc}; "
                         f"rhs batching {rb}, contracting {rc})")


# --- ONNX ("onnx": .rten files) ---

def onnx_shape_of(node: Node, carrying: set, batch) -> None:
    """Shape, Size: the batch would become a value."""
    raise _err(node, "reads the batch size as a value (shape arithmetic on the batch is not rewritten)")


def onnx_axis(node: Node, carrying: set, batch) -> None:
    """Softmax, Concat, Split, ArgMax, TopK...: ``axis`` (default 0) is not 0."""
    a = node.attrs
    if _axis_is_batch(a.get("axis", 0), _rank(node.inputs[0] if node.inputs else None)):
        raise _err(node, f"works along the batch dimension (axis {a.get('axis', 0)})")


def onnx_gather(node: Node, carrying: set, batch) -> None:
    a = node.attrs
    carries = _carries(node, carrying)
    rank = _rank(node.inputs[0] if node.inputs else None)
    if carries[1:2] == [True] and (carries[0] or not _axis_is_batch(a.get("axis", 0), rank)):
        raise _err(node, "takes batch-carrying indices (followed only into a table that does not carry "
                         "the batch, along axis 0)")
    if carries[0] and _axis_is_batch(a.get("axis", 0), rank):
        raise _err(node, "gathers along the batch dimension (axis 0)")


def onnx_cumsum(node: Node, carrying: set, batch) -> None:
    ins = node.inputs
    axis = _const(ins[1]) if len(ins) > 1 else None
    if axis is None or _axis_is_batch(axis, _rank(ins[0] if ins else None)):
        raise _err(node, "works along the batch dimension (or along a computed axis)")


def onnx_reduce(node: Node, carrying: set, batch) -> None:
    """Reduce*: constant axes (input 1 or ``axes``), not empty, not 0."""
    a, ins = node.attrs, node.inputs
    rank = _rank(ins[0] if ins else None)
    axes = _const(ins[1]) if len(ins) > 1 and ins[1] is not None else a.get("axes")
    if len(ins) > 1 and ins[1] is not None and ins[1].data is None:
        raise _err(node, "reduces over computed axes")
    axes = [] if axes is None else [int(v) for v in np.asarray(axes).reshape(-1)]
    if rank is None or not axes or any(ax % rank == 0 for ax in axes):
        raise _err(node, f"reduces over the batch dimension (axes {axes or 'all'})")


def onnx_flatten(node: Node, carrying: set, batch) -> None:
    rank = _rank(node.inputs[0] if node.inputs else None)
    if rank is not None and int(node.attrs.get("axis", 0)) % (rank + 1) == 0:
        raise _err(node, "flattens the batch dimension into the others (axis 0)")


def onnx_transpose(node: Node, carrying: set, batch) -> None:
    perm = node.attrs.get("perm")
    rank = _rank(node.inputs[0] if node.inputs else None)
    if (perm is None or len(perm) == 0) and (rank or 0) > 1 or perm is not None and len(perm) and \
            int(perm[0]) != 0:
        raise _err(node, f"moves the batch dimension (perm {None if perm is None else list(perm)})")


def onnx_squeeze(node: Node, carrying: set, batch) -> None:
    """Squeeze, Unsqueeze: no axis at the batch dimension."""
    op, a, ins = node.op_name, node.attrs, node.inputs
    axes = _const(ins[1]) if len(ins) > 1 else None
    if axes is None and a.get("axes") is not None:
        axes = np.asarray(a["axes"])
    out_rank = _rank(node.outputs[0]) if op == "Unsqueeze" else _rank(ins[0] if ins else None)
    if axes is None or out_rank is None or any(int(v) % out_rank == 0 for v in axes.reshape(-1)):
        raise _err(node, f"{'removes' if op == 'Squeeze' else 'inserts'} an axis at the batch dimension "
                         f"(axes {None if axes is None else axes.reshape(-1).tolist()})")


def onnx_reshape(node: Node, carrying: set, batch) -> None:
    """Reshape: a constant target gets -1 as its leading entry (0 copies)."""
    a, ins = node.attrs, node.inputs
    x = ins[0] if ins else None
    shape = _const(ins[1]) if len(ins) > 1 else None
    if shape is None or shape.ndim != 1:
        raise _err(node, "takes its target shape from a computed tensor")
    target = shape.astype(np.int64).tolist()
    if not a.get("allow_zero") and target and target[0] == 0:
        return  # copies the batch dimension
    if not a.get("allow_zero") and x.shape is not None:
        target = [x.shape[i] if d == 0 and i < len(x.shape) and x.shape[i] is not None else d
                  for i, d in enumerate(target)]
    ins[1] = _new_const(ins[1], np.asarray(batch_target(node, target, x), shape.dtype))


def onnx_slice(node: Node, carrying: set, batch) -> None:
    """Slice: ``[0, end >= 1)`` of dimension 0 takes all of it."""
    ins = node.inputs
    rank = _rank(ins[0] if ins else None)
    starts, ends = _const(ins[1]), _const(ins[2])
    axes = _const(ins[3]) if len(ins) > 3 and ins[3] is not None else None
    steps = _const(ins[4]) if len(ins) > 4 and ins[4] is not None else None
    if starts is None or ends is None or (len(ins) > 3 and ins[3] is not None and axes is None) or \
            (len(ins) > 4 and ins[4] is not None and steps is None):
        raise _err(node, "has computed starts/ends/axes/steps")
    axes = np.arange(len(starts)) if axes is None else axes.reshape(-1)
    new_ends = ends.copy()
    for k, ax in enumerate(axes):
        if rank and int(ax) % rank == 0:
            step = 1 if steps is None else int(steps[k])
            if int(starts[k]) != 0 or step != 1 or int(ends[k]) < 1:
                raise _err(node, f"slices the batch dimension (start {int(starts[k])}, end {int(ends[k])}, "
                                 f"step {step})")
            new_ends[k] = np.iinfo(ends.dtype).max
    ins[2] = _new_const(ins[2], new_ends)


def onnx_expand(node: Node, carrying: set, batch) -> None:
    """Expand, Tile: a constant shape/repeats leaving dimension 0 at 1."""
    ins = node.inputs
    rank = _rank(ins[0] if ins else None)
    shape = _const(ins[1]) if len(ins) > 1 else None
    if shape is None or rank is None or len(shape) > rank or (len(shape) == rank and int(shape[0]) != 1):
        raise _err(node, f"expands or repeats the batch dimension ({node.op_name} "
                         f"{None if shape is None else shape.tolist()})")


def onnx_pad(node: Node, carrying: set, batch) -> None:
    ins = node.inputs
    rank = _rank(ins[0] if ins else None)
    pads = _const(ins[1]) if len(ins) > 1 else None
    axes = _const(ins[3]) if len(ins) > 3 and ins[3] is not None else None
    if pads is None or rank is None:
        raise _err(node, "has computed pads")
    axes = np.arange(rank) if axes is None else axes.reshape(-1)
    n = len(axes)
    for k, ax in enumerate(axes):
        if int(ax) % rank == 0 and (int(pads[k]) or int(pads[k + n])):
            raise _err(node, f"pads the batch dimension (pads {pads.tolist()})")


def onnx_resize(node: Node, carrying: set, batch) -> None:
    ins = node.inputs
    scales = _const(ins[2]) if len(ins) > 2 and ins[2] is not None else None
    if len(ins) > 3 and ins[3] is not None:
        raise _err(node, "resizes to fixed sizes, whose batch entry is the file's batch")
    if scales is None or (scales.size and float(scales.reshape(-1)[0]) != 1.0):
        raise _err(node, "scales the batch dimension (or takes computed scales)")


def onnx_matmul(node: Node, carrying: set, batch) -> None:
    ins = node.inputs
    carries = _carries(node, carrying)
    ra, rb = _rank(ins[0]), _rank(ins[1])
    if carries[1] and not (carries[0] and ra == rb and (ra or 0) >= 3):
        raise _err(node, "multiplies by a batch-carrying right operand that is not batched like the left")


def onnx_gemm(node: Node, carrying: set, batch) -> None:
    if _carries(node, carrying)[1:2] == [True] or node.attrs.get("transpose_a"):
        raise _err(node, "contracts the batch dimension (transposed or batch-carrying operand)")


def onnx_einsum(node: Node, carrying: set, batch) -> None:
    carries = _carries(node, carrying)
    eq = str(node.attrs.get("equation", "")).replace(" ", "")
    lhs, _, out = eq.partition("->")
    terms = lhs.split(",")
    lead = {t[:1] for t, c in zip(terms, carries) if c}
    others = "".join(t for t, c in zip(terms, carries) if not c)
    if not out or len(lead) != 1 or out[:1] not in lead or not out[:1].isalpha() or out[:1] in others:
        raise _err(node, f"does not keep the batch as the leading subscript ({eq!r})")
