"""Smoke test of the benchmark harness (fbjax/bench.py) on the tiny tflm_sine model.

Asserts the structure of the records, the table and the CLI wiring, never
timings: benchmarks are measured with ``nox -s bench``, not in tests.
"""

from __future__ import annotations

import json
import math

import pytest


from conftest import require  # noqa: E402
require("ai_edge_litert")

from fbjax import bench  # noqa: E402
from fbjax.cli import main as cli_main  # noqa: E402


@pytest.fixture(scope="module")
def sine(shared_models_dir):
    return str(shared_models_dir / "tflm_sine_float.tflite")


def test_bench_model_structure(sine):
    rec = bench.bench_model(sine, runs=3, batch=4, first=False, warmup=1)
    assert rec["model"] == "tflm_sine_float" and rec["other"] == "litert" and rec["format"] == "tflite"
    assert set(rec["latency_ms"]) == {"fbjax", "litert"}
    assert all(v > 0 for v in rec["latency_ms"].values())
    assert rec["latency_ratio"] == pytest.approx(rec["latency_ms"]["fbjax"] / rec["latency_ms"]["litert"])
    # the same model on both sides: fbjax matches LiteRT (float32, one dense chain)
    assert rec["max_rel_err"] < 1e-5
    assert rec["batch"] == 4 and rec["fbjax_batch_mode"] in ("batch_size", "vmap")
    bm = rec["batch_ms"]
    assert bm["litert"] == pytest.approx(min(bm["litert_repeated"], bm["litert_resized"] or math.inf))
    assert rec["throughput_ratio"] == pytest.approx(bm["litert"] / bm["fbjax"])
    json.dumps(rec)  # JSON-serialisable


def test_first_call_and_rss(sine, tmp_path):
    cold = bench.first_call(sine, str(tmp_path / "cache"))
    assert cold["first_call_s"] > 0 and cold["peak_rss_mib"] >= cold["baseline_rss_mib"] > 0
    assert cold["cache_dir"] == str(tmp_path / "cache")
    assert any((tmp_path / "cache").iterdir()), "the first call should have filled the persistent cache"


def test_summary_and_table():
    recs = [
        {"model": "a", "other": "litert", "latency_ratio": 2.0, "throughput_ratio": 0.5,
         "latency_ms": {"fbjax": 2.0, "litert": 1.0}, "batch": 32, "batch_ms": {"fbjax": 4.0, "litert": 2.0},
         "first_call_s": {"cold": 1.0, "warm": 0.25}},
        {"model": "b", "other": "litert", "latency_ratio": 0.5, "throughput_ratio": 2.0,
         "latency_ms": {"fbjax": 1.0, "litert": 2.0}, "batch": 32, "batch_ms": {"fbjax": 1.0, "litert": 2.0},
         "first_call_s": {"cold": 4.0, "warm": 1.0}},
        {"model": "c", "other": "onnxruntime", "latency_ratio": 1.5, "latency_ms": {"fbjax": 3, "onnxruntime": 2}},
        {"model": "d", "source": "d.tflite", "error": "ModelFormatError: broken"},
    ]
    s = bench.summary(recs)
    assert s["tflite_models"] == 2 and s["rten_models"] == 1
    assert s["geomean_latency_ratio_vs_litert"] == pytest.approx(1.0)
    assert s["geomean_throughput_ratio_vs_litert"] == pytest.approx(1.0)
    assert s["geomean_first_call_cold_s"] == pytest.approx(2.0)
    assert s["geomean_latency_ratio_vs_onnxruntime"] == pytest.approx(1.5)
    table = bench.markdown_table(recs, s)
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + len(recs)  # header + one row per model
    assert all(r.count("|") == rows[0].count("|") for r in rows)
    assert "error: ModelFormatError" in table and "**1.00**" in table


def test_geomean_skips_missing():
    assert bench.geomean([4.0, None, float("nan"), 1.0]) == pytest.approx(2.0)
    assert math.isnan(bench.geomean([]))


def test_cli_bench(sine, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert cli_main(["bench", sine, "--runs", "2", "--batch", "0", "--no-first-call", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["records"][0]["model"] == "tflm_sine_float" and "summary" in doc and "environment" in doc
    assert "| tflm_sine_float | litert |" in capsys.readouterr().out


def _tiny_rten(tmp_path) -> str:
    """x[1,4] -> Relu -> prob, as an .rten file written by rten-convert (not one of the onnx wheel's models)."""
    onnx = require("onnx")
    require("rten_convert")
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["prob"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(m)
    path = tmp_path / "small.rten"
    path.write_bytes(bench._onnx_to_rten(m))
    return str(path)


def test_rten_without_reference_runtime_says_so(tmp_path, capsys):
    """An .rten given as a file has no reference runtime (onnxruntime needs
    the source .onnx): one line says so, fbjax's figures are there, and no
    empty LiteRT / onnxruntime summary or target line is printed."""
    path = _tiny_rten(tmp_path)
    rec = bench.bench_model(path, runs=2, batch=4, first=False, warmup=1)
    assert rec["other"] is None and rec["latency_ratio"] is None and rec["max_rel_err"] is None
    assert "onnxruntime needs the source .onnx" in rec["no_reference"]
    assert rec["latency_ms"]["fbjax"] > 0 and rec["batch_ms"]["fbjax"] > 0 and "throughput_ratio" not in rec
    json.dumps(rec)
    s = bench.summary([rec])
    assert s["tflite_models"] == 0 and s["rten_models"] == 0  # the JSON keys stay
    table = bench.markdown_table([rec], s)
    row = next(line for line in table.splitlines() if line.startswith("| small |"))
    assert row.startswith("| small | none | ")
    notes = [line for line in table.splitlines() if line and not line.startswith("|")]
    assert notes == ["small: no reference runtime for this .rten (onnxruntime needs the source .onnx; pass "
                     "light:NAME for the onnx wheel's models); fbjax's own figures only."], notes
    assert "goal" not in table and "TFLite" not in table

    assert cli_main(["bench", path, "--runs", "2", "--batch", "0", "--no-first-call"]) == 0
    out = capsys.readouterr().out
    assert "no reference runtime for this .rten" in out and "0 TFLite models" not in out and "goal" not in out


def test_summary_lines_keep_only_existing_figures():
    """Batch skipped and no first-call run: the TFLite sentence keeps the
    latency ratio and its target, and drops the empty clauses."""
    recs = [{"model": "a", "other": "litert", "latency_ratio": 2.0, "latency_ratio_min": 1.5,
             "latency_ms": {"fbjax": 2.0, "litert": 1.0}}]
    table = bench.markdown_table(recs, bench.summary(recs))
    text = [line for line in table.splitlines() if line and not line.startswith("|")]
    assert text[0] == ("Geometric means over 1 TFLite models (fbjax / LiteRT): batch-1 latency ratio **2.00** "
                       "(fbjax takes 2.00x LiteRT's time per call; goal: at most 1.5x)."), text
    assert text[1] == ("Same with min / min instead of medians (less sensitive to other load): batch-1 latency "
                       "ratio 1.50."), text
    assert len(text) == 2 and "at least 1.0x" not in table and "first call" not in table.split("\n\n")[-1]
