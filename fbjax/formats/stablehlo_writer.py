"""Write a loaded ``stablehlo.flatbuf`` model back with new weights (``Model.save``).

A saved weight keeps its dtype and shape, so the new file is the original
file's bytes with the updated constants' ``Buffer.data`` vectors overwritten
in place: tables, names, options and every other buffer stay byte for byte
as they were. Types and shapes come from the file's own ``Tensor`` tables,
never from the IR.

Float constants take any real values, cast to the stored type (a float16
constant is rounded to float16). Integer constants (the format has no
quantization parameters) take integer values the stored type holds
exactly; ``INT4``/``UINT4`` constants are packed two to a byte, low nibble
first, as :mod:`fbjax.formats.stablehlo` unpacks them (the unused high
nibble of an odd-sized tensor's last byte is kept).

A buffer shared by several tensors is only rewritten when every tensor
using it is updated with the same values; otherwise the change would leak
into a tensor that was not updated, and :class:`~fbjax.InputError` is
raised.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ..errors import InputError
from ..ir import ModelIR, Value
from ._generated import stablehlo_generated as S
from ._writing import check_writable
from .rten_writer import encode, patch
from .stablehlo import DATATYPE_NAMES, tensor_dtype

__all__ = ["write"]


def _s(b) -> str:
    return b.decode("utf-8", "replace") if isinstance(b, bytes) else (b or "")


def _encode_int4(name: str, new, stored: np.dtype, shape: tuple, old_last: int) -> bytes:
    q = np.frombuffer(encode(name, new, np.int8, shape), np.int8) if stored == np.int8 else \
        np.frombuffer(encode(name, new, np.uint8, shape), np.uint8)
    lo, hi = (-8, 7) if stored == np.int8 else (0, 15)
    if q.size and (q.min() < lo or q.max() > hi):
        raise InputError(f"tensor {name!r}: values outside the 4-bit range {lo}..{hi}")
    flat = q.astype(np.uint8) & 0x0F
    odd = flat.size % 2
    if odd:
        flat = np.concatenate([flat, np.zeros(1, np.uint8)])
    packed = (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8)
    if odd:
        packed[-1] |= old_last & 0xF0
    return packed.tobytes()


def write(ir: ModelIR, updates: Mapping[Value, np.ndarray], *, requantize: str = "file", registry=None) -> bytes:
    """The ``stablehlo.flatbuf`` bytes of ``ir``'s source file with some constants replaced.

    Args:
        ir: a model read by :func:`fbjax.formats.stablehlo.read` (its
            ``buffer`` still holds the file's bytes).
        updates: IR constant -> new contents (same shape as the file's).
        requantize: accepted for :meth:`fbjax.Model.save`'s signature; the
            format has no quantization parameters, so it changes nothing.
        registry: accepted for :func:`fbjax.formats.write_model`'s signature
            (the op registry; this writer needs no op facts).

    Returns:
        the new file's bytes; only the updated buffers' data differ.

    Raises:
        InputError: a tensor that is not a constant of the file, a shape
            mismatch, a value the stored type cannot hold, a buffer shared
            with a tensor that was not updated the same way.
    """
    check_writable(ir, "stablehlo", "StableHLO", requantize)
    raw = ir.buffer
    if not updates:
        return bytes(raw)
    m = S.Model.GetRootAs(raw, 0)
    users: dict = {}  # buffer index -> [(subgraph, tensor)]
    for si in range(m.SubgraphsLength()):
        sg = m.Subgraphs(si)
        for ti in range(sg.TensorsLength()):
            b = sg.Tensors(ti).Buffer()
            if b:
                users.setdefault(b, []).append((si, ti))
    where = {id(v): gi for gi, g in enumerate(ir.graphs) for v in g.values}
    by_buffer: dict = {}  # buffer index -> {(si, ti): (name, bytes)}
    starts: dict = {}
    for v, x in updates.items():
        si = where.get(id(v))
        t = None
        if si is not None and si < m.SubgraphsLength() and 0 <= v.index < m.Subgraphs(si).TensorsLength():
            t = m.Subgraphs(si).Tensors(v.index)
        name = v.name if t is None else (_s(t.Name()) or f"tensor_{v.index}")
        if t is None or name != v.name or not t.Buffer():
            raise InputError(f"tensor {v.name!r} is not a constant stored in the model file")
        bi = t.Buffer()
        buf = m.Buffers(bi)
        o = buf._tab.Offset(4) if buf is not None else 0
        if not o or buf._tab.VectorLen(o) == 0:
            raise InputError(f"tensor {v.name!r} is not a constant stored in the model file")
        start = buf._tab.Vector(o)
        shape = tuple(int(d) for d in t.ShapeAsNumpy()) if t.ShapeLength() else ()
        stored = tensor_dtype(t.Type())
        if DATATYPE_NAMES[int(t.Type())] in ("INT4", "UINT4"):
            n = int(np.prod(shape)) if shape else 1
            data = _encode_int4(name, x, stored, shape, raw[start + (n + 1) // 2 - 1] if n else 0)
        else:
            data = encode(name, x, stored, shape)
        by_buffer.setdefault(bi, {})[(si, v.index)] = (name, data)
        starts[bi] = start
    spans = {}
    for bi, items in by_buffer.items():
        datas = {d for _, d in items.values()}
        missing = [p for p in users.get(bi, []) if p not in items]
        if len(datas) > 1 or missing:
            names = sorted(n for n, _ in items.values())
            raise InputError(
                f"tensor(s) {names} share buffer {bi} with "
                f"{'other tensors not updated' if missing else 'each other'}; "
                "saving different values for them would need a new buffer, which in-place saving does not add"
            )
        spans[starts[bi]] = datas.pop()
    return patch(raw, spans)
