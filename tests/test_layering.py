"""The package's layers point one way (developers' guide, issue 16).

Every module of ``fbjax`` is read with :mod:`ast` (nothing is imported) and
each import is resolved to the fbjax module it names. Layers, lowest first:

0. ``ir``, ``errors``, ``options``, ``_registry``, ``quantmath``, ``_farmhash``,
   ``formats`` (readers and writers): know nothing of JAX lowering;
1. passes: ``passes`` (its ``shapes``, ``quantization`` and ``reading`` rewrites), ``op_rules`` (the
   helpers the ops' facts are written with) (IR rewrites; they learn about ops from the registry they are
   handed, not by importing the lowering);
2. ``lower`` (the op sets, the graph builder, kernels) and ``reference``
   (the numpy twins; separately checked never to import ``lower``);
3. the load pipeline: ``loading`` (it hands the lowering registry to the
   passes, so it sits above ``lower``; every module of ``passes`` is below
   it), ``cache``, ``custom``;
4. the executors: ``executors`` (how a Model runs when called, with ``executors.planner``,
   the CPU program's planner);
5. ``model`` (with ``signature``, its entry points' runner), and the entry
   points above it: ``infer``, ``generate``, ``llm_bundle``, ``export``,
   ``train``, ``flax``, ``bench``, ``beam``, ``precision``, ``vision``,
   ``convert``, ``cli``, ``finetune``, ``serving`` (the HTTP server and its batching engine), the
   package root.

Every module must be in the table: a new module that matches no entry is an
error (the package root's entry matches ``fbjax/__init__.py`` only, not its
submodules).

A module may import from its own layer or below. A module-level import from
a higher layer is an error. A function-local import from a higher layer is
an error unless listed in :data:`ALLOWED_UPWARD` with its reason (an import
cycle dodged inside a function is still a cycle).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "fbjax"

#: (layer, module-name prefixes), the first matching (longest) prefix wins.
LAYERS = {
    "fbjax.ir": 0, "fbjax.errors": 0, "fbjax.options": 0, "fbjax._registry": 0, "fbjax.quantmath": 0, "fbjax._farmhash": 0,
    "fbjax.formats": 0, "fbjax.data": 0,
    "fbjax.passes": 1, "fbjax.op_rules": 1,
    "fbjax.lower": 2, "fbjax.reference": 2,
    "fbjax.loading": 3, "fbjax.cache": 3, "fbjax.custom": 3,
    "fbjax.executors": 4,
    "fbjax.model": 5, "fbjax.signature": 5, "fbjax.batch_inference": 5, "fbjax.generation": 5, "fbjax.llm_bundle": 5, "fbjax.llm_contract": 5,
    "fbjax.finetune": 5, "fbjax.serving": 5,
    "fbjax.export": 5, "fbjax.train": 5, "fbjax.flax": 5, "fbjax.bench": 5, "fbjax.beam": 5, "fbjax.precision": 5,
    "fbjax.vision": 5, "fbjax.convert": 5, "fbjax.cli": 5, "fbjax.cli_llm": 5,
    "fbjax.__main__": 5, "fbjax": 5,
}

#: entries of :data:`LAYERS` that name one module only, not its submodules
EXACT = frozenset({"fbjax"})

#: (importing module, imported module) -> why the function-local upward import stays.
ALLOWED_UPWARD: dict = {}


def _layer(mod: str) -> int:
    best = max((p for p in LAYERS if mod == p or (p not in EXACT and mod.startswith(p + "."))), key=len,
               default=None)
    if best is None:
        raise AssertionError(f"module {mod} is in no layer: add it to tests/test_layering.py LAYERS")
    return LAYERS[best]


def _modules():
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG.parent).with_suffix("")
        parts = list(rel.parts)
        if "_generated" in parts:
            continue
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        yield ".".join(parts), is_pkg, path


def _imports(mod: str, is_pkg: bool, path: Path):
    """``(imported fbjax module, line, function-local)`` for each import."""
    tree = ast.parse(path.read_text(), str(path))
    package = mod if is_pkg else mod.rpartition(".")[0]
    local: set = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            local.update(id(n) for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom)))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                root = ".".join(base + ([node.module] if node.module else []))
            else:
                root = node.module or ""
            # `from . import x` names a submodule; `from .m import f` names module m
            targets = [f"{root}.{a.name}" if _is_module(f"{root}.{a.name}") else root for a in node.names]
        else:
            continue
        for t in dict.fromkeys(targets):  # `from m import a, b`: one import of m
            if t == "fbjax" or t.startswith("fbjax."):
                yield t, node.lineno, id(node) in local


def _is_module(name: str) -> bool:
    p = PKG.parent.joinpath(*name.split("."))
    return p.with_suffix(".py").exists() or (p / "__init__.py").exists()


def _violations():
    out = []
    for mod, is_pkg, path in _modules():
        lo = _layer(mod)
        for target, line, local in _imports(mod, is_pkg, path):
            if _layer(target) > lo and not (local and (mod, target) in ALLOWED_UPWARD):
                kind = "function-local" if local else "module-level"
                out.append(f"{mod}:{line} imports {target} ({kind}, layer {lo} -> {_layer(target)})")
    return out


def test_no_import_points_up():
    bad = _violations()
    assert not bad, "imports from a higher layer:\n" + "\n".join(bad)


def test_allow_list_is_current():
    """Every allowed upward import still exists (remove entries once fixed)."""
    seen = {(mod, t) for mod, is_pkg, path in _modules() for t, _, local in _imports(mod, is_pkg, path) if local}
    stale = sorted(set(ALLOWED_UPWARD) - seen)
    assert not stale, f"stale ALLOWED_UPWARD entries: {stale}"


def test_reference_never_imports_the_lowering():
    bad = [f"{mod}:{line} imports {t}" for mod, is_pkg, path in _modules() if mod.startswith("fbjax.reference")
           for t, line, _ in _imports(mod, is_pkg, path) if t.startswith("fbjax.lower")]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("mod,layer", [("fbjax.loading", 3), ("fbjax.passes.shapes", 1),
                                       ("fbjax.executors.planner", 4), ("fbjax.lower.tflite.conv", 2),
                                       ("fbjax.formats.tflite_writer", 0), ("fbjax.formats.tflite_builder", 0), ("fbjax.executors.chunked", 4),
                                       ("fbjax.op_rules", 1), ("fbjax.passes.reading", 1), ("fbjax", 5)])
def test_layer_table(mod, layer):
    assert _layer(mod) == layer


def test_a_module_in_no_layer_is_an_error():
    """The package root's entry does not catch its submodules: a module the
    table does not name fails :func:`test_no_import_points_up`."""
    with pytest.raises(AssertionError, match="is in no layer"):
        _layer("fbjax.some_new_module")
    with pytest.raises(AssertionError, match="is in no layer"):
        _layer("numpy")
    assert {m for m, _, _ in _modules()} >= {"fbjax", "fbjax.signature", "fbjax.executors.tiered"}
    for mod, _, _ in _modules():  # every module of the package is placed
        _layer(mod)


def test_passes_is_one_layer_below_the_lowering():
    """Issue 36: every module of ``fbjax.passes`` is in the passes' layer (the
    load sequence that hands them the lowering registry is ``fbjax.loading``,
    above ``lower``), so no entry of the table singles one out."""
    mods = [m for m, _, _ in _modules() if m == "fbjax.passes" or m.startswith("fbjax.passes.")]
    assert len(mods) >= 4 and {_layer(m) for m in mods} == {1}, {m: _layer(m) for m in mods}
    assert not [k for k in LAYERS if k.startswith("fbjax.passes.")]


def test_the_lowering_imports_no_pass():
    """Issue 36 item 4: the lowering takes completed IR only (``build``
    refuses a reader's IR), so no module of ``fbjax.lower`` imports
    ``fbjax.passes`` (``lower/build.py`` imported ``passes.reading`` to
    complete the IR itself, the one import that ran back up the load
    sequence); the numpy reference imports only the read step."""
    lower = [f"{mod}:{line} imports {t}" for mod, is_pkg, path in _modules() if mod.startswith("fbjax.lower")
             for t, line, _ in _imports(mod, is_pkg, path) if t == "fbjax.passes" or t.startswith("fbjax.passes.")]
    assert not lower, "\n".join(lower)
    ref = {t for mod, is_pkg, path in _modules() if mod.startswith("fbjax.reference")
           for t, _, _ in _imports(mod, is_pkg, path) if t == "fbjax.passes" or t.startswith("fbjax.passes.")}
    assert ref == {"fbjax.passes.reading"}, ref


@functools.cache
def _calls_of(name: str) -> list:
    """``(module, innermost enclosing function or None)`` of every call of a
    function called ``name`` in the package (``name(...)`` or
    ``something.name(...)``)."""
    out = []

    class Calls(ast.NodeVisitor):
        def __init__(self, mod):
            self.mod, self.fn = mod, [None]

        def visit_FunctionDef(self, node):
            self.fn.append(node.name)
            self.generic_visit(node)
            self.fn.pop()

        visit_AsyncFunctionDef = visit_FunctionDef

        def visit_Call(self, node):
            f = node.func
            if (isinstance(f, ast.Name) and f.id == name) or (isinstance(f, ast.Attribute) and f.attr == name):
                out.append((self.mod, self.fn[-1]))
            self.generic_visit(node)

    for mod, _, path in _modules():
        Calls(mod).visit(ast.parse(path.read_text(), str(path)))
    return out


def test_reading_complete_is_called_from_one_place():
    """Issue 36 item 4: one read step. ``fbjax.passes.reading.complete`` is
    called by ``fbjax.passes.reading.read`` only, which ``fbjax.loading.read``
    (load, inspect, precision) and the numpy reference call; nothing imports
    ``complete`` by name to call it elsewhere."""
    assert _calls_of("complete") == [("fbjax.passes.reading", "read")]
    by_name = [mod for mod, is_pkg, path in _modules() for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.ImportFrom) and any(a.name == "complete" for a in node.names)]
    assert not by_name, by_name
    readers = sorted({mod for mod, fn in _calls_of("read") if mod in ("fbjax.loading", "fbjax.reference")})
    assert readers == ["fbjax.loading", "fbjax.reference"]


def test_the_call_finder_sees_calls():
    """:func:`_calls_of` finds a call it must (so the one-place test can fail)."""
    assert ("fbjax.loading", "read") in _calls_of("read")
    assert ("fbjax.lower.build", "build") in _calls_of("check_supported")
