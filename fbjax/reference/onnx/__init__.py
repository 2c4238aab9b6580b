"""numpy reference twins of the ``"onnx"`` op set (RTen models), name for name
with :mod:`fbjax.lower.onnx`; numpy only (no jax, nothing from fbjax.lower)."""

from . import conv, control, elementwise, gather, misc, norm, pool, quant, reduce, resize, rnn, shape  # noqa: F401

__all__ = ["conv", "control", "elementwise", "gather", "misc", "norm", "pool", "quant", "reduce", "resize",
           "rnn", "shape"]
