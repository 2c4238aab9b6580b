"""Attribute defaults: the lowering and its numpy twin agree (issue 36 item 2).

An op's attributes arrive as keyword-only arguments, and an attribute the
file leaves out takes the default written in the function's signature. The
lowering (:mod:`fbjax.lower`) and its twin (:mod:`fbjax.reference`) each
write those defaults, and the twin imports nothing from the lowering, so the
two copies are checked equal here for every op registered in both
registries (every op set: TFLite, its integer/hybrid kernels, fake
quantization, ONNX, StableHLO, GPU, composites). ``tests/test_parity.py``
and ``tests/test_onnx_conformance.py`` check the attribute *names*; this
checks the *values*, which drifted apart before (DEPTH_TO_SPACE's
``block_size``: 0 in the lowering, 2 in the twin; DEPTHWISE_CONV_2D's
``depth_multiplier``: 0 and None). Each default follows the op's spec
(TFLite schema field defaults, the ONNX operator's attribute default).
"""

from __future__ import annotations

import inspect

import numpy as np

import fbjax.reference
import fbjax.reference.onnx  # noqa: F401  (registers the twin's "onnx" op set)
from fbjax.lower import LOWERINGS
from fbjax.lower.composites import COMPOSITES as LOWER_COMPOSITES
from fbjax.reference.composites import COMPOSITES as REFERENCE_COMPOSITES
from fbjax.reference.registry import REFERENCE


def _registered(*registries) -> dict:
    return {od.key: od for r in registries for od in r}


# fbjax's own registrations, taken at import (collection), before any test registers a custom op of its own
_LOWER = _registered(LOWERINGS, LOWER_COMPOSITES)
_TWIN = _registered(REFERENCE, REFERENCE_COMPOSITES)


def _keyword_defaults(fn) -> dict:
    """``{name: default}`` of ``fn``'s keyword-only parameters (``inspect.Parameter.empty``: required)."""
    return {p.name: p.default for p in inspect.signature(fn).parameters.values() if p.kind is p.KEYWORD_ONLY}


def _same(a, b) -> bool:
    """Equal value and type (``0`` and ``0.0``, ``0`` and ``False``, ``None`` and ``0`` differ)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b))
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def test_registries_walked():
    """The walk below covers every op set both sides register (a registry that stopped filling fails)."""
    both = _LOWER.keys() & _TWIN.keys()
    op_sets = {s for s, _ in both}
    assert {"tflite", "tflite.custom", "tflite.int", "tflite.hybrid", "fbjax", "onnx", "stablehlo",
            "stablehlo.custom_call", "gpu_cl", "composite"} <= op_sets, sorted(op_sets)
    assert len(both) >= 400, len(both)


def test_attribute_defaults_equal():
    """For every op registered in both registries, each keyword-only attribute
    has the same default (value and type) in the lowering and in the twin, and
    the same names (a name only one side has is listed too)."""
    diffs = {}
    for key in sorted(_LOWER.keys() & _TWIN.keys()):
        low, twin = _keyword_defaults(_LOWER[key].fn), _keyword_defaults(_TWIN[key].fn)
        bad = {name: (low.get(name, "<absent>"), twin.get(name, "<absent>"))
               for name in sorted(low.keys() | twin.keys())
               if name not in low or name not in twin or not _same(low[name], twin[name])}
        if bad:
            diffs[f"{key[0]}:{key[1]}"] = bad
    assert not diffs, (f"{len(diffs)} op(s) whose attribute defaults differ, {{attribute: (lowering, twin)}}; "
                       f"fix both to the spec's default: {diffs}")


def test_same_catches_what_it_should():
    """The comparison itself: equal values pass; a changed value, a changed type, None for 0 fail."""
    assert _same(0, 0) and _same("SAME", "SAME") and _same(None, None) and _same((1, 2), (1, 2))
    assert _same(inspect.Parameter.empty, inspect.Parameter.empty)
    assert not _same(0, 2) and not _same(0, None) and not _same(0, 0.0) and not _same(0, False)
    assert not _same((1, 2), (1, 3)) and not _same(1.0, float("nan"))
