"""``fbjax convert model.onnx model.rten`` (issue 28 item 4): ONNX's defaults
stated before rten-convert, the result equal to onnxruntime, a refusal where
the meaning would change, and the constant-softmax warning printed once."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import fbjax
from fbjax.cli import main
from fbjax.convert import ConversionRefused, convert

from rten_convert_tools import convert as rten_convert_in_process


def _classifier(opset: int, shape=(1, 4), n=5) -> onnx.ModelProto:
    """MatMul to ``n`` logits, then a Softmax that leaves ``axis`` out (ONNX's default applies)."""
    w = numpy_helper.from_array(np.linspace(-1, 1, shape[-1] * n, dtype=np.float32).reshape(shape[-1], n), "W")
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["logits"]), helper.make_node("Softmax", ["logits"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape[:-1]) + [n])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(m)
    return m


def test_convert_matches_onnxruntime(tmp_path, capsys):
    src = tmp_path / "clf.onnx"
    onnx.save(_classifier(13), src)
    assert main(["convert", str(src), str(tmp_path / "clf.rten")]) == 0
    out = capsys.readouterr().out
    assert "stated ONNX default: Softmax y: axis=-1 (opset 13 default)" in out
    x = np.random.default_rng(0).standard_normal((1, 4)).astype(np.float32)
    want = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = np.asarray(fbjax.load(tmp_path / "clf.rten")(x))
    # a 4-term dot product and a 5-way softmax in float32: a few ulps of each output (values ~0.2)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert not np.allclose(got, 1.0)  # what the unstated file computes


def test_default_output_name_and_nothing_to_state(tmp_path, capsys):
    m = _classifier(13)
    m.graph.node[1].attribute.append(helper.make_attribute("axis", -1))
    src = tmp_path / "stated.onnx"
    onnx.save(m, src)
    report = convert(src)
    assert report.out == str(tmp_path / "stated.rten") and report.stated == [] and report.left == []


def test_refuses_a_changed_meaning(tmp_path, capsys):
    """opset 11: Softmax coerces its [1, 2, 3, 5] input to 2-D [1, 30]; a single axis cannot say that."""
    src = tmp_path / "old.onnx"
    onnx.save(_classifier(11, shape=(1, 2, 3, 4)), src)
    dst = tmp_path / "old.rten"
    with pytest.raises(ConversionRefused, match="--allow-changed-meaning"):
        convert(src, dst)
    assert not dst.exists()
    assert main(["convert", str(src), str(dst)]) == 1
    assert "flattens several axes" in capsys.readouterr().err and not dst.exists()
    assert main(["convert", str(src), str(dst), "--allow-changed-meaning"]) == 0
    assert "meaning changed" in capsys.readouterr().err and dst.exists()


def test_missing_and_bad_files(tmp_path, capsys):
    assert main(["convert", str(tmp_path / "none.onnx")]) == 1
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "junk.onnx").write_bytes(b"\x01\x02not protobuf at all")
    assert main(["convert", str(tmp_path / "junk.onnx")]) == 1
    assert "junk.onnx" in capsys.readouterr().err


def test_constant_softmax_warning_printed_once(tmp_path, capsys):
    """The trap of issue 28: rten-convert alone writes axis 0; fbjax warns, once per command."""
    path = tmp_path / "raw.rten"
    path.write_bytes(rten_convert_in_process(_classifier(13)))
    for argv in (["inspect", str(path)], ["run", str(path), "--repeat", "0"]):
        # a subprocess: the CLI's own printing, not pytest's warning capture
        proc = subprocess.run([sys.executable, "-m", "fbjax", *argv], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr.count("normalize over an axis of size 1") == 1, proc.stderr
        assert "fbjax convert model.onnx model.rten" in proc.stderr
