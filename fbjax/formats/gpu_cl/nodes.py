"""The file's nodes as stored: one :class:`GpuNode` per ``CLNode`` (``GpuNode`` in LiteRT).

A node's name carries its op types (``"convolution_2d 12 linked : relu 13"``);
its ``Arguments`` carry named int/float/half scalars and the weight objects
(buffer, Texture2D, TensorLinear and Tensor descriptors with their data).
Nothing here knows what an op means: :mod:`.kernels` reads these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ...errors import ModelFormatError
from .. import verify as _verify
from .generations import Generation


@dataclass
class GpuObject:
    """A weight object of a node's Arguments: its data as stored, and where.

    Attributes:
        kind: ``"buffer"``, ``"texture2d"``, ``"tensor_linear"`` or ``"tensor"``.
        dtype: element dtype of the stored floats (float32 or float16).
        flat: the stored values as a flat float array (a copy, file dtype).
        offset: byte offset of the data in the file (for write-back).
        info: descriptor fields shown by ``fbjax inspect`` (sizes).
    """

    kind: str
    dtype: np.dtype
    flat: np.ndarray
    offset: int
    info: dict = field(default_factory=dict)


@dataclass
class GpuNode:
    """One ``CLNode`` as stored: name parts, arguments, objects, code."""

    index: int
    name: str
    ops: list  # [(op type, graph node id)], the first is the kernel's own op, then linked ops
    input_ids: list
    output_ids: list
    ints: dict
    floats: dict
    objects: dict
    code: str
    work_group_size: tuple
    grid_size: tuple
    fingerprint: Optional[int] = None  # TF 2.7: the fingerprint of the node's compiled program


#: descriptor table of each object kind (its ``data`` field holds the weights)
_DESCRIPTORS = {"buffer": "BufferDescriptor", "texture2d": "Texture2DDescriptor",
                "tensor_linear": "TensorLinearDescriptor", "tensor": "TensorDescriptor"}


def _vec_offset(tab, slot_voffset: int) -> int:
    o = tab.Offset(slot_voffset)
    return tab.Vector(o) if o else -1


def _data_slot(gen: Generation, table: str) -> int:
    """vtable offset of ``table.data`` in ``gen``'s schema (from the verifier's schema description)."""
    return next(f.voffset for f in _verify.schema(gen.schema).tables[table] if f.name == "data")


def _object_info(kind: str, d) -> dict:
    """The descriptor's sizes, as ``fbjax inspect`` shows them."""
    if kind == "buffer":
        return {"element_size": d.ElementSize(), "size": d.Size()}
    if kind == "texture2d":
        s = d.Size()
        return {"width": s.X() if s else 0, "height": s.Y() if s else 0}
    if kind == "tensor_linear":
        return {"size": d.Size()}
    s = d.Shape()
    return {"shape": (s.B(), s.H(), s.W(), s.D(), s.C()) if s else None}


def _objects(args, gen: Generation, label: str) -> dict:
    """A node's weight objects by name: stored values, element type, file offset, descriptor sizes."""
    out = {}
    for kind, getter in gen.object_kinds:
        for j in range(getattr(args, getter + "Length")()):
            m = getattr(args, getter)(j)
            key = (m.Key() or b"").decode("utf-8", "replace")
            d = m.Value()
            if d is None:
                continue
            et = d.DataType() if kind == "tensor" else d.ElementType()
            dt = gen.dtypes.get(et)
            info = _object_info(kind, d)
            n = d.DataLength()
            if n == 0:
                out[key] = GpuObject(kind, dt or np.dtype("<f4"), np.zeros(0, np.float32), -1, info)
                continue
            if dt is None:
                raise ModelFormatError(f"{label}: object {key!r} has element type {et}, not a float type fbjax decodes")
            if n % dt.itemsize:
                raise ModelFormatError(f"{label}: object {key!r} holds {n} bytes, not whole {dt.name} values")
            pos = _vec_offset(d._tab, _data_slot(gen, _DESCRIPTORS[kind]))
            out[key] = GpuObject(kind, dt, np.frombuffer(bytes(d._tab.Bytes[pos:pos + n]), dt), pos, info)
    return out


def parse_name(name: str, label: str) -> list:
    """``"<op type> <id>[ linked : <op type> <id>]..."`` -> ``[(op type, id), ...]``.

    Raises:
        ModelFormatError: the name has another form.
    """
    ops = []
    for part in name.split(" linked : "):
        bits = part.strip().split(" ")
        if len(bits) != 2 or not bits[1].lstrip("-").isdigit() or not bits[0]:
            raise ModelFormatError(f"{label}: node name {name!r} is not '<op type> <id>[ linked : <op type> <id>]...'")
        ops.append((bits[0], int(bits[1])))
    return ops


def _check_shared(a, where: str, name: str) -> None:
    """Seed generation: each active scalar's ``offset`` slot of ``shared_int4s`` / ``shared_float4s`` holds its value
    (the kernel code reads the slot; fbjax reads the value)."""
    for count, get, shared_len, shared in (
            (a.IntValuesLength(), a.IntValues, a.SharedInt4sLength(), a.SharedInt4sAsNumpy),
            (a.FloatValuesLength(), a.FloatValues, a.SharedFloat4sLength(), a.SharedFloat4sAsNumpy)):
        arr = shared() if shared_len else np.zeros(0)
        for j in range(count):
            v = get(j)
            if not v.Active():
                continue
            off = v.Offset()
            if off >= arr.size or arr[off] != np.float32(v.Value()) and arr[off] != v.Value():
                raise ModelFormatError(f"{where} ({name!r}): argument {(v.Name() or b'').decode('utf-8', 'replace')!r} "
                                       f"= {v.Value()} but its shared slot {off} holds "
                                       f"{arr[off] if off < arr.size else 'nothing'}")


def _int3(t) -> tuple:
    return (t.X(), t.Y(), t.Z()) if t is not None else ()


def _named(count: int, get) -> dict:
    """``{name: value}`` of an Arguments value list (unnamed entries skipped)."""
    out = {}
    for j in range(count):
        v = get(j)
        if v.Name() is not None:
            out[v.Name().decode("utf-8", "replace")] = v.Value()
    return out


def parse_nodes(graph, gen: Generation, label: str) -> list[GpuNode]:
    """The graph's nodes with names, arguments and objects decoded.

    Raises:
        ModelFormatError: a node without ``gpu_op`` / ``arguments``, a name of another form, a weight object
            that is not whole float values, a seed scalar whose shared slot disagrees.
    """
    nodes = []
    for i in range(graph.NodesLength()):
        n = graph.Nodes(i)
        where = f"{label}node {i}"
        name = (n.Name() or b"").decode("utf-8", "replace")
        op = n.GpuOp()
        if op is None or op.Arguments() is None:
            raise ModelFormatError(f"{where} ({name!r}) has no gpu_op/arguments")
        a = op.Arguments()
        ints = _named(a.IntValuesLength(), a.IntValues)
        floats = _named(a.FloatValuesLength(), a.FloatValues)
        if gen.shared_slots:
            _check_shared(a, where, name)
        floats.update(_named(a.HalfValuesLength(), a.HalfValues))
        nodes.append(GpuNode(
            i, name, parse_name(name, where), [int(x) for x in n.InputIdsAsNumpy()] if n.InputIdsLength() else [],
            [int(x) for x in n.OutputIdsAsNumpy()] if n.OutputIdsLength() else [], ints, floats,
            _objects(a, gen, where), (op.Code() or b"").decode("utf-8", "replace"),
            _int3(op.WorkGroupSize()), _int3(op.GridSize()),
            n.Fingerprint() if gen.node_fingerprint else None))
    return nodes
