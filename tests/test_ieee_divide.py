"""Float division by a broadcast or constant divisor is one correctly rounded
IEEE division per element in every op set (``fbjax.lower.kernels.ieee_divide``).

XLA's algebraic simplifier turns ``x / broadcast(y)`` into
``x * broadcast(1 / y)`` (two roundings); TFLite's DIV kernel, onnxruntime's
``Div`` and the StableHLO spec's ``divide`` round once. IEEE 754 division is
correctly rounded on every conforming machine, so numpy's ``x / y`` is the
oracle bit for bit, whatever the CPU.
"""

from __future__ import annotations

import numpy as np

import fbjax
from fbjax.formats.tflite_builder import TFLiteBuilder

import rten_builders as T
from fbjax.formats._generated import rten_generated as R

#: divisors whose reciprocal is inexact: x * (1/y) differs from x / y for some x
DIVISORS = (3.0, 7.0, 0.1, 1.7)
X = np.linspace(-50.0, 50.0, 240, dtype=np.float32).reshape(8, 30)


def _differs_when_multiplied(y: float) -> int:
    """How many elements the two-rounding rewrite gets wrong (the test's power)."""
    y32 = np.float32(y)
    return int(np.count_nonzero(X * (np.float32(1) / y32) != X / y32))


def test_the_rewrite_would_be_visible():
    assert all(_differs_when_multiplied(y) > 0 for y in DIVISORS)


def test_tflite_div_by_a_constant_scalar():
    for y in DIVISORS:
        b = TFLiteBuilder()
        x = b.add_input(X.shape)
        c = b.add_tensor(data=np.array([y], np.float32), name="divisor")
        out = b.add_tensor(X.shape)
        b.add_op("DIV", [x, c], [out])
        b.add_output(out)
        got = np.asarray(fbjax.load(b.build())(X))
        np.testing.assert_array_equal(got, X / np.float32(y), err_msg=f"DIV by {y}")


def test_onnx_div_by_a_constant_scalar():
    for y in DIVISORS:
        data = T.rten_file([T.value_node("x", list(X.shape)), T.const_node("y", np.array([y], np.float32)),
                            T.value_node("z", list(X.shape)), T.op_node(R.OperatorType.Div, [0, 1], [2])],
                           [0], [2])
        got = np.asarray(fbjax.load(data, format="rten")(X))
        np.testing.assert_array_equal(got, X / np.float32(y), err_msg=f"Div by {y}")


def test_stablehlo_divide_by_a_broadcast_constant():
    """``STABLEHLO_BROADCAST_IN_DIM`` of a scalar, then ``STABLEHLO_DIVIDE``
    (the pattern XLA rewrites; a full-shape divisor alone is a param)."""
    for y in DIVISORS:
        b = TFLiteBuilder()
        x = b.add_input(X.shape)
        c = b.add_tensor(data=np.array(y, np.float32).reshape(()), name="divisor")
        yb = b.add_tensor(X.shape)
        b.add_op("STABLEHLO_BROADCAST_IN_DIM", [c], [yb], options=dict(broadcast_dimensions=[]))
        out = b.add_tensor(X.shape)
        b.add_op("STABLEHLO_DIVIDE", [x, yb], [out])
        b.add_output(out)
        got = np.asarray(fbjax.load(b.build())(X))
        np.testing.assert_array_equal(got, X / np.float32(y), err_msg=f"stablehlo.divide by {y}")


def test_tflite_rsqrt_is_one_over_a_correctly_rounded_sqrt():
    """LiteRT's float RSQRT is ``1.f / std::sqrt(f)``: two correctly rounded operations, so numpy's
    ``1 / sqrt(x)`` is the oracle bit for bit. (XLA:CPU's own rsqrt, which XLA substitutes for
    ``1 / sqrt``, missed it in the last bit for 33 % of such inputs on this project's machines.)"""
    x = (np.random.default_rng(0).random((64, 500), dtype=np.float32) * 100 + 1e-3).astype(np.float32)
    want = np.float32(1) / np.sqrt(x)
    b = TFLiteBuilder()
    t = b.add_input(x.shape)
    out = b.add_tensor(x.shape)
    b.add_op("RSQRT", [t], [out])
    b.add_output(out)
    np.testing.assert_array_equal(np.asarray(fbjax.load(b.build())(x)), want)
