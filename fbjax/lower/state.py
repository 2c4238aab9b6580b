"""Explicit run state for every op set: resource variables and the PRNG key.

LiteRT keeps variables and random-number state inside the interpreter;
fbjax makes them an explicit ``state`` dict threaded through a pure
function: TFLite resource variables under their ``shared_name``, the PRNG
key (a raw ``jax.random`` key, ``uint32[2]``) under :data:`KEY`, shared by
TFLite's and ONNX's random ops. :func:`apply_with_state` runs a program with
a given state and returns the outputs and the new state;
:func:`initial_state` builds the first state at load time; :class:`fbjax.Model`
keeps the state between calls (``Model.state``).

Which ops need state, and what their initial state is, are facts declared
at their registration (:class:`fbjax._registry.OpDef`: ``stateful``,
``init_state``); this module knows no op by name, and the op sets import
nothing from each other for it.

While a program runs, its state lives in the run
(:class:`fbjax.lower.build.Run`, ``ctx.run.state``: a plain dict filled and
read in trace order, so the traced function stays pure); op lowerings reach
it through :func:`running` and :func:`ready` only.
"""

from __future__ import annotations

from .registry import LOWERINGS

__all__ = ["KEY", "running", "is_stateful", "has_state", "apply_with_state", "initial_state"]

#: The state key of the PRNG key.
KEY = "prng_key"

_NO_STATE = ("run the model through fbjax.Model (Model.state) or fbjax.lower.state.apply_with_state "
             "(state={'prng_key': key} for random ops)")


def running(ctx, need: str) -> dict:
    """The state dict of the run ``ctx`` belongs to.

    Raises:
        ModelFormatError: the program runs without state; the message starts
            with ``need`` (what the op needs) and says how to supply it.
    """
    st = ctx.run.state
    if st is None:
        raise ctx.error(f"{need}: {_NO_STATE}")
    return st


def ready(ctx) -> bool:
    """Whether the caller supplied the state (initialisers must not run again)."""
    return ctx.run.initialised


def is_stateful(node, registry=LOWERINGS) -> bool:
    """Whether ``node`` reads or writes run state (its ``stateful`` fact:
    a bool, or ``fn(node) -> bool`` for ops that need state only in some
    configurations, such as a training-mode ONNX Dropout)."""
    od = registry.get(node.op_set, node.op_name)
    s = od.stateful if od is not None else False
    return bool(s(node)) if callable(s) else bool(s)


def has_state(model, registry=LOWERINGS) -> bool:
    """True when a node of ``model`` (any graph) is stateful: resource
    variables, random draws."""
    return any(is_stateful(n, registry) for n in model.iter_nodes())


def apply_with_state(program, params, state, *inputs):
    """Run ``program`` on ``inputs`` with ``state``.

    Returns:
        ``(outputs tuple, new_state dict)``. Initialisers (TFLite CALL_ONCE)
        are skipped when ``state`` is given (the model is already
        initialised), and run when ``state`` is None.
    """
    return program.apply_graph(program.model.main, params, {} if state is None else state, *inputs,
                               initialise=state is None)


def initial_state(program, params, registry=LOWERINGS) -> dict:
    """The state before the first call: each distinct ``init_state`` fact of
    the model's stateful ops, ``(order, fn(program, params, state))``, run
    once in ``order`` (TFLite CALL_ONCE initialisers first, then the PRNG key
    seeding), on an empty state."""
    inits = {}
    for n in program.model.iter_nodes():
        if not is_stateful(n, registry):
            continue
        od = registry.get(n.op_set, n.op_name)
        if od.init_state is not None:
            order, fn = od.init_state
            inits.setdefault(fn, order)
    state: dict = {}
    for fn, _ in sorted(inits.items(), key=lambda kv: kv[1]):
        fn(program, params, state)
    return state
