"""Where :func:`fbjax.infer`'s examples come from, cut into steps.

Examples are given without the batch dimension: an iterable of arrays
(tuples, or dicts keyed by input name, for several inputs), an array of
shape ``(N, ...)``, a dict of such arrays keyed by input name, or a
directory of ``.npy`` files (one example of a one-input model each) or
``.npz`` files (one example each, one array per input keyed by input name
or ``arr_0``...), read in sorted file-name order.

:func:`step_source` turns them into a ``produce()`` callable that returns
one step at a time, ``(buffers, n)``: one array ``(step, ...)`` per input
and the number of real examples in it (``n < step`` for the last step,
whose rows past ``n`` are zeros; ``n == 0`` once the examples are
exhausted). Three ways, chosen from the examples:

* an array of examples of the input's dtype (one input): each full step is
  a view of it (no copy, no per-example work; :class:`ArraySteps`);
* a directory for a one-input model: each ``.npy`` file is read straight
  into the step's buffer (:class:`NpyFiles`: the header compared as bytes
  with those parsed before, the data read with ``readinto``), between
  dispatches, without a reader thread; any other file (another dtype,
  shape or order, ``.npz``) the general way;
* anything else: example by example, each checked (shape, ``same_kind``
  dtype cast) and copied into a fresh buffer per step.
"""

from __future__ import annotations

import io
import os
from typing import Iterator, Mapping, Optional, Sequence

import numpy as np

from ..errors import InputError

__all__ = ["example_files", "iter_examples", "iter_sourced", "stacked_by_name", "NpyFiles", "ArraySteps",
           "step_source"]


def example_files(d) -> list:
    """The ``.npy``/``.npz`` file names in directory ``d``, sorted (the order
    :func:`fbjax.infer` reads them and writes their results).

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
    for xs, _ in iter_sourced(examples, n_inputs, names):
        yield xs


def iter_sourced(examples, n_inputs: int, names: Sequence[str], files: Optional[list] = None) -> Iterator[tuple]:
    """:func:`iter_examples` yielding ``(arrays, file path or None)``;
    ``files``: the directory's :func:`example_files` when known."""
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


def stacked_by_name(examples, names: Sequence[str]):
    """A dict of stacked inputs keyed by input name as an iterable of
    examples; anything else as it is (per-example dicts are read by
    :func:`iter_sourced`).

    Raises:
        InputError: keys that are not the input names, arrays of different
            leading dimensions.
    """
    if isinstance(examples, Mapping):
        return _Stacked(_by_name(examples, names, "examples"))
    return examples


def count(examples, files: Optional[list]) -> Optional[int]:
    """The number of examples when known without reading them (for the progress bar)."""
    if files is not None:  # (a path: len() would be its number of characters)
        return len(files)
    try:
        return len(examples)
    except TypeError:
        return None


class NpyFiles:
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


class _Checker:
    """Checks one example's array of input ``k`` against the model's spec:
    its shape must be the input's without the batch dimension, its dtype
    cast to the input's under numpy's ``same_kind`` rule.

    Raises:
        InputError: naming the example (and its file), the input and what it expected.
    """

    def __init__(self, specs: Sequence, sample_shapes: Sequence[tuple]):
        self.specs, self.shapes = list(specs), list(sample_shapes)

    def __call__(self, x, i: int, src: Optional[str], k: int):
        s, shp = self.specs[k], self.shapes[k]
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


class ArraySteps:
    """Steps of an array of examples ``(N, *sample shape)`` of the input's
    dtype: each full step a view (no copy); the last partial step copied
    into a zero-padded buffer. Costs nothing to make, so it runs without a
    reader thread (:attr:`cheap`)."""

    cheap = True

    def __init__(self, arr: np.ndarray, step: int):
        self.arr, self.step, self.i = arr, step, 0

    def __call__(self):
        arr, step, i = self.arr, self.step, self.i
        n = min(step, len(arr) - i)
        self.i = i + n
        if n == step:
            return [arr[i:i + n]], n
        buf = np.zeros((step, *arr.shape[1:]), arr.dtype)
        buf[:n] = arr[i:i + n]
        return [buf], n


class _DirectorySteps:
    """Steps of a directory of ``.npy`` files for a one-input model: each
    file read into the step's buffer (:class:`NpyFiles`), any other file
    the general way (checked). Read by the thread that dispatches the steps
    (:attr:`cheap`): the steps in flight keep the device busy while it
    reads, and a reader thread only competed for the cores and the GIL
    (side by side on a quiet 2-core machine, steps of 1 and 8 examples:
    the thread took 1.01-1.21x as long as reading in place)."""

    cheap = True

    def __init__(self, folder: str, files: list, spec, shape: tuple, step: int, check: _Checker):
        self.folder, self.files, self.spec, self.shape, self.step = folder, files, spec, shape, step
        self.check, self.npy, self.i = check, NpyFiles(shape, spec.dtype), 0

    def __call__(self):
        step, npy = self.step, self.npy
        # a fresh buffer per step (the call may keep reading it after returning)
        buf = np.empty((step, *self.shape), self.spec.dtype)
        flat = buf.reshape(-1).view(np.uint8).reshape(step, npy.nbytes)
        n = 0
        while n < step and self.i < len(self.files):
            i, f = self.i, self.files[self.i]
            self.i += 1
            if not (f.endswith(".npy") and npy.read_into(os.path.join(self.folder, f), memoryview(flat[n]))):
                for xs, src in iter_sourced(self.folder, 1, [self.spec.name], [f]):
                    buf[n] = self.check(xs[0], i, src, 0)
            n += 1
        buf[n:] = 0
        return [buf], n


class _ExampleSteps:
    """Steps of any iterable of examples (or a directory of ``.npz``): each
    example checked and copied into a fresh buffer per step."""

    cheap = False

    def __init__(self, it: Iterator, specs: Sequence, shapes: Sequence[tuple], step: int, check: _Checker):
        self.it, self.specs, self.shapes, self.step, self.check, self.i = it, specs, shapes, step, check, 0

    def __call__(self):
        # np.empty, padding rows zeroed below: without writing each example twice
        bufs = [np.empty((self.step, *shp), s.dtype) for shp, s in zip(self.shapes, self.specs)]
        n = 0
        for xs, src in self.it:
            i = self.i
            self.i += 1
            for k, x in enumerate(xs):
                bufs[k][n] = self.check(x, i, src, k)
            n += 1
            if n == self.step:
                break
        for b in bufs:
            b[n:] = 0
        return bufs, n


def step_source(examples, specs: Sequence, step: int, files: Optional[list] = None):
    """``produce()`` -> ``(buffers, n)``, one step of ``step`` examples per
    call (see the module docstring); its ``cheap`` attribute says whether it
    can run without a reader thread.

    Args:
        examples: as :func:`iter_examples` takes them (a dict of stacked
            inputs already turned into an iterable, :func:`stacked_by_name`).
        specs: the model's input ``TensorSpec``s, batch dimension first.
        step: examples per step.
        files: the directory's :func:`example_files` when ``examples`` is one.

    Raises (from the calls):
        InputError: an example that does not match the inputs (naming its file).
    """
    shapes = [tuple(s.shape[1:]) for s in specs]
    check = _Checker(specs, shapes)
    one = specs[0] if len(specs) == 1 else None
    if (one is not None and isinstance(examples, np.ndarray) and examples.ndim == 1 + len(shapes[0])
            and examples.shape[1:] == shapes[0] and examples.dtype == one.dtype):
        return ArraySteps(examples, step)
    if one is not None and files is not None:
        return _DirectorySteps(os.fspath(examples), files, one, shapes[0], step, check)
    return _ExampleSteps(iter_sourced(examples, len(specs), [s.name for s in specs], files), specs, shapes, step,
                         check)
