"""MediaPipe Tasks vision bundles (``.task``): several ``.tflite`` models in one zip.

(Named apart from MediaPipe's LLM ``.task`` bundles, read by
:mod:`fbjax.formats.llm_container`: :class:`VisionTaskBundle`,
:func:`write_vision_task`; this module was ``fbjax.formats.task_bundle``, its
class ``TaskBundle`` and its writer ``write_bundle``: the old names still
work, with a ``DeprecationWarning``.)

A vision task file (face landmarker, hand landmarker, gesture recognizer...)
is a zip archive whose members are ``.tflite`` models (each with its own
TFLite metadata) and, for composite tasks, nested ``.task`` bundles; members
are stored uncompressed with their data 4-byte aligned, so a runtime can map
them in place (MediaPipe's ``model_asset_bundle_utils.create_model_asset_bundle``
writes them that way). MediaPipe's *LLM* ``.task`` files are zips too, but
carry a ``TF_LITE_PREFILL_DECODE`` member and no ``.tflite`` names: they are
not vision bundles (:func:`is_vision_task` says no).

:class:`VisionTaskBundle` lists the members, reads each one's metadata without
compiling it, loads any member as a model through the ``loader`` it is
given (``fbjax.load`` hands its own, with its options), and writes the bundle
back with some members replaced (:meth:`VisionTaskBundle.save`), the others'
bytes unchanged.
"""

from __future__ import annotations

import io
import os
import warnings
import zipfile
from typing import Callable, Mapping, Optional

from ..errors import InputError, ModelFormatError
from . import tflite
from ._writing import write_file
from .tflite_metadata import ZIP_ERRORS

__all__ = ["VisionTaskBundle", "is_vision_task", "write_vision_task", "LLM_MEMBER"]

#: the member that marks a MediaPipe LLM bundle (not a vision bundle)
LLM_MEMBER = "TF_LITE_PREFILL_DECODE"
_EOCD = b"PK\x05\x06"  # zip end-of-central-directory signature
_ALIGN = 4  # data alignment of stored members (MediaPipe's bundles)
_PAD_ID = 0xD935  # extra-field id of alignment padding (the one Android's zipalign uses)
_MODEL_SUFFIXES = (".tflite", ".task")


def _bytes(source) -> tuple:
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source), "<bytes>"
    path = os.fspath(source)
    with open(path, "rb") as f:
        return f.read(), path


def _ends(source) -> tuple:
    """(first 8 bytes, last 64 KiB + 22 bytes) of a path or bytes."""
    tail_len = 65535 + 22
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source[:8]), bytes(source[-tail_len:])
    path = os.fspath(source)
    if os.path.isdir(path):
        return b"", b""
    with open(path, "rb") as f:
        head = f.read(8)
        size = f.seek(0, 2)
        f.seek(max(0, size - tail_len))
        return head, f.read()


def is_vision_task(source) -> bool:
    """True when ``source`` (a path or bytes) is a MediaPipe Tasks vision
    bundle: a zip archive (found from its end record: MediaPipe's writer may
    pad before the first header) with at least one member named ``*.tflite``
    or ``*.task`` and no ``TF_LITE_PREFILL_DECODE`` member (that one marks an
    LLM bundle), and not a ``.tflite`` file (those may end with a zip of
    associated files). Never raises for a file that is not one (False)."""
    try:
        head, tail = _ends(source)
        if head[4:8] == b"TFL3" or _EOCD not in tail:
            return False
        # a path: zipfile reads the central directory only (LLM bundles are gigabytes)
        f = io.BytesIO(bytes(source)) if isinstance(source, (bytes, bytearray, memoryview)) else os.fspath(source)
        with zipfile.ZipFile(f) as z:
            names = z.namelist()
    except ZIP_ERRORS:
        return False
    return LLM_MEMBER not in names and any(n.lower().endswith(_MODEL_SUFFIXES) for n in names)


class VisionTaskBundle:
    """A MediaPipe Tasks vision bundle (``fbjax.load("face_landmarker.task")``).

    ``bundle["face_detector.tflite"]`` loads a member as a :class:`fbjax.Model`
    (a nested ``.task`` member as a :class:`VisionTaskBundle`); ``bundle.names``
    lists the members in archive order; ``bundle.metadata(name)`` reads a
    member's TFLite metadata without compiling it.

    Attributes:
        path: the file it was read from (None for bytes).
        names: member names, in archive order.
    """

    def __init__(self, source, loader: Optional[Callable] = None):
        data, label = _bytes(source)
        self.path = None if label == "<bytes>" else label
        self._label = label
        self._data = data
        self._loader = loader
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                self._infos = z.infolist()
                self._members = {i.filename: z.read(i.filename) for i in self._infos}
        except ZIP_ERRORS as e:
            raise ModelFormatError(f"{label}: damaged .task bundle ({type(e).__name__}: {e})") from None
        self.names = [i.filename for i in self._infos]

    def __contains__(self, name) -> bool:
        return name in self._members

    def __iter__(self):
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    def member_bytes(self, name: str) -> bytes:
        """The stored bytes of member ``name``.

        Raises:
            KeyError: no such member (the message lists them).
        """
        if name not in self._members:
            raise KeyError(f"{self._label}: no member {name!r}; members: {', '.join(self.names)}")
        return self._members[name]

    def metadata(self, name: str):
        """Member ``name``'s TFLite metadata
        (:class:`~fbjax.formats.tflite_metadata.TFLiteMetadata`), or None
        (none, or not a ``.tflite`` member). Reads the file, compiles nothing."""
        data = self.member_bytes(name)
        if not name.lower().endswith(".tflite"):
            return None
        return tflite.read(data).metadata.get("tflite_metadata")

    def __getitem__(self, name: str):
        """Member ``name`` loaded: a ``.task`` member as a :class:`VisionTaskBundle`,
        anything else through the loader (``fbjax.load`` with the options the
        bundle was opened with).

        Raises:
            KeyError: no such member.
        """
        data = self.member_bytes(name)
        if name.lower().endswith(".task") or is_vision_task(data):
            return VisionTaskBundle(data, self._loader)
        if self._loader is None:
            raise InputError("this VisionTaskBundle was made without a loader: open it with fbjax.load(path)")
        return self._loader(data)

    def summary(self) -> list:
        """Lines describing the members (``fbjax inspect BUNDLE.task``)."""
        out = [f"MediaPipe Tasks bundle: {len(self.names)} member(s)"]
        for n in self.names:
            size = len(self._members[n])
            out.append(f"  {n}  ({size:,} bytes)")
            if n.lower().endswith(".task"):
                out += ["    " + line for line in VisionTaskBundle(self._members[n]).summary()]
            elif n.lower().endswith(".tflite"):
                try:
                    md = self.metadata(n)
                except ModelFormatError as e:
                    out.append(f"    not a readable model: {e}")
                    continue
                if md is None:
                    out.append("    (no TFLite metadata)")
                else:
                    out += ["    " + line for line in md.summary()]
        return out

    def save(self, path=None, replace: Optional[Mapping] = None) -> bytes:
        """Write the bundle with some members replaced.

        Args:
            path: file to write (replaced atomically); None: only return the bytes.
            replace: member name -> new bytes, or an object with a ``save()``
                returning them (a :class:`fbjax.Model` fine-tuned from
                ``bundle[name]``: its ``save(params=...)`` output, or the Model
                itself with its current params), or a :class:`VisionTaskBundle`.

        Returns:
            the new bundle's bytes: members in the same order and with the
            same names and timestamps, stored uncompressed and 4-byte aligned
            as MediaPipe writes them; members not replaced keep their bytes.

        Raises:
            InputError: a name that is not a member; a folder that does not exist.
        """
        replace = dict(replace or {})
        for name in replace:
            if name not in self._members:
                raise InputError(f"save: {name!r} is not a member of the bundle; members: {', '.join(self.names)}")
        members = []
        for info in self._infos:
            new = replace.get(info.filename)
            if new is None:
                data = self._members[info.filename]
            elif isinstance(new, (bytes, bytearray, memoryview)):
                data = bytes(new)
            else:
                data = new.save()
            members.append((info, data))
        out = write_vision_task(members)
        if path is not None:
            write_file(path, out)
        return out

    def __repr__(self) -> str:
        name = os.path.basename(self.path) if self.path else "<bytes>"
        return f"VisionTaskBundle({name}: {', '.join(self.names)})"


def write_vision_task(members) -> bytes:
    """A MediaPipe Tasks bundle (zip) of ``members``.

    Args:
        members: ``(name or zipfile.ZipInfo, bytes)`` pairs, in order; a
            ZipInfo's name and timestamp are kept.

    Returns:
        the zip's bytes: every member stored (uncompressed) with its data at
        a 4-byte-aligned offset (alignment padding goes in the local header's
        extra field, as zipalign does; MediaPipe's own writer pads before the
        header instead; readers find the data either way).
    """
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as z:
        for key, data in members:
            name = key.filename if isinstance(key, zipfile.ZipInfo) else str(key)
            info = zipfile.ZipInfo(name, date_time=key.date_time if isinstance(key, zipfile.ZipInfo)
                                   else (1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_STORED
            info.external_attr = key.external_attr if isinstance(key, zipfile.ZipInfo) else 0o644 << 16
            at = buf.tell() + 30 + len(name.encode("utf-8"))
            need = -at % _ALIGN
            if need:
                pad = need + 4  # an extra block: 2-byte id, 2-byte size, then padding bytes
                info.extra = _PAD_ID.to_bytes(2, "little") + (pad - 4).to_bytes(2, "little") + b"\0" * (pad - 4)
            z.writestr(info, data)
    return buf.getvalue()


#: deprecated name -> its replacement in this module (issue 36: vision and LLM ``.task`` bundles named apart)
_RENAMED = {"TaskBundle": "VisionTaskBundle", "write_bundle": "write_vision_task"}


def __getattr__(name: str):
    if name in _RENAMED:
        warnings.warn(f"fbjax.formats.vision_task.{name} is deprecated: use {_RENAMED[name]} (a MediaPipe vision "
                      ".task bundle; LLM .task bundles are fbjax.formats.llm_container's)", DeprecationWarning,
                      stacklevel=2)
        return globals()[_RENAMED[name]]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
