"""Load-time handling of quantized TFLite models: ``fbjax.load(path, quantized=...)``.

:func:`rewrite_quantized` rewrites a freshly read :class:`~fbjax.ir.ModelIR` in place
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

``"float"`` (differentiable; forward equal to the integer model)
    Every quantized constant is dequantized to float32 (so weights become
    trainable params); every quantized activation tensor becomes float32
    holding its real value ``(q - zero_point) * scale``. Each node with an
    integer lowering computes its forward value with that integer kernel
    (:func:`_int_forward_nodes`: on-grid float inputs quantized back, weights
    re-quantized from the float params with the file's scales by
    ``fbjax:QUANTIZE_WEIGHTS``, the ``"tflite.int"`` op, DEQUANTIZE) and its
    gradient with the float op (``fbjax:STRAIGHT_THROUGH``); each quantized
    activation is then a ``fbjax:FAKE_QUANT`` node (identity on these
    on-grid values, straight-through gradient). So with the file's weights
    the forward equals ``"exact"`` mode dequantized -- bit for bit, because
    no float computation stays within one step of the integer kernels on
    LSB-sensitive models (one input step moves 4-71% of LiteRT's own outputs
    by more than a step on several test models) -- and after fine-tuning it
    is what the re-quantized model will compute. What is approximate is the
    gradient: the float op's at the on-grid inputs, straight through the
    roundings. Nodes without an integer lowering (and hybrid ops) run in
    float, their quantized outputs fake-quantized with the rounding of the
    integer kernel they stand for (:func:`_fq_rounding`: ties half-even for
    float->int QUANTIZE, up for the gemm output stage of 8-bit CONV_2D /
    DEPTHWISE_CONV_2D / FULLY_CONNECTED, away from zero elsewhere; the
    SRDHM pre-rounding before a right shift, the optimized MEAN's
    zero-point term, the 16x8 kernels' 15-bit multiplier). QUANTIZE of a
    float tensor becomes FAKE_QUANT; graph inputs and outputs that were
    quantized become float32 real values.

Hybrid (dynamic-range) models: int8 weight constants that feed float
computations. In ``"exact"`` mode, FULLY_CONNECTED, CONV_2D,
DEPTHWISE_CONV_2D, TRANSPOSE_CONV and BATCH_MATMUL nodes reading such weights
move to the op set ``"tflite.hybrid"`` (:mod:`fbjax.lower.tflite_int.hybrid`),
which reproduces TFLite's hybrid kernels bit for bit: the float input is quantized
on the fly (per row or per image, symmetric or asymmetric as TFLite
chooses), products are summed in int32 and scaled back to float32 with
TFLite's rounding order. Other consumers of int8 weights (hybrid LSTM, RNN,
SVDF, EMBEDDING_LOOKUP, GATHER, ...) get the weights dequantized at load time
and run in float, which agrees with LiteRT only to float tolerance. In
``"float"`` mode all weights are dequantized (trainable params); each node
that exact mode runs as a hybrid kernel computes its forward with that
kernel on the weights re-quantized with the file's scales and its gradient
with the float op (:func:`_hybrid_forward_nodes`), so the forward equals
exact mode's.
float16 weight models (DEQUANTIZE of float16 constants) are untouched.

What "exact" reproduces: the oracle is LiteRT's builtin kernels without
XNNPACK (``OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES``) on x86. They
differ from TFLite's reference kernels (``BUILTIN_REF``) in a few places,
each verified against LiteRT and followed here:

* float -> int QUANTIZE multiplies by the float32 reciprocal of the scale and
  rounds half to even (reference: ``round_half_away(x / scale)``, which the
  builtin kernel keeps for per-channel output scales);
* 8-bit DEQUANTIZE computes ``q*s - zp*s`` (two roundings), except for the
  last ``size % 8`` elements, which get ``(q - zp) * s``;
* 8-bit CONV_2D and FULLY_CONNECTED rescale through the gemm output stage,
  whose final right shift rounds ties toward +inf (reference: away from
  zero); BATCH_MATMUL and DEPTHWISE_CONV_2D use ``RoundingDivideByPOT``;
* int8 SOFTMAX uses a float exp table (reference: gemmlowp fixed point);
* 8-bit DEPTHWISE_CONV_2D rounds the final shift's ties up in its 8-channel
  vector body and away from zero in the scalar tail (last ``C % 8``
  channels);
* 8-bit -> 8-bit QUANTIZE (requantization) rounds ties up in its 16-element
  vector body, away from zero in the tail (last ``size % 16``);
* int16 FULLY_CONNECTED/CONV_2D without an int64 bias rescale in 32 bits;
  int16 FULLY_CONNECTED with ``quantized_bias_type`` INT64 (what the converter
  writes) requantizes in double: ``round(acc * s_in * s_w / s_out)``.

16x8 kernels accumulate in int64 like TFLite: for int16 models the pass sets
``model.metadata["needs_x64"]`` so that :class:`fbjax.Model` traces them
under a scoped ``jax.enable_x64``.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..errors import InputError
from ..ir import Graph, ModelIR, Node, QuantParams, Value
from ..quantmath import dequantize_array, weights_roundtrip

MODES = ("exact", "float")

_Q_KINDS = (np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int16))


def is_quantized(v: Optional[Value]) -> bool:
    """An 8/16-bit integer tensor with quantization parameters."""
    return v is not None and v.quant is not None and np.dtype(v.dtype) in _Q_KINDS and v.quant.scale.size > 0


def _is_quantized_const(v: Optional[Value]) -> bool:
    """A constant with quantization parameters (weights, int32/int64 biases)."""
    return (v is not None and v.data is not None and v.quant is not None and v.quant.scale.size > 0
            and np.dtype(v.dtype).kind in "iu")


def has_quantized_tensors(model: ModelIR) -> bool:
    """True when any activation or constant of ``model`` carries TFLite quantization parameters."""
    return any(is_quantized(v) or _is_quantized_const(v) for g in model.graphs for v in g.values)


#: during one :func:`rewrite_quantized`: (id(integer data), scales, zero points, axis) -> (that data, its float32
#: values), so a weight that several subgraphs read from one buffer stays one array, hence one param
#: (fbjax.lower.build); emptied when rewrite_quantized returns
_DEQUANTIZED: dict = {}


def _dequantize_const_in_place(v: Value) -> None:
    q = v.quant
    key = (v.data_key, np.asarray(q.scale).tobytes(), np.asarray(q.zero_point).tobytes(), q.quantized_dimension)
    hit = _DEQUANTIZED.get(key)
    if hit is None or hit[0] is not v.data:
        hit = _DEQUANTIZED[key] = (v.data, dequantize_array(v.data, v.quant))
    v.data = hit[1]
    v.dtype = np.dtype(np.float32)
    v.quant = None


def _consumers(graph: Graph) -> dict:
    uses: dict = {}
    for n in graph.nodes:
        for v in n.inputs:
            if v is not None:
                uses.setdefault(id(v), []).append(n)
    return uses


def _dequantize_hybrid_weights(graph: Graph, registry, hybrid_ops: Optional[frozenset] = None) -> int:
    """Hybrid (dynamic-range) ops: quantized constants all of whose consumers
    compute in float.

    When every consumer is an op whose ``"tflite.hybrid"`` lowering in
    ``registry`` declares it can read the constant as its integer weights
    (the ``hybrid_eligible`` fact: int8 weights with zero point 0, float32
    activations and outputs...), the consumers move to ``"tflite.hybrid"``
    and the weights stay int8 (TFLite's hybrid kernels). Otherwise the
    constant is dequantized to float32 and the consumers run in float.
    ``hybrid_ops``: only these hybrid op names (default: all registered).
    Returns the number of constants handled.
    """
    uses = _consumers(graph)
    count = 0
    f32 = np.dtype(np.float32)

    def hybrid_kernel(n, v):
        od = registry.get("tflite.hybrid", n.op_name)
        eligible = None if od is None else od.fact("hybrid_eligible")
        return (eligible is not None and (hybrid_ops is None or n.op_name in hybrid_ops) and bool(eligible(n, v)))

    for v in graph.values:
        if not _is_quantized_const(v):
            continue
        users = uses.get(id(v), [])
        if not users:
            continue
        float_users = all(
            n.op_set == "tflite" and _conversion(registry, n) != "dequantize"
            and not any(is_quantized(x) for x in list(n.inputs) + list(n.outputs) if x is not None and x.data is None)
            and (any(x is not None and x.data is None and np.dtype(x.dtype).kind == "f" for x in n.inputs)
                 # a lookup into a quantized table with float output (litert-torch's dynamic_int8 embedding)
                 or (_fact(registry, n, "table_lookup") and all(o is None or np.dtype(o.dtype) == f32
                                                                for o in n.outputs)))
            for n in users
        )
        if not float_users:
            continue
        if all(hybrid_kernel(n, v) for n in users):
            for n in users:
                n.op_set = "tflite.hybrid"
        else:
            _dequantize_const_in_place(v)
        count += 1
    return count


def _fact(registry, n: Node, fact: str):
    """``fact`` of the lowering registered for ``n`` (None when there is none)."""
    od = registry.get(n.op_set, n.op_name)
    return None if od is None else od.fact(fact)


def _conversion(registry, n: Node) -> Optional[str]:
    """The ``quant_conversion`` fact of the integer kernel of the TFLite op of
    ``n`` (``"quantize"``: QUANTIZE; ``"dequantize"``: DEQUANTIZE; None: not
    a conversion)."""
    od = registry.get("tflite.int", n.op_name)
    return None if od is None else od.fact("quant_conversion")


def _op_names(registry, op_set: str) -> frozenset:
    return frozenset(registry.ops(op_set).get(op_set, []))


def _rewrite_exact(model: ModelIR, registry) -> None:
    int_ops = _op_names(registry, "tflite.int")
    passthrough = registry.names_with("tflite", "int_passthrough")  # data movement: the float lowering serves
    for g in model.graphs:
        _dequantize_hybrid_weights(g, registry)
        for n in g.nodes:
            if n.op_set != "tflite":
                continue
            touched = [v for v in list(n.inputs) + list(n.outputs) if is_quantized(v) and v.data is None]
            if not touched:
                if _conversion(registry, n) and any(is_quantized(v) for v in n.inputs):
                    n.op_set = "tflite.int"  # DEQUANTIZE of a quantized constant
                continue
            if n.op_name in passthrough and n.op_name not in int_ops:
                continue
            n.op_set = "tflite.int"


def _fq_node(src: Value, q: QuantParams, dtype: np.dtype, where: str, extra: Optional[dict] = None
             ) -> tuple[Node, Value]:
    lo, hi = np.iinfo(dtype).min, np.iinfo(dtype).max
    out = Value(name=(src.name or "t") + "/fake_quant", dtype=np.dtype(np.float32), shape=src.shape,
                index=src.index)
    attrs = dict(scale=float(np.asarray(q.scale, np.float32).reshape(-1)[0]),
                 zero_point=int(np.asarray(q.zero_point).reshape(-1)[0]) if np.asarray(q.zero_point).size else 0,
                 qmin=int(lo), qmax=int(hi))
    attrs.update(extra or {})
    return Node("fbjax", "FAKE_QUANT", [src], [out], attrs, location=f"{where} (fake quantization)"), out


def _fq_rounding(n: Node, orig: dict, registry) -> dict:
    """FAKE_QUANT attributes (``rounding``, ``offset``, ``pre_shift``,
    ``gain``, ``tail_away``; see :mod:`fbjax.lower.tflite_int.fake_quant`)
    that make the rounding of the float model's output of ``n`` follow
    TFLite's integer kernel for ``n``: the ``fq_rounding`` fact of the
    ``"tflite.int"`` lowering (:mod:`fbjax.lower.tflite_int.rounding`), else
    half away from zero. ``orig``: id(value) -> (QuantParams, integer dtype)
    of the activations and quantized constants before the rewrite."""
    od = registry.get("tflite.int", n.op_name)
    if od is None or od.fact("fq_rounding") is None:
        return {"rounding": "half_away"}
    return od.fact("fq_rounding")(n, orig)


def _int_forward_nodes(n: Node, orig: dict, orig_inputs: list, int_ops: set, orig_data: dict,
                       registry) -> Optional[tuple]:
    """``(nodes, new values)`` computing ``n`` in float mode with its integer
    kernel (the exact mode's ``"tflite.int"`` lowering) and the float op only
    for the gradient, or None when ``n`` does not qualify.

    ``n`` qualifies when it has a ``"tflite.int"`` lowering, reads at least one
    quantized activation, every output is quantized, and every other input is
    a quantized constant, a non-float tensor or omitted; or when it is a
    DEQUANTIZE of a quantized activation or constant (LiteRT's float32
    rounding of it, identity gradient). The nodes built:
    each fake-quantized (on-grid) float activation is quantized back
    (``tflite.int:QUANTIZE``, exact for on-grid values); each quantized
    constant -- a float param in this mode -- goes through
    ``fbjax:QUANTIZE_WEIGHTS`` with the file's scales (so fine-tuned weights
    are rounded to the grid the deployed model will use), except at the
    lowering's static input positions (pad values, sizes), which keep the
    file's integers; then the integer op, ``tflite.int:DEQUANTIZE`` of each
    output, the float op on the float inputs (8/16-bit weights through
    ``fbjax:CLIP_WEIGHTS``: clipped to their integer range, no gradient
    beyond it), and ``fbjax:STRAIGHT_THROUGH``
    (value of the integer result, gradient of the float op). A constant that
    would not come back unchanged through float32 (:func:`fbjax.quantmath.weights_roundtrip`:
    large int32/int64 biases) is anchored to the file's integers
    (``QUANTIZE_WEIGHTS``' ``file_values``). ``orig_inputs``: ``n``'s inputs before the
    rewrite (``n.inputs`` already holds the fake-quantized float ones);
    ``orig_data``: id(constant) -> its integer data from the file."""
    if n.op_set != "tflite" or n.op_name not in int_ops:
        return None
    outs = list(n.outputs)
    dequantize = _conversion(registry, n) == "dequantize"
    if dequantize:  # of a quantized activation or constant: float output
        if not orig_inputs or orig_inputs[0] is None or id(orig_inputs[0]) not in orig or len(outs) != 1:
            return None
    else:
        if not outs or any(o is None or id(o) not in orig for o in outs):
            return None
        if not any(v is not None and v.data is None and id(v) in orig for v in orig_inputs):
            return None
    static = registry.get("tflite.int", n.op_name).static_inputs
    where = f"{n.location} (float mode: integer kernel forward)"
    f32 = np.dtype(np.float32)
    nodes, vals, int_ins = [], [], []
    for i, (v, vf) in enumerate(zip(orig_inputs, n.inputs)):
        if v is None:
            int_ins.append(None)
        elif id(v) in orig and v.data is None:  # quantized activation (now fake-quantized float)
            q, dt = orig[id(v)]
            xi = Value(name=f"{vf.name}/int", dtype=dt, shape=vf.shape, quant=q)
            nodes.append(Node("tflite.int", "QUANTIZE", [vf], [xi], {}, location=where))
            vals.append(xi)
            int_ins.append(xi)
        elif id(v) in orig:  # quantized constant (now a float param)
            q, dt = orig[id(v)]
            data = orig_data[id(v)]
            wi = Value(name=f"{v.name}/int", dtype=dt, shape=v.shape, quant=q,
                       data=data if i in static else None)
            if i not in static:
                ins = [v]
                if not weights_roundtrip(data, q):  # large biases: anchored to the file's integers
                    fv = Value(name=f"{v.name}/file_values", dtype=dt, shape=v.shape, data=data)
                    ins.append(fv)
                    vals.append(fv)
                nodes.append(Node("fbjax", "QUANTIZE_WEIGHTS", ins, [wi], {}, location=where))
            vals.append(wi)
            int_ins.append(wi)
        elif np.dtype(v.dtype).kind == "f":
            return None  # a float operand: not an integer kernel
        else:
            int_ins.append(v)
    if dequantize:  # LiteRT's DEQUANTIZE rounding (8-bit: two roundings), identity gradient
        yd = Value(name=f"{outs[0].name}/int_dequantized", dtype=f32, shape=outs[0].shape)
        nodes.append(Node("tflite.int", "DEQUANTIZE", int_ins[:1], [yd], {}, location=where))
        nodes.append(Node("fbjax", "STRAIGHT_THROUGH", [n.inputs[0], yd], outs, {}, location=where))
        return nodes, vals + [yd]
    ints, deqs, floats = [], [], []
    for o in outs:
        q, dt = orig[id(o)]
        ints.append(Value(name=f"{o.name}/int", dtype=dt, shape=o.shape, quant=q))
        deqs.append(Value(name=f"{o.name}/int_dequantized", dtype=f32, shape=o.shape))
        floats.append(Value(name=f"{o.name}/float", dtype=f32, shape=o.shape))
    nodes.append(Node("tflite.int", n.op_name, int_ins, ints, dict(n.attrs), location=where))
    nodes += [Node("tflite.int", "DEQUANTIZE", [a], [b], {}, location=where) for a, b in zip(ints, deqs)]
    if _conversion(registry, n) == "quantize":  # requantization: the float op is the identity (then fake quantization)
        nodes.append(Node("fbjax", "IDENTITY", list(n.inputs[:1]), floats, {}, location=n.location))
    else:
        float_ins = list(n.inputs)
        for i, v in enumerate(orig_inputs):
            # 8/16-bit weights: the float op sees them clipped to their integer
            # range, zero gradient beyond it (clipped straight-through)
            if v is not None and v.data is not None and id(v) in orig and i not in static \
                    and orig[id(v)][1].itemsize <= 2:
                cv, clip = _clip_weights_node(v, *orig[id(v)], where)
                nodes.append(clip)
                vals.append(cv)
                float_ins[i] = cv
        nodes.append(Node(n.op_set, n.op_name, float_ins, floats, dict(n.attrs), location=n.location))
    nodes += [Node("fbjax", "STRAIGHT_THROUGH", [a, b], [o], {}, location=where)
              for a, b, o in zip(floats, deqs, outs)]
    return nodes, vals + ints + deqs + floats


def _clip_weights_node(v: Value, q: QuantParams, dt, where: str) -> tuple:
    """``(clipped value, node)``: ``fbjax:CLIP_WEIGHTS`` of the float weight
    ``v`` to the integer range of ``dt`` on its file grid ``q`` (the float
    op's view of a quantized weight: clipped straight-through gradient)."""
    zp = np.asarray(q.zero_point).reshape(-1)
    cv = Value(name=f"{v.name}/clipped", dtype=np.dtype(np.float32), shape=v.shape)
    node = Node("fbjax", "CLIP_WEIGHTS", [v], [cv], dict(
        scale=tuple(float(x) for x in np.asarray(q.scale, np.float32).reshape(-1)),
        zero_point=tuple(int(x) for x in zp) if zp.size else (0,),
        axis=int(q.quantized_dimension), qmin=int(np.iinfo(dt).min), qmax=int(np.iinfo(dt).max)),
        location=where)
    return cv, node


def _hybrid_forward_nodes(n: Node, orig: dict, orig_data: dict, traced_ok: frozenset) -> Optional[tuple]:
    """``(nodes, new values)`` computing the hybrid node ``n`` (op set
    ``"tflite.hybrid"``, its int8 weights already dequantized to a float
    param) in float mode: forward by the hybrid kernel on the weights
    re-quantized with the file's scales (``fbjax:QUANTIZE_WEIGHTS``, so
    the forward equals ``"exact"`` mode and LiteRT, and follows fine-tuned
    weights onto the grid the saved file will hold), gradient by the float
    op on the weights clipped to the int8 range (``fbjax:CLIP_WEIGHTS``),
    joined by ``fbjax:STRAIGHT_THROUGH`` (blockwise int4 weights: re-quantized
    per row and block to [-8, 7]; the float op sees them unclipped). None
    when no input is such a weight: the node then runs in float, as do ops
    whose lowering does not declare
    ``traced_weights`` (``traced_ok``; a hybrid EMBEDDING_LOOKUP's float op
    gives the same float32 products)."""
    if n.op_name not in traced_ok:
        return None
    where = f"{n.location} (float mode: hybrid kernel forward)"
    nodes, vals, h_ins, f_ins = [], [], [], []
    for v in n.inputs:
        if v is None or v.data is None or id(v) not in orig:
            h_ins.append(v)
            f_ins.append(v)
            continue
        q, dt = orig[id(v)]
        data = orig_data[id(v)]
        wi = Value(name=f"{v.name}/int", dtype=dt, shape=v.shape, quant=q)
        ins = [v]
        if not weights_roundtrip(data, q):
            fv = Value(name=f"{v.name}/file_values", dtype=dt, shape=v.shape, data=data)
            ins.append(fv)
            vals.append(fv)
        nodes.append(Node("fbjax", "QUANTIZE_WEIGHTS", ins, [wi], {}, location=where))
        if getattr(q, "block_size", 0):  # blockwise int4: the float op sees the weights unclipped
            vals.append(wi)
            h_ins.append(wi)
            f_ins.append(v)
            continue
        cv, clip = _clip_weights_node(v, q, dt, where)
        nodes.append(clip)
        vals += [wi, cv]
        h_ins.append(wi)
        f_ins.append(cv)
    if not vals:
        return None
    hs = [Value(name=f"{o.name}/hybrid", dtype=o.dtype, shape=o.shape) for o in n.outputs]
    fs = [Value(name=f"{o.name}/float", dtype=o.dtype, shape=o.shape) for o in n.outputs]
    nodes.append(Node("tflite.hybrid", n.op_name, h_ins, hs, dict(n.attrs), location=where))
    nodes.append(Node("tflite", n.op_name, f_ins, fs, dict(n.attrs), location=n.location))
    nodes += [Node("fbjax", "STRAIGHT_THROUGH", [f, h], [o], {}, location=where)
              for f, h, o in zip(fs, hs, n.outputs)]
    return nodes, vals + hs + fs


def _rewrite_float(model: ModelIR, registry) -> None:
    int_ops = _op_names(registry, "tflite.int")
    traced_ok = registry.names_with("tflite.hybrid", "traced_weights")
    for g in model.graphs:
        # 0. hybrid ops: found as in exact mode (then forward by their kernel, below)
        _dequantize_hybrid_weights(g, registry)
        # 1. constants: dequantize (weights become float params).
        orig = {}  # id(value) -> (QuantParams, integer dtype) before the rewrite
        orig_data = {}  # id(constant) -> integer data from the file
        for v in g.values:
            if _is_quantized_const(v):
                orig[id(v)] = (v.quant, np.dtype(v.dtype))
                orig_data[id(v)] = v.data
                _dequantize_const_in_place(v)
        # 2. activations: float32 + FAKE_QUANT after each producer.
        for v in g.values:
            if is_quantized(v) and v.data is None:
                orig[id(v)] = (v.quant, np.dtype(v.dtype))
                v.dtype = np.dtype(np.float32)
                v.quant = None
        replace: dict = {}  # id(old value) -> fake-quantized value
        new_nodes: list = []

        def add_fq(v: Value, where: str, extra: Optional[dict] = None):
            q, dt = orig[id(v)]
            node, out = _fq_node(v, q, dt, where, extra)
            new_nodes.append(node)
            g.values.append(out)
            replace[id(v)] = out

        for v in g.inputs:
            if v is not None and id(v) in orig:
                add_fq(v, f"graph {g.name!r} input {v.name!r}")
        for n in g.nodes:
            extra = _fq_rounding(n, orig, registry)  # before the inputs are replaced
            orig_inputs = list(n.inputs)
            n.inputs = [replace.get(id(v), v) if v is not None else None for v in n.inputs]
            if n.op_set == "tflite.hybrid":
                emu = _hybrid_forward_nodes(n, orig, orig_data, traced_ok)
                if emu is not None:
                    new_nodes.extend(emu[0])
                    g.values.extend(emu[1])
                    continue
                n.op_set = "tflite"
            emu = _int_forward_nodes(n, orig, orig_inputs, int_ops, orig_data, registry)
            if emu is not None:
                nodes, vals = emu
                new_nodes.extend(nodes)
                g.values.extend(vals)
                if any(np.dtype(v.dtype) in (np.dtype(np.int16), np.dtype(np.int64)) for v in vals):
                    model.metadata["needs_x64"] = True
                for o in n.outputs:
                    if id(o) in orig:
                        add_fq(o, n.location)  # already on the grid: keeps the value, names the tensor
                continue
            if n.op_set == "tflite" and _conversion(registry, n) == "quantize" and n.outputs \
                    and id(n.outputs[0]) in orig:
                q, dt = orig[id(n.outputs[0])]
                fq, _ = _fq_node(n.inputs[0], q, dt, n.location, extra)
                n.op_set, n.op_name, n.attrs = "fbjax", "FAKE_QUANT", fq.attrs
                new_nodes.append(n)
                continue
            if n.op_set == "tflite" and _conversion(registry, n) == "dequantize" and n.inputs \
                    and n.inputs[0] is not None and np.dtype(n.inputs[0].dtype) == np.float32:
                n.op_set, n.op_name, n.attrs = "fbjax", "IDENTITY", {}
            new_nodes.append(n)
            for o in n.outputs:
                if o is not None and id(o) in orig:
                    add_fq(o, n.location, extra)
        g.nodes = new_nodes
        before = list(g.outputs)
        g.outputs = [replace.get(id(v), v) if v is not None else None for v in g.outputs]
        for old, new in zip(before, g.outputs):
            if new is not None and new is not old:  # the model's outputs keep the file's names
                new.name, old.name = old.name, f"{old.name}/before_fake_quant"
        for sig in model.signatures.values():
            if model.graphs[sig.graph_index] is g:
                sig.inputs = {k: v for k, v in sig.inputs.items()}
                sig.outputs = {k: replace.get(id(v), v) for k, v in sig.outputs.items()}


def rewrite_quantized(model: ModelIR, quantized: str = "exact", *, registry) -> ModelIR:
    """Rewrite ``model`` in place for ``quantized`` = ``"exact"`` or ``"float"``.

    Models without quantized tensors are returned unchanged. ``registry``:
    the lowering registry (:data:`fbjax.lower.LOWERINGS`) whose op facts
    the rewrite follows: which ``"tflite.int"`` / ``"tflite.hybrid"``
    kernels exist, which builtins only move values (``int_passthrough``)
    and how each integer kernel rounds (``fq_rounding``).

    Raises:
        InputError: unknown mode.
    """
    if quantized not in MODES:
        raise InputError(f"quantized must be one of {MODES}, got {quantized!r}")
    if not has_quantized_tensors(model):
        return model
    try:
        _rewrite(model, quantized, registry)
    finally:
        _DEQUANTIZED.clear()
    return model


def _rewrite(model: ModelIR, quantized: str, registry) -> None:
    if quantized == "exact":
        _rewrite_exact(model, registry)
        if any(is_quantized(v) and np.dtype(v.dtype) == np.int16 for g in model.graphs for v in g.values):
            # TFLite's 16x8 kernels accumulate in int64: ask fbjax.Model to
            # trace under a scoped jax.enable_x64 (see model._needs_x64).
            model.metadata["needs_x64"] = True
    else:
        _rewrite_float(model, registry)
