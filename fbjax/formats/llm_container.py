"""LLM bundles: LiteRT-LM ``.litertlm`` files and MediaPipe LLM ``.task`` zips, read and written back.

The file containers only (the formats layer); the model they hold, its
tokenizer and generation are :class:`fbjax.LlmBundle` (:mod:`fbjax.llm_bundle`).
MediaPipe *vision* ``.task`` bundles are :mod:`fbjax.formats.vision_task`'s.
(This module was ``fbjax.formats.llm_bundle``, its :class:`LlmBundleFile`
``BundleFile``: the old names still work, with a ``DeprecationWarning``.)

A bundle holds a TFLite prefill/decode model (litert-torch's generative
export: see :mod:`fbjax.generation`), its tokenizer and the metadata a runtime
needs to turn text into text. :func:`read_bundle` returns a
:class:`LlmBundleFile` with every section's bytes; :func:`write_bundle` writes
the bundle back with the model section replaced and every other byte kept.

``.litertlm`` (LiteRT-LM's container; schema ``schemas/litertlm_header.fbs``
vendored from google-ai-edge/LiteRT-LM, numbering as litert-lm-builder
0.18.1):

* bytes 0-7 ``LITERTLM``; u32 LE major, minor, patch at 8, 12, 16 (major 1
  is read); u64 LE ``header_end`` at 24;
* bytes ``[32, header_end)``: a ``LiteRTLMMetaData`` flatbuffer: system
  metadata (key/value pairs) and one ``SectionObject`` per section: its
  key/value ``items`` (``model_type``...), absolute ``begin_offset`` /
  ``end_offset`` (end exclusive) and ``data_type``
  (:data:`SECTION_TYPES`);
* each section starts on a 16 KiB boundary after the header.

Section payloads: TFLite model bytes; SentencePiece ``ModelProto`` bytes;
``HF_Tokenizer_Zlib``: u64 LE uncompressed size then a zlib stream of
``tokenizer.json``; ``LlmMetadataProto`` / ``ExecutorMetadataProto``:
binary ``litert.lm.proto.LlmMetadata`` / ``ExecutorMetadata``
(``schemas/litertlm/runtime/proto``, parsed with ``protobuf``).

``.task`` (MediaPipe LLM inference): a zip with members
``TF_LITE_PREFILL_DECODE`` (the model), ``TOKENIZER_MODEL`` (SentencePiece)
and ``METADATA`` (``LlmMetadata`` bytes). :func:`task_kind` tells an LLM
``.task`` from other ``.task`` zips by that member name.

Errors: :class:`~fbjax.errors.ModelFormatError` naming the section for a
truncated file, a wrong magic or version, section offsets outside the file,
inside the header or overlapping, an unreadable header, metadata proto or
tokenizer payload, a missing model or tokenizer, stop/start tokens that are
not ids. Unknown section types are skipped with a :class:`UserWarning`.
"""

from __future__ import annotations

import dataclasses
import io
import os
import struct
import warnings
import zipfile
import zlib
from typing import Optional, Union

from ..errors import ModelFormatError
from . import verify as _verify

__all__ = ["LlmBundleFile", "Section", "SECTION_TYPES", "bundle_kind", "task_kind", "read_bundle", "write_bundle",
           "BLOCK_SIZE"]

MAGIC = b"LITERTLM"
#: the container major version this reader knows
MAJOR = 1
#: sections start on multiples of this (LiteRT-LM's BLOCK_SIZE)
BLOCK_SIZE = 16 * 1024
#: ``AnySectionDataType`` value -> name (litert-lm-builder 0.18.1)
SECTION_TYPES = {1: "GenericBinaryData", 2: "Deprecated", 3: "TFLiteModel", 4: "SP_Tokenizer",
                 5: "LlmMetadataProto", 6: "HF_Tokenizer_Zlib", 7: "TFLiteWeights", 8: "EmbeddingMetadataProto",
                 9: "ExecutorMetadataProto", 10: "TtsMetadataProto", 11: "AsrMetadataProto"}
#: the ``.task`` members of an LLM bundle
TASK_MODEL, TASK_TOKENIZER, TASK_METADATA = "TF_LITE_PREFILL_DECODE", "TOKENIZER_MODEL", "METADATA"
#: largest tokenizer.json accepted (its declared uncompressed size), bytes
MAX_TOKENIZER_JSON = 1 << 30


@dataclasses.dataclass
class Section:
    """One section of a bundle.

    Attributes:
        index: its position in the header (``.task``: in the zip).
        kind: the ``AnySectionDataType`` name (``.task``: the member name).
        begin, end: absolute byte offsets in the file, end exclusive.
        items: the section's key/value metadata (``{"model_type": ...}``).
        view: the payload (``file[begin:end]``) as bytes, or for a model
            section a memoryview on the file's bytes (its weights held once).
        data: the payload as ``bytes`` (a copy of a model section's view,
            made on each access).
    """

    index: int
    kind: str
    begin: int
    end: int
    items: dict
    view: Union[bytes, memoryview]

    @property
    def data(self) -> bytes:
        return self.view if isinstance(self.view, bytes) else bytes(self.view)


@dataclasses.dataclass
class LlmBundleFile:
    """A parsed LLM bundle (see the module docstring).

    Attributes:
        container: ``"litertlm"`` or ``"task"``.
        label: the path (or ``"<bytes>"``) for messages.
        raw: the whole file's bytes.
        version: ``(major, minor, patch)`` of a ``.litertlm`` (``None`` for ``.task``).
        system_metadata: ``.litertlm`` system key/value pairs.
        sections: every known section, in header order (unknown types skipped).
        model: the TFLite prefill/decode section.
        tokenizer: the tokenizer section.
        tokenizer_kind: ``"sentencepiece"`` or ``"hf"``.
        tokenizer_data: SentencePiece ``ModelProto`` bytes, or the
            decompressed ``tokenizer.json`` bytes.
        llm_metadata: ``litert.lm.proto.LlmMetadata`` (empty message when absent).
        executor_metadata: ``litert.lm.proto.ExecutorMetadata`` or ``None``.
    """

    container: str
    label: str
    raw: bytes
    version: Optional[tuple]
    system_metadata: dict
    sections: list
    model: Section
    tokenizer: Section
    tokenizer_kind: str
    tokenizer_data: bytes
    llm_metadata: object
    executor_metadata: object


def task_kind(names) -> Optional[str]:
    """What a ``.task`` zip is, from its member names: ``"llm"`` for
    MediaPipe's LLM bundle (a member named ``TF_LITE_PREFILL_DECODE``), else
    ``None`` (another kind of ``.task``, e.g. MediaPipe vision bundles)."""
    return "llm" if TASK_MODEL in set(names) else None


def bundle_kind(source) -> Optional[str]:
    """``"litertlm"``, ``"task"`` (an LLM ``.task`` zip) or ``None``, from the bytes of ``source`` (path or bytes).

    Raises:
        FileNotFoundError: no such file.
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        head = bytes(source[:8])
    else:
        path = os.fspath(source)
        if os.path.isdir(path):
            return None
        with open(path, "rb") as f:
            head = f.read(8)
    if head == MAGIC:
        return "litertlm"
    if head[:4] == b"PK\x03\x04":
        try:
            with zipfile.ZipFile(io.BytesIO(bytes(source)) if isinstance(source, (bytes, bytearray, memoryview))
                                 else os.fspath(source)) as z:
                return "task" if task_kind(z.namelist()) else None
        except (zipfile.BadZipFile, OSError, EOFError, ValueError):
            return None
    return None


def _label(source) -> str:
    return "<bytes>" if isinstance(source, (bytes, bytearray, memoryview)) else os.fspath(source)


def read_bundle(source) -> LlmBundleFile:
    """Parse a ``.litertlm`` or LLM ``.task`` bundle (path or bytes).

    Raises:
        FileNotFoundError: no such file.
        ModelFormatError: not a bundle, or one that contradicts itself (the
            message names the section).
    """
    label = _label(source)
    raw = bytes(source) if isinstance(source, (bytes, bytearray, memoryview)) else open(os.fspath(source), "rb").read()
    kind = bundle_kind(raw)
    if kind == "litertlm":
        return _read_litertlm(raw, label)
    if kind == "task":
        return _read_task(raw, label)
    if raw[:4] == b"PK\x03\x04":
        raise ModelFormatError(f"{label}: a zip without a {TASK_MODEL} member: not a MediaPipe LLM .task bundle")
    raise ModelFormatError(f"{label}: not an LLM bundle (first bytes {raw[:8]!r}; a .litertlm starts with {MAGIC!r})")


# --- .litertlm ---------------------------------------------------------------

def _kv_items(vec_len, get, where: str) -> dict:
    from ._generated import litertlm_header_generated as S

    out = {}
    members = {v: k for k, v in vars(S.VData).items() if not k.startswith("_") and isinstance(v, int)}
    for j in range(vec_len):
        kv = get(j)
        key = kv.Key().decode("utf-8", "replace")
        t = kv.ValueType()
        name = members.get(t)
        tab = kv.Value()
        if name is None or tab is None:
            raise ModelFormatError(f"{where}: item {key!r} has value type {t}, not one of the schema's VData")
        cls = getattr(S, name)
        val = cls()
        val.Init(tab.Bytes, tab.Pos)
        v = val.Value()
        out[key] = v.decode("utf-8", "replace") if isinstance(v, bytes) else v
    return out


def _read_litertlm(raw: bytes, label: str) -> LlmBundleFile:
    from ._generated import litertlm_header_generated as S

    n = len(raw)
    if n < 32:
        raise ModelFormatError(f"{label}: header: the file has {n} bytes, fewer than the 32 of a .litertlm header "
                               "(truncated?)")
    major, minor, patch = struct.unpack_from("<III", raw, 8)
    if major != MAJOR:
        raise ModelFormatError(f"{label}: header: container version {major}.{minor}.{patch}; fbjax reads major "
                               f"version {MAJOR} (LiteRT-LM's current format)")
    (header_end,) = struct.unpack_from("<Q", raw, 24)
    if not 40 <= header_end <= n:
        raise ModelFormatError(f"{label}: header: header_end {header_end} is outside 40..{n} (the file has {n} "
                               "bytes: truncated?)")
    _verify.verify(raw, "litertlm_header", start=32, size=header_end - 32, label=f"{label}: header",
                   unchecked_enums=[("SectionObject", "data_type")])  # newer section types: skipped below
    root = S.LiteRTLMMetaData.GetRootAs(raw, 32)
    system = {}
    if root.SystemMetadata() is not None:
        sm = root.SystemMetadata()
        system = _kv_items(sm.EntriesLength(), sm.Entries, f"{label}: system metadata")
    smeta = root.SectionMetadata()
    if smeta is None:
        raise ModelFormatError(f"{label}: header: no section metadata")
    sections, spans = [], []
    for i in range(smeta.ObjectsLength()):
        obj = smeta.Objects(i)
        dtype, begin, end = obj.DataType(), obj.BeginOffset(), obj.EndOffset()
        kind = SECTION_TYPES.get(dtype)
        where = f"{label}: section {i} ({kind or f'type {dtype}'})"
        if not header_end <= begin <= end <= n:
            raise ModelFormatError(f"{where}: bytes {begin}..{end} are outside the sections' region "
                                   f"{header_end}..{n} of the {n}-byte file (truncated or corrupt offsets)")
        spans.append((begin, end, i, kind))
        if kind is None:
            warnings.warn(f"{where}: unknown section type {dtype} (fbjax knows {sorted(SECTION_TYPES)}); skipped",
                          stacklevel=3)
            continue
        if begin % BLOCK_SIZE:
            warnings.warn(f"{where}: starts at byte {begin}, not on a {BLOCK_SIZE}-byte boundary as LiteRT-LM "
                          "writes them", stacklevel=3)
        items = _kv_items(obj.ItemsLength(), obj.Items, where)
        # a model section is a view on the file's bytes (a 1B model's weights held once, not twice)
        data = memoryview(raw)[begin:end] if kind in ("TFLiteModel", "TFLiteWeights") else raw[begin:end]
        sections.append(Section(i, kind, begin, end, items, data))
    spans.sort()
    for (b0, e0, i0, k0), (b1, e1, i1, k1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise ModelFormatError(f"{label}: sections {i0} ({k0}, bytes {b0}..{e0}) and {i1} ({k1}, bytes "
                                   f"{b1}..{e1}) overlap")
    return _finish(LlmBundleFile("litertlm", label, raw, (major, minor, patch), system, sections, None, None, "", b"",
                              None, None))


def _pick(sections, kind: str, label: str, model_type: Optional[str] = None, required: bool = True):
    cands = [s for s in sections if s.kind == kind]
    if model_type is not None and len(cands) > 1:
        typed = [s for s in cands if s.items.get("model_type") == model_type]
        cands = typed or [s for s in cands if "model_type" not in s.items] or cands
    if not cands:
        if required:
            raise ModelFormatError(f"{label}: no {kind} section")
        return None
    return cands[0]


def _finish(b: LlmBundleFile) -> LlmBundleFile:
    """Pick the model, tokenizer and metadata sections of a parsed container; parse the protos."""
    from ._generated.litertlm_proto import executor_metadata_pb2, llm_metadata_pb2

    label, secs = b.label, b.sections
    tflites = [s for s in secs if s.kind == "TFLiteModel"]
    if not tflites:
        raise ModelFormatError(f"{label}: no TFLiteModel section (the prefill/decode model)")
    prefill = [s for s in tflites if s.items.get("model_type", "tf_lite_prefill_decode") == "tf_lite_prefill_decode"]
    if not prefill:
        raise ModelFormatError(f"{label}: no TFLiteModel section with model_type 'tf_lite_prefill_decode' (found "
                               f"{[s.items.get('model_type') for s in tflites]}): not a text generation bundle")
    b.model = prefill[0]
    if any(s.kind == "TFLiteWeights" for s in secs):
        raise ModelFormatError(f"{label}: the model keeps its weights in a separate TFLiteWeights section, which fbjax "
                               "does not read yet")
    toks = [s for s in secs if s.kind in ("SP_Tokenizer", "HF_Tokenizer_Zlib")]
    typed = [s for s in toks if s.items.get("model_type") in (None, "tf_lite_prefill_decode")]
    if not (typed or toks):
        raise ModelFormatError(f"{label}: no tokenizer section (SP_Tokenizer or HF_Tokenizer_Zlib): fbjax needs the "
                               "bundle's tokenizer to turn text into tokens")
    tok = (typed or toks)[0]
    b.tokenizer = tok
    where = f"{label}: section {tok.index} ({tok.kind})"
    if tok.kind == "SP_Tokenizer":
        b.tokenizer_kind, b.tokenizer_data = "sentencepiece", tok.data
    else:
        b.tokenizer_kind, b.tokenizer_data = "hf", _inflate(tok.data, where)
    if not b.tokenizer_data:
        raise ModelFormatError(f"{where}: the tokenizer is empty")
    meta = llm_metadata_pb2.LlmMetadata()
    ms = _pick(secs, "LlmMetadataProto", label, required=False)
    if ms is not None:
        _parse_proto(meta, ms, label)
    b.llm_metadata = meta
    es = _pick(secs, "ExecutorMetadataProto", label, required=False)
    if es is not None:
        b.executor_metadata = executor_metadata_pb2.ExecutorMetadata()
        _parse_proto(b.executor_metadata, es, label)
    return b


def _parse_proto(msg, sec: Section, label: str) -> None:
    from google.protobuf.message import DecodeError

    try:
        msg.ParseFromString(sec.data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise ModelFormatError(f"{label}: section {sec.index} ({sec.kind}): not a valid "
                               f"{msg.DESCRIPTOR.full_name} protobuf ({e})") from None


def _inflate(data: bytes, where: str) -> bytes:
    if len(data) < 8:
        raise ModelFormatError(f"{where}: {len(data)} bytes, fewer than the 8 of its size field (truncated?)")
    (size,) = struct.unpack_from("<Q", data, 0)
    if size > MAX_TOKENIZER_JSON:
        raise ModelFormatError(f"{where}: declares a {size}-byte tokenizer.json, over fbjax's limit of "
                               f"{MAX_TOKENIZER_JSON}")
    d = zlib.decompressobj()
    try:
        out = d.decompress(data[8:], size + 1)
    except zlib.error as e:
        raise ModelFormatError(f"{where}: the zlib stream does not decompress ({e})") from None
    if len(out) != size or not d.eof:
        raise ModelFormatError(f"{where}: the zlib stream gives {len(out)}{'' if d.eof else '+'} bytes, the section "
                               f"declares {size} (truncated or corrupt)")
    return out


# --- .task -------------------------------------------------------------------

def _read_task(raw: bytes, label: str) -> LlmBundleFile:
    try:
        z = zipfile.ZipFile(io.BytesIO(raw))
        infos = z.infolist()
        sections = []
        for i, info in enumerate(infos):
            with z.open(info) as f:
                data = f.read(info.file_size + 1)
            if len(data) != info.file_size:
                raise ModelFormatError(f"{label}: member {info.filename}: {len(data)} bytes, the zip says "
                                       f"{info.file_size}")
            lh = info.header_offset  # the member's local header (30 bytes + name + extra field), then its data
            if lh + 30 > len(raw):
                raise ModelFormatError(f"{label}: member {info.filename}: its local header is past the end of the file")
            begin = lh + 30 + sum(struct.unpack_from("<HH", raw, lh + 26))
            sections.append(Section(i, info.filename, begin, begin + info.compress_size, {}, data))
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, NotImplementedError) as e:
        raise ModelFormatError(f"{label}: a corrupt or truncated .task zip ({type(e).__name__}: {e})") from None
    names = {s.kind: s for s in sections}
    for need in (TASK_MODEL, TASK_TOKENIZER):
        if need not in names:
            what = "the tokenizer" if need == TASK_TOKENIZER else "the model"
            raise ModelFormatError(f"{label}: no {need} member ({what}) in the .task zip (members: {sorted(names)})")
    for info in infos:
        if info.compress_type != zipfile.ZIP_STORED:
            warnings.warn(f"{label}: member {info.filename} is compressed; LiteRT-LM loads .task zips only when "
                          "they are stored uncompressed (fbjax reads it anyway)", stacklevel=3)
            break
    from ._generated.litertlm_proto import llm_metadata_pb2

    meta = llm_metadata_pb2.LlmMetadata()
    if TASK_METADATA in names:
        _parse_proto(meta, names[TASK_METADATA], label)
    model, tok = names[TASK_MODEL], names[TASK_TOKENIZER]
    if not tok.data:
        raise ModelFormatError(f"{label}: member {TASK_TOKENIZER}: the tokenizer is empty")
    return LlmBundleFile("task", label, raw, None, {}, sections, model, tok, "sentencepiece", tok.data, meta, None)


# --- writing -------------------------------------------------------------------

def write_bundle(b: LlmBundleFile, model: Optional[bytes] = None, sections: Optional[dict] = None) -> bytes:
    """The bundle's bytes with its model section's payload replaced by ``model``
    (and any section ``i`` by ``sections[i]``, :attr:`Section.index`).

    ``.litertlm``: every other byte as in the file; sections after a replaced
    one move by a multiple of :data:`BLOCK_SIZE` when its padded size
    changes, and the header's offsets are patched in place (same header
    size). ``.task``: the zip rewritten with each member's name, date, order,
    compression and bytes, replaced members' bytes swapped.
    """
    new = dict(sections or {})
    if model is not None:
        new[b.model.index] = model
    if b.container == "task":
        src = zipfile.ZipFile(io.BytesIO(b.raw))
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as z:
            for i, info in enumerate(src.infolist()):
                data = new[i] if i in new else src.read(info)
                z.writestr(info, data, compress_type=info.compress_type)
        return out.getvalue()
    return _write_litertlm(b, new)


def _write_litertlm(b: LlmBundleFile, new: dict) -> bytes:
    from ._generated import litertlm_header_generated as S

    raw = b.raw
    (header_end,) = struct.unpack_from("<Q", raw, 24)
    root = S.LiteRTLMMetaData.GetRootAs(raw, 32)
    smeta = root.SectionMetadata()
    objs = []
    for i in range(smeta.ObjectsLength()):
        o = smeta.Objects(i)
        objs.append((o.BeginOffset(), o.EndOffset(), i, o))
    objs.sort()
    header = bytearray(raw[:header_end])
    body = bytearray()
    pos, shift = header_end, 0  # pos: how far the old file is copied; shift: how far later sections move
    pad_to = lambda x: -(-x // BLOCK_SIZE) * BLOCK_SIZE  # noqa: E731
    for k, (begin, end, i, o) in enumerate(objs):
        body += raw[pos:begin]  # the padding before the section, as the file has it
        new_begin = begin + shift
        data = new[i] if i in new else raw[begin:end]
        body += data
        pos = end
        if i in new and k + 1 < len(objs):  # pad the new payload to a block; later sections move by blocks
            new_end = new_begin + len(data)
            body += b"\0" * (pad_to(new_end) - new_end)
            shift += pad_to(new_end) - pad_to(end)
            pos = min(pad_to(end), objs[k + 1][0])
        for slot, value in ((6, new_begin), (8, new_begin + len(data))):  # begin_offset, end_offset vtable slots
            struct.pack_into("<Q", header, o._tab.Pos + o._tab.Offset(slot), value)
    return bytes(header) + bytes(body)


def __getattr__(name: str):
    if name == "BundleFile":  # issue 36: named apart from the vision .task bundle
        warnings.warn("fbjax.formats.llm_container.BundleFile is deprecated: use LlmBundleFile", DeprecationWarning,
                      stacklevel=2)
        return LlmBundleFile
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
