"""numpy twin of ``stablehlo.custom_call``: handlers registered with
:func:`register_reference_custom_call` (the JAX handlers of
:func:`fbjax.register_custom_call` are not usable here)."""

from __future__ import annotations

from typing import Callable

from ..._registry import call_op
from ...errors import UnsupportedOperatorError
from ..registry import REFERENCE, register

OP_SET = "stablehlo"
#: the op set of custom-call targets, as in the lowering registry
CUSTOM_CALL_OP_SET = "stablehlo.custom_call"


def register_reference_custom_call(target_name: str, fn: Callable) -> Callable:
    """numpy handler ``fn(*operands, backend_config=bytes)`` for
    ``target_name``, in the reference registry under
    :data:`CUSTOM_CALL_OP_SET` (a later registration replaces it)."""

    def twin(ctx, *operands, backend_config=b""):
        res = fn(*operands, backend_config=backend_config)
        return list(res) if isinstance(res, (tuple, list)) else res

    register(CUSTOM_CALL_OP_SET, target_name, replace=True)(twin)
    return fn


@register(CUSTOM_CALL_OP_SET, "mhlo.topk")
def topk(ctx, operand):
    """``mhlo.topk``: the k (outputs' last dim) largest of the last
    dimension, descending, ties by lower index (stable sort of ``-x``)."""
    import numpy as np

    x = np.asarray(operand)
    k = int(ctx.outputs[0].shape[-1])
    order = np.argsort(-x.astype(np.float64), axis=-1, kind="stable")[..., :k]
    return [np.take_along_axis(x, order, axis=-1), order.astype(ctx.out_dtype(1))]


@register(OP_SET, "stablehlo.custom_call")
def custom_call(ctx, *operands, call_target_name="", backend_config=b""):
    """Calls the registered numpy handler; raises UnsupportedOperatorError
    naming the target when there is none."""
    opdef = REFERENCE.get(CUSTOM_CALL_OP_SET, call_target_name)
    if opdef is None:
        raise UnsupportedOperatorError(
            [(OP_SET, f"stablehlo.custom_call @{call_target_name}")],
            detail=f"{ctx.node.location}: the reference has no handler for custom call {call_target_name!r}.",
        )
    return call_op(opdef, ctx, operands, {"backend_config": backend_config})
