"""One block's weight buffer inside a layer scan's body, as the stacked array and the block index.

:meth:`fbjax.lower.build.Program._eval_scan` binds each per-block weight buffer
of the body to a :class:`LayerSlice`. Lowerings that list the operand in their
``layer_slices`` fact (the hybrid FULLY_CONNECTED) receive it as it is and hand
the stacked array and the index to fbjax's CPU kernels, which read the block in
place (:mod:`fbjax.lower.cpu_kernels`); every other lowering receives
:meth:`LayerSlice.materialize`, the block as an array (XLA copies it out of the
stack on each step of the scan).
"""

from __future__ import annotations

from jax import lax

__all__ = ["LayerSlice", "materialize"]


class LayerSlice:
    """Block ``index`` of ``stacked`` (``[blocks, ...]``), not yet read.

    Attributes:
        stacked: the ``[blocks, ...]`` array (a jit argument or tracer).
        index: int32 scalar (the scan's block counter).
    """

    def __init__(self, stacked, index):
        self.stacked = stacked
        self.index = index

    @property
    def shape(self) -> tuple:
        """The block's shape (``stacked.shape[1:]``)."""
        return tuple(self.stacked.shape[1:])

    @property
    def ndim(self) -> int:
        return len(self.stacked.shape) - 1

    @property
    def dtype(self):
        return self.stacked.dtype

    def materialize(self):
        """The block as an array (``stacked[index]``)."""
        return lax.dynamic_index_in_dim(self.stacked, self.index, keepdims=False)

    def astype(self, dtype):
        """The block as an array of ``dtype`` (a reduced ``compute_dtype`` casts a lowering's operands)."""
        return self.materialize().astype(dtype)


def materialize(x):
    """``x``, or the block a :class:`LayerSlice` stands for."""
    return x.materialize() if isinstance(x, LayerSlice) else x
