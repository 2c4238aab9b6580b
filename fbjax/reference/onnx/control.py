"""numpy twins of :mod:`fbjax.lower.onnx.control`: If, Loop (a Python loop) and
sequence ops (sequences are Python lists)."""

from __future__ import annotations

import numpy as np

from ... import op_rules
from ...op_rules import Region, any_arity
from ..registry import register
from ._util import OP_SET, axis as norm_axis, ints, out


def _if_dtype(node, k, graphs):
    """Output ``k`` of the ``then_branch`` graph's."""
    body = graphs[int(node.attrs["then_branch"])]
    return body.outputs[k].dtype if k < len(body.outputs) and body.outputs[k] is not None else None


@register(OP_SET, "If", out_dtype=_if_dtype,
          regions={"then_branch": Region(any_arity, required=True), "else_branch": Region(any_arity, required=True)})
def If(ctx, cond, *captured, then_branch=-1, else_branch=-1, then_branch_captures=(),
       else_branch_captures=()):
    """numpy ONNX ``If``."""
    allin = [cond, *captured]
    take = bool(np.asarray(cond).reshape(-1)[0])
    g, pos = (then_branch, then_branch_captures) if take else (else_branch, else_branch_captures)
    return ctx.call_graph(g, *[allin[p] for p in pos])


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
          regions={"body": Region(any_arity, required=True)})
def Loop(ctx, M=None, cond=None, *rest, body=-1, body_captures=()):
    """numpy ONNX ``Loop``. In static-bound mode (a trailing ``:valid_count``
    output) the scan outputs are padded with zeros to the trip count ``M``
    and the iterations run are returned last."""
    allin = [M, cond, *rest]
    caps = [allin[p] for p in body_captures]
    n_state = len(rest) - len(body_captures)
    state = list(rest[:n_state])
    last = ctx.outputs[-1] if ctx.outputs else None
    counted = last is not None and last.name.endswith(":valid_count") and last.shape == ()
    n_scan = len(ctx.outputs) - n_state - counted
    m = int(np.asarray(M).reshape(())) if M is not None else None
    c = bool(np.asarray(cond).reshape(-1)[0]) if cond is not None else True
    scans = [[] for _ in range(n_scan)]
    i = 0
    while c and (m is None or i < m):
        outs = ctx.call_graph(body, np.int32(i), np.int32(c), *state, *caps)
        c = bool(np.asarray(outs[0]).reshape(-1)[0])
        state = list(outs[1:1 + n_state])
        for k in range(n_scan):
            scans[k].append(outs[1 + n_state + k])
        i += 1
    if counted:
        padded = []
        for s in scans:
            a = np.zeros((m, *np.shape(s[0])), np.asarray(s[0]).dtype)
            a[:len(s)] = np.stack(s)
            padded.append(a)
        return state + padded + [np.int32(i)]
    return state + [np.stack(s) for s in scans]


@register(OP_SET, "SequenceEmpty")
def SequenceEmpty(ctx, *, dtype=None):
    """numpy ONNX ``SequenceEmpty``."""
    return [[]]


@register(OP_SET, "SequenceConstruct")
def SequenceConstruct(ctx, *inputs):
    """numpy ONNX ``SequenceConstruct``."""
    return [list(inputs)]


@register(OP_SET, "SequenceLength", out_dtype=op_rules.int32_out)
def SequenceLength(ctx, input_sequence):
    """numpy ONNX ``SequenceLength``."""
    return out(ctx, np.int32(len(input_sequence)))


def _p(position, n, insert=False):
    if position is None:
        return n if insert else n - 1
    p = int(np.asarray(position).reshape(()))
    return p + n if p < 0 else p


@register(OP_SET, "SequenceAt")
def SequenceAt(ctx, input_sequence, position):
    """numpy ONNX ``SequenceAt``."""
    return input_sequence[_p(position, len(input_sequence))]


@register(OP_SET, "SequenceInsert")
def SequenceInsert(ctx, input_sequence, tensor, position=None):
    """numpy ONNX ``SequenceInsert``."""
    s = list(input_sequence)
    s.insert(_p(position, len(s), True), tensor)
    return [s]


@register(OP_SET, "SequenceErase")
def SequenceErase(ctx, input_sequence, position=None):
    """numpy ONNX ``SequenceErase``."""
    s = list(input_sequence)
    del s[_p(position, len(s))]
    return [s]


@register(OP_SET, "ConcatFromSequence")
def ConcatFromSequence(ctx, input_sequence, *, axis=0, new_axis=False):
    """numpy ONNX ``ConcatFromSequence``."""
    s = [np.asarray(x) for x in input_sequence]
    if new_axis:
        return np.stack(s, axis=norm_axis(axis, s[0].ndim + 1))
    return np.concatenate(s, axis=norm_axis(axis, s[0].ndim))


@register(OP_SET, "SplitToSequence")
def SplitToSequence(ctx, input, split=None, *, axis=0, keep_dims=True):
    """numpy ONNX ``SplitToSequence``."""
    x = np.asarray(input)
    a = norm_axis(axis, x.ndim)
    n = x.shape[a]
    if split is None:
        parts = np.split(x, n, axis=a)
        return [[p if keep_dims else np.squeeze(p, a) for p in parts]]
    sp = np.asarray(split)
    sizes = [min(int(sp), n - i) for i in range(0, n, int(sp))] if sp.ndim == 0 else ints(sp)
    return [np.split(x, np.cumsum(sizes)[:-1], axis=a)]
