"""The converter-made one-op TFLite fixtures of ``tests/data/tflite_builtins``
(a helper module: ``tests/test_tflite_builtins.py`` checks them against
LiteRT, ``tests/test_tflite_control.py`` and ``tests/test_grads.py`` reuse
them): :data:`DATA`, :data:`MANIFEST` (``manifest.json``: per case the
builtin under test, every op code in the file, the input specs and the
tolerance) and :func:`case_inputs`, the seeded inputs of a case."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np

DATA = Path(__file__).parent / "data" / "tflite_builtins"
if not (DATA / "manifest.json").is_file():  # committed: a missing manifest fails, it does not empty the suite
    raise FileNotFoundError(f"committed fixture manifest {DATA / 'manifest.json'} is missing "
                            "(tests/data/tflite_builtins/generate.py writes it)")
MANIFEST = json.loads((DATA / "manifest.json").read_text())


def make_input(shape, dtype, kind, rng):
    """Deterministic test input of one ``(shape, dtype, kind)`` spec."""
    shape = tuple(shape)
    if kind == "normal":
        x = rng.standard_normal(shape)
    elif kind == "pos":
        x = rng.uniform(0.5, 2.0, shape)
    elif kind == "uniform":
        x = rng.uniform(0.0, 1.0, shape)
    elif kind == "nonzero":
        x = rng.choice([-1, 1], shape) * rng.uniform(0.5, 2.0, shape)
    elif kind == "halves":  # exact .5 ties for ROUND
        x = np.round(rng.standard_normal(shape) * 4) / 2
    elif kind == "int":
        x = rng.integers(-8, 9, shape)
    elif kind == "nonzero_int":
        x = rng.choice([-1, 1], shape) * rng.integers(1, 6, shape)
    elif kind == "smallpos":
        x = rng.integers(0, 4, shape)
    elif kind == "bool":
        x = rng.integers(0, 2, shape).astype(bool)
    elif kind.startswith("idx"):
        x = rng.integers(0, int(kind[3:]), shape)
    elif kind.startswith("perm"):
        x = rng.permutation(int(kind[4:]))[:int(np.prod(shape))].reshape(shape)
    elif kind.startswith("winidx"):  # uint32 window index in float32 bits (MediaPipe/XNNPACK argmax)
        return rng.integers(0, int(kind[6:]), shape).astype(np.uint32).view(np.float32)
    elif kind == "boxes":  # [y1, x1, y2, x2], overlapping on purpose
        lo = rng.uniform(0, 0.6, shape[:-1] + (2,))
        x = np.concatenate([lo, lo + rng.uniform(0.2, 0.5, shape[:-1] + (2,))], -1)
    else:
        raise ValueError(f"unknown input kind {kind!r}")
    return np.asarray(x).astype(dtype)


def case_inputs(name):
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    return [make_input(s, d, k, rng) for s, d, k in MANIFEST[name]["inputs"]]


def _as_list(out):
    return [np.asarray(o) for o in (out if isinstance(out, (list, tuple)) else [out])]
