"""Lowerings of the ``"onnx"`` op set (RTen models: ONNX operator semantics).

One function per op, named as ONNX spells it, grouped by family; every
module registers its ops in :data:`fbjax.lower.LOWERINGS` when imported
here (explicit list, nothing discovered by side effect). Attribute names and
defaults are the RTen schema's (see :mod:`fbjax.formats.rten`).
"""

from . import (  # noqa: F401
    control,
    conv,
    elementwise,
    gather,
    misc,
    norm,
    pool,
    quant,
    random,
    reduce,
    resize,
    rnn,
    shape,
)

__all__ = ["control", "conv", "elementwise", "gather", "misc", "norm", "pool", "quant", "random",
           "reduce", "resize", "rnn", "shape"]
