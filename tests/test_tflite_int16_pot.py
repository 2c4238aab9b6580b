"""int16 LOGISTIC/TANH with a power-of-two input scale, bit for bit against
LiteRT's builtin kernels, on single-op models built here in memory.

TFLite's ``SigmoidPrepare``/``TanhPrepare`` (LiteRT 2.3.0) compute
``left = 12 + CheckedLog2(input scale)``; when the scale is a power of two
(within 1e-3 in log2) and ``left`` is 0 (LOGISTIC), or 0 or 1 (TANH), the
input multiplier stays 0 and ``SigmoidEval``/``TanhEval`` run
``optimized_ops::Logistic``/``Tanh`` on int16: gemmlowp's fixed-point
``logistic``/``tanh`` on ``FixedPoint<int16_t, 3>`` (TANH with ``left == 1``
first applies ``SaturatingRoundingMultiplyByPOT<1>`` to the codes): 8-lane
bodies when built with SSE4.1, then a scalar tail (the two round alike here). Every other scale takes the table
kernel (``reference_integer_ops``), checked here only at the boundaries of
the selection.

Each case runs every int16 code (65536, a multiple of 8 and 16: all in the
vector body) followed by a 7-element scalar tail, and a [3, 5, 7] tensor
(105 = 13 * 8 + 1) of random codes; the oracle is LiteRT, and the numpy twin
is checked on the same elements. No tolerance: the kernels are integer.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import require  # noqa: E402
litert = require("ai_edge_litert.interpreter")

import fbjax  # noqa: E402
from fbjax.reference import run as reference_run  # noqa: E402
from fbjax.formats.tflite_builder import TFLiteBuilder  # noqa: E402

#: every int16 code, then a scalar tail of extremes and small values
ALL = np.concatenate([np.arange(-32768, 32768), [-32768, 32767, -1, 0, 1, 4096, -4097]]).astype(np.int16)[None]
RANDOM = np.random.default_rng(0).integers(-32768, 32768, (3, 5, 7)).astype(np.int16)


def one_op(op: str, shape, in_scale: float, out_scale: float = 2.0**-15) -> bytes:
    """A .tflite with one int16 ``op`` (zero points 0), version 3 (int16)."""
    b = TFLiteBuilder()
    x = b.add_input(tuple(shape), np.int16, name="x", quant=(in_scale, 0))
    y = b.add_tensor(tuple(shape), np.int16, name="y", quant=(out_scale, 0))
    b.add_op(op, [x], [y], version=3)
    b.add_output(y)
    return b.build()


def litert_run(content: bytes, x: np.ndarray) -> np.ndarray:
    it = litert.Interpreter(model_content=content,
                            experimental_op_resolver_type=litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"])


def check(op: str, in_scale: float, x: np.ndarray) -> None:
    content = one_op(op, x.shape, in_scale)
    want = litert_run(content, x)
    m = fbjax.load(content)
    got = np.asarray(m(x))
    assert got.dtype == want.dtype == np.int16 and got.shape == want.shape
    bad = int((got != want).sum())
    assert bad == 0, f"fbjax: {bad} of {want.size} elements differ from LiteRT"
    twin = reference_run(m, x)[0]
    bad = int((np.asarray(twin) != want).sum())
    assert bad == 0, f"numpy twin: {bad} of {want.size} elements differ from LiteRT"


@pytest.mark.parametrize("op,in_scale", [("LOGISTIC", 2.0**-12), ("TANH", 2.0**-12), ("TANH", 2.0**-11)])
@pytest.mark.parametrize("data", ["all_codes", "random_3x5x7"])
def test_int16_pot_gemmlowp_kernel(op, in_scale, data):
    check(op, in_scale, ALL if data == "all_codes" else RANDOM)


@pytest.mark.parametrize("op,in_scale", [
    ("LOGISTIC", 2.0**-12 * (1 + 2.0**-12)),  # CheckedLog2 still says 2^-12: gemmlowp, input read as 2^-12
    ("TANH", 2.0**-11 * (1 - 2.0**-12)),       # likewise, 2^-11
    ("LOGISTIC", 2.0**-11),                    # left == 1: LOGISTIC takes the table kernel
    ("TANH", 2.0**-10),                        # left == 2: table kernel
    ("TANH", 2.0**-13),                        # left == -1: table kernel
])
def test_int16_kernel_selection(op, in_scale):
    """The power-of-two test and the ``left`` range that pick the kernel."""
    check(op, in_scale, ALL)


@pytest.mark.parametrize("op,in_scale,bound", [("LOGISTIC", 2.0**-12, 8), ("TANH", 2.0**-12, 16),
                                               ("TANH", 2.0**-11, 16)])
def test_int16_pot_oracle_sanity(op, in_scale, bound):
    """The oracle computes the function: over every code, LiteRT's Q0.15
    output is within ``bound`` steps of ``32768 f(x)`` (measured maxima: 6.4
    for LOGISTIC, 11.8 for TANH; gemmlowp's int16 polynomial and three
    Newton steps are that coarse), and exactly 16384 / 0 at x = 0."""
    x = ALL[:, :65536]
    want = litert_run(one_op(op, x.shape, in_scale), x)
    v = x.astype(np.float64) * in_scale
    f = 1.0 / (1.0 + np.exp(-v)) if op == "LOGISTIC" else np.tanh(v)
    assert np.abs(want - 32768 * f).max() <= bound
    assert want[0, 32768] == (16384 if op == "LOGISTIC" else 0)
