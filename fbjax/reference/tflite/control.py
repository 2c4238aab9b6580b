"""Control flow (numpy reference): WHILE, IF and CALL as plain Python loops
and branches over :meth:`ReferenceContext.call_graph`."""

from __future__ import annotations

import numpy as np

from ...op_rules import Region, n_in, n_out
from ..registry import register


@register("tflite", "WHILE",
          regions={"cond_subgraph_index": Region(lambda n: (n_in(n), 1)),
                    "body_subgraph_index": Region(lambda n: (n_in(n), n_in(n)))})
def WHILE(ctx, *xs, cond_subgraph_index=0, body_subgraph_index=0):
    """``while cond(*v): v = body(*v)``."""
    v = [np.asarray(x) for x in xs]
    while bool(np.asarray(ctx.call_graph(int(cond_subgraph_index), *v)[0]).reshape(-1)[0]):
        v = [np.asarray(o) for o in ctx.call_graph(int(body_subgraph_index), *v)]
    return v


@register("tflite", "IF",
          regions={"then_subgraph_index": Region(lambda n: (n_in(n) - 1, n_out(n))),
                    "else_subgraph_index": Region(lambda n: (n_in(n) - 1, n_out(n)))})
def IF(ctx, cond, *xs, then_subgraph_index=0, else_subgraph_index=0):
    """Run the branch the condition picks."""
    idx = then_subgraph_index if bool(np.asarray(cond).reshape(-1)[0]) else else_subgraph_index
    return ctx.call_graph(int(idx), *xs)


@register("tflite", "CALL",
          regions={"subgraph": Region(lambda n: (n_in(n), n_out(n)))})
def CALL(ctx, *xs, subgraph=0):
    """Run ``subgraph``."""
    return ctx.call_graph(int(subgraph), *xs)
