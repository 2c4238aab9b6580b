"""Write a loaded ``.tflite`` model back with new weights (``Model.save``).

The file fbjax read is unpacked with the flatc object API
(``ModelT.InitFromObj``), the buffers of the updated constants are replaced,
and the object tree is packed again: operators, options, signatures,
metadata, tensor names, quantization parameters and every buffer that was
not updated are kept as they were. Only schema fields the generated bindings
know survive (fields from a newer schema than ``schemas/tflite.fbs`` would
be dropped by the round trip). Buffers are written 16-byte aligned, as
TensorFlow's converter writes them.

Types, shapes and quantization parameters are those of the file's own
tensors, never the IR's: load-time passes rewrite the IR (``quantized=
"float"`` dequantizes constants in place, ``batch_size`` changes shapes),
and the saved file keeps the original types and batch-1 shapes.

Per tensor kind:

* float constants (float32, float16, float64, bfloat16): the new values are
  cast to the tensor's stored dtype (a float16 weight is rounded to float16:
  run fbjax on the rounded params to compare with LiteRT).
* quantized integer constants (int8/uint8/int16/int32/int4 with scales):
  given as *float* (dequantized) values (what ``fbjax.load(...,
  quantized="float")`` exposes as params), they are re-quantized,
  ``q = clip(round_half_away(x / scale) + zero_point)``, with the file's
  scales and zero points (``requantize="file"``, the default), or with new
  symmetric per-channel scales ``max|x| / qmax`` along the tensor's
  quantized dimension (``requantize="per_channel"``; zero points must be 0,
  as TFLite requires for int8 weights; a per-tensor quantized weight gets
  one new scale). Recomputing the scales of a weight
  changes the scale its consumers expect of their int32 bias (``s_in *
  s_w``), so the int32 bias of every CONV_2D, DEPTHWISE_CONV_2D,
  FULLY_CONNECTED and TRANSPOSE_CONV reading the weight is re-quantized to
  the new bias scales too (from its updated float values if given, else
  from its current dequantized values).
* sparse constants (``sparsity``, read densified): only the values stored
  in the sparse structure can be written. If the new dense values are zero
  everywhere the structure stores nothing, they are written into the
  existing values buffer; otherwise :class:`~fbjax.errors.InputError` names
  the tensor (fine-tuning a pruned weight must keep its zeros; mask the
  update, e.g. ``g * (w != 0)``).
* INT4 constants are packed two per byte as the file stores them.

A model saved without changes is returned byte for byte. TFLite metadata
(the ``TFLITE_METADATA`` buffer) is a buffer like any other and is kept; the
zip archive of associated files (label maps) that TFLite Support appends to
a model is appended again, byte for byte, after the re-packed flatbuffer
(:func:`fbjax.formats.tflite_metadata.associated_zip_range`).

Files that keep buffers after the flatbuffer (``offset``/``size`` relative to
the file start, the over-2-GB convention litert-torch also uses for smaller
files; the schema's ``Buffer.offset``/``size``) are written in the same
layout. When every replaced buffer keeps its byte length and the flatbuffer
itself does not change (no new scales, no shared buffer split), the new bytes
are written over the old ones in a copy of the file: everything else stays
byte for byte. Otherwise the flatbuffer is packed again with those buffers
(and any large custom options) as ``offset``/``size`` entries, followed by
their bytes, each 16-byte aligned; inline buffers stay inline.
"""

from __future__ import annotations

from typing import Mapping, Optional

import flatbuffers
import numpy as np

from ..errors import InputError
from ..ir import ModelIR, Value
from ..quantmath import requantize_weights, weights_roundtrip
from ._generated import tflite_generated as T
from ._writing import REQUANTIZE_MODES, check_writable
from .tflite_metadata import associated_zip_range
from .tflite import FILE_IDENTIFIER, TENSOR_TYPE_NAMES, densify, opcode_name, tensor_dtype

__all__ = ["write", "quantize", "REQUANTIZE_MODES"]

_ALIGN = 16


def _bias_ops(registry) -> Optional[dict]:
    """TFLite op name -> ``(weight input, bias input, activation input)``
    for the ops whose int32 bias scale is activation scale * weight scale:
    the ``bias_scale`` fact of their registration in ``registry`` (the op
    registry is handed down: formats sit below the lowering that fills it)."""
    if registry is None:
        return None
    return {od.name: tuple(od.fact("bias_scale")) for od in registry if od.op_set == "tflite" and od.fact("bias_scale")}


class _AlignedBufferT(T.BufferT):
    """A buffer whose data vector starts on a 16-byte boundary."""

    def __init__(self, payload: Optional[bytes]):
        super().__init__()
        self._payload = payload

    def Pack(self, builder):
        data = None
        if self._payload:
            n = len(self._payload)
            builder.StartVector(1, n, _ALIGN)
            builder.head = builder.head - n
            builder.Bytes[builder.head: builder.head + n] = self._payload
            data = builder.EndVector()
        T.BufferStart(builder)
        if data is not None:
            T.BufferAddData(builder, data)
        return T.BufferEnd(builder)


def _qrange(dtype: np.dtype, type_name: str) -> tuple[int, int]:
    if type_name == "INT4":
        return -8, 7
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def _bcast(p: np.ndarray, ndim: int, dim: int) -> np.ndarray:
    shape = [1] * ndim
    if p.size > 1:
        shape[dim] = p.size
        return p.reshape(shape)
    return p.reshape(()) if ndim else p.reshape(())


def quantize(x: np.ndarray, scale, zero_point, dim: int, dtype, *, qmin: int, qmax: int) -> np.ndarray:
    """``clip(round_half_away(x / scale) + zero_point, qmin, qmax)`` in ``dtype``.

    ``scale`` and ``zero_point`` are 1-D (length 1: per-tensor, else along
    ``dim``). Division in float64 then rounding half away from zero, as
    TFLite's ``AffineQuantize``.
    """
    x = np.asarray(x, np.float64)
    s = _bcast(np.asarray(scale, np.float64), x.ndim, dim)
    z = _bcast(np.asarray(zero_point, np.int64), x.ndim, dim)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = x / np.where(s == 0, 1.0, s)
    q = np.sign(q) * np.floor(np.abs(q) + 0.5)
    q = np.clip(q + z, qmin, qmax)
    return q.astype(dtype)


def _pack_int4(q: np.ndarray) -> bytes:
    flat = q.reshape(-1).astype(np.int8)
    if flat.size % 2:
        flat = np.concatenate([flat, np.zeros(1, np.int8)])
    lo = flat[0::2].astype(np.uint8) & 0x0F
    hi = (flat[1::2].astype(np.uint8) & 0x0F) << 4
    return (lo | hi).astype(np.uint8).tobytes()


def _le_bytes(a: np.ndarray) -> bytes:
    a = np.ascontiguousarray(a)
    if a.dtype.byteorder == ">" or (a.dtype.byteorder == "=" and not np.little_endian):
        a = a.astype(a.dtype.newbyteorder("<"))
    return a.tobytes()


def _file_quant(t):
    """QuantParams of a file tensor (object API), or None."""
    from ..ir import QuantParams

    q = t.quantization
    if q is None or q.scale is None or len(q.scale) == 0:
        return None
    scale = np.asarray(q.scale, np.float32).reshape(-1)
    zp = np.asarray(q.zeroPoint if q.zeroPoint is not None and len(q.zeroPoint) else np.zeros(scale.size),
                    np.int64).reshape(-1)
    if zp.size == 1 and scale.size > 1:
        zp = np.full(scale.shape, zp[0], np.int64)
    return QuantParams(scale, zp, int(q.quantizedDimension))


def _name(t) -> str:
    return t.name.decode("utf-8", "replace") if isinstance(t.name, bytes) else str(t.name)


class _Writer:
    """Works on the file's own tensors (object API): dtype, shape and
    quantization come from the file, never from the IR, which load-time
    passes may have rewritten (``quantized="float"`` dequantizes constants
    in place, ``batch_size`` changes shapes)."""

    def __init__(self, ir: ModelIR, requantize: str, registry=None):
        check_writable(ir, "tflite", "TFLite", requantize)
        self.ir = ir
        self.requantize = requantize
        self.bias_ops = _bias_ops(registry)
        raw = ir.buffer
        self.raw = raw
        self.m = T.ModelT.InitFromObj(T.Model.GetRootAs(raw, 0))
        # buffers whose bytes follow the flatbuffer (offset/size, valid when > 1)
        self.after = {bi for bi, b in enumerate(self.m.buffers or []) if b is not None and b.offset > 1}
        self.restructured = False  # the flatbuffer itself changes (new scales, split buffers)
        # id(Value) -> (subgraph, tensor) position in the file
        self.where = {}
        for si, g in enumerate(ir.graphs):
            n_file = len(self.m.subgraphs[si].tensors or []) if si < len(self.m.subgraphs or []) else 0
            for ti, v in enumerate(g.values[:n_file]):
                self.where.setdefault(id(v), (si, ti))
        self.payloads: list = [self._payload(b) for b in (self.m.buffers or [])]
        self.original = list(self.payloads)

    def _payload(self, b) -> Optional[bytes]:
        if b is not None and b.offset > 1:  # a view, not a copy: such files may be large
            return memoryview(self.raw)[b.offset:b.offset + b.size]  # the reader checked the range
        if b is None or b.data is None:
            return None
        return np.asarray(b.data, np.uint8).tobytes()

    def _pos(self, v: Value) -> tuple:
        pos = self.where.get(id(v))
        if pos is None:
            raise InputError(f"tensor {v.name!r} is not stored in the model file")
        return pos

    def _t(self, pos):
        return self.m.subgraphs[pos[0]].tensors[pos[1]]

    # -- encoding one tensor -----------------------------------------------------
    def encode(self, t, new: np.ndarray, quant=None) -> bytes:
        """Bytes of the buffer holding ``new`` for file tensor ``t``."""
        name = _name(t)
        type_name = TENSOR_TYPE_NAMES.get(t.type, "?")
        stored = tensor_dtype(t.type)
        shape = tuple(int(d) for d in (t.shape if t.shape is not None else []))
        new = np.asarray(new)
        if new.shape != shape:
            raise InputError(f"tensor {name!r}: new value has shape {new.shape}, the file stores {shape}")
        if stored.kind == "f":
            if new.dtype.kind not in "fiu":
                raise InputError(f"tensor {name!r}: cannot store {new.dtype} values as {stored}")
            with np.errstate(over="ignore"):
                q = new.astype(stored)
            big = np.isfinite(new) & ~np.isfinite(q)
            if big.any():  # float16 storage: beyond +-65504
                raise InputError(f"tensor {name!r}: {int(big.sum())} value(s) (largest magnitude "
                                 f"{float(np.max(np.abs(new[big]))):.4g}) overflow the file's {stored} storage "
                                 f"(largest finite {float(np.finfo(stored).max):.6g})")
        elif stored.kind in "iu":
            qp = quant if quant is not None else _file_quant(t)
            if new.dtype.kind == "f" and qp is not None and getattr(qp, "block_size", 0):
                # blockwise int4 (litert-torch's dynamic_int4_block32): the file's float16 scales per row
                # and block are kept, the values re-quantized on them (round half to even, [-8, 7])
                q = requantize_weights(new.astype(np.float32), qp, np.int8).astype(stored)
            elif new.dtype.kind == "f":
                if qp is None:
                    raise InputError(
                        f"tensor {name!r} holds unquantized {stored} values; float values cannot be written to it"
                    )
                lo, hi = _qrange(stored, type_name)
                if quant is None:
                    # the file's own scales: float mode's definition
                    # (fbjax:QUANTIZE_WEIGHTS), so LiteRT runs the saved file as
                    # fbjax.load(..., quantized="float") ran these weights
                    orig = self._file_ints(t, stored, shape)
                    anchor = orig if orig is not None and not weights_roundtrip(orig, qp) else None
                    q = np.clip(requantize_weights(new, qp, stored, anchor), lo, hi).astype(stored)
                else:
                    q = quantize(new, qp.scale, qp.zero_point, qp.quantized_dimension, stored, qmin=lo, qmax=hi)
            elif new.dtype == stored:
                q = new
            else:
                raise InputError(f"tensor {name!r}: give {stored} or float values, not {new.dtype}")
        else:
            raise InputError(f"tensor {name!r}: cannot write {stored} tensors")
        if t.sparsity is not None:
            return self._sparse_values(t, q)
        if type_name == "INT4":
            return _pack_int4(q)
        return _le_bytes(q)

    def _blockwise_quant(self, pos):
        """The blockwise QuantParams (``block_size`` > 0, scales ``[rows, blocks]`` as float32 from the
        file's scales tensor, zero points 0) of the tensor at ``pos``, or None when it has none."""
        from ..ir import QuantParams

        t = self._t(pos)
        q = t.quantization
        if q is None or q.detailsType != T.QuantizationDetails.BlockwiseQuantization or q.details is None:
            return None
        st = self.m.subgraphs[pos[0]].tensors[int(q.details.scales)]
        raw = self.payloads[st.buffer] if st.buffer is not None and st.buffer < len(self.payloads) else None
        if raw is None:
            raise InputError(f"tensor {_name(t)!r}: its blockwise scales tensor holds no data")
        dims = tuple(int(d) for d in (st.shape if st.shape is not None else []))
        scale = np.frombuffer(bytes(raw), tensor_dtype(st.type)).astype(np.float32).reshape(dims)
        return QuantParams(scale, np.broadcast_to(np.int64(0), scale.shape), 0, int(q.details.blockSize))

    def _file_ints(self, t, stored: np.dtype, shape: tuple) -> Optional[np.ndarray]:
        """The integers the file stores for dense tensor ``t``, or None
        (sparse, packed int4, or no data)."""
        if t.sparsity is not None or TENSOR_TYPE_NAMES.get(t.type) == "INT4":
            return None
        raw = self.payloads[t.buffer] if t.buffer is not None and t.buffer < len(self.payloads) else None
        n = int(np.prod(shape)) if shape else 1
        if not raw or len(raw) != n * stored.itemsize:
            return None
        return np.frombuffer(raw, stored.newbyteorder("<")).astype(stored).reshape(shape)

    def _sparse_values(self, t, dense: np.ndarray) -> bytes:
        n_stored = len(self.payloads[t.buffer] or b"") // dense.dtype.itemsize
        # which dense position holds stored value k: densify 1..n and read back
        marks = densify(np.arange(1, n_stored + 1, dtype=np.int64), dense.shape, t.sparsity)
        stored_at = marks != 0
        outside = dense[~stored_at]
        if np.any(outside != 0):
            raise InputError(
                f"tensor {_name(t)!r} is stored sparse (TFLite sparsity); the new values are non-zero at "
                f"{int(np.count_nonzero(outside))} position(s) the sparse structure does not store. "
                "Keep the pruned zeros when fine-tuning (mask the update, e.g. grad * (w != 0))."
            )
        values = np.zeros(n_stored, dense.dtype)
        values[marks[stored_at] - 1] = dense[stored_at]
        return _le_bytes(values)

    # -- updates -------------------------------------------------------------------
    def apply(self, updates: Mapping[Value, np.ndarray]) -> None:
        pending = {}  # (si, ti) -> new values
        for v, x in updates.items():
            pos = self._pos(v)
            t = self._t(pos)
            if not t.buffer or self.payloads[t.buffer] is None:
                raise InputError(f"tensor {v.name!r} is not a constant of the file")
            pending[pos] = np.asarray(x)
        new_quant = {}  # (si, ti) -> QuantParams with recomputed scales
        if self.requantize == "per_channel":
            for pos, x in pending.items():
                t = self._t(pos)
                if tensor_dtype(t.type).kind in "iu" and _file_quant(t) is not None and x.dtype.kind == "f":
                    new_quant[pos] = self._per_channel_quant(t, x)
            if new_quant:
                self._bias_updates(pending, new_quant)
                self.restructured = True
        for pos, x in pending.items():  # float values for a blockwise-quantized tensor: the file's grid
            if pos not in new_quant and x.dtype.kind == "f":
                bq = self._blockwise_quant(pos)
                if bq is not None:
                    new_quant[pos] = bq
        groups: dict = {}
        for pos, x in pending.items():
            t = self._t(pos)
            groups.setdefault(t.buffer, []).append((t, self.encode(t, x, new_quant.get(pos))))
        users = self._buffer_users()
        for bi, items in groups.items():
            first = items[0][1]
            untouched = users.get(bi, 0) > len(items)
            if not untouched and all(d == first for _, d in items):
                self.payloads[bi] = first
                continue
            # the buffer is shared by tensors that now differ: give each its own
            self.restructured = True
            for t, data in items:
                if bi in self.after:
                    self.after.add(len(self.payloads))
                t.buffer = len(self.payloads)
                self.payloads.append(data)

    def _buffer_users(self) -> dict:
        users: dict = {}
        for sg in self.m.subgraphs or []:
            for t in sg.tensors or []:
                if t.buffer:
                    users[t.buffer] = users.get(t.buffer, 0) + 1
        return users

    def _per_channel_quant(self, t, x: np.ndarray):
        from ..ir import QuantParams

        q = _file_quant(t)
        if np.any(q.zero_point != 0):
            raise InputError(
                f"tensor {_name(t)!r}: requantize='per_channel' recomputes symmetric scales, but the file's "
                "zero points are not 0; use requantize='file'"
            )
        dim = q.quantized_dimension if q.per_channel else 0
        _, qmax = _qrange(tensor_dtype(t.type), TENSOR_TYPE_NAMES.get(t.type, "?"))
        x64 = np.abs(np.asarray(x, np.float64))
        if q.per_channel and x64.ndim:
            amax = np.max(x64, axis=tuple(a for a in range(x64.ndim) if a != dim)).reshape(-1)
        else:
            amax = np.asarray([x64.max() if x64.size else 0.0])
        scale = np.where(amax > 0, amax / qmax, 1.0).astype(np.float32)
        t.quantization.scale = [float(s) for s in scale]
        t.quantization.zeroPoint = [0] * scale.size
        t.quantization.quantizedDimension = int(dim)
        t.quantization.min = None
        t.quantization.max = None
        return QuantParams(scale, np.zeros(scale.shape, np.int64), dim)

    def _bias_updates(self, pending: dict, new_quant: dict) -> None:
        """Re-quantize the int32 biases whose scale is input_scale * weight_scale."""
        from ..ir import QuantParams

        if self.bias_ops is None:
            raise InputError("requantize='per_channel' changes the scales int32 biases depend on, which the "
                             "op registry declares (bias_scale): save through Model.save, or pass "
                             "registry=fbjax.lower.LOWERINGS to fbjax.formats.write_model")
        names = [opcode_name(oc) for oc in (self.m.operatorCodes or [])]
        for si, sg in enumerate(self.m.subgraphs or []):
            for op in sg.operators or []:
                op_set, op_name = names[op.opcodeIndex]
                io = self.bias_ops.get(op_name) if op_set == "tflite" else None
                ins = [int(i) for i in (op.inputs if op.inputs is not None else [])]
                if io is None or len(ins) <= max(io):
                    continue
                wi, bi, xi = ins[io[0]], ins[io[1]], ins[io[2]]
                if (si, wi) not in new_quant or bi < 0 or xi < 0 or (si, bi) in new_quant:
                    continue
                bt, xt = sg.tensors[bi], sg.tensors[xi]
                bq, xq = _file_quant(bt), _file_quant(xt)
                if bq is None or xq is None or xq.scale.size != 1 or not bt.buffer:
                    continue
                if (si, bi) in pending:
                    given = np.asarray(pending[(si, bi)])
                    fb = given.astype(np.float64)
                    if given.dtype.kind != "f":  # given as integers in the file's scale
                        fb = (fb - bq.zero_point) * bq.scale.astype(np.float64)
                else:
                    stored = np.frombuffer(self.payloads[bt.buffer], tensor_dtype(bt.type).newbyteorder("<"))
                    fb = (stored.astype(np.int64) - bq.zero_point) * bq.scale.astype(np.float64)
                bscale = (np.float64(xq.scale[0]) * new_quant[(si, wi)].scale.astype(np.float64)).astype(np.float32)
                bt.quantization.scale = [float(s) for s in bscale]
                bt.quantization.zeroPoint = [0] * bscale.size
                bt.quantization.quantizedDimension = 0
                new_quant[(si, bi)] = QuantParams(bscale, np.zeros(bscale.shape, np.int64), 0)
                pending[(si, bi)] = fb.reshape(tuple(int(d) for d in bt.shape))

    def pack(self) -> bytes:
        for bi, (p, o) in enumerate(zip(self.payloads, self.original)):
            if p is not o and p is not None and o is not None and p == o:
                self.payloads[bi] = o  # rewritten with the same bytes (float16 weights round-tripped through float32)
        if all(p is o for p, o in zip(self.payloads, self.original)) and not self.restructured:
            return bytes(self.raw)  # nothing changed: the file as it was, metadata and associated files too
        zipped = associated_zip_range(self.raw)
        if zipped is not None and zipped[0] < self._flatbuffer_end():
            zipped = None  # not an appended archive
        out = self._pack()
        if zipped is None or out.endswith(bytes(memoryview(self.raw)[zipped[0]:])):
            return out
        # TFLite metadata's associated files (label maps...): the zip archive
        # appended after the model, kept byte for byte (zipfile finds it from its end record)
        return out + bytes(memoryview(self.raw)[zipped[0]:zipped[1]])

    def _flatbuffer_end(self) -> int:
        """Where the file's flatbuffer and the buffers it places after itself end."""
        end = 0
        for bi in self.after:
            b = self.m.buffers[bi]
            end = max(end, int(b.offset) + int(b.size))
        for sg in self.m.subgraphs or []:
            for op in sg.operators or []:
                if op.largeCustomOptionsSize:
                    end = max(end, int(op.largeCustomOptionsOffset) + int(op.largeCustomOptionsSize))
        return end

    def _pack(self) -> bytes:
        large = bool(self.after) or any(op.largeCustomOptionsSize for sg in self.m.subgraphs or []
                                        for op in sg.operators or [])
        if not large:
            return self._pack_inline()
        if not self.restructured and all(
                p is o or len(p or b"") == len(o or b"") for p, o in zip(self.payloads, self.original)):
            return self._patch()
        return self._pack_after()

    def _patch(self) -> bytes:
        """The file's bytes with the changed buffers' bytes in place of the old ones."""
        bufs = T.Model.GetRootAs(self.raw, 0)
        changed = []
        for bi, (p, o) in enumerate(zip(self.payloads, self.original)):
            if p is o or not p:
                continue
            b = self.m.buffers[bi]
            if bi in self.after:
                start = int(b.offset)
            else:  # inline: where the data vector of buffer bi lies in the file
                tab = bufs.Buffers(bi)._tab
                start = tab.Vector(tab.Offset(4))
            changed.append((start, p))
        view, pieces, at = memoryview(self.raw), [], 0
        for start, p in sorted(changed, key=lambda c: c[0]):
            pieces += [view[at:start], p]
            at = start + len(p)
        pieces.append(view[at:])
        return b"".join(pieces)

    def _pack_after(self) -> bytes:
        """The flatbuffer packed again, then the bytes it refers to by offset."""
        blobs = []  # (BufferT or OperatorT, "buffer" or "options", bytes) placed after the flatbuffer
        bufs = []
        for bi, p in enumerate(self.payloads):
            if bi in self.after:
                b = T.BufferT()
                bufs.append(b)
                blobs.append((b, "buffer", p or b""))
            else:
                bufs.append(_AlignedBufferT(p))
        for sg in self.m.subgraphs or []:
            for op in sg.operators or []:
                if op.largeCustomOptionsSize:
                    off = int(op.largeCustomOptionsOffset)
                    blobs.append((op, "options", memoryview(self.raw)[off:off + int(op.largeCustomOptionsSize)]))
        self.m.buffers = bufs

        def place(offsets):
            for (obj, kind, data), off in zip(blobs, offsets):
                if kind == "buffer":
                    obj.offset, obj.size = off, len(data)
                else:
                    obj.largeCustomOptionsOffset, obj.largeCustomOptionsSize = off, len(data)

        # offsets are fixed-width fields: pack once with non-zero placeholders to learn the size
        place([1 << 62] * len(blobs))
        head = self._pack_inline(keep_buffers=True)
        pos, offsets = len(head), []
        for _, _, data in blobs:
            pos += -pos % _ALIGN
            offsets.append(pos)
            pos += max(len(data), 1)
        place(offsets)
        head2 = self._pack_inline(keep_buffers=True)
        if len(head2) != len(head):  # a flatbuffers builder change; never expected
            raise InputError("saving: the flatbuffer changed size when its buffer offsets were filled in")
        pieces, at = [head2], len(head2)
        for (_, _, data), off in zip(blobs, offsets):
            pieces += [b"\0" * (off - at), data]
            at = off + len(data)
        return b"".join(pieces)

    def _pack_inline(self, keep_buffers: bool = False) -> bytes:
        if not keep_buffers:
            self.m.buffers = [_AlignedBufferT(p) for p in self.payloads]
        size = sum(len(p or b"") + _ALIGN for bi, p in enumerate(self.payloads) if bi not in self.after) + (1 << 16)
        builder = flatbuffers.Builder(size)
        root = self.m.Pack(builder)
        builder.Finish(root, file_identifier=FILE_IDENTIFIER)
        return bytes(builder.Output())


def write(ir: ModelIR, updates: Mapping[Value, np.ndarray], *, requantize: str = "file", registry=None) -> bytes:
    """The ``.tflite`` bytes of ``ir``'s source file with some constants replaced.

    Args:
        ir: a model read by :func:`fbjax.formats.tflite.read` (its
            ``buffer`` still holds the file's bytes).
        updates: IR constant -> new contents (same shape). Float tensors take
            float values; quantized integer tensors take float (dequantized)
            values, re-quantized per ``requantize``, or integers of the
            stored dtype, written as they are.
        requantize: ``"file"`` (keep the file's scales and zero points) or
            ``"per_channel"`` (new symmetric per-channel scales, and the
            dependent int32 biases re-quantized; see the module docstring).
        registry: the op registry (``fbjax.lower.LOWERINGS``), whose
            ``bias_scale`` facts say which biases depend on a weight's
            scales; needed for ``requantize="per_channel"`` only.

    Returns:
        the new file's bytes; everything not updated is kept.

    Raises:
        InputError: a shape mismatch, a value the tensor's type cannot hold,
            a sparse tensor whose zeros were changed; ``per_channel``
            without ``registry``.
    """
    w = _Writer(ir, requantize, registry)
    w.apply(updates)
    return w.pack()
