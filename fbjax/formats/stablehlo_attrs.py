"""How the StableHLO readers (:mod:`fbjax.formats.stablehlo`, and TFLite's
``STABLEHLO_*`` builtins through :mod:`fbjax.formats.tflite_stablehlo`)
hand integer-vector attributes to the op sets: numpy int64 vectors, an
absent optional vector as an empty one, ``padding`` flattened as ``[lo0,
hi0, lo1, hi1, ...]``. The JAX lowering (:mod:`fbjax.lower.stablehlo`) and
the numpy reference (:mod:`fbjax.reference.stablehlo`) both read them with
these two helpers (numpy only)."""

from __future__ import annotations

import numpy as np

__all__ = ["ints", "pairs"]


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
