"""TFLite resource variables as explicit state: VAR_HANDLE, READ_VARIABLE,
ASSIGN_VARIABLE and CALL_ONCE (``kernels/var_handle.cc``,
``read_variable.cc``, ``assign_variable.cc``, ``call_once.cc``).

LiteRT keeps variables inside the interpreter; fbjax makes them an explicit
``state`` dict ``{shared_name: array}`` threaded through a pure function:
:func:`apply_with_state` runs a program with a given state and returns the
outputs and the new state; :func:`initial_state` runs the model's CALL_ONCE
initialisation subgraphs once (at load time) to build the first state.
While a program runs, the current state lives in ``program._state`` (a plain
dict, filled and read in trace order, so the traced function stays pure);
VAR_HANDLE yields a static int32 handle, an index into
``program._var_names``. :class:`fbjax.Model` keeps the state between calls
as LiteRT does (see ``Model.state``).
"""

from __future__ import annotations

import numpy as np

from ...errors import ModelFormatError
from ..registry import register


def _name(shared_name) -> str:
    return shared_name.decode("utf-8", "replace") if isinstance(shared_name, (bytes, bytearray)) \
        else str(shared_name)


_STATEFUL = ("VAR_HANDLE", "CALL_ONCE", "RANDOM_STANDARD_NORMAL", "RANDOM_UNIFORM", "MULTINOMIAL")
_RANDOM = _STATEFUL[2:]


def has_state(model) -> bool:
    """True when the model uses resource variables or random ops (PRNG key; TFLite
    or ONNX, see :func:`fbjax.lower.onnx.random.draws`)."""
    from ..onnx.random import uses_prng_key
    return any(n.op_set == "tflite" and n.op_name in _STATEFUL for n in model.iter_nodes()) or uses_prng_key(model)


def _names(program) -> list:
    if not hasattr(program, "_var_names"):
        program._var_names = []
    return program._var_names


def apply_with_state(program, params, state, *inputs):
    """Run ``program`` on ``inputs`` with variable ``state``.

    Returns:
        ``(outputs tuple, new_state dict)``. CALL_ONCE nodes are skipped
        when ``state`` is given (the model is already initialised), and run
        when ``state`` is None.
    """
    prev = getattr(program, "_state", None), getattr(program, "_state_ready", False)
    program._state = {} if state is None else dict(state)
    program._state_ready = state is not None
    try:
        outs = program.apply(params, *inputs)
        return outs, dict(program._state)
    finally:
        program._state, program._state_ready = prev


def initial_state(program, params) -> dict:
    """The state after the main graph's CALL_ONCE initialisers ran once."""
    prev = getattr(program, "_state", None), getattr(program, "_state_ready", False)
    program._state, program._state_ready = {}, False
    try:
        main = program.model.graphs[program.model.main]
        for n in main.nodes:
            if n.op_name == "CALL_ONCE":
                program.eval_graph(int(n.attrs.get("init_subgraph_index", 0)), [], params)
        if any(n.op_name in _RANDOM for n in program.model.iter_nodes()):
            import jax

            from .random import KEY, first_seed
            program._state[KEY] = jax.random.PRNGKey(first_seed(program.model))
        else:  # ONNX random ops share the key (issue 5)
            from ..onnx import random as onnx_random
            if onnx_random.uses_prng_key(program.model):
                program._state[onnx_random.KEY] = onnx_random.initial_key(program.model)
        return dict(program._state)
    finally:
        program._state, program._state_ready = prev


def _state(ctx) -> dict:
    st = getattr(ctx.program, "_state", None)
    if st is None:
        raise ctx.error("this model has resource variables: run it through fbjax.Model (which keeps "
                        "Model.state) or fbjax.lower.tflite.state.apply_with_state")
    return st


@register("tflite", "CALL_ONCE", differentiable=False, foldable=False)
def CALL_ONCE(ctx, *, init_subgraph_index=0):
    """TFLite CALL_ONCE: run the initialisation subgraph the first time only
    (when the state was not supplied by the caller)."""
    _state(ctx)
    if not ctx.program._state_ready:
        ctx.call_graph(int(init_subgraph_index))
    return []


@register("tflite", "VAR_HANDLE", differentiable=False, foldable=False)
def VAR_HANDLE(ctx, *, container="", shared_name=""):
    """TFLite VAR_HANDLE: a static handle naming the variable ``shared_name``
    (``container`` is ignored, as LiteRT does)."""
    names = _names(ctx.program)
    n = _name(shared_name) or f"{ctx.node.location}"
    if n not in names:
        names.append(n)
    return np.asarray(names.index(n), np.int32)


def _key(ctx, handle) -> str:
    if not isinstance(handle, np.ndarray):
        raise ctx.error("the resource handle must come from a VAR_HANDLE (static)")
    return _names(ctx.program)[int(handle)]


@register("tflite", "READ_VARIABLE", foldable=False)
def READ_VARIABLE(ctx, handle):
    """TFLite READ_VARIABLE: the variable's current value."""
    st = _state(ctx)
    k = _key(ctx, handle)
    if k not in st:
        raise ctx.error(f"variable {k!r} is read before it is assigned")
    return st[k]


@register("tflite", "ASSIGN_VARIABLE", foldable=False)
def ASSIGN_VARIABLE(ctx, handle, value):
    """TFLite ASSIGN_VARIABLE: set the variable (shape and dtype fixed by
    the first assignment, as XLA needs them constant across calls)."""
    st = _state(ctx)
    k = _key(ctx, handle)
    import jax.numpy as jnp

    v = jnp.asarray(value)
    old = st.get(k)
    if old is not None and (tuple(jnp.shape(old)) != tuple(v.shape)):
        raise ctx.error(f"variable {k!r} changes shape from {tuple(jnp.shape(old))} to {tuple(v.shape)}")
    st[k] = v if old is None else v.astype(jnp.asarray(old).dtype)
    return []


__all__ = ["apply_with_state", "initial_state", "has_state", "ModelFormatError"]
