"""StableHLO ops with bodies beyond reductions: ``stablehlo.sort``
(comparator), ``stablehlo.while``, ``stablehlo.case``,
``stablehlo.composite`` (decomposition), and ``stablehlo.rng_bit_generator``.

Bodies are graphs of the model named by index (TFLite appends them as
subgraphs): ``comparator``, ``cond`` / ``body``, ``branches``,
``decomposition``. ``case`` branches and ``while`` bodies receive the op's
remaining operands as their inputs (TFLite passes captured values that way).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ...op_rules import Region, n_in, n_out
from .. import composites
from ..layer_slice import materialize
from . import _util
from ._util import ints, register

OP_SET = "stablehlo"


def _graph(ctx, index, what: str) -> int:
    index = int(index)
    if not 0 <= index < len(ctx.model.graphs):
        raise ctx.error(f"{what} refers to subgraph {index}, but the model has {len(ctx.model.graphs)}")
    return index


@register(OP_SET, "stablehlo.sort",
          regions={"comparator": Region(lambda n: (2 * n_in(n), 1), scalar=True)}, batch=_util.dimension_batch(-1))
def sort(ctx, *inputs, dimension=-1, is_stable=False, comparator=-1):
    """``stablehlo.sort``: sorts N same-shape operands together along
    ``dimension`` with the ``comparator`` body (``comparator(lhs0, rhs0,
    lhs1, rhs1, ...)`` is "lhs before rhs").

    The comparator is applied to every pair of positions at once (it is
    made of element-wise ops): element ``i``'s rank is the number of
    elements before it plus the equivalent ones with a smaller position, so
    the sort is stable for any strict weak order; memory grows as the
    square of the sorted length.

    Raises:
        ModelFormatError: no operand, or operands of different shapes.
    """
    if not inputs:
        raise ctx.error("needs at least one operand")
    xs = [jnp.asarray(x) for x in inputs]
    if any(x.shape != xs[0].shape for x in xs):
        raise ctx.error(f"operand shapes differ: {[x.shape for x in xs]}")
    comp = _graph(ctx, comparator, "comparator")
    rank = xs[0].ndim
    d = int(dimension) % rank if rank else 0
    if rank == 0:
        return xs
    moved = [jnp.moveaxis(x, d, -1) for x in xs]
    n = moved[0].shape[-1]
    full = moved[0].shape + (n,)
    args = []
    for x in moved:
        args += [jnp.broadcast_to(x[..., :, None], full), jnp.broadcast_to(x[..., None, :], full)]
    less = jnp.asarray(ctx.call_graph(comp, *args)[0]).astype(bool)  # less[..., i, j]: i before j
    less = jnp.broadcast_to(less, full)
    before = jnp.swapaxes(less, -1, -2)  # before[..., i, j]: j before i
    eq = ~less & ~before
    lower = jnp.arange(n)[None, :] < jnp.arange(n)[:, None]  # j < i
    rank_i = jnp.sum(before, axis=-1) + jnp.sum(eq & lower, axis=-1)
    perm = jnp.argsort(rank_i, axis=-1, stable=True)
    return [jnp.moveaxis(jnp.take_along_axis(x, perm, axis=-1), -1, d) for x in moved]


@register(OP_SET, "stablehlo.while",
          regions={"cond": Region(lambda n: (n_in(n), 1)), "body": Region(lambda n: (n_in(n), n_in(n)))},
          foldable=False, batch=_util.not_followed_batch)
def while_(ctx, *operands, cond=-1, body=-1):
    """``stablehlo.while``: runs ``body`` on the loop state while ``cond``
    (a graph returning a boolean scalar) holds (``lax.while_loop``)."""
    c, b = _graph(ctx, cond, "cond"), _graph(ctx, body, "body")
    state = tuple(jnp.asarray(x) for x in operands)
    dts = [x.dtype for x in state]

    def cond_fn(s):
        return jnp.asarray(ctx.call_graph(c, *s)[0]).reshape(()).astype(bool)

    def body_fn(s):
        out = ctx.call_graph(b, *s)
        if len(out) != len(s):
            raise ctx.error(f"body returns {len(out)} values for a state of {len(s)}")
        return tuple(jnp.asarray(v, dt).reshape(x.shape) for v, dt, x in zip(out, dts, s))

    return list(lax.while_loop(cond_fn, body_fn, state))


@register(OP_SET, "stablehlo.case", batch=_util.not_followed_batch)
def case(ctx, index, *operands, branches=()):
    """``stablehlo.case``: runs branch ``index`` (an int32 scalar; out of
    range selects the last branch, as the spec says) on the remaining
    operands (``lax.switch``)."""
    br = [_graph(ctx, i, f"branch {k}") for k, i in enumerate(ints(branches))]
    if not br:
        raise ctx.error("has no branches")
    i = jnp.asarray(index).reshape(()).astype(jnp.int32)
    n = len(br)
    i = jnp.where((i < 0) | (i >= n), n - 1, i)
    outs = [(o.dtype, o.shape) for o in ctx.outputs]

    def branch(g):
        def fn(*args):
            res = ctx.call_graph(g, *args)
            return tuple(jnp.asarray(r, np.dtype(dt)) for r, (dt, _) in zip(res, outs))
        return fn

    if isinstance(index, np.ndarray):  # known at load time: only that branch
        return list(branch(br[int(np.asarray(i))])(*operands))
    return list(lax.switch(i, [branch(g) for g in br], *operands))


@register(OP_SET, "stablehlo.composite",
          regions={"decomposition": Region(lambda n: (n_in(n), n_out(n)))}, batch=_util.not_followed_batch,
          layer_slices=composites.layer_slices)
def composite(ctx, *inputs, name="", decomposition=-1, composite_attributes=b"", version=0):
    """``stablehlo.composite``: the composite lowering registered under
    ``name`` (:mod:`fbjax.lower.composites`) when the load option
    ``composites`` fuses it (``ctx.options["composites"]``: ``"litert"``,
    the default, fuses what LiteRT's default CPU delegate fuses;
    ``"fused"`` every registered one; ``"decomposed"`` none), else its
    ``decomposition`` graph on the inputs. Inputs at the composite's
    ``layer_slices`` positions may be blocks of a layer scan's stacked arrays
    (:class:`~fbjax.lower.layer_slice.LayerSlice`): passed on to the fused
    lowering, materialized for the decomposition."""
    g = _graph(ctx, decomposition, f"composite {name!r} decomposition")
    chosen = composites.choose(ctx, name, composite_attributes, ctx.options.get("composites", "litert"))
    keep = composites.layer_slices(ctx.node) if chosen is not None else ()
    inputs = [x if i in keep else materialize(x) for i, x in enumerate(inputs)]
    if chosen is not None:
        fn, attrs = chosen
        out = fn(ctx, *inputs, **attrs)
        return list(out) if isinstance(out, (list, tuple)) else [out]
    return list(ctx.call_graph(g, *inputs))


_ALGORITHMS = {"DEFAULT": lax.RandomAlgorithm.RNG_DEFAULT, "THREEFRY": lax.RandomAlgorithm.RNG_THREE_FRY,
               "THREE_FRY": lax.RandomAlgorithm.RNG_THREE_FRY, "PHILOX": lax.RandomAlgorithm.RNG_PHILOX}


@register(OP_SET, "stablehlo.rng_bit_generator", batch=_util.not_followed_batch)
def rng_bit_generator(ctx, initial_state, *, rng_algorithm="DEFAULT", algorithm=None):
    """``stablehlo.rng_bit_generator``: (output_state, output) from
    ``initial_state`` with XLA's DEFAULT / THREE_FRY / PHILOX bit generator
    (``lax.rng_bit_generator``); the output's shape and type are the output
    tensor's. The bits are XLA's, which the spec leaves
    implementation-defined.

    Raises:
        ModelFormatError: an unknown algorithm or an output shape that is not static.
    """
    alg = str(algorithm if algorithm is not None else rng_algorithm).upper()
    if alg not in _ALGORITHMS:
        raise ctx.error(f"unknown rng algorithm {alg!r}")
    out = ctx.outputs[1]
    if out is None or out.shape is None or any(s is None for s in out.shape):
        raise ctx.error("output 1 needs a static shape")
    key = jnp.asarray(initial_state)
    kdt = key.dtype
    if kdt != jnp.uint32:
        key = lax.bitcast_convert_type(key, jnp.uint32).reshape(-1)
    odt = np.dtype(out.dtype)
    if odt.kind not in "iu":
        raise ctx.error(f"output 1 must be an integer tensor, not {odt.name}")
    udt = np.dtype(f"uint{odt.itemsize * 8}")  # signed outputs: the same bits, viewed as signed
    new, bits = lax.rng_bit_generator(key, tuple(out.shape), dtype=udt, algorithm=_ALGORITHMS[alg])
    if udt != odt:
        bits = lax.bitcast_convert_type(bits, odt)
    if kdt != jnp.uint32:
        new = lax.bitcast_convert_type(new.reshape(-1, np.dtype(kdt).itemsize // 4), kdt)
    return [new.reshape(np.shape(initial_state)), bits]
