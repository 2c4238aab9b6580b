"""What every writer (``formats.write_model``: ``<format>_writer.write``)
checks first, in one place: the model is of the writer's format, its file's
bytes are still held, and ``requantize`` is a known mode."""

from __future__ import annotations

import os

from ..errors import InputError
from ..ir import ModelIR

#: ``requantize=`` modes of :meth:`fbjax.Model.save` (only the TFLite writer
#: has quantization parameters to recompute; the others accept both)
REQUANTIZE_MODES = ("file", "per_channel")


def check_writable(ir: ModelIR, fmt: str, writer: str, requantize: str, *, needs_buffer: bool = True) -> None:
    """Raise :class:`~fbjax.errors.InputError` unless ``ir`` is a ``fmt``
    model (``writer``: the writer's name in the message) whose file contents
    are held (``ir.buffer``, when ``needs_buffer``) and ``requantize`` is one
    of :data:`REQUANTIZE_MODES`."""
    if ir.format != fmt:
        raise InputError(f"the {writer} writer cannot write a {ir.format!r} model")
    if needs_buffer and ir.buffer is None:
        raise InputError("the model's file contents are no longer available; load it again to save it")
    if requantize not in REQUANTIZE_MODES:
        raise InputError(f"requantize must be one of {REQUANTIZE_MODES}, got {requantize!r}")


def write_file(path, data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all: into a temporary file
    beside it, then renamed over it (a reader never sees half a model).

    Raises:
        InputError: ``path``'s folder does not exist.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise InputError(f"save: folder {folder!r} does not exist (create it first)")
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
