"""The container: schema generations of the serialized ``InferenceContext`` and how to tell them apart.

The files carry no identifier. :func:`detect_generation` verifies the bytes
against each schema fbjax has (``schemas/gpu_cl_*.fbs``); each
:class:`Generation` also says where that generation keeps what the reader
needs (the graph table, the graph's input/output names, precision and
storage, the compiled programs, the weight-object kinds), so the rest of the
reader asks the generation instead of testing its name.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from ...errors import ModelFormatError
from .. import verify as _verify
from .._generated import gpu_cl_litert_generated as _GL
from .._generated import gpu_cl_seed_generated as _GS
from .._generated import gpu_cl_tf25_generated as _G25
from .._generated import gpu_cl_tf27_generated as _G27

#: TF 2.5's delegate writes this enum field from uninitialised memory (values -1..-4).
UNCHECKED_ENUMS = (("Texture2DDescriptor", "normalized_type"),)

#: ``CalculationsPrecision`` values as the delegate names them
PRECISIONS = {0: "F32", 1: "F32_F16", 2: "F16"}
#: ``TensorStorageType`` values as the delegate names them
STORAGE = {0: "UNKNOWN", 1: "BUFFER", 2: "IMAGE_BUFFER", 3: "TEXTURE_2D", 4: "TEXTURE_3D", 5: "TEXTURE_ARRAY",
           6: "SINGLE_TEXTURE_2D"}

_ALL_OBJECTS = (("buffer", "BufferObjects"), ("texture2d", "Texture2dObjects"),
                ("tensor_linear", "TensorLinearObjects"), ("tensor", "TensorObjects"))


class _EmptyGraph:
    """A LiteRT root without ``gpu_model``: a graph of no nodes (detection refuses it)."""

    def NodesLength(self):
        return 0


def _root_graph(root):
    return root


def _gpu_model_graph(root):
    g = root.GpuModel()
    return _EmptyGraph() if g is None else g


def _root_precision_storage(root, graph) -> tuple[int, int]:
    return root.Precision(), root.StorageType()


def _litert_precision_storage(root, graph) -> tuple[int, int]:
    """LiteRT: precision per operation (the first one's), storage per tensor (the first graph tensor's)."""
    d = graph.Nodes(0).GpuOp().Definition() if graph.NodesLength() and graph.Nodes(0).GpuOp() else None
    t0 = graph.Tensors(0).Desc() if graph.TensorsLength() and graph.Tensors(0).Desc() else None
    return (d.Precision() if d is not None else 0), (t0.StorageType() if t0 is not None else 0)


@dataclass(frozen=True)
class Generation:
    """One schema generation of the serialized InferenceContext, and where it keeps each thing.

    Attributes:
        name: ``"seed"``, ``"tf2.5"``, ``"tf2.7"`` or ``"litert"``.
        schema: the :mod:`fbjax.formats.verify` schema name.
        module: the flatc bindings.
        root_fields: fields of ``InferenceContext`` in this schema (a file with more is another generation).
        dtypes: ``DataType`` value -> numpy dtype (the enum was renumbered after the seed generation).
        graph: ``graph(root)`` -> the table holding ``nodes`` / ``tensors`` / ``input_ids``...: the root, or
            (LiteRT) its ``gpu_model``.
        precision_storage: ``fn(root, graph) -> (precision, storage type)`` enum values.
        shared_slots: scalar arguments also sit in ``shared_int4s`` / ``shared_float4s`` (seed), which must agree.
        refs: the graph names its inputs/outputs by ``input_refs`` / ``output_refs`` (TFLite tensor
            indices); without them (seed) they are named ``"id<value id>"``.
        programs: the root has ``driver_version`` and compiled ``binary_programs``.
        node_fingerprint: each node names its compiled program (``CLNode.fingerprint``, TF 2.7).
        object_kinds: ``((kind, Arguments accessor), ...)``: the weight-object maps this generation has.
    """

    name: str
    schema: str
    module: object
    root_fields: int
    dtypes: dict
    graph: Callable = _root_graph
    precision_storage: Callable = _root_precision_storage
    shared_slots: bool = False
    refs: bool = True
    programs: bool = False
    node_fingerprint: bool = False
    object_kinds: tuple = _ALL_OBJECTS

    def root(self, buf):
        """The root ``InferenceContext`` table of ``buf`` (already verified)."""
        return self.module.InferenceContext.GetRootAs(buf, 0)


GENERATIONS = (
    Generation("seed", "gpu_cl_seed", _GS, 11, {1: np.dtype("<f4"), 2: np.dtype("<f2")}, shared_slots=True,
               refs=False),
    Generation("tf2.5", "gpu_cl_tf25", _G25, 14, {1: np.dtype("<f2"), 2: np.dtype("<f4")}),
    Generation("tf2.7", "gpu_cl_tf27", _G27, 16, {1: np.dtype("<f2"), 2: np.dtype("<f4")}, programs=True,
               node_fingerprint=True),
    Generation("litert", "gpu_cl_litert", _GL, 5, {1: np.dtype("<f2"), 2: np.dtype("<f4")}, graph=_gpu_model_graph,
               precision_storage=_litert_precision_storage, programs=True,
               object_kinds=(("buffer", "BufferObjects"), ("tensor", "TensorObjects"))),
)


def root_unknown_fields(buf, n_fields: int) -> list[int]:
    """Slots of the root table beyond the schema's ``n_fields`` that hold a value."""
    root = struct.unpack_from("<I", buf, 0)[0]
    vt = root - struct.unpack_from("<i", buf, root)[0]
    vsize = struct.unpack_from("<H", buf, vt)[0]
    return [s for s in range(n_fields, (vsize - 4) // 2) if struct.unpack_from("<H", buf, vt + 4 + 2 * s)[0]]


def detect_generation(buf, label: Optional[str] = None) -> Generation:
    """The schema generation ``buf`` is a valid InferenceContext of.

    A generation matches when the verifier accepts the file, the root table
    has no field the schema does not know and the graph has nodes.

    Raises:
        ModelFormatError: no generation matches; the message gives each one's reason.
    """
    reasons = []
    for gen in GENERATIONS:
        try:
            _verify.verify(buf, gen.schema, unchecked_enums=UNCHECKED_ENUMS)
        except ModelFormatError as e:
            reasons.append(f"{gen.name}: {e}")
            continue
        extra = root_unknown_fields(buf, gen.root_fields)
        if extra:
            reasons.append(f"{gen.name}: InferenceContext has fields in slots {extra} this generation does not define")
            continue
        if not gen.graph(gen.root(buf)).NodesLength():
            reasons.append(f"{gen.name}: read this way the graph has no nodes")
            continue
        return gen
    pre = f"{label}: " if label else ""
    raise ModelFormatError(f"{pre}not a TFLite GPU delegate (OpenCL) serialized model of any known generation "
                           f"({', '.join(g.name for g in GENERATIONS)}): " + "; ".join(reasons))


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


def programs(gen: Generation, root) -> tuple[Optional[str], list]:
    """``driver_version`` and the compiled programs ``[(fingerprint, size in bytes)]`` (TF 2.7 / LiteRT);
    ``(None, [])`` for generations without them."""
    if not gen.programs:
        return None, []
    dv = root.DriverVersion()
    progs = []
    for j in range(root.BinaryProgramsLength()):
        p = root.BinaryPrograms(j)
        progs.append((p.Fingerprint(), p.BinaryLength()))
    return (dv.decode("utf-8", "replace") if dv is not None else None), progs


def precision_storage(gen: Generation, root, graph) -> tuple[str, str]:
    """The file's calculation precision and tensor storage type as the delegate names them (``"F32"``, ``"BUFFER"``)."""
    prec, storage = gen.precision_storage(root, graph)
    return PRECISIONS.get(prec, str(prec)), STORAGE.get(storage, str(storage))
