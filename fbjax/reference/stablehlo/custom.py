"""numpy twin of ``stablehlo.custom_call``: handlers registered with
:func:`register_reference_custom_call` (the JAX handlers of
:func:`fbjax.register_custom_call` are not usable here)."""

from __future__ import annotations

from typing import Callable

from ...errors import UnsupportedOperatorError
from ..registry import register

OP_SET = "stablehlo"
REFERENCE_CUSTOM_CALLS: dict[str, Callable] = {}


def register_reference_custom_call(target_name: str, fn: Callable) -> Callable:
    """numpy handler ``fn(*operands, backend_config=bytes)`` for ``target_name``."""
    REFERENCE_CUSTOM_CALLS[target_name] = fn
    return fn


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
    fn = REFERENCE_CUSTOM_CALLS.get(call_target_name)
    if fn is None and call_target_name == "mhlo.topk":
        return topk(ctx, *operands)
    if fn is None:
        raise UnsupportedOperatorError(
            [(OP_SET, f"stablehlo.custom_call @{call_target_name}")],
            detail=f"{ctx.node.location}: the reference has no handler for custom call {call_target_name!r}.",
        )
    res = fn(*operands, backend_config=backend_config)
    return list(res) if isinstance(res, (tuple, list)) else res
