"""TFLite metadata: what a ``.tflite`` file says about its inputs and outputs.

A model file may carry an entry of ``Model.metadata`` named
``TFLITE_METADATA`` whose buffer is a flatbuffer of the TFLite metadata schema
(``schemas/tflite_metadata.fbs``, MediaPipe's copy of TFLite Support's
``metadata_schema.fbs``, version 1.5.0; root ``ModelMetadata``, file
identifier ``M001``). Files it refers to (label maps, vocabularies, score
calibration tables) are appended to the model as a zip archive ("associated
files"); :mod:`zipfile` opens the whole file and lists them.

:func:`read` turns both into a :class:`TFLiteMetadata` (``fbjax.Model.metadata``):
model name, description, version, author, license; per input tensor the
normalization ``(x - mean) / std``, value range statistics and image
properties; per output tensor its name, description, content kind
(image / bounding box / feature), bounding-box layout, score calibration and
thresholds, and labels per locale read from the associated files.
:meth:`TFLiteMetadata.as_dict` gives the whole table in the JSON form
``flatc --json`` writes (what TFLite Support's ``MetadataDisplayer`` prints),
which the tests compare with that displayer's recorded output.
"""

from __future__ import annotations

import dataclasses
import io
import struct
import zipfile
from typing import Optional

import numpy as np

from ..errors import ModelFormatError
from . import verify as _verify
from ._generated import tflite_metadata_generated as MD
from ._generated import tflite_metadata_schema_desc as _DESC

__all__ = ["TFLiteMetadata", "TensorMetadata", "AssociatedFile", "BoundingBox", "read", "METADATA_NAME",
           "associated_zip_range"]

#: the ``Model.metadata`` entry name that holds the metadata flatbuffer
METADATA_NAME = "TFLITE_METADATA"
#: largest associated file read (a label map is kilobytes; a larger one is refused, not read)
_MAX_FILE = 256 << 20
_EOCD = b"PK\x05\x06"  # zip end-of-central-directory signature
#: what zipfile raises on a damaged archive (an unknown version: NotImplementedError; encrypted: RuntimeError)
ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError, OSError, NotImplementedError,
              RuntimeError, struct.error, UnicodeDecodeError, OverflowError)


@dataclasses.dataclass(frozen=True)
class AssociatedFile:
    """One ``AssociatedFile`` entry: ``type`` is the schema's enum name
    (``"TENSOR_AXIS_LABELS"``, ``"TENSOR_VALUE_LABELS"``, ``"DESCRIPTIONS"``,
    ``"TENSOR_AXIS_SCORE_CALIBRATION"``, ``"VOCABULARY"``, ...); ``locale``
    an ISO 639-1 code (e.g. ``"en"``) or None."""

    name: str
    description: Optional[str] = None
    type: str = "UNKNOWN"
    locale: Optional[str] = None
    version: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class BoundingBox:
    """``BoundingBoxProperties``: ``type`` is ``"BOUNDARIES"`` (left, top,
    right, bottom), ``"UPPER_LEFT"`` (x, y, width, height) or ``"CENTER"``
    (center x, center y, width, height); ``index`` the position of those four
    values in the tensor's last axis (default ``(0, 1, 2, 3)``);
    ``coordinate_type`` ``"RATIO"`` (0..1 of the image) or ``"PIXEL"``."""

    type: str = "UNKNOWN"
    index: tuple = (0, 1, 2, 3)
    coordinate_type: str = "RATIO"


@dataclasses.dataclass
class TensorMetadata:
    """What the metadata says about one input or output tensor.

    Attributes:
        name, description: free text (``name`` is the metadata's name, which
            may differ from the graph tensor's name).
        content: ``"image"``, ``"bounding_box"``, ``"feature"``, ``"audio"``
            or None (no ``Content`` table).
        color_space: ``"RGB"``, ``"GRAYSCALE"`` or ``"UNKNOWN"`` for images, else None.
        default_size: ``(width, height)`` of a dynamic-size image input, else None.
        bounding_box: :class:`BoundingBox` for box outputs, else None.
        range: ``Content.range`` ``(min, max)``: the dimensions one content
            object spans (e.g. ``(2, 2)``: each entry of axis 2 is a box), or None.
        mean, std: per-channel normalization ``(x - mean) / std``
            (``NormalizationOptions``; one value applies to every channel),
            tuples of float, or None.
        min, max: ``Stats`` value range (after normalization for inputs), or None.
        score_calibration: ``{"score_transformation", "default_score"}`` or None.
        score_threshold: ``ScoreThresholdingOptions.global_score_threshold`` or None.
        dimension_names: names of the tensor's dimensions, or None.
        associated_files: tuple of :class:`AssociatedFile`.
        labels: ``{locale: [label, ...]}`` from the ``TENSOR_AXIS_LABELS``
            files (locale ``None`` when the file names none), in file order.
        value_labels: the same for ``TENSOR_VALUE_LABELS`` files (a tensor of
            class indices).
    """

    name: Optional[str] = None
    description: Optional[str] = None
    content: Optional[str] = None
    color_space: Optional[str] = None
    default_size: Optional[tuple] = None
    bounding_box: Optional[BoundingBox] = None
    range: Optional[tuple] = None
    mean: Optional[tuple] = None
    std: Optional[tuple] = None
    min: Optional[tuple] = None
    max: Optional[tuple] = None
    score_calibration: Optional[dict] = None
    score_threshold: Optional[float] = None
    dimension_names: Optional[tuple] = None
    associated_files: tuple = ()
    labels: dict = dataclasses.field(default_factory=dict)
    value_labels: dict = dataclasses.field(default_factory=dict)

    def label_list(self, locale: Optional[str] = None) -> Optional[list]:
        """The labels of ``locale`` (default: the first label file, as TFLite
        Support picks it), or None when the tensor has no label file."""
        if not self.labels:
            return None
        if locale is None:
            return next(iter(self.labels.values()))
        return self.labels.get(locale)


class TFLiteMetadata:
    """A model file's TFLite metadata (``fbjax.Model.metadata``).

    Attributes:
        name, description, version, author, license, min_parser_version:
            ``ModelMetadata`` strings (None when absent).
        inputs, outputs: lists of :class:`TensorMetadata`, in the order of the
            first subgraph's inputs and outputs (the schema's order).
        associated_files: model-level :class:`AssociatedFile` entries.
        packed_files: names of the files in the appended zip archive.
        missing_files: files the metadata names that are not packed (a
            damaged or stripped archive): their labels are absent.
        raw: the metadata flatbuffer's bytes.
    """

    def __init__(self, tree, raw: bytes, zip_bytes: Optional[bytes], label: str):
        self._tree = tree
        self.raw = raw
        self._zip = zip_bytes
        self._label = label
        self._files: dict = {}
        s = _text
        self.name = s(tree.name)
        self.description = s(tree.description)
        self.version = s(tree.version)
        self.author = s(tree.author)
        self.license = s(tree.license)
        self.min_parser_version = s(tree.minParserVersion)
        self.associated_files = tuple(_assoc(f) for f in tree.associatedFiles or [])
        self.packed_files = self._packed_names()
        sub = (tree.subgraphMetadata or [None])[0]
        self.subgraph_name = s(sub.name) if sub is not None else None
        self.inputs = [self._tensor(t) for t in (sub.inputTensorMetadata or [])] if sub is not None else []
        self.outputs = [self._tensor(t) for t in (sub.outputTensorMetadata or [])] if sub is not None else []
        named = [f.name for f in self.associated_files] + [f.name for t in self.inputs + self.outputs
                                                            for f in t.associated_files]
        #: associated files the metadata names that the file does not pack (their labels are absent)
        self.missing_files = [n for n in dict.fromkeys(named) if n not in self.packed_files]

    # -- associated files -------------------------------------------------------
    def _packed_names(self) -> list:
        if self._zip is None:
            return []
        try:
            with zipfile.ZipFile(io.BytesIO(self._zip)) as z:
                return [i.filename for i in z.infolist()]
        except ZIP_ERRORS as e:
            raise ModelFormatError(f"{self._label}: associated files: the appended zip archive is damaged ({e})") from None

    def file(self, name: str) -> bytes:
        """The bytes of associated file ``name`` from the appended zip archive.

        Raises:
            KeyError: no such file in the archive.
            ModelFormatError: the archive or the member is damaged, or larger
                than 256 MiB.
        """
        if name in self._files:
            return self._files[name]
        if name not in self.packed_files:
            raise KeyError(f"{self._label}: no associated file {name!r} packed in the model "
                           f"(packed: {', '.join(self.packed_files) or 'none'})")
        try:
            with zipfile.ZipFile(io.BytesIO(self._zip)) as z:
                info = z.getinfo(name)
                if info.file_size > _MAX_FILE:
                    raise ModelFormatError(f"{self._label}: associated file {name!r} says it holds "
                                           f"{info.file_size} bytes (more than {_MAX_FILE})")
                data = z.read(name)
        except ZIP_ERRORS as e:
            raise ModelFormatError(f"{self._label}: associated file {name!r} is damaged ({type(e).__name__}: {e})") from None
        self._files[name] = data
        return data

    def _labels(self, files, kind: str) -> dict:
        out: dict = {}
        for f in files:
            if f.type != kind or f.name not in self.packed_files:
                continue
            text = self.file(f.name).decode("utf-8", "replace")
            lines = [ln.rstrip("\r") for ln in text.split("\n")]
            while lines and not lines[-1]:
                lines.pop()
            out.setdefault(f.locale, lines)
        return out

    def _tensor(self, t) -> TensorMetadata:
        s = _text
        tm = TensorMetadata(name=s(t.name), description=s(t.description))
        if t.dimensionNames is not None:
            tm.dimension_names = tuple(s(x) for x in t.dimensionNames)
        c = t.content
        if c is not None:
            kind = _DESC.UNIONS["ContentProperties"].get(int(c.contentPropertiesType))
            props = c.contentProperties
            tm.content = {"FeatureProperties": "feature", "ImageProperties": "image",
                          "BoundingBoxProperties": "bounding_box", "AudioProperties": "audio"}.get(kind)
            if kind == "ImageProperties" and props is not None:
                tm.color_space = _enum_name("ColorSpaceType", props.colorSpace)
                if props.defaultSize is not None:
                    tm.default_size = (int(props.defaultSize.width), int(props.defaultSize.height))
            elif kind == "BoundingBoxProperties" and props is not None:
                idx = tuple(int(i) for i in props.index) if props.index is not None and len(props.index) else (0, 1, 2, 3)
                tm.bounding_box = BoundingBox(_enum_name("BoundingBoxType", props.type), idx,
                                              _enum_name("CoordinateType", props.coordinateType))
            if c.range is not None:
                tm.range = (int(c.range.min), int(c.range.max))
        for pu in t.processUnits or []:
            kind = _DESC.UNIONS["ProcessUnitOptions"].get(int(pu.optionsType))
            o = pu.options
            if o is None:
                continue
            if kind == "NormalizationOptions":
                tm.mean = _floats(o.mean)
                tm.std = _floats(o.std)
            elif kind == "ScoreCalibrationOptions":
                tm.score_calibration = {
                    "score_transformation": _enum_name("ScoreTransformationType", o.scoreTransformation),
                    "default_score": float(o.defaultScore)}
            elif kind == "ScoreThresholdingOptions":
                tm.score_threshold = float(o.globalScoreThreshold)
        if t.stats is not None:
            tm.min = _floats(t.stats.min)
            tm.max = _floats(t.stats.max)
        tm.associated_files = tuple(_assoc(f) for f in t.associatedFiles or [])
        tm.labels = self._labels(tm.associated_files, "TENSOR_AXIS_LABELS")
        tm.value_labels = self._labels(tm.associated_files, "TENSOR_VALUE_LABELS")
        return tm

    # -- views ------------------------------------------------------------------
    def as_dict(self) -> dict:
        """The whole ``ModelMetadata`` table as ``flatc --json`` writes it
        (and TFLite Support's ``MetadataDisplayer.get_metadata_json``):
        schema field names, enum values by name, a union as ``<field>_type``
        plus ``<field>``, fields the file leaves out omitted (scalars at
        their default 0 too), vectors of ubyte as lists of ints."""
        return _to_dict(self._tree, _DESC.ROOT)

    def summary(self) -> list:
        """Human-readable lines (what ``fbjax inspect`` prints)."""
        out = []
        out.append(f"metadata: {self.name or '(unnamed)'}" + (f" (version {self.version})" if self.version else ""))
        for key in ("description", "author", "license"):
            val = getattr(self, key)
            if val:
                out.append(f"  {key}: {_oneline(val)}")
        for side, tensors in (("input", self.inputs), ("output", self.outputs)):
            for i, t in enumerate(tensors):
                bits = []
                if t.content:
                    bits.append(t.content + (f" {t.color_space}" if t.color_space else ""))
                if t.mean is not None or t.std is not None:
                    bits.append(f"normalize (x - {_nums(t.mean)}) / {_nums(t.std)}")
                if t.min is not None or t.max is not None:
                    bits.append(f"range [{_nums(t.min)}, {_nums(t.max)}]")
                if t.bounding_box is not None:
                    b = t.bounding_box
                    bits.append(f"boxes {b.type} {b.coordinate_type} index {list(b.index)}")
                if t.score_calibration:
                    bits.append(f"score calibration {t.score_calibration['score_transformation']}")
                if t.score_threshold is not None:
                    bits.append(f"score threshold {t.score_threshold:g}")
                for lab_kind, labs in (("labels", t.labels), ("value labels", t.value_labels)):
                    for loc, ls in labs.items():
                        shown = ", ".join(ls[:5]) + (", ..." if len(ls) > 5 else "")
                        bits.append(f"{len(ls)} {lab_kind}{f' ({loc})' if loc else ''}: {shown}")
                out.append(f"  {side} {i} {t.name!r}: " + "; ".join(bits) if bits else f"  {side} {i} {t.name!r}")
                if t.description:
                    out.append(f"      {_oneline(t.description)}")
        if self.packed_files:
            out.append(f"  associated files: {', '.join(self.packed_files)}")
        if self.missing_files:
            out.append(f"  named but not packed in the file (no labels from them): {', '.join(self.missing_files)}")
        return out

    def __repr__(self) -> str:
        return (f"TFLiteMetadata(name={self.name!r}, version={self.version!r}, inputs={len(self.inputs)}, "
                f"outputs={len(self.outputs)}, packed_files={self.packed_files})")


def _oneline(s: str, n: int = 160) -> str:
    s = " ".join(s.split())
    return s if len(s) <= n else s[: n - 3] + "..."


def _nums(v) -> str:
    if v is None:
        return "?"
    if len(v) > 1 and all(x == v[0] for x in v):
        return f"{v[0]:g}"
    return "[" + ", ".join(f"{x:g}" for x in v) + "]" if len(v) != 1 else f"{v[0]:g}"


def _text(b) -> Optional[str]:
    if b is None:
        return None
    return b.decode("utf-8", "replace") if isinstance(b, (bytes, bytearray)) else str(b)


def _floats(v) -> Optional[tuple]:
    if v is None:
        return None
    return tuple(float(x) for x in np.asarray(v, np.float32).ravel())


def _enum_name(enum: str, value) -> str:
    cls = getattr(MD, enum)
    for k, v in vars(cls).items():
        if not k.startswith("_") and v == int(value):
            return k
    return str(int(value))


def _assoc(f) -> AssociatedFile:
    return AssociatedFile(_text(f.name) or "", _text(f.description), _enum_name("AssociatedFileType", f.type),
                          _text(f.locale), _text(f.version))


def _camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


_SCALARS = {"bool", "byte", "ubyte", "short", "ushort", "int", "uint", "long", "ulong", "float", "double",
            "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float32", "float64"}


def _value(x, typ: str):
    if typ == "string":
        return _text(x)
    if typ in _DESC.ENUMS:
        return _enum_name(typ, x)
    if typ in _SCALARS:
        return float(x) if typ in ("float", "double", "float32", "float64") else int(x)
    return _to_dict(x, typ)  # a table


def _to_dict(obj, table: str) -> dict:
    out: dict = {}
    for fname, _slot, ftype, _flags in _DESC.TABLES[table]:
        attr = _camel(fname)
        if ftype in _DESC.UNIONS:
            tag = int(getattr(obj, attr + "Type", 0) or 0)
            val = getattr(obj, attr, None)
            if tag:
                name = _DESC.UNIONS[ftype].get(tag, str(tag))
                out[f"{fname}_type"] = name
                out[fname] = _to_dict(val, name) if val is not None and name in _DESC.TABLES else {}
            continue
        val = getattr(obj, attr, None)
        if val is None:
            continue
        if ftype.startswith("["):
            base = ftype[1:-1]
            out[fname] = [_value(x, base) for x in val]
        else:
            v = _value(val, ftype)
            if (ftype in _SCALARS and v == 0) or (ftype in _DESC.ENUMS and int(val) == 0):
                continue  # at the default: flatc leaves it out
            out[fname] = v
    return out


def associated_zip_range(raw) -> Optional[tuple]:
    """``(start, end)`` byte range of the zip archive appended to a model
    file, or None when the file ends with none. The archive runs from its
    first local header to the end of the file (as TFLite Support's metadata
    populator appends it).

    Raises:
        ModelFormatError: the end record is there but the archive is damaged.
    """
    n = len(raw)
    tail = bytes(raw[max(0, n - (65535 + 22)):])
    if tail.rfind(_EOCD) < 0:
        return None
    data = raw if isinstance(raw, bytes) else bytes(raw)
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            infos = z.infolist()
    except ZIP_ERRORS:
        return None  # "PK\5\6" inside constant data, or an archive zipfile cannot read: no associated files
    if not infos:
        return None
    start = min(i.header_offset for i in infos)
    if not 0 <= start < n:
        raise ModelFormatError(f"associated files: the zip archive starts outside the file ({start})")
    return start, n


def read(m, raw, label: str = "<bytes>") -> Optional[TFLiteMetadata]:
    """The TFLite metadata of a model, or None when it has none.

    Args:
        m: the file's ``ModelT`` (flatc object API of ``schemas/tflite.fbs``).
        raw: the whole file's bytes (the metadata buffer may lie after the
            flatbuffer; the associated files are the appended zip archive).
        label: the file name for messages.

    Returns:
        :class:`TFLiteMetadata`, or None (no ``TFLITE_METADATA`` entry).

    Raises:
        ModelFormatError: the entry names a missing buffer, the buffer is not
            a well-formed metadata flatbuffer, or the zip archive is damaged
            (messages without the file name: the caller adds it).
    """
    entry = None
    for md in m.metadata or []:
        if _text(md.name) == METADATA_NAME:
            entry = md
            break
    if entry is None:
        return None
    buffers = m.buffers or []
    bi = int(entry.buffer)
    if not 0 <= bi < len(buffers) or buffers[bi] is None:
        raise ModelFormatError(f"{METADATA_NAME} refers to buffer {bi}, but the file has {len(buffers)}")
    b = buffers[bi]
    if b.offset is not None and int(b.offset) > 1:
        _verify.check_byte_range(int(b.offset), int(b.size), len(raw), f"{METADATA_NAME} buffer")
        data = bytes(raw[int(b.offset):int(b.offset) + int(b.size)])
    else:
        data = bytes(np.asarray(b.data, np.uint8)) if b.data is not None else b""
    if not data:
        raise ModelFormatError(f"{METADATA_NAME} buffer {bi} is empty")
    try:
        _verify.verify(data, "tflite_metadata", label=METADATA_NAME)
        tree = MD.ModelMetadataT.InitFromObj(MD.ModelMetadata.GetRootAs(data, 0))
    except ModelFormatError:
        raise
    except Exception as e:  # the verifier passed: a binding failure is still the file's fault
        raise ModelFormatError(f"{METADATA_NAME}: damaged metadata ({type(e).__name__}: {e})") from None
    rng = associated_zip_range(raw)
    zip_bytes = bytes(raw[rng[0]:rng[1]]) if rng else None
    return TFLiteMetadata(tree, data, zip_bytes, label)
