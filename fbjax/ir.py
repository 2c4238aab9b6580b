"""Format-neutral graph IR that every frontend fills and every backend reads.

A :class:`ModelIR` holds one or more :class:`Graph` s (TFLite subgraphs,
RTen nested graphs, StableHLO functions and region bodies). A graph is a
topologically ordered list of :class:`Node` s over :class:`Value` s. Values
carry dtype, static shape (``None`` for a dimension unknown until call time),
optional quantization parameters and optional constant data (numpy arrays,
usually zero-copy views on the model file).

Nothing here knows about JAX; the lowering (:mod:`fbjax.lower`) and the numpy
reference interpreter (:mod:`fbjax.reference`) both consume this IR.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np

Shape = Optional[tuple[Optional[int], ...]]

#: Name suffix of the int32 count output that ``fbjax.load(static_bounds=True)``
#: (:func:`fbjax.passes.shapes.add_valid_counts`) appends to an op whose output size
#: depends on values; the op's lowering and numpy twin recognize it by it.
VALID_COUNT_SUFFIX = ":valid_count"

#: Default byte budget of one value a model computes (an op's output, a
#: constant computed ahead, a range or fill whose size the file's values
#: decide): 4 GiB. ``fbjax.load(path, max_value_bytes=N)`` changes it for a
#: real model that needs more; values over it are refused at load with a
#: ModelFormatError naming the node (:meth:`OpContext.check_size`).
MAX_VALUE_BYTES = 1 << 32


def value_size_problem(shape, dtype, max_bytes: int = MAX_VALUE_BYTES) -> Optional[str]:
    """Why a value of ``shape`` and ``dtype`` may not be made, or None.

    Counts in Python integers (no overflow); symbolic dimensions (a
    ``jax.export`` batch) count as 1. Says so when the element count does
    not fit in 64 bits (XLA aborts the process on such a shape) or when the
    value would take more than ``max_bytes`` bytes.
    """
    n = 1
    for d in shape:
        if isinstance(d, (int, np.integer)):  # (a symbolic dimension is not: it counts as 1)
            n *= max(int(d), 0)
    if n >= 1 << 63:
        return f"shape {list(shape)} has {n} elements, more than a 64-bit count holds"
    nbytes = n * np.dtype(dtype).itemsize
    if nbytes > max_bytes:
        return (f"shape {list(shape)} of {np.dtype(dtype).name} takes {nbytes} bytes, over the budget of "
                f"{max_bytes} bytes for one value (a real model that needs more: "
                f"fbjax.load(path, max_value_bytes=N))")
    return None


def has_valid_count(node) -> bool:
    """``node`` was given a trailing int32 scalar :data:`VALID_COUNT_SUFFIX`
    output (static-bound mode): it returns outputs padded to their bound."""
    o = node.outputs[-1] if node.outputs else None
    return o is not None and o.name.endswith(VALID_COUNT_SUFFIX) and o.shape == ()


@dataclass(eq=False)
class QuantParams:
    """Affine quantization: ``real = (q - zero_point) * scale``.

    ``scale`` (float32) and ``zero_point`` (int64) are 1-D; length 1 means
    per-tensor, otherwise per-channel along ``quantized_dimension``.
    Blockwise quantization (TFLite ``BlockwiseQuantization``: litert-torch's
    ``dynamic_int4_block32``) has ``block_size > 0`` and a 2-D ``scale``
    ``[rows, columns // block_size]``: one scale per row and block of
    ``block_size`` consecutive values along the last axis (zero points 0).
    """

    scale: np.ndarray
    zero_point: np.ndarray
    quantized_dimension: int = 0
    block_size: int = 0

    @property
    def per_channel(self) -> bool:
        return self.scale.size > 1


@dataclass(eq=False)
class Value:
    """A tensor in a graph.

    Attributes:
        name: the name stored in the file (may be empty or repeated there).
        dtype: numpy dtype of the elements.
        shape: static shape; a ``None`` entry is a dimension known only at
            call time; ``shape is None`` means unknown rank.
        quant: quantization parameters, if the tensor is quantized.
        data: constant contents with ``dtype`` and ``shape``, else ``None``
            (a property: a constant that :meth:`release_data` dropped is
            computed again from the file's bytes when read; test constness
            with :attr:`is_constant`, which computes nothing).
        index: the tensor's index in the source file (for error messages).
        is_variable: a TFLite variable tensor (state kept between calls).
        storage_bits: for a constant the file stores narrower than
            ``dtype`` (TFLite ``INT4``: two values per byte, ``data``
            unpacked to int8), its bits per value; 0 otherwise. The lowering
            keeps such a weight buffer packed on the device
            (:func:`fbjax.lower.build.buffer_array`).
    """

    name: str
    dtype: np.dtype
    shape: Shape
    quant: Optional[QuantParams] = None
    data: Optional[np.ndarray] = None
    index: int = -1
    is_variable: bool = False
    storage_bits: int = 0

    @property
    def is_constant(self) -> bool:
        """Whether the value is a constant (without computing ``data`` that was released)."""
        return self.__dict__.get("_data") is not None or self.__dict__.get("_source") is not None

    @property
    def data_key(self) -> int:
        """An identity of this constant's contents, shared by the Values that
        hold one array (subgraphs that read one file buffer) and stable
        across :meth:`release_data` (where ``id(data)`` is not: a released
        constant is a new array at each read)."""
        src = self.__dict__.get("_source")
        return id(src) if src is not None else id(self.__dict__.get("_data"))

    def set_data_source(self, source: "DataSource") -> None:
        """Record how ``data`` can be computed again from the file's bytes
        (a constant the file stores in another form, e.g. TFLite ``INT4``
        packed two per byte), so that :meth:`release_data` may drop it."""
        self.__dict__["_source"] = source

    def release_data(self) -> bool:
        """Drop ``data`` where :meth:`set_data_source` says how to compute it
        again; a later read of ``data`` computes it (and while someone holds
        that array, reads return the same one). Returns whether it dropped
        anything. (An LLM bundle's int4 weights after load: the device holds
        them packed, the programs take them as arguments.)"""
        src = self.__dict__.get("_source")
        d = self.__dict__.get("_data")
        if src is None or d is None:
            return False
        src.remember(d)
        self.__dict__["_data"] = None
        return True

    @property
    def static_shape(self) -> bool:
        return self.shape is not None and all(d is not None for d in self.shape)

    def __repr__(self) -> str:  # keep reprs short: data can be megabytes
        dims = "?" if self.shape is None else "x".join("?" if d is None else str(d) for d in self.shape)
        const = " const" if self.is_constant else ""
        return f"Value({self.name!r}, {np.dtype(self.dtype).name}[{dims}]{const})"


def _value_data(self) -> Optional[np.ndarray]:
    d = self.__dict__.get("_data")
    if d is None:
        src = self.__dict__.get("_source")
        if src is not None:
            return src()
    return d


def _set_value_data(self, data) -> None:
    self.__dict__["_data"] = data
    self.__dict__["_source"] = None


Value.data = property(_value_data, _set_value_data, doc="constant contents with ``dtype`` and ``shape``, else None "
                      "(computed again on reading after :meth:`Value.release_data`)")


class DataSource:
    """``source() -> array``: a constant's contents computed from the file's
    bytes (``compute``), the array last computed kept while anyone holds it
    (a weak reference), so Values that share one (a buffer that several
    subgraphs read) return one array."""

    def __init__(self, compute: Callable[[], np.ndarray]):
        self._compute = compute
        self._last = None

    def remember(self, data: np.ndarray) -> None:
        """The array ``data`` is (while it lives, calls return it)."""
        self._last = weakref.ref(data)

    def __getstate__(self) -> dict:  # (pickled without the weak reference: it is only a cache)
        return {"_compute": self._compute, "_last": None}

    def __call__(self) -> np.ndarray:
        d = self._last() if self._last is not None else None
        if d is None:
            d = self._compute()
            self._last = weakref.ref(d)
        return d


@dataclass(eq=False)
class Node:
    """One operator application.

    Attributes:
        op_set: which registry the op belongs to (``"tflite"``,
            ``"tflite.custom"``, ``"onnx"``, ``"stablehlo"``).
        op_name: the op's name exactly as its spec spells it.
        inputs: input values in spec order; ``None`` marks an omitted
            optional input.
        outputs: output values in spec order (``None`` for unused outputs).
        attrs: attributes, snake_case as in the schema, enums as names.
        location: human-readable position in the file, for error messages.
        version: the operator version the file records (TFLite
            ``OperatorCode.version``; custom ops such as MediaPipe's change
            semantics between versions).
        regions: the graphs the node runs, filled by the reader: attribute
            name -> tuple of graph indices (TFLite ``*_subgraph_index``
            fields, StableHLO ``computation``/``body``/``branches``..., ONNX
            ``then_branch``/``else_branch``/``body``). Passes find every
            graph a node uses here, without knowing attribute names.
    """

    op_set: str
    op_name: str
    inputs: list
    outputs: list
    attrs: dict = field(default_factory=dict)
    location: str = ""
    version: int = 1
    regions: dict = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str]:
        return (self.op_set, self.op_name)

    def __repr__(self) -> str:
        return f"Node({self.op_set}:{self.op_name} @ {self.location})"


@dataclass(eq=False)
class Graph:
    """A function body: inputs, outputs and nodes in topological order."""

    name: str
    inputs: list
    outputs: list
    nodes: list
    values: list = field(default_factory=list)


def fill_zero_size_constants(graph: Graph) -> int:
    """Make every zero-element tensor of ``graph`` that nothing writes a constant.

    A tensor with a zero dimension (shape ``[0]``: the shape operand of a
    RESHAPE to a scalar, an empty slice list) has no bytes, so formats that
    store constants as buffers (TFLite, the StableHLO flatbuffer) give it an
    empty buffer, which reads like "no data". LiteRT allocates such a tensor
    with zero bytes and never reads it; it is a constant with no elements.
    Values that are graph inputs, operator outputs or variables keep
    ``data = None``; dimensions known only at call time are left alone.

    Returns:
        how many values became constants (``data`` = an empty array of the
        value's dtype and shape).
    """
    written = {id(v) for v in graph.inputs}
    written.update(id(o) for n in graph.nodes for o in n.outputs if o is not None)
    count = 0
    for v in graph.values:
        if (v.data is None and not v.is_variable and id(v) not in written and v.static_shape
                and 0 in v.shape and np.dtype(v.dtype) != np.object_):
            v.data = np.zeros(v.shape, v.dtype)
            count += 1
    return count


@dataclass(eq=False)
class Signature:
    """A named entry point (TFLite ``signature_defs``)."""

    key: str
    graph_index: int
    inputs: dict  # signature-level name -> Value
    outputs: dict


@dataclass(eq=False)
class ModelIR:
    """A parsed model file.

    Attributes:
        format: ``"tflite"``, ``"rten"`` or ``"stablehlo"``.
        graphs: all graphs; ``graphs[main]`` is the entry point, the others
            are bodies referenced by control-flow ops.
        signatures: named entry points, possibly empty.
        description: free text from the file.
        source: where the model was read from (path), if anywhere.
        buffer: the object keeping constant data alive (mmap or bytes).
        completed: whether the IR has been completed with an op registry's
            facts (:func:`fbjax.passes.reading.complete`, run by the one read
            step :func:`fbjax.passes.reading.read` that :func:`fbjax.loading.read`
            and the numpy reference use): region arities checked, open
            output dtypes filled. A reader returns False;
            :func:`fbjax.lower.build.build` takes completed IR only.
    """

    format: str
    graphs: list
    main: int = 0
    signatures: dict = field(default_factory=dict)
    description: str = ""
    source: Optional[str] = None
    buffer: Any = None
    metadata: dict = field(default_factory=dict)
    completed: bool = False

    @property
    def main_graph(self) -> Graph:
        return self.graphs[self.main]

    def iter_nodes(self):
        for g in self.graphs:
            yield from g.nodes


class OpContext:
    """What an op implementation may know about the node it implements.

    Both the JAX lowering and the numpy reference hand one of these as the
    first argument of every op function. Subclasses add ``call_graph`` for
    control flow.

    Attributes:
        node: the :class:`Node` being evaluated.
        model: the :class:`ModelIR` it belongs to.
    """

    def __init__(self, node: Node, model: ModelIR):
        self.node = node
        self.model = model

    @property
    def inputs(self) -> Sequence[Optional[Value]]:
        return self.node.inputs

    @property
    def outputs(self) -> Sequence[Optional[Value]]:
        return self.node.outputs

    def out_dtype(self, i: int = 0) -> np.dtype:
        return np.dtype(self.node.outputs[i].dtype)

    def quant_scale(self, i: int):
        """Input ``i``'s quantization scales as float32 numpy (the lowering's
        context may hand a layer scan's per-block scales instead)."""
        return np.asarray(self.inputs[i].quant.scale, np.float32)

    @property
    def bounded(self) -> bool:
        """The node carries a static-bound valid-count output (see
        :func:`has_valid_count`)."""
        return has_valid_count(self.node)

    #: the byte budget of one value this op may make (:func:`value_size_problem`)
    max_value_bytes: int = MAX_VALUE_BYTES

    def call_graph(self, index: int, *args):  # pragma: no cover - overridden
        raise NotImplementedError

    def check_size(self, shape, dtype, what: str = "output") -> None:
        """Refuse to make a value of ``shape`` and ``dtype`` whose size the
        file's values decide (a range, a fill, a resize), before numpy or XLA
        allocates it: raises ModelFormatError naming this node when its
        element count overflows 64 bits or it exceeds
        :attr:`max_value_bytes`."""
        why = value_size_problem(shape, dtype, self.max_value_bytes)
        if why is not None:
            raise self.error(f"{what}: {why}")

    def error(self, message: str) -> Exception:
        """A ModelFormatError naming this node; ``raise ctx.error(...)``."""
        from .errors import ModelFormatError

        return ModelFormatError(f"{self.node.location} ({self.node.op_name}): {message}")
