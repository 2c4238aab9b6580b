"""The ``fbjax`` CLI on quantized TFLite models.

``fbjax inspect``: input/output scale and zero point as LiteRT reports them,
integer weights counted, and support judged after the default
``quantized="exact"`` rewrite (a QUANTIZE node is not "unsupported" just
because the plain ``tflite`` op set has no integer lowering).
``fbjax run --quantized float``: the float mode from the command line."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from fbjax.cli import main
from conftest import require
from helpers import relu_model as _relu_model

MODEL = Path(__file__).parent / "data" / "quant" / "models" / "ssd_head_uint8.tflite"


def test_inspect_quantized_model(capsys):
    litert = require("ai_edge_litert.interpreter", "the oracle")  # in the test extra: missing fails
    assert main(["inspect", str(MODEL)]) == 0
    out = capsys.readouterr().out
    it = litert.Interpreter(model_path=str(MODEL))
    for d in it.get_input_details() + it.get_output_details():
        s, z = d["quantization"]
        line = next(ln for ln in out.splitlines() if ln.strip().startswith(d["name"] + ":"))
        m = re.search(r"scale ([0-9.e+-]+), zero point (-?\d+)", line)
        assert m, line
        assert np.isclose(float(m.group(1)), s, rtol=1e-5) and int(m.group(2)) == z, line
    assert "QUANTIZE" in out and "<- unsupported" not in out
    assert "unsupported: none" in out
    m = re.search(r"quantized weights: ([\d,]+) values", out)
    assert m and int(m.group(1).replace(",", "")) > 0


def test_cli_run_quantized_float_and_dynamic_batch_alias(tmp_path, capsys):
    """``fbjax run --quantized float`` runs the float mode (float32 real
    inputs/outputs) and writes what ``fbjax.load(..., quantized="float")``
    computes; ``batch_size="dynamic"`` (the export CLI's spelling) equals
    ``batch_size=None``."""
    import fbjax

    x = np.random.default_rng(2).random((1, 32, 32, 3), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(MODEL), "--quantized", "float", "-i", str(tmp_path / "x.npy"), "--repeat", "0",
                 "-o", str(tmp_path / "o.npz")]) == 0
    want = fbjax.load(MODEL, quantized="float")(x)
    with np.load(tmp_path / "o.npz") as o:
        assert [o[k].dtype for k in o.files] == [np.float32, np.float32]
        for k, w in zip(o.files, want):
            np.testing.assert_array_equal(o[k], np.asarray(w))
    assert fbjax.load(MODEL, batch_size="dynamic").inputs[0].shape[0] is None


# --- argument checks and messages (fbjax run / export) -------------------------

def _usage_error(capsys, argv) -> str:
    """main(argv) must exit with argparse's status 2; returns its stderr."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # refused before anything is printed
    return captured.err


def test_cli_run_output_without_npz_suffix_reports_the_file_written(tmp_path, capsys):
    """np.savez appends .npz to a name without it; the message names that file."""
    model = _relu_model(tmp_path)
    x = np.array([[-1.0, 0.5, -2.0, 3.0]], np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(model), "-i", f"x={tmp_path / 'x.npy'}", "--repeat", "0",
                 "--output", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert f"wrote {tmp_path / 'out.npz'} (out)" in out, out
    with np.load(tmp_path / "out.npz") as z:
        np.testing.assert_array_equal(z["out"], np.maximum(x, 0))  # RELU, exact


def test_cli_run_output_folder_checked_before_loading(tmp_path, capsys):
    with pytest.raises(SystemExit, match="output folder .*nodir does not exist"):
        main(["run", str(tmp_path / "not_a_model.tflite"), "--output", str(tmp_path / "nodir" / "o.npz")])


def test_cli_run_repeat_must_not_be_negative(tmp_path, capsys):
    err = _usage_error(capsys, ["run", str(_relu_model(tmp_path)), "--repeat", "-5"])
    assert "usage: fbjax run" in err and "--repeat: expected an int >= 0, got '-5'" in err
    # 0 keeps its documented meaning (no timed runs)
    assert main(["run", str(_relu_model(tmp_path)), "--repeat", "0"]) == 0
    assert "steady-state" not in capsys.readouterr().out


def test_cli_run_accepts_inputs_alias_and_errors_show_runs_usage(tmp_path, capsys):
    """``--inputs`` (fbjax infer's spelling) is an alias of ``--input``; an
    unknown option is reported with ``fbjax run``'s usage line."""
    model = _relu_model(tmp_path)
    x = np.array([[1.0, -1.0, 2.0, -2.0]], np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(model), "--inputs", str(tmp_path / "x.npy"), "--repeat", "0",
                 "-o", str(tmp_path / "o.npz")]) == 0
    assert "(file)" in capsys.readouterr().out
    with np.load(tmp_path / "o.npz") as z:
        np.testing.assert_array_equal(z["out"], np.maximum(x, 0))
    err = _usage_error(capsys, ["run", str(model), "--bogus", "1"])
    assert "usage: fbjax run" in err and "unrecognized arguments: --bogus 1" in err
    # a directory is infer's input, not run's: say so instead of a traceback
    (tmp_path / "d").mkdir()
    with pytest.raises(SystemExit, match="is a directory.*fbjax infer"):
        main(["run", str(model), "--inputs", str(tmp_path / "d"), "--repeat", "0"])


def test_cli_export_batch_size_message_uses_cli_spelling(tmp_path, capsys):
    model = str(_relu_model(tmp_path))
    for bad in ("0", "-2", "many"):
        err = _usage_error(capsys, ["export", model, "--to", "mlir", str(tmp_path / "m.mlir"), "--batch-size", bad])
        assert "usage: fbjax export" in err
        assert f"--batch-size: expected a positive int, 'dynamic' or 'file', got '{bad}'" in err, err
    assert not (tmp_path / "m.mlir").exists()
    assert main(["export", model, "--to", "mlir", str(tmp_path / "m.mlir"), "--batch-size", "3"]) == 0
    assert "tensor<3x4xf32>" in (tmp_path / "m.mlir").read_text()


def test_run_default_model_shows_its_job_on_a_drawn_person(capsys):
    """Issue 15: ``fbjax run`` on the bundled model printed an all-zero mask
    of random noise with nothing saying so. On the drawn figure of
    fbjax.data.synthetic_person the person mask must match the figure
    (intersection over union well above chance: the figure is 32 % of the
    image) and the output must be explained."""
    assert main(["run", "--repeat", "0"]) == 0
    out = capsys.readouterr().out
    assert "fbjax.data.synthetic_person()" in out and "random" not in out
    m = re.search(r"probability that each pixel shows a person: > 0.5 on ([0-9.]+)% of the image; "
                  r"intersection over union with the drawn figure \(which covers ([0-9.]+)%\): ([0-9.]+)", out)
    assert m, out
    assert float(m.group(3)) > 0.9, out


def test_run_with_random_inputs_says_so(tmp_path, capsys):
    assert main(["run", str(_relu_model(tmp_path)), "--repeat", "0"]) == 0
    assert "random inputs show that the model runs and how fast, not what it computes" in capsys.readouterr().out


def test_help_texts_say_what_the_options_mean(capsys):
    """infer: one example per file without the batch dimension, under
    --input-dir (--inputs still accepted); run: --input is one full input;
    export --to has a help text that tells its formats apart."""
    for cmd in ("infer", "run", "export"):
        with pytest.raises(SystemExit):
            main([cmd, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "each file is ONE example WITHOUT the batch dimension" in out
    assert "--input-dir DIR, --inputs DIR" in out
    assert "with the model's full shape (batch included" in out
    assert "'mlir': the same program as StableHLO MLIR text" in out
    assert "Neither is the stablehlo.flatbuf file format fbjax reads" in out


def test_run_input_without_batch_dimension_says_so(tmp_path, capsys):
    """A (4,) array for a (1, 4) input: the error says the batch dimension is missing."""
    np.save(tmp_path / "x.npy", np.ones(4, np.float32))
    assert main(["run", str(_relu_model(tmp_path)), "--input", f"x={tmp_path / 'x.npy'}", "--repeat", "0"]) == 1
    err = capsys.readouterr().err
    assert "has shape (4,)" in err and "the batch dimension is missing" in err


LLAMA = Path(__file__).parent / "data" / "llm" / "llama_f32.tflite"


def test_run_nan_outputs_on_random_integer_inputs_name_them(tmp_path, capsys, monkeypatch):
    """Random integer inputs that are not quantized values are drawn small and
    non-negative (indices): the decode signature's outputs are finite. Where
    random integers still give NaN (here forced: drawn up to 1000, outside a
    256-token vocabulary and a 64-slot cache), `fbjax run` says which random
    integer inputs may be the cause; with in-range inputs from a file (token
    5 at position 0, empty cache) there is no such line."""
    import fbjax.cli
    import fbjax.signature

    assert main(["run", str(LLAMA), "--signature", "decode", "--repeat", "0"]) == 0
    out = capsys.readouterr().out
    assert "random integers in [0, 8)" in out and "nan" not in out and "may be out of range" not in out
    monkeypatch.setattr(fbjax.cli, "_RANDOM_INDEX_BOUND", 1000)
    # a concrete input_pos past the KV cache is refused (issue 26 item 7) ...
    assert main(["run", str(LLAMA), "--signature", "decode", "--repeat", "0"]) == 1
    assert "input_pos runs from" in capsys.readouterr().err
    # ... and where that check does not apply (a cache fbjax cannot measure), the NaN hint names the inputs
    monkeypatch.setattr(fbjax.signature.SignatureRunner, "_check_positions", lambda self, vals: None)
    assert main(["run", str(LLAMA), "--signature", "decode", "--repeat", "0"]) == 0
    out = capsys.readouterr().out
    nan_lines = [ln for ln in out.splitlines() if "min nan" in ln]
    assert nan_lines, out  # the premise: random indices give NaN somewhere
    assert "the random integer inputs (input_pos, tokens) may be out of range" in out
    ins = {"tokens": np.array([[5]], np.int32), "input_pos": np.array([0], np.int32)}
    ins.update({f"kv_cache_{a}_{i}": np.zeros((1, 64, 2, 32), np.float32) for a in "kv" for i in (0, 1)})
    np.savez(tmp_path / "ins.npz", **ins)
    assert main(["run", str(LLAMA), "--signature", "decode", "--input", str(tmp_path / "ins.npz"),
                 "--repeat", "0"]) == 0
    out = capsys.readouterr().out
    assert "nan" not in out and "NaN in" not in out


def test_output_into_a_closed_pipe_is_no_traceback(tmp_path):
    """`fbjax inspect M | head`: the reader closing the pipe early ends the
    command quietly (exit 1), not with a BrokenPipeError traceback."""
    import subprocess
    import sys

    code = f"import sys; from fbjax.cli import main; sys.exit(main(['inspect', {str(_relu_model(tmp_path))!r}]))"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p.stdout.close()  # before the child (still importing jax) writes anything
    err = p.stderr.read()
    assert p.wait(timeout=300) == 1
    assert "Traceback" not in err and "Exception ignored" not in err, err


def test_generate_on_a_model_without_signatures_says_what_it_needs(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["generate", str(_relu_model(tmp_path)), "--prompt-tokens", "1,2"])
    msg = str(e.value.code)
    assert msg.startswith("fbjax generate: the model has no signatures"), msg
    assert "prefill_N and decode signatures" in msg


def test_inspect_without_model_inspects_the_bundled_one_and_names_the_run_command(capsys):
    from fbjax.data import DEFAULT_MODEL

    assert main(["inspect"]) == 0
    out = capsys.readouterr().out
    assert "no model given: inspecting the bundled default model" in out
    assert f"fbjax can run this model: `fbjax run {DEFAULT_MODEL}`" in out


def test_inspect_code_on_a_tflite_file_is_refused(tmp_path, capsys):
    assert main(["inspect", str(_relu_model(tmp_path)), "--code", "0"]) == 2
    assert "--code reads TFLite GPU delegate .bin files" in capsys.readouterr().err


def test_run_input_names_are_checked_before_anything_runs(tmp_path, capsys):
    """An unknown NAME, or no NAME for a two-input model, is refused naming the
    inputs, before any input line is printed."""
    from fbjax.formats.tflite_builder import TFLiteBuilder

    b = TFLiteBuilder()
    a, c = b.add_input((1, 4), name="a"), b.add_input((1, 4), name="c")
    y = b.add_tensor((1, 4), name="out")
    b.add_op("ADD", [a, c], [y])
    b.add_output(y)
    path = tmp_path / "add.tflite"
    path.write_bytes(b.build())
    np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
    for given, want in ((f"foo={tmp_path / 'x.npy'}", "no model input named foo; inputs are: a, c"),
                        (str(tmp_path / "x.npy"), "without NAME= is for one-input models; this one has 2")):
        with pytest.raises(SystemExit) as e:
            main(["run", str(path), "--input", given, "--repeat", "0"])
        assert want in str(e.value.code)
        assert "input  " not in capsys.readouterr().out


def test_generate_refuses_token_ids_outside_the_vocabulary():
    """The llama fixture's vocabulary is 256 (VOCAB in tests/data/llm/generate.py):
    ids 256 and -5 are refused by name (they ran silently before)."""
    import fbjax

    model = fbjax.load(LLAMA)
    for bad in (256, -5):
        with pytest.raises(fbjax.InputError, match=rf"prompt 1 has token ids \[{bad}\] outside 0..255"):
            fbjax.generate(model, [[1, 2], [3, bad]], 2)
    assert fbjax.generate(model, [1, 255], 2).shape == (2,)
