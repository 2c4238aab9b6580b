"""``fbjax inspect`` on quantized TFLite models: input/output scale and zero
point as LiteRT reports them, integer weights counted, and support judged
after the default ``quantized="exact"`` rewrite (a QUANTIZE node is not
"unsupported" just because the plain ``tflite`` op set has no integer
lowering)."""

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
