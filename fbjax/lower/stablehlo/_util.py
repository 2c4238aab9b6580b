"""Small helpers shared by the StableHLO lowering families. The attribute
helpers (:func:`ints`, :func:`pairs`) are the readers' own
(:mod:`fbjax.formats.stablehlo_attrs`), shared with the reference."""

from __future__ import annotations

import numpy as np

from ... import op_rules
from ...formats.stablehlo_attrs import ints, pairs  # noqa: F401 (re-exported to the families)


def out_shape(ctx, i: int = 0, batch=None) -> tuple:
    """Static shape of output ``i``; raises the node's error when unknown.

    ``batch``: the size a leading dimension left unknown by a
    batch-polymorphic load (:func:`fbjax.passes.shapes.set_batch_size`) takes."""
    v = ctx.outputs[i]
    shape = None if v is None else v.shape
    if shape and shape[0] is None and batch is not None:
        shape = (batch,) + tuple(shape[1:])
    if shape is None or any(d is None for d in shape):
        raise ctx.error(f"output {i} needs a static shape")
    return tuple(int(d) for d in shape)


def declared_types(ctx, args) -> list:
    """Float constants back in the type the file declares: fbjax keeps a
    float32 master copy of float16 / bfloat16 constants as params
    (:func:`fbjax.lower.build.master_weight`), while StableHLO ops require
    exactly typed operands. Other inputs pass unchanged."""
    import jax.numpy as jnp

    out = []
    for i, a in enumerate(args):
        v = ctx.inputs[i] if i < len(ctx.inputs) else None
        if (v is not None and v.data is not None and a is not None and hasattr(a, "dtype")
                and np.dtype(a.dtype) != np.dtype(v.dtype) and jnp.issubdtype(v.dtype, jnp.inexact)):
            a = a.astype(v.dtype)
        out.append(a)
    return out


def register(op_set: str, name: str, **kw):
    """:func:`fbjax.lower.registry.register` for StableHLO lowerings: the
    registered function first restores the declared types of float constants
    (:func:`declared_types`); the decorated function itself is returned
    unchanged."""
    import functools

    from ..registry import register as _register

    def deco(fn):
        @functools.wraps(fn)
        def lowering(ctx, *args, **attrs):
            return fn(ctx, *declared_types(ctx, args), **attrs)

        _register(op_set, name, **kw)(lowering)
        return fn

    return deco


def not_followed_batch(node, carrying, batch) -> None:
    """The ``batch`` rule of gather, scatter, dynamic slices, custom_call,
    while, case...: refused (the batch rewrite does not follow them)."""
    raise op_rules.refusal(node, "reads a batch-carrying value; the batch rewrite does not follow the batch through it")


def dimensions_batch(node, carrying, batch) -> None:
    """The ``batch`` rule of reduce, reverse: ``dimensions`` leave 0 alone."""
    dims = op_rules.ints(node.attrs.get("dimensions"))
    if 0 in dims:
        raise op_rules.refusal(node, f"works along the batch dimension (dimensions {dims})")


def dimension_batch(default: int):
    """The ``batch`` rule of ops with a ``dimension`` attribute (concatenate,
    sort): that dimension (absent: ``default``, the lowering's) is not the batch."""
    def rule(node, carrying, batch) -> None:
        d = node.attrs.get("dimension")
        d = default if d is None else int(d)
        r = op_rules.rank(node.inputs[0] if node.inputs else None)
        if r and d % r == 0:
            raise op_rules.refusal(node, "works along the batch dimension (dimension 0)")
    rule.__doc__ = f"``dimension`` (default {default}) is not the batch."
    return rule
