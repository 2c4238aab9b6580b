"""Batch inference over every device: :func:`infer`.

::

    model = fbjax.load("model.tflite", batch_size=None)     # any batch
    probs = fbjax.infer(model, images, step_size=64)        # all local devices
    fbjax.infer(model, "samples/", step_size=64, out="preds.npz")    # streamed

Examples are cut into batches, read and assembled in a background thread
ahead of the device: an array of examples is passed a view per step (no
copy); a directory's ``.npy`` files of one input are read straight into
the step's buffer (each header compared as bytes with the one parsed
before, the data read with ``readinto``; files of another dtype, shape or
order are loaded and checked the general way). On one CPU device each batch
runs as calls of the prepared program ``Model.__call__`` uses
(:mod:`fbjax.run.cpu_prepared`: weights relaid once, values read twice
materialized) on chunks of examples whose activations fit in cache (the
largest divisor of the batch under ``KernelOptions.chunk_bytes``; 1 for the
MediaPipe detectors, whose batched program is slower per example than
batch-1 calls); for the MediaPipe detectors that is, per example, the
program of a loop of ``model(x)`` with less host work per call
(``benchmarks/infer.py``). A model loaded with a fixed batch ``B``
(``fbjax.load(path)``: the file's shapes, ``B = 1`` for most files) runs
there as its own calls of ``B`` examples, the compiled program of a loop of
``model(x)`` (compiled already when the model ran before; results
identical to the loop's), not loaded again; except when several examples'
activations fit in cache (small models, whose batch-1 calls cost mostly
host work): then it is loaded again batch-polymorphic, once, when its graph
allows. The steps run either as one stream of asynchronous calls or two at a time in worker
threads (as :class:`fbjax.run.chunked.ChunkedCall` does), whichever the
first steps measure faster, measured again every
:data:`STREAM_KEEP_STEPS` steps (:class:`_StreamChooser`). The chunk size
comes from the model's activation sizes alone and each step is the same
program either way, so results never depend on timing. Otherwise each batch
is placed on a 1-D device mesh (``jax.sharding.Mesh`` with axis
``"batch"``; the next batch is put while the current one runs), split along
its leading dimension with ``NamedSharding(mesh, P("batch"))``, and run by
one jitted ``model.apply`` whose weights are replicated on every device.
The last partial batch is padded with zeros to the full batch (one shape:
no recompilation) and the padding is trimmed from the results. Steps are
dispatched asynchronously and results are copied back only once ~32
examples (at least two steps) are queued behind them, so the host never
waits on the device per step; results go either to memory or, batch by
batch, to an ``.npy``/``.npz`` file, so the dataset never has to fit in
memory.

Multi-host: under ``jax.distributed.initialize()`` the mesh spans the
devices of all processes. Each process passes *its own share* of the
examples and gets (or writes) the results of its share; a process that runs
out of examples early keeps feeding padding until every process is done (one
small all-gather per step decides when to stop).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
import zipfile
from typing import Iterable, Iterator, Mapping, Optional, Sequence, Union

import numpy as np

from .errors import InputError
from .options import kernel_options

__all__ = ["infer", "iter_examples", "FILE_NAMES_KEY"]

#: Key of the extra array in an ``.npz`` written by :func:`infer` from a
#: directory of examples: the example file names (``str``), in the order of
#: the results. No output is ever stored under this key (an output named so
#: is written as ``output_<k>``).
FILE_NAMES_KEY = "__files__"


def example_files(d) -> list:
    """The ``.npy``/``.npz`` file names in directory ``d``, sorted (the order
    :func:`infer` reads them and writes their results).

    Raises:
        InputError: ``d`` is not a directory or holds no such file.
    """
    d = os.fspath(d)
    if not os.path.isdir(d):
        raise InputError(f"examples: {d!r} is not a directory of .npy/.npz files")
    files = sorted(f for f in os.listdir(d) if f.endswith((".npy", ".npz")))
    if not files:
        raise InputError(f"examples: no .npy or .npz files in {d!r}")
    return files


def _check_batch_size(batch_size, name: str = "step_size") -> None:
    if batch_size is None:
        return
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
        raise InputError(f"{name} must be a positive int or None, got {batch_size!r}")
    if batch_size < 1:
        raise InputError(f"{name} must be positive, got {batch_size}")


def effective_batch_size(batch_size: Optional[int], n_devices: int) -> int:
    """Examples per step :func:`infer` uses on ``n_devices`` local devices:
    ``batch_size`` rounded up to a multiple of ``n_devices`` (default: 8 per
    device)."""
    if batch_size is None:
        return 8 * n_devices
    return -(-int(batch_size) // n_devices) * n_devices


def check_out_path(out) -> str:
    """Validate an ``out`` path of :func:`infer` before any work is done: it
    must end in ``.npy`` or ``.npz`` and its folder must exist.

    Raises:
        InputError: naming the suffix or the missing folder.
    """
    out = os.fspath(out)
    if not out.endswith((".npy", ".npz")):
        raise InputError(f"out must end in .npy or .npz, got {out!r}")
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        raise InputError(f"out: the folder {folder} does not exist (create it first)")
    return out


def iter_examples(examples, n_inputs: int = 1, names: Sequence[str] = ()) -> Iterator[tuple]:
    """Yield one tuple of arrays per example.

    Args:
        examples: an iterable of samples (an array, or a tuple of arrays
            -- or a dict keyed by input name -- for multi-input models; a
            numpy array of shape ``(N, ...)`` is N samples), or a path to
            a directory of ``.npy`` files (one sample of a single-input
            model each) or ``.npz`` files (one sample each, one array per
            input, keyed by input name or ``arr_0``...), read in sorted
            file-name order.
        n_inputs: number of model inputs.
        names: the model's input names (for ``.npz`` keys).

    Raises:
        InputError: an example with the wrong number of arrays (or a dict
            whose keys are not ``names``), an empty or missing directory.
    """
    for xs, _ in _iter_sourced(examples, n_inputs, names):
        yield xs


def _iter_sourced(examples, n_inputs: int, names: Sequence[str], files: Optional[list] = None) -> Iterator[tuple]:
    """:func:`iter_examples` yielding ``(arrays, file path or None)``."""
    if isinstance(examples, (str, os.PathLike)):
        d = os.fspath(examples)
        if files is None:
            files = example_files(d)
        for f in files:
            p = os.path.join(d, f)
            if f.endswith(".npy"):
                if n_inputs != 1:
                    raise InputError(f"{p}: the model has {n_inputs} inputs; give one .npz per sample")
                yield (np.load(p, mmap_mode="r"),), p
            else:
                with np.load(p) as z:
                    keys = [n for n in names if n in z.files]
                    if len(keys) != n_inputs:
                        keys = [f"arr_{i}" for i in range(n_inputs)]
                    missing = [k for k in keys if k not in z.files]
                    if missing:
                        raise InputError(f"{p}: holds {z.files}, expected the input names {list(names)} "
                                         f"or arr_0..arr_{n_inputs - 1}")
                    yield tuple(z[k] for k in keys), p
        return
    for i, ex in enumerate(examples):
        if isinstance(ex, Mapping):  # {input name: array}
            ex = _by_name(ex, names, f"example {i}")
        xs = tuple(ex) if isinstance(ex, (tuple, list)) else (ex,)
        if len(xs) != n_inputs:
            raise InputError(f"example {i} has {len(xs)} array(s); the model takes {n_inputs} input(s)")
        yield xs, None


def _by_name(ex: Mapping, names: Sequence[str], where: str) -> tuple:
    """The arrays of ``ex`` (input name -> array) in ``names`` order.

    Raises:
        InputError: a name missing from ``ex`` or one that is no input.
    """
    missing = [n for n in names if n not in ex]
    unknown = [k for k in ex if k not in names]
    if missing or unknown:
        raise InputError(f"{where}: keys {list(ex)} do not match the input names {list(names)}"
                         + (f" (missing {missing})" if missing else "") + (f" (unknown {unknown})" if unknown else ""))
    return tuple(ex[n] for n in names)


class _Stacked:
    """``{input name: array (N, ...)}`` seen as N examples (tuples in input order)."""

    def __init__(self, arrays: Sequence):
        self.arrays = arrays
        sizes = {int(np.shape(a)[0]) if np.ndim(a) else -1 for a in arrays}
        if len(sizes) != 1 or -1 in sizes:
            raise InputError(f"examples: the arrays of a dict of inputs must share their leading (examples) "
                             f"dimension; got shapes {[np.shape(a) for a in arrays]}")
        self.n = sizes.pop()

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        for i in range(self.n):
            yield tuple(a[i] for a in self.arrays)


def _named_examples(examples, names: Sequence[str]):
    """A dict of stacked inputs keyed by input name as an iterable of
    examples (:class:`_Stacked`); anything else as it is (per-example dicts
    are read by :func:`_iter_sourced`)."""
    if isinstance(examples, Mapping):
        return _Stacked(_by_name(examples, names, "examples"))
    return examples


class _Sink:
    """Results of one process: in memory, or streamed to a .npy/.npz file."""

    def __init__(self, out: Optional[str], names: Sequence[str], file_names: Optional[Sequence[str]] = None):
        self.out = out
        self.names = list(names)
        self.file_names = None if file_names is None else list(file_names)
        self.chunks: list = [[] for _ in names]
        self.files: list = []
        self.meta: list = [None] * len(names)  # (dtype, per-sample shape)
        self.count = 0
        if out is not None:
            check_out_path(out)
            if out.endswith(".npy") and len(names) != 1:
                raise InputError(f"the model has {len(names)} outputs; write them to an .npz file")
            tmpdir = os.path.dirname(os.path.abspath(out))
            self.files = [tempfile.TemporaryFile(dir=tmpdir) for _ in names]

    def add(self, outs: Sequence[np.ndarray], n: int) -> None:
        for k, o in enumerate(outs):
            o = np.ascontiguousarray(o[:n])
            if self.meta[k] is None:
                self.meta[k] = (o.dtype, o.shape[1:])
            if self.files:
                self.files[k].write(o.tobytes())
            else:
                self.chunks[k].append(o)
        self.count += n

    def finish(self, empty_metas):
        """Return the results (or write the file); ``empty_metas()`` gives
        (dtype, per-sample shape) per output when there were no examples."""
        metas = self.meta
        if any(m is None for m in metas):
            metas = empty_metas()
        if not self.files:
            res = [np.concatenate(c) if c else np.zeros((0, *m[1]), m[0]) for c, m in zip(self.chunks, metas)]
            return res[0] if len(res) == 1 else res
        tmp = f"{self.out}.tmp{os.getpid()}"
        try:
            if self.out.endswith(".npy"):
                with open(tmp, "wb") as f:
                    self._write_npy(f, 0, metas[0])
            else:
                keys = _output_keys(self.names)
                with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
                    for k, key in enumerate(keys):
                        with zf.open(f"{key}.npy", "w", force_zip64=True) as f:
                            self._write_npy(f, k, metas[k])
                    if self.file_names is not None:
                        with zf.open(f"{FILE_NAMES_KEY}.npy", "w", force_zip64=True) as f:
                            np.lib.format.write_array(f, np.asarray(self.file_names, dtype=str).reshape(-1))
            os.replace(tmp, self.out)
        finally:
            for f in self.files:
                f.close()
            if os.path.exists(tmp):
                os.remove(tmp)
        return self.out

    def _write_npy(self, f, k: int, meta) -> None:
        dtype, shape = meta
        np.lib.format.write_array_header_2_0(
            f, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
                "shape": (self.count, *shape)})
        src = self.files[k]
        src.seek(0)
        shutil.copyfileobj(src, f, 1 << 22)

    def close(self):
        for f in self.files:
            f.close()


def _output_keys(names: Sequence[str]) -> list:
    return [n if n and names.count(n) == 1 and "/" not in n and n != FILE_NAMES_KEY else f"output_{i}"
            for i, n in enumerate(names)]


class _Direct:
    """:class:`_Prefetch`'s interface without a thread: ``produce()`` called by
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


#: {(process id, streams): ThreadPoolExecutor} running the streamed steps of
#: :func:`infer`, kept between calls (starting threads per call cost
#: milliseconds on a busy machine); per process id, as a forked child has
#: none of its parent's threads
_STREAM_POOLS: dict = {}
_STREAM_LOCK = threading.Lock()


def _stream_pool(streams: int):
    """The kept pool of ``streams`` worker threads of this process (made at first use)."""
    from concurrent.futures import ThreadPoolExecutor

    key = (os.getpid(), streams)
    with _STREAM_LOCK:
        pool = _STREAM_POOLS.get(key)
        if pool is None:
            pool = _STREAM_POOLS[key] = ThreadPoolExecutor(streams, thread_name_prefix="fbjax-infer-run")
        return pool


#: Steps :class:`_StreamChooser` times each way (one stream, then several at once)
#: before keeping the faster way for :data:`STREAM_KEEP_STEPS` steps, and again.
STREAM_PROBE_STEPS = 8
STREAM_KEEP_STEPS = 64


class _StreamChooser:
    """How many steps :func:`infer` runs at once on one CPU device, by
    timing: :data:`STREAM_PROBE_STEPS` steps with one stream (asynchronous
    calls, as a loop of ``model(x)``), as many with ``streams`` concurrent
    steps, then the faster of the two for :data:`STREAM_KEEP_STEPS` steps;
    then it measures again (the load of a shared machine changes). Two
    concurrent executions fill the gaps between one stream's small kernels on
    an idle machine (1.4x) but lose to one stream when other processes hold
    the cores. Each step is the same program on the same examples either
    way, so the choice changes only the time, never a result.

    The caller waits for every step in flight (:meth:`due`) before each
    phase starts, so a phase's time is its own steps'. One chooser serves
    every :func:`infer` call on a model with that many streams
    (:func:`_chooser`): a call continues the rounds where the last one
    stopped (:meth:`resume`), so repeated calls on short datasets do not
    each spend their first steps probing."""

    def __init__(self, streams: int):
        self.streams = streams
        self.times: dict = {}  # streams -> seconds per step, this probe round
        self.phases = [(1, STREAM_PROBE_STEPS), (streams, STREAM_PROBE_STEPS)]
        self.mode, self.left = self.phases[0]
        self.start = None  # perf_counter at the phase's start; None: not started
        self.steps = 0
        self.history: list = []  # (mode, steps) of every phase run (for tests)

    def due(self) -> bool:
        """Whether a phase ends before the next step (the caller drains, then :meth:`begin`)."""
        return self.start is None or self.left == 0

    def begin(self, now: float) -> None:
        """Close the phase that ran (time per step) and start the next at ``now``."""
        if self.start is not None and self.steps:
            self.history.append((self.mode, self.steps))
            if len(self.times) < 2 and self.mode not in self.times:
                self.times[self.mode] = (now - self.start) / self.steps
            if self.phases:
                self.phases.pop(0)
            if not self.phases:
                if len(self.times) == 2:  # both measured: keep the faster
                    best = min(self.times, key=self.times.get)
                    self.phases = [(best, STREAM_KEEP_STEPS)]
                    self.times = {}
                else:  # after keeping: measure again
                    self.phases = [(1, STREAM_PROBE_STEPS), (self.streams, STREAM_PROBE_STEPS)]
        self.mode, self.left = self.phases[0]
        self.steps = 0
        self.start = now

    def took(self) -> None:
        """One step of the current phase was dispatched."""
        self.left -= 1
        self.steps += 1

    def resume(self) -> None:
        """At the start of another :func:`infer` call: the phase under way
        starts again at the next step (its time so far spans the gap
        between the calls, so it is not recorded); the rounds, and a choice
        being kept, go on."""
        if self.start is not None and self.steps:
            self.history.append((self.mode, self.steps))
        self.start = None
        self.steps = 0


def _chooser(model, streams: int) -> _StreamChooser:
    """The :class:`_StreamChooser` of ``model``'s :func:`infer` calls with
    ``streams`` streams (made at the first, then resumed)."""
    choosers = model.__dict__.setdefault("_infer_choosers", {})
    ch = choosers.get(streams)
    if ch is None:
        ch = choosers[streams] = _StreamChooser(streams)
    else:
        ch.resume()
    return ch


class _Prefetch:
    """``produce()`` called in a background thread, up to ``depth`` results
    ahead of :meth:`get`, so that reading files and assembling batches
    overlaps the device's work. ``produce`` returns ``(buffers, n)``;
    after the first ``n == 0`` (examples exhausted) it is not called again
    and :meth:`get` keeps returning that result. An exception raised by
    ``produce`` is raised by the :meth:`get` that would have returned its
    result."""

    def __init__(self, produce, depth: int = 2):
        import queue
        import threading

        self._last = None
        self._queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._work, args=(produce,), name="fbjax-infer-reader",
                                        daemon=True)
        self._thread.start()

    def _work(self, produce) -> None:
        import queue

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
        import queue

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
            self._last = None
            raise err
        if value[1] == 0:
            self._last = value
        return value

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def _example_bytes(model) -> int:
    """Largest activation set of one example: max over the main graph's nodes
    of their non-constant input + output bytes, an unknown (batch) dimension
    counted as 1."""
    g = model.ir.main_graph
    best = 0
    for node in g.nodes:
        total = 0
        for v in list(node.inputs) + list(node.outputs):
            if v is None or v.data is not None or v.shape is None:
                continue
            total += int(np.prod([1 if d is None else d for d in v.shape])) * np.dtype(v.dtype).itemsize
        best = max(best, total)
    return best


def _plan(model, batch: int) -> tuple:
    """``(k, streams)`` on one CPU device: up to ``streams`` steps of ``k``
    examples run at once. XLA:CPU runs a batch layer by layer, so a batch
    whose activations do not fit in cache streams each from memory and runs
    slower per example than smaller calls: ``k`` is the largest divisor of
    ``batch`` whose ``streams * k`` examples' activations fit within
    the model's ``KernelOptions.chunk_bytes`` (about what stays in cache from one
    layer to the next), at least 1. ``streams`` is always its
    ``KernelOptions.chunk_threads``: two independent executions at
    once fill the gaps between one stream's small per-layer kernels, even
    when one example's activations already fill the cache (MediaPipe palm
    detection, 3.5 MB per example, batch-1 steps on the 2-core machine: one
    stream 145-162 examples/s, two 163-197, measured side by side); whether
    they do run at once is timed while running (:class:`_StreamChooser`),
    since on a machine whose cores other processes hold one stream wins
    (``benchmarks/infer.py``)."""
    cache = model.__dict__.setdefault("_infer_example_bytes", [])
    if not cache:
        cache.append(max(_example_bytes(model), 1))
    per = cache[0]
    ko = kernel_options(model.program)
    budget = ko.chunk_bytes
    streams = max(1, ko.chunk_threads)
    best = 1
    for k in range(1, batch + 1):
        if batch % k == 0 and streams * k * per <= budget:
            best = k
    return best, streams


def _chunk(model, batch: int) -> int:
    """Examples per call on a CPU device (the ``k`` of :func:`_plan`)."""
    return _plan(model, batch)[0]


def _fixed_batch(model) -> Optional[int]:
    """The fixed batch ``B`` of a :class:`fbjax.Model` without run state whose
    every input and output has the leading dimension ``B``: 1 (the file's
    batch-1 shapes, ``fbjax.load(path)``; one example per call is the
    batch whatever the graph does with it), or the ``batch_size=B`` it was
    loaded with (the batch rewrite proved it the batch). :func:`infer` on
    one CPU device runs it as calls of ``B`` examples, the calls a loop of
    ``model(x)`` makes. ``None`` for any other model (batch-polymorphic,
    stateful, a rank-0 input, a file's leading dimension other than 1,
    inputs of different leading dimensions)."""
    if getattr(model, "_stateful", False):
        return None
    lead = {s.shape[0] if s.shape else None for s in model.inputs}
    if len(lead) != 1:
        return None
    b = lead.pop()
    if not isinstance(b, (int, np.integer)) or b < 1:
        return None
    if b != 1 and getattr(model, "_load_kwargs", {}).get("batch_size") != b:
        # a leading dimension of the file's other than 1 need not be a batch (a [2, 3] input);
        # fbjax.load(path, batch_size=b) proved it is
        return None
    # each output's leading dimension must be the batch too, to split the results per example
    return b if all(o.shape and o.shape[0] == b for o in model.outputs) else None


def _own_call(model):
    """``fn(params, *inputs)``: the compiled program :meth:`fbjax.Model.__call__`
    runs on inputs of the model's shapes and dtypes, without its checks:
    the Jit executor's fast path (``jitted_leaves``, the params as a tuple)
    while the model takes unchecked calls, else the executor itself. So a
    loop of ``model(x)`` before :func:`infer` compiled its steps' program
    already, and both give the same bits."""
    ex = model.executor
    jl = getattr(ex, "jitted_leaves", None)
    if jl is None or not getattr(model, "_unchecked", False):
        return ex
    leaves = ex.leaves

    def call(params, *inputs):
        return jl(leaves(params), *inputs)

    return call


def _batch_polymorphic(model, load, quiet: bool = False):
    """``model`` loaded again with ``batch_size=None`` (its other load options
    kept), made once per model and kept on it, so repeated :func:`infer`
    calls neither parse, lower nor compile it again (a refusal is kept
    too).

    Args:
        quiet: return ``None`` instead of raising.

    Raises:
        InputError: a model loaded from bytes (no path to load again), or one
            whose graph cannot take another batch (the rewrite's reason).
    """
    kept = model.__dict__.get("_infer_poly")
    if kept is None:
        if model.path is None:
            kept = InputError("infer needs a batch-polymorphic model here (several devices or an accelerator): "
                              "load it with fbjax.load(path, batch_size=None)")
        else:
            try:
                kept = load(model.path, **dict(model._load_kwargs, batch_size=None))
            except InputError as e:  # the batch rewrite refused the graph
                kept = e
        model.__dict__["_infer_poly"] = kept
    if isinstance(kept, InputError):
        if quiet:
            return None
        raise kept
    return kept


class _NpyFiles:
    """Reads ``.npy`` example files of one input straight into a step's
    buffer: the header of each file is compared (as bytes) with the headers
    already seen to describe a C-order array of exactly the input's
    ``shape`` and ``dtype``, and the data is read with ``readinto`` into the
    buffer (no per-file allocation, mapping or header parsing: ~4x less
    work per file than ``np.load``). A header not seen before is parsed once
    (``numpy.lib.format``); a file of another shape, dtype or order is left
    to the caller (:meth:`read_into` returns False), which loads it the
    general way and checks it there."""

    _PREFIX = 12  # magic (6) + version (2) + header length (2 in version 1, 4 after)

    def __init__(self, shape: tuple, dtype):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        self.headers: set = set()  # exact header bytes (magic to the data) known to match

    def _matches(self, header: bytes) -> bool:
        import io

        f = io.BytesIO(header)
        try:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                return False
        except (ValueError, SyntaxError, TypeError):
            return False  # np.load says what is wrong with it
        return tuple(shape) == self.shape and (not fortran or len(shape) < 2) and dtype == self.dtype

    def read_into(self, path: str, dest: memoryview) -> bool:
        """Fill ``dest`` (``nbytes`` bytes) with the data of the ``.npy`` file
        ``path`` when its header describes exactly this input's shape and
        dtype (C order); False (``dest`` unspecified) otherwise.

        Raises:
            InputError: a file with a matching header but fewer data bytes
                than it announces (truncated), naming the file.
        """
        with open(path, "rb", buffering=0) as f:
            head = f.read(self._PREFIX)
            if len(head) < 10 or head[:6] != b"\x93NUMPY":
                return False
            if head[6] == 1:
                start = 10 + int.from_bytes(head[8:10], "little")
            elif head[6] in (2, 3) and len(head) == 12:
                start = 12 + int.from_bytes(head[8:12], "little")
            else:
                return False
            if start > 1 << 20:
                return False
            header = head + f.read(start - len(head)) if start > len(head) else head[:start]
            if len(header) != start:
                return False
            if header not in self.headers:
                if not self._matches(header):
                    return False
                self.headers.add(header)
            f.seek(start)
            got = 0
            while got < self.nbytes:
                r = f.readinto(dest[got:])
                if not r:
                    raise InputError(f"{path}: holds {got} of the {self.nbytes} data bytes its header announces "
                                     f"(a truncated file? write it again with numpy.save)")
                got += r
        return True


def infer(
    model,
    examples: Union[Iterable, str, os.PathLike],
    step_size: Optional[int] = None,
    devices: Optional[Sequence] = None,
    out: Union[None, str, os.PathLike] = None,
    *,
    params=None,
    progress: bool = True,
    batch_size: Optional[int] = None,
):
    """Run ``examples`` through ``model``, data-parallel over devices.

    Args:
        model: a :class:`fbjax.Model` whose inputs have an unknown leading
            (batch) dimension (``fbjax.load(path, batch_size=None)``), or a
            path, loaded that way. A model loaded with a fixed batch ``B``
            (the file's shapes, the default of :func:`fbjax.load`; or
            ``batch_size=B``) runs on one CPU device as its own calls of
            ``B`` examples, the last padded: the program and results of a
            loop of ``model(x)``, also for graphs that cannot take another
            batch; except a batch-1 model whose several examples' activations
            fit in cache (a small model: batch-1 calls cost mostly host work),
            which is loaded again batch-polymorphic, once, when its graph
            allows (else its own calls). On several devices or an accelerator it is loaded again
            batch-polymorphic from its path, once per model (kept on it for
            later calls). Or a
            signature, ``model.signature(key)``: one whose inputs have an
            unknown leading dimension takes the batch there; one with fixed
            shapes (litert-torch's batch-1 ``prefill_N``/``decode`` and
            vision signatures) runs under ``jax.vmap`` over the examples,
            each example an input without its leading 1 (rank 2 or more;
            rank-0/1 inputs such as positions whole), outputs likewise
            (:class:`fbjax.signature.ExamplesOf`).
        examples: samples shaped like the model's inputs without the batch
            dimension: an iterable of arrays (tuples of arrays in input order,
            or dicts keyed by input name, for multi-input models), an array
            of shape ``(N, ...)``, a dict of such arrays keyed by input
            name, or a directory of ``.npy``/``.npz`` files read in sorted
            file-name order (see :func:`iter_examples`).
        step_size: examples per step for this process, split over its
            devices; rounded up to a multiple of the number of this process's
            devices in the mesh. Default: 8 per device. (Not the model's
            ``batch_size`` of :func:`fbjax.load`: the model is loaded with
            any batch, and each step runs ``step_size`` examples.)
        devices: the devices to use (default: ``jax.devices()``, every device
            of every process).
        out: ``None`` to return the results; a ``.npy`` (one output) or
            ``.npz`` path to stream them to (keys: output names, or
            ``output_<k>``; when ``examples`` is a directory, the ``.npz``
            also holds the example file names, in result order, under
            :data:`FILE_NAMES_KEY` ``"__files__"``). The path is checked
            (suffix, existing folder) before anything is loaded or compiled.
            Multi-process runs write one file per process: a
            ``{process}`` in the path is replaced by ``jax.process_index()``.
        params: weights to use instead of ``model.params``.
        progress: show a tqdm progress bar.
        batch_size: deprecated spelling of ``step_size`` (a
            ``DeprecationWarning``).

    Returns:
        per model output an array whose leading dimension is this process's
        number of examples (a list when the model has several outputs; with
        no examples, arrays of shape ``(0, *per-sample shape)``), or the path
        written when ``out`` is given.

    Raises:
        InputError: examples that do not match the model's inputs (naming the
            file when they come from a directory), a model that cannot be
            made batch-polymorphic where one is needed (several devices or an
            accelerator; a fixed-batch model loaded from bytes there), a
            non-positive ``step_size``, both
            ``step_size`` and ``batch_size`` given, a bad
            ``out`` path (wrong suffix, missing folder).
    """
    import jax
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from .model import Model, load

    spelled = "step_size"
    if batch_size is not None:
        spelled = "batch_size"
        if step_size is not None:
            raise InputError("infer: give step_size only (batch_size is its deprecated spelling)")
        import warnings

        warnings.warn("fbjax.infer(batch_size=...) is deprecated: the examples per step are step_size=... "
                      "(batch_size is the model's leading dimension in fbjax.load)", DeprecationWarning,
                      stacklevel=2)
        step_size = batch_size
    batch_size = step_size
    # everything that can be checked without the model, before loading or compiling it
    _check_batch_size(batch_size, spelled)
    me = jax.process_index()
    if out is not None:
        out = os.fspath(out)
        if "{process" in out:
            out = out.format(process=me)
        check_out_path(out)
    files = example_files(examples) if isinstance(examples, (str, os.PathLike)) else None

    from .signature import ExamplesOf, SignatureRunner

    devs = list(devices) if devices is not None else list(jax.devices())
    devs.sort(key=lambda d: (d.process_index, d.id))
    mesh = Mesh(np.array(devs), ("batch",))
    n_local = sum(d.process_index == me for d in devs)
    if n_local == 0:
        raise InputError(f"process {me} has no device in the mesh")
    n_proc = len({d.process_index for d in devs})
    one_cpu = n_proc == 1 and n_local == 1 and devs[0].platform == "cpu"

    if not isinstance(model, (Model, SignatureRunner, ExamplesOf)):
        model = load(model, batch_size=None)
    if isinstance(model, SignatureRunner) and model.has_fixed_shapes():
        model = model.over_examples()  # a batch-1 signature: jax.vmap over the examples (fbjax.signature)
    # A model loaded with a fixed batch B (fbjax.load's default: the file's shapes): on one CPU
    # device its steps are its own calls of B examples (_fixed_batch), the program of a loop of
    # model(x), compiled already if the model ran; elsewhere it is loaded again batch-polymorphic,
    # once per model (_batch_polymorphic)
    fixed = _fixed_batch(model) if isinstance(model, Model) and one_cpu else None
    if fixed == 1 and _plan(model, effective_batch_size(batch_size, 1))[0] > 1:
        # several examples' activations fit in cache (small models): one call of k examples
        # beats k batch-1 calls, whose per-call host work dominates; so the batch-polymorphic
        # model runs, loaded once, when the graph allows it
        poly = _batch_polymorphic(model, load, quiet=True)
        if poly is not None:
            model, fixed = poly, None
    if fixed is None and any(s.shape is None or not s.shape or s.shape[0] is not None for s in model.inputs):
        if isinstance(model, SignatureRunner):
            raise InputError(f"infer needs a batch-polymorphic signature; {model.key!r} has inputs {model.inputs}")
        model = _batch_polymorphic(model, load)
    apply = model.apply_tuple if isinstance(model, SignatureRunner) else model.apply
    specs = model.inputs
    for s in specs:
        if any(d is None for d in s.shape[1:]):
            raise InputError(f"input {s.name!r} has unknown non-batch dimensions {s}; infer needs them fixed")
    sample_shapes = [tuple(s.shape[1:]) for s in specs]
    examples = _named_examples(examples, [s.name for s in specs])
    local_batch = effective_batch_size(batch_size, n_local)
    batch_spec = P("batch")
    batch_sharding = NamedSharding(mesh, batch_spec)
    replicated = NamedSharding(mesh, P())

    sink = _Sink(out, [s.name for s in model.outputs], files)

    x64 = getattr(model, "_x64", False)
    with jax.enable_x64(x64):
        total = None
        if files is not None:  # (a path: len() would be its number of characters)
            total = len(files)
        else:
            try:
                total = len(examples)  # type: ignore[arg-type]
            except TypeError:
                pass
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=total, unit="ex", desc="fbjax.infer", disable=None)
        it = _iter_sourced(examples, len(specs), [s.name for s in specs], files)
        n_read = [0]  # examples taken from `it` so far (sink.count lags by the batch in flight)

        # One CPU device: each step is one call of k examples (see below), the steps of a batch
        # dispatched as they are read; else a step is the batch, split over the mesh.
        k, streams = _plan(model, local_batch) if (isinstance(model, Model) and one_cpu
                                                   and not getattr(model, "_stateful", False)) else (None, 1)
        if fixed is not None:
            k = fixed  # the model's own calls: B examples each, whatever the step size
        per_step = local_batch if k is None else k

        def checked(x, i, src, k, shp, s):
            x = np.asarray(x)
            if x.shape != shp:
                where = f"example {i}" if src is None else f"{src} (example {i})"
                raise InputError(
                    f"{where}: input {k} ({s.name!r}) has shape {x.shape}, expected "
                    f"{shp} (the model's input without its batch dimension)")
            if x.dtype != s.dtype and not np.can_cast(x.dtype, s.dtype, "same_kind"):
                where = f"example {i}" if src is None else f"{src} (example {i})"
                raise InputError(f"{where}: input {k} ({s.name!r}) has dtype {x.dtype}, expected {s.dtype}")
            return x

        def next_batch():
            # np.empty, padding rows zeroed below: a fresh buffer per step (the call may keep
            # reading it after returning), without writing each example twice
            bufs = [np.empty((per_step, *shp), s.dtype) for shp, s in zip(sample_shapes, specs)]
            n = 0
            for xs, src in it:
                i = n_read[0]
                n_read[0] += 1
                for k, (x, shp, s) in enumerate(zip(xs, sample_shapes, specs)):
                    bufs[k][n] = checked(x, i, src, k, shp, s)
                n += 1
                if n == per_step:
                    break
            for b in bufs:
                b[n:] = 0
            return bufs, n

        one = specs[0] if len(specs) == 1 else None
        produce = next_batch
        next_view_fn = None
        if (one is not None and isinstance(examples, np.ndarray) and examples.ndim == 1 + len(sample_shapes[0])
                and examples.shape[1:] == sample_shapes[0] and examples.dtype == one.dtype):
            # an array of examples: each full step is a view of it (no copy, no per-example work)
            arr = examples

            def next_view():
                i = n_read[0]
                n = min(per_step, len(arr) - i)
                n_read[0] = i + n
                if n == per_step:
                    return [arr[i:i + n]], n
                buf = np.zeros((per_step, *sample_shapes[0]), one.dtype)
                buf[:n] = arr[i:i + n]
                return [buf], n

            produce = next_view_fn = next_view
        elif one is not None and files is not None:
            # a directory for a one-input model: .npy files read straight into the step's buffer
            # (_NpyFiles); any other file (another dtype, shape or order, .npz) the general way
            npy = _NpyFiles(sample_shapes[0], one.dtype)
            folder = os.fspath(examples)

            def next_files():
                buf = np.empty((per_step, *sample_shapes[0]), one.dtype)
                flat = buf.reshape(-1).view(np.uint8).reshape(per_step, npy.nbytes)
                n = 0
                while n < per_step and n_read[0] < len(files):
                    i = n_read[0]
                    n_read[0] += 1
                    f = files[i]
                    if not (f.endswith(".npy") and npy.read_into(os.path.join(folder, f), memoryview(flat[n]))):
                        for xs, src in _iter_sourced(folder, 1, [one.name], [f]):
                            buf[n] = checked(xs[0], i, src, 0, sample_shapes[0], one)
                    n += 1
                buf[n:] = 0
                return [buf], n

            produce = next_files

        def to_global(local):
            return multihost_utils.host_local_array_to_global_array(local, mesh, batch_spec) if n_proc > 1 \
                else jax.device_put(local, batch_sharding)

        def fetch(res):
            res = res if isinstance(res, tuple) else (res,)
            if n_proc > 1:
                res = multihost_utils.global_array_to_host_local_array(res, mesh, batch_spec)
            return [np.asarray(r) for r in res]

        # How one step runs. One CPU device: the prepared program Model.__call__ runs
        # (fbjax.run.cpu_prepared: weights relaid once, residuals materialized; jit(model.apply)
        # has none of that) on steps of `k` examples whose activations stay in cache (the largest
        # divisor of the batch that fits) -- for the MediaPipe detectors k = 1, as the batched
        # program is slower per example than batch-1 calls; a step is dispatched as soon as its k
        # examples are read, so reading overlaps computing at any batch size (a batch of 64 that
        # waited for its 64 files measured 0.7x a loop); up to `streams` steps at once, as
        # timing decides (_plan, _StreamChooser). Otherwise: one jitted model.apply of the whole batch
        # over the mesh.
        if k is not None:
            run1 = _own_call(model)  # what Model.__call__ runs (fbjax.run), without its input checks
            # a batch job: the first step compiles the optimised program, no quick tier (fbjax.run.tiered),
            # whose compile and slower steps would only add to the total (nothing if the model ran before)
            model.skip_quick_tier()

            def put(bufs):
                # numpy, copied by the call itself: on CPU an explicit device_put queues behind
                # the running executions (measured ~3 ms each on a busy 2-core machine)
                return bufs

            p_host = model.params if params is None else params  # (its relaid copies are cached per array)

            first = [True]

            def dispatch(placed):
                res = run1(p_host, *placed)
                if first[0]:  # the first step compiled; if the model ran before infer, that was the
                    # quick tier (fbjax.run.tiered): the rest run the optimised program
                    first[0] = False
                    jax.block_until_ready(res)
                    model.wait_optimised()
                return res

            fetch_step = fetch
            if streams > 1:
                # `streams` steps at once: each runs in a worker thread (dispatch, then wait for its
                # results, without the GIL), as XLA:CPU runs independent executions concurrently;
                # the first step runs here alone (it compiles)
                from concurrent.futures import Future

                pool = _stream_pool(streams)
                warm = model.__dict__.setdefault("_infer_warm", set())  # step sizes run (compiled) before

                def run_step(placed):
                    with jax.enable_x64(x64):  # (JAX's config contexts are per thread)
                        return fetch(run1(p_host, *placed))

                chooser = _chooser(model, streams)

                def dispatch_streamed(placed):
                    if per_step not in warm:
                        done: Future = Future()
                        done.set_result(run_step(placed))  # the first step of this size runs here (compiles)
                        warm.add(per_step)
                        # if the model ran before infer, its first call compiled the quick tier
                        # (fbjax.run.tiered): the steps (and the chooser's timings) run the optimised program
                        model.wait_optimised()
                        return done
                    if chooser.due():
                        drain(0)  # the phase before is timed on its own steps
                        chooser.begin(time.perf_counter())
                    chooser.took()
                    if chooser.mode == 1:
                        return run1(p_host, *placed)  # asynchronous, as a loop of model(x)
                    return pool.submit(run_step, placed)

                def fetch_any(res):
                    return res.result() if isinstance(res, Future) else fetch(res)

                dispatch, fetch_step = dispatch_streamed, fetch_any
        else:
            p = model.params if params is None else params
            p = {name: jax.make_array_from_callback(np.shape(v), replicated, lambda idx, v=v: np.asarray(v)[idx])
                 for name, v in p.items()}
            # one jitted function per model and mesh, so repeated calls reuse the compilation
            cache = model.__dict__.setdefault("_infer_jit", {})
            key = tuple(d.id for d in devs)
            fn = cache.get(key)
            if fn is None:
                fn = cache[key] = jax.jit(apply, out_shardings=batch_sharding)

            def put(bufs):  # double buffering: the next batch goes to the devices before we wait
                return [to_global(b) for b in bufs]

            def dispatch(placed):
                return fn(p, *placed)

            fetch_step = fetch

        # Steps in flight: results are fetched (the only wait) once more than `ahead` steps are
        # queued, so the device always has work queued behind the running step, whatever the
        # Python overhead or scheduling hiccups between steps (at least ~32 examples ahead).
        from collections import deque

        pending: deque = deque()  # (device results, n valid) per step dispatched, oldest first
        ahead = max(2, -(-32 // per_step)) if n_proc == 1 else 1
        # examples read and batched in a thread, at least 2 steps (~16 examples) ahead
        reader = (_Direct(produce) if produce is next_view_fn else
                  _Prefetch(produce, depth=max(2, -(-16 // per_step))))

        def drain(keep: int) -> None:
            while len(pending) > keep:
                res_old, n_old = pending.popleft()
                sink.add(fetch_step(res_old), n_old)
                if bar is not None:
                    bar.update(n_old)

        try:
            bufs, n = reader.get()
            placed = None  # the batch already on its way to the device
            while True:
                if n_proc > 1:  # one small all-gather per step: stop when every process is done
                    counts = np.asarray(multihost_utils.process_allgather(np.int32(n)))
                    if not counts.any():
                        break
                elif n == 0:
                    break
                pending.append((dispatch(placed if placed is not None else put(bufs)), n))  # asynchronous
                bufs, n = reader.get()
                # double buffering: the next batch is copied to the device while this one computes
                placed = put(bufs) if n_proc == 1 and n else None
                drain(ahead)
            drain(0)
        except BaseException:
            sink.close()
            raise
        finally:
            reader.close()
            for res_old, _ in pending:  # after an error: steps not started yet are dropped
                if hasattr(res_old, "cancel"):
                    res_old.cancel()
            if bar is not None:
                bar.close()

        def empty_metas():
            # no examples: the per-sample output shapes and dtypes, traced (not run) at batch 1
            ins = [jax.ShapeDtypeStruct((fixed or 1, *shp), s.dtype) for shp, s in zip(sample_shapes, specs)]
            try:
                res = jax.eval_shape(apply, model.params if params is None else params, *ins)
                res = res if isinstance(res, (tuple, list)) else (res,)
                return [(np.dtype(r.dtype), tuple(r.shape[1:])) for r in res]
            except Exception:  # noqa: BLE001 - fall back to the declared output specs
                return [(np.dtype(o.dtype), tuple(1 if d is None else d for d in (o.shape or ())[1:]))
                        for o in model.outputs]

        return sink.finish(empty_metas)
