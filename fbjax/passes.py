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

Extra graphs are accepted only as region bodies of StableHLO ``reduce``,
``reduce_window``, ``scatter``, ``sort`` and ``select_and_scatter``: scalar
computations (rank-0 inputs and outputs) that never see the batch, so they
are left as they are. Any other graph (``while``/``case``/``composite``
bodies, TFLite WHILE/IF/CALL_ONCE, ONNX If/Loop, graphs nothing calls) is
refused. StableHLO ops (``"stablehlo"`` op set: ``stablehlo.flatbuf`` files
and TFLite ``STABLEHLO_*`` builtins) are checked by their dimension
attributes: the batch must stay dimension 0 of ``transpose``,
``broadcast_in_dim``, ``convolution``, ``dot``/``dot_general``, and must not
be reduced, windowed, padded, reversed, sorted, concatenated, sliced (with
``batch_size=None``) or normalised over; ``gather``, ``scatter``, dynamic
slices and ``custom_call`` on batch-carrying values are refused (a slice
taking ``[0, 1)`` of the batch takes all of it for an int batch). ONNX ops
(``"onnx"`` op set, ``.rten`` files) likewise: ``Softmax``, ``Concat``,
``Split``, ``Gather``... along axis 0, reductions over it (or over all
axes), ``Flatten`` at axis 0, ``Transpose``/``Squeeze``/``Unsqueeze``/
``Expand``/``Tile``/``Pad``/``Resize`` touching dimension 0, ``MatMul``/
``Gemm``/``Einsum`` contracting it, and ``Shape``/``Size`` of a
batch-carrying value are refused; a constant ``Reshape`` target gets ``-1``
as its leading entry as for TFLite, and a ``Slice`` of ``[0, end >= 1)`` of
dimension 0 takes all of it.

Shapes the file leaves unknown (``None``) on the outputs of pass-through ops
(``_PASS_THROUGH``: ONNX ``Dropout``, whose optional mask output ONNX shape
inference leaves unknown at opset 9, and ``Identity``; fbjax
``IDENTITY``), which compute output 0 as their input 0, are taken from
input 0.

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

#: (op set, op name) -> the attributes naming region bodies: graphs whose
#: block arguments are scalars (accumulators, elements, compared pairs), so
#: they never see the batch.
_REGION_ATTRS = {
    ("stablehlo", "stablehlo.reduce"): ("computation",),
    ("stablehlo", "stablehlo.reduce_window"): ("computation",),
    ("stablehlo", "stablehlo.scatter"): ("update_computation",),
    ("stablehlo", "stablehlo.sort"): ("comparator",),
    ("stablehlo", "stablehlo.select_and_scatter"): ("select", "scatter"),
}
#: op set -> attributes that name graphs (besides TFLite's ``*_subgraph_index``).
_GRAPH_ATTRS = {
    "stablehlo": ("computation", "update_computation", "comparator", "select", "scatter", "cond", "body",
                  "branches", "decomposition"),
    "onnx": ("then_branch", "else_branch", "body"),
}
#: (op set, op name) of ops whose output 0 is their input 0 at inference
#: (any further output, such as Dropout's mask, has the same shape).
_PASS_THROUGH = {("onnx", "Dropout"), ("onnx", "Identity"), ("fbjax", "IDENTITY")}


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


def _graph_refs(node: Node) -> list:
    """``[(attribute, graph index), ...]`` for every graph ``node`` names."""
    names = _GRAPH_ATTRS.get(node.op_set, ())
    out = []
    for k, val in node.attrs.items():
        if val is None or not (k in names or k.endswith("subgraph_index") or k.endswith("subgraph_indices")
                               or (k == "subgraph" and node.op_name == "CALL")):
            continue
        out += [(k, int(x)) for x in np.asarray(val).reshape(-1)]
    return out


def _check_subgraphs(ir: ModelIR) -> None:
    """Refuse a model whose extra graphs are not all scalar region bodies."""
    if len(ir.graphs) <= 1:
        return
    regions: dict = {}  # graph index -> where it is used as a region body
    for g in ir.graphs:
        for node in (g.nodes if g is not None else ()):
            region_attrs = _REGION_ATTRS.get((node.op_set, node.op_name), ())
            for attr, ref in _graph_refs(node):
                if attr not in region_attrs:
                    raise InputError(
                        f"batch_size: the model has control flow: {node.location} ({node.op_name}) runs "
                        f"subgraph {ref} ({attr}); the batch rewrite handles graphs whose extra subgraphs "
                        "are reduction/sort/scatter region bodies only")
                regions.setdefault(ref, f"{node.location} ({node.op_name}) {attr}")
    for gi, g in enumerate(ir.graphs):
        if gi == ir.main or g is None:
            continue
        if gi not in regions:
            raise InputError(
                f"batch_size: the model has {len(ir.graphs)} subgraphs and subgraph {gi} ({g.name!r}) is not "
                "the region body of a reduction, sort or scatter; the batch rewrite handles single-graph "
                "models and region bodies only")
        for kind, vs in (("input", g.inputs), ("output", g.outputs)):
            for k, v in enumerate(vs):
                if v is not None and v.shape != ():
                    raise InputError(
                        f"batch_size: subgraph {gi} ({g.name!r}), the region body of {regions[gi]}, has "
                        f"{kind} {k} of shape {v.shape}; the batch rewrite handles scalar region bodies only")


def _ints(v) -> list:
    return [] if v is None else [int(x) for x in np.asarray(v).reshape(-1)]


def _rewrite_stablehlo(node: Node, carrying: set, batch: Optional[int]) -> None:
    """Check (and for ``slice`` rewrite) a StableHLO op reading the batch."""
    op = node.op_name[len("stablehlo."):] if node.op_name.startswith("stablehlo.") else node.op_name
    a = node.attrs
    ins = node.inputs
    carries = [v is not None and id(v) in carrying for v in ins]
    x = ins[0] if ins else None
    rank = len(x.shape) if x is not None and x.shape is not None else None
    if op in ("gather", "scatter", "dynamic_slice", "dynamic_update_slice", "custom_call", "while", "case",
              "composite", "select_and_scatter", "rng_bit_generator", "dynamic_reshape",
              "dynamic_broadcast_in_dim", "real_dynamic_slice", "dynamic_pad", "dynamic_iota"):
        raise _err(node, "reads a batch-carrying value; the batch rewrite does not follow the batch through it")
    if op == "transpose":
        perm = _ints(a.get("permutation"))
        if perm and perm[0] != 0:
            raise _err(node, f"moves the batch dimension (permutation {perm})")
    elif op == "broadcast_in_dim":
        dims = _ints(a.get("broadcast_dimensions"))
        if not dims or dims[0] != 0:
            raise _err(node, f"moves the batch dimension (broadcast_dimensions {dims})")
    elif op in ("reduce", "reverse"):
        dims = _ints(a.get("dimensions"))
        if 0 in dims:
            raise _err(node, f"works along the batch dimension (dimensions {dims})")
    elif op == "reduce_window":
        wd, ws = _ints(a.get("window_dimensions")), _ints(a.get("window_strides"))
        bd, pad = _ints(a.get("base_dilations")), _ints(a.get("padding"))
        if (wd[:1] or [1])[0] != 1 or (ws[:1] or [1])[0] != 1 or (bd[:1] or [1])[0] != 1 or any(pad[:2]):
            raise _err(node, f"windows the batch dimension (window_dimensions {wd}, window_strides {ws}, "
                             f"base_dilations {bd}, padding {pad[:2]})")
    elif op in ("concatenate", "sort"):
        d = a.get("dimension")
        d = (-1 if op == "sort" else 0) if d is None else int(d)  # the lowerings' defaults
        if rank and d % rank == 0:
            raise _err(node, "works along the batch dimension (dimension 0)")
    elif op == "batch_norm_inference":
        if int(a.get("feature_index", 0) or 0) == 0:
            raise _err(node, "normalises along the batch dimension (feature_index 0)")
    elif op == "pad":
        for key in ("edge_padding_low", "edge_padding_high", "interior_padding"):
            if (_ints(a.get(key))[:1] or [0])[0] != 0:
                raise _err(node, f"pads the batch dimension ({key} {_ints(a.get(key))})")
    elif op == "slice":
        st, li = _ints(a.get("start_indices")), _ints(a.get("limit_indices"))
        if not st or st[0] != 0 or li[0] != 1:
            raise _err(node, f"slices the batch dimension (start_indices {st}, limit_indices {li})")
        if batch is None:
            raise _err(node, "slices with static bounds; with batch_size=None its limit on the batch "
                             "dimension is unknown (load with an int batch_size)")
        node.attrs = dict(a, limit_indices=np.asarray([batch] + li[1:], np.int64),
                          strides=np.asarray([1] + (_ints(a.get("strides")) or [1] * len(st))[1:], np.int64))
    elif op == "convolution":
        if carries[1:2] == [True]:
            raise _err(node, "takes a batch-carrying kernel")
        if int(a.get("input_batch_dimension", 0)) != 0 or int(a.get("output_batch_dimension", 0)) != 0 \
                or int(a.get("batch_group_count", 1) or 1) != 1:
            raise _err(node, "does not keep the batch as dimension 0 (input/output_batch_dimension, "
                             "batch_group_count)")
    elif op == "dot":
        if carries[1:2] == [True]:
            raise _err(node, "contracts a batch-carrying right operand")
    elif op == "dot_general":
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


def _axis_is_batch(axis, rank: Optional[int]) -> bool:
    return rank is not None and rank > 0 and int(np.asarray(axis).reshape(-1)[0]) % rank == 0


def _rank(v: Optional[Value]) -> Optional[int]:
    return None if v is None or v.shape is None else len(v.shape)


def _rewrite_onnx(node: Node, carrying: set) -> None:
    """Check (and for ``Reshape``/``Slice`` rewrite) an ONNX (RTen) op reading
    the batch. Attribute defaults are the lowerings' (RTen's schema)."""
    op, a, ins = node.op_name, node.attrs, node.inputs
    carries = [v is not None and id(v) in carrying for v in ins]
    x = ins[0] if ins else None
    rank = _rank(x)
    if op in ("Shape", "Size"):
        raise _err(node, "reads the batch size as a value (shape arithmetic on the batch is not rewritten)")
    if op in ("Softmax", "LogSoftmax", "Hardmax", "Concat", "Split", "ArgMax", "ArgMin", "TopK",
              "LayerNormalization", "GatherElements"):
        if _axis_is_batch(a.get("axis", 0), rank):
            raise _err(node, f"works along the batch dimension (axis {a.get('axis', 0)})")
    elif op == "Gather":
        if carries[1:2] == [True] and (carries[0] or not _axis_is_batch(a.get("axis", 0), rank)):
            raise _err(node, "takes batch-carrying indices (followed only into a table that does not carry "
                             "the batch, along axis 0)")
        if carries[0] and _axis_is_batch(a.get("axis", 0), rank):
            raise _err(node, "gathers along the batch dimension (axis 0)")
    elif op == "CumSum":
        axis = _const(ins[1]) if len(ins) > 1 else None
        if axis is None or _axis_is_batch(axis, rank):
            raise _err(node, "works along the batch dimension (or along a computed axis)")
    elif op.startswith("Reduce"):
        axes = _const(ins[1]) if len(ins) > 1 and ins[1] is not None else a.get("axes")
        if len(ins) > 1 and ins[1] is not None and ins[1].data is None:
            raise _err(node, "reduces over computed axes")
        axes = [] if axes is None else [int(v) for v in np.asarray(axes).reshape(-1)]
        if rank is None or not axes or any(ax % rank == 0 for ax in axes):
            raise _err(node, f"reduces over the batch dimension (axes {axes or 'all'})")
    elif op == "Flatten":
        if rank is not None and int(a.get("axis", 0)) % (rank + 1) == 0:
            raise _err(node, "flattens the batch dimension into the others (axis 0)")
    elif op == "Transpose":
        perm = a.get("perm")
        if (perm is None or len(perm) == 0) and (rank or 0) > 1 or perm is not None and len(perm) and \
                int(perm[0]) != 0:
            raise _err(node, f"moves the batch dimension (perm {None if perm is None else list(perm)})")
    elif op in ("Squeeze", "Unsqueeze"):
        axes = _const(ins[1]) if len(ins) > 1 else None
        if axes is None and a.get("axes") is not None:
            axes = np.asarray(a["axes"])
        out_rank = _rank(node.outputs[0]) if op == "Unsqueeze" else rank
        if axes is None or out_rank is None or any(int(v) % out_rank == 0 for v in axes.reshape(-1)):
            raise _err(node, f"{'removes' if op == 'Squeeze' else 'inserts'} an axis at the batch dimension "
                             f"(axes {None if axes is None else axes.reshape(-1).tolist()})")
    elif op == "Reshape":
        shape = _const(ins[1]) if len(ins) > 1 else None
        if shape is None or shape.ndim != 1:
            raise _err(node, "takes its target shape from a computed tensor")
        target = shape.astype(np.int64).tolist()
        if not a.get("allow_zero") and target and target[0] == 0:
            return  # copies the batch dimension
        if not a.get("allow_zero") and x.shape is not None:
            target = [x.shape[i] if d == 0 and i < len(x.shape) and x.shape[i] is not None else d
                      for i, d in enumerate(target)]
        ins[1] = _new_const(ins[1], np.asarray(_batch_target(node, target, x), shape.dtype))
    elif op == "Slice":
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
    elif op in ("Expand", "Tile"):
        shape = _const(ins[1]) if len(ins) > 1 else None
        if shape is None or rank is None or len(shape) > rank or (len(shape) == rank and int(shape[0]) != 1):
            raise _err(node, f"expands or repeats the batch dimension ({op} "
                             f"{None if shape is None else shape.tolist()})")
    elif op == "Pad":
        pads = _const(ins[1]) if len(ins) > 1 else None
        axes = _const(ins[3]) if len(ins) > 3 and ins[3] is not None else None
        if pads is None or rank is None:
            raise _err(node, "has computed pads")
        axes = np.arange(rank) if axes is None else axes.reshape(-1)
        n = len(axes)
        for k, ax in enumerate(axes):
            if int(ax) % rank == 0 and (int(pads[k]) or int(pads[k + n])):
                raise _err(node, f"pads the batch dimension (pads {pads.tolist()})")
    elif op == "Resize":
        scales = _const(ins[2]) if len(ins) > 2 and ins[2] is not None else None
        if len(ins) > 3 and ins[3] is not None:
            raise _err(node, "resizes to fixed sizes, whose batch entry is the file's batch")
        if scales is None or (scales.size and float(scales.reshape(-1)[0]) != 1.0):
            raise _err(node, "scales the batch dimension (or takes computed scales)")
    elif op == "MatMul":
        ra, rb = _rank(ins[0]), _rank(ins[1])
        if carries[1] and not (carries[0] and ra == rb and (ra or 0) >= 3):
            raise _err(node, "multiplies by a batch-carrying right operand that is not batched like the left")
    elif op == "Gemm":
        if carries[1:2] == [True] or a.get("transpose_a"):
            raise _err(node, "contracts the batch dimension (transposed or batch-carrying operand)")
    elif op == "Einsum":
        eq = str(a.get("equation", "")).replace(" ", "")
        lhs, _, out = eq.partition("->")
        terms = lhs.split(",")
        lead = {t[:1] for t, c in zip(terms, carries) if c}
        others = "".join(t for t, c in zip(terms, carries) if not c)
        if not out or len(lead) != 1 or out[:1] not in lead or not out[:1].isalpha() or out[:1] in others:
            raise _err(node, f"does not keep the batch as the leading subscript ({eq!r})")


def set_batch_size(ir: ModelIR, batch: Optional[int]) -> ModelIR:
    """Rewrite ``ir`` in place for batch ``batch`` (``None``: any batch).

    Raises:
        InputError: the model cannot be proven to carry its batch in the
            leading dimension (the message names the node and why).
    """
    if batch is not None and (not isinstance(batch, (int, np.integer)) or batch < 1):
        raise InputError(f"batch_size must be None (or 'dynamic'), a positive int or 'file', got {batch!r}")
    g = ir.main_graph
    _check_subgraphs(ir)
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
        if node.op_set == "stablehlo":
            _rewrite_stablehlo(node, carrying, batch)
        elif node.op_set == "onnx":
            _rewrite_onnx(node, carrying)
        if (node.op_set, node.op_name) in _PASS_THROUGH and node.inputs and node.inputs[0] is not None:
            for o in node.outputs:
                if o is not None and o.shape is None and node.inputs[0].shape:
                    o.shape = (None,) + tuple(node.inputs[0].shape[1:])
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


# --- constant_inputs= (issue 15 item 6) ------------------------------------------------------


def bind_inputs(ir: ModelIR, constants) -> None:
    """Bind named inputs of the main graph to constant values, in place:
    each becomes a constant :class:`~fbjax.ir.Value` (its ``data`` set, its
    shape the array's) and leaves ``Graph.inputs`` (and the inputs of the
    signatures that list it), so the lowering sees it at load time, as it
    sees values stored in the file (shape-like integers static, floats
    params).

    Args:
        ir: the model, as read from the file.
        constants: ``{input name: array-like}``; each array must have the
            input's shape (``None`` dimensions take the array's size) and a
            dtype that casts to the input's (``same_kind``, e.g. int64 to
            int32; a float array is not taken for an integer input).

    Raises:
        InputError: a name that is not an input of the model (the message
            lists them), an array of another shape or of a dtype that does
            not cast.
    """
    if not constants:
        return
    g = ir.main_graph
    by_name = {v.name: v for v in g.inputs}
    unknown = [n for n in constants if n not in by_name]
    if unknown:
        raise InputError(f"constant_inputs: {unknown} are not inputs of the model; its inputs are "
                         f"{[v.name for v in g.inputs]}")
    for name, x in constants.items():
        v = by_name[name]
        a = np.asarray(x)
        want = np.dtype(v.dtype)
        if a.dtype != want and not np.can_cast(a.dtype, want, "same_kind"):
            raise InputError(f"constant_inputs[{name!r}]: dtype {a.dtype} does not cast to the input's {want}")
        if v.shape is not None and (a.ndim != len(v.shape) or any(
                d is not None and d != s for d, s in zip(v.shape, a.shape))):
            dims = ", ".join("?" if d is None else str(d) for d in v.shape) + ("," if len(v.shape) == 1 else "")
            raise InputError(f"constant_inputs[{name!r}]: shape {a.shape}, the input is ({dims})")
        v.data = np.ascontiguousarray(a.astype(want, copy=False))
        v.shape = tuple(a.shape)
    bound = {id(by_name[n]) for n in constants}
    g.inputs = [v for v in g.inputs if id(v) not in bound]
    for sig in ir.signatures.values():
        for k in [k for k, v in sig.inputs.items() if id(v) in bound]:
            del sig.inputs[k]


from .lower.onnx._util import VALID_COUNT_SUFFIX  # noqa: E402 (the name the lowerings recognize)

#: Ops whose output size depends on the values of their inputs, and which
#: ``static_bounds=True`` pads to a bound: ``(op set, op name)``.
VALUE_SIZED_OPS = frozenset({("onnx", "NonMaxSuppression"), ("onnx", "NonZero"), ("onnx", "Loop"), ("onnx", "TopK")})


def add_valid_counts(ir: ModelIR) -> None:
    """Static-bound mode (``fbjax.load(..., static_bounds=True)``), in place:
    every :data:`VALUE_SIZED_OPS` node of the main graph (for ``Loop``: one
    with scan outputs) gets a trailing output, an int32 scalar
    ``"<output name>:valid_count"``, appended to the graph's outputs; its
    lowering (and the numpy reference) then returns the output padded to its
    bound (see :func:`fbjax.load`) plus that count (for ``Loop``: the
    iterations run; scan outputs padded to the trip count; ``TopK``: only
    where ``k`` is not stored in the file, outputs of the axis' full
    size)."""
    g = ir.main_graph
    for node in g.nodes:
        if (node.op_set, node.op_name) not in VALUE_SIZED_OPS:
            continue
        if node.op_name == "Loop":
            n_state = len(node.inputs) - 2 - len(node.attrs.get("body_captures", ()))
            if len(node.outputs) <= n_state:
                continue
            out = next((o for o in node.outputs[n_state:] if o is not None), None)
        elif node.op_name == "TopK":  # only a k the file does not store (computed by the graph)
            k = node.inputs[1] if len(node.inputs) > 1 else None
            if k is None or k.data is not None or len(node.outputs) != 2:
                continue
            x = node.inputs[0]
            out = node.outputs[0]
            for o in node.outputs:
                if o is not None and x.shape is not None:
                    o.shape = tuple(x.shape)  # the bound: the axis' full size
            if out is None:
                out = node.outputs[1]
        else:
            if len(node.outputs) != 1 or node.outputs[0] is None:
                continue
            out = node.outputs[0]
            out.shape = _value_sized_bound(node) or out.shape
        if out is None:
            continue
        count = Value(out.name + VALID_COUNT_SUFFIX, np.dtype(np.int32), ())
        node.outputs = list(node.outputs) + [count]
        g.outputs = list(g.outputs) + [count]


def _value_sized_bound(node: Node):
    """The padded output shape of a :data:`VALUE_SIZED_OPS` node where the
    input shapes (and NMS's constant ``max_output_boxes_per_class``) give it,
    else None."""
    x = node.inputs[0] if node.inputs else None
    if x is None or not x.static_shape:
        return None
    if node.op_name == "NonZero":
        return (len(x.shape), int(np.prod(x.shape, dtype=np.int64)))
    scores = node.inputs[1] if len(node.inputs) > 1 else None
    mx = node.inputs[2] if len(node.inputs) > 2 else None
    if scores is None or not scores.static_shape or len(scores.shape) != 3:
        return None
    per = 0 if mx is None else (None if mx.data is None else int(np.asarray(mx.data).reshape(-1)[0]))
    if per is None:
        return None
    b, c, n = scores.shape
    return (b * c * min(max(per, 0), n), 3)
