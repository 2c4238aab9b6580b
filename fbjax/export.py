"""Exporters: JAX functions -> flatbuffer model files.

:func:`to_stablehlo_flatbuffer` writes a JAX function, from the StableHLO
module JAX lowers it to, in the prototype ``stablehlo.flatbuf`` format
(``schemas/stablehlo.fbs``) that :func:`fbjax.load` reads back::

    data = fbjax.export.to_stablehlo_flatbuffer(fn, x, w)
    model = fbjax.load(data)           # model(x, w) == fn(x, w)

Only the 25 operators of the format can be written (plus constants, which
become buffers, and ``func.call``, which is inlined); a module with any
other op (``stablehlo.transpose``, ``stablehlo.compare``...) or with a type
the format lacks (bool, bf16, complex) raises :class:`ExportError` listing
every offending op. ``reduce``/``reduce_window`` bodies become extra
subgraphs after the main one, referenced by ``computation``.

:func:`jax_export` is ``jax.export`` of a loaded model's
``apply(params, *inputs)`` at the file's batch, a fixed batch, or a symbolic
batch ``b``; an operator whose lowering cannot follow a symbolic batch
raises :class:`DynamicBatchError` naming the node (instead of jax's
``InconclusiveDimensionOperation`` traceback)::

    model = fbjax.load("model.tflite", batch_size=None)
    exported = fbjax.export.jax_export(model, batch_size=None)
    y = exported.call(model.params, x)          # any batch
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Optional

import flatbuffers
import numpy as np

from .errors import FbjaxError
from .formats import stablehlo as shlo_format
from .formats._generated import stablehlo_generated as S

__all__ = ["ExportError", "DynamicBatchError", "jax_export", "dynamic_batch_errors", "to_stablehlo_flatbuffer",
           "module_to_stablehlo_flatbuffer", "StablehloFlatbufferWriter"]


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


class DynamicBatchError(FbjaxError, NotImplementedError):
    """An operator's lowering cannot follow a symbolic batch dimension
    (``jax.export`` shape polymorphism): it needs the batch as a number.

    Attributes:
        location: the node's place in the file (``"subgraph 0, operator 3"``),
            or None when the failing lowering could not be identified.
        op_name: the operator (``"Shape"``), or None.
    """

    def __init__(self, location: Optional[str], op_name: Optional[str], detail: str):
        self.location, self.op_name = location, op_name
        where = f"{location} ({op_name})" if location else "the model"
        super().__init__(
            f"{where} cannot be exported with a dynamic batch: {detail}. "
            "Export with a fixed batch size instead (--batch-size N, or batch_size=N)."
        )


def _failing_node(exc: BaseException):
    """(location, op_name) of the innermost lowering on ``exc``'s traceback:
    the deepest frame holding a lowering context ``ctx``, or (None, None)."""
    from .ir import OpContext

    found = (None, None)
    seen = set()
    e = exc
    while e is not None and id(e) not in seen:  # the filtered traceback, then jax's unfiltered one
        seen.add(id(e))
        tb = e.__traceback__
        while tb is not None:
            ctx = tb.tb_frame.f_locals.get("ctx")
            if isinstance(ctx, OpContext) and getattr(ctx, "node", None) is not None:
                found = (ctx.node.location, ctx.node.op_name)
            tb = tb.tb_next
        if found[0] is not None:
            return found
        e = e.__cause__ or e.__context__
    return found


def _poly_error_types() -> tuple:
    import jax

    t = getattr(jax.errors, "InconclusiveDimensionOperation", None)
    if t is None:  # older jax
        from jax._src.export.shape_poly import InconclusiveDimensionOperation as t  # noqa: N813
    return (t,)


class dynamic_batch_errors:  # noqa: N801 - used as a context manager, like contextlib's
    """Context manager turning shape-polymorphism failures raised while a
    model is traced with a symbolic batch into :class:`DynamicBatchError`.

    jax's ``InconclusiveDimensionOperation`` (a symbolic dim used where a
    number is needed: ``int(d)``, ``d > 1``, ``np.zeros(shape)``) is always
    translated. Other non-fbjax exceptions raised inside a lowering are
    translated too when ``symbolic`` is true: the model traced at concrete
    batches when it was loaded, so a failure only under the symbolic batch
    is one. fbjax's own errors pass unchanged (they already name the node).
    """

    def __init__(self, symbolic: bool = True):
        self.symbolic = symbolic

    def __enter__(self):
        return self

    def __exit__(self, typ, exc, tb):
        if exc is None or isinstance(exc, FbjaxError):
            return False
        poly = isinstance(exc, _poly_error_types())
        if not poly and not (self.symbolic and isinstance(exc, Exception)):
            return False
        location, op_name = _failing_node(exc)
        if not poly and location is None:
            return False  # not from a lowering: not ours to explain
        first = str(exc).strip().splitlines()[0].rstrip(".") if str(exc).strip() else ""
        raise DynamicBatchError(location, op_name, f"{type(exc).__name__}: {first}") from exc


def jax_export(model, *, batch_size="file"):
    """``jax.export.export`` of ``model.apply(params, *inputs)``.

    Args:
        model: a :class:`fbjax.Model`; for ``batch_size=None`` load it with
            ``fbjax.load(path, batch_size=None)``.
        batch_size: how a leading input dim the model leaves unknown
            (``fbjax.load(..., batch_size=None)``) is exported: None, the
            symbolic batch ``b`` (one artifact for every batch size); an int;
            ``"file"`` (default): 1. Other unknown dims are 1.

    Returns:
        ``jax.export.Exported``; ``exported.call(params, *inputs)``.

    Raises:
        DynamicBatchError: with ``batch_size=None``, an operator's lowering
            cannot follow a symbolic batch; the message names the node.
        InputError: ``batch_size`` is None or another int than the batch of
            a model whose inputs all have a fixed batch (load it with
            ``batch_size=None`` first).
    """
    import jax
    from jax import export as jexport

    if batch_size != "file" and model.inputs and not any(s.shape and s.shape[0] is None for s in model.inputs):
        fixed = {s.shape[0] for s in model.inputs if s.shape}
        if batch_size is None or fixed != {int(batch_size)}:
            from .errors import InputError

            raise InputError(f"jax_export(batch_size={batch_size!r}): the model's inputs have the fixed batch "
                             f"{sorted(fixed)}; load it with fbjax.load(path, batch_size=None) to export "
                             "another or a dynamic batch")
    b = jexport.symbolic_shape("b")[0] if batch_size is None else None
    params = {k: jax.ShapeDtypeStruct(np.shape(v), v.dtype) for k, v in model.params.items()}
    lead = b if b is not None else (int(batch_size) if isinstance(batch_size, (int, np.integer)) else 1)
    ins = [jax.ShapeDtypeStruct(tuple(d if d is not None else (lead if i == 0 else 1) for i, d in enumerate(s.shape)),
                                s.dtype) for s in model.inputs]
    symbolic = b is not None and any(s.shape and s.shape[0] is None for s in model.inputs)
    with dynamic_batch_errors(symbolic=symbolic), jax.enable_x64(getattr(model, "_x64", False)):
        return jexport.export(jax.jit(model.apply))(params, *ins)


_ELEMENT_TYPES = {
    "f16": np.float16, "f32": np.float32, "f64": np.float64,
    "i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64,
    "ui8": np.uint8, "ui16": np.uint16, "ui32": np.uint32, "ui64": np.uint64,
}

_OPTIONS = {  # op name -> (OperatorOptions union tag, options class)
    name: (getattr(S.OperatorOptions, "".join(p.capitalize() for p in code.split("_")) + "Options"),
           getattr(S, "".join(p.capitalize() for p in code.split("_")) + "OptionsT"))
    for code, name in shlo_format.OP_NAMES.items()
}


def export_model(model, to: str, *, batch_size="file"):
    """``jax.export`` of ``model.apply(params, *inputs)`` (what ``fbjax export`` writes).

    Returns ``(exported, serialized bytes or MLIR text)``. ``to`` is
    ``"stablehlo"`` (the serialized artifact, with its VJP, so
    ``jax.export.deserialize(data).call`` stays differentiable) or ``"mlir"``
    (the StableHLO text). With ``batch_size=None`` the leading input
    dimension is the symbolic ``b`` (:func:`fbjax.export.jax_export`; an
    operator that cannot follow it raises ``DynamicBatchError`` naming it).
    """
    exported = jax_export(model, batch_size=batch_size)
    if to == "mlir":
        return exported, exported.mlir_module()
    return exported, bytes(exported.serialize(vjp_order=1))


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


def to_stablehlo_flatbuffer(fn, *example_args) -> bytes:
    """Write JAX function ``fn`` in the prototype ``stablehlo.flatbuf`` format.

    ``fn`` is lowered with ``jax.jit(fn, keep_unused=True).lower(*example_args)``
    (unused arguments stay model inputs); its
    StableHLO module's ``main`` function is written op by op. The result
    loads with :func:`fbjax.load` and computes ``fn(*example_args)``'s
    function of the flattened array arguments (pytrees are flattened in JAX's
    order; outputs likewise).

    Raises:
        ExportError: the lowered module uses ops the format cannot express
            (e.g. ``stablehlo.transpose``, ``stablehlo.compare``) or types it
            lacks (bool, bf16, complex); every one is named.
    """
    import jax

    lowered = jax.jit(fn, keep_unused=True).lower(*example_args)
    return module_to_stablehlo_flatbuffer(lowered.compiler_ir("stablehlo"), "main")
