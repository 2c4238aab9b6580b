"""The numpy reference interpreter: fbjax's correctness oracle.

:func:`run` walks a model's main graph node by node, keeping every value in
a dict, and calls the numpy implementation registered in :data:`REFERENCE`
for each node. The implementations are written from the TFLite kernels'
semantics, independently of the JAX lowering (:mod:`fbjax.lower`), and
import neither it nor jax: agreement between the two is evidence, not
tautology. They favour being obviously correct over being fast (float64
accumulation, one kernel tap at a time) but run MediaPipe-sized models in
seconds.

    >>> from fbjax.reference import run
    >>> outputs = run("model.tflite", image)   # list of numpy arrays
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any, Sequence

import numpy as np

from ..passes import reading
from .._registry import call_op, gap_detail, kernel_gaps
from ..errors import InputError, UnsupportedOperatorError
from ..ir import ModelIR, Node, OpContext, Value
from ..options import COMPOSITE_MODES
from .registry import REFERENCE, register

# Family modules, imported for their registrations (explicitly, never by discovery).
from .tflite import elementwise, conv, pool, shape, reduce, quant, resize, custom  # noqa: E402,F401
from .tflite import math, array, gather, nn, control, nms, rnn, state, random, mediapipe  # noqa: E402,F401
from . import stablehlo  # noqa: E402,F401  (registers the "stablehlo" ops)
from . import gpu  # noqa: E402,F401  (registers the "gpu_cl" ops: TFLite GPU delegate .bin files)

__all__ = ["REFERENCE", "ReferenceContext", "ReferenceRun", "register", "run", "supported_ops"]


class ReferenceRun:
    """One :func:`run` of the reference: its resource variables
    (``state``: variable name -> array) and its VAR_HANDLE handles
    (``var_names``, in evaluation order). Kept here, never on the model."""

    def __init__(self, composites: str = "litert"):
        self.state: dict = {}
        self.var_names: list = []
        self.composites = composites


class ReferenceContext(OpContext):
    """The :class:`~fbjax.ir.OpContext` handed to reference op functions.

    ``call_graph(index, *args)`` runs ``model.graphs[index]`` on numpy
    arguments and returns its outputs as a list (for control-flow ops);
    ``run`` is the :class:`ReferenceRun` the node is evaluated in.
    """

    def __init__(self, node: Node, model: ModelIR, run: ReferenceRun):
        super().__init__(node, model)
        self.run = run

    def call_graph(self, index: int, *args) -> list:
        if not 0 <= int(index) < len(self.model.graphs):
            raise self.error(f"graph index {index} is out of range ({len(self.model.graphs)} graphs)")
        graph = self.model.graphs[int(index)]
        if len(args) != len(graph.inputs):
            raise self.error(f"graph {index} takes {len(graph.inputs)} arguments, got {len(args)}")
        return _run_graph(self.model, int(index), [a if isinstance(a, list) else np.asarray(a) for a in args],
                          self.run)


def supported_ops() -> dict:
    """Op names the reference implements, grouped by op set."""
    return REFERENCE.ops()


def _as_model(model_or_path: Any) -> ModelIR:
    """``model_or_path`` (see :func:`run`) through the read step with the
    reference's facts (:func:`fbjax.passes.reading.read`: region arities
    checked, open output dtypes filled)."""
    ir = getattr(model_or_path, "ir", None)
    if isinstance(ir, ModelIR):
        model_or_path = ir
    if isinstance(model_or_path, (ModelIR, str, os.PathLike, bytes, bytearray, memoryview)):
        return reading.read(model_or_path, REFERENCE)
    raise TypeError(
        f"expected a path, bytes, a ModelIR or an object with an .ir attribute, got {type(model_or_path).__name__}")


def _check_supported(model: ModelIR) -> None:
    missing = Counter(n.key for n in model.iter_nodes() if n.key not in REFERENCE)
    n_missing = len(missing)
    gaps = kernel_gaps(model.iter_nodes(), REFERENCE)  # what the lowering refuses at load, refused here too
    if missing or gaps:
        missing.update(n.key for n, _ in gaps)
        raise UnsupportedOperatorError(
            missing, detail=" ".join(x for x in ("(the numpy reference interpreter has no implementation)"
                                                 if n_missing else "", gap_detail(gaps)) if x))


def _describe(v: Value) -> str:
    dims = "?" if v.shape is None else "(" + ", ".join("?" if d is None else str(d) for d in v.shape) + ")"
    return f"{v.name!r} {np.dtype(v.dtype).name}{dims}"


def _shape_matches(spec, got) -> bool:
    if spec is None:
        return True
    return len(spec) == len(got) and all(d is None or d == s for d, s in zip(spec, got))


def _check_inputs(graph, inputs: Sequence) -> list:
    if len(inputs) != len(graph.inputs):
        names = ", ".join(_describe(v) for v in graph.inputs)
        raise InputError(f"the model takes {len(graph.inputs)} input(s) ({names}), got {len(inputs)}")
    out = []
    for k, (v, x) in enumerate(zip(graph.inputs, inputs)):
        if isinstance(x, list):  # a sequence-typed input (ONNX/RTen Sequence ops): a list of arrays
            out.append([np.asarray(e) for e in x])
            continue
        x = np.asarray(x)
        if not _shape_matches(v.shape, x.shape):
            raise InputError(f"input {k} {_describe(v)} got an array of shape {tuple(x.shape)}")
        if x.dtype != v.dtype:
            if not np.can_cast(x.dtype, v.dtype, "same_kind"):
                raise InputError(f"input {k} {_describe(v)} got an array of dtype {x.dtype.name}")
            x = x.astype(v.dtype)
        out.append(x)
    return out


def _lookup(env: dict, v: Value, node) -> np.ndarray:
    if v in env:
        return env[v]
    if v.data is not None:
        return v.data
    if v.is_variable and v.static_shape:  # TFLite variable tensor: zeros, as after allocate_tensors
        return np.zeros(v.shape, v.dtype)
    if v.static_shape and 0 in v.shape:
        # A constant with no elements has an empty buffer, which the reader
        # cannot tell from "no data"; its value is the empty array anyway.
        return np.zeros(v.shape, v.dtype)
    where = f"{node.location} ({node.op_name})" if node is not None else "graph output"
    raise UnsupportedOperatorError(
        [node.key] if node is not None else [],
        detail=f"{where}: tensor {_describe(v)} is read before anything computes it "
        "(variable tensors are not supported by the reference)")


#: (id(model), value name) of the declared output shapes already warned about
_WARNED_SHAPES: set = set()


def _declared_shape_loses(ctx: ReferenceContext, v: Value, shape: tuple) -> None:
    """A graph output computed with another shape than the file declares:
    the computed shape wins (files are written with placeholder shapes,
    e.g. PaddlePaddle's scalar ``float32()`` outputs), warned once per output,
    as :class:`fbjax.Model` does for its ``outputs``."""
    import warnings

    key = (id(ctx.model), v.name)
    if key not in _WARNED_SHAPES:
        _WARNED_SHAPES.add(key)
        warnings.warn(f"output {_describe(v)} is computed with shape {tuple(shape)}; the file's declared shape is "
                      "wrong and the computed one is used", stacklevel=3)


def _store(ctx: ReferenceContext, env: dict, results, graph_outputs: frozenset = frozenset()) -> None:
    node: Node = ctx.node
    if isinstance(results, np.ndarray) or np.isscalar(results):
        results = [results]
    results = list(results)
    if len(results) != len(node.outputs):
        raise ctx.error(f"the reference produced {len(results)} outputs, the node has {len(node.outputs)}")
    for k, (v, r) in enumerate(zip(node.outputs, results)):
        if v is None:
            continue
        if isinstance(r, list):  # a sequence value (ONNX/RTen Sequence ops) stays a list of arrays
            env[v] = [np.asarray(e) for e in r]
            continue
        r = np.asarray(r)
        if r.dtype == np.dtype(v.dtype) and not _shape_matches(v.shape, r.shape) and id(v) in graph_outputs:
            _declared_shape_loses(ctx, v, r.shape)
        elif r.dtype != np.dtype(v.dtype) or not _shape_matches(v.shape, r.shape):
            raise ctx.error(
                f"output {k} computed as {r.dtype.name}{tuple(r.shape)}, but the model declares {_describe(v)}")
        env[v] = r


def _run_graph(model: ModelIR, index: int, args: list, run: ReferenceRun) -> list:
    graph = model.graphs[index]
    env: dict = {}
    for v, a in zip(graph.inputs, args):
        if v is not None:
            env[v] = a
    outs = frozenset(id(v) for v in graph.outputs if v is not None)
    for node in graph.nodes:
        opdef = REFERENCE.get(*node.key)
        if opdef is None:  # only reachable through call_graph on unchecked models
            raise UnsupportedOperatorError([node.key], detail="(the numpy reference has no implementation)")
        ctx = ReferenceContext(node, model, run)
        ins = [None if v is None else _lookup(env, v, node) for v in node.inputs]
        while ins and ins[-1] is None:  # trailing omitted optionals take the defaults
            ins.pop()
        _store(ctx, env, call_op(opdef, ctx, ins, node.attrs), outs)
    return [_lookup(env, v, None) for v in graph.outputs]


def run(model_or_path: Any, *inputs, composites: str = "litert") -> list:
    """Evaluate a model's main graph with numpy.

    Args:
        model_or_path: a path or the bytes of a model file, a
            :class:`~fbjax.ir.ModelIR`, or any object with an ``.ir``
            attribute holding one (such as a loaded fbjax model).
        *inputs: one array per graph input, in graph input order. Arrays of
            another dtype of the same kind (float64 for float32) are cast.
        composites: which ``stablehlo.composite`` ops run as their numpy
            twin (:mod:`fbjax.reference.composites`) instead of their
            decomposition: ``"litert"`` (default), ``"fused"`` or
            ``"decomposed"``, as :func:`fbjax.load`'s option of that name.

    Returns:
        One numpy array per graph output, in graph output order.

    Raises:
        UnsupportedOperatorError: the model uses ops the reference lacks
            (all of them are listed, before anything runs).
        InputError: wrong number of inputs, or a shape/dtype that does not
            match the graph's input specs (``None`` dims accept any size), or
            an unknown ``composites`` mode.
        ModelFormatError: a node has invalid attributes or shapes, or a
            region graph's arity contradicts its operator
            (:func:`fbjax.passes.reading.check_regions`).

    Warns:
        UserWarning: once per output whose computed shape differs from the
            shape the file declares (the computed array is returned).
    """
    if composites not in COMPOSITE_MODES:
        raise InputError(f"composites must be one of {list(COMPOSITE_MODES)}, got {composites!r}")
    model = _as_model(model_or_path)  # completed: region arities, open dtypes
    _check_supported(model)
    args = _check_inputs(model.main_graph, inputs)
    outputs = _run_graph(model, model.main, args, ReferenceRun(composites))
    # Constants pass through as read-only views on the model file: hand out copies.
    return [o if isinstance(o, list) or o.flags.writeable else o.copy() for o in outputs]
from . import tflite_int  # noqa: E402,F401  (registers the "tflite.int" and "fbjax" quantization ops)
from . import onnx  # noqa: E402,F401  (registers the "onnx" op set: RTen models)
