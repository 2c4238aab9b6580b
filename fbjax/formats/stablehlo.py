"""StableHLO prototype flatbuffer (``stablehlo.flatbuf``) frontend: bytes -> :class:`~fbjax.ir.ModelIR`.

Follows ``schemas/stablehlo.fbs`` (TensorFlow's prototype
``stablehlo_flatbuffer.fbs``, namespace ``stablehlo.flatbuf``):

* no file identifier (recognised by :func:`looks_like_stablehlo`, which
  verifies the root table); ``Model.version`` is 0;
* one subgraph per function, subgraph 0 is the entry point; ``REDUCE`` and
  ``REDUCE_WINDOW`` bodies are further subgraphs referenced by the options'
  ``computation`` index, with the region's block arguments as inputs;
* buffer 0 is the empty sentinel; constants are little-endian, row-major;
* ``CONVERT`` has no options (the target type is the output tensor's type);
* missing optional attribute vectors are empty and mean the StableHLO
  defaults (strides and dilations 1, padding 0, no window reversal); the
  group counts, stored as 0 when absent, mean 1;
* the ``DataType`` enum has no bool, bf16 or complex.

Every operator becomes a node of op set ``"stablehlo"`` named as the
StableHLO spec spells it (``"stablehlo.add"``, ``"stablehlo.dot_general"``);
options become the spec's attribute names (the schema's
``input_feature_dimention`` and ``window_dimension`` are read as
``input_feature_dimension`` and ``window_dimensions``) with the
defaults filled in, so the lowering in :mod:`fbjax.lower.stablehlo` can be
shared with other carriers of StableHLO (TFLite ``STABLEHLO_*`` builtins).
``RESIZE_BILINEAR`` is not a StableHLO op; it becomes
``"stablehlo.resize_bilinear"`` with TensorFlow's ``ResizeBilinear``
semantics (NHWC).
"""

from __future__ import annotations

import os
import re
import struct
from typing import Optional

import numpy as np

from ..errors import ModelFormatError
from ..ir import Graph, ModelIR, Node, Value, fill_zero_size_constants
from . import verify as _verify
from ._mmap import open_source
from ._generated import stablehlo_generated as S

OP_SET = "stablehlo"


def _enum_names(cls) -> dict[int, str]:
    return {v: k for k, v in vars(cls).items() if not k.startswith("_") and isinstance(v, int)}


OPCODE_NAMES = _enum_names(S.OperatorCode)  # 0 -> "DOT", ...
DATATYPE_NAMES = _enum_names(S.DataType)

#: OperatorCode name -> StableHLO op name (the IR's op_name).
OP_NAMES = {
    "DOT": "stablehlo.dot",
    "ADD": "stablehlo.add",
    "CONVOLUTION": "stablehlo.convolution",
    "MAXIMUM": "stablehlo.maximum",
    "MINIMUM": "stablehlo.minimum",
    "RESHAPE": "stablehlo.reshape",
    "DIVIDE": "stablehlo.divide",
    "MULTIPLY": "stablehlo.multiply",
    "REDUCE": "stablehlo.reduce",
    "REDUCE_WINDOW": "stablehlo.reduce_window",
    "BROADCAST_IN_DIM": "stablehlo.broadcast_in_dim",
    "LOGISTIC": "stablehlo.logistic",
    "CUSTOM_CALL": "stablehlo.custom_call",
    "BATCH_NORM_INFERENCE": "stablehlo.batch_norm_inference",
    "CLAMP": "stablehlo.clamp",
    "SLICE": "stablehlo.slice",
    "CONCATENATE": "stablehlo.concatenate",
    "IOTA": "stablehlo.iota",
    "SUBTRACT": "stablehlo.subtract",
    "CEIL": "stablehlo.ceil",
    "CONVERT": "stablehlo.convert",
    "GATHER": "stablehlo.gather",
    "ABS": "stablehlo.abs",
    "DOT_GENERAL": "stablehlo.dot_general",
    "RESIZE_BILINEAR": "stablehlo.resize_bilinear",
}
OP_CODES = {OP_NAMES[n]: c for c, n in OPCODE_NAMES.items()}  # "stablehlo.add" -> 1

#: DataType name -> numpy dtype (INT4/UINT4 are unpacked to int8/uint8).
_DTYPES = {
    "FLOAT16": np.float16,
    "FLOAT32": np.float32,
    "FLOAT64": np.float64,
    "INT4": np.int8,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "UINT4": np.uint8,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT64": np.int64,
}


def tensor_dtype(code: int) -> np.dtype:
    """numpy dtype of a ``DataType`` enum value.

    Raises:
        ModelFormatError: unknown DataType value.
    """
    name = DATATYPE_NAMES.get(int(code))
    if name is None:
        raise ModelFormatError(f"unknown DataType value {code}")
    return np.dtype(_DTYPES[name])


def dtype_to_datatype(dtype) -> int:
    """Inverse of :func:`tensor_dtype` for writers.

    Raises:
        ValueError: the dtype has no ``DataType`` (bool, bfloat16, complex).
    """
    dtype = np.dtype(dtype)
    for name, dt in _DTYPES.items():
        if name not in ("INT4", "UINT4") and np.dtype(dt) == dtype:
            return getattr(S.DataType, name)
    raise ValueError(f"stablehlo.flatbuf has no DataType for {dtype.name}")


# --- detection -------------------------------------------------------------

_MODEL_FIELDS = 4  # version, operator_codes, subgraphs, buffers


def looks_like_stablehlo(data) -> bool:
    """Whether ``data`` (bytes-like) verifies as a ``stablehlo.flatbuf`` Model.

    The format has no file identifier, so the root table is checked: the
    root offset, vtable and table lie inside the buffer, the vtable has at
    most the Model's four fields, every operator code is one of the 25 known
    ones, there is at least one subgraph and operators index into
    ``operator_codes``. A ``.tflite`` (``TFL3`` at bytes 4-7) or an ``.rten``
    v2 (starting with ``RTEN``) never matches.
    """
    try:
        buf = memoryview(data)
        n = len(buf)
        if n < 16 or bytes(buf[4:8]) == b"TFL3" or bytes(buf[:4]) == b"RTEN":
            return False
        (root,) = struct.unpack_from("<I", buf, 0)
        if root < 4 or root + 4 > n:
            return False
        (vt_rel,) = struct.unpack_from("<i", buf, root)
        vt = root - vt_rel
        if vt < 0 or vt + 4 > n:
            return False
        vt_size, tbl_size = struct.unpack_from("<HH", buf, vt)
        if vt_size < 4 or vt_size % 2 or vt_size > 4 + 2 * _MODEL_FIELDS or vt + vt_size > n:
            return False
        if root + tbl_size > n:
            return False
        for k in range((vt_size - 4) // 2):
            (off,) = struct.unpack_from("<H", buf, vt + 4 + 2 * k)
            if off and off + 4 > tbl_size:
                return False
        _verify.verify(buf, "stablehlo")  # every offset the bindings follow is in bounds
        m = S.Model.GetRootAs(bytes(buf) if not isinstance(data, (bytes, bytearray)) else data, 0)
        if m.SubgraphsLength() < 1:
            return False
        codes = [m.OperatorCodes(i) for i in range(m.OperatorCodesLength())]
        if any(c not in OPCODE_NAMES for c in codes):
            return False
        for si in range(m.SubgraphsLength()):
            sg = m.Subgraphs(si)
            nt = sg.TensorsLength()
            for oi in range(sg.OperatorsLength()):
                op = sg.Operators(oi)
                if op.OpcodeIndex() >= len(codes):
                    return False
                for j in range(op.InputsLength()):
                    if not -1 <= op.Inputs(j) < nt:
                        return False
        return True
    except Exception:  # any parse failure: not this format
        return False


def probe(source, head: bytes) -> bool:
    """``fbjax.formats._PROBES`` entry: read ``source`` and verify it."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return looks_like_stablehlo(source)
    try:
        with open(os.fspath(source), "rb") as f:
            return looks_like_stablehlo(f.read())
    except OSError:
        return False


# --- options ----------------------------------------------------------------

def _snake(name: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


# Schema field names that differ from the spec's attribute names.
_RENAMES = {"input_feature_dimention": "input_feature_dimension", "window_dimension": "window_dimensions"}

# Vector attributes whose absence means "ones" / "zeros" / "false" per rank.
_ONES = {"window_strides", "lhs_dilation", "rhs_dilation", "base_dilations", "window_dilations", "strides"}


def options_to_attrs(opts, op_name: str, rank: int) -> dict:
    """Object-API options table -> attrs with the StableHLO names and defaults.

    ``rank`` is the number of spatial / windowed dimensions that default
    vectors get (convolution: spatial dims; reduce_window and slice: the
    operand rank).
    """
    attrs: dict = {}
    if opts is None:
        return attrs
    for k, v in vars(opts).items():
        key = _snake(k)
        key = _RENAMES.get(key, key)
        if isinstance(v, bytes):
            v = v.decode("utf-8", "replace")
        elif isinstance(v, (list, np.ndarray)):
            v = np.asarray(v)
            v = v.astype(np.bool_) if key == "window_reversal" else v.astype(np.int64)
        attrs[key] = v
    if op_name == "stablehlo.custom_call":
        bc = getattr(opts, "backendConfig", None)
        attrs["backend_config"] = b"" if bc is None else bytes(np.asarray(bc, np.uint8))
    for key in list(attrs):
        v = attrs[key]
        if v is None:
            if key in _ONES:
                attrs[key] = np.ones(rank, np.int64)
            elif key == "padding":
                attrs[key] = np.zeros(2 * rank, np.int64)
            elif key == "window_reversal":
                attrs[key] = np.zeros(rank, np.bool_)
            elif key == "call_target_name":
                attrs[key] = ""
            else:  # dimension lists: absent == empty
                attrs[key] = np.zeros(0, np.int64)
    for key in ("feature_group_count", "batch_group_count"):
        if key in attrs and int(attrs[key]) == 0:
            attrs[key] = 1
    return attrs


# --- reading ----------------------------------------------------------------

def _tensor_value(t, ti: int, buffers, where: str) -> Value:
    desc = f"{where}, tensor {ti}"
    dtype = tensor_dtype(t.type)
    shape = tuple(int(d) for d in (t.shape if t.shape is not None else []))
    _verify.check_shape(shape, desc)  # rank, negative dims, element count limits
    name = t.name.decode("utf-8", "replace") if isinstance(t.name, bytes) else (t.name or f"tensor_{ti}")
    v = Value(name=name, dtype=dtype, shape=shape, index=ti)
    b = int(t.buffer)
    if not 0 <= b < len(buffers):
        raise ModelFormatError(f"{desc}: buffer {b} out of range (the model has {len(buffers)} buffers)")
    buf = buffers[b]
    if b == 0 or buf is None or buf.data is None or len(buf.data) == 0:
        return v
    raw = np.asarray(buf.data, np.uint8)
    n = int(np.prod(shape)) if shape else 1
    tname = DATATYPE_NAMES[int(t.type)]
    if tname in ("INT4", "UINT4"):
        if raw.size * 2 < n:
            raise ModelFormatError(f"{desc}: {tname} buffer has {raw.size} bytes, shape needs {(n + 1) // 2}")
        lo, hi = raw & 0xF, raw >> 4
        vals = np.stack([lo, hi], -1).reshape(-1)[:n].astype(dtype)
        if tname == "INT4":
            vals = ((vals.astype(np.int8) << 4) >> 4).astype(np.int8)
        v.data = vals.reshape(shape)
        return v
    need = n * dtype.itemsize
    if raw.size != need:
        raise ModelFormatError(
            f"{desc}: buffer {b} holds {raw.size} bytes but shape {list(shape)} of {dtype.name} needs {need}"
        )
    v.data = raw.copy().view(dtype.newbyteorder("<")).astype(dtype).reshape(shape)
    return v


def read(source) -> ModelIR:
    """Parse a ``stablehlo.flatbuf`` file (path or bytes) into the IR.

    Returns:
        :class:`~fbjax.ir.ModelIR` with format ``"stablehlo"``: one graph per
        subgraph (graph 0 is the entry point; reduction bodies are the graphs
        their ``computation`` attribute names).

    Raises:
        ModelFormatError: not a valid ``stablehlo.flatbuf`` Model (the
            message names the subgraph, operator or tensor at fault).
    """
    raw, path = open_source(source)
    label = path or "<bytes>"
    if not looks_like_stablehlo(raw):
        try:  # name the structural fault when there is one
            _verify.verify(raw, "stablehlo")
        except ModelFormatError as e:
            raise ModelFormatError(f"{label}: not a valid stablehlo.flatbuf model: {e}") from None
        raise ModelFormatError(
            f"{label}: not a stablehlo.flatbuf model (the root table does not verify: no subgraph, "
            "unknown operator codes or tensor indices out of range)"
        )
    with _verify.corrupt_file_errors(label, "stablehlo.flatbuf"):
        _verify.verify(raw, "stablehlo")  # structure first: the generated bindings trust every offset
        m = S.ModelT.InitFromObj(S.Model.GetRootAs(bytes(raw), 0))
        ir = _to_ir(m, path)
        ir.buffer = raw  # the file's bytes, for fbjax.formats.stablehlo_writer
        return ir


def _spatial_rank(name: str, ins: list) -> int:
    x = ins[0] if ins else None
    r = len(x.shape) if x is not None and x.shape is not None else 0
    return max(r - 2, 0) if name == "stablehlo.convolution" else r


def _to_ir(m, path) -> ModelIR:
    if not m.subgraphs:
        raise ModelFormatError("the model has no subgraphs")
    buffers = m.buffers or []
    codes = [int(c) for c in (m.operatorCodes if m.operatorCodes is not None else [])]
    for i, c in enumerate(codes):
        if c not in OPCODE_NAMES:
            raise ModelFormatError(f"operator_codes[{i}] = {c} is not a known OperatorCode")
    graphs = []
    calls: list = []
    for si, sg in enumerate(m.subgraphs):
        where = f"subgraph {si}"
        values = [_tensor_value(t, ti, buffers, where) for ti, t in enumerate(sg.tensors or [])]

        def ref(i, what: str) -> Optional[Value]:
            i = int(i)
            if i == -1:
                return None
            if not 0 <= i < len(values):
                raise ModelFormatError(f"{what} refers to tensor {i}, but the subgraph has {len(values)} tensors")
            return values[i]

        nodes = []
        for oi, op in enumerate(sg.operators or []):
            if not 0 <= op.opcodeIndex < len(codes):
                raise ModelFormatError(f"{where}, operator {oi}: opcode index {op.opcodeIndex} out of range")
            name = OP_NAMES[OPCODE_NAMES[codes[op.opcodeIndex]]]
            loc = f"{where}, operator {oi}"
            ins = [ref(i, f"{loc} ({name}): input {k}") for k, i in enumerate(op.inputs if op.inputs is not None else [])]
            outs = [ref(i, f"{loc} ({name}): output {k}") for k, i in enumerate(op.outputs if op.outputs is not None else [])]
            attrs = options_to_attrs(op.operatorOptions, name, _spatial_rank(name, ins))
            regions: dict = {}
            if "computation" in attrs:
                c = int(attrs["computation"])
                if not 0 <= c < len(m.subgraphs):
                    raise ModelFormatError(
                        f"{loc} ({name}): computation {c} out of range (the model has {len(m.subgraphs)} subgraphs)"
                    )
                calls.append((si, c, f"{loc} ({name}): computation"))
                regions = {"computation": (c,)}
            elif name in ("stablehlo.reduce", "stablehlo.reduce_window"):
                raise ModelFormatError(f"{loc} ({name}): has no options naming its computation subgraph")
            if any(o is None for o in outs) or not outs:
                raise ModelFormatError(f"{loc} ({name}): every output must name a tensor")
            nodes.append(Node(OP_SET, name, ins, outs, attrs, loc, regions=regions))
        g_in = [ref(i, f"{where}: input") for i in (sg.inputs if sg.inputs is not None else [])]
        g_out = [ref(i, f"{where}: output") for i in (sg.outputs if sg.outputs is not None else [])]
        for kind, lst in (("input", g_in), ("output", g_out)):
            if any(v is None for v in lst):
                raise ModelFormatError(f"{where}: {kind} {lst.index(None)} refers to tensor -1")
        gname = sg.name.decode("utf-8", "replace") if isinstance(sg.name, bytes) else (sg.name or f"subgraph_{si}")
        graphs.append(Graph(gname, g_in, g_out, nodes, values))
        fill_zero_size_constants(graphs[-1])  # zero-element constants have empty buffers
    _verify.check_call_graph(len(graphs), calls)
    ir = ModelIR("stablehlo", graphs, 0, {}, "", path, None, {"version": int(m.version)})
    return ir
