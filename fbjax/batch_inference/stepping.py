"""How :func:`fbjax.infer` runs its steps: chunking, streams, prefetch and
device sharding.

**One CPU device** (:class:`CpuSteps`): each step is one call of the
prepared program ``Model.__call__`` runs (:mod:`fbjax.executors.cpu_prepared`:
weights relaid once, values read twice materialized) on ``k`` examples
(:func:`plan`): the largest divisor of the step whose activations fit in
cache (``KernelOptions.chunk_bytes``; 1 for the MediaPipe detectors, whose
batched program is slower per example than batch-1 calls). A model loaded
with a fixed batch ``B`` (:func:`fixed_batch`) runs as its own calls of
``B`` examples: the compiled program of a loop of ``model(x)``, results
identical to the loop's. Steps are dispatched asynchronously (JAX's
dispatch returns before the program has run), as a loop of ``model(x)``
does; when the model's ``KernelOptions.chunk_threads`` allows several
streams, :class:`StreamChooser` times one stream against several steps at
once in worker threads and keeps the faster. Each step is the same program
on the same examples either way, so results never depend on timing.

**Otherwise** (:class:`MeshSteps`): each step is placed on a 1-D device
mesh (``jax.sharding.Mesh``, axis ``"batch"``; the next step is put while
the current one runs), split along its leading dimension with
``NamedSharding(mesh, P("batch"))`` and run by one jitted ``model.apply``
whose weights are replicated on every device.

:func:`run_steps` drives either: the next step is read (in a background
thread, :class:`Prefetch`, unless the source is cheap) while the current
ones run, and results are fetched (the only wait) once enough steps are
queued behind them, so the host never waits on the device per step.
"""

from __future__ import annotations

import os
import queue
import threading
import time
import warnings
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Optional

import jax
import numpy as np

from ..cache import compiler_options
from ..errors import InputError
from ..options import kernel_options

__all__ = ["effective_step_size", "effective_batch_size", "example_bytes", "plan", "chunk", "fixed_batch", "own_call",
           "per_example_apply", "per_example_call", "batch_polymorphic", "StreamChooser", "Prefetch", "Direct",
           "CpuSteps", "MeshSteps", "run_steps",
           "STREAM_PROBE_STEPS", "STREAM_KEEP_STEPS", "STREAM_KEEP_MAX_STEPS", "STREAM_MARGIN"]


def effective_step_size(step_size: Optional[int], n_devices: int) -> int:
    """Examples per step :func:`fbjax.infer` uses on ``n_devices`` local devices:
    ``step_size`` rounded up to a multiple of ``n_devices`` (default: 8 per
    device)."""
    if step_size is None:
        return 8 * n_devices
    return -(-int(step_size) // n_devices) * n_devices


def effective_batch_size(batch_size: Optional[int], n_devices: int) -> int:
    """Deprecated name of :func:`effective_step_size` (``batch_size`` is the
    model's leading dimension in :func:`fbjax.load`; a step of
    :func:`fbjax.infer` is its ``step_size``)."""
    warnings.warn("fbjax.batch_inference.effective_batch_size is deprecated: use effective_step_size "
                  "(infer's examples per step are its step_size)", DeprecationWarning, stacklevel=2)
    return effective_step_size(batch_size, n_devices)


def check_step_size(step_size, name: str = "step_size") -> None:
    """Raise :class:`InputError` unless ``step_size`` is None or a positive int."""
    if step_size is None:
        return
    if isinstance(step_size, bool) or not isinstance(step_size, (int, np.integer)):
        raise InputError(f"{name} must be a positive int or None, got {step_size!r}")
    if step_size < 1:
        raise InputError(f"{name} must be positive, got {step_size}")


# -- chunking -------------------------------------------------------------------------------------


def example_bytes(model) -> int:
    """Largest activation set of one example, in bytes: max over the main
    graph's nodes of their non-constant input + output bytes, an unknown
    (batch) dimension counted as 1 (at least 1; computed once per model,
    kept in its :attr:`~fbjax.Model.batch_cache`)."""
    cache = model.batch_cache
    if cache.example_bytes is None:
        best = 0
        for node in model.ir.main_graph.nodes:
            total = 0
            for v in list(node.inputs) + list(node.outputs):
                if v is None or v.data is not None or v.shape is None:
                    continue
                total += int(np.prod([1 if d is None else d for d in v.shape])) * np.dtype(v.dtype).itemsize
            best = max(best, total)
        cache.example_bytes = max(best, 1)
    return cache.example_bytes


def plan(model, batch: int) -> tuple:
    """``(k, streams)`` on one CPU device: up to ``streams`` steps of ``k``
    examples run at once. XLA:CPU runs a batch layer by layer, so a batch
    whose activations do not fit in cache streams each from memory and runs
    slower per example than smaller calls: ``k`` is the largest divisor of
    ``batch`` whose ``streams * k`` examples' activations fit within the
    model's ``KernelOptions.chunk_bytes`` (about what stays in cache from
    one layer to the next), at least 1. ``streams`` is the model's
    ``KernelOptions.chunk_threads``: two independent executions at once
    can fill the gaps between one stream's small per-layer kernels;
    whether they do run at once is timed while running
    (:class:`StreamChooser`), since on a machine whose cores other
    processes hold one stream wins (``benchmarks/infer.py``)."""
    per = example_bytes(model)
    ko = kernel_options(model.program)
    streams = max(1, ko.chunk_threads)
    best = 1
    for k in range(1, batch + 1):
        if batch % k == 0 and streams * k * per <= ko.chunk_bytes:
            best = k
    return best, streams


def chunk(model, batch: int) -> int:
    """Examples per call on a CPU device (the ``k`` of :func:`plan`)."""
    return plan(model, batch)[0]


def fixed_batch(model) -> Optional[int]:
    """The fixed batch ``B`` of a :class:`fbjax.Model` without run state whose
    every input and output has the leading dimension ``B``: 1 (the file's
    batch-1 shapes, ``fbjax.load(path)``; one example per call is the
    batch whatever the graph does with it), or the ``batch_size=B`` it was
    loaded with (the batch rewrite proved it the batch). :func:`fbjax.infer`
    on one CPU device runs it as calls of ``B`` examples, the calls a loop
    of ``model(x)`` makes. ``None`` for any other model (batch-polymorphic,
    stateful, a rank-0 input, a file's leading dimension other than 1,
    inputs of different leading dimensions)."""
    if model.state is not None:
        return None
    lead = {s.shape[0] if s.shape else None for s in model.inputs}
    if len(lead) != 1:
        return None
    b = lead.pop()
    if not isinstance(b, (int, np.integer)) or b < 1:
        return None
    if b != 1 and model.load_kwargs.get("batch_size") != b:
        # a leading dimension of the file's other than 1 need not be a batch (a [2, 3] input);
        # fbjax.load(path, batch_size=b) proved it is
        return None
    # each output's leading dimension must be the batch too, to split the results per example
    return b if all(o.shape and o.shape[0] == b for o in model.outputs) else None


def own_call(model):
    """``fn(params, *inputs)``: the compiled program :meth:`fbjax.Model.__call__`
    runs on inputs of the model's shapes and dtypes, without its checks:
    the Jit executor's fast path (``jitted_leaves``, the params as a tuple)
    while the model takes unchecked calls, else the executor itself. So a
    loop of ``model(x)`` before :func:`fbjax.infer` compiled its steps'
    program already, and both give the same bits."""
    ex = model.executor
    jl = getattr(ex, "jitted_leaves", None)
    if jl is None or model.checks_inputs:
        return ex
    leaves = ex.leaves

    def call(params, *inputs):
        return jl(leaves(params), *inputs)

    return call


def per_example_apply(model):
    """``fn(params, *inputs) -> tuple``: ``model``'s batch-1 program on each
    of a stack of examples under ``jax.vmap``, for a batch-1 model whose graph
    cannot take another batch (:func:`batch_polymorphic` refused it, as it
    does litert-torch's ViT, whose ``MEAN`` reduces over the batch
    dimension, or a model loaded from bytes): ``inputs[i]`` has shape
    ``(k, *input i's shape without its leading 1)``; output ``j`` comes as
    ``(k, *output j's shape without its leading 1)``. Each example sees the
    shapes of one ``model(x)`` call, so a graph that reduces over its batch
    of 1 computes each example as the call does; the vmapped program may
    order float sums differently from a batch-1 call (the bound is that of a
    reordered sum, as for :class:`fbjax.signature.ExamplesOf`)."""
    n = len(model.inputs)

    def one(params, *xs):
        outs = model.apply(params, *[x[None] for x in xs])
        return tuple(o[0] for o in (outs if isinstance(outs, tuple) else (outs,)))

    return jax.vmap(one, in_axes=(None,) + (0,) * n)


def per_example_call(model):
    """:func:`per_example_apply` jitted with the model's compile options
    (:func:`fbjax.cache.compiler_options`, as its own calls), made once per
    model and kept in its :attr:`~fbjax.Model.batch_cache`."""
    cache = model.batch_cache
    if cache.per_example_program is None:
        opts = compiler_options(model.program.backend, kernel_options(model.program).xla_defaults)
        cache.per_example_program = jax.jit(per_example_apply(model), compiler_options=opts)
    return cache.per_example_program


def batch_polymorphic(model, load, quiet: bool = False):
    """``model`` loaded again with ``batch_size=None`` (its other load options
    kept), made once per model and kept in its
    :attr:`~fbjax.Model.batch_cache`, so repeated :func:`fbjax.infer` calls
    neither parse, lower nor compile it again (a refusal is kept too).

    Args:
        load: :func:`fbjax.load`.
        quiet: return ``None`` instead of raising.

    Raises:
        InputError: a model loaded from bytes (no path to load again), or one
            whose graph cannot take another batch (the rewrite's reason).
    """
    cache = model.batch_cache
    kept = cache.batch_polymorphic
    if kept is None:
        if model.path is None:
            kept = InputError("infer needs a batch-polymorphic model here (several devices or an accelerator): "
                              "load it with fbjax.load(path, batch_size=None)")
        else:
            try:
                kept = load(model.path, **dict(model.load_kwargs, batch_size=None))
            except InputError as e:  # the batch rewrite refused the graph
                kept = e
        cache.batch_polymorphic = kept
    if isinstance(kept, InputError):
        if quiet:
            return None
        raise kept
    return kept


# -- streams --------------------------------------------------------------------------------------

#: {(process id, streams): ThreadPoolExecutor} running the streamed steps, kept between calls
#: (starting threads per call cost milliseconds on a busy machine); per process id, as a forked
#: child has none of its parent's threads
_STREAM_POOLS: dict = {}
_STREAM_LOCK = threading.Lock()


def stream_pool(streams: int) -> ThreadPoolExecutor:
    """The kept pool of ``streams`` worker threads of this process (made at first use)."""
    key = (os.getpid(), streams)
    with _STREAM_LOCK:
        pool = _STREAM_POOLS.get(key)
        if pool is None:
            pool = _STREAM_POOLS[key] = ThreadPoolExecutor(streams, thread_name_prefix="fbjax-infer-run")
        return pool


#: Steps :class:`StreamChooser` times each way (one stream, then several at once)
#: before keeping the faster way for :data:`STREAM_KEEP_STEPS` steps, and again; each
#: round that confirms the way kept doubles the steps it is kept, up to
#: :data:`STREAM_KEEP_MAX_STEPS` (a probe of the slower way costs its steps' extra time).
STREAM_PROBE_STEPS = 8
STREAM_KEEP_STEPS = 64
STREAM_KEEP_MAX_STEPS = 1024
#: Several streams are kept only when a probe's step took less than this fraction of one
#: stream's: otherwise the loop's way (one stream of asynchronous calls) runs, as noise on a
#: busy machine should not pick the way that loses when other processes hold the cores.
STREAM_MARGIN = 0.9


class StreamChooser:
    """How many steps :func:`fbjax.infer` runs at once on one CPU device, by
    timing: :data:`STREAM_PROBE_STEPS` steps with one stream (asynchronous
    calls, as a loop of ``model(x)``), as many with ``streams`` concurrent
    steps, then the faster of the two (several streams only when faster by
    :data:`STREAM_MARGIN`) for :data:`STREAM_KEEP_STEPS` steps;
    then it measures again (the load of a shared machine changes), and
    when the same way wins again it is kept twice as long, up to
    :data:`STREAM_KEEP_MAX_STEPS` steps (so the probes of the slower way
    cost at most ~1 % of the steps once the choice is stable; another
    winner starts again from :data:`STREAM_KEEP_STEPS`). Each
    step is the same program on the same examples either way, so the
    choice changes only the time, never a result.

    The caller waits for every step in flight (:meth:`due`) before each
    phase starts, so a phase's time is its own steps'. One chooser serves
    every :func:`fbjax.infer` call on a model with that many streams (kept
    in its :attr:`~fbjax.Model.batch_cache`): a call continues the rounds
    where the last one stopped (:meth:`resume`), so repeated calls on short
    datasets do not each spend their first steps probing, and a kept way
    runs its steps across calls. A probe phase is timed within one call:
    calls shorter than :data:`STREAM_PROBE_STEPS` steps never finish the
    first, so they run one stream, a loop's way."""

    def __init__(self, streams: int):
        self.streams = streams
        self.times: dict = {}  # streams -> seconds per step, this probe round
        self.phases = [(1, STREAM_PROBE_STEPS), (streams, STREAM_PROBE_STEPS)]
        self.mode, self.left = self.phases[0]
        self.start = None  # perf_counter at the phase's start; None: not started
        self.steps = 0
        self.history: list = []  # (mode, steps) of every phase run (for tests)
        self.kept = None  # the way the last round kept
        self.keep = STREAM_KEEP_STEPS  # steps the next winner is kept

    def due(self) -> bool:
        """Whether a phase ends (or a probe phase starts again) before the
        next step: the caller drains, then :meth:`begin`."""
        return self.left == 0 or (self.start is None and not self.keeping)

    @property
    def keeping(self) -> bool:
        """Whether the phase under way keeps a chosen way (else it probes one)."""
        return self.kept is not None and len(self.phases) == 1 and self.phases[0] == (self.kept, self.keep)

    def begin(self, now: float) -> None:
        """Close the phase that ran to its end (a probe: its time per step)
        and start the next at ``now``; a probe phase cut by the end of an
        :func:`fbjax.infer` call starts again whole (its time so far spans
        the gap between the calls)."""
        if self.left == 0:
            self._close(now)
        self.mode, self.left = self.phases[0]
        self.steps = 0
        self.start = now

    def end_call(self, now: float) -> None:
        """At the end of an :func:`fbjax.infer` call, every step finished:
        a phase whose last step was the call's is closed now (a probe timed
        up to here), not at the next call, whose start is after a gap."""
        if self.left == 0 and self.start is not None:
            self._close(now)

    def _close(self, now: float) -> None:
        """The phase under way ran its steps: record them (a probe timed in
        one piece: its time per step) and move to the next phase."""
        probe = not self.keeping
        if self.steps:
            self.history.append((self.mode, self.steps))
        if probe and self.start is not None and self.steps:
            self.times[self.mode] = (now - self.start) / self.steps
        self.phases.pop(0)
        if not self.phases:
            if len(self.times) == 2:  # both measured: keep the faster (one stream unless clearly slower)
                best = self.streams if self.times[self.streams] < STREAM_MARGIN * self.times[1] else 1
                self.keep = (min(2 * self.keep, STREAM_KEEP_MAX_STEPS) if best == self.kept
                             else STREAM_KEEP_STEPS)
                self.kept = best
                self.phases = [(best, self.keep)]
            else:  # after keeping, or a probe not timed in one piece: measure again
                self.phases = [(1, STREAM_PROBE_STEPS), (self.streams, STREAM_PROBE_STEPS)]
            self.times = {}
        self.mode, self.left = self.phases[0]
        self.steps = 0
        self.start = None

    def took(self) -> None:
        """One step of the current phase was dispatched."""
        self.left -= 1
        self.steps += 1

    def resume(self) -> None:
        """At the start of another :func:`fbjax.infer` call: a way being kept
        goes on where the last call left it (its steps count on); a probe
        phase under way starts again at the next step, whole."""
        if self.start is not None and self.steps:
            self.history.append((self.mode, self.steps))
        self.start = None
        self.steps = 0


def chooser(model, streams: int) -> StreamChooser:
    """The :class:`StreamChooser` of ``model``'s :func:`fbjax.infer` calls with
    ``streams`` streams (made at the first, then resumed)."""
    kept = model.batch_cache.stream_choosers
    ch = kept.get(streams)
    if ch is None:
        ch = kept[streams] = StreamChooser(streams)
    else:
        ch.resume()
    return ch


# -- prefetch -------------------------------------------------------------------------------------


class Prefetch:
    """``produce()`` called in a background thread, up to ``depth`` results
    ahead of :meth:`get`, so that reading files and assembling steps
    overlaps the device's work. ``produce`` returns ``(buffers, n)``;
    after the first ``n == 0`` (examples exhausted) it is not called again
    and :meth:`get` keeps returning that result. An exception raised by
    ``produce`` is raised by the :meth:`get` that would have returned its
    result."""

    def __init__(self, produce, depth: int = 2):
        self._last = None
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._work, args=(produce,), name="fbjax-infer-reader",
                                        daemon=True)
        self._thread.start()

    def _work(self, produce) -> None:
        while not self._stop.is_set():
            try:
                item = (produce(), None)
            except BaseException as e:  # noqa: BLE001 - handed to the consumer
                item = (None, e)
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=0.05)
                    break
                except queue.Full:
                    continue
            if item[1] is not None or item[0][1] == 0:
                return

    def get(self):
        if self._last is not None:
            return self._last
        while True:
            try:
                value, err = self._queue.get(timeout=0.05)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    raise RuntimeError("fbjax.infer: the example reader stopped") from None
        if err is not None:
            raise err
        if value[1] == 0:
            self._last = value
        return value

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


class Direct:
    """:class:`Prefetch`'s interface without a thread: ``produce()`` called by
    :meth:`get` itself (for sources whose steps cost nothing to make, such
    as views of an array: a thread would only add hand-offs)."""

    def __init__(self, produce):
        self._produce, self._last = produce, None

    def get(self):
        if self._last is not None:
            return self._last
        value = self._produce()
        if value[1] == 0:
            self._last = value
        return value

    def close(self) -> None:
        pass


def reader(produce, step: int):
    """:class:`Direct` for a cheap source, else a :class:`Prefetch` at least
    2 steps (~16 examples) ahead."""
    if getattr(produce, "cheap", False):
        return Direct(produce)
    return Prefetch(produce, depth=max(2, -(-16 // step)))


# -- steps ----------------------------------------------------------------------------------------


def _host(res) -> list:
    res = res if isinstance(res, tuple) else (res,)
    return [np.asarray(r) for r in res]


class CpuSteps:
    """Steps on one CPU device: each a call of the model's own compiled
    program (:func:`own_call`) on ``k`` examples, or with ``per_example``
    its batch-1 program on each of ``k`` examples under ``jax.vmap``
    (:func:`per_example_call`), dispatched asynchronously; with
    ``streams > 1`` the :class:`StreamChooser` decides per phase between
    one stream and ``streams`` steps at once in worker threads.

    The first call of a model on a step size compiles; on a model loaded
    with ``tiered_compile=True`` the batch job skips the quick tier (a
    batch job only pays its compile and slower calls) and, if the model ran
    before, waits for the optimised program after the first step."""

    def __init__(self, model, params, k: int, streams: int, per_example: bool = False):
        self.model, self.k, self.streams = model, k, streams
        if per_example:
            self.run1 = per_example_call(model)
        else:  # what Model.__call__ runs (fbjax.executors), without its input checks
            self.run1 = own_call(model)
        self.warm_key = ("per example" if per_example else "own", k)  # in batch_cache.compiled_steps
        model.skip_quick_tier()
        self.params = model.params if params is None else params  # (its relaid copies are cached per array)
        self.x64 = model.x64
        if streams == 1 and self.warm_key in model.batch_cache.compiled_steps:
            self.dispatch = self._call  # compiled and waited for before: the bare call
        if streams > 1:
            self.pool = stream_pool(streams)
            self.chooser = chooser(model, streams)

    def put(self, bufs):
        # numpy, copied by the call itself: on CPU an explicit device_put queues behind the
        # running executions (measured ~3 ms each on a busy 2-core machine)
        return bufs

    def _run_step(self, placed) -> list:
        with jax.enable_x64(self.x64):  # (JAX's config contexts are per thread)
            return _host(self.run1(self.params, *placed))

    def _call(self, placed, drain):
        return self.run1(self.params, *placed)  # asynchronous, as a loop of model(x)

    def dispatch(self, placed, drain):
        """Start one step; returns a handle for :meth:`fetch`. ``drain(0)``
        waits for every step in flight (before a timed phase starts)."""
        warm = self.model.batch_cache.compiled_steps
        if self.streams == 1:
            res = self.run1(self.params, *placed)
            if self.warm_key not in warm:  # the first step of this size compiled; if the model ran before
                # infer, that was the quick tier (fbjax.executors.tiered): the rest run the optimised program
                jax.block_until_ready(res)
                self.model.wait_optimised()
                warm.add(self.warm_key)
            self.dispatch = self._call
            return res
        if self.warm_key not in warm:
            done: Future = Future()
            done.set_result(self._run_step(placed))  # the first step of this size runs here (compiles)
            warm.add(self.warm_key)
            self.model.wait_optimised()  # the timings below run the optimised program
            return done
        ch = self.chooser
        if ch.due():
            drain(0)  # the phase before is timed on its own steps
            ch.begin(time.perf_counter())
        ch.took()
        if ch.mode == 1:
            return self.run1(self.params, *placed)  # asynchronous, as a loop of model(x)
        return self.pool.submit(self._run_step, placed)

    def finish(self) -> None:
        """Every step of the call finished: the stream chooser closes a phase that ended with it."""
        if self.streams > 1:
            self.chooser.end_call(time.perf_counter())

    def fetch(self, handle) -> list:
        """The step's outputs as host arrays (waits for it)."""
        if isinstance(handle, Future):
            return handle.result()
        if isinstance(handle, tuple):
            return [np.asarray(r) for r in handle]
        return [np.asarray(handle)]


class MeshSteps:
    """Steps over a 1-D device mesh: each step placed split along its
    leading dimension (``NamedSharding(mesh, P("batch"))``; across
    processes with ``multihost_utils``) and run by one jitted ``apply``
    whose weights are replicated; the jitted function is kept per model
    and devices in the owning model's :attr:`~fbjax.Model.batch_cache`."""

    def __init__(self, model, apply, params, devs, n_proc: int, cache, key):
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

        self.n_proc = n_proc
        self.mesh = Mesh(np.asarray(devs), ("batch",))
        self.spec = P("batch")
        self.sharding = NamedSharding(self.mesh, self.spec)
        replicated = NamedSharding(self.mesh, P())
        p = model.params if params is None else params
        self.params = {name: jax.make_array_from_callback(np.shape(v), replicated,
                                                          lambda idx, v=v: np.asarray(v)[idx])
                       for name, v in p.items()}
        # one jitted function per model and mesh, so repeated calls reuse the compilation
        key = (key, tuple(d.id for d in devs))
        fn = cache.mesh_programs.get(key)
        if fn is None:
            fn = cache.mesh_programs[key] = jax.jit(apply, out_shardings=self.sharding)
        self.fn = fn

    def put(self, bufs):
        from jax.experimental import multihost_utils

        if self.n_proc > 1:
            return [multihost_utils.host_local_array_to_global_array(b, self.mesh, self.spec) for b in bufs]
        return [jax.device_put(b, self.sharding) for b in bufs]

    def dispatch(self, placed, drain):
        return self.fn(self.params, *placed)

    def finish(self) -> None:
        pass

    def fetch(self, handle) -> list:
        from jax.experimental import multihost_utils

        res = handle if isinstance(handle, tuple) else (handle,)
        if self.n_proc > 1:
            res = multihost_utils.global_array_to_host_local_array(res, self.mesh, self.spec)
        return [np.asarray(r) for r in res]


def run_steps(rd, steps, sink, bar, per_step: int, n_proc: int) -> None:
    """Run every step of reader ``rd`` (:func:`reader`) with ``steps``
    (:class:`CpuSteps` or :class:`MeshSteps`) into ``sink``.

    Steps in flight: results are fetched (the only wait) once more than
    ``ahead`` steps are queued (at least ~32 examples), so the device always
    has work queued behind the running step, whatever the Python overhead
    between steps; the next step is put on the devices while this one runs.
    Multi-process: one small all-gather per step decides when every process
    is done (a process out of examples keeps feeding padding).
    """
    from jax.experimental import multihost_utils

    pending: deque = deque()  # (handle, n valid) per step dispatched, oldest first
    ahead = max(2, -(-32 // per_step)) if n_proc == 1 else 1
    fetch, add, put, get = steps.fetch, sink.add, steps.put, rd.get

    def drain(keep: int) -> None:
        while len(pending) > keep:
            handle, n_old = pending.popleft()
            add(fetch(handle), n_old)
            if bar is not None:
                bar.update(n_old)

    try:
        bufs, n = get()
        if n_proc == 1:
            placed = put(bufs) if n else None  # the step already on its way to the devices
            while n:
                # steps.dispatch is looked up per step: CpuSteps swaps in its bare call after the first
                pending.append((steps.dispatch(placed, drain), n))  # asynchronous
                bufs, n = get()
                placed = put(bufs) if n else None  # double buffering: put while the step runs
                if len(pending) > ahead:
                    drain(ahead)
        else:
            while np.asarray(multihost_utils.process_allgather(np.int32(n))).any():
                pending.append((steps.dispatch(put(bufs), drain), n))
                bufs, n = get()
                drain(ahead)
        drain(0)
        steps.finish()
    finally:
        rd.close()
        for handle, _ in pending:  # after an error: steps not started yet are dropped
            if hasattr(handle, "cancel"):
                handle.cancel()
