"""One prepared accelerator run: fbjax throughput on whatever device JAX sees.

    python benchmarks/device.py                    # the full run (fits 10 minutes on one GPU/TPU)
    python benchmarks/device.py --smoke            # CPU smoke: batch 2, two small models, a few calls

No network; writes ``<out>/device.json`` and ``<out>/device.md`` (default
``benchmarks/device_results``) and prints the table. Per model (every
``.tflite`` in ``../shared/models/tflite``, and the vision fixtures of
``tests/data/litert_torch`` where that folder exists), per batch (1 and
256) and compute dtype (float32 and bfloat16, :func:`fbjax.load`'s
``compute_dtype``):

* ``first_call_s``: ``fbjax.load`` + trace + compile + first result in this
  process, with fbjax's persistent caches off (``FBJAX_NO_CACHE=1`` set
  before import) -- a cold first call;
* ``images_per_s``: batch / median time of the timed calls (each
  ``block_until_ready``), after two warm-up calls;
* ``flops_per_image``: counted from the graph (:func:`graph_flops`: 2 x the
  multiply-adds of every convolution and matrix product, 1 per output
  element of every other float op), ``achieved_tflops`` = that x images/s,
  and ``peak_fraction`` against the device's dense peak for the dtype
  (:data:`PEAKS`, from the vendors' data sheets; ``None`` where unknown,
  e.g. CPUs).

LLM fixtures (``tests/data/llm/*_f32.tflite``, when ``fbjax.generate``
exists): decode tokens/s at batch 1 and 64 (32 greedy tokens after a
prompt of 8, timed after a compile run). PyTorch side by side: a fixture
folder holding ``torch_reference.py`` with ``module(seed) ->
torch.nn.Module`` (the same architecture and seeded weights the fixture was
converted from) and ``inputs(batch) -> tuple of tensors`` gets the module
timed eagerly and under ``torch.compile`` on the same device, batch and
dtype (every architecture of its ``NAMES`` tuple, if it has one, as
``module(0, name)`` / ``inputs(batch, name)``; ``tests/data/litert_torch``
has one); skipped (said in the table) where torch or such a file is absent.

A time budget (``--budget-s``, default 540 s) stops starting new
measurements so that the JSON and table are always written.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import math
import os
import statistics
import sys
import time
import traceback

os.environ.setdefault("FBJAX_NO_CACHE", "1")  # cold first calls: no persistent compilation / trace cache

import jax  # noqa: E402
import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import fbjax  # noqa: E402

SHARED = os.path.join(ROOT, "..", "shared", "models", "tflite")

#: dense peak TFLOP/s per chip, (device_kind substring, {dtype: peak}); float32 is
#: the non-tensor-core rate on NVIDIA (fbjax's float32 contractions ask for
#: Precision.HIGHEST), on TPU the bfloat16 rate / 6 (HIGHEST = 6 bfloat16 passes)
PEAKS = [
    ("H200", {"float32": 67.0, "bfloat16": 989.0}),
    ("H100", {"float32": 67.0, "bfloat16": 989.0}),
    ("A100", {"float32": 19.5, "bfloat16": 312.0}),
    ("L4", {"float32": 30.3, "bfloat16": 121.0}),
    ("TPU v6", {"float32": 918.0 / 6, "bfloat16": 918.0}),
    ("TPU v5p", {"float32": 459.0 / 6, "bfloat16": 459.0}),
    ("TPU v5", {"float32": 197.0 / 6, "bfloat16": 197.0}),  # v5e ("TPU v5 lite")
    ("TPU v4", {"float32": 275.0 / 6, "bfloat16": 275.0}),
]


def device_peak(kind: str, dtype: str):
    """Dense peak TFLOP/s of a device kind (``jax.devices()[0].device_kind``) for a dtype, or None."""
    for key, peaks in PEAKS:
        if key.lower() in kind.lower():
            return peaks.get(dtype)
    return None


def _numel(shape) -> int:
    return int(np.prod([int(d) for d in shape])) if shape is not None and None not in shape else 0


def graph_flops(ir) -> int:
    """FLOPs of one run of the main graph of ``ir`` at its declared shapes.

    Convolutions: 2 x output elements x (kernel taps x input channels per
    group); depthwise: 2 x output elements x kernel taps; transposed
    convolutions: 2 x input elements x kernel taps x output channels;
    FULLY_CONNECTED / BATCH_MATMUL / MatMul / Gemm: 2 x output elements x
    the contracted length; every other op with a float output: 1 per output
    element. Values with unknown dimensions count 0.
    """
    total = 0
    for node in ir.main_graph.nodes:
        outs = [o for o in node.outputs if o is not None]
        out_n = sum(_numel(o.shape) for o in outs)
        ins = node.inputs
        name = node.op_name
        w = ins[1] if len(ins) > 1 and ins[1] is not None else None
        if name in ("CONV_2D", "Conv") and w is not None and w.shape is not None:
            total += 2 * out_n * (_numel(w.shape) // max(int(w.shape[0]), 1))
        elif name == "DEPTHWISE_CONV_2D" and w is not None and w.shape is not None:
            total += 2 * out_n * int(w.shape[1]) * int(w.shape[2])
        elif name == "TRANSPOSE_CONV" and len(ins) > 2 and ins[1] is not None and ins[2] is not None:
            total += 2 * _numel(ins[2].shape) * (_numel(ins[1].shape) // max(int(ins[1].shape[-1]), 1))
        elif name in ("FULLY_CONNECTED", "Gemm") and w is not None and w.shape is not None:
            total += 2 * out_n * int(w.shape[-1] if name == "FULLY_CONNECTED" else ins[0].shape[-1])
        elif name in ("BATCH_MATMUL", "MatMul") and ins[0] is not None and ins[0].shape:
            total += 2 * out_n * int(ins[0].shape[-1])
        elif any(o.dtype is not None and o.dtype != np.object_ and np.issubdtype(np.dtype(o.dtype), np.floating)
                 for o in outs):
            total += out_n
    return int(total)


def _inputs(specs, batch, seed=0):
    rng = np.random.default_rng(seed)
    xs = []
    for s in specs:
        shape = [1 if d is None else int(d) for d in s.shape]
        if shape:
            shape[0] = batch
        dt = np.dtype(s.dtype)
        xs.append(rng.random(shape, dtype=np.float32).astype(dt) if dt.kind == "f"
                  else rng.integers(0, 4, shape).astype(dt))
    return xs


def _time_calls(fn, min_runs: int, min_s: float) -> list:
    times = []
    t_end = time.perf_counter() + min_s
    while len(times) < min_runs or time.perf_counter() < t_end:
        t = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t)
        if len(times) >= 10 * min_runs:
            break
    return times


def bench_model(path: str, batch: int, dtype: str, *, min_runs: int, min_s: float, peak_kind: str) -> dict:
    """One (model, batch, dtype) record; ``error`` holds the reason when it cannot run."""
    rec = {"model": os.path.basename(path), "batch": batch, "dtype": dtype}
    t0 = time.perf_counter()
    try:
        m = fbjax.load(path, batch_size=batch if batch > 1 else "file", compute_dtype=dtype)
        mode = "batch_size"
    except fbjax.InputError:  # the graph cannot be re-batched: vmap the batch-1 model
        m = fbjax.load(path, compute_dtype=dtype)
        mode = "vmap"
    xs = _inputs(m.inputs, batch)
    if mode == "vmap" and batch > 1:
        one = lambda p, *x: m.apply(p, *[v[None] for v in x])
        f = jax.jit(jax.vmap(one, in_axes=(None,) + (0,) * len(xs)))
        call = lambda: f(m.params, *xs)
    else:
        call = lambda: m(*xs)
    jax.block_until_ready(call())
    rec["first_call_s"] = time.perf_counter() - t0
    rec["mode"] = mode
    m.wait_optimised()  # on CPU (the smoke run), time the optimised program, not the quick first tier
    jax.block_until_ready(call())
    times = _time_calls(call, min_runs, min_s)
    med = statistics.median(times)
    rec.update(runs=len(times), median_s=med, images_per_s=batch / med)
    flops = graph_flops(m.ir)
    per_image = flops / (batch if mode == "batch_size" else 1)  # the graph holds the batch, or one image
    rec["flops_per_image"] = per_image
    rec["achieved_tflops"] = per_image * batch / med / 1e12
    peak = device_peak(peak_kind, dtype)
    rec["peak_tflops"] = peak
    rec["peak_fraction"] = rec["achieved_tflops"] / peak if peak else None
    return rec


def _torch_reference(folder: str):
    spec = importlib.util.spec_from_file_location("torch_reference", os.path.join(folder, "torch_reference.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def bench_torch(folder: str, batch: int, dtype: str, *, min_runs: int, min_s: float, name: str | None = None) -> dict:
    """The PyTorch original of a fixture folder (``torch_reference.py``), eager and compiled.

    ``name``: for a file that rebuilds several architectures (a ``NAMES`` tuple), the one to time,
    passed as ``module(0, name)`` and ``inputs(batch, name)``."""
    label = os.path.basename(folder) + (f"/{name}" if name else "")
    rec = {"model": label + " (torch)", "batch": batch, "dtype": dtype}
    try:
        import torch
    except ImportError:
        rec["skipped"] = "torch is not installed"
        return rec
    mod = _torch_reference(folder)
    extra = (name,) if name else ()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    tdt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    net = mod.module(0, *extra).to(dev, tdt).eval()
    xs = [x.to(dev, tdt) if x.is_floating_point() else x.to(dev) for x in mod.inputs(batch, *extra)]
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    for label, fn in (("eager", net), ("compile", torch.compile(net))):
        with torch.no_grad():
            t0 = time.perf_counter()
            fn(*xs)
            sync()
            first = time.perf_counter() - t0

            def call():
                fn(*xs)
                sync()
                return None
            times = _time_calls(call, min_runs, min_s)
        rec[label] = {"first_call_s": first, "images_per_s": batch / statistics.median(times)}
    return rec


def bench_llm(path: str, batch: int, *, new_tokens: int = 32, prompt_len: int = 8) -> dict:
    """Decode tokens/s of ``fbjax.generate`` on an LLM fixture (after a compile run)."""
    rec = {"model": os.path.basename(path), "batch": batch, "dtype": "float32", "kind": "llm"}
    m = fbjax.load(path)
    prompts = np.random.default_rng(0).integers(1, 200, (batch, prompt_len)).astype(np.int32)
    t0 = time.perf_counter()
    fbjax.generate(m, prompts, new_tokens)
    rec["first_call_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    np.asarray(fbjax.generate(m, prompts, new_tokens))
    dt = time.perf_counter() - t0
    rec["tokens_per_s"] = batch * new_tokens / dt
    return rec


def _fmt(v, f="{:.3g}"):
    return "-" if v is None else f.format(v)


def markdown(records: list, env: dict) -> str:
    lines = [f"Device: {env['device_kind']} ({env['backend']}, {env['n_devices']} device(s)); jax {env['jax']}; "
             f"fbjax caches off (cold first calls). Command: `{env['command']}`", "",
             "| model | batch | dtype | first call s | images/s | GFLOP/image | achieved TFLOP/s | % of peak |",
             "|---|---|---|---|---|---|---|---|"]
    for r in records:
        if r.get("kind") == "llm":
            continue
        if "torch" in r["model"]:
            if "skipped" in r:
                lines.append(f"| {r['model']} | {r['batch']} | {r['dtype']} | skipped: {r['skipped']} | | | | |")
            else:
                for label in ("eager", "compile"):
                    t = r.get(label, {})
                    lines.append(f"| {r['model']} {label} | {r['batch']} | {r['dtype']} | {_fmt(t.get('first_call_s'))}"
                                 f" | {_fmt(t.get('images_per_s'), '{:.1f}')} | | | |")
            continue
        if "error" in r or "skipped" in r:
            why = r.get("error") or r.get("skipped")
            lines.append(f"| {r['model']} | {r['batch']} | {r['dtype']} | {why[:100]} | | | | |")
            continue
        pf = r.get("peak_fraction")
        lines.append(f"| {r['model']} | {r['batch']}{' (vmap)' if r.get('mode') == 'vmap' else ''} | {r['dtype']} | "
                     f"{r['first_call_s']:.2f} | {r['images_per_s']:.1f} | {r['flops_per_image'] / 1e9:.3f} | "
                     f"{r['achieved_tflops']:.3g} | {_fmt(None if pf is None else 100 * pf, '{:.2f}')} |")
    llm = [r for r in records if r.get("kind") == "llm"]
    if llm:
        lines += ["", "| LLM fixture | batch | first call s | decode tokens/s |", "|---|---|---|---|"]
        for r in llm:
            if "error" in r or "skipped" in r:
                lines.append(f"| {r['model']} | {r['batch']} | {(r.get('error') or r.get('skipped'))[:100]} | |")
            else:
                lines.append(f"| {r['model']} | {r['batch']} | {r['first_call_s']:.2f} | {r['tokens_per_s']:.1f} |")
    for note in env.get("notes", []):
        lines.append(f"\n{note}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "device_results"), help="output folder")
    ap.add_argument("--models", nargs="*", help="model files (default: every shared TFLite model)")
    ap.add_argument("--batches", nargs="*", type=int, default=[1, 256])
    ap.add_argument("--dtypes", nargs="*", default=["float32", "bfloat16"])
    ap.add_argument("--llm-batches", nargs="*", type=int, default=[1, 64])
    ap.add_argument("--budget-s", type=float, default=540.0, help="start no new measurement after this")
    ap.add_argument("--min-runs", type=int, default=10)
    ap.add_argument("--min-s", type=float, default=1.0, help="time each configuration at least this long")
    ap.add_argument("--no-llm", action="store_true", help="skip the LLM decode figures")
    ap.add_argument("--smoke", action="store_true",
                    help="CPU smoke run: batch 2, the two smallest shared models (or --models), few calls, "
                         "LLM batch 1 only")
    a = ap.parse_args(argv)
    t_start = time.perf_counter()
    models = a.models or sorted(glob.glob(os.path.join(SHARED, "*.tflite")))
    vision = sorted(glob.glob(os.path.join(ROOT, "tests", "data", "litert_torch", "*.tflite")))
    llms = sorted(glob.glob(os.path.join(ROOT, "tests", "data", "llm", "*_f32.tflite")))
    if a.no_llm:
        llms = []
    if a.smoke:
        models = models if a.models else sorted(models, key=os.path.getsize)[:2]
        vision, llms = vision[:1], llms[:1]
        a.batches, a.min_runs, a.min_s, a.llm_batches = [2], 2, 0.0, [1]
    dev = jax.devices()[0]
    env = {"device_kind": dev.device_kind, "backend": jax.default_backend(), "n_devices": len(jax.devices()),
           "jax": jax.__version__, "command": " ".join([os.path.basename(sys.argv[0])] + list(argv or sys.argv[1:])),
           "notes": []}
    records = []

    def over_budget():
        return time.perf_counter() - t_start > a.budget_s

    for path in models + vision:
        for dtype in a.dtypes:
            for batch in a.batches:
                if over_budget():
                    records.append({"model": os.path.basename(path), "batch": batch, "dtype": dtype,
                                    "skipped": "time budget"})
                    continue
                try:
                    rec = bench_model(path, batch, dtype, min_runs=a.min_runs, min_s=a.min_s,
                                      peak_kind=dev.device_kind)
                except Exception as e:  # noqa: BLE001 -- one model failing must not lose the others' figures
                    rec = {"model": os.path.basename(path), "batch": batch, "dtype": dtype,
                           "error": f"{type(e).__name__}: {e}".splitlines()[0],
                           "traceback": traceback.format_exc()[-2000:]}
                records.append(rec)
                print(json.dumps({k: v for k, v in rec.items() if k != "traceback"}), flush=True)
    torch_dirs = sorted({os.path.dirname(p) for p in glob.glob(os.path.join(ROOT, "tests", "data", "*",
                                                                          "torch_reference.py"))})
    if not torch_dirs:
        env["notes"].append("PyTorch side by side: skipped, no fixture folder has a torch_reference.py.")
    for folder in torch_dirs:
        try:  # several architectures in one file: a NAMES tuple (needs torch to import; else one record)
            names = list(getattr(_torch_reference(folder), "NAMES", [None]))
        except ImportError:
            names = [None]
        if a.smoke:
            names = names[:1]
        for name in names:
            for dtype in a.dtypes:
                for batch in a.batches:
                    if over_budget():
                        continue
                    try:
                        records.append(bench_torch(folder, batch, dtype, min_runs=a.min_runs, min_s=a.min_s,
                                                   name=name))
                    except Exception as e:  # noqa: BLE001
                        records.append({"model": os.path.basename(folder) + (f"/{name}" if name else "") + " (torch)",
                                        "batch": batch, "dtype": dtype,
                                        "error": f"{type(e).__name__}: {e}".splitlines()[0]})
    if a.no_llm:
        env["notes"].append("LLM decode: skipped (--no-llm).")
    elif not hasattr(fbjax, "generate"):
        env["notes"].append("LLM decode: skipped, this fbjax has no fbjax.generate.")
    elif not llms:
        env["notes"].append("LLM decode: skipped, no tests/data/llm/*_f32.tflite fixtures.")
    else:
        for path in llms:
            for batch in a.llm_batches:
                if over_budget():
                    continue
                try:
                    records.append(bench_llm(path, batch))
                except Exception as e:  # noqa: BLE001
                    records.append({"model": os.path.basename(path), "batch": batch, "kind": "llm",
                                    "error": f"{type(e).__name__}: {e}".splitlines()[0]})
    env["wall_s"] = time.perf_counter() - t_start
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "device.json"), "w") as f:
        json.dump({"env": env, "records": records}, f, indent=1, default=str)
    md = markdown(records, env)
    with open(os.path.join(a.out, "device.md"), "w") as f:
        f.write(md + "\n")
    print(md)
    return 0 if not any("error" in r for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
