"""numpy twins of the ``"gpu_cl"`` op set (TFLite GPU delegate kernels), name for name with :mod:`fbjax.lower.gpu`."""

from . import ops  # noqa: F401

__all__ = ["ops"]
