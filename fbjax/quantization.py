"""Load-time handling of quantized TFLite models: ``fbjax.load(path, quantized=...)``.

:func:`prepare` rewrites a freshly read :class:`~fbjax.ir.ModelIR` in place
for one of two modes:

``"exact"`` (the default)
    Nodes that read or write quantized integer activations (int8, uint8,
    int16 with quantization parameters) move to the op set ``"tflite.int"``
    (:mod:`fbjax.lower.tflite_int`), whose lowerings reproduce TFLite's
    builtin integer kernels (without XNNPACK) bit for bit. Pure data
    movement ops (RESHAPE, TRANSPOSE, GATHER, STRIDED_SLICE, ...) stay in the
    ``"tflite"`` op set: they never look at values. Quantized ops without an
    integer-exact lowering are reported by ``fbjax.load`` as unsupported
    (``tflite.int:OP``) rather than silently computed in float.

``"float"`` (approximate, differentiable)
    Every quantized constant is dequantized to float32 (so weights become
    trainable params); every quantized activation tensor becomes float32 and
    is followed by a ``fbjax:FAKE_QUANT`` node that rounds it to its
    quantization grid with a straight-through gradient. QUANTIZE becomes
    FAKE_QUANT, DEQUANTIZE of quantized data becomes IDENTITY. Graph inputs
    and outputs that were quantized become float32 real values
    (``(q - zero_point) * scale``). Results match the integer model only
    approximately (float accumulation instead of integer rescaling, float
    activation functions instead of lookup tables).

Hybrid (dynamic-range) models, in both modes: int8 weight constants that feed
float computations (FULLY_CONNECTED, CONV_2D, ... with float activations) are
dequantized at load time and the op runs in float. This is *not* TFLite's
hybrid kernel, which quantizes the float input on the fly (per-row,
symmetric or with ``asymmetric_quantize_inputs``) and accumulates in
integers; results therefore agree with LiteRT only to float tolerance.
float16 weight models (DEQUANTIZE of float16 constants) are untouched.

What "exact" reproduces: the oracle is LiteRT's builtin kernels without
XNNPACK (``OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES``) on x86. They
differ from TFLite's reference kernels (``BUILTIN_REF``) in a few places,
each verified against LiteRT and followed here:

* float -> int QUANTIZE multiplies by the float32 reciprocal of the scale and
  rounds half to even (reference: ``round_half_away(x / scale)``);
* 8-bit DEQUANTIZE computes ``q*s - zp*s`` (two roundings), except for the
  last ``size % 8`` elements, which get ``(q - zp) * s``;
* 8-bit CONV_2D and FULLY_CONNECTED rescale through the gemm output stage,
  whose final right shift rounds ties toward +inf (reference: away from
  zero); BATCH_MATMUL and DEPTHWISE_CONV_2D use ``RoundingDivideByPOT``;
* int8 SOFTMAX uses a float exp table (reference: gemmlowp fixed point);
* int16 FULLY_CONNECTED/CONV_2D without an int64 bias rescale in 32 bits.

16x8 kernels accumulate in int64 like TFLite: for int16 models the pass sets
``model.metadata["needs_x64"]`` so that :class:`fbjax.Model` traces them
under a scoped ``jax.enable_x64``. Float nodes of quantized models whose
``"tflite"`` lowering is missing are routed to ``"tflite.qfloat"``
(:mod:`fbjax.lower.tflite_int.float_fallback`), if it has the op.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from .errors import InputError
from .ir import Graph, ModelIR, Node, QuantParams, Value

MODES = ("exact", "float")

#: Ops whose integer version only moves values around (input and output share
#: quantization parameters in TFLite); they keep the ``"tflite"`` lowering.
#: (Comparisons are not here: TFLite rescales quantized operands first.)
PASSTHROUGH = frozenset({
    "RESHAPE", "SQUEEZE", "EXPAND_DIMS", "TRANSPOSE", "GATHER", "GATHER_ND", "STRIDED_SLICE", "SLICE",
    "SPLIT", "SPLIT_V", "PACK", "UNPACK", "TILE", "DEPTH_TO_SPACE", "SPACE_TO_DEPTH", "BROADCAST_TO",
    "REVERSE_V2", "SHAPE", "ARG_MAX", "ARG_MIN", "BATCH_TO_SPACE_ND", "SPACE_TO_BATCH_ND",
    "SELECT", "SELECT_V2", "REDUCE_MAX", "REDUCE_MIN", "CAST",
})

_Q_KINDS = (np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int16))


def is_quantized(v: Optional[Value]) -> bool:
    """An 8/16-bit integer tensor with quantization parameters."""
    return v is not None and v.quant is not None and np.dtype(v.dtype) in _Q_KINDS and v.quant.scale.size > 0


def _is_quantized_const(v: Optional[Value]) -> bool:
    """A constant with quantization parameters (weights, int32/int64 biases)."""
    return (v is not None and v.data is not None and v.quant is not None and v.quant.scale.size > 0
            and np.dtype(v.dtype).kind in "iu")


def has_quantized_tensors(model: ModelIR) -> bool:
    return any(is_quantized(v) or _is_quantized_const(v) for g in model.graphs for v in g.values)


def dequantize_array(data: np.ndarray, q: QuantParams) -> np.ndarray:
    """``(q - zero_point) * scale`` in float32, per-channel along
    ``quantized_dimension`` (TFLite ``Dequantize``)."""
    data = np.asarray(data)
    scale = np.asarray(q.scale, np.float32).reshape(-1)
    zp = np.asarray(q.zero_point).astype(np.int64).reshape(-1)
    if zp.size == 0:
        zp = np.zeros(1, np.int64)
    if scale.size > 1:
        shape = [1] * data.ndim
        shape[q.quantized_dimension] = scale.size
        scale = scale.reshape(shape)
        zp = zp.reshape(shape) if zp.size == scale.size else zp.reshape(())
    else:
        scale, zp = scale.reshape(()), zp.reshape(())
    return ((data.astype(np.int64) - zp).astype(np.float32) * scale).astype(np.float32)


def _dequantize_const_in_place(v: Value) -> None:
    v.data = dequantize_array(v.data, v.quant)
    v.dtype = np.dtype(np.float32)
    v.quant = None


def _consumers(graph: Graph) -> dict:
    uses: dict = {}
    for n in graph.nodes:
        for v in n.inputs:
            if v is not None:
                uses.setdefault(id(v), []).append(n)
    return uses


def _dequantize_hybrid_weights(graph: Graph) -> int:
    """Dequantize quantized constants all of whose consumers compute in float
    (hybrid / dynamic-range ops and DEQUANTIZE-free weight reads)."""
    uses = _consumers(graph)
    count = 0
    for v in graph.values:
        if not _is_quantized_const(v):
            continue
        users = uses.get(id(v), [])
        if not users:
            continue
        hybrid = all(
            n.op_set == "tflite" and n.op_name != "DEQUANTIZE"
            and not any(is_quantized(x) for x in list(n.inputs) + list(n.outputs) if x is not None and x.data is None)
            and any(x is not None and x.data is None and np.dtype(x.dtype).kind == "f" for x in n.inputs)
            for n in users
        )
        if hybrid:
            _dequantize_const_in_place(v)
            count += 1
    return count


def _prepare_exact(model: ModelIR, int_ops: set) -> None:
    for g in model.graphs:
        _dequantize_hybrid_weights(g)
        for n in g.nodes:
            if n.op_set != "tflite":
                continue
            touched = [v for v in list(n.inputs) + list(n.outputs) if is_quantized(v) and v.data is None]
            if not touched:
                if n.op_name in ("DEQUANTIZE", "QUANTIZE") and any(is_quantized(v) for v in n.inputs):
                    n.op_set = "tflite.int"  # DEQUANTIZE of a quantized constant
                continue
            if n.op_name in PASSTHROUGH and n.op_name not in int_ops:
                continue
            n.op_set = "tflite.int"


def _fq_node(src: Value, q: QuantParams, dtype: np.dtype, where: str) -> tuple[Node, Value]:
    lo, hi = np.iinfo(dtype).min, np.iinfo(dtype).max
    out = Value(name=(src.name or "t") + "/fake_quant", dtype=np.dtype(np.float32), shape=src.shape,
                index=src.index)
    attrs = dict(scale=float(np.asarray(q.scale, np.float32).reshape(-1)[0]),
                 zero_point=int(np.asarray(q.zero_point).reshape(-1)[0]) if np.asarray(q.zero_point).size else 0,
                 qmin=int(lo), qmax=int(hi))
    return Node("fbjax", "FAKE_QUANT", [src], [out], attrs, location=f"{where} (fake quantization)"), out


def _prepare_float(model: ModelIR) -> None:
    for g in model.graphs:
        # 1. constants: dequantize (weights become float params).
        for v in g.values:
            if _is_quantized_const(v):
                _dequantize_const_in_place(v)
        # 2. activations: float32 + FAKE_QUANT after each producer.
        orig = {}  # id(value) -> (QuantParams, integer dtype)
        for v in g.values:
            if is_quantized(v) and v.data is None:
                orig[id(v)] = (v.quant, np.dtype(v.dtype))
                v.dtype = np.dtype(np.float32)
                v.quant = None
        replace: dict = {}  # id(old value) -> fake-quantized value
        new_nodes: list = []

        def add_fq(v: Value, where: str):
            q, dt = orig[id(v)]
            node, out = _fq_node(v, q, dt, where)
            new_nodes.append(node)
            g.values.append(out)
            replace[id(v)] = out

        for v in g.inputs:
            if v is not None and id(v) in orig:
                add_fq(v, f"graph {g.name!r} input {v.name!r}")
        for n in g.nodes:
            n.inputs = [replace.get(id(v), v) if v is not None else None for v in n.inputs]
            if n.op_set == "tflite" and n.op_name == "QUANTIZE" and n.outputs and id(n.outputs[0]) in orig:
                q, dt = orig[id(n.outputs[0])]
                fq, _ = _fq_node(n.inputs[0], q, dt, n.location)
                n.op_set, n.op_name, n.attrs = "fbjax", "FAKE_QUANT", fq.attrs
                new_nodes.append(n)
                continue
            if n.op_set == "tflite" and n.op_name == "DEQUANTIZE" and n.inputs and n.inputs[0] is not None \
                    and np.dtype(n.inputs[0].dtype) == np.float32:
                n.op_set, n.op_name, n.attrs = "fbjax", "IDENTITY", {}
            new_nodes.append(n)
            for o in n.outputs:
                if o is not None and id(o) in orig:
                    add_fq(o, n.location)
        g.nodes = new_nodes
        g.outputs = [replace.get(id(v), v) if v is not None else None for v in g.outputs]
        for sig in model.signatures.values():
            if model.graphs[sig.graph_index] is g:
                sig.inputs = {k: v for k, v in sig.inputs.items()}
                sig.outputs = {k: replace.get(id(v), v) for k, v in sig.outputs.items()}


def _route_float_fallbacks(model: ModelIR) -> None:
    """Float ``"tflite"`` nodes without a lowering go to ``"tflite.qfloat"``
    (:mod:`fbjax.lower.tflite_int.float_fallback`) when it has the op."""
    from .lower.registry import LOWERINGS

    for g in model.graphs:
        for n in g.nodes:
            if n.op_set == "tflite" and LOWERINGS.get("tflite", n.op_name) is None \
                    and LOWERINGS.get("tflite.qfloat", n.op_name) is not None:
                n.op_set = "tflite.qfloat"


def prepare(model: ModelIR, quantized: str = "exact") -> ModelIR:
    """Rewrite ``model`` in place for ``quantized`` = ``"exact"`` or ``"float"``.

    Models without quantized tensors are returned unchanged.

    Raises:
        InputError: unknown mode.
    """
    if quantized not in MODES:
        raise InputError(f"quantized must be one of {MODES}, got {quantized!r}")
    if not has_quantized_tensors(model):
        return model
    if quantized == "exact":
        from .lower.registry import LOWERINGS

        _prepare_exact(model, set(LOWERINGS.ops("tflite.int").get("tflite.int", [])))
        if any(is_quantized(v) and np.dtype(v.dtype) == np.int16 for g in model.graphs for v in g.values):
            # TFLite's 16x8 kernels accumulate in int64: ask fbjax.Model to
            # trace under a scoped jax.enable_x64 (see model._needs_x64).
            model.metadata["needs_x64"] = True
    else:
        _prepare_float(model)
    _route_float_fallbacks(model)
    return model
