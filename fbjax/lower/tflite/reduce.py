"""TFLite reductions, float path (``kernels/reduce.cc``)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ... import op_rules
from ..registry import register
from .elementwise import require_unquantized


def _axes(ctx, axis, rank):
    """Normalized, de-duplicated reduction axes from a static axis tensor."""
    out = []
    for a in np.asarray(axis).reshape(-1).tolist():
        a = int(a)
        if not -rank <= a < max(rank, 1):
            raise ctx.error(f"axis {a} out of range for rank {rank}")
        a %= max(rank, 1)
        if a not in out:
            out.append(a)
    return tuple(sorted(out))


def _reduce_batch(node, carrying, batch) -> None:
    """MEAN, SUM, REDUCE_*: constant axes (input 1) that leave dimension 0."""
    x = node.inputs[0] if node.inputs else None
    axes = op_rules.const(node.inputs[1])
    rank = op_rules.rank(x)
    if axes is None or rank is None or any(int(ax) % rank == 0 for ax in np.asarray(axes).reshape(-1)):
        raise op_rules.refusal(node, "reduces over the batch dimension")


@register("tflite", "MEAN", static_inputs=(1,), batch=_reduce_batch, full_precision=True)
def MEAN(ctx, x, axis, *, keep_dims=False):
    """TFLite MEAN (``kernels/reduce.cc``): mean over the static ``axis``
    tensor (negative axes count from the end, duplicates ignored), keeping
    reduced dims as size 1 when ``keep_dims``. Float inputs; plain integer
    inputs use the sum divided with truncation, like the reference kernel."""
    require_unquantized(ctx, "MEAN")
    x = jnp.asarray(x)
    axes = _axes(ctx, axis, x.ndim)
    if jnp.issubdtype(x.dtype, jnp.floating):
        return jnp.mean(x, axis=axes, keepdims=bool(keep_dims))
    count = int(np.prod([x.shape[a] for a in axes])) if axes else 1
    s = jnp.sum(x, axis=axes, keepdims=bool(keep_dims), dtype=x.dtype)
    return lax.div(s, jnp.full(s.shape, max(count, 1), x.dtype))


# --- the other reductions (kernels/reduce.cc) -------------------------------

def _reduce(ctx, fn, x, axis, keep_dims, **kw):
    require_unquantized(ctx)
    x = jnp.asarray(x)
    return fn(x, axis=_axes(ctx, axis, x.ndim), keepdims=bool(keep_dims), **kw)


def _extreme(ctx, fn, x, axis, keep_dims, lowest: bool):
    """REDUCE_MAX / REDUCE_MIN: ``reduce.cc`` starts from the type's
    ``numeric_limits::lowest()`` (max) or ``max()`` (min), so an empty set
    gives that value (-FLT_MAX, not -inf, for float32)."""
    require_unquantized(ctx)
    x = jnp.asarray(x)
    axes = _axes(ctx, axis, x.ndim)
    if any(x.shape[a] == 0 for a in axes):
        dt = np.dtype(x.dtype)
        info = jnp.finfo(dt) if jnp.issubdtype(dt, jnp.floating) else np.iinfo(dt)
        return fn(x, axis=axes, keepdims=bool(keep_dims), initial=np.array(info.min if lowest else info.max, dt))
    return fn(x, axis=axes, keepdims=bool(keep_dims))


@register("tflite", "SUM", static_inputs=(1,), batch=_reduce_batch, full_precision=True)
def SUM(ctx, x, axis, *, keep_dims=False):
    """TFLite SUM over the static ``axis`` tensor (see :func:`MEAN` for axes)."""
    return _reduce(ctx, jnp.sum, x, axis, keep_dims, dtype=jnp.asarray(x).dtype)


@register("tflite", "REDUCE_PROD", static_inputs=(1,), batch=_reduce_batch, full_precision=True)
def REDUCE_PROD(ctx, x, axis, *, keep_dims=False):
    """TFLite REDUCE_PROD: product over ``axis``."""
    return _reduce(ctx, jnp.prod, x, axis, keep_dims, dtype=jnp.asarray(x).dtype)


@register("tflite", "REDUCE_MAX", static_inputs=(1,), int_passthrough=True, batch=_reduce_batch)
def REDUCE_MAX(ctx, x, axis, *, keep_dims=False):
    """TFLite REDUCE_MAX: max over ``axis`` (empty set: the dtype's lowest
    finite value, as LiteRT's kernel)."""
    return _extreme(ctx, jnp.max, x, axis, keep_dims, True)


@register("tflite", "REDUCE_MIN", static_inputs=(1,), int_passthrough=True, batch=_reduce_batch)
def REDUCE_MIN(ctx, x, axis, *, keep_dims=False):
    """TFLite REDUCE_MIN: min over ``axis`` (empty set: the dtype's largest
    finite value, as LiteRT's kernel)."""
    return _extreme(ctx, jnp.min, x, axis, keep_dims, False)


@register("tflite", "REDUCE_ANY", static_inputs=(1,), batch=_reduce_batch)
def REDUCE_ANY(ctx, x, axis, *, keep_dims=False):
    """TFLite REDUCE_ANY: logical or over ``axis`` (bool)."""
    return _reduce(ctx, jnp.any, x, axis, keep_dims)


@register("tflite", "REDUCE_ALL", static_inputs=(1,), batch=_reduce_batch)
def REDUCE_ALL(ctx, x, axis, *, keep_dims=False):
    """TFLite REDUCE_ALL: logical and over ``axis`` (bool)."""
    return _reduce(ctx, jnp.all, x, axis, keep_dims)
