"""What :func:`fbjax.load` was asked for, as one frozen value.

:class:`LoadOptions` is validated once, at construction; it is what the load
pipeline (:mod:`fbjax.pipeline`) reads, the key of the CPU trace cache, and
how a model is loaded again with another batch (the chunked large-batch
path), so no option is threaded by hand.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Union

import numpy as np

from .errors import InputError
from .ir import MAX_VALUE_BYTES

__all__ = ["LoadOptions", "FILE_BATCH", "QUANTIZED_MODES", "COMPUTE_DTYPES", "COMPOSITE_MODES"]

#: ``batch_size`` value meaning "the shapes stored in the file".
FILE_BATCH = "file"
#: ``quantized`` values (see :mod:`fbjax.quantization`).
QUANTIZED_MODES = ("exact", "float")
#: ``compute_dtype`` values (see :func:`fbjax.load`).
COMPUTE_DTYPES = ("float32", "bfloat16", "float16")
#: ``composites`` values (see :func:`fbjax.load` and :mod:`fbjax.lower.composites`).
COMPOSITE_MODES = ("litert", "fused", "decomposed")


@dataclass(frozen=True)
class LoadOptions:
    """The options of :func:`fbjax.load` (see there for their meaning).

    Attributes:
        format: ``"tflite"``, ``"rten"``, ``"stablehlo"`` or None (detected).
        batch_size: ``"file"``, None (any batch; ``"dynamic"`` is stored as
            None) or a positive int.
        quantized: ``"exact"`` or ``"float"``.
        while_max_iterations: None or an int >= 0.
        static_bounds: ops whose output size depends on computed values
            return outputs padded to a bound plus a valid count
            (:func:`fbjax.passes.add_valid_counts`).
        compute_dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"`` (a
            numpy/JAX dtype is stored as its name).
        composites: ``"litert"``, ``"fused"`` or ``"decomposed"``: which
            ``stablehlo.composite`` ops run as fbjax's own lowering of the
            composite instead of their decomposition.
        max_value_bytes: the byte budget of one value the model computes
            (:data:`fbjax.ir.MAX_VALUE_BYTES`, 4 GiB, by default); a
            check, not a change of the computed program.

    Raises:
        InputError: ``while_max_iterations`` is not None or an int >= 0,
            ``quantized`` is not a known mode, ``batch_size`` is not
            ``"file"``, None/``"dynamic"`` or a positive int, or
            ``compute_dtype`` is not one of :data:`COMPUTE_DTYPES`, or
            ``composites`` not one of :data:`COMPOSITE_MODES`, or
            ``max_value_bytes`` is not a positive int.
    """

    format: Optional[str] = None
    batch_size: Union[int, None, str] = FILE_BATCH
    quantized: str = "exact"
    while_max_iterations: Optional[int] = None
    static_bounds: bool = False
    compute_dtype: str = "float32"
    composites: str = "litert"
    max_value_bytes: int = MAX_VALUE_BYTES

    def __post_init__(self):
        w = self.while_max_iterations
        if w is not None and (isinstance(w, bool) or not isinstance(w, (int, np.integer)) or w < 0):
            raise InputError(f"while_max_iterations must be None or an int >= 0, got {w!r}")
        b = self.batch_size
        if isinstance(b, str) and b == "dynamic":
            object.__setattr__(self, "batch_size", None)
        elif not (b is None or (isinstance(b, str) and b == FILE_BATCH)) and (
                not isinstance(b, (int, np.integer)) or b < 1):
            raise InputError(f"batch_size must be None (or 'dynamic'), a positive int or 'file', got {b!r}")
        if self.quantized not in QUANTIZED_MODES:
            raise InputError(f"quantized must be one of {QUANTIZED_MODES}, got {self.quantized!r}")
        try:
            cd = np.dtype(self.compute_dtype).name
        except TypeError:
            cd = None
        if cd not in COMPUTE_DTYPES:
            raise InputError(f"compute_dtype must be one of {list(COMPUTE_DTYPES)}, got {self.compute_dtype!r}")
        object.__setattr__(self, "compute_dtype", cd)
        if self.composites not in COMPOSITE_MODES:
            raise InputError(f"composites must be one of {list(COMPOSITE_MODES)}, got {self.composites!r}")
        m = self.max_value_bytes
        if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1:
            raise InputError(f"max_value_bytes must be a positive int, got {m!r}")
        object.__setattr__(self, "max_value_bytes", int(m))

    @property
    def rewrites_batch(self) -> bool:
        """Whether the batch rewrite (:func:`fbjax.passes.set_batch_size`) runs."""
        return not (isinstance(self.batch_size, str) and self.batch_size == FILE_BATCH)

    def lowering(self) -> dict:
        """The lowering options (``ctx.options`` of the lowerings)."""
        return {"while_max_iterations": self.while_max_iterations,
                "compute_dtype": None if self.compute_dtype == "float32" else self.compute_dtype,
                "composites": self.composites,
                "max_value_bytes": self.max_value_bytes}

    def replace(self, **changes) -> "LoadOptions":
        """A copy with ``changes`` (validated again)."""
        return dataclasses.replace(self, **changes)

    def as_kwargs(self) -> dict:
        """The keyword arguments of :func:`fbjax.load` that give these options."""
        return dataclasses.asdict(self)
