"""Executors: how a :class:`fbjax.Model` runs when called.

A Model holds its pure function (``Model.apply``) and exactly one executor,
chosen once at load by :func:`select`:

=================  ==========================================================
``"stateful"``     models with run state (resource variables, random ops):
                   :class:`~fbjax.executors.jit.Stateful`, ``fn(params, state, *xs)
                   -> (outputs, state)``
``"chunked"``      a fixed large batch on CPU whose activations exceed the
                   cache: :class:`~fbjax.executors.chunked.ChunkedCall`
``"trace_cache"``  the prepared CPU program kept traced in fbjax's cache:
                   :class:`~fbjax.executors.trace_cache.TraceCached`
``"cpu_prepared"`` the prepared CPU program: :class:`~fbjax.executors.cpu_prepared.CpuPrepared`
``"jit"``          everything else: :class:`~fbjax.executors.jit.Jit`, ``jax.jit``
                   of ``Model.apply`` (with the unchecked fast path)
=================  ==========================================================

Each executor has ``name`` (one of the above), ``stateful`` and
``unchecked`` (whether ``Model.__call__`` may try its ``jitted_leaves``
before checking inputs), and is called as ``fn(params, *inputs)`` (stateless)
or ``fn(params, state, *inputs)`` (stateful). All but ``"chunked"`` have
``trace(params[, state], *specs)``: the first call's trace on
``jax.ShapeDtypeStruct`` inputs, nothing run, returning the outputs'
``ShapeDtypeStruct`` pytree; :func:`fbjax.load` runs it so the lowerings'
errors are raised at load, and the first call reuses that trace.
"""

from __future__ import annotations

from typing import Callable, Optional

from .planner import worth_preparing
from .chunked import ChunkedCall, select_chunks
from .cpu_prepared import CpuPrepared
from .jit import Jit, Stateful, leaves_getter
from .tiered import TieredCall, worth_tiering
from .trace_cache import TraceCached, trace_base

__all__ = ["select", "Jit", "Stateful", "CpuPrepared", "TraceCached", "ChunkedCall", "select_chunks", "trace_base", "leaves_getter", "KINDS",
           "TieredCall", "worth_tiering"]

#: the executor names, in the order :func:`select` considers them
KINDS = ("stateful", "chunked", "trace_cache", "cpu_prepared", "jit")


def select(program, apply: Callable, apply_leaves: Callable, *, stateful: bool, compiler_options=None,
           trace_base: Optional[Callable] = None, chunks: Optional[Callable] = None, tiered: bool = False):
    """The one executor of a model (see the module docstring).

    Args:
        program: the lowered :class:`~fbjax.lower.build.Program`.
        apply: the model's pure ``apply(params, *inputs[, state=])``.
        apply_leaves: ``apply`` with the params as a tuple in
            ``program.params`` order, refusing unchecked inputs at trace time
            (for :class:`Jit`).
        stateful: whether the model has run state.
        trace_base: ``f(program) -> (digest, options) or None``: the trace
            cache key when the prepared program may be cached.
        chunks: ``f() -> ChunkedCall or None`` (:func:`fbjax.executors.chunked.select_chunks`
            for a model loaded with a fixed batch).
        tiered: the ``tiered_compile`` load option (:mod:`fbjax.executors.tiered`;
            it takes effect where :func:`worth_tiering` says so).
    """
    if stateful:
        return Stateful(apply, compiler_options)
    if chunks is not None:
        ex = chunks()
        if ex is not None:
            return ex
    if worth_preparing(program):
        base = trace_base(program) if trace_base is not None else None
        if base is not None:
            return TraceCached(program, compiler_options, trace_base=base, tiered=tiered)
        return CpuPrepared(program, compiler_options, tiered=tiered)
    return Jit(apply, apply_leaves, tuple(program.params), compiler_options,
               tiered=worth_tiering(program, tiered))
