"""``stablehlo.custom_call`` and the handler registry behind
:func:`fbjax.register_custom_call`."""

from __future__ import annotations

from typing import Callable, Optional

from ..._registry import call_op
from ...errors import UnsupportedOperatorError
from ..registry import LOWERINGS
from . import _util
from ._util import register

OP_SET = "stablehlo"

#: The op set under which each custom-call target has its entry in the one
#: lowering registry (``(CUSTOM_CALL_OP_SET, call_target_name)``), as TFLite
#: custom codes have theirs under ``"tflite.custom"``.
CUSTOM_CALL_OP_SET = "stablehlo.custom_call"


def _as_lowering(handler: Callable) -> Callable:
    """A user handler ``handler(*operands, backend_config=bytes)`` as a
    registry function ``fn(ctx, *operands, backend_config=bytes)``."""

    def lowering(ctx, *operands, backend_config=b""):
        res = handler(*operands, backend_config=backend_config)
        return list(res) if isinstance(res, (tuple, list)) else res

    lowering.handler = handler
    return lowering


def register_custom_call(target_name: str, fn: Optional[Callable] = None, *, replace: bool = False):
    """Register a JAX implementation for ``stablehlo.custom_call`` targets
    named ``target_name``, in the one lowering registry (op set
    :data:`CUSTOM_CALL_OP_SET`, as :func:`fbjax.register_custom_op` does
    for TFLite custom codes): ``fbjax.load`` refuses a file whose target
    has none.

    The handler is called as ``fn(*operands, backend_config=bytes)`` with
    JAX arrays and returns one array or a tuple (one per result). Usable as a
    decorator (``@register_custom_call("my_op")``) or directly.

    Raises:
        ValueError: ``target_name`` already has a handler (a registered one,
            or fbjax's own, e.g. ``mhlo.topk``) and ``replace`` is False.
    """
    if not isinstance(target_name, str) or not target_name:
        raise ValueError("custom call target name must be a non-empty string")

    def deco(f: Callable) -> Callable:
        if (CUSTOM_CALL_OP_SET, target_name) in LOWERINGS and not replace:
            raise ValueError(f"custom call {target_name!r} already has a handler (pass replace=True)")
        LOWERINGS.register(CUSTOM_CALL_OP_SET, target_name, replace=True, foldable=False)(_as_lowering(f))
        return f

    return deco if fn is None else deco(fn)


@register(CUSTOM_CALL_OP_SET, "mhlo.topk", foldable=False)
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


def _check_target(node) -> Optional[str]:
    """Load-time check (``check`` fact): the registry has a handler for the
    node's ``call_target_name``."""
    target = str(node.attrs.get("call_target_name", "") or "")
    if (CUSTOM_CALL_OP_SET, target) in LOWERINGS:
        return None
    return (f"no handler for custom call target {target!r}; register one with "
            f"fbjax.register_custom_call({target!r}, fn) before fbjax.load")


@register(OP_SET, "stablehlo.custom_call", foldable=False, batch=_util.not_followed_batch,
          check=_check_target)
def custom_call(ctx, *operands, call_target_name="", backend_config=b""):
    """``stablehlo.custom_call``: calls the handler registered for
    ``call_target_name``.

    Raises:
        UnsupportedOperatorError: no handler is registered (the message names
            the target and :func:`fbjax.register_custom_call`).
    """
    opdef = LOWERINGS.get(CUSTOM_CALL_OP_SET, call_target_name)
    if opdef is None:
        raise UnsupportedOperatorError(
            [(OP_SET, f"stablehlo.custom_call @{call_target_name}")],
            detail=f"{ctx.node.location}: no handler for custom call target {call_target_name!r}; "
            f"register one with fbjax.register_custom_call({call_target_name!r}, fn).",
        )
    bc = backend_config if isinstance(backend_config, bytes) else str(backend_config or "").encode()
    return call_op(opdef, ctx, operands, {"backend_config": bc})
