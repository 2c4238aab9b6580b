"""ONNX control flow (``If``, ``Loop``) and sequence ops.

Bodies are IR graphs (``attrs["then_branch"]`` etc. are graph indices); a
body's captured outer values are the node's trailing inputs listed in
``attrs["<branch>_captures"]`` and the body's trailing graph inputs.

* ``If``: a condition known at load time picks the branch while tracing
  (branches may then differ in shape); otherwise ``lax.cond``, which needs
  both branches to produce the same shapes and dtypes. Branches close over
  their captured values, so a captured constant stays static inside them.
  Both branches are traced first: unsupported nodes of both are reported in
  one error; a branch that cannot run at the given input shapes (onnxruntime
  and RTen would fail if it were taken) leaves the other branch, whose float
  outputs become NaN when the condition selects the impossible one.
* ``Loop``: without scan outputs and with tensor state, ``lax.while_loop``
  (trip count and condition may be dynamic). With scan outputs, tensor
  state and a trip count known at load time, ``lax.scan`` over the trip
  count when the body passes its condition through unchanged (every
  iteration runs: exact), or in static-bound mode (``fbjax.load(...,
  static_bounds=True)``: the node has a trailing ``:valid_count`` output)
  whatever the condition: scan outputs padded with zeros to the trip count,
  plus the number of iterations run. Otherwise (sequence state, a dynamic
  trip count) the loop is unrolled while tracing, which needs the trip
  count and every iteration's condition known at load time, or it raises.

Sequences are Python lists of arrays (their length is static); sequence ops
return them wrapped in a one-element list (one node output).
"""

from __future__ import annotations

from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ... import op_rules
from ...errors import UnsupportedOperatorError
from ...op_rules import Region, any_arity
from ..registry import register
from ._util import OP_SET, as_bool, axis as norm_axis, concrete, has_valid_count, ints


def _caps(inputs, positions):
    return [inputs[p] for p in positions]


def _if_dtype(node, k, graphs):
    """Output ``k`` of the ``then_branch`` graph's."""
    body = graphs[int(node.attrs["then_branch"])]
    return body.outputs[k].dtype if k < len(body.outputs) and body.outputs[k] is not None else None


@register(OP_SET, "If", out_dtype=_if_dtype,
          regions={"then_branch": Region(any_arity, required=True), "else_branch": Region(any_arity, required=True)},
          foldable=False)
def If(ctx, cond, *captured, then_branch=-1, else_branch=-1, then_branch_captures=(),
       else_branch_captures=()):
    """ONNX ``If``: evaluate ``then_branch`` or ``else_branch`` (graph indices).

    Raises:
        UnsupportedOperatorError: either branch has nodes fbjax cannot lower
            at these shapes (those of both branches are listed).

    Warns:
        UserWarning: once per node, when the condition is only known at run
            time and one branch cannot run at these input shapes (its float
            outputs are then NaN if the condition selects it).
    """
    allin = [cond, *captured]
    tcap = _caps(allin, then_branch_captures)
    ecap = _caps(allin, else_branch_captures)
    c = concrete(cond)
    if c is not None:
        return ctx.call_graph(then_branch if bool(np.asarray(c).reshape(-1)[0]) else else_branch,
                              *(tcap if bool(np.asarray(c).reshape(-1)[0]) else ecap))
    arr = lambda outs: jax.tree_util.tree_map(jnp.asarray, list(outs))  # noqa: E731 (sequences stay lists)
    pred = as_bool(jnp.asarray(cond).reshape(()))
    # The branches close over their captured values (not lax.cond operands):
    # a captured constant stays numpy, so it is static inside the branch
    # (a Pad amount, a Reshape shape) as it is in the enclosing graph.
    branches = {"then_branch": (then_branch, tcap), "else_branch": (else_branch, ecap)}
    failed, unsupported = {}, []
    saved = dict(ctx.run.state or {})  # (a probe must not leave tracers in the state)
    for name, (g, caps) in branches.items():
        try:
            jax.eval_shape(lambda g=g, caps=caps: arr(ctx.call_graph(g, *caps)))
        except UnsupportedOperatorError as e:
            unsupported.append(e)
        except (ValueError, TypeError, IndexError) as e:  # the branch cannot run at these shapes
            failed[name] = e
        finally:
            if ctx.run.state is not None:
                ctx.run.state.clear()
                ctx.run.state.update(saved)
    if unsupported:  # every offending node of both branches, in one error
        if len(unsupported) == 1:
            raise unsupported[0]
        counts = Counter()
        for e in unsupported:
            counts.update({tuple(k.split(":", 1)): c for k, c in e.ops.items()})
        raise UnsupportedOperatorError(counts, detail=" ".join(e.detail for e in unsupported))
    if len(failed) == 1:
        # One branch cannot even be traced at these input shapes (silero-vad:
        # the 8 kHz branch given a 16 kHz frame), so a runtime that evaluates
        # only the taken branch (onnxruntime, RTen) would fail if it were
        # taken. Run the other one; float outputs are NaN when the condition
        # picks the impossible branch (as a too-short ``while_max_iterations``
        # shows), since a jitted program cannot raise.
        (bad, err), = failed.items()
        good, caps = branches["else_branch" if bad == "then_branch" else "then_branch"]
        _warn_once(ctx, f"{ctx.node.location}: the If condition is only known at run time and its {bad} cannot "
                        f"run at these input shapes ({type(err).__name__}: {str(err).splitlines()[0][:200]}); "
                        f"fbjax runs the other branch, and gives NaN float outputs if the condition selects "
                        f"the {bad}")
        outs = arr(ctx.call_graph(good, *caps))
        taken_ok = pred if bad == "else_branch" else jnp.logical_not(pred)
        return [jnp.where(taken_ok, o, jnp.nan).astype(o.dtype) if jnp.issubdtype(o.dtype, jnp.floating) else o
                for o in outs]
    return lax.cond(pred, lambda: arr(ctx.call_graph(then_branch, *tcap)),
                    lambda: arr(ctx.call_graph(else_branch, *ecap)))


_WARNED: set = set()


def _warn_once(ctx, msg: str) -> None:
    import warnings

    key = (id(ctx.model), ctx.node.location)
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(msg, stacklevel=2)


def _loop_bound(node):
    """A loop with scan outputs: padded to the trip count by the lowering;
    the count is the iterations run, named after the first scan output."""
    n_state = len(node.inputs) - 2 - len(node.attrs.get("body_captures", ()))
    if len(node.outputs) <= n_state:
        return None
    return next((o for o in node.outputs[n_state:] if o is not None), None)


def _loop_dtype(node, k, graphs):
    """Output ``k + 1`` of the ``body`` graph's (after its condition), else
    the initial value's (the state outputs)."""
    body = graphs[int(node.attrs["body"])]
    b = body.outputs[k + 1] if k + 1 < len(body.outputs) else None
    if b is not None and b.dtype is not None:
        return b.dtype
    v = node.inputs[k + 2] if k + 2 < len(node.inputs) else None
    return v.dtype if v is not None else None


@register(OP_SET, "Loop", out_dtype=_loop_dtype,
          regions={"body": Region(any_arity, required=True)}, foldable=False, static_bound=_loop_bound)
def Loop(ctx, M=None, cond=None, *rest, body=-1, body_captures=()):
    """ONNX ``Loop``: ``for i in range(M) while cond`` over loop-carried values
    (strategies: see the module docstring)."""
    allin = [M, cond, *rest]
    caps = _caps(allin, body_captures)
    n_state = len(rest) - len(body_captures)
    state = list(rest[:n_state])
    counted = has_valid_count(ctx)
    n_scan = len(ctx.outputs) - n_state - counted
    m_c = concrete(M) if M is not None else None
    has_seq = any(isinstance(s, list) for s in state)
    if n_scan and not has_seq and m_c is not None and (counted or (
            _passes_condition_through(ctx.model.graphs[body]) and (cond is None or (
                concrete(cond) is not None and bool(np.asarray(concrete(cond)).reshape(-1)[0]))))):
        return _scan_loop(ctx, int(np.asarray(m_c).reshape(())), cond, state, caps, body, n_scan, counted)
    if n_scan == 0 and not has_seq:
        big = np.int32(np.iinfo(np.int32).max)
        m = jnp.asarray(M).reshape(()).astype(jnp.int32) if M is not None else big
        c0 = as_bool(jnp.asarray(cond).reshape(())) if cond is not None else jnp.asarray(True)

        def cond_fn(carry):
            i, c, *_ = carry
            return jnp.logical_and(i < m, c)

        def body_fn(carry):
            i, c, *vs = carry
            outs = ctx.call_graph(body, i.astype(jnp.int32), c.astype(jnp.int32), *vs, *caps)
            new = [jnp.asarray(o).astype(jnp.asarray(v).dtype).reshape(jnp.shape(v))
                   for o, v in zip(outs[1:1 + n_state], vs)]
            return (i + 1, as_bool(jnp.asarray(outs[0]).reshape(())), *new)

        carry = (jnp.asarray(0, jnp.int32), c0, *[jnp.asarray(s) for s in state])
        out = lax.while_loop(cond_fn, body_fn, carry)
        return list(out[2:])
    # Unrolled: trip count and conditions must be known while tracing.
    if M is not None and m_c is None:
        raise ctx.error("Loop with scan outputs or sequence state needs a trip count known at load time "
                        "(bind it with fbjax.load(path, constant_inputs={name: value}))")
    m = int(np.asarray(m_c).reshape(())) if m_c is not None else None
    c = True
    if cond is not None:
        cc = concrete(cond)
        if cc is None:
            raise ctx.error("Loop with scan outputs needs its condition known at load time")
        c = bool(np.asarray(cc).reshape(-1)[0])
    scans = [[] for _ in range(n_scan)]
    i = 0
    while c and (m is None or i < m):
        outs = ctx.call_graph(body, np.int32(i), np.int32(c), *state, *caps)
        cc = concrete(outs[0])
        if cc is None:
            raise ctx.error("Loop with scan outputs needs every iteration's condition known at load time, "
                            "or fbjax.load(path, static_bounds=True) (scan outputs padded to the trip count)")
        c = bool(np.asarray(cc).reshape(-1)[0])
        state = list(outs[1:1 + n_state])
        for k in range(n_scan):
            scans[k].append(jnp.asarray(outs[1 + n_state + k]))
        i += 1
        if i > 100000:
            raise ctx.error("Loop unrolled more than 100000 iterations")
    res = list(state)
    for k in range(n_scan):
        if not scans[k]:
            raise ctx.error("Loop ran zero iterations; the scan output's shape is unknown")
        res.append(jnp.stack(scans[k]))
    return res


def _passes_condition_through(g) -> bool:
    """True when the body graph's condition output is its condition input
    (directly or through ``Identity``) or a constant true: then a loop that
    starts with a true condition runs its full trip count."""
    producer = {id(o): n for n in g.nodes for o in n.outputs if o is not None}
    v = g.outputs[0] if g.outputs else None
    while v is not None and id(v) in producer and producer[id(v)].op_name == "Identity":
        v = producer[id(v)].inputs[0]
    if v is None:
        return False
    if v.data is not None:
        return bool(np.all(np.asarray(v.data)))
    return len(g.inputs) > 1 and v is g.inputs[1]


def _scan_loop(ctx, m, cond, state, caps, body, n_scan, counted):
    """``Loop`` as ``lax.scan`` over its trip count ``m``: each step runs the
    body and keeps its results while the condition holds (state unchanged,
    scan outputs zero once it is false). Returns the final state, the scan
    outputs ``[m, ...]`` and, when ``counted``, the int32 iterations run."""
    c0 = as_bool(jnp.asarray(cond).reshape(())) if cond is not None else jnp.asarray(True)
    st0 = [jnp.asarray(v) for v in state]

    def step(carry, i):
        c, vs = carry
        outs = ctx.call_graph(body, i, c.astype(jnp.int32), *vs, *caps)
        new = [jnp.where(c, jnp.asarray(o).astype(v.dtype).reshape(v.shape), v)
               for o, v in zip(outs[1:1 + len(vs)], vs)]
        ys = [jnp.asarray(y) for y in outs[1 + len(vs):1 + len(vs) + n_scan]]
        ys = [jnp.where(c, y, jnp.zeros_like(y)) for y in ys]
        c_next = jnp.logical_and(c, as_bool(jnp.asarray(outs[0]).reshape(())))
        return (c_next, new), (ys, c)

    if m == 0:
        raise ctx.error("Loop runs zero iterations; its scan outputs' shapes are unknown")
    (_, final), (ys, ran) = lax.scan(step, (c0, st0), jnp.arange(m, dtype=jnp.int32))
    res = list(final) + list(ys)
    if counted:
        res.append(jnp.sum(ran, dtype=jnp.int32))
    return res


def _seq(s):
    if not isinstance(s, list):
        raise TypeError("expected a sequence")
    return s


@register(OP_SET, "SequenceEmpty", foldable=False)
def SequenceEmpty(ctx, *, dtype=None):
    """ONNX ``SequenceEmpty``: an empty sequence."""
    return [[]]


@register(OP_SET, "SequenceConstruct", foldable=False)
def SequenceConstruct(ctx, *inputs):
    """ONNX ``SequenceConstruct``: a sequence of the inputs."""
    return [list(inputs)]


@register(OP_SET, "SequenceLength", out_dtype=op_rules.int32_out, differentiable=False, foldable=False)
def SequenceLength(ctx, input_sequence):
    """ONNX ``SequenceLength``: int32 scalar."""
    return np.int32(len(_seq(input_sequence)))


def _pos(ctx, position, n, insert=False):
    if position is None:
        return n if insert else n - 1
    p = int(np.asarray(position).reshape(()))
    p = p + n if p < 0 else p
    if not 0 <= p <= (n if insert else n - 1):
        raise ctx.error(f"sequence position {p} out of range for length {n}")
    return p


@register(OP_SET, "SequenceAt", static_inputs=(1,), foldable=False)
def SequenceAt(ctx, input_sequence, position):
    """ONNX ``SequenceAt`` a load-time-constant position."""
    s = _seq(input_sequence)
    return s[_pos(ctx, position, len(s))]


@register(OP_SET, "SequenceInsert", static_inputs=(2,), foldable=False)
def SequenceInsert(ctx, input_sequence, tensor, position=None):
    """ONNX ``SequenceInsert`` (at the end by default)."""
    s = list(_seq(input_sequence))
    s.insert(_pos(ctx, position, len(s), insert=True), tensor)
    return [s]


@register(OP_SET, "SequenceErase", static_inputs=(1,), foldable=False)
def SequenceErase(ctx, input_sequence, position=None):
    """ONNX ``SequenceErase`` (the last element by default)."""
    s = list(_seq(input_sequence))
    del s[_pos(ctx, position, len(s))]
    return [s]


@register(OP_SET, "ConcatFromSequence", foldable=False)
def ConcatFromSequence(ctx, input_sequence, *, axis=0, new_axis=False):
    """ONNX ``ConcatFromSequence`` (``new_axis`` stacks)."""
    s = [jnp.asarray(x) for x in _seq(input_sequence)]
    if new_axis:
        return jnp.stack(s, axis=norm_axis(axis, s[0].ndim + 1, ctx))
    return jnp.concatenate(s, axis=norm_axis(axis, s[0].ndim, ctx))


@register(OP_SET, "SplitToSequence", static_inputs=(1,), foldable=False)
def SplitToSequence(ctx, input, split=None, *, axis=0, keep_dims=True):
    """ONNX ``SplitToSequence``: pieces of the constant ``split`` sizes (scalar:
    chunks of that size), or size-1 pieces (squeezed unless ``keep_dims``)."""
    x = jnp.asarray(input)
    a = norm_axis(axis, x.ndim, ctx)
    n = x.shape[a]
    if split is None:
        parts = [lax.index_in_dim(x, i, a, keepdims=bool(keep_dims)) for i in range(n)]
        return [parts]
    sp = np.asarray(split)
    if sp.ndim == 0:
        k = int(sp)
        sizes = [min(k, n - i) for i in range(0, n, k)]
    else:
        sizes = ints(sp)
    offs = np.cumsum([0] + sizes)
    return [[lax.slice_in_dim(x, int(offs[i]), int(offs[i + 1]), axis=a) for i in range(len(sizes))]]
