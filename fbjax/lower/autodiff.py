"""A clear error for reverse-mode differentiation through ``lax.while_loop``.

JAX cannot transpose a ``while_loop`` (its trip count is dynamic), and its
error ("Reverse-mode differentiation does not work for lax.while_loop...")
does not say what to do with a model file. :func:`reverse_mode_guard` wraps
a loop's float results, when they are being linearized (``jax.grad``,
``jax.vjp``: the values are JAX ``LinearizeTracer`` s), in an identity whose
backward pass raises :class:`~fbjax.errors.InputError` pointing to
``fbjax.load(..., while_max_iterations=N)``. Forward mode (``jax.jvp``,
``jax.jacfwd``) and plain evaluation see the loop's results unchanged; the
price is that ``jax.linearize`` through such a loop fails too (it needs the
same rewrite). A loop traced under ``jit`` before being differentiated
(``jax.grad(jax.jit(model.apply))``) gives JAX's own error.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..errors import InputError

try:  # JAX's linearization tracer (jax.grad / jax.vjp); private, so optional
    from jax._src.interpreters.ad import LinearizeTracer as _LinearizeTracer
except ImportError:  # pragma: no cover - another JAX layout: no guard, JAX's own error
    _LinearizeTracer = None
try:  # forward-mode tracer (jax.jvp / jax.jacfwd)
    from jax._src.interpreters.ad import JVPTracer as _JVPTracer
except ImportError:  # pragma: no cover
    _JVPTracer = None


def _linearized(x, depth: int = 0) -> bool:
    """Whether ``x`` is (or, under vmap, wraps) a value being linearized."""
    if _LinearizeTracer is None or depth > 8 or not isinstance(x, jax.core.Tracer):
        return False
    if isinstance(x, _LinearizeTracer):
        return True
    inner = getattr(x, "val", None)  # BatchTracer
    return inner is not None and _linearized(inner, depth + 1)


def _tracer_kinds(x, kinds: set, depth: int = 0) -> set:
    """Adds ``"lin"`` / ``"jvp"`` to ``kinds`` for each linearization /
    forward-mode tracer in ``x``'s chain (through primals and vmap's values)."""
    if depth > 16 or not isinstance(x, jax.core.Tracer):
        return kinds
    if _LinearizeTracer is not None and isinstance(x, _LinearizeTracer):
        kinds.add("lin")
    elif _JVPTracer is not None and isinstance(x, _JVPTracer):
        kinds.add("jvp")
    inner = getattr(x, "primal", None)
    inner = getattr(x, "val", None) if inner is None else inner
    return kinds if inner is None else _tracer_kinds(inner, kinds, depth + 1)


def linearized_only(*values) -> bool:
    """Whether some of ``values`` are being linearized (``jax.grad``,
    ``jax.vjp``) and none is under forward mode (``jax.jvp``, ``jax.jacfwd``,
    also around or inside the linearization): where a ``jax.custom_vjp``
    may stand in for JAX's own derivative (it has no forward mode)."""
    kinds: set = set()
    for v in values:
        _tracer_kinds(v, kinds)
    return "lin" in kinds and "jvp" not in kinds


def reverse_mode_guard(values, where: str):
    """``values`` unchanged, except when they are being linearized: then the
    float ones pass through an identity whose transpose raises InputError.

    Args:
        values: the loop's results (a sequence of arrays).
        where: the operator, for the message (``"subgraph 0, operator 3 (WHILE)"``).

    Returns:
        a list, one entry per value.
    """
    values = list(values)
    if not any(_linearized(v) for v in values):
        return values

    @jax.custom_vjp
    def guard(x):
        return x

    def fwd(x):
        return x, None

    def bwd(_, ct):
        raise InputError(
            f"{where}: reverse-mode differentiation (jax.grad, jax.vjp) cannot go through a WHILE loop "
            "lowered to lax.while_loop, whose trip count is only known at run time. Load the model with "
            "fbjax.load(path, while_max_iterations=N), N >= the largest trip count: each WHILE then "
            "becomes an N-step lax.scan that jax.grad differentiates (forward mode, jax.jvp, works "
            "either way).")

    guard.defvjp(fwd, bwd)
    return [guard(v) if jnp.issubdtype(jnp.result_type(v), jnp.inexact) else v for v in values]
