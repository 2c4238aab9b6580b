"""Where :func:`fbjax.infer` puts results: in memory (:class:`MemorySink`)
or streamed, step by step, to an ``.npy``/``.npz`` file (:class:`FileSink`),
so the dataset's results never have to fit in memory.

A sink takes each step's outputs as host arrays (``add``) and the number of
valid rows (the last step is padded); ``finish`` returns the results (one
array per output, leading dimension the number of examples) or the path
written. The ``.npy`` format is numpy's (``numpy.lib.format``, version 2.0
headers); an ``.npz`` is a stored (uncompressed) zip of such files, as
``numpy.savez`` writes.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import zipfile
from typing import Callable, Optional, Sequence

import numpy as np

from ..errors import InputError

__all__ = ["FILE_NAMES_KEY", "check_out_path", "output_keys", "MemorySink", "FileSink", "make_sink"]

#: Key of the extra array in an ``.npz`` written by :func:`fbjax.infer` from a
#: directory of examples: the example file names (``str``), in the order of
#: the results. No output is ever stored under this key (an output named so
#: is written as ``output_<k>``).
FILE_NAMES_KEY = "__files__"


def check_out_path(out) -> str:
    """Validate an ``out`` path of :func:`fbjax.infer` before any work is
    done: it must end in ``.npy`` or ``.npz`` and its folder must exist.

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


def output_keys(names: Sequence[str]) -> list:
    """The ``.npz`` key of each output: its name when that is unique, has
    no ``/`` and is not :data:`FILE_NAMES_KEY`, else ``output_<k>``."""
    names = list(names)
    return [n if n and names.count(n) == 1 and "/" not in n and n != FILE_NAMES_KEY else f"output_{i}"
            for i, n in enumerate(names)]


#: ``() -> [(dtype, per-example shape)]`` per output, asked for when no example came
EmptyMetas = Callable[[], list]


class MemorySink:
    """Results kept in memory: one list of per-step arrays per output,
    concatenated once at :meth:`finish`."""

    def __init__(self, n_outputs: int):
        self.chunks: list = [[] for _ in range(n_outputs)]
        self.count = 0

    def add(self, outs: Sequence[np.ndarray], n: int) -> None:
        """Keep the first ``n`` rows of each output of a step (a view when
        the step is full: its arrays are not written again)."""
        for k, o in enumerate(outs):
            self.chunks[k].append(o if len(o) == n else o[:n])
        self.count += n

    def finish(self, empty_metas: EmptyMetas):
        """One array per output (the array itself for a single output);
        with no examples, ``(0, *per-example shape)`` arrays."""
        if not self.count:
            res = [np.zeros((0, *shape), dtype) for dtype, shape in empty_metas()]
        else:
            res = [np.concatenate(c) for c in self.chunks]  # (writable arrays, also from one step)
        return res[0] if len(res) == 1 else res

    def close(self) -> None:
        pass


class FileSink:
    """Results streamed to ``out`` (``.npy`` for one output, ``.npz``): each
    step's rows are appended to one temporary file per output in ``out``'s
    folder; :meth:`finish` writes the headers (the number of examples is
    known only then) and the data into ``out.tmp<pid>``, then renames it to
    ``out``, so a failed run never leaves a half-written ``out``.

    Raises:
        InputError: a bad ``out`` path, or ``.npy`` for a model of several outputs.
    """

    def __init__(self, out: str, names: Sequence[str], file_names: Optional[Sequence[str]] = None):
        self.out = check_out_path(out)
        self.names = list(names)
        self.file_names = None if file_names is None else list(file_names)
        if out.endswith(".npy") and len(names) != 1:
            raise InputError(f"the model has {len(names)} outputs; write them to an .npz file")
        self.meta: list = [None] * len(names)  # (dtype, per-example shape)
        self.count = 0
        folder = os.path.dirname(os.path.abspath(out))
        self.files = [tempfile.TemporaryFile(dir=folder) for _ in names]

    def add(self, outs: Sequence[np.ndarray], n: int) -> None:
        """Append the first ``n`` rows of each output of a step."""
        for k, o in enumerate(outs):
            o = np.ascontiguousarray(o[:n])
            if self.meta[k] is None:
                self.meta[k] = (o.dtype, o.shape[1:])
            self.files[k].write(memoryview(o).cast("B"))
        self.count += n

    def finish(self, empty_metas: EmptyMetas) -> str:
        """Write ``out``; return its path."""
        metas = self.meta if all(m is not None for m in self.meta) else empty_metas()
        tmp = f"{self.out}.tmp{os.getpid()}"
        try:
            if self.out.endswith(".npy"):
                with open(tmp, "wb") as f:
                    self._write_npy(f, 0, metas[0])
            else:
                with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
                    for k, key in enumerate(output_keys(self.names)):
                        with zf.open(f"{key}.npy", "w", force_zip64=True) as f:
                            self._write_npy(f, k, metas[k])
                    if self.file_names is not None:
                        with zf.open(f"{FILE_NAMES_KEY}.npy", "w", force_zip64=True) as f:
                            np.lib.format.write_array(f, np.asarray(self.file_names, dtype=str).reshape(-1))
            os.replace(tmp, self.out)
        finally:
            self.close()
            if os.path.exists(tmp):
                os.remove(tmp)
        return self.out

    def _write_npy(self, f, k: int, meta) -> None:
        dtype, shape = meta
        np.lib.format.write_array_header_2_0(
            f, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False,
                "shape": (self.count, *shape)})
        src = self.files[k]
        src.seek(0)
        shutil.copyfileobj(src, f, 1 << 22)

    def close(self) -> None:
        for f in self.files:
            f.close()


def make_sink(out: Optional[str], names: Sequence[str], file_names: Optional[Sequence[str]] = None):
    """:class:`MemorySink` when ``out`` is None, else :class:`FileSink`."""
    return MemorySink(len(names)) if out is None else FileSink(out, names, file_names)
