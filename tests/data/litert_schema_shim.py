"""For the litert-torch generator scripts (``tests/data/*/generate.py``):
litert-torch imports ``tensorflow.lite.python.schema_py_generated`` without
depending on tensorflow; ai-edge-litert ships identical schema bindings.
:func:`install` registers them under that name (with empty ``tensorflow``
package stand-ins), so the generators run without TensorFlow. Import torch
and ``torch._dynamo`` first: dynamo probes which packages exist."""

from __future__ import annotations

import importlib.machinery
import sys
import types


def install() -> None:
    """Make ``tensorflow.lite.python.schema_py_generated`` resolve to
    ``ai_edge_litert.schema_py_generated`` (existing modules are kept)."""
    import ai_edge_litert.schema_py_generated as schema

    for name in ("tensorflow", "tensorflow.lite", "tensorflow.lite.python"):
        if name not in sys.modules:
            m = types.ModuleType(name)
            m.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
            m.__path__ = []
            sys.modules[name] = m
    sys.modules["tensorflow.lite.python.schema_py_generated"] = schema
    sys.modules["tensorflow.lite.python"].schema_py_generated = schema
