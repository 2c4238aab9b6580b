"""The README's code runs (issue 15 item 3).

* every ```python block runs as written, in a fresh interpreter, in an empty
  folder (so it cannot lean on ``../shared`` or files left by another test);
* every ```sh block's commands parse: ``fbjax ...`` lines through the CLI's own
  argument parser (a renamed option fails here), ``pip install '.[X]'``
  names an extra pyproject.toml defines, and every other command is one a
  user has after the Quick start (python3, pip, pytest, nox, fbjax).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def blocks(lang: str) -> list[tuple[int, str]]:
    """``(line number, code)`` of each fenced block of ``lang``."""
    out = []
    for m in re.finditer(rf"^```{lang}\n(.*?)^```", README, re.S | re.M):
        out.append((README.count("\n", 0, m.start()) + 1, m.group(1)))
    return out


PY = blocks("python")
SH = blocks("sh")


def test_readme_has_code_blocks():
    assert len(PY) >= 2 and len(SH) >= 3


@pytest.mark.parametrize("code", [c for _, c in PY], ids=[f"line{n}" for n, _ in PY])
def test_python_block_runs(code, tmp_path):
    # the folder stands for the clone's root: the blocks may read the committed tests/data
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "data").symlink_to(ROOT / "tests" / "data")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, f"README block failed:\n{code}\n--- stderr ---\n{proc.stderr[-4000:]}"


def test_python_blocks_do_not_find_the_clone_through_the_package():
    """`pip install .` (the Quick start) puts fbjax in site-packages, where
    ``fbjax.__file__`` has no ``../tests`` beside it: a block that finds a
    fixture that way fails for that user (and passes in an editable install)."""
    for n, code in PY:
        assert "__file__" not in code, f"README line {n}: a block locates files through __file__"


def _commands(code: str) -> list[list[str]]:
    cmds = []
    for line in code.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        for part in line.split("&&"):
            cmds.append(shlex.split(part.strip()))
    return cmds


SH_COMMANDS = [(n, c) for n, code in SH for c in _commands(code)]


@pytest.mark.parametrize("argv", [c for _, c in SH_COMMANDS],
                         ids=[f"line{n}-{' '.join(c[:2])}" for n, c in SH_COMMANDS])
def test_sh_command_parses(argv):
    prog = argv[0]
    if prog == "fbjax":
        from fbjax.cli import build_parser

        try:
            args = build_parser().parse_args(argv[1:])
        except SystemExit as e:  # argparse: unknown option, missing argument...
            pytest.fail(f"`{' '.join(argv)}` does not parse (exit {e.code})")
        assert args.command == argv[1]
    elif prog == "pip":
        assert argv[1] == "install"
        extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
        for spec in argv[2:]:
            m = re.fullmatch(r"\.(?:\[(\w+)\])?", spec)
            if m and m.group(1):
                assert m.group(1) in extras, f"pip install {spec}: no extra {m.group(1)!r} in pyproject.toml"
    elif prog == "python3":
        assert argv[1:3] == ["-m", "venv"], argv
    elif prog == ".":
        assert argv[1].endswith("bin/activate"), argv
    elif prog == "pytest":
        assert set(argv[1:]) <= {"-q"}, argv
    elif prog == "nox":
        sessions = re.findall(r"^def (\w+)\(session", (ROOT / "noxfile.py").read_text(), re.M)
        assert argv[1] == "-s" and argv[2] in sessions, (argv, sessions)
    elif prog == "curl":  # the Serving section's requests to `fbjax serve` (run by tests/test_serve.py)
        assert any(a.startswith("http://127.0.0.1:8000/v1/") for a in argv), argv
    else:
        pytest.fail(f"README runs {prog!r}, which the Quick start does not provide")
