"""int16 ADD/SUB with general (non power-of-two) scales, bit for bit against
LiteRT's builtin kernels, on single-op models built here in memory.

LiteRT 2.3.0 rescales the inputs of an int16 ADD on equal shapes with one
rounding (``x = v << (15 + e)`` or ``v >> -(15 + e)``, then
``(x * m + 2^30) >> 31``), and those of SUB and of a broadcasting ADD with
two (``SRDHM`` then ``RoundingDivideByPOT``). The two differ only where the
final rescale lands within about 1e-4 of a half, so the converter's int16x8
fixtures (tests/data/quant/ops) rarely see it; the scales below make it
frequent: a multiplier ``1.5 * 2^-16`` puts every even input on an exact tie
of the input rescale, ``1.3 * 2^-17`` exercises ``e < -15``, and the other
triples are taken from ai-edge-quantizer's a16w8 face detector.

Every int16 value goes through the rescaled input (the other input random),
followed by a 15-element scalar tail, so each case checks 65551 elements; the oracle is LiteRT, and the numpy
twin is checked on the same elements.
"""

from __future__ import annotations

import flatbuffers
import numpy as np
import pytest

from conftest import require  # noqa: E402
litert = require("ai_edge_litert.interpreter")

import fbjax  # noqa: E402
from fbjax.formats._generated import tflite_generated as T  # noqa: E402
from fbjax.reference import run as reference_run  # noqa: E402

#: (s_in1, s_in2, s_out), float32 as stored. In the synthetic ones (the
#: first five) the other input is 0 and ``s_out`` is about ``2 max s / 2^15``,
#: so the output is the rounded input rescale itself (the output multiplier
#: is ``1 - 1e-4`` or ``1 - 2^-20``); e is the input multiplier's exponent.
SCALES = {
    "tie_e-15": (3 * 2.0**-16, 1.0, 2.0**-14 * 1.0001),
    "tie_e-15_swapped": (1.0, 3 * 2.0**-16, 2.0**-14 * 1.0001),
    "e-17": (1.3 * 2.0**-17, 1.0, 2.0**-14 * (1 + 2.0**-20)),
    "e-21": (1.3 * 2.0**-21, 1.0, 2.0**-14 * (1 + 2.0**-20)),
    "e-30": (1.3 * 2.0**-30, 1.0, 2.0**-14 * (1 + 2.0**-20)),
    "face_op25": (0.00026918735238723457, 0.0002533885126467794, 0.00017411491717211902),
    "face_op4": (0.0001247492036782205, 0.00040292434277944267, 0.0003129330580122769),
}


def single_op_model(op: str, shape_a, shape_b, scales, *, activation: str = "NONE",
                    pot_scale_int16: bool = True) -> bytes:
    """A .tflite with one int16 ADD or SUB: inputs ``a``, ``b``, output ``y``."""
    act = getattr(T.ActivationFunctionType, activation)
    tensors = []
    out_shape = np.broadcast_shapes(tuple(shape_a), tuple(shape_b))
    for i, (name, shape, s) in enumerate(zip("aby", (shape_a, shape_b, out_shape), scales)):
        t = T.TensorT()
        t.name, t.shape, t.type, t.buffer = name, list(shape), T.TensorType.INT16, 0
        q = T.QuantizationParametersT()
        q.scale, q.zeroPoint = [float(np.float32(s))], [0]
        t.quantization = q
        tensors.append(t)
    code = T.OperatorCodeT()
    code.builtinCode = getattr(T.BuiltinOperator, op)
    code.deprecatedBuiltinCode = code.builtinCode
    code.version = 3
    node = T.OperatorT()
    node.opcodeIndex, node.inputs, node.outputs = 0, [0, 1], [2]
    opts = T.AddOptionsT() if op == "ADD" else T.SubOptionsT()
    opts.fusedActivationFunction, opts.potScaleInt16 = act, pot_scale_int16
    node.builtinOptionsType = T.BuiltinOptions.AddOptions if op == "ADD" else T.BuiltinOptions.SubOptions
    node.builtinOptions = opts
    sg = T.SubGraphT()
    sg.tensors, sg.inputs, sg.outputs, sg.operators = tensors, [0, 1], [2], [node]
    m = T.ModelT()
    m.version, m.operatorCodes, m.subgraphs, m.buffers = 3, [code], [sg], [T.BufferT()]
    b = flatbuffers.Builder(1024)
    b.Finish(m.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def litert_run(content: bytes, a, b):
    it = litert.Interpreter(model_content=content,
                            experimental_op_resolver_type=litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    it.allocate_tensors()
    ins = it.get_input_details()
    it.set_tensor(ins[0]["index"], a)
    it.set_tensor(ins[1]["index"], b)
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"])


#: every int16 value, then 15 ties of ``tie_e-15`` in the scalar tail
#: (65551 = 16 * 4096 + 15 elements).
ALL = np.concatenate([np.arange(-32768, 32768), np.full(15, -2)]).astype(np.int16)


@pytest.mark.parametrize("op", ["ADD", "SUB"])
@pytest.mark.parametrize("layout", ["same", "rank", "broadcast"])
@pytest.mark.parametrize("name", sorted(SCALES))
def test_int16_add_sub_general_scales(name, layout, op):
    """``same``: equal shapes (ADD: one rounding); ``rank``: ``[1, n] + [n]``,
    equal once left-padded, so LiteRT does not broadcast (one rounding);
    ``broadcast``: ``[1, n] + [1, 1]`` (two roundings)."""
    sa, sb, so = SCALES[name]
    rng = np.random.default_rng(0)
    small_first = sa < sb  # the input whose multiplier rounds gets every int16 value
    full = ALL[None]
    other = rng.integers(-32768, 32768, ALL.size).astype(np.int16)
    if not name.startswith("face"):
        other[:] = 0
    if layout == "broadcast":
        other = np.zeros((1, 1), np.int16)  # b = 0: the sum is the rescaled a alone
        a, b, shape_b = full, other, (1, 1)
        if not small_first:
            sa, sb = sb, sa  # keep the rounding input first: it is the one not broadcast
    else:
        a, b = (full, other[None]) if small_first else (other[None], full)
        shape_b = (ALL.size,) if layout == "rank" else (1, ALL.size)
        b = b.reshape(shape_b)
    content = single_op_model(op, a.shape, shape_b, (sa, sb, so))
    want = litert_run(content, a, b)
    m = fbjax.load(content)
    got = np.asarray(m(a, b))
    assert got.dtype == want.dtype and got.shape == want.shape
    bad = int((got != want).sum())
    assert bad == 0, f"{bad} of {want.size} elements differ from LiteRT"
    twin = reference_run(m, a, b)[0]
    assert np.array_equal(twin, want)


@pytest.mark.parametrize("activation", ["RELU", "RELU_N1_TO_1"])
def test_int16_add_fused_activation(activation):
    """The fused clamp follows the one-rounding sum (negative ties included:
    RELU_N1_TO_1 keeps them)."""
    sa, sb, so = SCALES["tie_e-15"]
    content = single_op_model("ADD", (1, ALL.size), (1, ALL.size), (sa, sb, so), activation=activation)
    b = np.zeros((1, ALL.size), np.int16)
    want = litert_run(content, ALL[None], b)
    assert np.array_equal(np.asarray(fbjax.load(content)(ALL[None], b)), want)


def test_int16_add_ties_round_up():
    """The measured facts the lowering encodes: with the multiplier
    ``1.5 * 2^-16``, ``(v << 15) * m / 2^46 = 3v/4``; LiteRT's ADD rounds the
    tie ``-1.5`` to ``-1`` (half up) in its 16-lane vector body (the first
    ``16 floor(size / 16)`` elements) and to ``-2`` (half away, the double
    rounding) in the scalar tail; SUB gives ``-2`` everywhere; the
    pot_scale_int16 flag does not matter."""
    sa, sb, so = SCALES["tie_e-15"]
    a = np.array([[-2, 2] * 8 + [-2, 2]], np.int16)  # 16 vector-body elements, then a 2-element tail
    zero = np.zeros_like(a)
    want_add = [[-1, 2] * 8 + [-2, 2]]
    for pot in (True, False):
        add = litert_run(single_op_model("ADD", a.shape, a.shape, (sa, sb, so), pot_scale_int16=pot), a, zero)
        sub = litert_run(single_op_model("SUB", a.shape, a.shape, (sa, sb, so), pot_scale_int16=pot), a, zero)
        assert add.tolist() == want_add and sub.tolist() == [[-2, 2] * 9]
    m = fbjax.load(single_op_model("ADD", a.shape, a.shape, (sa, sb, so)))
    assert np.asarray(m(a, zero)).tolist() == want_add
    assert reference_run(m, a, zero)[0].tolist() == want_add


def test_int16_add_rejects_zero_points():
    """LiteRT's add.cc refuses int16 zero points other than 0 at Prepare; fbjax
    raises a ModelFormatError naming the node instead of guessing."""
    content = bytearray(single_op_model("ADD", (1, 4), (1, 4), SCALES["face_op4"]))
    m = T.ModelT.InitFromObj(T.Model.GetRootAs(bytes(content), 0))
    m.subgraphs[0].tensors[0].quantization.zeroPoint = [5]
    b = flatbuffers.Builder(1024)
    b.Finish(m.Pack(b), file_identifier=b"TFL3")
    with pytest.raises(fbjax.errors.ModelFormatError, match="zero points 0"):
        fbjax.load(bytes(b.Output()))(np.zeros((1, 4), np.int16), np.zeros((1, 4), np.int16))
