"""Registration helper for the issue-3 family modules.

:func:`builtin` registers a ``"tflite"`` reference op unless an earlier family
module (imported first by :mod:`fbjax.reference`) already registered the
same op: several engineers add ops concurrently, and the first, older
lowering wins instead of an import-time ``ValueError``.
"""

from __future__ import annotations

from ..registry import REFERENCE as LOWERINGS, register


def builtin(name: str, **kw):
    """``register("tflite", name, **kw)`` that skips already-registered ops."""

    def deco(fn):
        if ("tflite", name) in LOWERINGS:
            return fn
        return register("tflite", name, **kw)(fn)

    return deco
