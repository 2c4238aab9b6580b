"""Opening model sources for the readers: a path is memory-mapped read-only,
bytes are wrapped in a memoryview, so constants can be zero-copy views."""

from __future__ import annotations

import mmap
import os
from typing import Optional, Union

from ..errors import ModelFormatError


def open_source(source: Union[str, os.PathLike, bytes, bytearray, memoryview]) -> tuple:
    """``(buffer, path)`` for a path or bytes; ``path`` is None for bytes.

    Raises:
        FileNotFoundError: no such file.
        ModelFormatError: the file is empty (mmap cannot map it).
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        return memoryview(source), None
    path: Optional[str] = os.fspath(source)
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            raise ModelFormatError(f"{path}: file is empty")
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return mm, path
