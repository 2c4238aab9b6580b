"""Write MLIR StableHLO computations as TFLite models of ``STABLEHLO_*``
builtins (codes 162 onwards), as TensorFlow's converter does with
``target_spec.supported_ops = [tf.lite.OpsSet.EXPERIMENTAL_STABLEHLO_OPS]``.

Used by the conformance harness for test-data files the prototype
``stablehlo.flatbuf`` format cannot express. Region bodies (reduce,
reduce_window, scatter, sort, while) become appended subgraphs referenced
by index; ``func.call``s to private functions are inlined; constants become
constant tensors. Ops without a ``STABLEHLO_*`` code (sqrt, sine, xor,
reverse...), captured values and tensors of element types TFLite lacks are
collected and reported by :meth:`StablehloTfliteWriter.finish` as
:class:`NotExpressible`.

Builds on :class:`fbjax.formats.tflite_builder.TFLiteBuilder`; needs jaxlib's MLIR bindings.
"""

from __future__ import annotations

import re
from collections import Counter

import numpy as np

from fbjax.formats.stablehlo_attrs import MLIR_ELEMENT_TYPES
from fbjax.formats.tflite_builder import BUILTIN_CODES, TFLiteBuilder

_ELEMENT_TYPES = MLIR_ELEMENT_TYPES  # one table, shared with fbjax's MLIR writer

_COMPARE_TYPES = {"NOTYPE": "STABLEHLO_COMPARISON_TYPE_NOTYPE", "FLOAT": "STABLEHLO_COMPARISON_TYPE_FLOAT",
                  "TOTALORDER": "STABLEHLO_COMPARISON_TYPE_FLOAT_TOTAL_ORDER",
                  "SIGNED": "STABLEHLO_COMPARISON_TYPE_SIGNED", "UNSIGNED": "STABLEHLO_COMPARISON_TYPE_UNSIGNED"}


class NotExpressible(Exception):
    """The computation uses ops / types TFLite's STABLEHLO_* builtins lack."""

    def __init__(self, what: Counter):
        self.what = what
        super().__init__(", ".join(f"{k} (x{v})" for k, v in what.most_common()))


def _ir():
    from jaxlib.mlir import ir

    return ir


def element_dtype(mlir_type):
    """numpy dtype of a tensor type's elements, or None."""
    t = _ir().RankedTensorType(mlir_type)
    dt = _ELEMENT_TYPES.get(str(t.element_type))
    return None if dt is None else np.dtype(dt)


def tensor_shape(mlir_type) -> tuple:
    return tuple(int(d) for d in _ir().RankedTensorType(mlir_type).shape)


def _scalar_from_bits(tok: str, dt: np.dtype):
    bits = int(tok, 16)
    return np.array([bits], np.dtype(f"u{dt.itemsize}")).view(dt)[0]


def _parse_real(tok: str, dt: np.dtype):
    tok = tok.strip()
    if tok.lower().startswith("0x"):
        return _scalar_from_bits(tok, dt)
    if tok in ("true", "false"):
        return tok == "true"
    return float(tok) if (dt.kind in "fc" or dt.name == "bfloat16") else int(tok)


def dense_to_numpy(attr, mlir_type) -> np.ndarray:
    """A dense elements attribute (splat, list or hex) as a numpy array;
    covers bool, bf16 and complex, which the generic path cannot read."""
    dt = element_dtype(mlir_type)
    shape = tensor_shape(mlir_type)
    if dt is None:
        raise NotExpressible(Counter({f"element type {_ir().RankedTensorType(mlir_type).element_type}": 1}))
    n = int(np.prod(shape))
    if dt.kind == "b":
        a = _ir().DenseElementsAttr(attr)
        if a.is_splat:
            return np.full(shape, bool(_ir().BoolAttr(a.get_splat_value()).value), dt)
        return np.array(a).astype(bool).reshape(shape)
    if dt.kind in "iuf" and dt.name != "bfloat16":
        from fbjax.export import dense_to_numpy as generic

        try:
            return generic(attr, mlir_type)
        except Exception:  # noqa: BLE001 - fall back on the text
            pass
    text = attr if isinstance(attr, str) else str(attr)
    text = text[text.index("dense<"):]
    body = text[len("dense<"): text.rindex(">", 0, text.rindex(" : ") if " : " in text else len(text))]
    body = body.strip()
    if body.startswith('"0x'):
        raw = bytes.fromhex(body[3:-1])
        cdt = dt
        arr = np.frombuffer(raw, cdt)
        return (np.full(shape, arr[0], dt) if arr.size == 1 and n != 1 else arr.reshape(shape)).copy()
    flat = body.replace("[", " ").replace("]", " ")
    if dt.kind == "c":
        pairs = re.findall(r"\(([^,()]+),([^,()]+)\)", flat)
        rdt = np.dtype(np.float32 if dt == np.complex64 else np.float64)
        vals = [complex(float(_parse_real(a, rdt)), float(_parse_real(b, rdt))) for a, b in pairs]
    else:
        vals = [_parse_real(t, dt) for t in flat.split(",") if t.strip()]
    arr = np.array(vals).astype(dt) if dt.kind != "f" or dt.name != "bfloat16" else \
        np.array([float(v) for v in vals], np.float32).astype(dt)
    if arr.size == 1 and n != 1:
        return np.full(shape, arr[0], dt)
    return arr.reshape(shape)


def constant_value(op) -> np.ndarray:
    """The value of a ``stablehlo.constant`` op; complex constants, which
    the Python bindings cannot hand out as attributes, are read from the
    op's text."""
    res = op.results[0]
    try:
        attr = op.attributes["value"]
    except TypeError:
        attr = str(op)
    return dense_to_numpy(attr, res.type)


def _ints(attr) -> list:
    try:
        return [int(x) for x in attr]
    except TypeError:
        return [int(x) for x in np.array(attr).reshape(-1)]


class StablehloTfliteWriter:
    """Builds a TFLite model of ``STABLEHLO_*`` ops from MLIR operations.

    ``add_graph(inputs, ops, outputs)`` writes one subgraph (the first is
    the entry point); regions become further subgraphs. :meth:`finish`
    returns the bytes or raises :class:`NotExpressible` listing every gap.
    """

    def __init__(self, module=None):
        ir = _ir()
        self.functions = {}
        if module is not None:
            for op in module.body.operations:
                if op.operation.name == "func.func":
                    self.functions[ir.StringAttr(op.attributes["sym_name"]).value] = op
        self.b = TFLiteBuilder(description="fbjax tests: StableHLO test data as STABLEHLO_* builtins")
        self.n_subgraphs = 1
        self.gaps: Counter = Counter()
        self.ops_used: Counter = Counter()

    # -- tensors ----------------------------------------------------------------
    def _tensor(self, scope, value, data=None) -> int:
        if data is None and value in scope:
            return scope[value]
        dt = element_dtype(value.type)
        shape = tensor_shape(value.type)
        if dt is None:
            self.gaps[f"element type {_ir().RankedTensorType(value.type).element_type}"] += 1
            dt = np.dtype(np.float32)
        if any(d < 0 for d in shape):
            self.gaps["dynamic shape"] += 1
            shape = tuple(max(d, 1) for d in shape)
        if data is not None:
            idx = self.b.add_tensor(shape, dt, data=np.asarray(data, dt))
        else:
            idx = self.b.add_tensor(shape, dt)
        scope[value] = idx
        return idx

    def _lookup(self, scope, value) -> int:
        if value not in scope:
            self.gaps["value captured from an enclosing scope"] += 1
            return self._tensor(scope, value)
        return scope[value]

    # -- graphs ---------------------------------------------------------------------
    def add_graph(self, inputs, ops, outputs, name: str = "main") -> int:
        """Write a subgraph; returns its index."""
        if self.n_subgraphs == 1 and not getattr(self, "_main_done", False):
            index = 0
            self._main_done = True
        else:
            index = self.b.add_subgraph(name)
            self.n_subgraphs += 1
        prev = self.b.subgraph
        self.b.set_subgraph(index)
        scope: dict = {}
        for v in inputs:
            t = self._tensor(scope, v)
            self.b._sg.inputs.append(t)  # noqa: SLF001 - TFLiteBuilder keeps inputs per subgraph
        for op in ops:
            self._write_op(scope, op)
            self.b.set_subgraph(index)
        for v in outputs:
            t = self._lookup(scope, v)
            if t >= 0:
                self.b.add_output(t)
        if prev != index:
            self.b.set_subgraph(prev)
        return index

    def _add_region(self, region, name: str) -> int:
        block = region.blocks[0]
        ops = list(block.operations)
        cur = self.b.subgraph
        idx = self.add_graph(list(block.arguments), ops[:-1], list(ops[-1].operands), name)
        self.b.set_subgraph(cur)
        return idx

    def _inline_call(self, scope, op) -> None:
        ir = _ir()
        callee = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
        func = self.functions.get(callee)
        if func is None:
            self.gaps[f"func.call @{callee}"] += 1
            return
        block = func.regions[0].blocks[0]
        for arg, operand in zip(block.arguments, op.operands):
            scope[arg] = self._lookup(scope, operand)
        body = list(block.operations)
        for inner in body[:-1]:
            self._write_op(scope, inner)
        for res, ret in zip(op.results, body[-1].operands):
            scope[res] = self._lookup(scope, ret)
        for v in list(block.arguments) + [r for inner in body[:-1] for r in inner.results]:
            scope.pop(v, None)

    def _write_op(self, scope, op) -> None:
        op = op.operation
        name = op.name
        if name == "stablehlo.constant":
            res = op.results[0]
            try:
                data = constant_value(op)
            except NotExpressible as e:
                self.gaps.update(e.what)
                scope.setdefault(res, -1)
                return
            self._tensor(scope, res, data)
            return
        if name == "func.call":
            self._inline_call(scope, op)
            return
        code = "STABLEHLO_" + name.split(".", 1)[-1].upper() if name.startswith("stablehlo.") else None
        if code is None or code not in BUILTIN_CODES:
            self.gaps[name] += 1
            for r in op.results:
                scope.setdefault(r, -1)
            return
        cur = self.b.subgraph
        opts = self._options(op, name)
        self.b.set_subgraph(cur)
        if opts is False:
            for r in op.results:
                scope.setdefault(r, -1)
            return
        ins = [self._lookup(scope, v) for v in op.operands]
        outs = [self._tensor(scope, r) for r in op.results]
        if opts:
            opts = {k: v for k, v in opts.items() if v is not None}
        self.b.add_op(code, ins, outs, options=opts or None)
        self.ops_used[code] += 1

    def _options(self, op, name):
        """Options dict for ``op`` (None: no options table), or False if refused."""
        ir = _ir()
        from jaxlib.mlir.dialects import stablehlo as hlo

        a = op.attributes

        def opt(key):
            return _ints(a[key]) if key in a else None

        def flag(key):
            return bool(ir.BoolAttr(a[key]).value) if key in a else False

        if name == "stablehlo.compare":
            d = hlo.ComparisonDirectionAttr(a["comparison_direction"]).value
            o = {"comparison_direction": f"STABLEHLO_COMPARISON_DIRECTION_{d}"}
            if "compare_type" in a:
                o["compare_type"] = _COMPARE_TYPES[hlo.ComparisonTypeAttr(a["compare_type"]).value]
            return o
        if name == "stablehlo.scatter":
            d = hlo.ScatterDimensionNumbers(a["scatter_dimension_numbers"])
            if list(d.input_batching_dims) or list(d.scatter_indices_batching_dims):
                self.gaps["stablehlo.scatter with batching dims"] += 1
                return False
            return {"update_window_dims": list(d.update_window_dims), "inserted_window_dims": list(d.inserted_window_dims),
                    "scatter_dims_to_operand_dims": list(d.scattered_dims_to_operand_dims),
                    "index_vector_dim": d.index_vector_dim, "indices_are_sorted": flag("indices_are_sorted"),
                    "unique_indices": flag("unique_indices"),
                    "update_computation_subgraph_index": self._add_region(op.regions[0], "scatter_update")}
        if name == "stablehlo.gather":
            d = hlo.GatherDimensionNumbers(a["dimension_numbers"])
            if list(d.operand_batching_dims) or list(d.start_indices_batching_dims):
                self.gaps["stablehlo.gather with batching dims"] += 1
                return False
            return {"offset_dims": list(d.offset_dims), "collapsed_slice_dims": list(d.collapsed_slice_dims),
                    "start_index_map": list(d.start_index_map), "index_vector_dim": d.index_vector_dim,
                    "slice_sizes": opt("slice_sizes"), "indices_are_sorted": flag("indices_are_sorted")}
        if name == "stablehlo.pad":
            return {"edge_padding_low": opt("edge_padding_low"), "edge_padding_high": opt("edge_padding_high"),
                    "interior_padding": opt("interior_padding")}
        if name == "stablehlo.transpose":
            return {"permutation": opt("permutation")}
        if name == "stablehlo.dynamic_slice":
            return {"slice_sizes": opt("slice_sizes")}
        if name == "stablehlo.iota":
            return {"iota_dimension": ir.IntegerAttr(a["iota_dimension"]).value}
        if name == "stablehlo.concatenate":
            return {"dimension": ir.IntegerAttr(a["dimension"]).value}
        if name == "stablehlo.broadcast_in_dim":
            return {"broadcast_dimensions": opt("broadcast_dimensions") or []}
        if name == "stablehlo.slice":
            return {"start_indices": opt("start_indices"), "limit_indices": opt("limit_indices"),
                    "strides": opt("strides")}
        if name == "stablehlo.reduce":
            return {"dimensions": opt("dimensions"), "body_subgraph_index": self._add_region(op.regions[0], "reduce_body")}
        if name == "stablehlo.reduce_window":
            pad = list(np.array(a["padding"]).reshape(-1).astype(int)) if "padding" in a else None
            return {"window_dimensions": opt("window_dimensions"), "window_strides": opt("window_strides"),
                    "base_dilations": opt("base_dilations"), "window_dilations": opt("window_dilations"),
                    "padding": pad, "body_subgraph_index": self._add_region(op.regions[0], "reduce_window_body")}
        if name == "stablehlo.sort":
            return {"dimension": ir.IntegerAttr(a["dimension"]).value if "dimension" in a else -1,
                    "is_stable": flag("is_stable"),
                    "comparator_subgraph_index": self._add_region(op.regions[0], "sort_comparator")}
        if name == "stablehlo.while":
            c = self._add_region(op.regions[0], "while_cond")
            body = self._add_region(op.regions[1], "while_body")
            return {"cond_subgraph_index": c, "body_subgraph_index": body}
        if name == "stablehlo.dot_general":
            if "algorithm" in a:
                self.gaps["stablehlo.dot_general with algorithm"] += 1
                return False
            d = hlo.DotDimensionNumbers(a["dot_dimension_numbers"])
            return {"lhs_batching_dimensions": list(d.lhs_batching_dimensions),
                    "rhs_batching_dimensions": list(d.rhs_batching_dimensions),
                    "lhs_contracting_dimensions": list(d.lhs_contracting_dimensions),
                    "rhs_contracting_dimensions": list(d.rhs_contracting_dimensions)}
        if name == "stablehlo.convolution":
            d = hlo.ConvDimensionNumbers(a["dimension_numbers"])
            return {"window_strides": opt("window_strides"),
                    "padding": list(np.array(a["padding"]).reshape(-1).astype(int)) if "padding" in a else None,
                    "lhs_dilation": opt("lhs_dilation"), "rhs_dilation": opt("rhs_dilation"),
                    "window_reversal": [bool(x) for x in a["window_reversal"]] if "window_reversal" in a else None,
                    "input_batch_dimension": d.input_batch_dimension,
                    "input_feature_dimension": d.input_feature_dimension,
                    "input_spatial_dimensions": list(d.input_spatial_dimensions),
                    "kernel_input_feature_dimension": d.kernel_input_feature_dimension,
                    "kernel_output_feature_dimension": d.kernel_output_feature_dimension,
                    "kernel_spatial_dimensions": list(d.kernel_spatial_dimensions),
                    "output_batch_dimension": d.output_batch_dimension,
                    "output_feature_dimension": d.output_feature_dimension,
                    "output_spatial_dimensions": list(d.output_spatial_dimensions),
                    "feature_group_count": ir.IntegerAttr(a["feature_group_count"]).value,
                    "batch_group_count": ir.IntegerAttr(a["batch_group_count"]).value}
        if name == "stablehlo.rng_bit_generator":
            alg = hlo.RngAlgorithmAttr(a["rng_algorithm"]).value
            return {"algorithm": {"DEFAULT": "DEFAULT", "THREE_FRY": "THREEFRY", "PHILOX": "PHILOX"}[alg]}
        if name == "stablehlo.custom_call":
            self.gaps["stablehlo.custom_call"] += 1
            return False
        if name == "stablehlo.case":
            self.gaps["stablehlo.case (branches capture values)"] += 1
            return False
        return None

    def finish(self) -> bytes:
        """The model bytes.

        Raises:
            NotExpressible: some op or type could not be written (all listed).
        """
        if self.gaps:
            raise NotExpressible(self.gaps)
        return self.b.build()
