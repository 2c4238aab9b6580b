"""User-registered TFLite custom ops: :func:`register_custom_op`.

A ``.tflite`` file may contain ``CUSTOM`` operators identified by a
``custom_code`` string. fbjax lowers the ones it knows (MediaPipe's,
``TFLite_Detection_PostProcess`` ...); for any other code, users register
their own JAX lowering, and optionally a numpy twin for
:func:`fbjax.reference.run`::

    import jax.numpy as jnp
    import fbjax

    def scale_ref(ctx, x, *, alpha=1.0):          # numpy, for fbjax.reference
        return x * alpha

    @fbjax.register_custom_op("MyScale", reference=scale_ref)
    def my_scale(ctx, x, *, alpha=1.0):           # JAX, traced under jit
        return x * alpha

    model = fbjax.load("with_my_scale.tflite")

The function receives ``ctx`` (the node, its input/output tensor specs,
``ctx.error(msg)``), the op's inputs positionally (JAX arrays; numpy arrays
for positions listed in ``static_inputs``) and, as keyword arguments, the
custom options: a flexbuffer map is decoded into its keys, anything else
arrives as ``custom_options=<bytes>``. Keywords the function does not declare
are dropped (declare ``**attrs`` to receive them all). It returns one array or
a sequence, one per output.
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional

from .lower.registry import LOWERINGS

#: The op set of TFLite custom codes in fbjax's registries.
CUSTOM_OP_SET = "tflite.custom"


def register_custom_op(
    name: str,
    *,
    reference: Optional[Callable] = None,
    static_inputs: Iterable[int] = (),
    differentiable: bool = True,
    replace: bool = False,
    **facts,
):
    """Decorator registering a JAX lowering for the TFLite custom code ``name``.

    Args:
        name: the ``custom_code`` string exactly as stored in the file.
        reference: optional numpy twin with the same signature, registered
            for :func:`fbjax.reference.run`.
        static_inputs: input positions that must be known at load time
            (they arrive as numpy arrays).
        differentiable: False when gradients through the op are meaningless.
        replace: allow replacing an existing registration (including
            fbjax's own lowering of that code).
        **facts: what the load-time passes should know about the op, as for
            fbjax's own ops (:class:`fbjax._registry.OpDef`: ``batch``,
            ``foldable``, ``weights``, ...); by default the op keeps a batch
            in dimension 0 and is pure. ``regions`` and ``out_dtype`` also
            reach the ``reference`` registration (both executors read a
            file alike, :mod:`fbjax.passes.reading`).

    Returns:
        the decorator; it returns the function unchanged.

    Raises:
        ValueError: ``name`` is already registered and ``replace`` is False.
        TypeError: an unknown fact.
    """
    if not isinstance(name, str) or not name:
        raise ValueError("custom op name must be a non-empty string")
    static = tuple(int(i) for i in static_inputs)

    def deco(fn: Callable) -> Callable:
        LOWERINGS.register(CUSTOM_OP_SET, name, static_inputs=static, differentiable=differentiable,
                           replace=replace, **facts)(fn)
        if reference is not None:  # with the facts the reference needs to read a file, as the lowering has them
            # imported here, not with fbjax: the numpy reference is fbjax.reference.run's, and importing its
            # families costs every `fbjax` command ~0.1 s of CPU that only a reference registration needs
            from .reference.registry import REFERENCE

            shared = {k: v for k, v in facts.items() if k in ("regions", "out_dtype")}
            REFERENCE.register(CUSTOM_OP_SET, name, static_inputs=static, replace=replace, **shared)(reference)
        return fn

    return deco
