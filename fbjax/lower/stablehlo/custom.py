"""``stablehlo.custom_call`` and the handler registry behind
:func:`fbjax.register_custom_call`."""

from __future__ import annotations

from typing import Callable, Optional

from ... import batch_rules
from ...errors import UnsupportedOperatorError
from ._util import register

OP_SET = "stablehlo"

#: call_target_name -> handler(*operands, backend_config=bytes) -> array or tuple
CUSTOM_CALLS: dict[str, Callable] = {}


def register_custom_call(target_name: str, fn: Optional[Callable] = None, *, replace: bool = False):
    """Register a JAX implementation for ``stablehlo.custom_call`` targets
    named ``target_name``.

    The handler is called as ``fn(*operands, backend_config=bytes)`` with
    JAX arrays and returns one array or a tuple (one per result). Usable as a
    decorator (``@register_custom_call("my_op")``) or directly.

    Raises:
        ValueError: ``target_name`` already has a handler and ``replace`` is
            False.
    """

    def deco(f: Callable) -> Callable:
        if target_name in CUSTOM_CALLS and not replace:
            raise ValueError(f"custom call {target_name!r} already has a handler (pass replace=True)")
        CUSTOM_CALLS[target_name] = f
        return f

    return deco if fn is None else deco(fn)


def topk(ctx, operand):
    """``mhlo.topk`` (TensorFlow's converter writes ``tf.sort``,
    ``tf.argsort`` and ``tf.math.top_k`` so): the ``k`` largest elements of
    the last dimension, in descending order, and their indices (ties: lower
    index first); ``k`` is the outputs' last dimension."""
    import jax.numpy as jnp
    from jax import lax

    if len(ctx.outputs) != 2 or ctx.outputs[0] is None or not ctx.outputs[0].shape:
        raise ctx.error("mhlo.topk needs two outputs (values, indices) with static shapes")
    k = int(ctx.outputs[0].shape[-1])
    values, indices = lax.top_k(jnp.asarray(operand), k)
    return [values, indices.astype(ctx.out_dtype(1))]


#: targets fbjax lowers itself when no handler is registered for them.
BUILTIN_TARGETS: dict[str, Callable] = {"mhlo.topk": topk}


def _check_target(node) -> Optional[str]:
    """Load-time check (``check`` fact): a handler exists for the node's
    ``call_target_name``."""
    target = str(node.attrs.get("call_target_name", "") or "")
    if target in CUSTOM_CALLS or target in BUILTIN_TARGETS:
        return None
    return (f"no handler for custom call target {target!r}; register one with "
            f"fbjax.register_custom_call({target!r}, fn) before fbjax.load")


@register(OP_SET, "stablehlo.custom_call", foldable=False, batch=batch_rules.hlo_not_followed,
          check=_check_target)
def custom_call(ctx, *operands, call_target_name="", backend_config=b""):
    """``stablehlo.custom_call``: calls the handler registered for
    ``call_target_name``.

    Raises:
        UnsupportedOperatorError: no handler is registered (the message names
            the target and :func:`fbjax.register_custom_call`).
    """
    fn = CUSTOM_CALLS.get(call_target_name)
    if fn is None and call_target_name in BUILTIN_TARGETS:
        return BUILTIN_TARGETS[call_target_name](ctx, *operands)
    if fn is None:
        raise UnsupportedOperatorError(
            [(OP_SET, f"stablehlo.custom_call @{call_target_name}")],
            detail=f"{ctx.node.location}: no handler for custom call target {call_target_name!r}; "
            f"register one with fbjax.register_custom_call({call_target_name!r}, fn).",
        )
    bc = backend_config if isinstance(backend_config, bytes) else str(backend_config or "").encode()
    res = fn(*operands, backend_config=bc)
    return list(res) if isinstance(res, (tuple, list)) else res
