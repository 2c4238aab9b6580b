"""Smoke test of the benchmark harness (fbjax/bench.py) on the tiny tflm_sine model.

Asserts the structure of the records, the table and the CLI wiring, never
timings: benchmarks are measured with ``nox -s bench``, not in tests.
"""

from __future__ import annotations

import json
import math

import pytest


pytest.importorskip("ai_edge_litert")

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
