"""``fbjax.infer`` side by side with a plain loop of the same model's calls,
for both ways of loading a model, interleaved in one process.

    python benchmarks/infer.py [--models NAME_OR_PATH ...] [--steps 8 32] [--examples 64] [--runs 5]
                               [--batched] [--json out.json]

For each model (``.tflite`` files of ``../shared/models/tflite`` by name
without the suffix, or paths; default: every file there) it loads

* ``fixed``: ``fbjax.load(path)``, the file's shapes (a fixed batch of 1 for
  the MediaPipe models), the way a new user loads it;
* ``poly``: ``fbjax.load(path, batch_size=None)``, batch-polymorphic (left
  out, with the reason, when the graph cannot take another batch);

and times, on the same ``--examples`` random examples (float: normal, seed
0; integer inputs: uniform over the dtype's range), the seconds of:

* ``loop``: ``[model(x[None]) for x in examples]`` then one
  ``jax.block_until_ready`` (the Python loop a user writes), per load mode;
* ``loop dir``: the same loop reading each example with ``np.load`` from a
  directory of one ``.npy`` per example;
* ``infer`` / ``infer dir``: ``fbjax.infer(model, examples, step_size=S)``
  on the in-memory array / on that directory, per load mode and step size;
* ``batched`` (with ``--batched``): ``jax.jit(poly.apply)`` on the examples
  stacked S at a time.

Each round runs every ``infer`` variant back to back with the loop it is
compared with (same load mode, same source: ``infer dir`` with ``loop
dir``), the pairs in an order that reverses between rounds and which of a
pair runs first alternating; the machine is shared, so the ratios are
*paired*: the loop's time over ``infer``'s within each pair, then the median
over rounds (target: >= 1); also the ratio of the minima over all runs
(the least disturbed run of each) and of the medians. ``A/A`` times the
same loop against itself the same way (``loop again``): its paired median
and range over rounds show what this protocol reads when nothing differs.
``dir / mem loop`` is ``infer dir`` against the in-memory loop (a ratio of
medians: they do not run back to back). ``load`` is the
1-minute load average (``os.getloadavg``) at the row's end. Every variant's
outputs are compared with the fixed model's loop (max abs difference / max
abs value over all outputs).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the other benchmark scripts

SHARED = os.path.join(ROOT, "..", "shared", "models", "tflite")


def _outs(y) -> list:
    return [np.asarray(o) for o in (y if isinstance(y, (tuple, list)) else (y,))]


def _stack(per_example: list) -> list:
    """Loop results (one tuple of outputs per call) as one array per output."""
    outs = [_outs(y) for y in per_example]
    return [np.concatenate([o[k] for o in outs]) for k in range(len(outs[0]))]


def _rel_err(got, ref) -> float:
    got = _outs(got)
    worst = 0.0
    for g, r in zip(got, ref):
        g, r = np.asarray(g, np.float64), np.asarray(r, np.float64)
        scale = float(np.max(np.abs(r))) or 1.0
        worst = max(worst, float(np.max(np.abs(g - r))) / scale if r.size else 0.0)
    return worst


def _examples(spec, n: int) -> np.ndarray:
    shape, dtype = tuple(spec.shape[1:]), np.dtype(spec.dtype)
    rng = np.random.default_rng(0)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return rng.integers(info.min, int(info.max) + 1, (n, *shape)).astype(dtype)
    return rng.standard_normal((n, *shape)).astype(dtype)


def _paired_rounds(fns: dict, runs: int) -> tuple:
    """Time every ``infer ...`` variant back to back with the loop it is
    compared with (``infer MODE S`` with ``loop MODE``, ``infer dir MODE S``
    with ``loop dir MODE``), ``runs`` rounds; the pairs' order reverses every
    round and which of the two runs first alternates, so a change of the
    machine's load within a round hits both sides of a pair alike. Other
    variants (``batched``) run once per round between the pairs.

    Returns ``(times, ratios)``: seconds per variant (a loop once per pair
    it is in), and ``{(infer key, loop key): [loop s / infer s per pair]}``.
    """
    pairs = []
    for k in fns:
        if k.startswith("loop again "):  # A/A: the same loop twice, the noise of this protocol
            pairs.append((k, "loop " + k.split()[2]))
        elif k.startswith("infer dir "):
            pairs.append((k, "loop dir " + k.split()[2]))
        elif k.startswith("infer "):
            pairs.append((k, "loop " + k.split()[1]))
    others = [k for k in fns if not k.startswith(("infer ", "loop "))]
    ts = {k: [] for k in fns}
    ratios = {p: [] for p in pairs}

    def timed(k):
        t = time.perf_counter()
        fns[k]()
        dt = time.perf_counter() - t
        ts[k].append(dt)
        return dt

    for r in range(runs):
        for i, (a, b) in enumerate(pairs if r % 2 else pairs[::-1]):
            if (r + i) % 2:
                ta, tb = timed(a), timed(b)
            else:
                tb, ta = timed(b), timed(a)
            ratios[(a, b)].append(tb / ta)
        for k in others:
            timed(k)
    return ts, ratios


def bench_model(path: str, steps, n: int, runs: int, batched: bool = False):
    """Records (one per load mode and step size) of one model, or ``(None, reason)``."""
    import jax

    import fbjax

    name = os.path.basename(path)
    t0 = time.perf_counter()
    m1 = fbjax.load(path)
    if len(m1.inputs) != 1:
        return None, "takes several inputs (benchmarks/infer.py times single-input models)"
    if getattr(m1, "_stateful", False):
        return None, "has run state (resource variables): infer runs stateless models only"
    if any(d is None for d in m1.inputs[0].shape[1:]):
        return None, f"input {m1.inputs[0]} has unknown non-batch dimensions"
    models = {"fixed": m1}
    skipped = {}
    if m1.inputs[0].shape[0] is None:
        skipped["poly"] = "the file's model is already batch-polymorphic (fixed = poly)"
    else:
        try:
            models["poly"] = fbjax.load(path, batch_size=None)
        except fbjax.InputError as e:
            skipped["poly"] = str(e).splitlines()[0]
    xs = _examples(m1.inputs[0], n)
    records = []
    with tempfile.TemporaryDirectory() as d:
        files = []
        for i, x in enumerate(xs):
            files.append(os.path.join(d, f"{i:06d}.npy"))
            np.save(files[-1], x)

        fns = {}
        for mode, m in models.items():
            fns[f"loop {mode}"] = lambda m=m: jax.block_until_ready([m(x[None]) for x in xs])
            fns[f"loop dir {mode}"] = lambda m=m: jax.block_until_ready([m(np.load(f)[None]) for f in files])
            fns[f"loop again {mode}"] = fns[f"loop {mode}"]  # A/A control (see _paired_rounds)
            for s in steps:
                fns[f"infer {mode} {s}"] = lambda m=m, s=s: fbjax.infer(m, xs, step_size=s, progress=False)
                fns[f"infer dir {mode} {s}"] = lambda m=m, s=s: fbjax.infer(m, d, step_size=s, progress=False)
        if batched and "poly" in models:
            mN = models["poly"]
            jitted = jax.jit(mN.apply)
            for s in steps:
                pad = -(-n // s) * s
                stacked = np.concatenate([xs, np.zeros((pad - n, *xs.shape[1:]), xs.dtype)])
                fns[f"batched {s}"] = lambda s=s, pad=pad, stacked=stacked: jax.block_until_ready(
                    [jitted(mN.params, stacked[i:i + s]) for i in range(0, pad, s)])

        fns["loop fixed"]()  # compiles
        for m in models.values():
            m(xs[:1])
            m.wait_optimised()  # time the optimised program, not a quick first tier (fbjax.executors.tiered)
        ref = _stack(fns["loop fixed"]())  # the user's loop: the reference of every variant
        errs = {}
        for k, f in fns.items():  # warm-up (compiles), results checked
            got = f()
            if k.startswith(("loop", "batched")):
                got = _stack(got) if k.startswith("loop") else [np.concatenate(c)[:n] for c in
                                                                  zip(*[_outs(y) for y in got])]
            errs[k] = _rel_err(got, ref)
        setup = time.perf_counter() - t0
        ts, pair_ratios = _paired_rounds(fns, runs)
    load = round(os.getloadavg()[0], 1)

    def paired(num, den):
        if (den, num) in pair_ratios:  # infer and its loop run back to back (see _paired_rounds)
            return round(float(np.median(pair_ratios[(den, num)])), 2)
        return round(float(np.median(ts[num]) / np.median(ts[den])), 2)  # not run side by side: medians

    def of_min(num, den):
        return round(float(min(ts[num]) / min(ts[den])), 2)

    def of_median(num, den):
        return round(float(np.median(ts[num]) / np.median(ts[den])), 2)

    for mode in models:
        for s in steps:
            rec = {"model": name, "load mode": mode, "step": s, "examples": n, "runs": runs,
                   "loop ex/s": round(n / np.median(ts[f"loop {mode}"]), 1),
                   "loop dir ex/s": round(n / np.median(ts[f"loop dir {mode}"]), 1),
                   "infer ex/s": round(n / np.median(ts[f"infer {mode} {s}"]), 1),
                   "infer dir ex/s": round(n / np.median(ts[f"infer dir {mode} {s}"]), 1),
                   "infer / loop": paired(f"loop {mode}", f"infer {mode} {s}"),
                   "dir / loop dir": paired(f"loop dir {mode}", f"infer dir {mode} {s}"),
                   "dir / mem loop": paired(f"loop {mode}", f"infer dir {mode} {s}"),
                   "infer / loop min": of_min(f"loop {mode}", f"infer {mode} {s}"),
                   "infer / loop median": of_median(f"loop {mode}", f"infer {mode} {s}"),
                   "dir / loop dir min": of_min(f"loop dir {mode}", f"infer dir {mode} {s}"),
                   "dir / loop dir median": of_median(f"loop dir {mode}", f"infer dir {mode} {s}"),
                   "A/A loop / loop": paired(f"loop {mode}", f"loop again {mode}"),
                   "A/A range": [round(float(min(pair_ratios[(f"loop again {mode}", f"loop {mode}")])), 2),
                                 round(float(max(pair_ratios[(f"loop again {mode}", f"loop {mode}")])), 2)],
                   "rounds infer / loop": [round(float(x), 3) for x in pair_ratios[(f"infer {mode} {s}", f"loop {mode}")]],
                   "rounds dir / loop dir": [round(float(x), 3)
                                             for x in pair_ratios[(f"infer dir {mode} {s}", f"loop dir {mode}")]],
                   "rounds A/A": [round(float(x), 3) for x in pair_ratios[(f"loop again {mode}", f"loop {mode}")]],
                   "load": load,
                   "max rel err": max(errs[f"infer {mode} {s}"], errs[f"infer dir {mode} {s}"]),
                   "setup s": round(setup, 1)}
            if f"batched {s}" in ts:
                rec["batched ex/s"] = round(n / np.median(ts[f"batched {s}"]), 1)
            print(json.dumps(rec), flush=True)
            records.append(rec)
    for mode, why in skipped.items():
        print(json.dumps({"model": name, "load mode": mode, "skipped": why}), flush=True)
    return records, skipped


def markdown(records, skipped) -> str:
    head = ("| model | load | step | loop ex/s | infer ex/s | infer / loop (paired, min, median) | loop dir ex/s "
            "| infer dir ex/s | dir / loop dir (paired, min, median) | dir / mem loop | A/A loop / loop (range) "
            "| load avg | max rel err |")
    lines = [head, "|" + "---|" * 13]
    for r in records:
        lines.append(f"| {r['model']} | {r['load mode']} | {r['step']} | {r['loop ex/s']:.0f} | "
                     f"{r['infer ex/s']:.0f} | {r['infer / loop']:.2f}, {r['infer / loop min']:.2f}, "
                     f"{r['infer / loop median']:.2f} | {r['loop dir ex/s']:.0f} | "
                     f"{r['infer dir ex/s']:.0f} | {r['dir / loop dir']:.2f}, {r['dir / loop dir min']:.2f}, "
                     f"{r['dir / loop dir median']:.2f} | {r['dir / mem loop']:.2f} | "
                     f"{r['A/A loop / loop']:.2f} ({r['A/A range'][0]:.2f}-{r['A/A range'][1]:.2f}) | "
                     f"{r['load']:.1f} | {r['max rel err']:.1e} |")
    for name, why in skipped:
        lines.append(f"\n{name}: not timed: {why}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", help="model names in ../shared/models/tflite (without .tflite), "
                   "or paths (default: every .tflite there)")
    p.add_argument("--steps", nargs="+", type=int, default=[8, 32], help="infer step sizes")
    p.add_argument("--examples", type=int, default=64, help="examples per timed run")
    p.add_argument("--runs", type=int, default=5, help="interleaved rounds (medians are reported)")
    p.add_argument("--batched", action="store_true", help="also time jax.jit(poly.apply) on stacked steps")
    p.add_argument("--json", help="also write the records here")
    args = p.parse_args(argv)
    from fbjax.bench import environment

    names = args.models or sorted(os.path.basename(f)[:-7] for f in glob.glob(os.path.join(SHARED, "*.tflite")))
    recs, skipped = [], []
    start = time.perf_counter()
    load0 = os.getloadavg()[0]
    for name in names:
        path = name if os.path.exists(name) else os.path.join(SHARED, name + ".tflite")
        got, why = bench_model(path, args.steps, args.examples, args.runs, args.batched)
        if got is None:
            print(json.dumps({"model": os.path.basename(path), "skipped": why}), flush=True)
            skipped.append((os.path.basename(path), why))
            continue
        recs += got
        skipped += [(f"{os.path.basename(path)} ({mode})", w) for mode, w in why.items()]
    print(markdown(recs, skipped))
    wall = time.perf_counter() - start
    print(f"wall {wall:.0f} s, load average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": environment(), "command": " ".join(["python"] + sys.argv),
                       "wall s": round(wall), "records": recs,
                       "skipped": [{"model": m, "reason": w} for m, w in skipped]}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
