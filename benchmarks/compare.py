"""The benchmark of ``nox -s bench``, run side by side for two commits (``nox -s bench_compare``).

    python benchmarks/compare.py --base REV [--head DIR] [--runs 20] [--only NAME ...]

``REV`` (a commit, tag or branch of this repository) is checked out into a
temporary ``git worktree``; ``--head`` is the checkout to compare (default:
this one). For each model of ``benchmarks/run.py`` the two checkouts run
``benchmarks/run.py --only MODEL`` one after the other in fresh processes,
the order alternating from model to model, so that the machine's load drifts
over both alike. Each side imports its own ``fbjax`` (``run.py`` puts its
checkout first on ``sys.path``; its first-call children get it through
``PYTHONPATH``).

Printed and written to ``OUT.md`` / ``OUT.json``: per model, each side's
fbjax/LiteRT (or /onnxruntime) batch-1 latency ratio (median and min over
rounds), batch-32 throughput ratio and first call, and head/base of each.
The summary is the geometric mean of head/base over models with a 95 %
interval (t distribution over the models' log ratios): an interval that
contains 1, or lies below it for latencies, means no slowdown beyond the
spread of this machine's measurements. Both runtimes of one side are timed
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
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=checkout)
    if p.returncode != 0:
        return {"error": (p.stderr or p.stdout)[-800:]}
    with open(out + ".json") as f:
        recs = [r for r in json.load(f)["records"] if model in (r.get("model"), "light:" + str(r.get("model")))]
    return recs[0] if recs else {"error": "no record"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="commit to compare against (checked out in a temporary worktree)")
    p.add_argument("--head", default=ROOT, help="checkout to measure (default: this one)")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--only", nargs="*", help="substrings of model names to keep")
    p.add_argument("--no-first-call", action="store_true")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "compare"), help="output prefix")
    args = p.parse_args(argv)
    models = _models(args.only)
    if not models:
        print(f"no models (looked in {SHARED} and the light models {LIGHT})", file=sys.stderr)
        return 2
    tmp = tempfile.mkdtemp(prefix="fbjax-bench-compare-")
    base_dir = os.path.join(tmp, "base")
    rev = subprocess.run(["git", "-C", args.head, "rev-parse", args.base], capture_output=True, text=True, check=True)
    base_rev = rev.stdout.strip()
    head_rev = subprocess.run(["git", "-C", args.head, "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    subprocess.run(["git", "-C", args.head, "worktree", "add", "--detach", base_dir, base_rev], check=True,
                   capture_output=True)
    shared_link = os.path.join(tmp, "shared")  # run.py finds ../shared beside its checkout
    os.symlink(os.path.abspath(os.path.join(ROOT, "..", "shared")), shared_link)
    rows = []
    try:
        for i, m in enumerate(models):
            sides = [("base", base_dir), ("head", args.head)]
            rec = {}
            for side, d in (sides if i % 2 == 0 else sides[::-1]):
                rec[side] = _run_side(d, m, os.path.join(tmp, f"{side}_{m}"), args)
                err = rec[side].get("error")
                print(f"[compare] {m} {side}: " + (f"FAILED {err}" if err else
                      f"b1 {_get(rec[side], ('latency_ratio',)) or float('nan'):.2f}"), flush=True)
            rows.append({"model": m, **rec})
    finally:
        subprocess.run(["git", "-C", args.head, "worktree", "remove", "--force", base_dir], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    summary = {}
    lines = [f"# Benchmark side by side: head {head_rev[:10]} vs base {base_rev[:10]}", "",
             f"`python benchmarks/compare.py --base {args.base} --runs {args.runs}`; per model both commits run "
             "`benchmarks/run.py --only MODEL` in turn (order alternating). Ratios are fbjax / other runtime "
             "(LiteRT for .tflite, onnxruntime for .rten); head/base < 1 means head is faster for latencies.", "",
             "| model | " + " | ".join(f"{lab} base / head / head÷base" for lab, _, _ in FIGURES) + " |",
             "|---|" + "---|" * len(FIGURES)]
    for r in rows:
        cells = []
        for lab, path, _ in FIGURES:
            b, h = _get(r.get("base", {}), path), _get(r.get("head", {}), path)
            cells.append("–" if b is None or h is None else f"{b:.2f} / {h:.2f} / **{h / b:.2f}**")
        lines.append(f"| {r['model']} | " + " | ".join(cells) + " |")
    lines.append("")
    for lab, path, smaller in FIGURES:
        q = [_get(r.get("head", {}), path) / _get(r.get("base", {}), path) for r in rows
             if _get(r.get("head", {}), path) and _get(r.get("base", {}), path)]
        g, lo, hi = geomean_interval(q)
        worse = lo is not None and ((lo > 1) if smaller else (hi < 1))
        summary[lab] = {"geomean_head_over_base": g, "ci95": [lo, hi], "models": len(q), "slower_beyond_noise": worse}
        ci = "" if lo is None else f" (95 % interval {lo:.2f}–{hi:.2f})"
        verdict = "slower beyond noise" if worse else "no slowdown beyond noise"
        lines.append(f"- {lab}: head/base geometric mean **{g:.3f}**{ci} over {len(q)} models: {verdict}")
    failed = [(r["model"], s) for r in rows for s in ("base", "head") if r.get(s, {}).get("error")]
    if failed:
        lines.append(f"- failed runs: {failed}")
    text = "\n".join(lines) + "\n"
    print(text)
    with open(args.out + ".md", "w") as f:
        f.write(text)
    with open(args.out + ".json", "w") as f:
        json.dump({"command": " ".join(sys.argv), "base": base_rev, "head": head_rev, "rows": rows,
                   "summary": summary}, f, indent=1, default=str)
    print(f"wrote {args.out}.md and {args.out}.json")
    return 1 if any(s["slower_beyond_noise"] for s in summary.values()) or failed else 0


if __name__ == "__main__":
    sys.exit(main())
