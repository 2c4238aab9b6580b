"""Generated cases of the lowering/twin parity test (a helper module, not a
test module: ``tests/test_parity.py`` runs them).

A :class:`ParityCase` makes a small model and seeded random inputs of a valid
shape and dtype; the test runs it through ``fbjax.load`` (the JAX lowering)
and through ``fbjax.reference.run`` on the loaded model's IR (the numpy twins:
they see the nodes the lowering saw, after :mod:`fbjax.passes` moved
quantized nodes into ``"tflite.int"``/``"tflite.hybrid"``) and compares the
outputs (``compare``, below). Which registered ops a case exercises is read
from the loaded IR, not declared here.

Sources, each reused from the case tables the per-op-set tests already have:

* ``tflite`` / ``tflite.custom``: the converter-made one-op fixtures of
  ``tests/data/tflite_builtins`` (:mod:`tflite_builtin_cases`: every builtin,
  control flow, state, random, MediaPipe pooling, detection post-processing)
  and :mod:`tflite_op_cases` (``Convolution2DTransposeBias``), plus the
  MediaPipe geometry ops written here.
* ``tflite.int``: the converter-made quantized one-op fixtures of
  ``tests/data/quant/ops`` (int8 and 16x8), plus int8 models written here for
  the integer kernels no fixture holds (MAXIMUM, MINIMUM, RELU_N1_TO_1,
  TRANSPOSE).
* ``tflite.hybrid``: ``tests/data/hybrid`` and an EMBEDDING_LOOKUP with an
  int8 table written here.
* ``fbjax``: a quantized fixture loaded with ``quantized="float"`` (FAKE_QUANT,
  QUANTIZE_WEIGHTS, CLIP_WEIGHTS, STRAIGHT_THROUGH, IDENTITY).
* ``stablehlo`` / ``stablehlo.custom_call``: the one-op ``STABLEHLO_*``
  models of :mod:`stablehlo_op_cases`, one ``mhlo.topk`` custom call, and,
  for the 20 ops neither the TFLite ``STABLEHLO_*`` codes nor a test writer
  can carry (``stablehlo.sine``, ``stablehlo.xor``...), a one-node
  :class:`fbjax.ir.ModelIR` loaded through ``fbjax.load`` by a test reader
  (:func:`read_ir_model`).
* ``composite``: litert-torch's attention block (``tests/data/composites``)
  loaded with ``composites="fused"``.

``compare`` (how outputs are compared; integer and bool outputs are always
compared exactly):

* ``"bound"``: float outputs within the error bound derived from the op
  (:func:`op_bounds.fixture_bound`, ``op`` naming the op-bounds rule).
* ``"exact"``: bit-equal: integer kernels, data movement, single correctly
  rounded IEEE operations (float64 then rounded once to float32 is
  correctly rounded for ``+ - * / sqrt``).
* ``"random"``: random draws (the lowering uses JAX's PRNG, the twin numpy's
  generator): shapes, dtypes and the support of the distribution only.
* ``"fq_step"``: ``quantized="float"``: fake-quantized float outputs within
  one quantization step (the two sides round to the same grid point except
  where a value lies within a rounding of a half step).
* ``"relative"``: ``max|a - b| / max(1, |b|) <= tol`` for whole blocks
  (composites), ``tol`` derived from the stages and accumulation lengths.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from fbjax.ir import Graph, ModelIR, Node, Value
from fbjax.formats.tflite_builder import TFLiteBuilder, stablehlo_op_model

import stablehlo_op_cases
from helpers import custom_op_model
import tflite_builtin_cases
import tflite_op_cases

HERE = Path(__file__).resolve().parent
QUANT_OPS = HERE / "data" / "quant" / "ops"
HYBRID = HERE / "data" / "hybrid"
COMPOSITES = HERE / "data" / "composites"
F32, I32 = np.float32, np.int32

#: the format name under which :func:`read_ir_model` is installed in
#: ``fbjax.formats.READERS`` by the test (a fixture, undone after each test)
IR_FORMAT = "parity-ir"


@dataclass
class ParityCase:
    """One generated case.

    Attributes:
        id: the case name (pytest id).
        op_set: the op set it is listed under.
        make: ``() -> (source, inputs)``: a path or model bytes and one array
            per model input.
        compare: ``"bound"``, ``"exact"``, ``"random"``, ``"fq_step"`` or
            ``"relative"`` (module docstring).
        op: the op-bounds rule for ``"bound"`` (``op_bounds`` names; ``None``:
            the fixture manifest's op).
        ops: every op of the model (for :func:`op_bounds.fixture_bound`).
        attrs: attributes of the op under test (fused activation...).
        load_kwargs: extra ``fbjax.load`` options (``quantized="float"``...),
            also handed to the reference where it takes them (``composites``).
        tol: for ``"relative"``.
        format: ``fbjax.load``'s ``format`` (``IR_FORMAT`` for IR cases).
        slow: a further variant of an op another case covers (``-m slow``);
            the default cases alone cover every registered op.
        more_inputs: ``k -> inputs``: further seeded inputs for the same
            model (the integer kernels: a compiled model runs them in
            microseconds), compared like the first.
    """

    id: str
    op_set: str
    make: Callable
    compare: str = "bound"
    op: Optional[str] = None
    ops: tuple = ()
    attrs: dict = field(default_factory=dict)
    load_kwargs: dict = field(default_factory=dict)
    tol: float = 0.0
    format: Optional[str] = None
    slow: bool = False
    more_inputs: Optional[Callable] = None


def _rng(name: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(name.encode()))


def random_inputs(specs, name: str) -> list:
    """Seeded inputs for value specs (:attr:`fbjax.Model.inputs`): float
    standard normal, int8/int16 over their whole range, other integers
    in [-100, 100) (ids, positions), bools half true."""
    rng = _rng(name)
    out = []
    for v in specs:
        shape = tuple(1 if d is None else d for d in v.shape)
        dt = np.dtype(v.dtype)
        if dt.kind == "f":
            out.append(rng.standard_normal(shape).astype(dt))
        elif dt in (np.dtype(np.int8), np.dtype(np.int16), np.dtype(np.uint8)):
            info = np.iinfo(dt)
            out.append(rng.integers(info.min, info.max, shape, endpoint=True).astype(dt))
        elif dt.kind in "iu":
            out.append(rng.integers(-100 if dt.kind == "i" else 0, 100, shape).astype(dt))
        else:
            out.append(rng.integers(0, 2, shape).astype(dt))
    return out


# --- tflite: the converter-made one-op fixtures -------------------------------------------------

#: manifest suites whose outputs are random draws
_RANDOM_SUITES = {"random"}


def _builtin_case(name: str) -> ParityCase:
    spec = tflite_builtin_cases.MANIFEST[name]
    path = tflite_builtin_cases.DATA / f"{name}.tflite"
    from fbjax.lower import LOWERINGS

    op_set = "tflite.custom" if ("tflite.custom", spec["op"]) in LOWERINGS else "tflite"
    return ParityCase(f"builtin-{name}", op_set, lambda: (path, tflite_builtin_cases.case_inputs(name)),
                      compare="random" if spec.get("suite") in _RANDOM_SUITES else "bound",
                      op=spec["op"], ops=tuple(spec["ops"]))


TFLITE_FIXTURE_CASES = [_builtin_case(n) for n in sorted(tflite_builtin_cases.MANIFEST)]


def _cast_edges(out_dtype):
    """CAST float32 -> integer on values beyond the type's range, infinities
    and NaN (LiteRT saturates; NaN gives the maximum) and ordinary ones."""
    def make():
        from fbjax.formats.tflite_builder import single_op_model

        rng = _rng(f"CAST-edges-{np.dtype(out_dtype).name}")
        x = np.where(rng.random(24) < 0.3, rng.choice([np.nan, np.inf, -np.inf, 1e10, -1e10], 24),
                     rng.uniform(-400, 400, 24)).astype(F32)
        return single_op_model("CAST", [x.shape], output_shapes=[x.shape], output_dtypes=[out_dtype],
                               input_dtypes=[F32]), [x]
    return ParityCase(f"CAST-edges-{np.dtype(out_dtype).name}", "tflite", make, compare="exact")


def _min_max_edges(op):
    """MAXIMUM/MINIMUM on every ordered pair of NaN, signed zeros,
    infinities and 1.5 (LiteRT: ``a > b ? a : b``, so the operand order
    matters for NaN and zeros)."""
    def make():
        from fbjax.formats.tflite_builder import single_op_model

        edges = np.array([np.nan, 0.0, -0.0, np.inf, -np.inf, 1.5], F32)
        a, b = (v.reshape(-1).copy() for v in np.meshgrid(edges, edges))
        return single_op_model(op, [(36,), (36,)], output_shapes=[(36,)]), [a, b]
    return ParityCase(f"{op}-edges", "tflite", make, compare="exact")


def _floor_div_multiples():
    """FLOOR_DIV of exact float32 multiples of a broadcast divisor (quotients
    that round to an integer), signed zeros, infinities and NaN."""
    def make():
        from fbjax.formats.tflite_builder import single_op_model

        rng = _rng("FLOOR_DIV-multiples")
        den = (rng.uniform(0.05, 3, 4) * rng.choice([-1, 1], 4)).astype(F32)
        num = (rng.integers(-200, 200, (16, 4)) * den).astype(F32)
        num.reshape(-1)[:6] = [0.0, -0.0, np.inf, -np.inf, np.nan, 0.25]
        return single_op_model("FLOOR_DIV", [num.shape, den.shape], output_shapes=[num.shape]), [num, den]
    return ParityCase("FLOOR_DIV-multiples", "tflite", make, compare="exact")


def _hashtable_lookup():
    """HASHTABLE_LOOKUP (no converter fixture): sorted int32 keys, float rows,
    lookups that hit and miss (a data move: exact)."""
    def make():
        rng = _rng("HASHTABLE_LOOKUP")
        keys = np.sort(rng.choice(np.arange(-50, 50), 6, replace=False)).astype(I32)
        values = rng.standard_normal((6, 3)).astype(F32)
        lookup = np.concatenate([rng.choice(keys, 5), rng.integers(-60, 60, 5)]).astype(I32)
        b = TFLiteBuilder(description="fbjax parity case")
        x = b.add_input(lookup.shape, I32)
        out, hits = b.add_tensor((10, 3), F32), b.add_tensor((10,), np.uint8)
        b.add_op("HASHTABLE_LOOKUP", [x, b.add_constant(keys), b.add_constant(values)], [out, hits])
        b.add_output(out)
        b.add_output(hits)
        return b.build(), [lookup]
    return ParityCase("HASHTABLE_LOOKUP", "tflite", make, compare="exact")


def _logic_cases():
    """Comparisons and boolean reductions on values that make both answers
    occur (the converter fixtures' normal draws never compare equal, and their
    boolean reductions come out all false / all true)."""
    def compare(op):
        def make():
            from fbjax.formats.tflite_builder import single_op_model

            rng = _rng(f"{op}-hits")
            a, b = (rng.integers(-2, 3, (4, 6)).astype(F32) for _ in range(2))
            a[0, :3] = [0.0, -0.0, np.nan]
            b[0, :3] = [-0.0, 0.0, np.nan]
            return single_op_model(op, [a.shape, b.shape], output_shapes=[a.shape], output_dtypes=[np.bool_]), [a, b]
        return ParityCase(f"{op}-hits", "tflite", make, compare="exact")

    def reduce(op):
        def make():
            from fbjax.formats.tflite_builder import single_op_model

            x = _rng(f"{op}-mixed").random((5, 3)) < 0.7
            x[0], x[1] = True, False  # an all-true and an all-false row
            return single_op_model(op, [x.shape, np.array([1], I32)], options=dict(keep_dims=False),
                                   output_shapes=[(5,)], output_dtypes=[np.bool_], input_dtypes=[np.bool_]), [x]
        return ParityCase(f"{op}-mixed", "tflite", make, compare="exact")
    return [compare("EQUAL"), compare("NOT_EQUAL"), reduce("REDUCE_ALL"), reduce("REDUCE_ANY")]


#: one-op models written here for ops or edge values the converter fixtures do not hold
TFLITE_EDGE_CASES = [*_logic_cases(), _hashtable_lookup(), _cast_edges(np.uint8), _cast_edges(np.int32), _min_max_edges("MAXIMUM"),
                     _min_max_edges("MINIMUM"), _floor_div_multiples()]


def _op_case(case, op) -> ParityCase:
    def make():
        built = case.make()
        return built.model, built.inputs
    return ParityCase(f"op-{case.id}", "tflite.custom", make, op=op)


# --- tflite.custom: MediaPipe's geometry ops (no fixture; written here) ----------------------------

def _custom_model(code, version, in_shapes, out_shape, options):
    return custom_op_model(code, version, in_shapes, out_shape, options, description="fbjax parity case")


def _affine(rng):
    m = np.eye(4, dtype=F32)
    m[:2, :2] = rng.uniform(-1.5, 1.5, (2, 2))
    m[:2, 3] = rng.uniform(-3, 3, 2)
    return m.reshape(1, 4, 4)


def _landmarks_v1():
    rng = _rng("Landmarks2TransformMatrix-v1")
    lm = rng.uniform(4, 28, (7, 3)).astype(F32)
    lm[4, 0] = lm[1, 0] + rng.uniform(5, 10)  # the right landmark right of the left one: a moderate angle
    opts = dict(input_hw=[40, 60], output_hw=[16, 24], dimensions=3, landmarks_range=32, bbox_size_multiplier=1.5,
                left_rotation_idx=1, right_rotation_idx=4, subset=[0, 2, 3, 5, 6])
    return _custom_model("Landmarks2TransformMatrix", 1, [(1, 1, 1, 21)], (1, 4, 4), opts), [lm.reshape(1, 1, 1, 21)]


def _landmarks_v2():
    lm = _rng("Landmarks2TransformMatrix-v2").uniform(0, 50, (1, 6, 3)).astype(F32)
    opts = dict(subset_idxs=[0, 1, 2, 3, 4], left_rotation_idx=0, right_rotation_idx=3, target_rotation_radians=0.25,
                output_height=16, output_width=24, scale_x=1.2, scale_y=0.8)
    return _custom_model("Landmarks2TransformMatrix", 2, [lm.shape], (1, 4, 4), opts), [lm]


def _transform_landmarks(version):
    def make():
        rng = _rng(f"TransformLandmarks-v{version}")
        shape = (1, 2, 3, 6) if version == 1 else (1, 5, 3)
        lm = rng.uniform(-10, 10, shape).astype(F32)
        opts = dict(dimensions=3, scale=2.5) if version == 1 else {}
        return _custom_model("TransformLandmarks", version, [shape, (1, 4, 4)], shape, opts), [lm, _affine(rng)]
    return make


def _transform_tensor(version):
    def make():
        rng = _rng(f"TransformTensor-v{version}")
        img = rng.uniform(-1, 1, (1, 4, 5, 2)).astype(F32)
        code = "TransformTensorBilinear" if version >= 2 else "TransformTensor"
        opts = dict(mode="bilinear", output_size=[3, 6]) if version == 1 else dict(output_size=[3, 6])
        m = np.eye(4, dtype=F32).reshape(1, 4, 4)  # a mild rotation and scale: most samples inside the 4x5 image
        m[0, :2, :2] = np.array([[0.7, 0.2], [-0.2, 0.7]], F32) + rng.uniform(-0.1, 0.1, (2, 2)).astype(F32)
        m[0, :2, 3] = rng.uniform(0, 1, 2)
        return _custom_model(code, version, [img.shape, (1, 4, 4)], (1, 3, 6, 2), opts), [img, m]
    return make


def roll_model(shape, shift, axis, dtype=F32, shift_input: bool = False) -> bytes:
    """A model of one custom ``Roll`` (TFLite's ``kernels/roll.cc``) of an
    input of ``shape``: ``axis`` a constant, ``shift`` a constant (or, with
    ``shift_input``, a second int32 model input of ``shift``'s shape)."""
    b = TFLiteBuilder(description="fbjax tests: Roll")
    x = b.add_input(shape, dtype)
    s = b.add_input(np.shape(shift), np.int32) if shift_input else b.add_constant(np.asarray(shift, np.int32))
    a = b.add_constant(np.asarray(axis, np.int32))
    y = b.add_tensor(shape, dtype)
    b.add_op("Roll", [x, s, a], [y], custom=True)
    b.add_output(y)
    return b.build()


def _roll():
    x = _rng("Roll").standard_normal((2, 3, 5)).astype(F32)
    return roll_model(x.shape, [2, -1, 3], [2, 1, -1]), [x]


TFLITE_CUSTOM_CASES = [
    _op_case(tflite_op_cases.TRANSPOSE_CONV_CASES[1], "Convolution2DTransposeBias"),
    ParityCase("Landmarks2TransformMatrix-v1", "tflite.custom", _landmarks_v1, op="MEDIAPIPE_GEOMETRY"),
    ParityCase("Landmarks2TransformMatrix-v2", "tflite.custom", _landmarks_v2, op="MEDIAPIPE_GEOMETRY"),
    ParityCase("TransformLandmarks-v1", "tflite.custom", _transform_landmarks(1), op="MEDIAPIPE_GEOMETRY"),
    ParityCase("TransformLandmarks-v2", "tflite.custom", _transform_landmarks(2), op="MEDIAPIPE_GEOMETRY"),
    ParityCase("TransformTensor-v1", "tflite.custom", _transform_tensor(1), op="MEDIAPIPE_BILINEAR"),
    ParityCase("TransformTensorBilinear-v2", "tflite.custom", _transform_tensor(2), op="MEDIAPIPE_BILINEAR"),
    ParityCase("Roll", "tflite.custom", _roll, compare="exact"),
]


# --- tflite.int: quantized fixtures and int8 models written here ---------------------------------

#: quantized fixtures LiteRT itself rejects (no valid model): not a parity case
QUANT_INVALID = {
    "padv2_int16x8": "the converter writes a float32 constant_values for an int16 PADV2; LiteRT and fbjax "
                     "both reject the model (pad.cc: INT16 != FLOAT32)",
}


def _fixture(path: Path, op_set: str, compare: str = "exact", slow: bool = False, **load_kwargs) -> ParityCase:
    def inputs(seed_name):
        from fbjax.formats import read_model

        return random_inputs(read_model(path).main_graph.inputs, seed_name)
    suffix = "" if not load_kwargs else "-" + "-".join(f"{v}" for v in load_kwargs.values())
    return ParityCase(f"{path.parent.name}-{path.stem}{suffix}", op_set, lambda: (path, inputs(path.stem)),
                      compare=compare, load_kwargs=load_kwargs, slow=slow,
                      more_inputs=lambda k: inputs(f"{path.stem}-{k}"))


def _int8_model(op, in_shapes, out_shape, *, consts=(), options=None, quant=(0.05, 3), out_quant=None):
    """One ``op`` on int8 model inputs (all with ``quant``) and int8 constants."""
    def make():
        rng = _rng(f"int8-{op}")
        b = TFLiteBuilder(description="fbjax parity case")
        ins = [b.add_input(s, np.int8, quant=quant) for s in in_shapes]
        ins += [b.add_tensor(data=c) for c in consts]
        out = b.add_tensor(out_shape, np.int8, quant=out_quant or quant)
        b.add_op(op, ins, [out], options=options)
        b.add_output(out)
        xs = [rng.integers(-128, 128, s).astype(np.int8) for s in in_shapes]
        return b.build(), xs
    return ParityCase(f"int8-{op}", "tflite.int", make, compare="exact")


TFLITE_INT_CASES = [
    *[_fixture(p, "tflite.int") for p in sorted(QUANT_OPS.glob("*.tflite")) if p.stem not in QUANT_INVALID],
    _int8_model("MAXIMUM", [(2, 3, 4), (2, 3, 4)], (2, 3, 4)),
    _int8_model("MINIMUM", [(2, 3, 4), (1, 3, 1)], (2, 3, 4)),
    # the output scale differs from the input's: a real requantization, clamped to [-1, 1] in real terms
    _int8_model("RELU_N1_TO_1", [(3, 7)], (3, 7), quant=(0.05, -4), out_quant=(1 / 127, 0)),
    _int8_model("TRANSPOSE", [(2, 3, 4)], (4, 2, 3), consts=[np.array([2, 0, 1], I32)]),
]


# --- tflite.hybrid ---------------------------------------------------------------------------------

def _hybrid_embedding_lookup():
    rng = _rng("hybrid-EMBEDDING_LOOKUP")
    table = rng.integers(-127, 128, (6, 5)).astype(np.int8)
    scales = rng.uniform(0.01, 0.1, 6).astype(F32)
    b = TFLiteBuilder(description="fbjax parity case")
    ids = b.add_input((4,), I32, name="ids")
    t = b.add_tensor(data=table, name="table", quant=dict(scale=scales, zero_point=0, quantized_dimension=0))
    out = b.add_tensor((4, 5), F32, name="out")
    b.add_op("EMBEDDING_LOOKUP", [ids, t], [out])
    b.add_output(out)
    return b.build(), [rng.integers(0, 6, 4).astype(I32)]


#: the hybrid fixtures of the default run, one per kernel and weight layout; the others (per-tensor
#: ``_pt``, symmetric-input ``_sym``, stride, dilation, 1x1 and equal-per-channel-scale variants) run
#: under ``-m slow``
HYBRID_DEFAULT = {"batch_matmul", "conv_2d", "depthwise_conv_2d", "fully_connected", "fully_connected_3d",
                  "quantize_per_channel", "transpose_conv"}

TFLITE_HYBRID_CASES = [
    *[_fixture(p, "tflite.hybrid", slow=p.stem not in HYBRID_DEFAULT) for p in sorted(HYBRID.glob("*.tflite"))],
    ParityCase("hybrid-EMBEDDING_LOOKUP", "tflite.hybrid", _hybrid_embedding_lookup, compare="exact"),
]

#: quantized="float": the "fbjax" fake-quantization op set
FBJAX_CASES = [
    _fixture(QUANT_OPS / "concatenation_int16x8.tflite", "fbjax", compare="fq_step", quantized="float"),
    _fixture(QUANT_OPS / "conv_2d_fint8.tflite", "fbjax", compare="fq_step", quantized="float"),
]


# --- stablehlo -------------------------------------------------------------------------------------

#: stablehlo op -> op-bounds rule (``op_bounds`` names) for float outputs; ops not listed compute
#: their float results exactly (moves, selections, max/min, comparisons, rounding to integers, single
#: correctly rounded operations, the WHILE case's repeated multiplications in one order)
STABLEHLO_RULES = {
    "stablehlo.exponential": "EXP", "stablehlo.log": "LOG", "stablehlo.tanh": "TANH",
    "stablehlo.logistic": "LOGISTIC", "stablehlo.cosine": "COS", "stablehlo.sine": "SIN",
    "stablehlo.power": "POW", "stablehlo.rsqrt": "RSQRT", "stablehlo.atan2": "ATAN2",
    "stablehlo.cbrt": "CBRT", "stablehlo.tan": "TAN", "stablehlo.exponential_minus_one": "EXPM1",
    "stablehlo.log_plus_one": "LOG1P", "stablehlo.dot": "SUMS", "stablehlo.dot_general": "SUMS",
    "stablehlo.convolution": "SUMS", "stablehlo.reduce": "SUMS", "stablehlo.scatter": "SUMS",
    "stablehlo.batch_norm_inference": "BATCH_NORM", "stablehlo.resize_bilinear": "RESIZE_BILINEAR",
}


def _shlo_case(name: str) -> ParityCase:
    op = stablehlo_op_cases.CASES[name][0].replace("STABLEHLO_", "stablehlo.").lower()
    if name == "STABLEHLO_SCATTER-replace":  # its body returns the update: no sum, exact
        op += " (replace)"
    return ParityCase(f"shlo-{name}", "stablehlo", lambda: stablehlo_op_cases.build(name), op=op)


def _topk():
    x = _rng("mhlo.topk").standard_normal((3, 7)).astype(F32)
    data = stablehlo_op_model("STABLEHLO_CUSTOM_CALL", [(x.shape, x.dtype)], [((3, 4), F32), ((3, 4), I32)],
                              options=dict(call_target_name="mhlo.topk"))
    return data, [x]


# One-node IR models for the ops no file format carries ----------------------------------------

#: token -> () -> ModelIR, filled by :func:`ir_case`; read by :func:`read_ir_model`
_IR_MODELS: dict = {}


def read_ir_model(source) -> ModelIR:
    """The test reader installed as ``fbjax.formats.READERS[IR_FORMAT]``: a
    fresh one-node :class:`ModelIR` for the token bytes :func:`ir_case`
    made (fresh: loading rewrites the IR in place)."""
    return _IR_MODELS[bytes(source)]()


def _ir(op_name, ins, outs, attrs):
    """``ins``: ``(shape, dtype)`` model inputs or numpy constants; ``outs``: ``(shape, dtype)``."""
    values, inputs = [], []
    for k, x in enumerate(ins):
        if isinstance(x, np.ndarray):
            v = Value(f"const{k}", x.dtype, tuple(x.shape), data=x)
        else:
            v = Value(f"input{k}", np.dtype(x[1]), tuple(x[0]))
            inputs.append(v)
        values.append(v)
    outputs = [Value(f"output{k}", np.dtype(d), tuple(s)) for k, (s, d) in enumerate(outs)]
    node = Node("stablehlo", op_name, values, outputs, dict(attrs), f"subgraph 0, operator 0 ({op_name})")
    g = Graph("main", inputs, outputs, [node], values + outputs)
    return ModelIR("stablehlo", [g], 0, {}, "fbjax parity case")


def ir_case(op_name, ins, outs, attrs=None, *, gen=None, name=None) -> ParityCase:
    """A one-node ``stablehlo`` IR case; ``gen(rng, shape, dtype)`` draws the
    inputs (one for all, or a list: one per model input; default: standard
    normal floats, ints in [-50, 50), bools half true)."""
    cid = name or op_name
    token = f"fbjax-parity-ir:{cid}".encode()
    _IR_MODELS[token] = lambda: _ir(op_name, ins, outs, attrs or {})

    def make():
        rng = _rng(cid)
        xs = []
        for x in ins:
            if isinstance(x, np.ndarray):
                continue
            shape, dt = x[0], np.dtype(x[1])
            g = gen[len(xs)] if isinstance(gen, (list, tuple)) else gen
            if g is not None:
                xs.append(np.asarray(g(rng, shape, dt)).astype(dt))
            elif dt.kind == "f":
                xs.append(rng.standard_normal(shape).astype(dt))
            elif dt.kind == "b":
                xs.append(rng.integers(0, 2, shape).astype(dt))
            else:
                xs.append(rng.integers(-50, 50, shape).astype(dt))
        return token, xs
    return ParityCase(f"ir-{cid}", "stablehlo", make, op=op_name, format=IR_FORMAT)


def _halves(rng, shape, dt):  # exact .5 ties and ordinary values
    return np.round(rng.standard_normal(shape) * 6) / 2 + rng.choice([0, 0.25], shape)


def _ints_any(rng, shape, dt):
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, shape, endpoint=True)


def _shifts(rng, shape, dt):  # in range and out of range ([0, bits) is defined; the rest gives 0 / sign)
    return rng.integers(-2, np.dtype(dt).itemsize * 8 + 3, shape)


S45 = ((4, 5), F32)
I45 = ((4, 5), I32)
B45 = ((4, 5), np.bool_)
U45 = ((4, 5), np.uint8)

STABLEHLO_IR_CASES = [
    ir_case("stablehlo.atan2", [S45, S45], [S45]),
    ir_case("stablehlo.batch_norm_inference",
            [((2, 3, 4), F32), *[_rng("bn").uniform(0.5, 2, 3).astype(F32) for _ in range(4)]], [((2, 3, 4), F32)],
            dict(epsilon=1e-3, feature_index=1)),
    ir_case("stablehlo.ceil", [S45], [S45], gen=_halves),
    ir_case("stablehlo.dot", [((3, 4), F32), ((4, 5), F32)], [((3, 5), F32)]),
    ir_case("stablehlo.exponential_minus_one", [S45], [S45]),
    ir_case("stablehlo.is_finite", [S45], [B45],
            gen=lambda rng, s, d: np.where(rng.random(s) < 0.3, rng.choice([np.inf, -np.inf, np.nan], s),
                                           rng.standard_normal(s))),
    ir_case("stablehlo.log_plus_one", [S45], [S45], gen=lambda rng, s, d: rng.uniform(-0.9, 3, s)),
    ir_case("stablehlo.not", [I45], [I45], gen=_ints_any),
    ir_case("stablehlo.not", [B45], [B45], name="stablehlo.not-bool"),
    ir_case("stablehlo.popcnt", [I45], [I45], gen=_ints_any),
    ir_case("stablehlo.resize_bilinear", [((1, 4, 5, 2), F32), np.array([7, 3], I32)], [((1, 7, 3, 2), F32)],
            dict(align_corners=False, half_pixel_centers=True)),
    ir_case("stablehlo.reverse", [((3, 4, 5), F32)], [((3, 4, 5), F32)], dict(dimensions=[0, 2])),
    ir_case("stablehlo.round_nearest_afz", [S45], [S45], gen=_halves),
    ir_case("stablehlo.round_nearest_even", [S45], [S45], gen=_halves),
    ir_case("stablehlo.shift_right_arithmetic", [I45, I45], [I45], gen=[_ints_any, _shifts]),
    ir_case("stablehlo.shift_right_logical", [I45, I45], [I45], gen=[_ints_any, _shifts]),
    # integer division by zero and INT_MIN / -1 (implementation-defined: XLA's -1 and INT_MIN)
    ir_case("stablehlo.divide", [I45, I45], [I45], name="stablehlo.divide-int",
            gen=[lambda rng, s, d: np.where(rng.random(s) < 0.1, np.iinfo(np.int32).min, rng.integers(-99, 99, s)),
                 lambda rng, s, d: rng.integers(-3, 4, s)]),
    # float -> integer beyond the range, NaN, infinities: saturating (XLA; the spec leaves it open)
    ir_case("stablehlo.convert", [S45], [U45], name="stablehlo.convert-float-to-uint8",
            gen=lambda rng, s, d: np.where(rng.random(s) < 0.2, rng.choice([np.nan, np.inf, -np.inf], s),
                                           rng.uniform(-400, 400, s))),
    # an unsigned operand: the top bit still fills (the StableHLO interpreter's APInt::ashr)
    ir_case("stablehlo.shift_right_arithmetic", [U45, U45], [U45], gen=[_ints_any, _shifts],
            name="stablehlo.shift_right_arithmetic-uint8"),
    ir_case("stablehlo.sign", [S45], [S45],
            gen=lambda rng, s, d: np.where(rng.random(s) < 0.2, rng.choice([0.0, -0.0, np.nan], s),
                                           rng.standard_normal(s))),
    ir_case("stablehlo.sine", [S45], [S45], gen=lambda rng, s, d: rng.uniform(-10, 10, s)),
    ir_case("stablehlo.sqrt", [S45], [S45], gen=lambda rng, s, d: rng.uniform(0, 9, s)),
    ir_case("stablehlo.tan", [S45], [S45], gen=lambda rng, s, d: rng.uniform(-1.2, 1.2, s)),
    ir_case("stablehlo.xor", [I45, I45], [I45], gen=_ints_any),
]

#: cases of the STABLEHLO_* table not used here, with the reason
STABLEHLO_NOT_USED = {
    "STABLEHLO_CUSTOM_CALL": "its target fbjax_test.double is a handler tests/test_tflite_stablehlo.py registers; "
                             "the mhlo.topk case runs stablehlo.custom_call with fbjax's own handler",
}

STABLEHLO_CUSTOM_CALL_CASES = [ParityCase("mhlo.topk", "stablehlo.custom_call", _topk, compare="exact")]

STABLEHLO_CASES = [
    *[_shlo_case(n) for n in sorted(stablehlo_op_cases.CASES) if n not in STABLEHLO_NOT_USED],
    *STABLEHLO_IR_CASES,
    *STABLEHLO_CUSTOM_CALL_CASES,  # stablehlo.custom_call itself, dispatching to mhlo.topk
]


def _composite_block():
    """litert-torch's one-block model (attention with 4 query heads over one
    KV head, RMS norm, layer norm as ``odml.group_norm``), prefill signature."""
    from fbjax.formats import read_model

    path = COMPOSITES / "mqa.tflite"
    rng = _rng("composite-mqa")
    xs = []
    for v in read_model(path).main_graph.inputs:
        if "tokens" in v.name:
            xs.append(rng.integers(0, 64, v.shape).astype(v.dtype))
        elif "input_pos" in v.name:
            xs.append(np.arange(v.shape[0], dtype=v.dtype))
        else:
            xs.append((rng.standard_normal(v.shape) * 0.5).astype(v.dtype))
    return path, xs


#: one block of width 64, MLP 128 (tests/test_tflite_composites.py): 13 chained stages whose
#: longest accumulation is 128 terms; each side within 13 * 128 u of exact, relative to max(1, |y|)
COMPOSITE_TOL = 2 * 13 * 128 * 2.0 ** -24

COMPOSITE_CASES = [ParityCase("composite-mqa-fused", "composite", _composite_block, compare="relative",
                              load_kwargs=dict(composites="fused"), tol=COMPOSITE_TOL)]


#: op set -> its cases
CASES_BY_OP_SET = {
    "tflite": [c for c in TFLITE_FIXTURE_CASES if c.op_set == "tflite"] + TFLITE_EDGE_CASES,
    "tflite.custom": [c for c in TFLITE_FIXTURE_CASES if c.op_set == "tflite.custom"] + TFLITE_CUSTOM_CASES,
    "tflite.int": TFLITE_INT_CASES,
    "tflite.hybrid": TFLITE_HYBRID_CASES,
    "fbjax": FBJAX_CASES,
    "stablehlo": STABLEHLO_CASES,
    "stablehlo.custom_call": STABLEHLO_CUSTOM_CALL_CASES,
    "composite": COMPOSITE_CASES,
}
