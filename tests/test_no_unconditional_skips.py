"""Every test can fail: no new unconditional skips or xfails in tests/ (issue 36 item 6).

Reads every module under ``tests/`` (its AST, not by importing it) and
lists:

* a ``pytest.skip(...)`` call that runs whatever happens, i.e. with no
  ``if``, conditional expression, ``except`` handler, ``assert``, boolean
  operator or comprehension condition between it and its function (or the
  module), or one whose ``if`` only asks whether the test's name is in a
  module constant (``if stem in KNOWN: pytest.skip(...)``: the same ids
  skip on every run);
* every ``pytest.xfail(...)`` call: it ends the test where it stands, so
  unless the code ran and its failure was asserted first, a fix never shows
  (the ones that do run first are in :data:`ALLOWED`);
* a ``pytest.mark.skip`` mark (a skip without a condition) and a
  ``pytest.mark.skipif`` without a condition or with a constant one, where
  they are not built under such a condition;
* a ``pytest.mark.xfail`` that is not ``strict=True`` (a fix would pass
  unseen: a known gap is recorded as a strict xfail, so a fix shows as
  XPASS and fails until the mark goes; ``xfail_strict`` in pyproject makes
  the default strict too);
* ``from pytest import skip/xfail`` (which would hide the calls from this
  scan).

Each one found must be in :data:`ALLOWED` with its reason, or the test fails.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent

#: ``(file relative to tests/, enclosing function or "<module>", what)`` -> why it may stay
ALLOWED: dict = {
    ("test_tflite_quant.py", "_skip_if_no_oracle", "pytest.skip() for the names of a fixed list"):
        "fixtures LiteRT cannot run (no oracle): LiteRT's refusal is asserted first, so the entry fails "
        "once LiteRT runs the file",
    ("test_tflite_quant.py", "_require_supported", "pytest.xfail()"):
        "MODEL_UNSUPPORTED (empty today): fbjax's refusal is asserted first; a model that loads fails",
    ("test_tflite_quant.py", "test_op_exact", "pytest.xfail()"):
        "OP_UNSUPPORTED (empty today): the load's refusal is asserted first (pytest.raises)",
    ("test_tflite_quant.py", "test_op_reference_twin", "pytest.xfail()"):
        "OP_UNSUPPORTED (empty today): the load's refusal is asserted first (pytest.raises)",
    ("test_tflite_quant.py", "test_op_builtin_ref_agrees", "pytest.xfail()"):
        "REF_DIFFERS: the comparison runs and frac < 1 is asserted first; an equal result fails",
    ("test_tflite_quant.py", "test_aeq_exact", "pytest.xfail()"):
        "AEQ_EXACT_KNOWN: the comparison runs and frac < 1 is asserted first; an exact result fails",
}

_CONDITIONS = (ast.If, ast.IfExp, ast.ExceptHandler, ast.Assert, ast.BoolOp, ast.While, ast.Match)


def _is_pytest_attr(node, *names) -> bool:
    """``pytest.<names[0]>`` (``pytest.skip``) or ``pytest.mark.<name>`` for two names."""
    chain = []
    while isinstance(node, ast.Attribute):
        chain.append(node.attr)
        node = node.value
    return isinstance(node, ast.Name) and node.id == "pytest" and tuple(reversed(chain)) == names


def _parents(tree) -> dict:
    parent = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parent[child] = node
    return parent


def _context(node, parent) -> tuple[str, bool]:
    """``(enclosing function name or "<module>", whether a condition guards node)``."""
    conditional = False
    while node in parent:
        up = parent[node]
        if isinstance(up, _CONDITIONS):
            conditional = True
        if isinstance(up, ast.comprehension) and node in up.ifs:
            conditional = True
        if isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return getattr(up, "name", "<lambda>"), conditional
        node = up
    return "<module>", conditional


def _fixed_list_guard(node, parent) -> bool:
    """Whether the nearest ``if`` guarding ``node`` tests membership in a
    module constant (``if stem in ORACLE_FAILS:``): the same test ids skip on
    every run, whatever the code does."""
    while node in parent:
        up = parent[node]
        if isinstance(up, ast.If) and node in up.body:
            t = up.test
            return (isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], ast.In)
                    and isinstance(t.comparators[0], ast.Name) and t.comparators[0].id.isupper())
        if isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return False
        node = up
    return False


def _kw(call: ast.Call, name: str):
    return next((k.value for k in call.keywords if k.arg == name), None)


def findings(source: str, filename: str = "<test>") -> list:
    """``[(filename, function, what, line)]``: the unconditional skips and
    xfails of a test module's source (see the module docstring)."""
    tree = ast.parse(source)
    parent = _parents(tree)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "pytest":
            for alias in node.names:
                if alias.name in ("skip", "xfail"):
                    out.append((filename, "<module>", f"from pytest import {alias.name}", node.lineno))
        if isinstance(node, ast.Call) and _is_pytest_attr(node.func, "xfail"):
            # an imperative xfail ends the test there: unless the code ran (and its failure was
            # asserted) before it, a fix never shows; each one is listed in ALLOWED with why
            out.append((filename, _context(node, parent)[0], "pytest.xfail()", node.lineno))
            continue
        if isinstance(node, ast.Call) and _is_pytest_attr(node.func, "skip"):
            func, conditional = _context(node, parent)
            if not conditional:
                out.append((filename, func, "pytest.skip()", node.lineno))
            elif _fixed_list_guard(node, parent):
                out.append((filename, func, "pytest.skip() for the names of a fixed list", node.lineno))
            continue
        mark = node.func if isinstance(node, ast.Call) else node
        call = node if isinstance(node, ast.Call) else None
        if isinstance(node, ast.Attribute) and isinstance(parent.get(node), ast.Call) and parent[node].func is node:
            continue  # seen as the Call
        if _is_pytest_attr(mark, "mark", "skip"):
            func, conditional = _context(node, parent)
            if not conditional:
                out.append((filename, func, "pytest.mark.skip", node.lineno))
        elif _is_pytest_attr(mark, "mark", "skipif"):
            cond = call.args[0] if call is not None and call.args else (_kw(call, "condition") if call else None)
            if cond is None or (isinstance(cond, ast.Constant) and bool(cond.value)):
                out.append((filename, _context(node, parent)[0], "pytest.mark.skipif without a condition", node.lineno))
        elif _is_pytest_attr(mark, "mark", "xfail"):
            strict = _kw(call, "strict") if call is not None else None
            if not (isinstance(strict, ast.Constant) and strict.value is True):
                out.append((filename, _context(node, parent)[0], "pytest.mark.xfail without strict=True", node.lineno))
    return out


def test_no_unconditional_skip_or_xfail_in_tests():
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        rel = path.relative_to(TESTS)
        if rel.parts[0] == "data":
            continue
        found += findings(path.read_text(), str(rel))
    new = [f for f in found if f[:3] not in ALLOWED]
    listing = "\n".join(f"  {f}:{line} in {func}: {what}" for f, func, what, line in new)
    assert not new, ("unconditional skips/xfails in tests/ (make the test able to fail: assert the "
                     "condition, use a strict xfail mark for a known gap, or add it to ALLOWED with "
                     f"its reason):\n{listing}")
    stale = [k for k in ALLOWED if k not in {f[:3] for f in found}]
    assert not stale, f"ALLOWED entries that no longer match anything: {stale}"


def test_the_scan_finds_what_it_should():
    """The scan itself: each kind it must find is found; guarded ones are not."""
    src = '''
import pytest

def test_a():
    pytest.skip("always")

def test_b(x):
    if x:
        pytest.skip("sometimes")
    try:
        f()
    except TypeError:
        pytest.xfail("guarded")

def test_c():
    pytest.xfail("before running")

@pytest.mark.skip(reason="r")
def test_d(): pass

@pytest.mark.skipif(reason="no condition")
def test_e(): pass

@pytest.mark.skipif(True, reason="constant")
def test_f(): pass

@pytest.mark.skipif(X is None, reason="ok")
def test_g(): pass

@pytest.mark.xfail(reason="loose")
def test_h(): pass

@pytest.mark.xfail(reason="strict", strict=True)
def test_i(): pass

P = [pytest.param(n, marks=pytest.mark.xfail(reason="r", strict=True)) if n else n for n in range(3)]
Q = [pytest.param(None, marks=pytest.mark.skip(reason="r")) if not n else n for n in range(3)]

def test_j(stem):
    if stem in KNOWN:
        pytest.skip(KNOWN[stem])
'''
    got = {(func, what) for _, func, what, _ in findings(src)}
    assert got == {("test_a", "pytest.skip()"), ("test_b", "pytest.xfail()"), ("test_c", "pytest.xfail()"),
                   ("test_d", "pytest.mark.skip"), ("test_e", "pytest.mark.skipif without a condition"),
                   ("test_f", "pytest.mark.skipif without a condition"),
                   ("test_h", "pytest.mark.xfail without strict=True"),
                   ("test_j", "pytest.skip() for the names of a fixed list")}, got
    assert len([f for f in findings(src) if f[2] == "pytest.mark.skip"]) == 1  # test_d's; Q's is guarded
