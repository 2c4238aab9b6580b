"""Wrong error paths a new user met on the command line (issue 35, items 1-6):
each is answered by fbjax's own message in one or two lines, with an exit
status of 1, never a traceback.

The files are committed fixtures, cut or named wrongly here; missing optional
packages are simulated with ``None`` entries in ``sys.modules`` (what Python
does for a package that is not installed: ``import`` raises ImportError).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import fbjax.data
from fbjax import bench
from fbjax.cli import main

DATA = Path(__file__).parent / "data"
LLAMA_TFLITE = DATA / "llm" / "llama_f32.tflite"
GEMMA_TASK = DATA / "llm_bundles" / "gemma_sp.task"
LLAMA_SP = DATA / "llm_bundles" / "llama_sp.litertlm"
LLAMA_CHAT = DATA / "llm_bundles" / "llama_hf_chat.litertlm"
VISION_TASK = DATA / "tasks" / "tiny_vision.task"
ROOT = Path(__file__).resolve().parents[1]
LLM_PACKAGES = ("sentencepiece", "tokenizers", "jinja2")


def run(capsys, *argv) -> tuple:
    """``fbjax ARGV`` in this process: (exit status, stdout, stderr), with a
    ``SystemExit(message)`` counted as Python counts it (status 1, the message on stderr)."""
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
        if not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    out, err = capsys.readouterr()
    return rc, out, err


def one_or_two_lines(text: str) -> str:
    lines = text.strip().splitlines()
    assert 1 <= len(lines) <= 2 and "Traceback" not in text, text
    return text


def test_chat_on_a_tflite_llm_says_what_it_is_and_what_runs_it(capsys):
    """Item 1: `fbjax chat llama_f32.tflite` ended in AttributeError ('Model' object has no attribute 'chat')."""
    rc, out, err = run(capsys, "chat", LLAMA_TFLITE)
    assert rc == 1 and not out
    one_or_two_lines(err)
    assert "is a .tflite LLM (prefill/decode signatures" in err and "not an LLM bundle" not in err
    assert f"fbjax generate {LLAMA_TFLITE} --prompt-tokens 1,2,3" in err
    assert ".litertlm or MediaPipe LLM .task bundle" in err


def test_chat_on_a_vision_model_points_to_run(capsys):
    rc, out, err = run(capsys, "chat", fbjax.data.DEFAULT_MODEL)
    assert rc == 1 and not out
    one_or_two_lines(err)
    assert "is a tflite model, not an LLM bundle" in err and f"fbjax run {fbjax.data.DEFAULT_MODEL}" in err


@pytest.mark.parametrize("argv", [["generate", "missing.litertlm", "--prompt", "hi"], ["chat", "missing.litertlm"],
                                  ["generate", "missing.tflite", "-p", "1,2"], ["inspect", "missing.task"]])
def test_a_missing_file_is_called_missing(tmp_path, capsys, argv):
    """Item 2: `fbjax generate missing.litertlm --prompt hi` said a .tflite takes token ids."""
    argv = [argv[0], str(tmp_path / argv[1]), *argv[2:]]
    rc, out, err = run(capsys, *argv)
    assert rc == 1
    assert one_or_two_lines(err).strip() == f"fbjax {argv[0]}: {argv[1]}: no such file"


def _member_end(full: bytes, name: str) -> int:
    """Where member ``name``'s data ends in the zip ``full`` (from zipfile's own reading of the whole file)."""
    with zipfile.ZipFile(io.BytesIO(full)) as z:
        info = z.getinfo(name)
    n, m = int.from_bytes(full[info.header_offset + 26:info.header_offset + 28], "little"), \
        int.from_bytes(full[info.header_offset + 28:info.header_offset + 30], "little")
    return info.header_offset + 30 + n + m + info.compress_size


@pytest.mark.parametrize("command", ["generate", "inspect", "run", "chat"])
def test_a_cut_off_task_is_named_as_one(tmp_path, capsys, command):
    """Item 3: `head -c 600000 gemma_sp.task`: generate gave the token-ids message, the others "not a model file
    ... supported formats: gpu_cl, rten, stablehlo, tflite" (no bundles, nothing about a cut-off zip)."""
    full = GEMMA_TASK.read_bytes()
    cut = tmp_path / "t.task"
    cut.write_bytes(full[:600000])
    need = _member_end(full, "TF_LITE_PREFILL_DECODE")
    assert need > 600000  # the model member is what the cut loses
    rc, out, err = run(capsys, command, cut, *(["--prompt", "hi"] if command == "generate" else []))
    assert rc == 1
    text = one_or_two_lines(out + err)
    assert "a MediaPipe LLM .task bundle (first member 'TF_LITE_PREFILL_DECODE') cut off at 600,000 bytes" in text
    assert f"needs bytes up to {need:,}" in text and "looks truncated" in text


def test_a_cut_off_vision_task_and_a_foreign_zip(tmp_path):
    """A vision .task cut before its central directory, and a complete zip of something else (the refusal lists
    the bundle formats among the supported ones)."""
    full = VISION_TASK.read_bytes()
    cut = tmp_path / "v.task"
    cut.write_bytes(full[:len(full) - 30])  # the end record (22 bytes) and part of the directory gone
    with pytest.raises(fbjax.ModelFormatError, match=r"a MediaPipe Tasks \.task bundle .* cut off .* looks truncated"):
        fbjax.load(cut)
    other = tmp_path / "notes.zip"
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("readme.txt", "hello")
    with pytest.raises(fbjax.ModelFormatError, match="complete zip archive .*readme.txt.* no bundle fbjax opens") as e:
        fbjax.load(other)
    assert "the bundles .litertlm, MediaPipe LLM .task and MediaPipe Tasks vision .task" in str(e.value)


def test_a_cut_off_tflite_says_it_looks_truncated(tmp_path, capsys):
    """Item 6: `head -c 50000 FILE.tflite` said an offset points past the end, not that the file looks truncated."""
    full = LLAMA_TFLITE.read_bytes()
    cut = tmp_path / "t.tflite"
    cut.write_bytes(full[:50000])
    rc, out, err = run(capsys, "run", cut)
    assert rc == 1
    one_or_two_lines(err)
    assert "the file looks truncated (it has 50,000 bytes; its offsets need at least " in err
    need = int(err.split("need at least ")[1].split(":")[0].replace(",", ""))
    assert 50000 < need <= len(full)  # what the cut file's own offsets reach: inside the whole file


@pytest.fixture
def no_llm_packages(monkeypatch):
    for name in LLM_PACKAGES:
        monkeypatch.setitem(sys.modules, name, None)


def test_bundle_commands_without_the_llm_extra_print_one_line():
    """Item 4: a plain `pip install .` (no fbjax[llm]) and a bundle command printed a 25-line traceback: now one
    line with the install hint and status 1 (a fresh interpreter, the packages made unimportable)."""
    code = (f"import sys\nfor m in {LLM_PACKAGES!r}: sys.modules[m] = None\n"
            "from fbjax.cli import main\nsys.exit(main(sys.argv[1:]))")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", code, "generate", str(GEMMA_TASK), "--prompt", "hi"],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert p.returncode == 1 and not p.stdout
    assert one_or_two_lines(p.stderr).strip() == ("fbjax generate: reading a sentencepiece tokenizer needs the "
                                                  "'sentencepiece' package: pip install 'fbjax[llm]'")


def test_inspect_lists_a_bundles_sections_without_the_llm_extra(capsys, no_llm_packages):
    rc, out, err = run(capsys, "inspect", LLAMA_SP)
    assert rc == 0 and "Traceback" not in err
    assert "[0] TFLiteModel" in out and "[1] SP_Tokenizer" in out
    assert "tokenizer:  sentencepiece (not read: " in out and "pip install 'fbjax[llm]'" in out
    assert "  prefill_16: (" in out and "  decode: (" in out


def test_chat_without_jinja2_names_the_extra(capsys, monkeypatch):
    """A bundle with a Jinja chat template, jinja2 missing: the first turn says which extra to install."""
    monkeypatch.setitem(sys.modules, "jinja2", None)
    monkeypatch.setattr("builtins.input", lambda prompt="": "hi")
    rc, out, err = run(capsys, "chat", LLAMA_CHAT)
    assert rc == 1
    assert one_or_two_lines(err).strip() == ("fbjax chat: this needs the 'jinja2' package, which is not installed: "
                                             "pip install 'fbjax[llm]'")


def test_bench_without_litert_refuses_before_running(capsys, monkeypatch):
    """Item 5: `fbjax bench` without LiteRT put the error, cut off, into a table cell."""
    monkeypatch.setitem(sys.modules, "ai_edge_litert", None)
    monkeypatch.setitem(sys.modules, "ai_edge_litert.interpreter", None)
    rc, out, err = run(capsys, "bench", fbjax.data.DEFAULT_MODEL, "--runs", "1", "--batch", "0", "--no-first-call")
    assert rc == 1 and "|" not in out  # refused before any benchmark: no table
    one_or_two_lines(err)
    assert "compares fbjax with LiteRT, which is not installed" in err and "pip install ai-edge-litert" in err


def test_bench_table_gives_a_long_error_in_full():
    """The table cell keeps 120 characters of an error; the whole text follows the table."""
    error = "ModelFormatError: " + "x" * 200 + " the end"
    table = bench.markdown_table([{"model": "m", "source": "m.tflite", "error": error}], bench.summary([]))
    row = next(line for line in table.splitlines() if line.startswith("| m |"))
    assert "the end" not in row
    assert f"m: {error}" in table.splitlines()


def _chat(capsys, monkeypatch, lines, *options) -> list:
    monkeypatch.setattr("sys.stdin", io.StringIO("".join(line + "\n" for line in lines) + "\n"))
    assert main(["chat", str(LLAMA_CHAT), *options]) == 0
    return [line for line in capsys.readouterr().out.splitlines() if "(" in line and "positions" in line]


def test_chat_says_once_how_much_room_is_left_and_what_to_do(capsys, monkeypatch):
    """LLM CLI item 9: the README's chat spent all 64 positions on the first reply and every later turn was
    refused alike. A reply length that leaves room (-n 8) gets three short turns; when the cache is full that
    is said once, with what to do, and each later refusal is one short line."""
    notes = _chat(capsys, monkeypatch, ["Hi!", "Who are you?", "Why?", "ok", "fine"], "-n", "8")
    assert len(notes) == 3, notes  # the note after the third reply filled the cache, then the two refused turns
    assert notes[0].startswith("(the KV cache is full: this conversation holds all 64 positions. /reset starts")
    assert "-n N` caps each reply at N tokens" in notes[0] and "shorter message" not in notes[0]
    assert notes[1:] == ["> (does not fit either: 0 positions left; /reset starts over)"] * 2
    notes = _chat(capsys, monkeypatch, ["Hi!", "Who are you?"])  # no cap: the first reply leaves a few positions
    assert len(notes) == 1 and "positions with the conversation so far; the KV cache holds 64; " in notes[0], notes
    left = int(notes[0].split("holds 64; ")[1].split(" of its positions are left")[0])
    assert 0 < left < 64 and "a shorter message may still fit" in notes[0]
