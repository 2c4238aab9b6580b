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

Extra graphs (:attr:`fbjax.ir.Node.regions`) are accepted only as region
bodies declared ``scalar_regions`` at registration: StableHLO ``reduce``,
``reduce_window``, ``scatter`` and ``sort``: scalar
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
(rule :func:`fbjax.op_rules.same_as_input`: ONNX ``Dropout``, whose
optional mask output ONNX shape inference leaves unknown at opset 9, and
``Identity``; fbjax ``IDENTITY``), which compute output 0 as their input 0,
are taken from input 0.

What each op does with the batch is its ``batch`` fact, declared at its
registration (:class:`fbjax._registry.OpDef`; the rules are in each op's
family file, written with :mod:`fbjax.op_rules`); this module only walks the
graph. TFLite integer kernels (``"tflite.int"``) without a rule of their own follow the builtin's.
Ops the registry does not know are left for :func:`fbjax.load` to report as
unsupported.

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

from ..errors import InputError, UnsupportedOperatorError
from ..op_rules import refusal
from ..ir import VALID_COUNT_SUFFIX, ModelIR, Node, Value

__all__ = ["set_batch_size", "check_batch_size"]

def _graph_refs(node: Node) -> list:
    """``[(attribute, graph index), ...]`` for every graph ``node`` runs."""
    return [(k, int(x)) for k, refs in node.regions.items() for x in refs]


def _check_subgraphs(ir: ModelIR, registry) -> None:
    """Refuse a model whose extra graphs are not all scalar region bodies
    (the ``scalar_regions`` facts of the ops that run them)."""
    if len(ir.graphs) <= 1:
        return
    regions: dict = {}  # graph index -> where it is used as a region body
    for g in ir.graphs:
        for node in (g.nodes if g is not None else ()):
            od = registry.get(node.op_set, node.op_name)
            region_attrs = od.scalar_regions if od is not None else ()
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


def _rule(registry, node: Node):
    od = registry.get(node.op_set, node.op_name)
    rule = od.batch if od is not None else None
    if rule is None and node.op_set == "tflite.int":
        od = registry.get("tflite", node.op_name)
        rule = od.batch if od is not None else None
    return rule


def set_batch_size(ir: ModelIR, batch: Optional[int], *, registry) -> ModelIR:
    """Rewrite ``ir`` in place for batch ``batch`` (``None``: any batch).

    ``registry``: the lowering registry (:data:`fbjax.lower.LOWERINGS`)
    whose ``batch`` facts say how each op treats the batch.

    Raises:
        InputError: the model cannot be proven to carry its batch in the
            leading dimension (the message names the node and why).
    """
    if batch is not None and (not isinstance(batch, (int, np.integer)) or batch < 1):
        raise InputError(f"batch_size must be None (or 'dynamic'), a positive int or 'file', got {batch!r}")
    g = ir.main_graph
    _check_subgraphs(ir, registry)
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
        rule = _rule(registry, node)
        if rule is not None:
            rule(node, carrying, batch)
        for o in node.outputs:
            if o is None:
                continue
            if o.shape is None or len(o.shape) == 0 or o.shape[0] not in (1, None):
                raise refusal(node, f"computes {o.name!r} of shape {o.shape} from the batch; its leading "
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
            outs = jax.eval_shape(lambda p, *xs: program.apply(p, None, *xs)[0], params, *ins)
        except (InputError, UnsupportedOperatorError):  # an op fbjax cannot lower says so itself
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


# --- constant_inputs= ------------------------------------------------------


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


def add_valid_counts(ir: ModelIR, *, registry) -> None:
    """Static-bound mode (``fbjax.load(..., static_bounds=True)``), in place:
    every main-graph node whose op was registered with a ``static_bound``
    rule (declared beside the op: ONNX NonZero, NonMaxSuppression, TopK,
    Loop; TFLite WHERE, UNIQUE) and that the rule says needs one gets a
    trailing output, an int32 scalar ``"<output name>:valid_count"``,
    appended to the graph's outputs; the rule sets the padded outputs'
    shapes to their bounds. Its lowering (and the numpy reference) then
    returns the outputs padded to those bounds plus the count (see
    :func:`fbjax.load`). ``registry``: the lowering registry
    (:data:`fbjax.lower.LOWERINGS`)."""
    g = ir.main_graph
    for node in g.nodes:
        od = registry.get(node.op_set, node.op_name)
        rule = od.static_bound if od is not None else None
        out = rule(node) if rule is not None else None
        if out is None:
            continue
        count = Value(out.name + VALID_COUNT_SUFFIX, np.dtype(np.int32), ())
        node.outputs = list(node.outputs) + [count]
        g.outputs = list(g.outputs) + [count]
