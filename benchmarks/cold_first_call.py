"""Cold first call under XLA options that may compile faster, and whether each keeps the default's bits.

    python benchmarks/cold_first_call.py [--repeats 3] [--only NAME ...] [--timing-models a.tflite ...]
        [--bits-models a.tflite ...] [--json out.json] [--md out.md]

For each option (an ``XLA_FLAGS`` setting; ``default`` is fbjax as it is):

* **cold first call**: per timing model (default the three shared float
  models issue 35 item 12 names), a fresh process with ``FBJAX_CACHE_DIR``
  set to a new empty directory (neither JAX's persistent compilation cache
  nor fbjax's trace cache holds anything) times ``import fbjax``,
  ``fbjax.load`` and the first call (``load + first call`` is the figure a
  user waits for), then a second (warm) call whose outputs must equal the
  first's bit for bit. Options alternate per model and repeat (each repeat
  rotates the order), so the machine's load falls on all of them alike; the
  1-minute load average is recorded with every run.
* **bits**: one fresh process per option (empty cache) loads every bits
  model (default every ``.tflite`` in ``../shared/models/tflite``), calls it
  on seeded inputs (:func:`fbjax.bench._inputs`) and hashes every output's
  bytes; an option keeps the bits when every hash equals the default's.

Prints a Markdown table (median seconds over the repeats) and writes it and
the raw runs when ``--md`` / ``--json`` are given.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(ROOT, "..", "shared", "models", "tflite")
TIMING = ("mediapipe_selfie_segmentation", "mediapipe_face_detection_short_range", "mediapipe_hand_landmark_lite")

#: name -> XLA_FLAGS; each changes how XLA:CPU compiles, and may or may not change what it computes
OPTIONS = {
    "default": "",
    "O2": "--xla_backend_optimization_level=2",
    "O1": "--xla_backend_optimization_level=1",
    "O0": "--xla_backend_optimization_level=0",
    "no_expensive_llvm_passes": "--xla_llvm_disable_expensive_passes=true",
    "codegen_split_1": "--xla_cpu_parallel_codegen_split_count=1",
    "no_fusion_emitters": "--xla_cpu_use_fusion_emitters=false",
    "vector_width_128": "--xla_cpu_prefer_vector_width=128",
    "max_isa_avx2": "--xla_cpu_max_isa=AVX2",
}
#: jaxlib 0.10.2 refuses these in XLA_FLAGS ("Unknown flag"), though its library names them:
#: xla_cpu_disable_loop_unrolling, xla_cpu_disable_slp_vectorizer, xla_cpu_optimize_for_size,
#: xla_cpu_disable_tiled_emitter

_TIME_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import jax, numpy as np
import fbjax
from fbjax.bench import _inputs
t1 = time.perf_counter()
m = fbjax.load(sys.argv[1])
t2 = time.perf_counter()
xs = _inputs(m.inputs)
out = jax.block_until_ready(m(*xs))
t3 = time.perf_counter()
again = jax.block_until_ready(m(*xs))
t4 = time.perf_counter()
leaves = lambda o: [np.asarray(a) for a in jax.tree_util.tree_leaves(o)]
warm_equal = all(a.tobytes() == b.tobytes() for a, b in zip(leaves(out), leaves(again)))
print(json.dumps({"import": t1 - t0, "load": t2 - t1, "first_call": t3 - t2, "warm_call": t4 - t3,
                  "warm_equal": warm_equal}))
"""

_BITS_CHILD = r"""
import hashlib, json, sys
import jax, numpy as np
import fbjax
from fbjax.bench import _inputs
res = {}
for path in sys.argv[1:]:
    name = path.rsplit("/", 1)[-1]
    try:
        m = fbjax.load(path)
        out = jax.block_until_ready(m(*_inputs(m.inputs)))
        h = hashlib.sha256()
        for a in jax.tree_util.tree_leaves(out):
            a = np.asarray(a)
            h.update(str((a.shape, a.dtype)).encode()); h.update(a.tobytes())
        res[name] = h.hexdigest()
    except Exception as e:  # a model this fbjax does not load: recorded, not compared
        res[name] = "error: " + type(e).__name__
    print(json.dumps({name: res[name]}), file=sys.stderr, flush=True)
print(json.dumps(res))
"""


def _load() -> float:
    return os.getloadavg()[0]


def _child(code: str, args: list, flags: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="fbjax-cold-") as d:
        env = dict(os.environ, FBJAX_CACHE_DIR=os.path.join(d, "cache"), XLA_FLAGS=flags)
        env.pop("FBJAX_NO_CACHE", None)
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
        out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                             cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"child failed ({flags!r}, {args[:1]}):\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", nargs="*", help="option names (default: all; 'default' is always run)")
    ap.add_argument("--timing-models", nargs="*", default=[os.path.join(SHARED, n + ".tflite") for n in TIMING])
    ap.add_argument("--bits-models", nargs="*", default=sorted(glob.glob(os.path.join(SHARED, "*.tflite"))))
    ap.add_argument("--no-bits", action="store_true", help="time only")
    ap.add_argument("--json")
    ap.add_argument("--md")
    args = ap.parse_args()
    names = ["default"] + [n for n in (args.only or OPTIONS) if n != "default"]
    runs = {n: {os.path.basename(m): [] for m in args.timing_models} for n in names}
    for r in range(args.repeats):
        for m in args.timing_models:
            order = names[r % len(names):] + names[:r % len(names)]
            for n in order:
                rec = _child(_TIME_CHILD, [m], OPTIONS[n])
                rec["loadavg"] = _load()
                runs[n][os.path.basename(m)].append(rec)
                print(f"{n:26s} {os.path.basename(m):45s} load+1st {rec['load'] + rec['first_call']:6.2f} s "
                      f"(load avg {rec['loadavg']:.1f})", file=sys.stderr, flush=True)
    bits = {}
    if not args.no_bits:
        for n in names:
            bits[n] = _child(_BITS_CHILD, args.bits_models, OPTIONS[n])
            print(f"bits {n}: done (load avg {_load():.1f})", file=sys.stderr, flush=True)
    rows = []
    head = ["option", "XLA_FLAGS"] + [f"{os.path.basename(m).removesuffix('.tflite')} s" for m in args.timing_models]
    head += ["warm == first", "bits == default"]
    for n in names:
        cells = [n, f"`{OPTIONS[n]}`" if OPTIONS[n] else "(none)"]
        for m in args.timing_models:
            rs = runs[n][os.path.basename(m)]
            cells.append(f"{statistics.median(x['load'] + x['first_call'] for x in rs):.2f}" if rs else "-")
        warm = [x["warm_equal"] for v in runs[n].values() for x in v]
        cells.append(("yes" if all(warm) else "NO") if warm else "-")
        if bits:
            ok = [k for k, h in bits[n].items() if h == bits["default"].get(k) and not h.startswith("error")]
            cells.append(f"{'yes' if len(ok) == len(bits['default']) else 'NO'} ({len(ok)}/{len(bits['default'])})")
        else:
            cells.append("not run")
        rows.append(cells)
    loads = [x["loadavg"] for v in runs.values() for rs in v.values() for x in rs]
    table = "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                      + ["| " + " | ".join(c) + " |" for c in rows])
    if loads:
        table += (f"\n\nload + first call, median of {args.repeats} fresh process(es) each, empty cache; "
                  f"1-min load average {min(loads):.1f}-{max(loads):.1f}")
    print(table)
    if args.md:
        with open(args.md, "w") as f:
            f.write(table + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"options": {n: OPTIONS[n] for n in names}, "runs": runs, "bits": bits}, f, indent=1)
    digest = hashlib.sha256(json.dumps(bits, sort_keys=True).encode()).hexdigest()[:12] if bits else "-"
    print(f"bits digest {digest}", file=sys.stderr)


if __name__ == "__main__":
    main()
