"""Write a loaded ``.rten`` model back with new weights (``Model.save``).

A saved weight keeps its dtype and shape, so the new file is the original
file's bytes with only the updated constants' data overwritten in place:
header, flatbuffer tables, names, attributes, alignment padding and every
other constant stay byte for byte as they were.

Where a constant's data lives (found by walking the file's own flatbuffer,
in the order :mod:`fbjax.formats.rten` numbers graphs: main graph first,
then ``If``/``Loop`` bodies depth first, fields in schema order):

* v2 files, large constants: the tensor-data segment, at
  ``tensor_data_offset + ConstantNode.data_offset`` (dtype
  ``ConstantNode.dtype``);
* v1 files and small v2 constants: the inline ``FloatData`` /
  ``Int32Data`` / ``Int8Data`` / ``UInt8Data`` vector (its element type).

Values are cast to the stored dtype (RTen stores only float32, int32, int8
and uint8). RTen constants carry no quantization parameters (quantized
models keep their scales as separate tensors feeding ``DequantizeLinear``),
so an integer constant takes integer values that fit its dtype exactly;
float values for it are refused rather than silently rounded.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ..errors import InputError
from ..ir import ModelIR, Value
from ._generated import rten_generated as R
from ._writing import REQUANTIZE_MODES, check_writable  # noqa: F401 (REQUANTIZE_MODES: re-exported)
from .rten import DTYPES, MAGIC, parse_header

__all__ = ["write", "encode", "patch"]

_INLINE = {  # ConstantData union type -> (table class, element dtype)
    R.ConstantData.FloatData: (R.FloatData, DTYPES[1]),
    R.ConstantData.Int32Data: (R.Int32Data, DTYPES[0]),
    R.ConstantData.Int8Data: (R.Int8Data, DTYPES[2]),
    R.ConstantData.UInt8Data: (R.UInt8Data, DTYPES[3]),
}


def encode(name: str, new, stored: np.dtype, shape: tuple) -> bytes:
    """Little-endian bytes of ``new`` stored as ``stored`` with ``shape``.

    Float storage takes any real values (cast, rounding to the stored
    precision). Integer storage takes integer values that the stored dtype
    holds exactly (no quantization parameters to re-quantize floats with).

    Raises:
        InputError: shape mismatch, float values for an integer tensor,
            integers out of the stored dtype's range, non-numeric values.
    """
    new = np.asarray(new)
    stored = np.dtype(stored)
    if tuple(new.shape) != tuple(shape):
        raise InputError(f"tensor {name!r}: new value has shape {tuple(new.shape)}, the file stores {tuple(shape)}")
    if stored.kind == "f":
        if new.dtype.kind not in "fiub":
            raise InputError(f"tensor {name!r}: cannot store {new.dtype} values as {stored}")
        q = new.astype(stored)
    elif stored.kind in "iu":
        if new.dtype.kind not in "iub":
            raise InputError(
                f"tensor {name!r} holds unquantized {stored} values (the file has no scale for it); "
                f"give {stored} values, not {new.dtype}"
            )
        info = np.iinfo(stored)
        if new.size and (new.min() < info.min or new.max() > info.max):
            raise InputError(f"tensor {name!r}: values outside the range of {stored} ({info.min}..{info.max})")
        q = new.astype(stored)
    else:
        raise InputError(f"tensor {name!r}: cannot write {stored} tensors")
    return np.ascontiguousarray(q).astype(stored.newbyteorder("<")).tobytes()


def patch(raw, spans: Mapping[int, bytes]) -> bytes:
    """``raw`` (bytes-like) with ``spans`` (byte offset -> new bytes) written over it."""
    out = bytearray(raw)
    for start, data in spans.items():
        if start < 0 or start + len(data) > len(out):
            raise InputError(f"constant data at bytes {start}..{start + len(data)} lies outside the file")
        out[start:start + len(data)] = data
    return bytes(out)


def _s(b) -> str:
    return b.decode("utf-8", "replace") if isinstance(b, bytes) else (b or "")


def _constants(raw, moff: int, toff) -> list:
    """Per graph (reader's numbering): ``{node index: (name, offset, dtype, shape)}``."""
    model = R.Model.GetRootAs(raw, moff)
    graphs: list = []

    def walk(g) -> None:
        table: dict = {}
        graphs.append(table)
        for ni in range(g.NodesLength()):
            node = g.Nodes(ni)
            kind = node.DataType()
            d = node.Data()
            if d is None:
                continue
            if kind == R.NodeKind.ConstantNode:
                c = R.ConstantNode()
                c.Init(d.Bytes, d.Pos)
                shape = tuple(int(x) for x in c.ShapeAsNumpy()) if not c.ShapeIsNone() else ()
                inline = c.Data()
                if inline is not None and c.DataType() in _INLINE:
                    cls, dtype = _INLINE[c.DataType()]
                    t = cls()
                    t.Init(inline.Bytes, inline.Pos)
                    o = t._tab.Offset(4)
                    if not o:
                        continue
                    start = t._tab.Vector(o)
                elif c.DataOffset() is not None and toff is not None and c.Dtype() in DTYPES:
                    dtype = DTYPES[c.Dtype()]
                    start = toff + int(c.DataOffset())
                else:
                    continue
                table[ni] = (_s(node.Name()), start, dtype, shape)
            elif kind == R.NodeKind.OperatorNode:
                op = R.OperatorNode()
                op.Init(d.Bytes, d.Pos)
                at, a = op.AttrsType(), op.Attrs()
                if a is None:
                    continue
                if at == R.OperatorAttrs.IfAttrs:
                    x = R.IfAttrs()
                    x.Init(a.Bytes, a.Pos)
                    bodies = (x.ThenBranch(), x.ElseBranch())
                elif at == R.OperatorAttrs.LoopAttrs:
                    x = R.LoopAttrs()
                    x.Init(a.Bytes, a.Pos)
                    bodies = (x.Body(),)
                else:
                    continue
                for b in bodies:
                    if b is not None:
                        walk(b)

    g = model.Graph()
    if g is not None:
        walk(g)
    return graphs


def write(ir: ModelIR, updates: Mapping[Value, np.ndarray], *, requantize: str = "file", registry=None) -> bytes:
    """The ``.rten`` bytes of ``ir``'s source file with some constants replaced.

    Args:
        ir: a model read by :func:`fbjax.formats.rten.read` (its ``buffer``
            still holds the file's bytes).
        updates: IR constant -> new contents (same shape as the file's).
        requantize: accepted for :meth:`fbjax.Model.save`'s signature
            (``"file"`` or ``"per_channel"``); RTen constants have no
            quantization parameters, so it changes nothing.
        registry: accepted for :func:`fbjax.formats.write_model`'s signature
            (the op registry; this writer needs no op facts).

    Returns:
        the new file's bytes: the original bytes with the updated constants'
        data overwritten; nothing else changes.

    Raises:
        InputError: a constant not stored in the file, a shape mismatch, a
            value the stored dtype cannot hold.
    """
    check_writable(ir, "rten", "RTen", requantize)
    raw = ir.buffer
    if len(raw) >= 4 and bytes(raw[:4]) == MAGIC:
        _, moff, _, toff = parse_header(raw)
    else:
        moff, toff = 0, None
    if not updates:
        return bytes(raw)
    consts = _constants(raw, moff, toff)
    where = {id(v): gi for gi, g in enumerate(ir.graphs) for v in g.values}
    spans: dict = {}
    for v, x in updates.items():
        gi = where.get(id(v))
        entry = consts[gi].get(v.index) if gi is not None and gi < len(consts) else None
        if entry is None or entry[0] != v.name:
            raise InputError(f"tensor {v.name!r} is not a constant stored in the model file")
        name, start, dtype, shape = entry
        data = encode(name, x, dtype, shape)
        if start in spans and spans[start] != data:
            raise InputError(f"tensor {name!r} shares its data with another updated constant given other values")
        spans[start] = data
    return patch(raw, spans)
