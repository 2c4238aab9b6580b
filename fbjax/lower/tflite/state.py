"""TFLite resource variables as explicit state: VAR_HANDLE, READ_VARIABLE,
ASSIGN_VARIABLE and CALL_ONCE (``kernels/var_handle.cc``,
``read_variable.cc``, ``assign_variable.cc``, ``call_once.cc``).

Variables are entries ``{shared_name: array}`` of the explicit run state
(:mod:`fbjax.lower.state`, which also holds :func:`apply_with_state` and
:func:`initial_state`, re-exported here); CALL_ONCE's initialisation
subgraphs make the initial state (its ``init_state`` fact). VAR_HANDLE
yields a static int32 handle, an index into the run's ``var_names``
(:class:`fbjax.lower.build.Run`).
:class:`fbjax.Model` keeps the state between calls as LiteRT does (see
``Model.state``).
"""

from __future__ import annotations

import numpy as np

from ...errors import ModelFormatError
from ...op_rules import Region
from ..registry import register
from ..state import apply_with_state, has_state, initial_state, ready, running  # noqa: F401  (re-exported)


def _name(shared_name) -> str:
    return shared_name.decode("utf-8", "replace") if isinstance(shared_name, (bytes, bytearray)) \
        else str(shared_name)


def _names(ctx) -> list:
    return ctx.run.var_names


def _state(ctx) -> dict:
    return running(ctx, "this model has resource variables")


def _run_call_once(program, params, state) -> None:
    """Initial state: the main graph's CALL_ONCE initialisers, run once."""
    main = program.model.graphs[program.model.main]
    for n in main.nodes:
        if n.op_name == "CALL_ONCE":
            _, new = program.apply_graph(int(n.attrs.get("init_subgraph_index", 0)), params, state,
                                         initialise=True)
            state.update(new)


@register("tflite", "CALL_ONCE",
          regions={"init_subgraph_index": Region(lambda n: (0, None))}, differentiable=False, foldable=False,
          stateful=True, init_state=(0, _run_call_once))
def CALL_ONCE(ctx, *, init_subgraph_index=0):
    """TFLite CALL_ONCE: run the initialisation subgraph the first time only
    (when the state was not supplied by the caller)."""
    _state(ctx)
    if not ready(ctx):
        ctx.call_graph(int(init_subgraph_index))
    return []


@register("tflite", "VAR_HANDLE", differentiable=False, foldable=False, stateful=True)
def VAR_HANDLE(ctx, *, container="", shared_name=""):
    """TFLite VAR_HANDLE: a static handle naming the variable ``shared_name``
    (``container`` is ignored, as LiteRT does)."""
    names = _names(ctx)
    n = _name(shared_name) or f"{ctx.node.location}"
    if n not in names:
        names.append(n)
    return np.asarray(names.index(n), np.int32)


def _key(ctx, handle) -> str:
    if not isinstance(handle, np.ndarray):
        raise ctx.error("the resource handle must come from a VAR_HANDLE (static)")
    return _names(ctx)[int(handle)]


@register("tflite", "READ_VARIABLE", foldable=False, int_passthrough=True)
def READ_VARIABLE(ctx, handle):
    """TFLite READ_VARIABLE: the variable's current value."""
    st = _state(ctx)
    k = _key(ctx, handle)
    if k not in st:
        raise ctx.error(f"variable {k!r} is read before it is assigned")
    return st[k]


@register("tflite", "ASSIGN_VARIABLE", foldable=False, int_passthrough=True)
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
