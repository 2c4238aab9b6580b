"""Model file formats: readers turn a file's bytes into :class:`fbjax.ir.ModelIR`
(:func:`read_model`), writers patch new constants into a file's bytes
(:func:`write_model`).

* :mod:`fbjax.formats.tflite` -- ``.tflite`` (TFLite schema v3, ``TFL3``;
  ``STABLEHLO_*`` builtins via :mod:`fbjax.formats.tflite_stablehlo`);
  writer :mod:`fbjax.formats.tflite_writer`
* :mod:`fbjax.formats.rten` -- ``.rten`` (v2: ``RTEN`` header; v1: probed);
  writer :mod:`fbjax.formats.rten_writer`
* :mod:`fbjax.formats.stablehlo` -- ``stablehlo.flatbuf`` (the StableHLO
  prototype flatbuffer, probed); writer :mod:`fbjax.formats.stablehlo_writer`
* :mod:`fbjax.formats.gpu_cl` -- TFLite GPU delegate (OpenCL) serialized
  ``.bin`` (probed per schema generation); writer :mod:`fbjax.formats.gpu_cl_writer`
* :mod:`fbjax.formats.llm_container` -- LLM bundles: LiteRT-LM ``.litertlm``
  and MediaPipe LLM ``.task`` (containers around a ``.tflite``: ``fbjax.load``
  dispatches on :func:`fbjax.formats.llm_container.bundle_kind` before
  :func:`read_model`); written back by ``write_bundle``
* :mod:`fbjax.formats.vision_task` -- MediaPipe Tasks vision ``.task``
  bundles (a zip of ``.tflite`` members, :class:`~fbjax.formats.vision_task.VisionTaskBundle`)

The module names ``fbjax.formats.llm_bundle`` and ``fbjax.formats.task_bundle``
(before issue 36 named the two ``.task`` kinds apart and left one
``llm_bundle`` module, :mod:`fbjax.llm_bundle`) still resolve as attributes
(``from fbjax.formats import llm_bundle``), with a ``DeprecationWarning``.

``_generated/`` holds the Python bindings ``flatc`` generated from
``schemas/*.fbs`` (regenerate with ``nox -s schemas``; do not edit by hand).
"""

from __future__ import annotations

import importlib
import os
import struct
import warnings
from typing import Mapping, Optional

from ..errors import InputError, ModelFormatError
from ..ir import ModelIR
from . import tflite


def _lazy(module: str, function: str):
    """``fbjax.formats.<module>.<function>``, imported at its first call: a
    ``.tflite`` or LLM bundle never imports the other formats' flatc bindings
    (issue 35: about 0.3 s of ``fbjax generate``'s start-up on an idle 2-core
    machine, over 1 s on a loaded one)."""
    def call(*args, **kwargs):
        return getattr(importlib.import_module(f"{__name__}.{module}"), function)(*args, **kwargs)
    call.__name__ = call.__qualname__ = f"{module}.{function}"
    return call


#: format name -> reader(source) -> ModelIR
READERS = {"tflite": tflite.read, "stablehlo": _lazy("stablehlo", "read"), "rten": _lazy("rten", "read"),
           "gpu_cl": _lazy("gpu_cl", "read")}


def detect_format(source) -> str:
    """Name of the format of ``source`` (a path or bytes), from its bytes.

    TFLite files carry ``TFL3`` at bytes 4-7.

    Raises:
        ModelFormatError: no known format matches, or the path is a directory.
        FileNotFoundError: the path does not exist.
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        head = bytes(source[:8])
        label = "<bytes>"
    else:
        label = os.fspath(source)
        if os.path.isdir(label):
            raise ModelFormatError(
                f"{label}: is a directory, not a model file; fbjax reads single .tflite, .rten, "
                "StableHLO flatbuffer and TFLite GPU delegate .bin files (a TensorFlow SavedModel directory "
                "must be converted to .tflite first, e.g. with tf.lite.TFLiteConverter.from_saved_model)"
            )
        with open(label, "rb") as f:
            head = f.read(8)
    if tflite.is_tflite(head):
        return "tflite"
    for name, probe in _PROBES:
        if probe(source, head):
            return name
    if not head:
        raise ModelFormatError(f"{label}: the file is empty (0 bytes): an interrupted download or copy?")
    if _is_jax_export(source):
        raise ModelFormatError(
            f"{label}: a serialized jax.export program (what `fbjax export --to stablehlo` writes), not a model "
            "file: it is already compiled from one, and runs without fbjax as "
            "jax.export.deserialize(open(PATH, 'rb').read()).call(params, *inputs); "
            "load the model file it was exported from instead")
    if _ZIP_LOCAL in head:  # a zip no bundle reader took (MediaPipe's writer may pad before it): what, where it ends
        raise ModelFormatError(_cut_zip(source, label))
    ext = os.path.splitext(label)[1].lower()
    named = _EXTENSION_FORMATS.get(ext)
    if named is not None:  # named like a format it does not probe as: say why that reader refuses it
        try:
            READERS[named](source)
        except ModelFormatError as e:
            raise ModelFormatError(
                f"{label}: named like a {named} file (extension {ext}) but damaged or not one: "
                f"{str(e).removeprefix(label + ': ')} (other formats: {', '.join(sorted(set(READERS) - {named}))}; "
                f"`fbjax inspect --format FORMAT` or fbjax.load(path, format=...) reads it as another)") from None
    advice = _CONVERT_ADVICE.get(ext, "")
    raise ModelFormatError(
        f"{label}: not a model file fbjax recognises (first bytes {head!r}); "
        f"supported formats: {', '.join(sorted(READERS))}, and the bundles {BUNDLE_FORMATS}"
        + (f"; {advice}" if advice else "")
    )


#: the container formats fbjax.load opens besides the READERS (named in refusals)
BUNDLE_FORMATS = ".litertlm, MediaPipe LLM .task and MediaPipe Tasks vision .task"
_ZIP_LOCAL = b"PK\x03\x04"  # a zip member's local header signature


def _cut_zip(source, label: str) -> str:
    """Why a file that starts as a zip archive is no bundle fbjax opens: cut
    off (no end-of-central-directory record, or a member's data running past
    the end: a ``.task`` bundle loses its directory, stored at the end, first),
    or a complete zip of something else. Names the bundle kind its first
    member shows, and the size the local headers need against the file's."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        raw = bytes(source)
    else:
        with open(label, "rb") as f:
            raw = f.read()
    names, pos, need = [], raw.find(_ZIP_LOCAL, 0, 4096), 0
    names_at = pos
    while pos >= 0 and raw[pos:pos + 4] == _ZIP_LOCAL and pos + 30 <= len(raw):  # walk the local headers from the start
        flags, csize, n, m = struct.unpack_from("<H10xIxxxxHH", raw, pos + 6)
        names.append(raw[pos + 30:pos + 30 + n].decode("utf-8", "replace"))
        need = pos + 30 + n + m + csize
        if flags & 8 or need > len(raw):  # sizes in a trailing descriptor, or the data runs past the end
            break
        pos = need
    first = names[0] if names else "?"
    kind = ("a MediaPipe LLM .task bundle" if "TF_LITE_PREFILL_DECODE" in names
            else "a MediaPipe Tasks .task bundle" if first.lower().endswith((".tflite", ".task")) else "a zip archive")
    # complete: an end record whose central directory ends right before it (zipfile alone would also take
    # the end record of a zip inside a member, e.g. a .tflite's associated files)
    e = raw.rfind(b"PK\x05\x06")
    complete = e >= 0 and e + 22 <= len(raw) and sum(struct.unpack_from("<II", raw, e + 12)) in (e, e - names_at)
    if complete and need <= len(raw):
        return (f"{label}: a complete zip archive (members {', '.join(names[:5])}{'...' if len(names) > 5 else ''}) "
                f"that is no bundle fbjax opens: an LLM .task holds a TF_LITE_PREFILL_DECODE member, a vision .task "
                f".tflite members; supported formats: {', '.join(sorted(READERS))}, and the bundles {BUNDLE_FORMATS}")
    cut = (f"member {names[-1]!r} needs bytes up to {need:,}" if need > len(raw)
           else "the end of its central directory (the member list, stored last) is missing")
    return (f"{label}: {kind} (first member {first!r}) cut off at {len(raw):,} bytes: {cut}; the file looks "
            "truncated (an interrupted download or copy?): fetch it again")


#: the format a file's name suggests (its reader's refusal explains a file that probes as none)
_EXTENSION_FORMATS = {".tflite": "tflite", ".rten": "rten", ".bin": "gpu_cl", ".flatbuf": "stablehlo"}


def _is_jax_export(source) -> bool:
    """Whether ``source`` (a path or bytes) is a serialized ``jax.export.Exported``."""
    from jax import export  # only for a file no reader takes (the import costs ~0.1 s)

    try:
        data = bytes(source) if isinstance(source, (bytes, bytearray, memoryview)) else open(source, "rb").read()
        export.deserialize(bytearray(data))
        return True
    except Exception:  # noqa: BLE001 - anything it cannot read is not one
        return False


#: what to do with a file of a format fbjax does not read, by file-name extension
_CONVERT_ADVICE = {
    ".onnx": "an ONNX model runs once converted to .rten: pip install 'fbjax[onnx]', then "
             "fbjax convert MODEL.onnx MODEL.rten",
    ".pb": "convert a TensorFlow model to .tflite first (tf.lite.TFLiteConverter)",
    ".h5": "convert a Keras model to .tflite first (tf.lite.TFLiteConverter.from_keras_model)",
    ".keras": "convert a Keras model to .tflite first (tf.lite.TFLiteConverter.from_keras_model)",
    ".pt": "convert a PyTorch model to .tflite first (litert-torch), or to ONNX and then .rten (rten-convert)",
    ".pth": "convert a PyTorch model to .tflite first (litert-torch), or to ONNX and then .rten (rten-convert)",
}


# Extra (name, probe(source, head) -> bool) pairs for formats without a file
# identifier; filled by the format modules that need them.
_PROBES: list = [("rten", _lazy("rten", "probe")), ("stablehlo", _lazy("stablehlo", "probe")),
                 ("gpu_cl", _lazy("gpu_cl", "probe"))]


def read_model(source, format: Optional[str] = None) -> ModelIR:
    """Parse a model file into the IR.

    Args:
        source: path or bytes of the model.
        format: force a format (``"tflite"``); detected from the bytes if None.

    What a file means per op (region graphs' arities, the output dtypes an
    RTen file leaves open as None) is applied after reading, with an op
    registry, by the read step :func:`fbjax.passes.reading.read`
    (:func:`fbjax.loading.read`, run by :func:`fbjax.load`, and
    :func:`fbjax.reference.run` call it); the lowering takes only its result
    (:attr:`fbjax.ir.ModelIR.completed`).

    Raises:
        ModelFormatError: unknown or corrupt file.
    """
    fmt = format or detect_format(source)
    if fmt not in READERS:
        raise ModelFormatError(f"unknown format {fmt!r}; known: {', '.join(sorted(READERS))}")
    return READERS[fmt](source)


#: format -> module of :mod:`fbjax.formats` whose ``write(ir, updates,
#: *, requantize) -> bytes`` re-writes a file of that format with the
#: constants in ``updates`` (``{Value: array}``) replaced.
WRITERS = {"tflite": "tflite_writer", "rten": "rten_writer", "stablehlo": "stablehlo_writer",
           "gpu_cl": "gpu_cl_writer"}


def write_model(ir: ModelIR, updates: Mapping, *, requantize: str = "file", registry=None) -> bytes:
    """The bytes of ``ir``'s file (``ir.format``) with the constants in
    ``updates`` (``{Value: array}``) replaced; everything else as the file had
    it. Used by :meth:`fbjax.Model.save`, which hands down ``registry`` (the
    op registry, ``fbjax.lower.LOWERINGS``: formats sit below the lowering)
    for the op facts a writer reads (TFLite's ``bias_scale``, needed by
    ``requantize="per_channel"``).

    Raises:
        InputError: no writer for the format, or values the writer refuses.
    """
    mod = WRITERS.get(ir.format)
    try:
        module = importlib.import_module(f".{mod}", __package__) if mod else None
    except ModuleNotFoundError:
        module = None
    if module is None:
        raise InputError(f"saving {ir.format!r} models is not supported yet (writers: {sorted(WRITERS)})")
    return module.write(ir, updates, requantize=requantize, registry=registry)


#: deprecated submodule name -> the module that took its job (issue 36)
_RENAMED_MODULES = {"llm_bundle": "llm_container", "task_bundle": "vision_task"}


def __getattr__(name: str):
    if name in _RENAMED_MODULES:
        new = _RENAMED_MODULES[name]
        warnings.warn(f"fbjax.formats.{name} is deprecated: use fbjax.formats.{new}", DeprecationWarning,
                      stacklevel=2)
        return importlib.import_module(f"{__name__}.{new}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
