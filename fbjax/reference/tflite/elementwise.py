"""Element-wise TFLite ops: binary arithmetic, activations, PRELU.

Float inputs are computed in float64 and rounded once to the output dtype.
int32/int64 ADD/SUB/MUL/DIV use integer arithmetic (wrapping like the C++
kernels); quantized integer tensors are refused (see ``reject_quantized``).
"""

from __future__ import annotations

import numpy as np

from ...errors import InputError
from ..registry import register
from . import fused_activation, reject_quantized, require_float, to_out


def _binary(ctx, op, x, y, act):
    reject_quantized(ctx)
    if x.dtype != y.dtype:
        raise ctx.error(f"input dtypes differ: {x.dtype.name} and {y.dtype.name}")
    if np.issubdtype(x.dtype, np.floating):
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            r = op(x.astype(np.float64), y.astype(np.float64))
    elif np.issubdtype(x.dtype, np.integer):
        with np.errstate(over="ignore"):
            r = op(x, y)
    else:
        raise ctx.error(f"{x.dtype.name} inputs are not arithmetic")
    return to_out(ctx, fused_activation(ctx, r, act))


def _register_fused_binary(name: str, fn, doc: str):
    def op(ctx, x, y, *, fused_activation_function="NONE"):
        return _binary(ctx, fn, x, y, fused_activation_function)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = doc
    register("tflite", name)(op)
    return op


#: two-input arithmetic with a ``fused_activation_function`` (DIV: below)
_FUSED_BINARY = {
    "ADD": (np.add, "``x + y`` with numpy broadcasting (kernels/add.cc, float/int paths)."),
    "SUB": (np.subtract, "``x - y`` with numpy broadcasting (kernels/sub.cc)."),
    "MUL": (np.multiply, "``x * y`` with numpy broadcasting (kernels/mul.cc)."),
}
for _n, (_f, _d) in _FUSED_BINARY.items():
    _register_fused_binary(_n, _f, _d)


def _truncating_divide(a, b):
    """C++ integer division: the quotient rounded toward zero."""
    q = np.abs(a) // np.abs(b)
    return np.where((a < 0) != (b < 0), -q, q).astype(np.result_type(a, b))


@register("tflite", "DIV")
def DIV(ctx, x, y, *, fused_activation_function="NONE"):
    """``x / y`` with numpy broadcasting (kernels/div.cc).

    Floats follow IEEE (x/0 is +-inf or nan); int32 rounds toward zero like
    C++, and a zero divisor is an error, as in TFLite's int32 kernel.
    """
    if np.issubdtype(x.dtype, np.integer) and not np.issubdtype(y.dtype, np.floating):
        if np.any(y == 0):
            raise InputError(f"{ctx.node.location} (DIV): integer division by zero")
        return _binary(ctx, _truncating_divide, x, y, fused_activation_function)
    return _binary(ctx, np.divide, x, y, fused_activation_function)


def _unary(ctx, x, f):
    require_float(ctx, x)
    with np.errstate(over="ignore", invalid="ignore"):
        return to_out(ctx, f(x.astype(np.float64)))


def _register_float_unary(name: str, fn, doc: str):
    def op(ctx, x):
        return _unary(ctx, x, fn)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = doc
    register("tflite", name)(op)
    return op


#: float activations (kernels/activations.cc): ``name: (fn on float64, doc)``
_FLOAT_UNARY = {
    "RELU": (lambda v: np.maximum(v, 0), "``max(x, 0)`` (ReluEval)."),
    "RELU6": (lambda v: np.clip(v, 0, 6), "``min(max(x, 0), 6)`` (Relu6Eval)."),
    "RELU_N1_TO_1": (lambda v: np.clip(v, -1, 1), "``min(max(x, -1), 1)`` (Relu1Eval)."),
    "RELU_0_TO_1": (lambda v: np.clip(v, 0, 1), "``min(max(x, 0), 1)`` (Relu0to1Eval)."),
    "TANH": (np.tanh, "``tanh(x)`` (TanhEval, float path)."),
    "LOGISTIC": (lambda v: 0.5 + 0.5 * np.tanh(0.5 * v),
                 "``1 / (1 + exp(-x))`` (SigmoidEval, float path), evaluated as ``0.5 + 0.5 * tanh(x / 2)``, "
                 "the same function without overflow for large ``|x|``."),
}
for _n, (_f, _d) in _FLOAT_UNARY.items():
    _register_float_unary(_n, _f, _d)


@register("tflite", "HARD_SWISH")
def HARD_SWISH(ctx, x):
    """``x * relu6(x + 3) / 6`` (kernels/activations.cc HardSwishEval), in
    float32 in the builtin x86 kernel's order: ``(x * (1/6)) * relu6(x + 3)``,
    the last ``size % 4`` elements ``(x * relu6(x + 3)) * (1/6)``."""
    if np.asarray(x).dtype != np.float32:
        return _unary(ctx, x, lambda v: v * np.clip(v + 3.0, 0.0, 6.0) / 6.0)
    x = np.asarray(x)
    sixth = np.float32(1.0) / np.float32(6.0)
    r6 = np.clip(x + np.float32(3.0), np.float32(0.0), np.float32(6.0))
    y = (x * sixth) * r6
    flat, tail = y.reshape(-1), x.size % 4
    if tail:
        flat[x.size - tail:] = ((x * r6) * sixth).reshape(-1)[x.size - tail:]
    return to_out(ctx, flat.reshape(x.shape))


@register("tflite", "PRELU")
def PRELU(ctx, x, alpha):
    """``x >= 0 ? x : alpha * x`` with ``alpha`` broadcast against ``x``
    (kernels/activations.cc PreluEval; the output has the broadcast shape)."""
    require_float(ctx, x, alpha)
    xf, af = x.astype(np.float64), alpha.astype(np.float64)
    return to_out(ctx, np.where(xf >= 0, xf, xf * af))
