"""Summary of a ``benchmarks/infer.py --json`` file: per load mode and
source, the geometric mean of the cells' paired medians (and how many are
below 1), and the geometric mean of every round's paired ratio pooled over
the cells, with a 95 % bootstrap interval (cells resampled, then rounds
within them), beside the same for the A/A control (the loop against
itself), which shows what the protocol reads when nothing differs.

    python benchmarks/infer_summary.py benchmarks/infer5_results.json [--per-model]

``--per-model`` adds one row per model and load mode: every round of its
cells (both sources, every step size) pooled the same way, beside its A/A
control and its lowest paired median, so a model that is slower than its
loop shows as an interval below 1.
"""

from __future__ import annotations

import json
import sys

import numpy as np


def _gmean(xs) -> float:
    return float(np.exp(np.mean(np.log(np.asarray(xs, float)))))


def _pooled(cells: list, rng, n_boot: int = 2000) -> tuple:
    """Geometric mean of all rounds of ``cells`` (lists of per-round ratios)
    and its 95 % bootstrap interval (resampling cells, then rounds)."""
    logs = [np.log(np.asarray(c, float)) for c in cells if len(c)]
    point = float(np.exp(np.mean(np.concatenate(logs))))
    boots = []
    for _ in range(n_boot):
        pick = rng.integers(0, len(logs), len(logs))
        boots.append(np.mean(np.concatenate([rng.choice(logs[i], len(logs[i])) for i in pick])))
    lo, hi = np.exp(np.percentile(boots, [2.5, 97.5]))
    return point, float(lo), float(hi)


def summary(path: str) -> str:
    recs = json.load(open(path))["records"]
    rng = np.random.default_rng(0)
    lines = ["| load | source | cells | geomean of paired medians | cells < 1 | pooled rounds (95 % CI) "
             "| A/A pooled (95 % CI) |", "|---|---|---|---|---|---|---|"]
    for mode in ("fixed", "poly"):
        rows = [r for r in recs if r["load mode"] == mode]
        if not rows:
            continue
        aa = {r["model"]: r["rounds A/A"] for r in rows}  # one A/A per model and load mode
        a = _pooled(list(aa.values()), rng)
        for src, med, rounds in (("array", "infer / loop", "rounds infer / loop"),
                                 ("directory", "dir / loop dir", "rounds dir / loop dir")):
            meds = [r[med] for r in rows]
            p = _pooled([r[rounds] for r in rows], rng)
            lines.append(f"| {mode} | {src} | {len(rows)} | {_gmean(meds):.2f} ({min(meds):.2f}-{max(meds):.2f}) | "
                         f"{sum(m < 1 for m in meds)} | {p[0]:.2f} ({p[1]:.2f}-{p[2]:.2f}) | "
                         f"{a[0]:.2f} ({a[1]:.2f}-{a[2]:.2f}) |")
    return "\n".join(lines)


def per_model(path: str) -> str:
    recs = json.load(open(path))["records"]
    rng = np.random.default_rng(0)
    lines = ["| model | load | cells | pooled rounds (95 % CI) | lowest paired median | A/A pooled (95 % CI) |",
             "|---|---|---|---|---|---|"]
    keys = sorted({(r["model"], r["load mode"]) for r in recs}, key=lambda k: (k[0], k[1]))
    for model, mode in keys:
        rows = [r for r in recs if r["model"] == model and r["load mode"] == mode]
        cells = [r["rounds infer / loop"] for r in rows] + [r["rounds dir / loop dir"] for r in rows]
        p = _pooled(cells, rng)
        a = _pooled([rows[0]["rounds A/A"]], rng)
        low = min(min(r["infer / loop"], r["dir / loop dir"]) for r in rows)
        lines.append(f"| {model} | {mode} | {len(cells)} | {p[0]:.2f} ({p[1]:.2f}-{p[2]:.2f}) | {low:.2f} | "
                     f"{a[0]:.2f} ({a[1]:.2f}-{a[2]:.2f}) |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(summary(sys.argv[1]))
    if "--per-model" in sys.argv[2:]:
        print()
        print(per_model(sys.argv[1]))
