"""Resource variables (numpy reference): one :func:`fbjax.reference.run`
is one first call of the model: CALL_ONCE runs the initialiser, variables
live in the run's own dict (``ctx.run``, :class:`fbjax.reference.ReferenceRun`),
not on the model."""

from __future__ import annotations

import numpy as np

from ...op_rules import Region
from ..registry import register


def _state(ctx) -> dict:
    return ctx.run.state


@register("tflite", "CALL_ONCE",
          regions={"init_subgraph_index": Region(lambda n: (0, None))})
def CALL_ONCE(ctx, *, init_subgraph_index=0):
    """Reset the variables and run the initialiser (each run is a first call)."""
    ctx.run.state.clear()
    ctx.call_graph(int(init_subgraph_index))
    return []


@register("tflite", "VAR_HANDLE")
def VAR_HANDLE(ctx, *, container="", shared_name=""):
    """Handle: index of ``shared_name`` in the model's variable list."""
    n = shared_name.decode() if isinstance(shared_name, bytes) else str(shared_name)
    names = ctx.run.var_names
    if n not in names:
        names.append(n)
    return np.asarray(names.index(n), np.int32)


def _key(ctx, handle):
    return ctx.run.var_names[int(handle)]


@register("tflite", "READ_VARIABLE")
def READ_VARIABLE(ctx, handle):
    """Current value."""
    st = _state(ctx)
    k = _key(ctx, handle)
    if k not in st:
        raise ctx.error(f"variable {k!r} is read before it is assigned")
    return st[k]


@register("tflite", "ASSIGN_VARIABLE")
def ASSIGN_VARIABLE(ctx, handle, value):
    """Set the value."""
    _state(ctx)[_key(ctx, handle)] = np.array(value, copy=True)
    return []
