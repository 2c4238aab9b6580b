"""The example scripts the README names explain every option in ``--help``
(a new user runs them with small settings first, e.g. ``--steps 3``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.py"))


def test_there_are_examples():
    assert len(EXAMPLES) >= 5


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_option_has_a_help_text(path):
    missing = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument" and not any(k.arg == "help" for k in node.keywords)):
            missing.append(f"line {node.lineno}: {ast.unparse(node.args[0]) if node.args else '?'}")
    assert not missing, f"{path.name}: options without help=: {missing}"
