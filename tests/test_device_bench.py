"""CPU smoke run of ``benchmarks/device.py`` (issue 19 item 3), so the
prepared accelerator script never reaches a device broken."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONV = ROOT / "tests" / "data" / "tflite_builtins" / "conv_2d.tflite"


def _device_module():
    spec = importlib.util.spec_from_file_location("fbjax_device_bench", ROOT / "benchmarks" / "device.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_device_script_smoke_run_writes_json_and_table(tmp_path):
    dev = _device_module()
    rc = dev.main(["--smoke", "--no-llm", "--models", str(CONV), "--out", str(tmp_path)])
    data = json.loads((tmp_path / "device.json").read_text())
    recs = [r for r in data["records"] if r["model"] == "conv_2d.tflite"]
    assert rc == 0, [r.get("error") for r in data["records"]]
    assert sorted(r["dtype"] for r in recs) == ["bfloat16", "float32"]
    for r in recs:
        assert r["batch"] == 2 and r["images_per_s"] > 0 and r["first_call_s"] > 0
        # one CONV_2D: output 3x3x5 per image, each a sum over a 3x3x3 window: 2 * 45 * 27 FLOPs
        assert r["flops_per_image"] == 2 * 45 * 27
    md = (tmp_path / "device.md").read_text()
    assert "| conv_2d.tflite | 2 | bfloat16 |" in md
    assert "LLM decode: skipped" in md
    # the first litert-torch vision fixture is measured too, and its PyTorch original is timed side by
    # side (or said to be skipped where torch is absent, as in CI)
    vis = [r for r in data["records"] if r["model"] == "mobilenet_v3_small_f32.tflite"]
    assert sorted(r["dtype"] for r in vis) == ["bfloat16", "float32"]
    assert all(r["images_per_s"] > 0 for r in vis), [r.get("error") for r in vis]
    torch_rows = [r for r in data["records"] if r["model"].endswith("(torch)")]
    assert torch_rows and all("error" not in r for r in torch_rows), torch_rows
    assert "| litert_torch" in md and "(torch)" in md


def test_peak_table_knows_the_usual_accelerators():
    dev = _device_module()
    assert dev.device_peak("NVIDIA H200", "bfloat16") == 989.0
    assert dev.device_peak("TPU v5 lite", "bfloat16") == 197.0
    assert dev.device_peak("cpu", "float32") is None
