"""``fbjax.load`` + first call, each in a fresh process (issue 15 item 2).

Since ``fbjax.load`` traces the model abstractly (so every lowering error is
raised at load), the question is whether that adds to the time a user waits
before the first result: the first call must reuse the load-time trace.
This prints, per model, the load time, the first call's time and their sum,
median of ``--repeats`` fresh processes (``FBJAX_NO_CACHE=1``: no persistent
compilation or trace cache, so every process compiles).

    python benchmarks/load_first_call.py ../shared/models/tflite/a.tflite ... [--repeats 3]
        [--python /other/checkout/.venv/bin/python --python .venv/bin/python]

With several ``--python`` (checkouts to compare), the runs alternate
between them (ABBA order), so a busy machine's load falls on each alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np
import fbjax
t1 = time.perf_counter()
m = fbjax.load(sys.argv[1])
t2 = time.perf_counter()
xs = [np.zeros(s.shape, s.dtype) for s in m.inputs]
out = m(*xs)
import jax
jax.block_until_ready(out)
t3 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "load": t2 - t1, "first_call": t3 - t2, "executor": m.executor.name}))
"""


def measure(path: str, python: str) -> dict:
    env = dict(os.environ, FBJAX_NO_CACHE="1")
    out = subprocess.run([python, "-c", _CHILD, path], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--python", action="append",
                    help="an interpreter (a checkout's venv); repeat to compare checkouts (default: this one)")
    args = ap.parse_args()
    pythons = args.python or [sys.executable]
    print(f"{'model':40s} {'python':28s} {'executor':13s} {'load s':>7s} {'1st call s':>10s} {'sum s':>7s}")
    for path in args.models:
        runs = {py: [] for py in pythons}
        for r in range(args.repeats):
            for py in (pythons if r % 2 == 0 else pythons[::-1]):  # ABBA: neither goes first every time
                runs[py].append(measure(path, py))
        for py in pythons:
            rs = runs[py]
            med = {k: statistics.median(r[k] for r in rs) for k in ("load", "first_call")}
            tot = statistics.median(r["load"] + r["first_call"] for r in rs)
            print(f"{os.path.basename(path):40s} {py[-28:]:28s} {rs[0]['executor']:13s} {med['load']:7.2f} "
                  f"{med['first_call']:10.2f} {tot:7.2f}", flush=True)


if __name__ == "__main__":
    main()
