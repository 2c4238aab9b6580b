"""The JAX lowering registry: ``(op_set, op_name) -> lowering function``.

A lowering is ``fn(ctx, *inputs, **attrs)``: ``ctx`` is a
:class:`fbjax.lower.build.LowerContext` (the node, its input/output
:class:`~fbjax.ir.Value` specs, ``ctx.backend``, ``ctx.call_graph``); inputs
are jax arrays (or numpy arrays for ``static_inputs`` positions and for
load-time constants); attributes are keyword-only with the spec's defaults.
It returns one array or a sequence of arrays, one per node output.
"""

from .._registry import Registry

LOWERINGS = Registry("lowering")
register = LOWERINGS.register
