"""How the StableHLO readers (:mod:`fbjax.formats.stablehlo`, and TFLite's
``STABLEHLO_*`` builtins through :mod:`fbjax.formats.tflite_stablehlo`)
hand integer-vector attributes to the op sets: numpy int64 vectors, an
absent optional vector as an empty one, ``padding`` flattened as ``[lo0,
hi0, lo1, hi1, ...]``. The JAX lowering (:mod:`fbjax.lower.stablehlo`) and
the numpy reference (:mod:`fbjax.reference.stablehlo`) both read them with
these two helpers (numpy only). :data:`MLIR_ELEMENT_TYPES` maps MLIR's
element type names to numpy dtypes, for the MLIR writer
(:mod:`fbjax.formats.stablehlo_mlir`) and the tests' MLIR-to-TFLite writer."""

from __future__ import annotations

import numpy as np

__all__ = ["MLIR_ELEMENT_TYPES", "ints", "pairs"]

#: MLIR element type name -> numpy dtype (``bf16`` when ml_dtypes is present: JAX depends on it)
MLIR_ELEMENT_TYPES = {
    "f16": np.float16, "f32": np.float32, "f64": np.float64, "i1": np.bool_, "i8": np.int8, "i16": np.int16,
    "i32": np.int32, "i64": np.int64, "ui8": np.uint8, "ui16": np.uint16, "ui32": np.uint32, "ui64": np.uint64,
    "complex<f32>": np.complex64, "complex<f64>": np.complex128,
}
try:
    import ml_dtypes

    MLIR_ELEMENT_TYPES["bf16"] = ml_dtypes.bfloat16
except ImportError:  # pragma: no cover - installed with jax
    pass


def ints(v) -> tuple:
    """A static integer vector attribute (None -> empty) as a tuple of ints."""
    if v is None:
        return ()
    return tuple(int(x) for x in np.asarray(v).reshape(-1))


def pairs(padding, rank: int) -> list:
    """Flattened ``[lo0, hi0, lo1, hi1, ...]`` -> ``[(lo0, hi0), ...]``; empty -> ``rank`` zero pairs."""
    p = ints(padding)
    if not p:
        return [(0, 0)] * rank
    return [(p[2 * i], p[2 * i + 1]) for i in range(len(p) // 2)]
