"""numpy reference twins of :mod:`fbjax.lower.stablehlo`, name for name.

Written from the StableHLO spec (https://openxla.org/stablehlo/spec), not
from the lowering: no jax, nothing from :mod:`fbjax.lower`. Slow and plain
(explicit windows, per-element gather loops, float64 accumulation).
"""

from . import control, conv, custom, elementwise, linalg, reduce, shape  # noqa: F401

OP_SET = "stablehlo"
