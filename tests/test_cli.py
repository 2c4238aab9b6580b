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

litert = pytest.importorskip("ai_edge_litert.interpreter", reason="ai-edge-litert (the oracle) is not installed")

MODEL = Path(__file__).parent / "data" / "quant" / "models" / "ssd_head_uint8.tflite"


def test_inspect_quantized_model(capsys):
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
