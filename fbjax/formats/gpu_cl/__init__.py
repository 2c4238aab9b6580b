"""TFLite GPU delegate (OpenCL) serialized models (``.bin``): bytes -> :class:`~fbjax.ir.ModelIR`.

The delegate writes ``tflite.gpu.cl.data.InferenceContext`` flatbuffers to skip
graph compilation on the next start: its whole compiled graph, one ``CLNode``
per OpenCL kernel, with the kernel's source, launch sizes, tensor descriptors
and every weight repacked into GPU layouts. There is no file identifier and the
schema changed between TensorFlow releases; :func:`detect_generation` verifies
the root table against each schema fbjax has (``schemas/gpu_cl_*.fbs``):

* ``"seed"`` (TF master late 2020, ``schemas/gpu_cl_seed.fbs``): ``DataType``
  FLOAT32 = 1, FLOAT16 = 2; ``Arguments`` carry ``shared_int4s`` /
  ``shared_float4s`` / ``shared_half4s``; graph inputs/outputs are named by
  ``input_ids`` / ``output_ids`` only;
* ``"tf2.5"`` (TensorFlow 2.5.0, ``schemas/gpu_cl_tf25.fbs``): FLOAT16 = 1,
  FLOAT32 = 2; ``const_tensors``; ``input_refs`` / ``output_refs`` (the TFLite
  tensor indices the graph's inputs and outputs stand for);
* ``"tf2.7"`` (TensorFlow 2.7, ``schemas/gpu_cl_tf27.fbs``): the 2.5 layout
  with ``driver_version`` and the compiled ``binary_programs`` (``BinaryProgram``:
  a kernel fingerprint and the driver's program binary) in the root table's first
  two slots, and ``CLNode.fingerprint`` naming each node's program;
* ``"litert"`` (LiteRT today, ``schemas/gpu_cl_litert.fbs``): the graph moves
  to ``InferenceContext.gpu_model`` (``GpuModel`` / ``GpuNode``) beside
  ``driver_version`` and compiled ``binary_programs``; ``Arguments`` lose the
  Texture2D and TensorLinear objects (those weights are TensorDescriptor
  objects); precision lives in each operation's definition.

fbjax reads the graph and the weights; compiled programs are device code for
the driver that built them: ``fbjax inspect`` counts them, ``Model.save`` keeps
their bytes as they are.

A generation matches when the verifier accepts the file, the root table has
no field the schema does not know and the graph has nodes. Op types exist only in node names
(``"convolution_2d 12 linked : relu 13"``): each node becomes one IR node of op
set ``"gpu"`` for its own op plus one per linked (fused element-wise) op. Every
weight object is decoded back to TFLite layouts (OHWI convolution filters,
``[1, H, W, C]`` depthwise filters, ``[O, I]`` fully connected weights, ``[C]``
biases, ``[1, 1, C]`` PReLU slopes) through an index map into the object's
data (:func:`weight_index`), so :mod:`fbjax.formats.gpu_cl_writer` can put
tuned values back in the same places. Activations are ``[B, H, W, C]``.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ...errors import ModelFormatError, UnsupportedOperatorError
from ...ir import Graph, ModelIR, Node, Value
from .. import verify as _verify
from .._generated import gpu_cl_seed_generated as _GS
from .._generated import gpu_cl_litert_generated as _GL
from .._generated import gpu_cl_tf25_generated as _G25
from .._generated import gpu_cl_tf27_generated as _G27
from .._text import format_bytes

OP_SET = "gpu"

#: TF 2.5's delegate writes this enum field from uninitialised memory (values -1..-4).
_UNCHECKED_ENUMS = (("Texture2DDescriptor", "normalized_type"),)


@dataclass(frozen=True)
class Generation:
    """One schema generation of the serialized InferenceContext."""

    name: str
    schema: str  # fbjax.formats.verify schema name
    module: object  # flatc bindings
    root_fields: int  # fields of InferenceContext in this schema
    dtypes: dict  # DataType value -> numpy dtype


GENERATIONS = (
    Generation("seed", "gpu_cl_seed", _GS, 11, {1: np.dtype("<f4"), 2: np.dtype("<f2")}),
    Generation("tf2.5", "gpu_cl_tf25", _G25, 14, {1: np.dtype("<f2"), 2: np.dtype("<f4")}),
    Generation("tf2.7", "gpu_cl_tf27", _G27, 16, {1: np.dtype("<f2"), 2: np.dtype("<f4")}),
    Generation("litert", "gpu_cl_litert", _GL, 5, {1: np.dtype("<f2"), 2: np.dtype("<f4")}),
)
PRECISIONS = {0: "F32", 1: "F32_F16", 2: "F16"}
STORAGE = {0: "UNKNOWN", 1: "BUFFER", 2: "IMAGE_BUFFER", 3: "TEXTURE_2D", 4: "TEXTURE_3D", 5: "TEXTURE_ARRAY",
           6: "SINGLE_TEXTURE_2D"}


#: GPU operation types (node-name op types) this reader turns into IR nodes
KNOWN_OPS = frozenset({
    "convolution_2d", "depthwise_convolution", "fully_connected", "convolution_transposed", "pooling_2d", "add",
    "mul", "prelu", "relu", "sigmoid", "hard_swish", "concat", "reshape", "mean", "pad", "slice", "resize"})


def _root_unknown_fields(buf, n_fields: int) -> list[int]:
    """Slots of the root table beyond the schema's ``n_fields`` that hold a value."""
    root = struct.unpack_from("<I", buf, 0)[0]
    vt = root - struct.unpack_from("<i", buf, root)[0]
    vsize = struct.unpack_from("<H", buf, vt)[0]
    return [s for s in range(n_fields, (vsize - 4) // 2) if struct.unpack_from("<H", buf, vt + 4 + 2 * s)[0]]


def detect_generation(buf, label: Optional[str] = None) -> Generation:
    """The schema generation ``buf`` is a valid InferenceContext of.

    Raises:
        ModelFormatError: no generation matches; the message gives each one's reason.
    """
    reasons = []
    for gen in GENERATIONS:
        try:
            _verify.verify(buf, gen.schema, unchecked_enums=_UNCHECKED_ENUMS)
        except ModelFormatError as e:
            reasons.append(f"{gen.name}: {e}")
            continue
        extra = _root_unknown_fields(buf, gen.root_fields)
        if extra:
            reasons.append(f"{gen.name}: InferenceContext has fields in slots {extra} this generation does not define")
            continue
        if not _graph(gen, gen.module.InferenceContext.GetRootAs(buf, 0)).NodesLength():
            reasons.append(f"{gen.name}: read this way the graph has no nodes")
            continue
        return gen
    pre = f"{label}: " if label else ""
    raise ModelFormatError(f"{pre}not a TFLite GPU delegate (OpenCL) serialized model of any known generation "
                           f"({', '.join(g.name for g in GENERATIONS)}): " + "; ".join(reasons))


def _graph(gen: Generation, ic):
    """The table holding nodes/tensors/input_ids...: the root, or (LiteRT) its ``gpu_model``."""
    if gen.name == "litert":
        g = ic.GpuModel()
        if g is None:
            return _EmptyGraph()
        return g
    return ic


class _EmptyGraph:
    def NodesLength(self):
        return 0


def probe(source, head: bytes) -> bool:
    """``fbjax.formats._PROBES`` entry: whether ``source`` verifies as some generation."""
    try:
        if isinstance(source, (bytes, bytearray, memoryview)):
            buf = bytes(source)
        else:
            with open(os.fspath(source), "rb") as f:
                buf = f.read()
        detect_generation(buf)
        return True
    except (OSError, ModelFormatError):
        return False


# --- parsed nodes --------------------------------------------------------------

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


def _vec_offset(tab, slot_voffset: int) -> int:
    o = tab.Offset(slot_voffset)
    return tab.Vector(o) if o else -1


_DESCRIPTORS = {"buffer": "BufferDescriptor", "texture2d": "Texture2DDescriptor",
                "tensor_linear": "TensorLinearDescriptor", "tensor": "TensorDescriptor"}


def _data_slot(gen: Generation, table: str) -> int:
    """vtable offset of ``table.data`` in ``gen``'s schema (from the verifier's schema description)."""
    return next(f.voffset for f in _verify.schema(gen.schema).tables[table] if f.name == "data")


def _objects(args, gen: Generation, label: str) -> dict:
    """A node's weight objects by name: stored values, element type, file offset, descriptor sizes."""
    out = {}
    for kind, getter in (("buffer", "BufferObjects"), ("texture2d", "Texture2dObjects"),
                         ("tensor_linear", "TensorLinearObjects"), ("tensor", "TensorObjects")):
        if not hasattr(args, getter + "Length"):  # LiteRT has no Texture2D / TensorLinear objects
            continue
        for j in range(getattr(args, getter + "Length")()):
            m = getattr(args, getter)(j)
            key = (m.Key() or b"").decode("utf-8", "replace")
            d = m.Value()
            if d is None:
                continue
            et = d.DataType() if kind == "tensor" else d.ElementType()
            dt = gen.dtypes.get(et)
            info = {}
            if kind == "buffer":
                info = {"element_size": d.ElementSize(), "size": d.Size()}
            elif kind == "texture2d":
                s = d.Size()
                info = {"width": s.X() if s else 0, "height": s.Y() if s else 0}
            elif kind == "tensor_linear":
                info = {"size": d.Size()}
            else:
                s = d.Shape()
                info = {"shape": (s.B(), s.H(), s.W(), s.D(), s.C()) if s else None}
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


def _parse_name(name: str, label: str) -> list:
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


def parse_nodes(ic, gen: Generation, label: str) -> list[GpuNode]:
    """The file's CLNodes with names, arguments and objects decoded."""
    nodes = []
    for i in range(ic.NodesLength()):
        n = ic.Nodes(i)
        where = f"{label}node {i}"
        name = (n.Name() or b"").decode("utf-8", "replace")
        op = n.GpuOp()
        if op is None or op.Arguments() is None:
            raise ModelFormatError(f"{where} ({name!r}) has no gpu_op/arguments")
        a = op.Arguments()
        ints = {a.IntValues(j).Name().decode("utf-8", "replace"): a.IntValues(j).Value()
                for j in range(a.IntValuesLength()) if a.IntValues(j).Name() is not None}
        floats = {a.FloatValues(j).Name().decode("utf-8", "replace"): a.FloatValues(j).Value()
                  for j in range(a.FloatValuesLength()) if a.FloatValues(j).Name() is not None}
        if gen.name == "seed":
            _check_shared(a, where, name)
        if hasattr(a, "HalfValuesLength"):
            floats.update({a.HalfValues(j).Name().decode("utf-8", "replace"): a.HalfValues(j).Value()
                           for j in range(a.HalfValuesLength()) if a.HalfValues(j).Name() is not None})
        nodes.append(GpuNode(
            i, name, _parse_name(name, where), [int(x) for x in n.InputIdsAsNumpy()] if n.InputIdsLength() else [],
            [int(x) for x in n.OutputIdsAsNumpy()] if n.OutputIdsLength() else [], ints, floats,
            _objects(a, gen, where), (op.Code() or b"").decode("utf-8", "replace"),
            _int3(op.WorkGroupSize()), _int3(op.GridSize()),
            n.Fingerprint() if hasattr(n, "Fingerprint") else None))
    return nodes


def _programs(root) -> tuple[Optional[str], list]:
    """``driver_version`` and the compiled programs ``[(fingerprint, bytes)]`` of a TF 2.7 / LiteRT root table."""
    if not hasattr(root, "DriverVersion"):
        return None, []
    dv = root.DriverVersion()
    progs = []
    for j in range(root.BinaryProgramsLength()):
        p = root.BinaryPrograms(j)
        progs.append((p.Fingerprint(), p.BinaryLength()))
    return (dv.decode("utf-8", "replace") if dv is not None else None), progs


# --- weight layouts ------------------------------------------------------------

def _slices(c: int) -> int:
    return (c + 3) // 4


def weight_index(layout: str, shape: tuple, **kw) -> np.ndarray:
    """Index map of a weight layout: ``flat[index]`` is the TFLite-layout weight.

    ``index`` has the TFLite shape and holds, for each element, its position
    (in floats) in the object's stored data (channels padded to slices of 4).

    Layouts (TF 2.5 ``gpu/common/task/weights_conversion.h`` and the task
    classes):

    * ``"linear"`` ``[C]`` (or ``[1, 1, C]``): one float4 per channel slice.
    * ``"conv_i4o4"`` / ``"conv_o4i4"`` OHWI, ``group=G``: per group of G output
      slices, y, x, input slice, output slice in the group: 16 floats holding,
      for each of 4 input channels, 4 output channels (``i4o4``), or for each
      of 4 output channels, 4 input channels (``o4i4``).
    * ``"dw"`` ``[1, H, W, C]``: per channel slice, y, x: 4 channels.
    * ``"dw3x3"`` ``[1, 3, 3, C]`` and ``"dw3x3_bias"`` ``[C]``: per channel
      slice 9 float4 weights (row-major) then one float4 bias.
    * ``"fc"`` ``[O, I]``: 4x4 blocks, float index
      ``(i // 4) * Op * 4 + (o // 4) * 16 + (i % 4) * 4 + o % 4`` (Op = O
      padded to 4).
    * ``"transposed_thin"`` ``[1, KH, KW, I]`` (ConvolutionTransposedThin, one
      output channel): per input slice, y, x, a float4 of 4 input channels;
      then ``"transposed_thin_bias"``: one float4 of biases (``taps=KH*KW*slices``).
    """
    if layout == "linear":
        c = shape[-1]
        return np.arange(c).reshape(shape)
    if layout in ("conv_i4o4", "conv_o4i4", "transposed_ohwi_i4o4"):
        o_, kh, kw_, i_ = shape
        g = kw.get("group", 1)
        o = np.arange(o_)[:, None, None, None]
        y = np.arange(kh)[None, :, None, None]
        x = np.arange(kw_)[None, None, :, None]
        i = np.arange(i_)[None, None, None, :]
        si_n = _slices(i_)
        os_, o4 = o // 4, o % 4
        gn, gs = os_ // g, os_ % g
        si, j = i // 4, i % 4
        base = ((((gn * kh + y) * kw_ + x) * si_n + si) * g + gs) * 16
        inner = j * 4 + o4 if layout != "conv_o4i4" else o4 * 4 + j
        return base + inner
    if layout == "dw":
        _, kh, kw_, c = shape
        y = np.arange(kh)[None, :, None, None]
        x = np.arange(kw_)[None, None, :, None]
        ch = np.arange(c)[None, None, None, :]
        return ((ch // 4 * kh + y) * kw_ + x) * 4 + ch % 4
    if layout == "dw3x3":
        _, kh, kw_, c = shape
        y = np.arange(3)[None, :, None, None]
        x = np.arange(3)[None, None, :, None]
        ch = np.arange(c)[None, None, None, :]
        return (ch // 4 * 10 + y * 3 + x) * 4 + ch % 4
    if layout == "dw3x3_bias":
        ch = np.arange(shape[0])
        return (ch // 4 * 10 + 9) * 4 + ch % 4
    if layout == "fc":
        o_, i_ = shape
        op = _slices(o_) * 4
        o = np.arange(o_)[:, None]
        i = np.arange(i_)[None, :]
        return (i // 4) * op * 4 + (o // 4) * 16 + (i % 4) * 4 + o % 4
    if layout == "transposed_thin":  # one output channel: per input slice, y, x, a float4 of 4 input channels
        _, kh, kw_, i_ = shape
        y = np.arange(kh)[None, :, None, None]
        x = np.arange(kw_)[None, None, :, None]
        i = np.arange(i_)[None, None, None, :]
        return ((i // 4 * kh + y) * kw_ + x) * 4 + i % 4
    if layout == "transposed_thin_bias":  # then one float4 of biases
        return kw["taps"] * 4 + np.arange(shape[0])
    raise ValueError(f"unknown GPU weight layout {layout!r}")


@dataclass
class WeightRef:
    """Where a decoded weight lives: object, layout, index map (for write-back)."""

    node: int
    object: str
    layout: str
    index: np.ndarray
    value: Value


def _decode(obj: GpuObject, layout: str, shape: tuple, where: str, **kw) -> tuple[np.ndarray, np.ndarray]:
    n = 1
    for d in shape:
        n *= int(d)
    if n > obj.flat.size:  # each weight has its own slot: refuse before building a huge index map
        raise ModelFormatError(f"{where}: a {layout} weight of shape {list(shape)} has {n} values, "
                               f"but the object holds only {obj.flat.size}")
    idx = weight_index(layout, shape, **kw)
    if idx.size and int(idx.max()) >= obj.flat.size:
        raise ModelFormatError(f"{where}: a {layout} weight of shape {list(shape)} needs {int(idx.max()) + 1} values, "
                               f"but the object holds {obj.flat.size}")
    return obj.flat[idx].astype(np.float32), idx


# --- graph ---------------------------------------------------------------------

def _code_group(code: str) -> int:
    """Output slices per weight group of a general convolution kernel (its accumulators ``r_..._s<k>``)."""
    ks = [int(k) for k in re.findall(r"\br_w\d+_h\d+_s(\d+)\b", code)]
    return max(ks) + 1 if ks else 1


def _binary_links(node: GpuNode) -> list[bool]:
    """For each linked op (1-based position N), whether it reads a second tensor."""
    out = []
    for n in range(1, len(node.ops)):
        keys = (f"second_tensor_link{n}_", f"src_data_1_link{n}_")
        out.append(any(k.startswith(keys) for k in node.ints))
    return out


class _Builder:
    def __init__(self, gen: Generation, label: str):
        self.gen = gen
        self.label = label
        self.values: dict[int, Value] = {}
        self.all_values: list[Value] = []
        self.nodes: list[Node] = []
        self.weights: list[WeightRef] = []

    def const(self, node: GpuNode, obj_name: str, layout: str, shape: tuple, pname: str, **kw) -> Value:
        where = f"{self.label}node {node.index} ({node.name})"
        obj = node.objects.get(obj_name)
        if obj is None:
            raise ModelFormatError(f"{where}: object {obj_name!r} is missing")
        data, idx = _decode(obj, layout, shape, f"{where}: {obj_name}", **kw)
        v = Value(pname if "/" in pname else f"{node.ops[0][0]} {node.ops[0][1]}/{pname}", np.dtype(np.float32),
                  tuple(shape), data=data)
        self.all_values.append(v)
        self.weights.append(WeightRef(node.index, obj_name, layout, idx, v))
        return v

    def temp(self, like: Value, name: str) -> Value:
        v = Value(name, like.dtype, like.shape)
        self.all_values.append(v)
        return v


def _tensor_values(ic, gen: Generation, label: str) -> dict[int, Value]:
    out = {}
    for i in range(ic.TensorsLength()):
        t = ic.Tensors(i)
        d = t.Desc()
        s = d.Shape() if d is not None else None
        if s is None:
            raise ModelFormatError(f"{label}tensors[{i}] has no shape")
        b, h, w, dd, c = s.B(), s.H(), s.W(), s.D(), s.C()
        shape = (b, h, w, c)
        _verify.check_shape(shape, f"{label}tensors[{i}] (id {t.Id()})")
        if min(shape) < 1 or dd not in (0, 1):
            raise ModelFormatError(f"{label}tensors[{i}] (id {t.Id()}) has shape BHWDC {[b, h, w, dd, c]}; "
                                   "fbjax reads 2-D tensors with positive sizes")
        if t.Id() in out:
            raise ModelFormatError(f"{label}tensor id {t.Id()} appears twice in tensors")
        out[t.Id()] = Value(f"t{t.Id()}", np.dtype(np.float32), shape, index=t.Id())
    return out


def _get(values: dict, vid: int, where: str) -> Value:
    v = values.get(vid)
    if v is None:
        raise ModelFormatError(f"{where} refers to tensor id {vid}, which is not in tensors")
    return v


def read(source) -> ModelIR:
    """Parse a serialized GPU delegate model into the IR (op set ``"gpu"``).

    Args:
        source: path or bytes.

    Returns:
        a :class:`ModelIR` with ``format="gpu_cl"``; ``metadata`` holds
        ``generation``, ``precision``, ``storage_type``, the parsed ``nodes``
        (:class:`GpuNode`), ``weights`` (:class:`WeightRef`, for
        write-back), ``driver_version`` (str, or None before TF 2.7) and
        ``binary_programs`` (``[(fingerprint, size in bytes)]`` of the
        compiled programs, TF 2.7 and LiteRT).

    Raises:
        ModelFormatError: no generation matches, or the file contradicts
            itself (a missing object, a weight object too small for the
            tensors' channel counts, an unknown tensor id).
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        buf, path = bytes(source), None
    else:
        path = os.fspath(source)
        with open(path, "rb") as f:
            buf = f.read()
    label = f"{path}: " if path else ""
    gen = detect_generation(buf, path)
    root = gen.module.InferenceContext.GetRootAs(buf, 0)
    ic = _graph(gen, root)
    b = _Builder(gen, label)
    values = _tensor_values(ic, gen, label)
    b.all_values.extend(values.values())
    gnodes = parse_nodes(ic, gen, label)
    unknown = [(n, op) for n in gnodes for op, _ in n.ops if op not in KNOWN_OPS]
    if unknown:
        from collections import Counter

        raise UnsupportedOperatorError(Counter((OP_SET, op) for _, op in unknown), detail=(
            f"{label}GPU node(s) of a kind fbjax does not read: "
            + "; ".join(f"node {n.index} ({n.name!r}): {op}" for n, op in unknown[:10])
            + ("" if len(unknown) <= 10 else f"; and {len(unknown) - 10} more")))
    for node in gnodes:
        _lower_node(b, node, values)
    in_ids = [int(x) for x in ic.InputIdsAsNumpy()] if ic.InputIdsLength() else []
    out_ids = [int(x) for x in ic.OutputIdsAsNumpy()] if ic.OutputIdsLength() else []
    if gen.name == "seed":
        in_names, out_names = [f"id{i}" for i in in_ids], [f"id{i}" for i in out_ids]
    else:
        in_refs = [int(x) for x in ic.InputRefsAsNumpy()] if ic.InputRefsLength() else []
        out_refs = [int(x) for x in ic.OutputRefsAsNumpy()] if ic.OutputRefsLength() else []
        if len(in_refs) != len(in_ids) or len(out_refs) != len(out_ids):
            raise ModelFormatError(f"{label}input_refs/output_refs ({len(in_refs)}/{len(out_refs)}) do not match "
                                   f"input_ids/output_ids ({len(in_ids)}/{len(out_ids)})")
        in_names, out_names = [str(r) for r in in_refs], [str(r) for r in out_refs]
    inputs = []
    for vid, name in zip(in_ids, in_names):
        v = _get(values, vid, f"{label}input_ids")
        v.name = name
        inputs.append(v)
    outputs = []
    for vid, name in zip(out_ids, out_names):
        v = _get(values, vid, f"{label}output_ids")
        if v not in inputs:
            v.name = name
        outputs.append(v)
    _check_order(b.nodes, inputs, label)
    g = Graph("main", inputs, outputs, b.nodes, b.all_values)
    if gen.name == "litert":  # per operation: the first one's; storage: the graph tensors'
        d = ic.Nodes(0).GpuOp().Definition() if ic.NodesLength() and ic.Nodes(0).GpuOp() else None
        prec = d.Precision() if d is not None else 0
        t0 = ic.Tensors(0).Desc() if ic.TensorsLength() and ic.Tensors(0).Desc() else None
        storage = t0.StorageType() if t0 is not None else 0
    else:
        prec, storage = root.Precision(), root.StorageType()
    meta = {"generation": gen.name, "precision": PRECISIONS.get(prec, str(prec)),
            "storage_type": STORAGE.get(storage, str(storage)),
            "nodes": gnodes, "weights": b.weights, "size": len(buf)}
    meta["driver_version"], meta["binary_programs"] = _programs(root)
    return ModelIR("gpu_cl", [g], description=f"TFLite GPU delegate (OpenCL) serialized model, generation {gen.name}",
                   source=path, buffer=buf, metadata=meta)


def _check_order(nodes: list, inputs: list, label: str) -> None:
    """Every node input is a graph input, a constant or an earlier node's output."""
    ready = {id(v) for v in inputs}
    for n in nodes:
        for v in n.inputs:
            if v is not None and v.data is None and id(v) not in ready:
                raise ModelFormatError(f"{label}{n.location} reads {v.name}, which no earlier node writes "
                                       "(nodes out of order, or a tensor never computed)")
        ready.update(id(v) for v in n.outputs)


# --- node kinds ----------------------------------------------------------------

def _kernel_attrs(ints: dict, n: int = 1) -> dict:
    return {"kernel": (ints.get("kernel_size_y", 1), ints.get("kernel_size_x", 1)),
            "strides": (ints.get("stride_y", 1), ints.get("stride_x", 1)),
            "dilations": (ints.get("dilation_y", 1), ints.get("dilation_x", 1)),
            "padding": (-ints.get("padding_y", 0), -ints.get("padding_x", 0))}


def _lower_node(b: _Builder, node: GpuNode, values: dict) -> None:
    where = f"{b.label}node {node.index} ({node.name})"
    op, _gid = node.ops[0]
    ins = [_get(values, i, where) for i in node.input_ids]
    outs = [_get(values, i, where) for i in node.output_ids]
    if len(outs) != 1:
        raise ModelFormatError(f"{where}: has {len(outs)} outputs; GPU kernels write one tensor")
    binary = _binary_links(node)
    n_link_ins = sum(binary)
    n_main = len(ins) - n_link_ins
    if n_main < 1:
        raise ModelFormatError(f"{where}: {len(ins)} inputs for an op and {n_link_ins} linked binary ops")
    main_ins, link_ins = ins[:n_main], ins[n_main:]
    out = outs[0]
    final = out
    chain_out = out if len(node.ops) == 1 else b.temp(out, f"{node.name}/{op}")
    attrs, extra = _main_op(b, node, op, main_ins, chain_out, where)
    attrs["gpu_node"] = node.name
    attrs["gpu_index"] = node.index
    loc = f"node {node.index} ({node.name})"
    b.nodes.append(Node(OP_SET, op, [*main_ins, *extra], [chain_out], attrs, location=loc))
    cur = chain_out
    k = 0
    for n, (lop, _lid) in enumerate(node.ops[1:], start=1):
        dst = final if n == len(node.ops) - 1 else b.temp(out, f"{node.name}/{lop}")
        lin = [cur]
        if binary[n - 1]:
            lin.append(link_ins[k])
            k += 1
        lattrs, lextra = _link_op(b, node, lop, n, cur, where)
        lattrs["gpu_node"] = node.name
        lattrs["gpu_index"] = node.index
        b.nodes.append(Node(OP_SET, lop, [*lin, *lextra], [dst], lattrs, location=f"{loc}, linked op {n}"))
        cur = dst


def _unsupported(where: str, op: str, variant: str) -> UnsupportedOperatorError:
    """A kernel variant whose weights fbjax does not decode: the op type and node are named."""
    return UnsupportedOperatorError({(OP_SET, f"{op} ({variant})"): 1}, detail=f"{where}: {op} with {variant}.")


def _linear(b, node, name, c, pname, shape=None):
    return b.const(node, name, "linear", shape or (c,), pname)


def _main_op(b: _Builder, node: GpuNode, op: str, ins: list, out: Value, where: str):
    """(attrs, extra constant inputs) of a node's own op; weights decoded from its objects."""
    ints, objs, code = node.ints, node.objects, node.code
    c_out = out.shape[3]
    c_in = ins[0].shape[3]
    if op == "convolution_2d":
        if "weights" not in objs and len(ins) == 1 and "biases" not in objs:
            # ConverterToConvWeights: reorders a runtime OHWI filter (as a B=O, H, W, C=I tensor) into the
            # convolution weight layout; in the IR its output is that filter, OHWI
            out.shape = ins[0].shape
            return {"variant": "converter"}, []
        if "weights" not in objs:  # weights from the second input (a converter's output), OHWI
            if len(ins) != 2 or "biases" not in objs:
                raise ModelFormatError(f"{where}: a convolution with neither weights nor a runtime filter input")
            attrs = _kernel_attrs(ints)
            attrs["kernel"] = tuple(ins[1].shape[1:3])
            attrs["variant"] = "runtime_weights"
            return attrs, [_linear(b, node, "biases", c_out, "bias")]
        attrs = _kernel_attrs(ints)
        kh, kw = attrs["kernel"]
        obj = objs["weights"]
        if obj.kind != "buffer":
            raise _unsupported(where, "convolution_2d", f"weights in {obj.kind} objects")
        group = _code_group(code)
        layout = "conv_o4i4" if re.search(r"\bdot\(", code) else "conv_i4o4"
        need = -(-_slices(c_out) // group) * group * kh * kw * _slices(c_in) * 16
        if obj.flat.size != need:
            raise ModelFormatError(f"{where}: weights hold {obj.flat.size} values; a {kh}x{kw} convolution "
                                   f"{c_in}->{c_out} channels in groups of {group} output slices needs {need} "
                                   "(Winograd or another layout fbjax does not decode)")
        w = b.const(node, "weights", layout, (c_out, kh, kw, c_in), "weights", group=group)
        bias = _linear(b, node, "biases", c_out, "bias")
        attrs["variant"] = "general" if "kernel_size_x" in ints else "1x1"
        return attrs, [w, bias]
    if op == "depthwise_convolution":
        if c_out != c_in:
            raise _unsupported(where, "depthwise_convolution", "channel multiplier != 1")
        if "biases" in objs:
            attrs = _kernel_attrs(ints)
            kh, kw = attrs["kernel"]
            w = b.const(node, "weights", "dw", (1, kh, kw, c_out), "weights")
            bias = _linear(b, node, "biases", c_out, "bias")
            attrs["variant"] = "general"
        else:  # DepthwiseConv3x3: stride 1, padding 1, weights and bias packed together
            attrs = {"kernel": (3, 3), "strides": (1, 1), "dilations": (1, 1), "padding": (1, 1), "variant": "3x3"}
            w = b.const(node, "weights", "dw3x3", (1, 3, 3, c_out), "weights")
            bias = b.const(node, "weights", "dw3x3_bias", (c_out,), "bias")
        return attrs, [w, bias]
    if op == "fully_connected":
        w = b.const(node, "weights", "fc", (c_out, c_in), "weights")
        bias = _linear(b, node, "biases", c_out, "bias")
        return {}, [w, bias]
    if op == "prelu":
        return {}, [_linear(b, node, "alpha", c_out, "alpha", (1, 1, c_out))]
    if op == "pooling_2d":
        attrs = _kernel_attrs(ints)
        attrs["kind"] = "max" if re.search(r"\bmax\(", code) else "average"
        return attrs, []
    if op == "relu":
        return _relu_attrs(node, "", code), []
    if op == "resize":
        return {"method": "nearest" if "bilinear" not in code and "mix(" not in code and "st.x" not in code
                else "bilinear", "half_pixel": "+ 0.5f" in code or "0.5f)" in code,
                "scale": (node.floats.get("scale_factor_y", 1.0), node.floats.get("scale_factor_x", 1.0))}, []
    if op == "pad":
        return {"prepended": (ints.get("prepended_y", 0), ints.get("prepended_x", 0), ints.get("prepended_z", 0))}, []
    if op == "slice":
        return {"offsets": (ints.get("offset_y", 0), ints.get("offset_x", 0), ints.get("offset_z", 0)),
                "strides": (ints.get("stride_y", 1), ints.get("stride_x", 1))}, []
    if op == "convolution_transposed":
        m = re.search(r"float r\[(\d+)\]\[(\d+)\];", code)
        sx = re.search(r"X \*= (\d+);", code)
        if not m or not sx or c_out != 1 or "weights" not in objs:
            raise _unsupported(where, "convolution_transposed", "a kernel other than ConvolutionTransposedThin "
                               "with one output channel")
        kh, kw, s_ = int(m.group(1)), int(m.group(2)), int(sx.group(1))
        w = b.const(node, "weights", "transposed_thin", (c_out, kh, kw, c_in), "weights")
        bias = b.const(node, "weights", "transposed_thin_bias", (c_out,), "bias", taps=kh * kw * _slices(c_in))
        return {"kernel": (kh, kw), "strides": (s_, s_), "variant": "thin"}, [w, bias]
    return {}, []


def _relu_attrs(node: GpuNode, suffix: str, code: str) -> dict:
    return {"clip": float(node.floats.get(f"clip{suffix}", 0.0)), "alpha": float(node.floats.get(f"alpha{suffix}", 0.0))}


def _link_op(b: _Builder, node: GpuNode, op: str, n: int, x: Value, where: str):
    """(attrs, extra constant inputs) of linked op ``n``; params named ``"<op> <id>/<weight>"`` by the linked op."""
    c = x.shape[3]
    if op == "prelu":
        lop, lid = node.ops[n]
        return {}, [b.const(node, f"alpha_link{n}", "linear", (1, 1, c), f"{lop} {lid}/alpha")]
    if op == "relu":
        return _relu_attrs(node, f"_link{n}", node.code), []
    return {}, []


# --- inspection ----------------------------------------------------------------

def _variant(ir: ModelIR, node: GpuNode) -> str:
    for n in ir.main_graph.nodes:
        if n.attrs.get("gpu_index") == node.index and "variant" in n.attrs:
            return str(n.attrs["variant"])
    return ""


def _listed_name(node: GpuNode) -> str:
    """A node's name as ``fbjax inspect`` lists it: its ops joined by ``" -> "``."""
    return " -> ".join(f"{op} {i}" for op, i in node.ops)


def find_node(ir: ModelIR, key: str) -> GpuNode:
    """The node a user names: its position (``"3"``), its name as stored
    (``"conv 12 linked : relu 13"``) or as ``fbjax inspect`` lists it
    (``"conv 12 -> relu 13"``), or the name of its first op (``"conv 12"``).

    Raises:
        KeyError: no node matches; the message lists a few names.
    """
    nodes = ir.metadata["nodes"]
    key = key.strip()
    if key.isdigit() and int(key) < len(nodes):
        return nodes[int(key)]
    for n in nodes:
        if key in (n.name, n.name.split(" linked : ")[0], _listed_name(n)):
            return n
    raise KeyError(f"no node {key!r}; give a position 0..{len(nodes) - 1} or a name such as "
                   f"{', '.join(repr(n.name.split(' linked : ')[0]) for n in nodes[:3])}")


def describe(ir: ModelIR) -> str:
    """What ``fbjax inspect`` prints for a ``.bin``: generation, precision, storage, nodes, tensors, weights."""
    md = ir.metadata
    lines = [f"generation: {md['generation']}  precision: {md['precision']}  storage: {md['storage_type']}"]
    if md.get("driver_version") is not None or md.get("binary_programs"):
        progs = md.get("binary_programs", [])
        lines.append(f"driver version: {md.get('driver_version') or '(none)'}; compiled programs: {len(progs)} "
                     f"({format_bytes(sum(n for _, n in progs))}), kept as stored")
    weight_bytes = sum(o.flat.nbytes for n in md["nodes"] for o in n.objects.values())
    lines.append(f"weight objects: {format_bytes(weight_bytes)} stored; decoded weights: "
                 f"{sum(w.value.data.size for w in md['weights']):,} values")
    lines.append(f"nodes ({len(md['nodes'])}):")
    for n in md["nodes"]:
        ops = _listed_name(n)
        var = _variant(ir, n)
        lines.append(f"  [{n.index}] {ops}" + (f"  ({var})" if var else "")
                     + f"  in {n.input_ids} out {n.output_ids}  work group {n.work_group_size} grid {n.grid_size}"
                     + (f"  program {n.fingerprint:#018x}" if n.fingerprint is not None else ""))
        for name, o in sorted(n.objects.items()):
            lines.append(f"        {name}: {o.kind} {o.dtype.name} x {o.flat.size} ({format_bytes(o.flat.nbytes)}) "
                         + " ".join(f"{k}={v}" for k, v in o.info.items()))
        args = {k: v for k, v in n.ints.items() if not k.startswith(("src_tensor", "dst_tensor", "task_size"))}
        if args or n.floats:
            lines.append("        args: " + " ".join(f"{k}={v}" for k, v in {**args, **n.floats}.items()))
    lines.append("tensors:")
    for v in ir.main_graph.values:
        if v.data is None and v.index >= 0:
            lines.append(f"  id {v.index}: {v.name} {list(v.shape)}")
    return "\n".join(lines)

