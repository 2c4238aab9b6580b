"""The prepared CPU executor with its traced program kept in fbjax's cache.

:class:`TraceCached` is :class:`~fbjax.executors.cpu_prepared.CpuPrepared` whose
first call reads the program, traced and lowered by an earlier process
(a ``jax.export.Exported``), from :func:`fbjax.cache.trace_cache_dir`, or
exports it and stores it there; later processes skip tracing the graph.
"""

from __future__ import annotations

import hashlib
from typing import Optional

import jax
import numpy as np

from .. import cache
from .cpu_prepared import CpuPrepared
from .tiered import TieredCall, mark_optimised, optimised_marked, wait_optimised

__all__ = ["TraceCached", "trace_base"]


class TraceCached(CpuPrepared):
    """``fn(params, *inputs) -> outputs``: :class:`CpuPrepared` run through
    the cached ``Exported`` program (see the module docstring).

    Args:
        trace_base: ``(model digest, load options)``, the key of the model's
            traced programs (with the call's argument shapes and dtypes).

    Attributes:
        name: ``"trace_cache"``.
        exported: the ``jax.export.Exported`` the calls run, once the first
            call made or read it (None before, or when export failed and the
            plain jit of the prepared program runs instead).
    """

    name = "trace_cache"

    def __init__(self, program, compiler_options=None, *, trace_base: tuple, tiered: bool = False):
        super().__init__(program, compiler_options, tiered=tiered)
        self.trace_base = trace_base
        self.exported = None
        self._cached_call = None  # what __call__ runs: self.jitted, or a jit of the Exported
        self._ran = False  # whether a call ran (the first one lowers the Exported program)
        self._skip_quick = False  # skip_quick_tier(): no quick tier for the first call

    @property
    def runs_exported(self) -> bool:
        """Whether calls run the cached (or just stored) ``Exported`` program."""
        return self._cached_call is not None and self._cached_call is not self.call

    def _export(self, key: str, args: tuple, inputs: tuple):
        """The optimised program traced and lowered into a ``jax.export.Exported``
        for ``args`` and ``inputs``, stored in the trace cache under ``key``;
        raises what export raises."""
        ex = cache.export_program(self.jitted, self.base.backend)(*args, *inputs)
        cache.save_exported(key, ex)
        return ex

    def _first_call(self, args: tuple, inputs: tuple):
        """What calls run: a jit of the ``Exported`` program read from the
        cache, or exported now and stored (one trace + lowering either way);
        :attr:`run` when export cannot take the program. On CPU, unless an
        earlier process left the optimised executable in the persistent
        cache (:func:`~fbjax.executors.tiered.optimised_marked`), calls run in
        tiers (:mod:`fbjax.executors.tiered`): the quick program
        (:attr:`CpuPrepared.quick`) first, while the background thread reads
        or exports the ``Exported`` program and compiles it."""
        try:
            digest, options = self.trace_base
            key = cache.trace_key(digest, options, tuple(args) + tuple(inputs),
                                  extra=f"{self.base.backend} {sorted((self._compiler_options or {}).items())}")
            exported = cache.load_exported(key)
            tiered = self.quick is not None and not self._skip_quick and not optimised_marked(key)
            if tiered:
                def optimised():  # in the background thread
                    try:
                        ex = exported if exported is not None else self._export(key, args, inputs)
                    except Exception:  # noqa: BLE001 - anything export cannot take: the plain jit
                        return self.jitted
                    self.exported = ex
                    return jax.jit(ex.call, compiler_options=self._compiler_options)

                def marked():  # the cached Exported program's executable is in the persistent cache now
                    if self.exported is not None:
                        mark_optimised(key)

                return TieredCall(self.jitted, on_optimised=marked, quick=self.quick, optimised=optimised)
            self.exported = exported if exported is not None else self._export(key, args, inputs)
            return jax.jit(self.exported.call, compiler_options=self._compiler_options)
        except Exception:  # noqa: BLE001 - anything export cannot take: the plain jit
            return self.call

    def __call__(self, params: dict, *inputs):
        args = self.args(params)
        first = not self._ran
        if self._cached_call is None:
            self._cached_call = self._first_call(args, inputs)
        self._ran = True
        if self._cached_call is not self.call:
            try:
                if first and self.exported is not None:
                    # lowered now: without JAX's LAPACK set-up (a scipy import) unless needed
                    with cache.lapack_init_skipped(self.exported):
                        return self._cached_call(*args, *inputs)
                return self._cached_call(*args, *inputs)
            except (TypeError, ValueError):  # other shapes/dtypes than the cached program's: trace them
                self._cached_call = self.call
        return self.call(*args, *inputs)

    def skip_quick_tier(self) -> None:
        """The first call compiles the optimised (``Exported``) program
        directly: when the calls' program is not chosen yet, no tiers; when
        it is (a load-time trace), its quick tier is skipped
        (:meth:`fbjax.executors.tiered.TieredCall.skip_quick`). Nothing once called."""
        super().skip_quick_tier()
        if self._cached_call is None:
            self._skip_quick = True
        elif isinstance(self._cached_call, TieredCall):
            self._cached_call.skip_quick()

    def wait_optimised(self, timeout=None) -> None:
        """:meth:`CpuPrepared.wait_optimised` for what calls run here (the
        tiers of the cached or exported program)."""
        wait_optimised(self._cached_call, self.call, timeout=timeout)

    def trace(self, params: dict, *specs):
        """The first call's work short of compiling, on inputs of ``specs``
        (``jax.ShapeDtypeStruct``): when calls run in tiers, the quick
        program's trace (the optimised one is exported in the background
        after the first call); else the ``Exported`` program read from the
        cache (a program fbjax traced before without error), or traced,
        exported and stored; when export cannot take the program, the
        plain jit's trace (:meth:`CpuPrepared.trace`). Returns the outputs'
        ``ShapeDtypeStruct`` pytree; raises what the lowerings raise."""
        if self._cached_call is None:
            self._cached_call = self._first_call(self.abstract_args(params), specs)
        if isinstance(self._cached_call, TieredCall):  # the quick program, which the first call compiles
            return self._cached_call.trace(*self.abstract_args(params), *specs).out_info
        if self.exported is not None:
            ex = self.exported
            return jax.tree_util.tree_unflatten(ex.out_tree, [jax.ShapeDtypeStruct(a.shape, a.dtype)
                                                              for a in ex.out_avals])
        return super().trace(params, *specs)


#: a model whose weight buffers (:attr:`fbjax.lower.build.Program.buffers`) hold more bytes than this keeps
#: no traced main program: the prepared CPU program reads them as constants, so its ``Exported`` artifact
#: would hold a copy of them (an LLM bundle's prefill graph: 130 MB per entry, written at load). LLM bundles
#: cache their signatures' programs, which take the buffers as arguments (``fbjax.llm_bundle``).
TRACE_MAX_BUFFER_BYTES = 16 * 2 ** 20


def trace_base(program, source, options, constant_inputs=None, *, embeds_buffers: bool = True) -> Optional[tuple]:
    """The key under which :class:`TraceCached` may keep the traced
    program of the model read from ``source`` (a path or bytes) in fbjax's
    cache (:func:`fbjax.cache.trace_cache_dir`): ``(model digest, load
    options)`` (``options``: the :class:`~fbjax.options.LoadOptions`; the
    values of ``constant_inputs``, ``{name: array}``, key it too) when the
    cache is on, the model's input shapes are static and every lowering it
    uses is fbjax's own (a user's custom op could change without fbjax's
    code changing), and, for a program that would hold the weight buffers
    as constants (``embeds_buffers``, the prepared CPU program), they are
    at most :data:`TRACE_MAX_BUFFER_BYTES`; else None."""
    if cache.trace_cache_dir() is None:
        return None
    if any(v.shape is None or None in v.shape for v in program.model.main_graph.inputs):
        return None
    if embeds_buffers and sum(np.asarray(b).nbytes for b in program.buffers.values()) > TRACE_MAX_BUFFER_BYTES:
        return None
    for node in program.model.iter_nodes():
        od = program.registry.get(node.op_set, node.op_name)
        if od is None or not getattr(od.fn, "__module__", "").startswith("fbjax."):
            return None
    digest = cache.source_digest(source)
    if digest is None:
        return None
    key = options.cache_key()  # every load option, KernelOptions field by field
    if constant_inputs:  # the bound values key the trace too
        bound = tuple((k, np.asarray(v).dtype.str, np.shape(v),
                       hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest())
                      for k, v in sorted(constant_inputs.items()))
        key += (repr(bound),)
    return digest, key
