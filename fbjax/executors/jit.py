"""The plain executors: ``jax.jit`` of the model's pure function.

:class:`Jit` runs a stateless model (any backend); :class:`Stateful` runs a
model with resource variables or random ops, threading ``state`` through the
call (:mod:`fbjax.lower.state`).
"""

from __future__ import annotations

import operator
from typing import Callable

import jax

from .tiered import TieredCall, wait_optimised

__all__ = ["Jit", "Stateful", "leaves_getter"]


def leaves_getter(names: tuple) -> Callable:
    """``f(params) -> tuple`` of ``params[name]`` for ``names`` (KeyError if one is missing)."""
    if len(names) >= 2:
        return operator.itemgetter(*names)  # one C call
    if names:
        get = operator.itemgetter(names[0])
        return lambda params: (get(params),)
    return lambda params: ()


class Jit:
    """``fn(params, *inputs) -> outputs``: ``jax.jit`` of the model's pure
    ``apply(params, *inputs)``.

    Also the unchecked fast path of :meth:`fbjax.Model.__call__`:
    :attr:`jitted_leaves` takes the params as a tuple in ``param_names``
    order (the jit dispatch flattens a tuple faster than a dict, whose keys
    it sorts on every call) and runs ``apply_leaves``, which refuses at
    trace time inputs that need checking (see ``Model._apply_leaves``).

    Attributes:
        name: ``"jit"``.
        jitted: the jit of ``apply``.
        leaves: ``f(params) -> tuple`` of the params in ``param_names`` order.
        jitted_leaves: the jit of ``apply_leaves(leaves, *inputs)``.

    On CPU both are :class:`~fbjax.executors.tiered.TieredCall` s of the jits
    (a quickly compiled first tier, the optimised program swapped in when
    ready) when ``tiered`` (:func:`fbjax.executors.tiered.worth_tiering`).
    """

    name = "jit"
    stateful = False
    unchecked = True  # Model.__call__ may try jitted_leaves before any input check

    def __init__(self, apply: Callable, apply_leaves: Callable, param_names: tuple, compiler_options=None,
                 tiered: bool = False):
        self.jitted = jax.jit(apply, compiler_options=compiler_options)
        self.leaves = leaves_getter(tuple(param_names))
        self.jitted_leaves = jax.jit(apply_leaves, compiler_options=compiler_options)
        if tiered:
            self.jitted, self.jitted_leaves = TieredCall(self.jitted), TieredCall(self.jitted_leaves)

    def __call__(self, params: dict, *inputs):
        return self.jitted(params, *inputs)

    def skip_quick_tier(self) -> None:
        """The first call compiles the optimised programs directly
        (:meth:`fbjax.executors.tiered.TieredCall.skip_quick`); nothing when not
        tiered or once called."""
        for c in (self.jitted, self.jitted_leaves):
            if isinstance(c, TieredCall):
                c.skip_quick()

    def wait_optimised(self, timeout=None) -> None:
        """Block until both jits run their optimised programs
        (:mod:`fbjax.executors.tiered`); at once when not tiered or not called
        yet. ``timeout`` in seconds per jit."""
        wait_optimised(self.jitted, self.jitted_leaves, timeout=timeout)

    def trace(self, params: dict, *specs):
        """Trace the first call on inputs of ``specs`` (``jax.ShapeDtypeStruct``)
        without running it: what :meth:`fbjax.Model.__call__`'s fast path
        calls (:attr:`jitted_leaves`), so that call reuses this trace (JAX
        keeps traces per function and argument types). Returns the outputs'
        ``ShapeDtypeStruct`` pytree; raises what the lowerings raise."""
        return self.jitted_leaves.trace(self.leaves(params), *specs).out_info


class Stateful:
    """``fn(params, state, *inputs) -> (outputs, new_state)``: ``jax.jit``
    of the model's ``apply(params, *inputs, state=state)`` (models with
    resource variables or random ops; :class:`fbjax.Model` keeps the state
    between calls).

    Attributes:
        name: ``"stateful"``.
        jitted: the jit of ``apply``.
    """

    name = "stateful"
    stateful = True
    unchecked = False

    def __init__(self, apply: Callable, compiler_options=None):
        self.jitted = jax.jit(apply, compiler_options=compiler_options)

    def __call__(self, params: dict, state: dict, *inputs):
        return self.jitted(params, *inputs, state=state)

    def trace(self, params: dict, state: dict, *specs):
        """Trace the first call (see :meth:`Jit.trace`); returns
        ``(outputs, new_state)`` as ``ShapeDtypeStruct`` pytrees."""
        return self.jitted.trace(params, *specs, state=state).out_info
