"""``fbjax.infer`` side by side with a loop of batch-1 calls and the batched
program, interleaved in one process.

    python benchmarks/infer.py [--models NAME ...] [--batches 1 8 32 64] [--examples 64] [--runs 3]
                               [--json out.json]

For each model (``.tflite`` files of ``../shared/models/tflite``, by name
without the suffix) and batch size B, on the same ``--examples`` random
examples (float32 normal, seed 0), images/s of:

* ``loop``: ``[model(x[None]) for x in examples]`` with the file's batch-1
  model, then one ``jax.block_until_ready`` (the Python loop a user writes);
* ``batched``: ``jax.jit(model.apply)`` of the batch-polymorphic model on
  the examples stacked B at a time (the program ``fbjax.infer`` ran per step
  before issue 15), arrays already in memory, one wait at the end;
* ``infer``: ``fbjax.infer(model, examples_array, step_size=B)``;
* ``infer dir``: ``fbjax.infer(model, directory, step_size=B)`` on one
  ``.npy`` file per example (files read inside the timing).

Each round runs every variant once, in an order that alternates; the figure
is the best (minimum-time) round, as the machine is shared. ``ratio`` =
infer images/s / max(loop, batched) images/s (target: >= 1). ``paired`` is
the median over rounds of the same ratio taken within each round (the
variants of one round run back to back, so they see the same load from
other processes: the fairer figure on a busy machine); ``load`` is the
1-minute load average (``os.getloadavg``) when the row was measured. The results of
``infer`` are checked against the loop's (max abs difference / max abs
value).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SHARED = os.path.join(ROOT, "..", "shared", "models", "tflite")
DEFAULT_MODELS = ("mediapipe_palm_detection_lite", "mediapipe_face_detection_short_range")


def _first(y):
    return np.asarray(y[0] if isinstance(y, (tuple, list)) else y)


def bench_model(path: str, batches, n: int, runs: int) -> list:
    import jax

    import fbjax

    m1 = fbjax.load(path)
    mN = fbjax.load(path, batch_size=None)
    shape, dtype = m1.inputs[0].shape[1:], m1.inputs[0].dtype
    if len(m1.inputs) != 1:
        raise SystemExit(f"{path}: benchmarks/infer.py takes single-input models")
    xs = np.random.default_rng(0).standard_normal((n, *shape)).astype(dtype)
    jitted = jax.jit(mN.apply)
    records = []
    with tempfile.TemporaryDirectory() as d:
        for i, x in enumerate(xs):
            np.save(os.path.join(d, f"{i:06d}.npy"), x)

        def loop():
            return jax.block_until_ready([m1(x[None]) for x in xs])

        ref = np.concatenate([_first(y) for y in loop()])
        m1.wait_optimised()  # time the optimised program, not the quick first tier (fbjax.run.tiered)
        scale = float(np.max(np.abs(ref))) or 1.0
        for b in batches:
            pad = -(-n // b) * b
            stacked = np.concatenate([xs, np.zeros((pad - n, *shape), dtype)])

            def batched(b=b, stacked=stacked):
                return jax.block_until_ready([jitted(mN.params, stacked[i:i + b]) for i in range(0, pad, b)])

            def inf(b=b):
                return fbjax.infer(mN, xs, step_size=b, progress=False)

            def inf_dir(b=b):
                return fbjax.infer(mN, d, step_size=b, progress=False)

            fns = {"loop": loop, "batched": batched, "infer": inf, "infer dir": inf_dir}
            errs = {k: float(np.max(np.abs(_first(f()) - ref))) / scale for k, f in
                    (("infer", inf), ("infer dir", inf_dir))}  # (also the warm-up: compiles)
            jax.block_until_ready(batched())
            ts = {k: [] for k in fns}
            items = list(fns.items())
            for r in range(runs):
                for k, f in (items if r % 2 else items[::-1]):
                    t = time.perf_counter()
                    f()
                    ts[k].append(time.perf_counter() - t)
            rate = {k: n / min(v) for k, v in ts.items()}
            best_other = [min(a, c) for a, c in zip(ts["loop"], ts["batched"])]

            def paired(k):
                return float(np.median([o / t for o, t in zip(best_other, ts[k])]))

            rec = {"model": os.path.basename(path), "batch": b, "examples": n, "runs": runs,
                   **{f"{k} ex/s": round(v, 1) for k, v in rate.items()},
                   "ratio": round(rate["infer"] / max(rate["loop"], rate["batched"]), 2),
                   "ratio dir": round(rate["infer dir"] / max(rate["loop"], rate["batched"]), 2),
                   "paired": round(paired("infer"), 2), "paired dir": round(paired("infer dir"), 2),
                   "load": round(os.getloadavg()[0], 1), "max rel err": max(errs.values())}
            print(json.dumps(rec), flush=True)
            records.append(rec)
    return records


def markdown(records) -> str:
    head = ("| model | batch | loop ex/s | batched ex/s | infer ex/s | infer dir ex/s | infer / best | dir / best "
            "| paired | paired dir | load | max rel err |")
    lines = [head, "|" + "---|" * 12]
    for r in records:
        lines.append(f"| {r['model']} | {r['batch']} | {r['loop ex/s']:.0f} | {r['batched ex/s']:.0f} | "
                     f"{r['infer ex/s']:.0f} | {r['infer dir ex/s']:.0f} | {r['ratio']:.2f} | {r['ratio dir']:.2f} | "
                     f"{r['paired']:.2f} | {r['paired dir']:.2f} | {r['load']:.1f} | {r['max rel err']:.1e} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS),
                   help="model names in ../shared/models/tflite (without .tflite), or paths")
    p.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32, 64])
    p.add_argument("--examples", type=int, default=64, help="examples per timed run")
    p.add_argument("--runs", type=int, default=3, help="interleaved rounds (the best is reported)")
    p.add_argument("--json", help="also write the records here")
    args = p.parse_args(argv)
    from fbjax.bench import environment

    recs = []
    for name in args.models:
        path = name if os.path.exists(name) else os.path.join(SHARED, name + ".tflite")
        recs += bench_model(path, args.batches, args.examples, args.runs)
    print(markdown(recs))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": environment(), "command": " ".join(sys.argv), "records": recs}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
