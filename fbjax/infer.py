"""Batch inference over every device: :func:`infer`.

::

    model = fbjax.load("model.tflite", batch_size=None)     # any batch
    probs = fbjax.infer(model, images, step_size=64)        # all local devices
    fbjax.infer(model, "samples/", step_size=64, out="preds.npz")    # streamed

Examples are cut into batches; each batch is placed on a 1-D device mesh
(``jax.sharding.Mesh`` with axis ``"batch"``), split along its leading
dimension with ``NamedSharding(mesh, P("batch"))``, and run by one jitted
``model.apply`` whose weights are replicated on every device. The last
partial batch is padded with zeros to the full batch and the padding is
trimmed from the results. The next batch is dispatched before the previous
results are copied back, so host-side loading overlaps device work; results
go either to memory or, batch by batch, to an ``.npy``/``.npz`` file, so the
dataset never has to fit in memory.

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
import zipfile
from typing import Iterable, Iterator, Optional, Sequence, Union

import numpy as np

from .errors import InputError

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
        examples: an iterable of samples (an array, or a tuple of arrays for
            multi-input models; a numpy array of shape ``(N, ...)`` is N
            samples), or a path to a directory of ``.npy`` files (one sample
            of a single-input model each) or ``.npz`` files (one sample each,
            one array per input, keyed by input name or ``arr_0``...), read
            in sorted file-name order.
        n_inputs: number of model inputs.
        names: the model's input names (for ``.npz`` keys).

    Raises:
        InputError: an example with the wrong number of arrays, an empty or
            missing directory.
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
        xs = tuple(ex) if isinstance(ex, (tuple, list)) else (ex,)
        if len(xs) != n_inputs:
            raise InputError(f"example {i} has {len(xs)} array(s); the model takes {n_inputs} input(s)")
        yield xs, None


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
            path, loaded that way. A model loaded with the file's batch-1
            shapes is re-loaded batch-polymorphic from its path. Or a
            signature, ``model.signature(key)``, whose inputs have an unknown
            leading dimension (examples in its input order).
        examples: samples shaped like the model's inputs without the batch
            dimension: an iterable of arrays (tuples of arrays for multi-input
            models), an array of shape ``(N, ...)``, or a directory of
            ``.npy``/``.npz`` files read in sorted file-name order (see
            :func:`iter_examples`).
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
            made batch-polymorphic, a non-positive ``step_size``, both
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

    from .signature import SignatureRunner

    if not isinstance(model, (Model, SignatureRunner)):
        model = load(model, batch_size=None)
    if any(s.shape is None or not s.shape or s.shape[0] is not None for s in model.inputs):
        if isinstance(model, SignatureRunner):
            raise InputError(f"infer needs a batch-polymorphic signature; {model.key!r} has inputs {model.inputs}")
        if model.path is None:
            raise InputError("infer needs a batch-polymorphic model: load it with fbjax.load(path, batch_size=None)")
        model = load(model.path, batch_size=None)
    apply = model.apply_tuple if isinstance(model, SignatureRunner) else model.apply
    specs = model.inputs
    for s in specs:
        if any(d is None for d in s.shape[1:]):
            raise InputError(f"input {s.name!r} has unknown non-batch dimensions {s}; infer needs them fixed")
    sample_shapes = [tuple(s.shape[1:]) for s in specs]

    devs = list(devices) if devices is not None else list(jax.devices())
    devs.sort(key=lambda d: (d.process_index, d.id))
    mesh = Mesh(np.array(devs), ("batch",))
    n_local = sum(d.process_index == me for d in devs)
    if n_local == 0:
        raise InputError(f"process {me} has no device in the mesh")
    n_proc = len({d.process_index for d in devs})
    local_batch = effective_batch_size(batch_size, n_local)
    batch_spec = P("batch")
    batch_sharding = NamedSharding(mesh, batch_spec)
    replicated = NamedSharding(mesh, P())

    sink = _Sink(out, [s.name for s in model.outputs], files)

    x64 = getattr(model, "_x64", False)
    with jax.enable_x64(x64):
        p = model.params if params is None else params
        p = {k: jax.make_array_from_callback(np.shape(v), replicated, lambda idx, v=v: np.asarray(v)[idx])
             for k, v in p.items()}
        # one jitted function per model and mesh, so repeated calls reuse the compilation
        cache = model.__dict__.setdefault("_infer_jit", {})
        key = tuple(d.id for d in devs)
        fn = cache.get(key)
        if fn is None:
            fn = cache[key] = jax.jit(apply, out_shardings=batch_sharding)

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

        def next_batch():
            bufs = [np.zeros((local_batch, *shp), s.dtype) for shp, s in zip(sample_shapes, specs)]
            n = 0
            for xs, src in it:
                i = n_read[0]
                n_read[0] += 1
                where = f"example {i}" if src is None else f"{src} (example {i})"
                for k, (x, shp, s) in enumerate(zip(xs, sample_shapes, specs)):
                    x = np.asarray(x)
                    if x.shape != shp:
                        raise InputError(
                            f"{where}: input {k} ({s.name!r}) has shape {x.shape}, expected "
                            f"{shp} (the model's input without its batch dimension)")
                    if x.dtype != s.dtype and not np.can_cast(x.dtype, s.dtype, "same_kind"):
                        raise InputError(f"{where}: input {k} ({s.name!r}) has dtype {x.dtype}, expected {s.dtype}")
                    bufs[k][n] = x
                n += 1
                if n == local_batch:
                    break
            return bufs, n

        def to_global(local):
            return multihost_utils.host_local_array_to_global_array(local, mesh, batch_spec) if n_proc > 1 \
                else jax.device_put(local, batch_sharding)

        def fetch(res):
            res = res if isinstance(res, tuple) else (res,)
            if n_proc > 1:
                res = multihost_utils.global_array_to_host_local_array(res, mesh, batch_spec)
            return [np.asarray(r) for r in res]

        pending = None  # (device results, n valid)
        try:
            while True:
                bufs, n = next_batch()
                if n_proc > 1:
                    counts = np.asarray(multihost_utils.process_allgather(np.int32(n)))
                    done = not counts.any()
                else:
                    done = n == 0
                if done:
                    break
                res = fn(p, *[to_global(b) for b in bufs])
                if pending is not None:
                    sink.add(fetch(pending[0]), pending[1])
                    if bar is not None:
                        bar.update(pending[1])
                pending = (res, n)
            if pending is not None:
                sink.add(fetch(pending[0]), pending[1])
                if bar is not None:
                    bar.update(pending[1])
        except BaseException:
            sink.close()
            raise
        finally:
            if bar is not None:
                bar.close()

        def empty_metas():
            # no examples: the per-sample output shapes and dtypes, traced (not run) at batch 1
            ins = [jax.ShapeDtypeStruct((1, *shp), s.dtype) for shp, s in zip(sample_shapes, specs)]
            try:
                res = jax.eval_shape(apply, model.params if params is None else params, *ins)
                res = res if isinstance(res, (tuple, list)) else (res,)
                return [(np.dtype(r.dtype), tuple(r.shape[1:])) for r in res]
            except Exception:  # noqa: BLE001 - fall back to the declared output specs
                return [(np.dtype(o.dtype), tuple(1 if d is None else d for d in (o.shape or ())[1:]))
                        for o in model.outputs]

        return sink.finish(empty_metas)
