"""Write an MLIR StableHLO module (``jaxlib.mlir``, as ``jax.jit(...).lower``
gives it) in the prototype ``stablehlo.flatbuf`` format
(``schemas/stablehlo.fbs``) that :mod:`fbjax.formats.stablehlo` reads:
the writer beside the reader. :func:`fbjax.export.to_stablehlo_flatbuffer`
lowers a JAX function and calls :func:`module_to_stablehlo_flatbuffer`.

Only the 25 operators of the format can be written (plus constants, which
become buffers, and ``func.call``, which is inlined); a module with any
other op (``stablehlo.transpose``, ``stablehlo.compare``...) or with a type
the format lacks (bool, bf16, complex) raises :class:`ExportError` listing
every offending op. ``reduce``/``reduce_window`` bodies become extra
subgraphs after the main one, referenced by ``computation``.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Optional

import flatbuffers
import numpy as np

from ..errors import FbjaxError
from . import stablehlo as shlo_format
from ._generated import stablehlo_generated as S
from .stablehlo_attrs import MLIR_ELEMENT_TYPES

__all__ = ["ExportError", "module_to_stablehlo_flatbuffer", "StablehloFlatbufferWriter", "element_dtype",
           "tensor_shape", "dense_to_numpy"]


class ExportError(FbjaxError, NotImplementedError):
    """The function uses ops or types the target format cannot express.

    Attributes:
        ops: ``{"stablehlo.transpose": count, ...}`` of everything refused.
    """

    def __init__(self, ops: Counter, fmt: str = "stablehlo.flatbuf"):
        self.ops = dict(sorted(ops.items()))
        listing = ", ".join(f"{k} (x{c})" for k, c in self.ops.items())
        super().__init__(
            f"cannot write {len(self.ops)} op type(s) in {fmt}: {listing}. The format expresses only "
            f"{', '.join(sorted(shlo_format.OP_CODES))} (and constants), with element types "
            "f16/f32/f64/i8/i16/i32/i64/ui8/ui16/ui32/ui64."
        )


#: the element types the stablehlo.flatbuf prototype can store
_ELEMENT_TYPES = {k: MLIR_ELEMENT_TYPES[k] for k in
                  ("f16", "f32", "f64", "i8", "i16", "i32", "i64", "ui8", "ui16", "ui32", "ui64")}

_OPTIONS = {  # op name -> (OperatorOptions union tag, options class)
    name: (getattr(S.OperatorOptions, "".join(p.capitalize() for p in code.split("_")) + "Options"),
           getattr(S, "".join(p.capitalize() for p in code.split("_")) + "OptionsT"))
    for code, name in shlo_format.OP_NAMES.items()
}


def _ir():
    from jaxlib.mlir import ir

    return ir


def element_dtype(mlir_type) -> Optional[np.dtype]:
    """numpy dtype of an MLIR tensor type's element type, or None when
    ``stablehlo.flatbuf`` cannot express it."""
    ir = _ir()
    t = ir.RankedTensorType(mlir_type)
    dt = _ELEMENT_TYPES.get(str(t.element_type))
    return None if dt is None else np.dtype(dt)


def tensor_shape(mlir_type) -> Optional[tuple]:
    """Static shape of a ranked tensor type (None if any dim is dynamic)."""
    ir = _ir()
    t = ir.RankedTensorType(mlir_type)
    shape = tuple(int(d) for d in t.shape)
    if any(d < 0 for d in shape):
        return None
    return shape


def dense_to_numpy(attr, mlir_type) -> np.ndarray:
    """A ``DenseElementsAttr`` (splat or not) as a numpy array of the tensor type."""
    ir = _ir()
    dt = element_dtype(mlir_type)
    shape = tensor_shape(mlir_type)
    a = ir.DenseElementsAttr(attr)
    if a.is_splat:
        sv = a.get_splat_value()
        if np.issubdtype(dt, np.floating):
            v = np.array(ir.FloatAttr(sv).value, dt)
        else:
            iv = int(ir.IntegerAttr(sv).value)
            v = np.array(iv & ((1 << (8 * dt.itemsize)) - 1), np.uint64).astype(dt) if iv < 0 and dt.kind == "u" \
                else np.array(iv).astype(dt)
        return np.full(shape, v, dt)
    arr = np.array(a)
    if arr.dtype != dt:
        arr = arr.astype(dt)
    return arr.reshape(shape)


def _ints(attr) -> list:
    try:
        return [int(x) for x in attr]
    except TypeError:
        return [int(x) for x in np.array(attr).reshape(-1)]


class StablehloFlatbufferWriter:
    """Builds a ``stablehlo.flatbuf`` Model from MLIR StableHLO operations.

    ``add_graph(inputs, ops, outputs)`` writes one subgraph (the first call
    is subgraph 0, the entry point); region bodies are appended as further
    subgraphs. Ops the format cannot express are collected and raised
    together by :meth:`finish` as :class:`ExportError`.
    """

    def __init__(self, module=None):
        self.functions = {}
        if module is not None:
            ir = _ir()
            for op in module.body.operations:
                if op.operation.name == "func.func":
                    self.functions[ir.StringAttr(op.attributes["sym_name"]).value] = op
        self.subgraphs: list = []
        self.buffers: list = [S.BufferT()]
        self.opcodes: list = []
        self.unsupported: Counter = Counter()

    # -- helpers ----------------------------------------------------------
    def _opcode_index(self, code: int) -> int:
        if code not in self.opcodes:
            self.opcodes.append(code)
        return self.opcodes.index(code)

    class _Scope:
        def __init__(self, sg):
            self.sg = sg
            self.tensor_of: dict = {}

    def _tensor(self, scope, value, data: Optional[np.ndarray] = None) -> int:
        if data is None and value in scope.tensor_of:
            return scope.tensor_of[value]
        t = S.TensorT()
        shape = tensor_shape(value.type)
        dt = element_dtype(value.type)
        if shape is None:
            self.unsupported["dynamic shape"] += 1
            shape = tuple(max(int(d), 1) for d in _ir().RankedTensorType(value.type).shape)
        if dt is None:
            self.unsupported[f"element type {_ir().RankedTensorType(value.type).element_type}"] += 1
            dt = np.dtype(np.float32)
        t.shape = list(shape)
        t.type = shlo_format.dtype_to_datatype(dt)
        try:
            t.name = value.get_name().lstrip("%")
        except Exception:  # noqa: BLE001 - names are cosmetic
            t.name = f"t{len(scope.sg.tensors)}"
        if data is not None:
            raw = np.ascontiguousarray(np.asarray(data, dt).astype(dt.newbyteorder("<"))).view(np.uint8).reshape(-1)
            b = S.BufferT()
            b.data = raw
            self.buffers.append(b)
            t.buffer = len(self.buffers) - 1
        else:
            t.buffer = 0
        scope.sg.tensors.append(t)
        idx = len(scope.sg.tensors) - 1
        scope.tensor_of[value] = idx
        return idx

    def _lookup(self, scope, value) -> int:
        if value not in scope.tensor_of:
            self.unsupported["value captured from an enclosing scope"] += 1
            return self._tensor(scope, value)
        return scope.tensor_of[value]

    # -- graphs -------------------------------------------------------------
    def add_graph(self, inputs: Iterable, ops: Iterable, outputs: Iterable, name: str = "main") -> int:
        """Write one subgraph: ``inputs`` (MLIR values) are its inputs,
        ``ops`` are written in order, ``outputs`` (values) are its outputs.
        Returns the subgraph index."""
        sg = S.SubGraphT()
        sg.tensors, sg.operators, sg.name = [], [], name
        self.subgraphs.append(sg)
        index = len(self.subgraphs) - 1
        scope = self._Scope(sg)
        sg.inputs = [self._tensor(scope, v) for v in inputs]
        for op in ops:
            self._write_op(scope, op)
        sg.outputs = [self._lookup(scope, v) for v in outputs]
        return index

    def add_function(self, func, name: Optional[str] = None) -> int:
        """Write a ``func.func`` as a subgraph (block args in, return out)."""
        block = func.regions[0].blocks[0]
        ops = list(block.operations)
        term = ops[-1]
        return self.add_graph(list(block.arguments), ops[:-1], list(term.operands),
                              name or _ir().StringAttr(func.attributes["sym_name"]).value)

    def _add_region(self, region, name: str) -> int:
        block = region.blocks[0]
        ops = list(block.operations)
        return self.add_graph(list(block.arguments), ops[:-1], list(ops[-1].operands), name)

    def _inline_call(self, scope, op) -> None:
        ir = _ir()
        callee = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
        func = self.functions.get(callee)
        if func is None:
            self.unsupported[f"func.call @{callee} (unknown function)"] += 1
            return
        block = func.regions[0].blocks[0]
        for arg, operand in zip(block.arguments, op.operands):
            scope.tensor_of[arg] = self._lookup(scope, operand)
        ops = list(block.operations)
        for inner in ops[:-1]:
            self._write_op(scope, inner)
        for res, ret in zip(op.results, ops[-1].operands):
            scope.tensor_of[res] = self._lookup(scope, ret)
        # forget the callee's values: a second call of the same function gets fresh tensors
        for v in list(block.arguments) + [r for inner in ops[:-1] for r in inner.results]:
            scope.tensor_of.pop(v, None)

    def _write_op(self, scope, op) -> None:
        op = op.operation
        name = op.name
        if name == "stablehlo.constant":
            res = op.results[0]
            if element_dtype(res.type) is None:
                self.unsupported[f"element type {_ir().RankedTensorType(res.type).element_type}"] += 1
                return
            self._tensor(scope, res, dense_to_numpy(op.attributes["value"], res.type))
            return
        if name == "func.call":
            self._inline_call(scope, op)
            return
        if name not in shlo_format.OP_CODES:
            self.unsupported[name] += 1
            for r in op.results:  # keep later ops writable so every gap is listed
                scope.tensor_of.setdefault(r, -1)
            return
        opts = self._options(scope, op, name)
        if opts is None:  # refused (recorded in self.unsupported); keep going to list every gap
            for r in op.results:
                scope.tensor_of.setdefault(r, -1)
            return
        tag, options = opts
        o = S.OperatorT()
        o.opcodeIndex = self._opcode_index(shlo_format.OP_CODES[name])
        o.inputs = [self._lookup(scope, v) for v in op.operands]
        o.outputs = [self._tensor(scope, r) for r in op.results]
        o.operatorOptionsType = tag
        o.operatorOptions = options
        scope.sg.operators.append(o)

    def _options(self, scope, op, name):
        """(union tag, options object) for ``op``, or None if refused."""
        ir = _ir()
        from jaxlib.mlir.dialects import stablehlo as hlo

        tag, cls = _OPTIONS[name]
        o = cls()
        a = op.attributes

        def opt_ints(key):
            return _ints(a[key]) if key in a else None

        if name == "stablehlo.convolution":
            d = hlo.ConvDimensionNumbers(a["dimension_numbers"])
            o.windowStrides = opt_ints("window_strides")
            o.padding = list(np.array(a["padding"]).reshape(-1).astype(int)) if "padding" in a else None
            o.lhsDilation = opt_ints("lhs_dilation")
            o.rhsDilation = opt_ints("rhs_dilation")
            o.windowReversal = [bool(x) for x in a["window_reversal"]] if "window_reversal" in a else None
            o.inputBatchDimension = d.input_batch_dimension
            o.inputFeatureDimention = d.input_feature_dimension
            o.inputSpatialDimensions = list(d.input_spatial_dimensions)
            o.kernelInputFeatureDimension = d.kernel_input_feature_dimension
            o.kernelOutputFeatureDimension = d.kernel_output_feature_dimension
            o.kernelSpatialDimensions = list(d.kernel_spatial_dimensions)
            o.outputBatchDimension = d.output_batch_dimension
            o.outputFeatureDimension = d.output_feature_dimension
            o.outputSpatialDimensions = list(d.output_spatial_dimensions)
            o.featureGroupCount = ir.IntegerAttr(a["feature_group_count"]).value
            o.batchGroupCount = ir.IntegerAttr(a["batch_group_count"]).value
        elif name == "stablehlo.dot_general":
            if "algorithm" in a:
                self.unsupported["stablehlo.dot_general with algorithm"] += 1
                return None
            d = hlo.DotDimensionNumbers(a["dot_dimension_numbers"])
            o.lhsBatchingDimensions = list(d.lhs_batching_dimensions)
            o.rhsBatchingDimensions = list(d.rhs_batching_dimensions)
            o.lhsContractingDimensions = list(d.lhs_contracting_dimensions)
            o.rhsContractingDimensions = list(d.rhs_contracting_dimensions)
        elif name in ("stablehlo.reduce", "stablehlo.reduce_window"):
            if name == "stablehlo.reduce":
                o.dimensions = opt_ints("dimensions")
            else:
                o.windowDimension = opt_ints("window_dimensions")
                o.windowStrides = opt_ints("window_strides")
                o.baseDilations = opt_ints("base_dilations")
                o.windowDilations = opt_ints("window_dilations")
                o.padding = list(np.array(a["padding"]).reshape(-1).astype(int)) if "padding" in a else None
            o.computation = self._add_region(op.regions[0], f"{name.split('.')[1]}_body_{len(self.subgraphs)}")
        elif name == "stablehlo.broadcast_in_dim":
            o.broadcastDimensions = opt_ints("broadcast_dimensions") or []
        elif name == "stablehlo.custom_call":
            o.callTargetName = ir.StringAttr(a["call_target_name"]).value
            if "backend_config" in a:
                bc = a["backend_config"]
                try:
                    text = ir.StringAttr(bc).value
                except (ValueError, TypeError):  # a dictionary (API version 4): keep its text
                    text = str(bc)
                o.backendConfig = list(text.encode())
        elif name == "stablehlo.batch_norm_inference":
            o.epsilon = ir.FloatAttr(a["epsilon"]).value
            o.featureIndex = ir.IntegerAttr(a["feature_index"]).value
        elif name == "stablehlo.slice":
            o.startIndices = opt_ints("start_indices")
            o.limitIndices = opt_ints("limit_indices")
            o.strides = opt_ints("strides")
        elif name == "stablehlo.concatenate":
            o.dimension = ir.IntegerAttr(a["dimension"]).value
        elif name == "stablehlo.iota":
            o.iotaDimension = ir.IntegerAttr(a["iota_dimension"]).value
        elif name == "stablehlo.gather":
            d = hlo.GatherDimensionNumbers(a["dimension_numbers"])
            if list(d.operand_batching_dims) or list(d.start_indices_batching_dims):
                self.unsupported["stablehlo.gather with batching dims"] += 1
                return None
            o.offsetDims = list(d.offset_dims)
            o.collapsedSliceDims = list(d.collapsed_slice_dims)
            o.startIndexMap = list(d.start_index_map)
            o.indexVectorDim = d.index_vector_dim
            o.sliceSizes = opt_ints("slice_sizes")
            o.indicesAreSorted = bool(ir.BoolAttr(a["indices_are_sorted"]).value) if "indices_are_sorted" in a else False
        return tag, o

    # -- output -----------------------------------------------------------------
    def finish(self) -> bytes:
        """The serialized Model.

        Raises:
            ExportError: some ops or types could not be written (all listed).
        """
        if self.unsupported:
            raise ExportError(self.unsupported)
        m = S.ModelT()
        m.version = 0
        m.operatorCodes = list(self.opcodes)
        m.subgraphs = self.subgraphs
        m.buffers = self.buffers
        b = flatbuffers.Builder(1024)
        b.Finish(m.Pack(b))
        return bytes(b.Output())


def module_to_stablehlo_flatbuffer(module, func_name: str = "main") -> bytes:
    """Write function ``func_name`` of an MLIR StableHLO module (``jaxlib.mlir``)
    as a ``stablehlo.flatbuf`` Model.

    Raises:
        ExportError: ops or types the format cannot express (all listed).
    """
    with module.context:
        w = StablehloFlatbufferWriter(module)
        if func_name not in w.functions:
            raise ValueError(f"the module has no function {func_name!r} (it has {sorted(w.functions)})")
        w.add_function(w.functions[func_name], func_name)
        return w.finish()
