"""RTen model (``.rten``, versions 1 and 2) frontend: file bytes -> :class:`~fbjax.ir.ModelIR`.

Follows ``schemas/rten.fbs`` (the seed schema extended, append-only, to the
layout rten-convert 0.22 writes: operators 0-127):

* **v2** files start with a 32-byte little-endian header: ``b"RTEN"``, u32
  version (= 2), u64 model offset, u64 model length, u64 tensor-data offset.
  Large constants live in the tensor-data segment at
  ``tensor_data_offset + ConstantNode.data_offset``; they are numpy views on
  the memory-mapped file when their address is aligned to the element size,
  and copied once otherwise (the format only guarantees element alignment of
  the segment start, not of every tensor).
* **v1** files (anything not starting with ``b"RTEN"``) are the bare
  flatbuffer with every constant inline. Neither version writes a flatbuffer
  file identifier, so v1 is recognised by :func:`probe_v1`, which checks that
  the root table really is an RTen ``Model``.
* Nodes of a graph share one index space (constants, values and operators);
  ``-1`` marks an omitted optional input or an unused output.
* Missing attribute fields take the **schema's** defaults (``AutoPad.Same``,
  Conv ``groups`` 0, Gemm ``alpha``/``beta`` 0, ``keep_dims`` false, TopK
  ``largest`` false, ``NearestMode.Floor``...), never ONNX's: rten-convert
  omits fields equal to the schema default. One consequence: rten-convert
  0.22 writes an ONNX Softmax/LogSoftmax that has no ``axis`` attribute as
  axis 0 (ONNX's default is -1, or 1 with 2-D coercion before opset 13);
  fbjax runs the file as written.
* Runtime types are only int32, float32, int8 and uint8 (ONNX bool and int64
  were converted to int32 by the writer).
* ``If``/``Loop`` bodies are nested ``Graph`` tables; each becomes an extra
  IR graph. A body's ``captures`` are value nodes that take the value of the
  same name from the enclosing scope: in the IR they are extra trailing
  inputs of the body graph, and the ``If``/``Loop`` node gets the matching
  outer values as extra trailing inputs (``attrs["<branch>_captures"]`` lists
  their positions in ``node.inputs``).
* Symbolic dimensions (``Dim.name``) become dynamic (``None``) dimensions, and so
  do unnamed 0 dims of value nodes (rten-convert's spelling of an ONNX dim
  with neither a value nor a name).

Operators get op set ``"onnx"`` and their ONNX names (``Conv``, ``MatMul``);
attributes keep the schema's snake_case field names (``auto_pad``,
``kernel_size``, ``keep_dims``), enums become their names (``"NotSet"``),
``DataType`` fields numpy dtypes, vectors tuples of ints, subgraphs graph
indices.
"""

from __future__ import annotations

import os
import re
import struct
import warnings
from typing import Any, Optional

import numpy as np

from ..errors import ModelFormatError
from ..ir import Graph, ModelIR, Node, Value
from . import verify as _verify
from ._mmap import open_source
from ._generated import rten_generated as R

MAGIC = b"RTEN"
HEADER_SIZE = 32
OP_SET = "onnx"


def _enum_names(cls) -> dict[int, str]:
    return {
        v: k.rstrip("_") for k, v in vars(cls).items() if not k.startswith("_") and isinstance(v, int)
    }


OPERATOR_NAMES = _enum_names(R.OperatorType)
ATTRS_NAMES = _enum_names(R.OperatorAttrs)
NODE_KIND_NAMES = _enum_names(R.NodeKind)

#: RTen ``DataType`` / ``ConstantDataType`` value -> numpy dtype.
DTYPES = {0: np.dtype(np.int32), 1: np.dtype(np.float32), 2: np.dtype(np.int8), 3: np.dtype(np.uint8)}

# Attribute fields holding enums: field -> enum class; ``mode`` depends on the table.
_ENUM_FIELDS = {
    "auto_pad": R.AutoPad,
    "direction": R.RNNDirection,
    "coord_mode": R.CoordTransformMode,
    "nearest_mode": R.NearestMode,
    "box_order": R.NMSBoxOrder,
    "reduction": R.ScatterReduction,
    "approximate": R.GeluApproximation,
}
_MODE_ENUMS = {
    "ResizeAttrs": R.ResizeMode,
    "PadAttrs": R.PadMode,
    "DepthToSpaceAttrs": R.DepthToSpaceMode,
}
_DTYPE_FIELDS = {"to", "dtype", "output_dtype"}
_GRAPH_FIELDS = ("then_branch", "else_branch", "body")
_ENUM_CACHE: dict[Any, dict[int, str]] = {}


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


def _str(s) -> str:
    if s is None:
        return ""
    return s.decode("utf-8", "replace") if isinstance(s, bytes) else str(s)




def is_rten_v2(head: bytes) -> bool:
    """True when ``head`` starts with the v2 magic ``b"RTEN"``."""
    return len(head) >= 4 and bytes(head[:4]) == MAGIC


def parse_header(raw, label: str = "<bytes>") -> tuple[int, int, int, int]:
    """Decode the v2 header: ``(version, model_offset, model_length, tensor_data_offset)``.

    Raises:
        ModelFormatError: short header, unsupported version, or offsets
            outside the file.
    """
    n = len(raw)
    if n < HEADER_SIZE:
        raise ModelFormatError(f"{label}: {n} bytes is too short for the {HEADER_SIZE}-byte RTen v2 header")
    magic, version, moff, mlen, toff = struct.unpack_from("<4sIQQQ", bytes(raw[:HEADER_SIZE]))
    if magic != MAGIC:
        raise ModelFormatError(f"{label}: header magic is {magic!r}, expected {MAGIC!r}")
    if version != 2:
        raise ModelFormatError(f"{label}: RTen header version {version} is not supported (fbjax reads 2)")
    if moff < HEADER_SIZE or moff + mlen > n or mlen < 8:
        raise ModelFormatError(
            f"{label}: header puts the model at bytes {moff}..{moff + mlen}, outside the file ({n} bytes)"
        )
    if toff > n:
        raise ModelFormatError(f"{label}: header tensor-data offset {toff} is past the end of the file ({n} bytes)")
    return version, moff, mlen, toff


# --- v1 probe ----------------------------------------------------------------

def _u32(buf: bytes, off: int) -> int:
    return struct.unpack_from("<I", buf, off)[0]


def _table_field(buf: bytes, table: int, field: int) -> int:
    """Absolute position of ``field`` of the table at ``table``, or 0 if absent."""
    vt = table - struct.unpack_from("<i", buf, table)[0]
    if vt < 0 or vt + 4 > len(buf):
        raise ValueError("vtable out of range")
    vsize = struct.unpack_from("<H", buf, vt)[0]
    if vsize < 4 or vsize % 2 or vt + vsize > len(buf):
        raise ValueError("bad vtable size")
    slot = 4 + 2 * field
    if slot + 2 > vsize:
        return 0
    rel = struct.unpack_from("<H", buf, vt + slot)[0]
    return table + rel if rel else 0


def probe_v1(source, head: bytes) -> bool:
    """True when ``source`` (path or bytes) is an RTen v1 file.

    v1 has no identifier, so this walks the flatbuffer: the root ``Model``
    table must have a small vtable (RTen's Model has 3 fields, TFLite's 8),
    a ``graph`` table whose ``nodes`` vector lies in the file, and nodes
    whose ``data`` union type is a known ``NodeKind``; then the whole buffer
    must pass :func:`fbjax.formats.verify.verify` against the RTen schema.
    Files carrying another format's identifier (``TFL3``) are rejected
    outright.
    """
    if len(head) >= 8 and (bytes(head[:4]) == MAGIC or bytes(head[4:8]) == b"TFL3"):
        return False
    try:
        if isinstance(source, (bytes, bytearray, memoryview)):
            buf = source
        else:
            with open(os.fspath(source), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < 16 or size > (1 << 31):
                    return False  # v1 files are limited to 2 GB
                buf = f.read()  # not a mapping: a file truncated meanwhile must not SIGBUS (formats/_mmap.py)
        if len(buf) < 16:
            return False
        root = _u32(buf, 0)
        if root < 4 or root + 4 > len(buf):
            return False
        vt = root - struct.unpack_from("<i", buf, root)[0]
        if not 0 <= vt < len(buf) - 4:
            return False
        vsize = struct.unpack_from("<H", buf, vt)[0]
        if vsize > 4 + 2 * 6:  # room for a few appended fields, not TFLite's 8
            return False
        ver = _table_field(buf, root, 0)
        if ver and not 0 <= struct.unpack_from("<i", buf, ver)[0] < 1000:
            return False
        gpos = _table_field(buf, root, 1)
        if not gpos:
            return False
        graph = gpos + _u32(buf, gpos)
        npos = _table_field(buf, graph, 0)
        if not npos:
            return False
        nodes = npos + _u32(buf, npos)
        count = _u32(buf, nodes)
        if nodes + 4 + 4 * count > len(buf):
            return False
        for i in range(min(count, 8)):
            e = nodes + 4 + 4 * i
            node = e + _u32(buf, e)
            tpos = _table_field(buf, node, 1)
            kind = struct.unpack_from("<B", buf, tpos)[0] if tpos else 0
            if kind not in NODE_KIND_NAMES or kind == 0:
                return False
        # Finally the full structural check against the RTen schema (bounded work).
        _verify.verify(buf, "rten")
        return True
    except (struct.error, ValueError, IndexError, OSError, ModelFormatError):
        return False


# --- attributes ---------------------------------------------------------------

def _enum_name(cls, v: int, what: str) -> str:
    names = _ENUM_CACHE.setdefault(cls, _enum_names(cls))
    if v not in names:
        raise ModelFormatError(f"{what} has unknown {cls.__name__} value {v} (known: {sorted(names)})")
    return names[v]


def _dtype(v: int, what: str) -> np.dtype:
    if v not in DTYPES:
        raise ModelFormatError(f"{what} has unknown DataType value {v} (known: 0-3)")
    return DTYPES[v]


def _tuple(v) -> tuple:
    return tuple(int(x) for x in np.asarray(v).reshape(-1))


class _Reader:
    """Builds IR graphs from the object-API tables, one scope per graph."""

    def __init__(self, raw, tensor_base: Optional[int], label: str):
        self.raw = raw
        self.bytes_u8 = np.frombuffer(raw, np.uint8)
        self.tensor_base = tensor_base
        self.label = label
        self.graphs: list[Graph] = []

    # constants ---------------------------------------------------------------
    def constant(self, c, name: str, idx: int, where: str) -> Value:
        shape = _tuple(c.shape) if c.shape is not None else ()
        _verify.check_shape(shape, f"{where}: constant shape", allow_unknown=False)
        inline = c.data
        if c.dtype is not None:
            dtype = _dtype(int(c.dtype), f"{where}: ConstantNode.dtype")
        elif inline is not None:
            kind = _enum_name(R.ConstantData, int(c.dataType), f"{where}: ConstantNode.data")
            dtype = {"FloatData": DTYPES[1], "Int32Data": DTYPES[0], "Int8Data": DTYPES[2],
                     "UInt8Data": DTYPES[3]}[kind]
        else:
            raise ModelFormatError(f"{where}: constant has neither a dtype nor inline data")
        n = int(np.prod(shape)) if shape else 1
        if c.dataOffset is not None and inline is None:
            if self.tensor_base is None:
                raise ModelFormatError(
                    f"{where}: constant refers to the tensor-data segment (offset {c.dataOffset}), "
                    "but the file has no v2 header"
                )
            start = self.tensor_base + int(c.dataOffset)
            size = n * dtype.itemsize
            if start + size > len(self.raw):
                raise ModelFormatError(
                    f"{where}: tensor data spans bytes {start}..{start + size}, past the end of the file "
                    f"({len(self.raw)} bytes)"
                )
            data = self.bytes_u8[start:start + size]
        elif inline is not None:
            arr = np.asarray(inline.data if inline.data is not None else np.zeros(0, dtype))
            if arr.size != n:
                raise ModelFormatError(
                    f"{where}: inline data holds {arr.size} elements but shape {list(shape)} needs {n}"
                )
            data = arr.view(np.uint8) if arr.dtype.itemsize == dtype.itemsize else arr.astype(dtype).view(np.uint8)
        elif n == 0:  # a zero-element constant (shape [0], any zero dim) needs no bytes
            data = np.zeros(0, np.uint8)
        else:
            raise ModelFormatError(f"{where}: constant has no data (neither inline nor data_offset)")
        if data.ctypes.data % dtype.itemsize:  # unaligned: copy once
            data = data.copy()
        arr = data.view(dtype.newbyteorder("<")).reshape(shape)
        if not arr.dtype.isnative:  # pragma: no cover - big-endian hosts
            arr = arr.astype(dtype)
        return Value(name=name, dtype=dtype, shape=shape, data=arr, index=idx)

    @staticmethod
    def value(v, name: str, idx: int, where: str) -> Value:
        shape = None
        if v.shape is not None:
            # rten-convert 0.22 writes ``dim_param or dim_value``: an ONNX dim
            # with neither (unknown, as exporters write dynamic dims) arrives
            # as an unnamed 0. A value's declared shape is only a hint (RTen
            # checks none), so an unnamed 0 reads as unknown too.
            shape = tuple(None if (d.name is not None or int(d.value) == 0) else int(d.value) for d in v.shape)
            _verify.check_shape(shape, f"{where}: value shape")
        dtype = None if v.dtype is None else _dtype(int(v.dtype), f"{where}: ValueNode.dtype")
        return Value(name=name, dtype=dtype, shape=shape, index=idx)

    # attributes --------------------------------------------------------------
    def attrs(self, op, op_name: str, where: str, scope) -> tuple[dict, list]:
        kind = int(op.attrsType)
        if kind not in ATTRS_NAMES:
            raise ModelFormatError(
                f"{where} ({op_name}): unknown OperatorAttrs type {kind} (fbjax knows 0-{max(ATTRS_NAMES)})"
            )
        table = ATTRS_NAMES[kind]
        a = op.attrs
        out: dict = {}
        captures: list = []  # (attr name, graph index, captured outer names)
        if a is None:
            return out, captures
        for k, v in vars(a).items():
            key = _snake(k)
            what = f"{where} ({op_name}): attribute {key}"
            if key == "value_type":
                continue
            if key == "value" and table == "ConstantOfShapeAttrs":
                stype = _enum_name(R.Scalar, int(a.valueType), what)
                if v is None or stype == "NONE":
                    raise ModelFormatError(f"{what}: missing scalar")
                v = np.float32(v.value) if stype == "FloatScalar" else np.int32(v.value)
            elif key in _GRAPH_FIELDS:
                if v is None:
                    raise ModelFormatError(f"{what}: missing subgraph")
                gi, names = self.graph(v, f"{where} ({op_name}).{key}", scope)
                captures.append((key, gi, names))
                v = gi
            elif key == "mode" and table in _MODE_ENUMS:
                v = _enum_name(_MODE_ENUMS[table], int(v), what)
            elif key in _ENUM_FIELDS:
                v = _enum_name(_ENUM_FIELDS[key], int(v), what)
            elif key in _DTYPE_FIELDS:
                v = None if v is None else _dtype(int(v), what)
            elif key == "equation":
                v = _str(v)
            elif isinstance(v, (list, np.ndarray)):
                v = _tuple(v)
            elif isinstance(v, (bool, np.bool_)):
                v = bool(v)
            out[key] = v
        return out, captures

    # graphs ------------------------------------------------------------------
    def graph(self, g, name: str, parent) -> tuple[int, list]:
        """Parse ``g`` into ``self.graphs``; returns (index, captured names)."""
        gi = len(self.graphs)
        self.graphs.append(None)  # reserve: bodies get later indices
        where = f"graph {gi} ({name})" if gi else "main graph"
        entries = g.nodes or []
        values: list = [None] * len(entries)
        by_name: dict[str, Value] = {}
        scope = _Scope(by_name, parent)
        nodes: list[Node] = []
        all_values: list[Value] = []
        capture_ids = [int(i) for i in (g.captures if g.captures is not None else [])]
        # rten-convert 0.22 captures an omitted optional operator input (an
        # LSTM's ``sequence_lens`` inside an If branch) as a value node named
        # '' while writing the operator's input itself as -1: a capture with
        # an empty name is "no value", like -1 (RTen ignores it too).
        absent = {i for i in capture_ids
                  if 0 <= i < len(entries) and entries[i].data is not None
                  and NODE_KIND_NAMES.get(int(entries[i].dataType)) == "ValueNode" and not _str(entries[i].name)}
        capture_ids = [i for i in capture_ids if i not in absent]

        def ref(i, what: str) -> Optional[Value]:
            i = int(i)
            if i < 0 or i in absent:
                return None
            if i >= len(entries):
                raise ModelFormatError(f"{what} refers to node {i}, but the graph has {len(entries)} nodes")
            if values[i] is None:
                raise ModelFormatError(f"{what} refers to node {i}, which is an operator or not yet defined")
            return values[i]

        for ni, entry in enumerate(entries):
            loc = f"{where}, node {ni}"
            nname = _str(entry.name)
            kind = NODE_KIND_NAMES.get(int(entry.dataType))
            if kind is None or kind == "NONE":
                raise ModelFormatError(f"{loc} ({nname!r}): unknown NodeKind value {int(entry.dataType)}")
            d = entry.data
            if ni in absent:
                continue
            if kind == "ConstantNode":
                v = self.constant(d, nname, ni, loc)
            elif kind == "ValueNode":
                v = self.value(d, nname, ni, loc)
                if ni in capture_ids and parent is not None:
                    outer = parent.find(nname)
                    if outer is not None:
                        v.dtype = v.dtype if v.dtype is not None else outer.dtype
                        v.shape = v.shape if v.shape is not None else outer.shape
            else:
                code = int(d.type)
                op_name = OPERATOR_NAMES.get(code)
                if op_name is None:
                    raise ModelFormatError(
                        f"{loc} ({nname!r}): unknown OperatorType value {code} "
                        f"(fbjax knows 0-{max(OPERATOR_NAMES)})"
                    )
                ins = [ref(i, f"{loc} ({op_name}): input {k}")
                       for k, i in enumerate(d.inputs if d.inputs is not None else [])]
                outs = []
                for k, i in enumerate(d.outputs if d.outputs is not None else []):
                    i = int(i)
                    if i < 0:
                        outs.append(None)
                        continue
                    outs.append(ref(i, f"{loc} ({op_name}): output {k}"))
                attrs, caps = self.attrs(d, op_name, loc, scope)
                for key, _gi, names in caps:
                    pos = []
                    for cname in names:
                        outer = scope.lookup(cname, f"{loc} ({op_name}).{key}")
                        pos.append(len(ins))
                        ins.append(outer)
                    attrs[f"{key}_captures"] = tuple(pos)
                nodes.append(Node(OP_SET, op_name, ins, outs, attrs, f"{loc} ({nname!r})" if nname else loc,
                                  regions={key: (gi,) for key, gi, _ in caps}))
                continue
            values[ni] = v
            all_values.append(v)
            if nname and nname not in by_name:
                by_name[nname] = v

        g_in = [ref(i, f"{where}: input") for i in (g.inputs if g.inputs is not None else [])]
        # ONNX initializers listed as graph inputs (old IR versions) arrive as
        # constants: they are weights, not inputs the caller must pass.
        g_in = [v for v in g_in if v is None or v.data is None]
        g_out = [ref(i, f"{where}: output") for i in (g.outputs if g.outputs is not None else [])]
        cap_vals = [ref(i, f"{where}: capture") for i in capture_ids]
        cap_vals += scope.implicit  # names a nested body needed from further out
        for v in cap_vals:
            if v is None:
                raise ModelFormatError(f"{where}: capture refers to an omitted node")
        cap_names = [v.name for v in cap_vals]
        # values the file leaves untyped keep dtype None: their op's out_dtype fact fills them
        # (fbjax.passes.reading.fill_dtypes, run by fbjax.load and the reference right after reading)
        self.graphs[gi] = Graph(name if gi else "main", g_in + cap_vals, g_out, nodes, all_values)
        return gi, cap_names


class _Scope:
    """Name lookup for captures: this graph, then the enclosing ones."""

    def __init__(self, by_name: dict, parent: Optional["_Scope"]):
        self.by_name = by_name
        self.parent = parent
        self.implicit: list[Value] = []

    def find(self, name: str) -> Optional[Value]:
        s = self
        while s is not None:
            if name in s.by_name:
                return s.by_name[name]
            s = s.parent
        return None

    def lookup(self, name: str, what: str) -> Value:
        v = self.by_name.get(name)
        if v is not None:
            return v
        if self.parent is None:
            raise ModelFormatError(f"{what}: captured value {name!r} is not defined in any enclosing graph")
        # Not here: capture it from further out as an extra input of this graph.
        v = Value(name=name, dtype=None, shape=None)
        self.parent.lookup(name, what)  # fail early if nobody defines it
        outer = self.parent.by_name.get(name)
        if outer is not None:
            v.dtype, v.shape = outer.dtype, outer.shape
        self.by_name[name] = v
        self.implicit.append(v)
        return v


def read(source) -> ModelIR:
    """Parse a ``.rten`` file (path or bytes, v1 or v2) into the IR.

    Returns:
        :class:`~fbjax.ir.ModelIR` with format ``"rten"``; graph 0 is the
        main graph, further graphs are ``If``/``Loop`` bodies.
        Values the file leaves untyped (ONNX shape inference did not type
        them) have dtype None: their ops' ``out_dtype`` facts fill them
        (:func:`fbjax.passes.reading.fill_dtypes`, which :func:`fbjax.load`
        and the reference run right after reading).

    Raises:
        ModelFormatError: bad header, corrupt flatbuffer, unknown operator or
            enum value (the message names the value and where it is).
    """
    raw, path = open_source(source)
    label = path or "<bytes>"
    head = bytes(raw[:8])
    if is_rten_v2(head):
        version, moff, mlen, toff = parse_header(raw, label)
    else:
        version, moff, mlen, toff = 1, 0, len(raw), None
        if len(raw) < 8:
            raise ModelFormatError(f"{label}: {len(raw)} bytes is too short for an RTen model")
    with _verify.corrupt_file_errors(label, "RTen flatbuffer"):
        _verify.verify(raw, "rten", start=moff, size=mlen)  # bounds every offset/length before unpacking
        root = R.Model.GetRootAs(raw, moff)
        m = R.ModelT.InitFromObj(root)
        if m.graph is None:
            raise ModelFormatError("Model.graph (required) is missing")
        reader = _Reader(raw, toff, label)
        reader.graph(m.graph, "main", None)
    meta = {"version": version, "schema_version": int(m.schemaVersion)}
    desc = ""
    if m.metadata is not None:
        for k, v in vars(m.metadata).items():
            if v is not None:
                meta[_snake(k)] = _str(v)
        desc = meta.get("description", "")
    _warn_constant_softmax(reader.graphs, label)
    return ModelIR("rten", reader.graphs, 0, {}, desc, path, raw, meta)


def _warn_constant_softmax(graphs: list, label: str) -> None:
    """Warn about Softmax / LogSoftmax nodes that normalize over an axis of
    static size 1: their output is constant (1.0 / 0.0) whatever the input.
    That is what rten-convert 0.22 makes of an ONNX Softmax that leaves out
    ``axis`` (it writes 0, the RTen schema default; ONNX means 1 before opset
    13 and -1 from 13), e.g. a classifier's ``[1, 1000]`` logits. fbjax, like
    RTen, runs what the file says; the fix is in the ``.onnx``
    (``fbjax convert model.onnx model.rten`` states it, :mod:`fbjax.convert`)."""
    found = []
    for g in graphs:
        for n in g.nodes:
            if n.op_name not in ("Softmax", "LogSoftmax") or not n.inputs or n.inputs[0] is None:
                continue
            shape = n.inputs[0].shape
            axis = int(n.attrs.get("axis", 0))
            if shape is not None and -len(shape) <= axis < len(shape) and shape[axis] == 1:
                found.append(f"{n.location or n.outputs[0].name}: {n.op_name} over axis {axis} of {tuple(shape)}")
    if found:
        warnings.warn(
            f"{label}: {len(found)} softmax node(s) normalize over an axis of size 1, so their output is "
            f"constant (Softmax 1.0, LogSoftmax 0.0): {'; '.join(found[:3])}. rten-convert 0.22 writes axis=0 "
            "where the ONNX node leaves the axis out (ONNX means 1 before opset 13, -1 from 13); state the axis "
            "in the .onnx and convert again: fbjax convert model.onnx model.rten (pip install 'fbjax[onnx]'; "
            "it states ONNX's defaults, then runs rten-convert; fbjax.convert.make_defaults_explicit)",
            stacklevel=5)  # _warn <- read <- read_model <- fbjax.load <- the caller


def probe(source, head: bytes) -> bool:
    """Format probe for :func:`fbjax.formats.detect_format`: v2 magic or a valid v1 root."""
    return is_rten_v2(head) or probe_v1(source, head)
