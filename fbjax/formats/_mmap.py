"""Opening model sources for the readers: a path is read into a private
``bytes`` copy, bytes are wrapped in a memoryview; constants are zero-copy
views on that buffer.

A path is deliberately not memory-mapped: a loaded model keeps views on the
buffer (constants, the bytes :meth:`fbjax.Model.save` rewrites), and a file
rewritten or truncated in place under a mapping (a service hot-reloading a
model, a tool writing the next version to the same path) makes the next read
of a vanished page kill the process with SIGBUS. One read costs the file's
size in memory once; nothing fbjax returns can then see the file change.
"""

from __future__ import annotations

import os
from typing import Optional, Union

from ..errors import ModelFormatError


def open_source(source: Union[str, os.PathLike, bytes, bytearray, memoryview]) -> tuple:
    """``(buffer, path)`` for a path or bytes; ``path`` is None for bytes.

    ``buffer`` is a ``bytes`` copy of the file for a path (never a mapping of
    it, see the module docstring), a memoryview for bytes.

    Raises:
        FileNotFoundError: no such file.
        ModelFormatError: the file is empty, or it changed size while being
            read (written to concurrently).
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        return memoryview(source), None
    path: Optional[str] = os.fspath(source)
    return read_file(path), path


def read_file(path: str) -> bytes:
    """The whole file at ``path`` as ``bytes`` (see :func:`open_source`).

    Raises:
        FileNotFoundError: no such file.
        ModelFormatError: the file is empty, or its size changed while it was
            read (another process writing it).
    """
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise ModelFormatError(f"{path}: file is empty")
        data = f.read()
    if len(data) != size:
        raise ModelFormatError(
            f"{path}: the file changed size while it was read ({size} -> {len(data)} bytes); "
            "another process is writing it: load it again once the writer has finished "
            "(write the new version to a temporary name and os.replace() it over the old one)")
    return data
