"""StableHLO reductions with computation bodies: ``stablehlo.reduce`` and
``stablehlo.reduce_window``.

A body is a graph of the model (``computation`` index) whose inputs are the
accumulators then the elements. When it is a single associative, commutative
op on its two arguments (add, multiply, maximum, minimum, and, or), the
reduction maps to the matching lax monoid primitive (``reduce_sum``,
``reduce_window_max``...) started from the op's identity, and the init value
is folded in afterwards: ``op(reduce(x), init)``. The spec leaves the order
of application implementation-defined (XLA's order differs from the one the
StableHLO test data were generated with by a few ULP on some float sums;
``tests/stablehlo_excludes.py`` lists them). Padding cells
and base-dilation holes are filled with the init value, as the spec says.

Any other body is traced as a JAX function through ``lax.reduce`` /
``lax.reduce_window``. Those cannot close over traced values, so a body
holding float constants (which are trainable params) is instead applied
element-wise to whole arrays: a ``lax.scan`` over the reduced elements for
``reduce``, one step per window offset for ``reduce_window`` (bodies made of
element-wise ops only; others raise a ModelFormatError naming the node).
"""

from __future__ import annotations

import itertools
from typing import Optional

import jax.numpy as jnp
import numpy as np
from jax import lax

from ... import op_rules
from ...op_rules import Region, n_in
from . import _util
from ._util import ints, pairs, register

OP_SET = "stablehlo"

#: body op name -> (lax binary op, identity(dtype))
MONOIDS = {
    "stablehlo.add": (lax.add, lambda dt: np.zeros((), dt)),
    "stablehlo.multiply": (lax.mul, lambda dt: np.ones((), dt)),
    # jnp.issubdtype knows ml_dtypes' bfloat16 (numpy's does not); the bool
    # identities are False for maximum (or) and True for minimum (and)
    "stablehlo.maximum": (lax.max, lambda dt: np.array(-np.inf, dt) if jnp.issubdtype(dt, jnp.inexact)
                          else np.array(False if dt == np.bool_ else np.iinfo(dt).min, dt)),
    "stablehlo.minimum": (lax.min, lambda dt: np.array(np.inf, dt) if jnp.issubdtype(dt, jnp.inexact)
                          else np.array(True if dt == np.bool_ else np.iinfo(dt).max, dt)),
    "stablehlo.and": (lax.bitwise_and, lambda dt: np.array(-1).astype(dt)),
    "stablehlo.or": (lax.bitwise_or, lambda dt: np.zeros((), dt)),
}


def monoid_of(model, index: int, n_operands: int) -> Optional[str]:
    """The op name when graph ``index`` is ``op(arg0, arg1)`` for a single
    known monoid op and one operand; else None."""
    if n_operands != 1 or not 0 <= index < len(model.graphs):
        return None
    g = model.graphs[index]
    if len(g.inputs) != 2 or len(g.outputs) != 1 or len(g.nodes) != 1:
        return None
    node = g.nodes[0]
    if node.op_set != OP_SET or node.op_name not in MONOIDS or len(node.inputs) != 2:
        return None
    if {id(v) for v in node.inputs} != {id(v) for v in g.inputs}:
        return None
    if len(node.outputs) != 1 or node.outputs[0] is not g.outputs[0]:
        return None
    return node.op_name


#: body ops that broadcast over whole arrays (safe to apply to non-scalars).
_ELEMENTWISE = {
    "stablehlo.add", "stablehlo.subtract", "stablehlo.multiply", "stablehlo.divide", "stablehlo.maximum",
    "stablehlo.minimum", "stablehlo.abs", "stablehlo.ceil", "stablehlo.logistic", "stablehlo.clamp",
    "stablehlo.convert", "stablehlo.and", "stablehlo.or", "stablehlo.xor", "stablehlo.not", "stablehlo.compare",
    "stablehlo.select", "stablehlo.negate", "stablehlo.exponential", "stablehlo.log", "stablehlo.sqrt",
    "stablehlo.rsqrt", "stablehlo.tanh", "stablehlo.power", "stablehlo.remainder", "stablehlo.floor",
    "stablehlo.sign", "stablehlo.cbrt", "stablehlo.cosine", "stablehlo.sine",
}


def _captures_params(ctx, computation: int) -> bool:
    """Whether the body graph holds float constants (params, traced under jit)."""
    g = ctx.model.graphs[int(computation)]
    return any(v.data is not None and np.issubdtype(np.dtype(v.dtype), np.floating) for v in g.values)


def _vectorizable(ctx, computation: int) -> None:
    g = ctx.model.graphs[int(computation)]
    bad = sorted({n.op_name for n in g.nodes if n.op_name not in _ELEMENTWISE})
    if bad:
        raise ctx.error(f"body graph {computation} holds float constants and non-element-wise ops {bad}; "
                        "fbjax cannot lower this combination")


def _split(ctx, args):
    if len(args) % 2 or not args:
        raise ctx.error(f"takes N operands and N init values, got {len(args)} inputs")
    n = len(args) // 2
    operands = [jnp.asarray(a) for a in args[:n]]
    # init values in the operands' types (a float16 constant may arrive as a
    # float32 param: fbjax.lower.build keeps float32 master weights)
    return operands, [jnp.asarray(a).astype(x.dtype) for a, x in zip(args[n:], operands)]


def _body(ctx, computation: int):
    def fn(accs, xs):
        return tuple(ctx.call_graph(int(computation), *accs, *xs))

    return fn


@register(OP_SET, "stablehlo.reduce",
          regions={"computation": Region(lambda n: (n_in(n), n_in(n) // 2), scalar=True)},
          batch=_util.dimensions_batch, full_precision=True)
def reduce(ctx, *args, dimensions=(), computation=-1):
    """``stablehlo.reduce``: reduces N operands over ``dimensions`` with the
    body graph ``computation`` (accumulators first), starting from N scalar
    init values. Returns N results."""
    operands, inits = _split(ctx, args)
    dims = ints(dimensions)
    mono = monoid_of(ctx.model, int(computation), len(operands))
    if mono is not None:
        op, identity = MONOIDS[mono]
        x, init = operands[0], inits[0].astype(operands[0].dtype)
        r = lax.reduce(x, identity(np.dtype(x.dtype)), op, dims)
        return [op(r, init)]
    if _captures_params(ctx, computation):
        _vectorizable(ctx, computation)
        keep = [d for d in range(operands[0].ndim) if d not in dims]
        shape = tuple(operands[0].shape[d] for d in keep)
        cols = tuple(jnp.moveaxis(jnp.transpose(x, keep + list(dims)).reshape(shape + (-1,)), -1, 0)
                     for x in operands)
        accs = tuple(jnp.broadcast_to(i, shape) for i in inits)

        def step(acc, col):
            return tuple(ctx.call_graph(int(computation), *acc, *col)), None

        res, _ = lax.scan(step, accs, cols)
        return list(res)
    return list(lax.reduce(tuple(operands), tuple(inits), _body(ctx, computation), dims))


def _reduce_window_batch(node, carrying, batch) -> None:
    a = node.attrs
    wd, ws = op_rules.ints(a.get("window_dimensions")), op_rules.ints(a.get("window_strides"))
    bd, pad = op_rules.ints(a.get("base_dilations")), op_rules.ints(a.get("padding"))
    if (wd[:1] or [1])[0] != 1 or (ws[:1] or [1])[0] != 1 or (bd[:1] or [1])[0] != 1 or any(pad[:2]):
        raise op_rules.refusal(node, f"windows the batch dimension (window_dimensions {wd}, window_strides {ws}, "
                               f"base_dilations {bd}, padding {pad[:2]})")


@register(OP_SET, "stablehlo.reduce_window",
          regions={"computation": Region(lambda n: (n_in(n), n_in(n) // 2), scalar=True)},
          batch=_reduce_window_batch, full_precision=True)
def reduce_window(ctx, *args, window_dimensions=(), window_strides=None, base_dilations=None,
                  window_dilations=None, padding=None, computation=-1):
    """``stablehlo.reduce_window``: windowed reduction of N operands with the
    body graph ``computation``; the operand is padded with the init value
    (``padding`` low/high, ``base_dilations - 1`` between elements), windows
    are dilated by ``window_dilations`` and stepped by ``window_strides``."""
    operands, inits = _split(ctx, args)
    rank = operands[0].ndim
    wd = ints(window_dimensions)
    if len(wd) != rank:
        raise ctx.error(f"window_dimensions {wd} do not match operand rank {rank}")
    ws = ints(window_strides) or (1,) * rank
    bd = ints(base_dilations) or (1,) * rank
    wdil = ints(window_dilations) or (1,) * rank
    pad = pairs(padding, rank)
    mono = monoid_of(ctx.model, int(computation), len(operands))
    if mono is not None:
        op, identity = MONOIDS[mono]
        x, init = operands[0], inits[0].astype(operands[0].dtype)
        if any(p != (0, 0) for p in pad) or any(b != 1 for b in bd):
            x = lax.pad(x, init, [(lo, hi, b - 1) for (lo, hi), b in zip(pad, bd)])
        r = lax.reduce_window(x, identity(np.dtype(x.dtype)), op, wd, ws, [(0, 0)] * rank, None, wdil)
        return [op(r, init)]
    if _captures_params(ctx, computation):
        _vectorizable(ctx, computation)
        padded = [lax.pad(x, i.astype(x.dtype), [(lo, hi, b - 1) for (lo, hi), b in zip(pad, bd)])
                  for x, i in zip(operands, inits)]
        eff = [(k - 1) * d + 1 for k, d in zip(wd, wdil)]
        shape = tuple(max((padded[0].shape[a] - eff[a]) // ws[a] + 1, 0) for a in range(rank))
        accs = [jnp.broadcast_to(i, shape) for i in inits]
        for offs in itertools.product(*[range(k) for k in wd]):
            start = [o * d for o, d in zip(offs, wdil)]
            limit = [st + (n - 1) * s + 1 if n else st for st, n, s in zip(start, shape, ws)]
            cols = [lax.slice(p, start, limit, ws) for p in padded]
            accs = list(ctx.call_graph(int(computation), *accs, *cols))
        return accs
    return list(lax.reduce_window(tuple(operands), tuple(inits), _body(ctx, computation), wd, ws, pad, bd, wdil))
