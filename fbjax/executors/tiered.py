"""Tiered compilation of the CPU executors' programs: a quick first call,
the optimised program swapped in when it is ready.

XLA:CPU's backend compile of the optimised program is most of a model's
cold first call (seconds on a 2-core machine), and fbjax's CPU kernel
choices (shifted depthwise convolutions, kernel taps: fast to run) make
4-5x the StableHLO ops of the plain ``jax.lax`` lowering, which traces,
lowers and compiles that much longer. :class:`TieredCall` runs the
program's first signature in two tiers:

1. at once: the *quick program* -- for the prepared executors
   (:class:`~fbjax.executors.cpu_prepared.CpuPrepared`,
   :class:`~fbjax.executors.trace_cache.TraceCached`) the same prepared graph
   lowered with the ``kernels="quick"`` choices
   (:data:`fbjax.lower.build.KERNEL_CHOICES`: grouped convolutions as one
   ``conv_general_dilated``, no kernel taps, only large depthwise
   convolutions shifted), for the plain jit executor its own program --
   compiled with :func:`quick_options` (LLVM at ``-O0``, XLA's legacy
   elemental emitters, no YNNPACK fusion). The load-time trace
   (:func:`fbjax.model._trace_at_load`) is this program's, so the first call
   only lowers and compiles it. Measured on the 2-core machine (load ~3.4,
   ``benchmarks/compile_time.py``; benchmarks/README.md has the table):
   mediapipe_palm_detection_lite 3450 -> 1028 StableHLO ops, lowering 0.35
   -> 0.08 s, backend compile 0.92 -> 0.35 s, one quick-tier call ~80 ->
   ~170 ms (alone); load + first call of the 13 shared float models 0.09-2.00
   -> 0.09-0.93 s. The first call returns this tier's result, after which
2. a background thread traces the optimised program (the executor's own
   kernel choices; :class:`~fbjax.executors.trace_cache.TraceCached` exports it
   into fbjax's trace cache), lowers it and compiles it with the
   executor's own options (into JAX's persistent compilation cache when
   that is on); calls run it from the moment it is ready. The thread
   starts once the first call's result is computed, so it does not compete
   with that run for the cores.

The two tiers compute the same operations through differently lowered and
fused programs: float results agree within float32 rounding of the same
sums (``tests/test_tiered.py`` holds both to a float64 oracle), not bit for
bit; integer kernels compute exactly in either tier. Compiling the
optimised program's own lowering with the quick options would not make them
agree either: ``xla_backend_optimization_level=0`` alone changes float
results (measured: mediapipe_selfie_segmentation 6.1e-5 relative,
palm_detection_lite 9.2e-7; ``xla_cpu_use_fusion_emitters=False`` alone
kept the bits but compiled no faster). Which tier a call lands on depends
on timing and on the cache, hence tiering is an explicit load option,
``fbjax.load(..., tiered_compile=True)`` (:class:`fbjax.options.LoadOptions`),
off by default: without it every call runs the optimised program.

When the optimised executable of a program is known to be in the
persistent cache (:func:`mark_optimised` left a marker for its trace-cache
key after an earlier process compiled it), there is nothing to tier: the
cached ``Exported`` program is read and the plain jit reads its executable
from the cache.

Off by default (every first call compiles the optimised program
directly); ``tiered_compile=True``, or ``FBJAX_TIERED_COMPILE=1`` as its
default, turns it on for fbjax's CPU executors. Interpreter exit waits for a background compile still running (an XLA
compile cannot be interrupted safely, and its result fills the cache for the
next process).
"""

from __future__ import annotations

import atexit
import os
import threading
from typing import Callable, Optional

import jax

from .. import cache
from ..cache import NO_YNN_FUSION
from ..options import kernel_options

__all__ = ["CHEAP_OPTIONS", "TieredCall", "worth_tiering", "mark_optimised", "wait_optimised",
           "optimised_marked", "quick_options"]

#: XLA:CPU options of the quick first tier (see the module docstring for
#: the measurements). Tried and not kept: ``xla_llvm_disable_expensive_passes``
#: (compile unchanged), ``xla_backend_optimization_level=0`` alone (compile
#: -50 to -75 %, not enough for palm_detection_lite), and
#: ``xla_cpu_parallel_codegen_split_count=1`` (no change within the noise).
CHEAP_OPTIONS = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}

_threads: list = []
_threads_lock = threading.Lock()


def _join_all():
    with _threads_lock:
        pending = list(_threads)
    for t in pending:
        t.join()


atexit.register(_join_all)


def worth_tiering(program, tiered: bool) -> bool:
    """Whether the executors of ``program`` (a lowered
    :class:`~fbjax.lower.build.Program`) compile in tiers: ``tiered`` (the
    ``tiered_compile`` load option), its backend is ``"cpu"`` (on GPU/TPU the
    plain jit) and its graphs have at least ``KernelOptions.tiered_min_nodes``
    nodes (32: smaller programs compile in well under a second anyway, and
    the compiled executable's call costs ~6 us more than the jit's
    dispatch, tflm_sine_float 17 vs 11 us per call, which matters only for
    such tiny models)."""
    if not tiered or program.backend != "cpu":
        return False
    least = kernel_options(program).tiered_min_nodes
    n = 0
    for _ in program.model.iter_nodes():
        n += 1
        if n >= least:
            return True
    return False


def _marker(key: str) -> Optional[str]:
    d = cache.trace_cache_dir()
    return None if d is None or cache.cache_dir() is None else os.path.join(d, key + ".optimised")


def optimised_marked(key: str) -> bool:
    """Whether an earlier process compiled the optimised program of trace
    key ``key`` (:func:`fbjax.cache.trace_key`) into the persistent cache."""
    path = _marker(key)
    return path is not None and os.path.exists(path)


def mark_optimised(key: str) -> None:
    """Record that the optimised program of ``key`` is in the persistent
    cache (errors are ignored: without the marker the next process tiers again)."""
    path = _marker(key)
    if path is None:
        return
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb"):
            pass
    except OSError:
        pass


def quick_options() -> dict:
    """XLA options the quick tier compiles with, on top of its jit's own
    (the executor's, e.g. :func:`fbjax.cache.compiler_options`):
    :data:`CHEAP_OPTIONS` with XLA:CPU's YNNPACK fusion off whatever the
    environment says, as the quick program's grouped convolutions need
    (``KernelOptions.depthwise_strategy``)."""
    return dict(NO_YNN_FUSION, **CHEAP_OPTIONS)


class TieredCall:
    """``call(*args)``: ``jitted(*args)``, compiled in two tiers for the first
    argument signature (see the module docstring).

    Args:
        jitted: a ``jax.jit`` function: what calls with another signature
            than the first run, and by default both tiers' program.
        quick: a ``jax.jit`` of the quick program (the same computation on
            the same arguments, lowered with the plain kernel choices:
            ``kernels="quick"``, :data:`fbjax.lower.build.KERNEL_CHOICES`),
            compiled with :func:`quick_options` for the first call; default
            ``jitted`` (both tiers compile one lowering).
        optimised: ``f() -> jax.jit`` function whose program the optimised
            tier compiles (with its own options), called where that tier
            compiles (the background thread, or the first call after
            :meth:`skip_quick`; :class:`~fbjax.executors.trace_cache.TraceCached`
            traces and exports there); default ``jitted``.
        on_optimised: called once the optimised executable is ready (in the
            background thread, or in the first call after
            :meth:`skip_quick`), e.g. :func:`mark_optimised`.

    Attributes:
        tier: ``None`` before the first call, then ``"cheap"``, ``"optimised"``
            once swapped in, or ``"jit"`` (compiling in tiers failed: calls
            run the plain jit). Calls with another signature than the first
            always run the plain jit.
    """

    def __init__(self, jitted: Callable, on_optimised: Optional[Callable[[], None]] = None, *,
                 quick: Optional[Callable] = None, optimised: Optional[Callable[[], Callable]] = None):
        self.jitted = jitted
        self.quick = jitted if quick is None else quick
        self._optimised = optimised
        self._on_optimised = on_optimised
        self._compiled = None  # what calls with the first signature run
        self._lowered = None  # the quick tier's lowering, until the background thread took it
        self._lock = threading.Lock()
        self.tier: Optional[str] = None
        self.thread: Optional[threading.Thread] = None
        self._direct = False  # skip_quick(): the first call compiles the optimised program itself
        self._signature = None  # (shape, dtype) of the first call's array arguments

    def _start(self, args: tuple):
        lowered = self.quick.lower(*args)  # errors of tracing (bad inputs) propagate; the next call tries again
        try:
            cheap = lowered.compile(compiler_options=quick_options())
        except Exception:  # noqa: BLE001 - options another jaxlib lacks, AOT limits: the plain jit
            self.tier = "jit"
            return
        self._compiled, self.tier = cheap, "cheap"
        self._lowered = lowered  # the optimised tier compiles it too when quick is jitted

    def _optimise(self, args: tuple) -> None:
        """Compile the optimised tier for ``args`` and swap it in (tier
        ``"optimised"``; ``"jit"`` when that fails, and the plain jit then
        compiles and reports it)."""
        try:
            fn = self.jitted if self._optimised is None else self._optimised()
            lowered, self._lowered = self._lowered, None
            best = (lowered if fn is self.quick and lowered is not None else fn.lower(*args)).compile()
        except Exception:  # noqa: BLE001 - the plain jit then compiles (and reports) it
            self.tier = "jit"
            return
        self._compiled, self.tier = best, "optimised"
        if self._on_optimised is not None:
            self._on_optimised()

    def _launch(self, args: tuple):
        """Start the background thread compiling the optimised tier."""
        t = threading.Thread(target=self._optimise, args=(args,), name="fbjax-optimise", daemon=True)
        with _threads_lock:
            _threads[:] = [x for x in _threads if x.is_alive()]
            _threads.append(t)
        self.thread = t
        t.start()

    def skip_quick(self) -> bool:
        """Make the first call compile the optimised program directly, with no
        quick tier (for batch jobs, where the quick tier's compile and slower
        calls only add to the total: :func:`fbjax.infer`). Returns whether it
        took effect: False once a call ran."""
        with self._lock:
            if self.tier is not None:
                return False
            self._direct = True
            return True

    def trace(self, *args, **kwargs):
        """``quick.trace``: the first call's trace without compiling (JAX
        keeps it, so the first call's lowering reuses it)."""
        return self.quick.trace(*args, **kwargs)

    def lower(self, *args, **kwargs):
        """``jitted.lower`` (for inspection: the optimised program)."""
        return self.jitted.lower(*args, **kwargs)

    def wait(self, timeout: Optional[float] = None) -> str:
        """Wait for the optimised tier (for tests and benchmarks); returns :attr:`tier`."""
        if self.thread is not None:
            self.thread.join(timeout)
        return self.tier

    def __call__(self, *args):
        if self.tier is None:
            with self._lock:
                if self.tier is None:
                    self._signature = _signature(args)
                if self.tier is None and self._direct:
                    self._optimise(args)  # on failure (bad inputs too) tier "jit": the plain jit raises it below
                elif self.tier is None:
                    self._start(args)
                    if self.tier == "cheap":
                        try:
                            # the first call's run completes before the background work competes for the cores
                            return jax.block_until_ready(self._compiled(*args))
                        finally:
                            self._launch(args)
        # another signature than the first call's: the plain jit, without asking the compiled
        # executable first (its refusal costs ~1 ms per call: a batch-polymorphic model called
        # at batch 1, then by fbjax.infer at its step's batch)
        if self.tier != "jit" and _signature(args) == self._signature:
            try:
                return self._compiled(*args)
            except (TypeError, ValueError):  # (another pytree, weak types...): the plain jit
                pass
        return self.jitted(*args)


def _signature(args: tuple) -> tuple:
    """``(shape, dtype)`` of each top-level array argument (the inputs; the
    weights, passed as containers, are the same objects on every call)."""
    return tuple((a.shape, a.dtype) for a in args if hasattr(a, "shape") and hasattr(a, "dtype"))


def wait_optimised(*calls, timeout: Optional[float] = None) -> None:
    """Block until each of ``calls`` that is a :class:`TieredCall` whose
    first call ran has its optimised tier swapped in (or gave up on it:
    tier ``"jit"``); other callables, and tiered calls not called yet (no
    compile started), return at once. ``timeout``: seconds per call
    (``None``: no limit)."""
    for c in calls:
        if isinstance(c, TieredCall):
            c.wait(timeout)
