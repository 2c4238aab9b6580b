"""ONNX reductions, arg-reductions, CumSum and TopK.

Reduction axes come from the ``axes`` attribute (``ReduceMeanAttrs.axes``,
older opsets) or from the optional second input (opset 18+, a load-time
constant). No axes means all axes (``noop_with_empty_axes`` is always 0:
rten-convert rejects 1). ``keep_dims`` defaults to the schema's false.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ... import op_rules
from ...errors import InputError
from ..registry import register
from ._util import OP_SET, axis as norm_axis, concrete, has_valid_count, ints, require_concrete


def _reduce_batch(node, carrying, batch) -> None:
    """Reduce*: constant axes (input 1 or ``axes``), not empty, not 0."""
    a, ins = node.attrs, node.inputs
    rank = op_rules.rank(ins[0] if ins else None)
    axes = op_rules.const(ins[1]) if len(ins) > 1 and ins[1] is not None else a.get("axes")
    if len(ins) > 1 and ins[1] is not None and ins[1].data is None:
        raise op_rules.refusal(node, "reduces over computed axes")
    axes = [] if axes is None else [int(v) for v in np.asarray(axes).reshape(-1)]
    if rank is None or not axes or any(ax % rank == 0 for ax in axes):
        raise op_rules.refusal(node, f"reduces over the batch dimension (axes {axes or 'all'})")


def _reduce(name, fn, doc):
    def op(ctx, data, axes_input=None, *, axes=None, keep_dims=False):
        x = jnp.asarray(data)
        ax = ints(axes_input) if axes_input is not None else (list(axes) if axes is not None else [])
        ax = tuple(sorted({norm_axis(a, x.ndim, ctx) for a in ax})) if ax else tuple(range(x.ndim))
        return fn(x, ax, bool(keep_dims))

    op.__name__ = op.__qualname__ = name
    op.__doc__ = (f"ONNX ``{name}``: {doc} over ``axes`` (attribute or constant second input; all "
                  "axes when empty), keeping them as size 1 when ``keep_dims``.")
    register(OP_SET, name, static_inputs=(1,), batch=_reduce_batch, full_precision=True)(op)


_reduce("ReduceSum", lambda x, a, k: jnp.sum(x, a, keepdims=k), "sum")
_reduce("ReduceMean", lambda x, a, k: jnp.mean(x, a, keepdims=k),
        "mean (an empty set gives NaN, 0/0: the spec leaves it undefined; onnxruntime gives 0)")
_reduce("ReduceProd", lambda x, a, k: jnp.prod(x, a, keepdims=k), "product")
def _extreme(fn, big: bool):
    def f(x, a, k):
        if any(x.shape[i] == 0 for i in a):  # empty set: the identity (inf / integer limit)
            dt = np.dtype(x.dtype)
            init = (np.inf if big else -np.inf) if jnp.issubdtype(dt, jnp.floating) else (np.iinfo(dt).max if big else np.iinfo(dt).min)
            return fn(x, a, keepdims=k, initial=np.array(init, dt))
        return fn(x, a, keepdims=k)
    return f


_reduce("ReduceMin", _extreme(jnp.min, True), "minimum (+inf / the type's max over an empty set)")
_reduce("ReduceMax", _extreme(jnp.max, False), "maximum (-inf / the type's min over an empty set)")
_reduce("ReduceSumSquare", lambda x, a, k: jnp.sum(x * x, a, keepdims=k), "sum of squares")
_reduce("ReduceL2", lambda x, a, k: jnp.sqrt(jnp.sum(x * x, a, keepdims=k)), "Euclidean norm")


def _arg(name, fn):
    def op(ctx, data, *, axis=0, keep_dims=False):
        x = jnp.asarray(data)
        a = norm_axis(axis, x.ndim, ctx)
        if x.shape[a] == 0:  # the ONNX spec defines no index over an empty axis (onnxruntime refuses it)
            raise InputError(f"{ctx.node.location} ({ctx.node.op_name}): the input has shape {tuple(x.shape)}, "
                             f"and there is no index of an extreme over its empty axis {a}")
        y = fn(x, axis=a).astype(jnp.int32)
        return jnp.expand_dims(y, a) if keep_dims else y

    op.__name__ = op.__qualname__ = name
    op.__doc__ = (f"ONNX ``{name}``: int32 index of the first extreme along ``axis`` "
                  "(``select_last_index`` 0; rten-convert rejects 1).")
    register(OP_SET, name, differentiable=False, batch=op_rules.axis_not_batch(0), out_dtype=op_rules.int32_out)(op)


_arg("ArgMax", jnp.argmax)
_arg("ArgMin", jnp.argmin)


def _cumsum_batch(node, carrying, batch) -> None:
    ins = node.inputs
    axis = op_rules.const(ins[1]) if len(ins) > 1 else None
    if axis is None or op_rules.axis_is_batch(axis, op_rules.rank(ins[0] if ins else None)):
        raise op_rules.refusal(node, "works along the batch dimension (or along a computed axis)")


@register(OP_SET, "CumSum", static_inputs=(1,), batch=_cumsum_batch, full_precision=True)
def CumSum(ctx, x, axis):
    """ONNX ``CumSum`` along the constant ``axis`` input (inclusive, forward only:
    rten-convert rejects ``exclusive``/``reverse``)."""
    x = jnp.asarray(x)
    return jnp.cumsum(x, axis=norm_axis(ints(axis)[0], x.ndim, ctx), dtype=x.dtype)


def _topk_bound(node):
    """Only a ``k`` the file does not store (computed by the graph): values
    and indices of the axis' full size."""
    k = node.inputs[1] if len(node.inputs) > 1 else None
    if k is None or k.data is not None or len(node.outputs) != 2:
        return None
    x = node.inputs[0]
    for o in node.outputs:
        if o is not None and x.shape is not None:
            o.shape = tuple(x.shape)  # the bound: the axis' full size
    return node.outputs[0] if node.outputs[0] is not None else node.outputs[1]


def _topk_dtype(node, k, graphs):
    """Output 1 (indices) is int32; output 0 has the input's dtype."""
    return np.dtype(np.int32) if k == 1 else None


@register(OP_SET, "TopK", out_dtype=_topk_dtype, batch=op_rules.axis_not_batch(0), static_bound=_topk_bound)
def TopK(ctx, X, K, *, axis=0, largest=False, sorted=False):
    """ONNX ``TopK``: the ``K`` largest or smallest along ``axis``.

    Returns ``(Values, Indices)``, indices int32; results are always sorted
    (allowed when ``sorted`` is false); ties keep the lower index first.
    ``K`` must be known at load time (a constant, or bound with
    ``fbjax.load(constant_inputs=...)``), except in static-bound mode
    (``fbjax.load(..., static_bounds=True)``: the node has a trailing
    ``:valid_count`` output) for a ``K`` computed by the graph: then both
    outputs have the axis' full size (the bound), entries from position
    ``min(K, size)`` on are 0 (values) and -1 (indices), and the count is
    ``min(K, size)``.
    """
    x = jnp.asarray(X)
    a = norm_axis(axis, x.ndim, ctx)
    counted = has_valid_count(ctx)
    kc = concrete(K)
    if kc is None and not counted:
        require_concrete(ctx, K, "TopK's k")
    n = x.shape[a]
    k = n if counted else int(np.asarray(kc).reshape(-1)[0])
    xm = jnp.moveaxis(x, a, -1)
    if largest:
        v, i = lax.top_k(xm, k)
    else:
        if jnp.issubdtype(xm.dtype, jnp.floating):
            v, i = lax.top_k(-xm, k)
            v = -v
        else:  # negate in a wider range-safe way: order by (-x) via stable argsort
            i = jnp.argsort(xm, axis=-1, stable=True)[..., :k]
            v = jnp.take_along_axis(xm, i, axis=-1)
    i = i.astype(jnp.int32)
    if counted:
        cnt = jnp.clip(jnp.asarray(K).reshape(-1)[0].astype(jnp.int32), 0, n)
        keep = jnp.arange(n) < cnt
        v = jnp.where(keep, v, jnp.zeros_like(v))
        i = jnp.where(keep, i, -1)
        return jnp.moveaxis(v, -1, a), jnp.moveaxis(i, -1, a), cnt
    return jnp.moveaxis(v, -1, a), jnp.moveaxis(i, -1, a)
