"""ONNX element-wise ops (numpy broadcasting): arithmetic, comparisons, logic,
activations, casts.

Spec: https://onnx.ai/onnx/operators/ . RTen has no bool at runtime:
comparisons and logical ops return int32 0/1 and accept int32 0/1.
Attribute defaults are the RTen schema's (``LeakyReluAttrs.alpha`` = 0...):
rten-convert writes every ONNX default that differs from them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ... import op_rules
from .. import kernels
from ..registry import register
from . import random as _random
from ._util import OP_SET, as_bool, from_bool, is_float


#: unary ops whose output lies in a bounded range (the ``squashing`` fact)
_SQUASHING = frozenset({"Sigmoid"})


def _unary(name: str, fn, doc: str, differentiable: bool = True):
    def op(ctx, X):
        return fn(jnp.asarray(X))

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"ONNX ``{name}``: {doc}"
    register(OP_SET, name, differentiable=differentiable, squashing=name in _SQUASHING)(op)
    return op


_UNARY = {
    "Abs": (jnp.abs, "``|x|``."),
    "Neg": (jnp.negative, "``-x``."),
    "Exp": (jnp.exp, "``e**x``."),
    "Log": (jnp.log, "natural logarithm."),
    "Sqrt": (jnp.sqrt, "square root."),
    "Sin": (jnp.sin, "sine."),
    "Cos": (jnp.cos, "cosine."),
    "Tan": (jnp.tan, "tangent."),
    "Asin": (jnp.arcsin, "arcsine."),
    "Acos": (jnp.arccos, "arccosine."),
    "Atan": (jnp.arctan, "arctangent."),
    "Tanh": (jnp.tanh, "hyperbolic tangent."),
    "Sigmoid": (jax.nn.sigmoid, "``1 / (1 + e**-x)``."),
    "Erf": (jax.scipy.special.erf, "Gauss error function."),
    "Relu": (jax.nn.relu, "``max(x, 0)``."),
    "Softplus": (jax.nn.softplus, "``log(1 + e**x)``."),
    "Sign": (jnp.sign, "-1, 0 or 1."),
    "Round": (jnp.round, "round half to even."),
    "Floor": (jnp.floor, "floor."),
    "Ceil": (jnp.ceil, "ceiling."),
    "Reciprocal": (lambda x: 1 / x, "``1 / x``."),
    "HardSwish": (lambda x: x * jnp.clip(x + 3, 0, 6) / 6, "``x * relu6(x + 3) / 6``."),
}
for _n, (_f, _d) in _UNARY.items():
    _unary(_n, _f, _d)


@register(OP_SET, "Identity", batch=op_rules.same_as_input)
def Identity(ctx, input):
    """ONNX ``Identity`` (tensors and sequences)."""
    return [input] if isinstance(input, list) else input


@register(OP_SET, "Dropout", static_inputs=(1, 2), batch=op_rules.same_as_input, stateful=_random.draws,
          init_state=_random.DRAWS["init_state"])
def Dropout(ctx, data, ratio=None, training_mode=None, *, seed=None):
    """ONNX ``Dropout``: ``(output, mask)``.

    Identity with a mask of ones unless ``training_mode`` (a load-time
    constant, default false) is true and ``ratio`` (load-time constant,
    default 0.5) is not 0; then each element is kept with probability
    ``1 - ratio`` and scaled by ``1 / (1 - ratio)``, zeroed otherwise (mask
    int32 0/1: RTen has no bool). The mask is drawn from the model's explicit
    PRNG key (``Model.state["prng_key"]``, see :mod:`.random`); ``seed``
    seeds the initial key when this is the first drawing node.
    """
    x = jnp.asarray(data)
    want_mask = len(ctx.outputs) > 1 and ctx.outputs[1] is not None
    train = training_mode is not None and bool(np.asarray(training_mode).reshape(-1)[0])
    r = 0.5 if ratio is None else float(np.asarray(ratio).reshape(-1)[0])
    if not train or r == 0.0:
        return (x, jnp.ones(x.shape, jnp.int32)) if want_mask else x
    if not 0.0 <= r < 1.0:
        raise ctx.error(f"Dropout ratio {r} is outside [0, 1)")

    keep = jax.random.bernoulli(_random.next_key(ctx), 1.0 - r, x.shape)
    y = jnp.where(keep, x / jnp.asarray(1.0 - r, x.dtype), jnp.zeros((), x.dtype))
    return (y, keep.astype(jnp.int32)) if want_mask else y


def _binary(name: str, fn, doc: str):
    def op(ctx, A, B):
        return fn(ctx, jnp.asarray(A), jnp.asarray(B))

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"ONNX ``{name}`` (multidirectional broadcasting): {doc}"
    register(OP_SET, name)(op)
    return op


def _int_div(a, b):
    """Integer division truncating toward zero (C semantics, as onnxruntime)."""
    q = lax.div(*jnp.broadcast_arrays(a, b))
    return q


_binary("Add", lambda ctx, a, b: a + b, "``A + B``.")
_binary("Sub", lambda ctx, a, b: a - b, "``A - B``.")
_binary("Mul", lambda ctx, a, b: a * b, "``A * B``.")
_binary("Div", lambda ctx, a, b: kernels.ieee_divide(a, b) if is_float(a) else _int_div(a, b),
        "``A / B``, rounded once per element (:func:`fbjax.lower.kernels.ieee_divide`); integers truncate toward zero.")


@register(OP_SET, "Pow")
def Pow(ctx, X, Y):
    """ONNX ``Pow``: ``X ** Y`` in X's dtype (Y is cast to it)."""
    X = jnp.asarray(X)
    Y = jnp.asarray(Y)
    if is_float(X):
        return jnp.power(X, Y.astype(X.dtype))
    if is_float(Y):
        return jnp.power(X.astype(Y.dtype), Y).astype(X.dtype)
    return jnp.power(X, Y.astype(X.dtype))


@register(OP_SET, "Mod")
def Mod(ctx, A, B, *, fmod=False):
    """ONNX ``Mod``: ``fmod`` true -> C ``fmod`` (sign of A); false -> sign of B (Python ``%``)."""
    A, B = jnp.asarray(A), jnp.asarray(B)
    if fmod:
        return jnp.fmod(A, B)
    return jnp.mod(A, B)


def _compare(name, fn):
    def op(ctx, A, B):
        return from_bool(fn(jnp.asarray(A), jnp.asarray(B)))

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"ONNX ``{name}``: element-wise comparison; int32 0/1 result (RTen's bool)."
    register(OP_SET, name, differentiable=False, out_dtype=op_rules.int32_out)(op)


for _n, _f in {"Equal": jnp.equal, "Greater": jnp.greater, "GreaterOrEqual": jnp.greater_equal,
               "Less": jnp.less, "LessOrEqual": jnp.less_equal}.items():
    _compare(_n, _f)


def _logic(name, fn):
    def op(ctx, A, B):
        return from_bool(fn(as_bool(A), as_bool(B)))

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"ONNX ``{name}``: logical op on int32 0/1 (nonzero is true); int32 0/1 result."
    register(OP_SET, name, differentiable=False, out_dtype=op_rules.int32_out)(op)


for _n, _f in {"And": jnp.logical_and, "Or": jnp.logical_or, "Xor": jnp.logical_xor}.items():
    _logic(_n, _f)


@register(OP_SET, "Not", out_dtype=op_rules.int32_out, differentiable=False)
def Not(ctx, X):
    """ONNX ``Not``: logical negation; int32 0/1 result."""
    return from_bool(jnp.logical_not(as_bool(X)))


@register(OP_SET, "IsNaN", out_dtype=op_rules.int32_out, differentiable=False)
def IsNaN(ctx, X):
    """ONNX ``IsNaN``: int32 0/1."""
    return from_bool(jnp.isnan(X))


@register(OP_SET, "IsInf", out_dtype=op_rules.int32_out, differentiable=False)
def IsInf(ctx, X):
    """ONNX ``IsInf`` (both signs; rten-convert rejects other ``detect_*``): int32 0/1."""
    return from_bool(jnp.isinf(X))


def _variadic(name, fn, doc):
    def op(ctx, *xs):
        xs = [jnp.asarray(x) for x in xs if x is not None]
        if not xs:
            raise ctx.error(f"{name} needs at least one input")
        return fn(xs)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"ONNX ``{name}`` over any number of broadcast inputs: {doc}"
    register(OP_SET, name)(op)


def _fold(f):
    def g(xs):
        y = xs[0]
        for x in xs[1:]:
            y = f(y, x)
        return y
    return g


_variadic("Max", _fold(jnp.maximum), "element-wise maximum (NaN propagates).")
_variadic("Min", _fold(jnp.minimum), "element-wise minimum (NaN propagates).")
_variadic("Sum", _fold(jnp.add), "element-wise sum.")
_variadic("Mean", lambda xs: _fold(jnp.add)(xs) / len(xs), "element-wise mean.")


@register(OP_SET, "Clip")
def Clip(ctx, X, min=None, max=None):
    """ONNX ``Clip`` (opset 11+: bounds as optional inputs): ``min(max(x, lo), hi)``."""
    y = jnp.asarray(X)
    if min is not None:
        y = jnp.maximum(y, jnp.asarray(min, y.dtype))
    if max is not None:
        y = jnp.minimum(y, jnp.asarray(max, y.dtype))
    return y


def _where_dtype(node, k, graphs):
    """The dtype of ``X`` (input 1)."""
    x = node.inputs[1] if len(node.inputs) > 1 else None
    return x.dtype if x is not None and x.dtype is not None else None


@register(OP_SET, "Where", out_dtype=_where_dtype)
def Where(ctx, condition, X, Y):
    """ONNX ``Where``: ``condition ? X : Y`` (condition int32 0/1 or bool), broadcast."""
    return jnp.where(as_bool(condition), X, Y)


@register(OP_SET, "LeakyRelu")
def LeakyRelu(ctx, X, *, alpha=0.0):
    """ONNX ``LeakyRelu``: ``x < 0 ? alpha * x : x`` (schema default alpha 0; ONNX's 0.01 is written)."""
    X = jnp.asarray(X)
    return jnp.where(X < 0, X * jnp.asarray(alpha, X.dtype), X)


@register(OP_SET, "PRelu")
def PRelu(ctx, X, slope):
    """ONNX ``PRelu``: ``x < 0 ? slope * x : x`` with ``slope`` broadcast to X."""
    X = jnp.asarray(X)
    return jnp.where(X < 0, X * slope, X)


@register(OP_SET, "Elu")
def Elu(ctx, X, *, alpha=0.0):
    """ONNX ``Elu``: ``x < 0 ? alpha * (e**x - 1) : x``."""
    X = jnp.asarray(X)
    return jnp.where(X < 0, jnp.asarray(alpha, X.dtype) * jnp.expm1(X), X)


@register(OP_SET, "HardSigmoid")
def HardSigmoid(ctx, X, *, alpha=0.0, beta=0.0):
    """ONNX ``HardSigmoid``: ``clip(alpha * x + beta, 0, 1)``."""
    X = jnp.asarray(X)
    return jnp.clip(X * jnp.asarray(alpha, X.dtype) + jnp.asarray(beta, X.dtype), 0, 1)


@register(OP_SET, "Gelu")
def Gelu(ctx, X, *, approximate="None"):
    """ONNX ``Gelu``: exact (erf) or ``approximate="Tanh"``."""
    return jax.nn.gelu(jnp.asarray(X), approximate=(approximate == "Tanh"))


def _cast_dtype(node, k, graphs):
    """``to`` (absent: RTen's DataType 0, int32)."""
    return node.attrs.get("to") or np.dtype(np.int32)


@register(OP_SET, "Cast", out_dtype=_cast_dtype)
def Cast(ctx, input, *, to=np.dtype(np.int32)):
    """ONNX ``Cast`` to ``to`` (an RTen DataType: int32, float32, int8, uint8).

    Float -> int truncates toward zero; bool and int64 targets were mapped to
    int32 by the writer. Schema default ``to`` is Int32.
    """
    to = np.dtype(to if to is not None else np.int32)
    x = jnp.asarray(input)
    return x.astype(to)


def _castlike_dtype(node, k, graphs):
    """The dtype of input 1 (``target_type``)."""
    t = node.inputs[1] if len(node.inputs) > 1 else None
    return None if t is None else (t.dtype or np.dtype(np.float32))


@register(OP_SET, "CastLike", out_dtype=_castlike_dtype)
def CastLike(ctx, input, target_type):
    """ONNX ``CastLike``: cast ``input`` to ``target_type``'s dtype."""
    return jnp.asarray(input).astype(jnp.asarray(target_type).dtype)
