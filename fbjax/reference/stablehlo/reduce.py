"""numpy twins of ``stablehlo.reduce`` and ``stablehlo.reduce_window``.

Known single-op bodies (add, multiply, maximum, minimum, and, or) use numpy
ufunc reductions; other bodies are folded one element at a time through
``ctx.call_graph`` in row-major order, starting from the init values.
"""

from __future__ import annotations

import itertools

import numpy as np

from ...op_rules import Region, n_in
from ..registry import register
from ._util import ints, pad_dilate, pairs

OP_SET = "stablehlo"
UFUNCS = {
    "stablehlo.add": np.add, "stablehlo.multiply": np.multiply, "stablehlo.maximum": np.maximum,
    "stablehlo.minimum": np.minimum, "stablehlo.and": np.bitwise_and, "stablehlo.or": np.bitwise_or,
}


def _monoid(model, index: int, n: int):
    g = model.graphs[index]
    if n != 1 or len(g.inputs) != 2 or len(g.outputs) != 1 or len(g.nodes) != 1:
        return None
    node = g.nodes[0]
    ok = (node.op_set == OP_SET and node.op_name in UFUNCS and len(node.inputs) == 2
          and {id(v) for v in node.inputs} == {id(v) for v in g.inputs} and node.outputs[0] is g.outputs[0])
    return UFUNCS[node.op_name] if ok else None


def _fold(ctx, computation, accs, columns):
    """Fold element tuples ``columns`` (list of per-operand 1-D arrays) into accs."""
    accs = [np.asarray(a) for a in accs]
    for k in range(len(columns[0])):
        accs = [np.asarray(r) for r in ctx.call_graph(int(computation), *accs, *[c[k] for c in columns])]
    return accs


@register(OP_SET, "stablehlo.reduce",
          regions={"computation": Region(lambda n: (n_in(n), n_in(n) // 2), scalar=True)})
def reduce(ctx, *args, dimensions=(), computation=-1):
    """Reduce N operands over ``dimensions`` from N init values."""
    n = len(args) // 2
    xs, inits = [np.asarray(a) for a in args[:n]], [np.asarray(a) for a in args[n:]]
    dims = ints(dimensions)
    uf = _monoid(ctx.model, int(computation), n)
    with np.errstate(over="ignore", invalid="ignore"):
        if uf is not None:
            dt = xs[0].dtype
            r = uf.reduce(xs[0], axis=dims, dtype=dt) if dims else xs[0]
            return [uf(inits[0].astype(dt), r, dtype=dt)]
    keep = [d for d in range(xs[0].ndim) if d not in dims]
    out_shape = tuple(xs[0].shape[d] for d in keep)
    outs = [np.empty(out_shape, ctx.out_dtype(i)) for i in range(n)]
    perm = keep + list(dims)
    moved = [np.transpose(x, perm).reshape(out_shape + (-1,)) for x in xs]
    for idx in np.ndindex(*out_shape):
        res = _fold(ctx, computation, inits, [m[idx] for m in moved])
        for o, r in zip(outs, res):
            o[idx] = r
    return outs


@register(OP_SET, "stablehlo.reduce_window",
          regions={"computation": Region(lambda n: (n_in(n), n_in(n) // 2), scalar=True)})
def reduce_window(ctx, *args, window_dimensions=(), window_strides=None, base_dilations=None,
                  window_dilations=None, padding=None, computation=-1):
    """Pad each operand with its init value (edges and base-dilation holes),
    then reduce every (dilated, strided) window."""
    n = len(args) // 2
    xs, inits = [np.asarray(a) for a in args[:n]], [np.asarray(a) for a in args[n:]]
    rank = xs[0].ndim
    wd = ints(window_dimensions)
    ws = ints(window_strides) or (1,) * rank
    bd = ints(base_dilations) or (1,) * rank
    wdl = ints(window_dilations) or (1,) * rank
    pads = pairs(padding, rank)
    padded = [pad_dilate(x, init.astype(x.dtype), pads, [b - 1 for b in bd]) for x, init in zip(xs, inits)]
    eff = [(k - 1) * d + 1 for k, d in zip(wd, wdl)]
    out_shape = tuple(max((padded[0].shape[i] - eff[i]) // ws[i] + 1, 0) for i in range(rank))
    uf = _monoid(ctx.model, int(computation), n)
    outs = [np.empty(out_shape, ctx.out_dtype(i)) for i in range(n)]
    for idx in itertools.product(*[range(s) for s in out_shape]):
        sl = tuple(slice(i * s, i * s + e, d) for i, s, e, d in zip(idx, ws, eff, wdl))
        wins = [p[sl].reshape(-1) for p in padded]
        with np.errstate(over="ignore", invalid="ignore"):
            if uf is not None:
                dt = wins[0].dtype
                r = uf.reduce(wins[0], dtype=dt) if wins[0].size else inits[0].astype(dt)
                outs[0][idx] = uf(inits[0].astype(dt), r, dtype=dt)
                continue
        for o, r in zip(outs, _fold(ctx, computation, inits, wins)):
            o[idx] = r
    return outs
