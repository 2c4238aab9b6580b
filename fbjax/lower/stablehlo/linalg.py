"""StableHLO contractions: ``stablehlo.dot`` and ``stablehlo.dot_general``."""

from __future__ import annotations

import numpy as np
from jax import lax

from ... import op_rules
from ._util import ints, register

OP_SET = "stablehlo"


def _operands(ctx, lhs, rhs):
    """Operands with the element type lax needs: StableHLO lets the operand
    types differ from each other and from the result (``i8 x i8 -> i32``,
    ``i32 x i32 -> f32``); mixed or int-to-float cases compute in the result
    type."""
    out = ctx.out_dtype(0)
    lt, rt = np.dtype(lhs.dtype), np.dtype(rhs.dtype)
    if lt != rt or (np.issubdtype(out, np.inexact) and not np.issubdtype(lt, np.inexact)):
        return lax.convert_element_type(lhs, out), lax.convert_element_type(rhs, out)
    return lhs, rhs


def _dot_batch(node, carrying, batch) -> None:
    if op_rules.carries(node, carrying)[1:2] == [True]:
        raise op_rules.refusal(node, "contracts a batch-carrying right operand")


@register(OP_SET, "stablehlo.dot", batch=_dot_batch)
def dot(ctx, lhs, rhs):
    """``stablehlo.dot`` (deprecated in the spec): vector.vector,
    matrix.vector or matrix.matrix product contracting the last dimension of
    ``lhs`` with the first of ``rhs``; result type from the output tensor."""
    if np.ndim(lhs) not in (1, 2) or np.ndim(rhs) not in (1, 2):
        raise ctx.error(f"operands must have rank 1 or 2, got {np.ndim(lhs)} and {np.ndim(rhs)}")
    lhs, rhs = _operands(ctx, lhs, rhs)
    return lax.dot(lhs, rhs, preferred_element_type=ctx.out_dtype(0))


def _dot_general_batch(node, carrying, batch) -> None:
    a = node.attrs
    carries = op_rules.carries(node, carrying)
    lb, rb = op_rules.ints(a.get("lhs_batching_dimensions")), op_rules.ints(a.get("rhs_batching_dimensions"))
    lc, rc = op_rules.ints(a.get("lhs_contracting_dimensions")), op_rules.ints(a.get("rhs_contracting_dimensions"))
    lhs_c, rhs_c = carries[0], carries[1] if len(carries) > 1 else False
    if lhs_c and rhs_c:
        ok = lb[:1] == [0] and rb[:1] == [0]
    elif lhs_c:
        ok = not lb and 0 not in lc
    else:
        ok = False
    if not ok:
        raise op_rules.refusal(node, f"does not keep the batch as dimension 0 (lhs batching {lb}, contracting {lc}; "
                               f"rhs batching {rb}, contracting {rc})")


@register(OP_SET, "stablehlo.dot_general", batch=_dot_general_batch)
def dot_general(ctx, lhs, rhs, *, lhs_batching_dimensions=(), rhs_batching_dimensions=(),
                lhs_contracting_dimensions=(), rhs_contracting_dimensions=()):
    """``stablehlo.dot_general``: result dims are batch, lhs free, rhs free
    (``lax.dot_general`` uses the same order); accumulation and result type
    from the output tensor.

    Raises:
        ModelFormatError: batching/contracting lists of unequal length.
    """
    lb, rb = ints(lhs_batching_dimensions), ints(rhs_batching_dimensions)
    lc, rc = ints(lhs_contracting_dimensions), ints(rhs_contracting_dimensions)
    if len(lb) != len(rb) or len(lc) != len(rc):
        raise ctx.error(f"dimension numbers differ in length: batching {lb} vs {rb}, contracting {lc} vs {rc}")
    lhs, rhs = _operands(ctx, lhs, rhs)
    return lax.dot_general(lhs, rhs, ((lc, rc), (lb, rb)), preferred_element_type=ctx.out_dtype(0))
