"""TFLite control flow: WHILE (``lax.while_loop``, or a bounded ``lax.scan``
with the ``while_max_iterations`` option), IF (``lax.cond``) and CALL
(inline call of a subgraph).

Subgraphs are evaluated with :meth:`LowerContext.call_graph`, so their float
constants are params like the main graph's. A WHILE loop's carried values
must keep their shapes and dtypes from one iteration to the next (XLA's
rule); a body that grows a tensor raises a ModelFormatError naming the node.
An IF whose condition is known at trace time runs only the branch taken.
Reference kernels: TFLite ``kernels/while.cc``, ``if.cc``, ``call.cc``.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ...ir import Node, Value
from ...op_rules import Region, n_in, n_out
from ..autodiff import reverse_mode_guard
from ..registry import register


def _producers(graph):
    return {id(o): n for n in graph.nodes for o in n.outputs if o is not None}


def _const_all(v, value):
    return v is not None and v.data is not None and np.asarray(v.data).size > 0 and \
        bool((np.asarray(v.data) == value).all())


def rewrite_tensor_list_set_item(graph) -> int:
    """Turn the converter's TensorList "set item" pattern into DYNAMIC_UPDATE_SLICE.

    Keras recurrent layers convert to a WHILE body that writes step ``i`` of
    a ``[T, ...]`` buffer ``x`` as ``CONCATENATION(SLICE(x, 0, [i, -1..]),
    item, SLICE(x, [i + 1, 0..], [-1..]))`` on axis 0: two slices whose sizes
    depend on the loop counter, which XLA cannot express. The result equals
    ``DYNAMIC_UPDATE_SLICE(x, item, [i, 0..])`` for ``0 <= i < T``; this
    rewrites every match in place (semantics unchanged, so the numpy
    reference may run either form) and drops nodes left without consumers.
    Returns the number of rewrites.
    """
    prod = _producers(graph)
    count = 0
    new_nodes = []
    for n in graph.nodes:
        ok = (n.op_name == "CONCATENATION" and len(n.inputs) == 3 and int(n.attrs.get("axis", 0)) == 0
              and all(v is not None for v in n.inputs))
        if ok:
            s0, s2 = prod.get(id(n.inputs[0])), prod.get(id(n.inputs[2]))
            ok = (s0 is not None and s2 is not None and s0.op_name == "SLICE" and s2.op_name == "SLICE"
                  and s0.inputs[0] is s2.inputs[0] and _const_all(s0.inputs[1], 0)
                  and _const_all(s2.inputs[2], -1))
        if ok:
            size0 = prod.get(id(s0.inputs[2]))
            ok = (size0 is not None and size0.op_name == "CONCATENATION" and len(size0.inputs) >= 2
                  and all(_const_all(v, -1) for v in size0.inputs[1:])
                  and size0.inputs[0].shape == (1,) and n.inputs[1].shape is not None
                  and n.inputs[1].shape[:1] == (1,))
        if not ok:
            new_nodes.append(n)
            continue
        x, item = s0.inputs[0], n.inputs[1]
        rank = len(item.shape)
        idt = np.dtype(size0.inputs[0].dtype)
        zeros = Value(f"{n.outputs[0].name}/dus_zeros", idt, (rank - 1,), data=np.zeros(rank - 1, idt))
        start = Value(f"{n.outputs[0].name}/dus_start", idt, (rank,))
        loc = n.location
        new_nodes.append(Node("tflite", "CONCATENATION", [size0.inputs[0], zeros], [start], {"axis": 0}, loc))
        new_nodes.append(Node("tflite", "DYNAMIC_UPDATE_SLICE", [x, item, start], list(n.outputs), {}, loc))
        graph.values.extend([zeros, start])
        count += 1
    if count:
        # drop nodes whose outputs nobody reads any more
        while True:
            used = {id(v) for m in new_nodes for v in m.inputs if v is not None}
            used |= {id(v) for v in graph.outputs}
            keep = [m for m in new_nodes if any(o is not None and id(o) in used for o in m.outputs)]
            if len(keep) == len(new_nodes):
                break
            new_nodes = keep
        graph.nodes[:] = new_nodes
    return count


def _pred(x):
    return jnp.reshape(jnp.asarray(x), (-1,))[0].astype(bool)


@register("tflite", "WHILE",
          regions={"cond_subgraph_index": Region(lambda n: (n_in(n), 1)),
                    "body_subgraph_index": Region(lambda n: (n_in(n), n_in(n)))}, foldable=False)
def WHILE(ctx, *xs, cond_subgraph_index=0, body_subgraph_index=0):
    """TFLite WHILE: ``while cond(*v): v = body(*v)``; returns the final
    values. The condition subgraph returns one bool (any shape with one
    element); the body returns as many values as it takes.

    Lowered to ``lax.while_loop`` (forward-mode differentiable only), or,
    when ``ctx.options["while_max_iterations"]`` is an int N, to a
    ``lax.scan`` of N steps each applying the body (``lax.cond``) only while
    the condition still holds: reverse-differentiable, equal to the
    ``while_loop`` when the trip count is <= N. If the condition still holds
    after N steps, float loop outputs are NaN (a visible too-small N)."""
    dts = [np.dtype(v.dtype) if v is not None else None for v in ctx.inputs]
    body_g = ctx.model.graphs[int(body_subgraph_index)]
    if not getattr(body_g, "_fbjax_tensor_list_rewritten", False):
        rewrite_tensor_list_set_item(body_g)
        body_g._fbjax_tensor_list_rewritten = True
    # Values the body passes through unchanged (output k is input k) and that
    # are known at trace time stay numpy constants instead of loop carries, so
    # shape-like integers (sizes, limits) remain static inside the loop.
    fixed = {k: x for k, x in enumerate(xs)
             if isinstance(x, np.ndarray) and k < len(body_g.outputs) and k < len(body_g.inputs)
             and body_g.outputs[k] is body_g.inputs[k]}
    carried = [k for k in range(len(xs)) if k not in fixed]

    def full(v):
        vals = dict(fixed)
        vals.update(zip(carried, v))
        return [vals[k] for k in range(len(xs))]

    init = tuple(jnp.asarray(xs[k], dts[k]) for k in carried)

    def cond(v):
        out = ctx.call_graph(int(cond_subgraph_index), *full(v))
        return _pred(out[0])

    def body(v):
        out = ctx.call_graph(int(body_subgraph_index), *full(v))
        if len(out) != len(xs):
            raise ctx.error(f"body subgraph returns {len(out)} values for {len(xs)} loop variables")
        return tuple(jnp.asarray(out[k], a.dtype) for k, a in zip(carried, v))

    max_iter = ctx.options.get("while_max_iterations")
    try:
        if max_iter is None:
            res = lax.while_loop(cond, body, init)
        else:
            res = _bounded_while(cond, body, init, int(max_iter))
    except TypeError as e:
        raise ctx.error(f"loop variables change shape or dtype across iterations, which XLA cannot "
                        f"express: {str(e)[:300]}") from None
    if max_iter is None:  # jax.grad through it: fbjax's error naming while_max_iterations, not JAX's
        res = reverse_mode_guard(res, f"{ctx.node.location} ({ctx.node.op_name})")
    return full(res)


def _bounded_while(cond, body, init, n):
    """``while cond(v): v = body(v)`` as a ``lax.scan`` of ``n`` steps (which
    JAX reverse-differentiates): a ``running`` flag turns false at the first
    false condition and the body runs (``lax.cond``, so a step past the end
    neither computes nor differentiates the body) only while it is true. If
    the condition still holds after ``n`` steps, the float values become NaN."""

    def step(carry, _):
        running, v = carry
        running = jnp.logical_and(running, cond(v))
        v = lax.cond(running, body, lambda u: tuple(u), v)
        return (running, v), None

    (running, res), _ = lax.scan(step, (jnp.asarray(True), tuple(init)), None, length=n)
    unfinished = jnp.logical_and(running, cond(res))
    return tuple(jnp.where(unfinished, jnp.asarray(np.nan, r.dtype), r) if jnp.issubdtype(r.dtype, jnp.inexact)
                 else r for r in res)


@register("tflite", "IF",
          regions={"then_subgraph_index": Region(lambda n: (n_in(n) - 1, n_out(n))),
                    "else_subgraph_index": Region(lambda n: (n_in(n) - 1, n_out(n)))}, foldable=False)
def IF(ctx, cond, *xs, then_subgraph_index=0, else_subgraph_index=0):
    """TFLite IF: ``then(*xs)`` if ``cond`` (a one-element bool) else
    ``else(*xs)``; both branches must give the same output shapes and dtypes
    unless ``cond`` is known at trace time."""
    if isinstance(cond, np.ndarray):
        idx = then_subgraph_index if bool(np.asarray(cond).reshape(-1)[0]) else else_subgraph_index
        return ctx.call_graph(int(idx), *xs)
    dts = [np.dtype(o.dtype) for o in ctx.outputs]

    def branch(idx):
        def f(*ops):
            return tuple(jnp.asarray(o, d) for o, d in zip(ctx.call_graph(int(idx), *ops), dts))
        return f

    try:
        return list(lax.cond(_pred(cond), branch(then_subgraph_index), branch(else_subgraph_index), *xs))
    except TypeError as e:
        raise ctx.error(f"the branches' outputs differ in shape or dtype: {str(e)[:300]}") from None


@register("tflite", "CALL",
          regions={"subgraph": Region(lambda n: (n_in(n), n_out(n)))}, foldable=False)
def CALL(ctx, *xs, subgraph=0):
    """TFLite CALL: evaluate ``subgraph`` on the inputs (inlined)."""
    return ctx.call_graph(int(subgraph), *xs)
