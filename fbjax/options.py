"""What :func:`fbjax.load` was asked for, as one frozen value.

:class:`LoadOptions` is validated once, at construction; it is what the load
pipeline (:mod:`fbjax.pipeline`) reads, the key of the CPU trace cache, and
how a model is loaded again with another batch (the chunked large-batch
path), so no option is threaded by hand.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Optional, Union

import numpy as np

from .errors import InputError

__all__ = ["LoadOptions", "FILE_BATCH", "QUANTIZED_MODES", "COMPUTE_DTYPES", "ENV", "ENV_FLAGS", "env_flag"]

#: fbjax's on/off environment variables: ``{name: (default, what it does)}``
#: (README "Environment variables" has the same table). Each is read once,
#: at import, into :data:`ENV` by :func:`env_flag`'s one rule.
ENV_FLAGS = {
    "FBJAX_TIERED_COMPILE": (False, "default of ``fbjax.load(tiered_compile=...)``: on CPU a quickly compiled "
                                    "first tier (faster cold first call, not bit-reproducible before "
                                    "``Model.wait_optimised()``)"),
}

_FALSE = ("", "0", "false", "no", "off")


def env_flag(name: str, default: bool = False, environ=None) -> bool:
    """The one rule fbjax reads its on/off environment variables with:
    unset -> ``default``; ``""``, ``0``, ``false``, ``no``, ``off`` (any case,
    surrounding blanks ignored) -> False; any other value -> True.
    ``environ``: default ``os.environ``."""
    v = (os.environ if environ is None else environ).get(name)
    if v is None:
        return default
    return v.strip().lower() not in _FALSE


#: :data:`ENV_FLAGS` as read at import (``{name: bool}``).
ENV = {name: env_flag(name, default) for name, (default, _) in ENV_FLAGS.items()}

#: ``batch_size`` value meaning "the shapes stored in the file".
FILE_BATCH = "file"
#: ``quantized`` values (see :mod:`fbjax.quantization`).
QUANTIZED_MODES = ("exact", "float")
#: ``compute_dtype`` values (see :func:`fbjax.load`).
COMPUTE_DTYPES = ("float32", "bfloat16", "float16")


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
        tiered_compile: on CPU, compile a quick program for the first call
            and swap the optimised one in when a background thread has
            compiled it (:mod:`fbjax.run.tiered`). It trades bit
            reproducibility for a faster cold first call: the quick
            program is lowered and compiled differently (``-O0`` alone
            changes float results), so calls before
            :meth:`fbjax.Model.wait_optimised` may differ from later ones
            and from another process's in the last bits (measured up to
            1.2e-4 relative on mediapipe_selfie_segmentation). Default
            False: every call runs the optimised program, the same bits
            whatever ran before and whatever the cache held. ``None`` is
            stored as the ``FBJAX_TIERED_COMPILE`` environment default
            (:data:`ENV`).

    Raises:
        InputError: ``while_max_iterations`` is not None or an int >= 0,
            ``quantized`` is not a known mode, ``batch_size`` is not
            ``"file"``, None/``"dynamic"`` or a positive int, or
            ``compute_dtype`` is not one of :data:`COMPUTE_DTYPES`.
    """

    format: Optional[str] = None
    batch_size: Union[int, None, str] = FILE_BATCH
    quantized: str = "exact"
    while_max_iterations: Optional[int] = None
    static_bounds: bool = False
    compute_dtype: str = "float32"
    tiered_compile: Optional[bool] = None

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
        t = self.tiered_compile
        if t is None:
            object.__setattr__(self, "tiered_compile", ENV["FBJAX_TIERED_COMPILE"])
        elif not isinstance(t, (bool, np.bool_)):
            raise InputError(f"tiered_compile must be True, False or None (the environment's default), got {t!r}")
        else:
            object.__setattr__(self, "tiered_compile", bool(t))

    @property
    def rewrites_batch(self) -> bool:
        """Whether the batch rewrite (:func:`fbjax.passes.set_batch_size`) runs."""
        return not (isinstance(self.batch_size, str) and self.batch_size == FILE_BATCH)

    def lowering(self) -> dict:
        """The lowering options (``ctx.options`` of the lowerings)."""
        return {"while_max_iterations": self.while_max_iterations,
                "compute_dtype": None if self.compute_dtype == "float32" else self.compute_dtype}

    def replace(self, **changes) -> "LoadOptions":
        """A copy with ``changes`` (validated again)."""
        return dataclasses.replace(self, **changes)

    def as_kwargs(self) -> dict:
        """The keyword arguments of :func:`fbjax.load` that give these options."""
        return dataclasses.asdict(self)
