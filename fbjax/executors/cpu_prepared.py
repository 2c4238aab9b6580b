"""The prepared CPU executor: :class:`fbjax.Model`'s call on XLA:CPU.

The program is the model's graph traced with the load-time preparations
planned in :mod:`fbjax.executors.planner` (weights relaid, constant subgraphs
computed once, values read twice written once); see there for why each one.
"""

from __future__ import annotations

import dataclasses
import operator
import threading

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import ModelFormatError
from ..lower.build import Run
from .planner import constant_nodes, fan_out_values, matrix_operands, plan
from .jit import leaves_getter
from .tiered import TieredCall, wait_optimised, worth_tiering

__all__ = ["CpuPrepared", "prepared"]


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


class CpuPrepared:
    """``fn(params, *inputs) -> outputs``: the jitted forward pass of the
    prepared program (see :mod:`fbjax.executors.planner`).

    ``params`` is in the file's layout (``Model.params``, a mapping with at
    least the program's param names; other keys are ignored). The relaid
    copies of params are cached and rebuilt when one of their entries of
    ``params`` is another array than last time (identity checks, per call);
    values of :func:`constant_nodes` are computed at the first call.

    Attributes:
        name: ``"cpu_prepared"``.
        layouts: ``{param name: (file layout, prepared layout)}`` of the relaid params.
        jitted: the jit of the prepared program, ``jitted(*args(params), *inputs)``.
        quick: with ``tiered`` on CPU (:func:`~fbjax.executors.tiered.worth_tiering`), the jit of
            the same prepared program lowered with the plain kernel choices
            (``kernels="quick"``, :data:`fbjax.lower.build.KERNEL_CHOICES`),
            taking the same arguments; else None.
        run: what calls run: :attr:`jitted`, or with ``tiered`` on CPU a
            :class:`~fbjax.executors.tiered.TieredCall` of it (:attr:`quick`
            compiled quickly for the first call, the optimised program
            swapped in when ready).
    """

    name = "cpu_prepared"
    stateful = False
    unchecked = False

    def __init__(self, program, compiler_options=None, *, relay: bool = True, materialize: bool = True,
                 ahead: bool = True, tiered: bool = False):
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
                     for p in matrix_operands(program, node) if p < len(node.inputs) and node.inputs[p] is not None}
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
        fan_out = fan_out_values(program) if materialize else set()
        reg = _Inference(program.registry, fan_out, replaced, self._key)
        self.registry = reg
        self.program = dataclasses.replace(program, options=opts, registry=reg)
        # jit arguments: the params passed as they are, then the relaid ones (see args)
        self._relay_names = tuple(self.layouts)
        self._names = tuple(k for k in program.params if k not in self.layouts)
        self._all_names = self._names + self._relay_names
        self._getter = leaves_getter(self._all_names)
        self.jitted = jax.jit(self._runner(self.program), compiler_options=compiler_options)
        self._compiler_options = compiler_options
        self.quick = None
        self.run = self.jitted
        if worth_tiering(program, tiered):
            # the quick tier: the same prepared program lowered with the plain kernel choices (its own
            # registry view: the optimised program may be traced in the background thread meanwhile)
            quick = dataclasses.replace(program, options=dict(opts, kernels="quick"),
                                        registry=_Inference(program.registry, fan_out, replaced, self._key))
            self.quick = jax.jit(self._runner(quick), compiler_options=compiler_options)
            self.run = TieredCall(self.jitted, quick=self.quick)
        self._one = jax.device_put(np.float32(1))
        self._ahead = None  # {key: jax array} once computed
        self._ahead_avals = None  # {key: jax.ShapeDtypeStruct} once traced (_ahead_shapes)
        self._ahead_compute = None  # the function computing them (_ahead_fn)
        self._static_ahead: dict = {}  # {key: numpy} (non-float results)
        self._relay_cache = None  # (the params entries the relaid copies were made from, the copies)

    def _runner(self, prog):
        """The function :attr:`jitted` (or :attr:`quick`) traces: ``prog``
        (the prepared program, one registry view each) on the jit arguments
        of :meth:`args`; its traces run one at a time (the registry view
        holds the trace's run-time ``1.0`` and computed-ahead values)."""
        reg, names, relay_names = prog.registry, self._names, self._relay_names
        lock = threading.Lock()

        def run(used, relaid, one, ahead, *inputs):
            with lock:
                reg.one, reg.ahead = one, dict(ahead, **self._static_ahead)
                params = dict(zip(names, used))
                params.update(zip(relay_names, relaid))
                try:
                    outs = tuple(jnp.asarray(o) for o in prog.apply(params, None, *inputs)[0])
                finally:
                    reg.one = reg.ahead = None
            return outs[0] if len(outs) == 1 else outs

        return run

    def _compute_ahead(self):
        """Evaluate the :func:`constant_nodes` the computed-ahead values need,
        once, as one jitted function (one compile, which the persistent
        cache keeps; op-by-op evaluation compiled one tiny program per op and
        shape), by the graph builder's walker (integer results folded at
        trace time); relaid values are transposed in the same function.
        Their shapes are checked first (:meth:`_ahead_shapes`): nothing is
        computed for a file whose constants are too large to make."""
        self._ahead_shapes()
        self._ahead = jax.jit(self._ahead_fn())() if self.registry.constant else {}

    def _ahead_shapes(self) -> dict:
        """``{key: jax.ShapeDtypeStruct}`` of the computed-ahead values, from
        an abstract trace of their computation (nothing runs; the walker's
        size checks, :meth:`fbjax.ir.OpContext.check_size`, refuse values
        too large to make before XLA sees them); fills the shape-like
        (integer) results, which the trace folds to numpy."""
        if self._ahead_avals is None:
            self._ahead_avals = jax.eval_shape(self._ahead_fn()) if self.registry.constant else {}
        return self._ahead_avals

    def _ahead_fn(self):
        """The function computing the values of :meth:`_compute_ahead`
        (``{key: array}``), made once; tracing it sets :attr:`_static_ahead`."""
        if self._ahead_compute is None:
            self._ahead_compute = self._make_ahead_fn()
        return self._ahead_compute

    def _make_ahead_fn(self):
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
            static.clear()
            # the one graph walker (Program.eval_nodes): constant nodes have no param operands
            env = prog.eval_nodes(nodes, {}, Run({}), where="computed-ahead values")
            out = {}
            for node in replaced.values():
                for o in node.outputs:
                    if o is None:
                        continue
                    key, x = self._key[id(o)], env[id(o)]
                    if id(o) in self._ahead_ids:
                        if id(o) in self._ahead_layouts:
                            src, dst = self._ahead_layouts[id(o)]
                            if np.ndim(x) != len(src):  # planned from the file's declared rank
                                raise ModelFormatError(
                                    f"{node.location} ({node.op_name}): its output has rank {np.ndim(x)}, "
                                    f"but the file declares {list(o.shape)}")
                            x = jnp.transpose(x, [src.index(c) for c in dst])
                        out[key] = jnp.asarray(x)
                    else:
                        static[key] = np.asarray(x)  # shape-like: numpy, as the walker folds them
            return out

        self._static_ahead = static
        return compute

    @property
    def ahead_layouts(self) -> dict:
        """``{id(Value): (file layout, prepared layout)}`` of the values
        computed ahead and relaid (convolution weights made by constant subgraphs)."""
        return self._ahead_layouts

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

    def abstract_args(self, params: dict) -> tuple:
        """:meth:`args` as ``jax.ShapeDtypeStruct`` s: what a trace of the
        first call needs, with nothing computed ahead and no weight relaid
        (:meth:`trace` checks every shape before anything runs)."""
        sds = lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype)  # noqa: E731
        cur = self._getter(params)
        n = len(self._names)
        relaid = [jax.ShapeDtypeStruct(tuple(np.shape(a)[src.index(c)] for c in dst), a.dtype)
                  for a, (src, dst) in zip(cur[n:], (self.layouts[k] for k in self._relay_names))]
        return tuple(map(sds, cur[:n])), relaid, sds(self._one), self._ahead_shapes()

    def lower(self, params: dict, *inputs):
        """``jax.jit(...).lower`` of the prepared program (for inspection)."""
        return self.jitted.lower(*self.args(params), *inputs)

    def __call__(self, params: dict, *inputs):
        return self.run(*self.args(params), *inputs)

    def skip_quick_tier(self) -> None:
        """The first call compiles the optimised program directly
        (:meth:`fbjax.executors.tiered.TieredCall.skip_quick`); nothing when calls
        are not tiered or once called."""
        if isinstance(self.run, TieredCall):
            self.run.skip_quick()

    def wait_optimised(self, timeout=None) -> None:
        """Block until calls run the optimised program (:mod:`fbjax.executors.tiered`:
        after the first call, the background thread compiles it); at once
        when calls are not tiered or no call ran yet. ``timeout`` in seconds."""
        wait_optimised(self.run, timeout=timeout)

    def trace(self, params: dict, *specs):
        """Trace the first call on inputs of ``specs`` (``jax.ShapeDtypeStruct``)
        without running anything: the computed-ahead values and the relaid
        weights enter as shapes (:meth:`abstract_args`), so every check the
        shapes decide fires before any of them is computed (the first call
        computes them, and reuses this trace). Returns the outputs'
        ``ShapeDtypeStruct`` pytree; raises what the lowerings raise. When
        calls run in tiers, the quick program is traced (the one the first
        call compiles)."""
        return self.run.trace(*self.abstract_args(params), *specs).out_info


def prepared(program, compiler_options=None, *, tiered: bool = False) -> CpuPrepared:
    """The prepared program of ``program`` (see :func:`fbjax.executors.planner.worth_preparing`
    for when :class:`fbjax.Model` uses it); ``tiered``: the ``tiered_compile``
    load option."""
    return CpuPrepared(program, compiler_options, tiered=tiered)
