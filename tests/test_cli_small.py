"""Issue 35's small things on the command line: `fbjax export` says what it
wrote and how to run it, `fbjax convert` summarises rten-convert's output
(all of it behind --verbose), `fbjax generate --verbose` shows where the
time goes, the palm detector's decoding line names palm anchors.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

import fbjax
import fbjax.data
from fbjax.cli import main
from fbjax.convert import summarize_log
from conftest import TFLITE_MODELS, require

DATA = Path(__file__).parent / "data"


def test_export_prints_a_snippet_that_runs(tmp_path, capsys):
    """The printed line runs as Python (with the input named as printed) and gives fbjax's own output."""
    out = tmp_path / "m.jax"
    assert main(["export", fbjax.data.DEFAULT_MODEL, "--to", "stablehlo", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"wrote {out} (stablehlo, " in text and f"wrote {tmp_path / 'm.params.npz'} (the params argument" in text
    snippet = text.split("run it without fbjax: ")[1].split("  (differentiable")[0]
    model = fbjax.load(fbjax.data.DEFAULT_MODEL)
    x = np.random.default_rng(0).random(model.inputs[0].shape, dtype=np.float32)
    scope = {model.inputs[0].name: x}
    exec(snippet, scope)
    got = scope["outputs"]
    got = got[0] if isinstance(got, (list, tuple)) else got
    want = np.asarray(model(x))
    # the artifact runs under XLA's default compile options, fbjax's calls under its own (other fusion, other
    # float32 rounding): a few float32 ulps at the output's scale (a probability map, at most 1)
    assert np.abs(np.asarray(got) - want).max() <= 4 * np.finfo(np.float32).eps * max(np.abs(want).max(), 1.0)
    assert main(["export", fbjax.data.DEFAULT_MODEL, "--to", "mlir", str(tmp_path / "m.mlir")]) == 0
    text = capsys.readouterr().out
    assert "(mlir, " in text and "`--to stablehlo` writes the runnable jax.export artifact" in text


def test_summarize_log_says_each_message_once():
    """rten-convert's three kinds of output (util.warn_once's 'WARNING: ', the converter's 'Error converting
    operator', a traceback) become one line each, counted."""
    log = "\n".join([
        "WARNING: Converting float16 weights to float32 because float16 is not supported natively yet.",
        "WARNING: WARNING: Unsupported attribute bogus for operator Relu",
        "WARNING: WARNING: Unsupported attribute bogus for operator Relu",
        'Error converting operator "n1": Unsupported operator "Hardmax"',
        "Traceback (most recent call last):",
        '  File "<string>", line 1, in <module>',
        "    graph = graph_from_onnx_graph(model.graph)",
        "rten_convert.errors.ConversionError: Errors occurred when converting 1 operators",
    ])
    assert summarize_log(log) == [
        "warning: Converting float16 weights to float32 because float16 is not supported natively yet.",
        "warning: Unsupported attribute bogus for operator Relu (x2)",
        "not converted: Unsupported operator \"Hardmax\" (node 'n1')",
        "rten-convert stopped: Errors occurred when converting 1 operators (ConversionError)",
    ]


def _onnx_models(tmp_path) -> tuple:
    onnx = require("onnx")
    require("rten_convert")
    from onnx import TensorProto as TP, helper as H, numpy_helper as nh

    x = [H.make_tensor_value_info("x", TP.FLOAT, [1, 4])]
    y = [H.make_tensor_value_info("out", TP.FLOAT, [1, 4])]
    nodes = [H.make_node("Cast", ["x"], ["xh"], to=TP.FLOAT16), H.make_node("Add", ["xh", "w"], ["y"]),
             H.make_node("Cast", ["y"], ["out"], to=TP.FLOAT)]
    warn = tmp_path / "warn.onnx"  # float16 weights: rten-convert widens them, with a warning
    onnx.save(H.make_model(H.make_graph(nodes, "g", x, y, [nh.from_array(np.ones((1, 4), np.float16), "w")]),
                           opset_imports=[H.make_opsetid("", 13)]), warn)
    fail = tmp_path / "fail.onnx"  # an operator RTen lacks: rten-convert fails with a traceback
    onnx.save(H.make_model(H.make_graph([H.make_node("Hardmax", ["x"], ["out"])], "g", x, y),
                           opset_imports=[H.make_opsetid("", 13)]), fail)
    return warn, fail


def test_convert_summarises_rten_converts_output(tmp_path, capsys):
    warn, fail = _onnx_models(tmp_path)
    assert main(["convert", str(warn), str(tmp_path / "w.rten")]) == 0
    out, err = capsys.readouterr()
    assert "rten-convert said (" in err and "  warning: Converting float16 weights to float32" in err
    assert "WARNING" not in err and "wrote " in out
    assert main(["convert", str(warn), str(tmp_path / "w.rten"), "--verbose"]) == 0
    assert "WARNING: Converting float16 weights" in capsys.readouterr().err  # the full text, as rten-convert said it
    assert main(["convert", str(fail), str(tmp_path / "f.rten")]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 2, err
    assert 'rten-convert failed (exit 1): not converted: Unsupported operator "Hardmax"' in err
    assert "rten-convert stopped: " in err and "--verbose prints rten-convert's full output" in err
    assert main(["convert", str(fail), str(tmp_path / "f.rten"), "-v"]) == 1
    assert "Traceback (most recent call last)" in capsys.readouterr().err


def test_generate_verbose_shows_where_the_time_goes(capsys):
    assert main(["generate", str(DATA / "llm_bundles" / "llama_sp.litertlm"), "--prompt", "hi", "-n", "4", "-v"]) == 0
    err = capsys.readouterr().err
    m = re.search(r"\[start-up \(Python, import jax and fbjax\): ([\d.]+) s; load \(read the bundle, its "
                  r"tokenizer, trace the model\): ([\d.]+) s\]", err)
    assert m, err
    assert re.search(r"\[4 pieces in [\d.]+ s; first after [\d.]+ s \(compile included\)\]", err), err
    total = float(re.search(r"\[total since the process started: ([\d.]+) s\]", err).group(1))
    assert total >= float(m.group(1)) + float(m.group(2)) > 0


def test_palm_detector_names_palm_anchors(capsys):
    """The palm detector shares its anchor layout with the short-range face detector: its decoding line
    named both; now the graph of its own size and anchor count."""
    import PIL  # noqa: F401  (--image needs Pillow: fbjax[image], in the test extra)
    palm = TFLITE_MODELS / "mediapipe_palm_detection_lite.tflite"
    assert palm.is_file(), f"{palm} is missing (../shared)"
    assert main(["run", str(palm), "--image", str(DATA / "images" / "person.jpg"), "--mean", "127.5", "--std",
                 "127.5", "--repeat", "0"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "decoded with" in x)
    assert "MediaPipe palm_detection's SSD anchors (strides 8, 16, 16, 16" in line and "face" not in line, line
