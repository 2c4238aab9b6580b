"""numpy twins of :mod:`fbjax.lower.onnx.elementwise` (ONNX element-wise ops)."""

from __future__ import annotations

import math

import numpy as np

from ... import op_rules
from ..registry import register
from ._util import OP_SET, out

_erf = np.vectorize(math.erf, otypes=[np.float64])

_UNARY = {
    "Abs": np.abs, "Neg": np.negative, "Exp": np.exp, "Log": np.log, "Sqrt": np.sqrt, "Sin": np.sin,
    "Cos": np.cos, "Tan": np.tan, "Asin": np.arcsin, "Acos": np.arccos, "Atan": np.arctan, "Tanh": np.tanh,
    "Sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x.astype(np.float64))),
    "Erf": lambda x: _erf(x.astype(np.float64)),
    "Relu": lambda x: np.maximum(x, 0),
    "Softplus": lambda x: np.logaddexp(0.0, x.astype(np.float64)),
    "Sign": np.sign, "Round": np.round, "Floor": np.floor, "Ceil": np.ceil,
    "Reciprocal": lambda x: 1.0 / x.astype(np.float64),
    "HardSwish": lambda x: x * np.clip(x + 3.0, 0, 6) / 6.0,
}


def _make_unary(name, f):
    def op(ctx, X):
        with np.errstate(all="ignore"):
            return out(ctx, f(np.asarray(X)))
    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"numpy ONNX ``{name}``."
    register(OP_SET, name)(op)


for _n, _f in _UNARY.items():
    _make_unary(_n, _f)


@register(OP_SET, "Identity")
def Identity(ctx, input):
    """numpy ONNX ``Identity``."""
    return [input] if isinstance(input, list) else input


@register(OP_SET, "Dropout")
def Dropout(ctx, data, ratio=None, training_mode=None, *, seed=None):
    """numpy ONNX ``Dropout``: identity with a mask of ones unless ``training_mode``
    is true and ``ratio`` (default 0.5) not 0; then elements are kept with
    probability ``1 - ratio`` and scaled by ``1 / (1 - ratio)``, the mask drawn
    with ``numpy.random.default_rng(seed)`` (a distribution twin of the JAX
    lowering, not a bit twin). The mask is int32 (RTen has no bool).
    """
    x = np.asarray(data)
    train = training_mode is not None and bool(np.asarray(training_mode).reshape(-1)[0])
    r = 0.5 if ratio is None else float(np.asarray(ratio).reshape(-1)[0])
    want_mask = len(ctx.outputs) > 1 and ctx.outputs[1] is not None
    if not train or r == 0.0:
        mask = np.ones(x.shape, np.int32)
        y = x
    else:
        if not 0.0 <= r < 1.0:
            raise ctx.error(f"Dropout ratio {r} is outside [0, 1)")
        mask = (np.random.default_rng(None if seed is None else int(seed)).random(x.shape) >= r).astype(np.int32)
        y = np.where(mask == 1, x / np.asarray(1.0 - r, x.dtype), np.zeros((), x.dtype)).astype(x.dtype)
    if want_mask:
        return [y, out(ctx, mask, 1)]
    return [y] + [None] * (len(ctx.outputs) - 1)


def _trunc_div(a, b):
    q = np.abs(a) // np.abs(b)
    return np.where((a < 0) != (b < 0), -q, q)


_BINARY = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply,
    "Div": lambda a, b: a / b if a.dtype.kind == "f" else _trunc_div(a, b),
}


def _make_binary(name, f):
    def op(ctx, A, B):
        with np.errstate(all="ignore"):
            return out(ctx, f(np.asarray(A), np.asarray(B)))
    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"numpy ONNX ``{name}``."
    register(OP_SET, name)(op)


for _n, _f in _BINARY.items():
    _make_binary(_n, _f)


@register(OP_SET, "Pow")
def Pow(ctx, X, Y):
    """numpy ONNX ``Pow`` in X's dtype."""
    return out(ctx, np.power(np.asarray(X, np.float64), np.asarray(Y, np.float64)))


@register(OP_SET, "Mod")
def Mod(ctx, A, B, *, fmod=False):
    """numpy ONNX ``Mod`` (``fmod``: sign of A; else sign of B)."""
    return out(ctx, np.fmod(A, B) if fmod else np.mod(A, B))


_CMP = {"Equal": np.equal, "Greater": np.greater, "GreaterOrEqual": np.greater_equal, "Less": np.less,
        "LessOrEqual": np.less_equal, "And": lambda a, b: (a != 0) & (b != 0),
        "Or": lambda a, b: (a != 0) | (b != 0), "Xor": lambda a, b: (a != 0) ^ (b != 0)}


def _make_cmp(name, f):
    def op(ctx, A, B):
        return out(ctx, f(np.asarray(A), np.asarray(B)).astype(np.int32))
    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"numpy ONNX ``{name}`` -> int32 0/1."
    register(OP_SET, name, out_dtype=op_rules.int32_out)(op)


for _n, _f in _CMP.items():
    _make_cmp(_n, _f)


@register(OP_SET, "Not", out_dtype=op_rules.int32_out)
def Not(ctx, X):
    """numpy ONNX ``Not`` -> int32 0/1."""
    return out(ctx, (np.asarray(X) == 0).astype(np.int32))


@register(OP_SET, "IsNaN", out_dtype=op_rules.int32_out)
def IsNaN(ctx, X):
    """numpy ONNX ``IsNaN``."""
    return out(ctx, np.isnan(X).astype(np.int32))


@register(OP_SET, "IsInf", out_dtype=op_rules.int32_out)
def IsInf(ctx, X):
    """numpy ONNX ``IsInf``."""
    return out(ctx, np.isinf(X).astype(np.int32))


def _make_var(name, f):
    def op(ctx, *xs):
        return out(ctx, f([np.asarray(x) for x in xs if x is not None]))
    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"numpy ONNX ``{name}`` (variadic)."
    register(OP_SET, name)(op)


_make_var("Max", lambda xs: np.maximum.reduce(np.broadcast_arrays(*xs)) if len(xs) > 1 else xs[0])
_make_var("Min", lambda xs: np.minimum.reduce(np.broadcast_arrays(*xs)) if len(xs) > 1 else xs[0])
_make_var("Sum", lambda xs: sum(xs[1:], xs[0]))
_make_var("Mean", lambda xs: sum(xs[1:], xs[0]) / len(xs))


@register(OP_SET, "Clip")
def Clip(ctx, X, min=None, max=None):
    """numpy ONNX ``Clip``."""
    y = np.asarray(X)
    if min is not None:
        y = np.maximum(y, min)
    if max is not None:
        y = np.minimum(y, max)
    return out(ctx, y)


def _where_dtype(node, k, graphs):
    """The dtype of ``X`` (input 1)."""
    x = node.inputs[1] if len(node.inputs) > 1 else None
    return x.dtype if x is not None and x.dtype is not None else None


@register(OP_SET, "Where", out_dtype=_where_dtype)
def Where(ctx, condition, X, Y):
    """numpy ONNX ``Where``."""
    return out(ctx, np.where(np.asarray(condition) != 0, X, Y))


@register(OP_SET, "LeakyRelu")
def LeakyRelu(ctx, X, *, alpha=0.0):
    """numpy ONNX ``LeakyRelu``."""
    return out(ctx, np.where(X < 0, X * alpha, X))


@register(OP_SET, "PRelu")
def PRelu(ctx, X, slope):
    """numpy ONNX ``PRelu``."""
    return out(ctx, np.where(X < 0, X * slope, X))


@register(OP_SET, "Elu")
def Elu(ctx, X, *, alpha=0.0):
    """numpy ONNX ``Elu``."""
    return out(ctx, np.where(X < 0, alpha * np.expm1(np.asarray(X, np.float64)), X))


@register(OP_SET, "HardSigmoid")
def HardSigmoid(ctx, X, *, alpha=0.0, beta=0.0):
    """numpy ONNX ``HardSigmoid``."""
    return out(ctx, np.clip(np.asarray(X, np.float64) * alpha + beta, 0, 1))


@register(OP_SET, "Gelu")
def Gelu(ctx, X, *, approximate="None"):
    """numpy ONNX ``Gelu`` (erf or tanh form)."""
    x = np.asarray(X, np.float64)
    if approximate == "Tanh":
        return out(ctx, 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))))
    return out(ctx, 0.5 * x * (1 + _erf(x / np.sqrt(2))))


def _cast_dtype(node, k, graphs):
    """``to`` (absent: RTen's DataType 0, int32)."""
    return node.attrs.get("to") or np.dtype(np.int32)


@register(OP_SET, "Cast", out_dtype=_cast_dtype)
def Cast(ctx, input, *, to=np.dtype(np.int32)):
    """numpy ONNX ``Cast`` (float -> int truncates)."""
    return np.asarray(input).astype(np.dtype(to if to is not None else np.int32))


def _castlike_dtype(node, k, graphs):
    """The dtype of input 1 (``target_type``)."""
    t = node.inputs[1] if len(node.inputs) > 1 else None
    return None if t is None else (t.dtype or np.dtype(np.float32))


@register(OP_SET, "CastLike", out_dtype=_castlike_dtype)
def CastLike(ctx, input, target_type):
    """numpy ONNX ``CastLike``."""
    return np.asarray(input).astype(np.asarray(target_type).dtype)
