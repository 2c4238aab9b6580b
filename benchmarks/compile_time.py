"""Cold first-call time of fbjax models, each in a fresh process with an empty cache.

    python benchmarks/compile_time.py [--only SUBSTR] [--json out.json] [--md out.md]
    python benchmarks/compile_time.py --hlo      # StableHLO size per op family instead
    python benchmarks/compile_time.py --hlo --only "(grad step)"   # ... of the grad step's program

For every float model in ``../shared/models/tflite``, the quantized fixtures
in ``tests/data/quant/models`` and ``tests/data/quant_aeq``, and the first
``jax.jit(jax.grad(loss))`` step of ``mediapipe_hand_landmark_lite`` (and,
as floors, the same step with every convolution a plain
``lax.conv_general_dilated``, at XLA's default and at ``-O0``), a child
process (``FBJAX_CACHE_DIR`` pointing at a new empty directory, so neither
JAX's persistent compilation cache nor fbjax's trace cache holds anything)
times ``fbjax.load`` + the first call, split with JAX's own monitoring
events into tracing (jaxpr), lowering to StableHLO and XLA's backend
compile; the rest (parsing, building, running) is ``other``. It also
records the StableHLO size (ops in the lowered module) of the program.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(ROOT, "..", "shared", "models", "tflite")

_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import jax, numpy as np
import jax.monitoring as mon
import fbjax
from fbjax.bench import _inputs
assert fbjax.__file__.startswith(__import__("os").getcwd()), (fbjax.__file__, "not the fbjax under test")
dur = {}
def listen(event, secs, **kw):
    dur[event] = dur.get(event, 0.0) + secs
mon.register_event_duration_secs_listener(listen)
t_import = time.perf_counter() - t0
path, kind = sys.argv[1], sys.argv[2]
ko = None
if kind.startswith("grad_plain"):  # the floor: the plain jax.lax lowering a hand-written JAX model would be
    ko = fbjax.KernelOptions(depthwise_strategy="conv", small_conv_taps=0)
t1 = time.perf_counter()
m = fbjax.load(path, kernel_options=ko)
t_load = time.perf_counter() - t1
xs = _inputs(m.inputs)
t2 = time.perf_counter()
if kind.startswith("grad"):
    import jax.numpy as jnp
    def loss(p):
        out = m.apply(p, *xs)
        out = out if isinstance(out, tuple) else (out,)
        return sum(jnp.mean(jnp.square(o.astype(jnp.float32))) for o in out)
    step = jax.jit(jax.grad(loss), compiler_options={"xla_backend_optimization_level": 0}
                   if kind.endswith("_o0") else None)
    jax.block_until_ready(step(m.params))
else:
    jax.block_until_ready(m(*xs))
t_call = time.perf_counter() - t2
if kind.startswith("grad"):  # steady state: the same compiled step again (training throughput)
    ts = []
    for _ in range(10):
        t = time.perf_counter(); jax.block_until_ready(step(m.params)); ts.append(time.perf_counter() - t)
    steady = {"grad_step_ms": min(ts) * 1e3, "grad_step_median_ms": sorted(ts)[len(ts) // 2] * 1e3}
ev = lambda k: sum(v for e, v in dur.items() if e.endswith(k))
rec = {"first_call_s": t_load + t_call, "load_s": t_load, "call_s": t_call,
       "trace_s": ev("jaxpr_trace_duration"), "lower_s": ev("jaxpr_to_mlir_module_duration"),
       "compile_s": ev("backend_compile_duration"), "import_s": t_import}
if kind.startswith("grad"):
    rec.update(steady)
if not kind.startswith("grad") and len(sys.argv) > 3 and sys.argv[3] == "tiers":
    # the run time of the tier the first call used, then of the optimised program (fbjax.executors.tiered)
    def best(n=5):
        ts = []
        for _ in range(n):
            t = time.perf_counter(); jax.block_until_ready(m(*xs)); ts.append(time.perf_counter() - t)
        return min(ts)
    ex = m.executor
    calls = [getattr(ex, k, None) for k in ("_cached_call", "call", "jitted_leaves", "jitted")]
    call = next((c for c in calls if getattr(c, "tier", None) is not None), None)
    rec["tier"] = getattr(call, "tier", None) or "plain"
    rec["first_tier_call_ms"] = best() * 1e3
    t3 = time.perf_counter()
    if hasattr(call, "wait"):
        call.wait()
    rec["optimised_wait_s"] = time.perf_counter() - t3
    rec["optimised_call_ms"] = best() * 1e3
print(json.dumps(rec))
"""


def hlo_by_family(path: str, grad: bool = False) -> tuple:
    """(total, Counter op name -> StableHLO ops, Counter op name -> nodes) of the
    lowered ``Model.apply`` program of ``path`` (the file's quantized mode:
    integer kernels), or with ``grad`` of ``jax.grad`` of the mean square of
    its outputs w.r.t. the params (the benchmark's grad step): each node's
    lowering runs under ``jax.named_scope`` so its StableHLO ops (backward
    ones included) carry the op's name in their locations; ``(none)`` counts
    ops outside every node (parameter casts, output tuples, the loss)."""
    import collections
    import dataclasses
    import re

    import jax
    import numpy as np

    from fbjax import loading
    from fbjax.lower.build import build
    from fbjax.lower.registry import LOWERINGS
    from fbjax.model import _needs_x64
    from fbjax.passes.quantization import rewrite_quantized

    class Scoped:
        def get(self, op_set, name):
            od = LOWERINGS.get(op_set, name)
            if od is None:
                return None
            fn = od.fn

            def scoped(ctx, *a, **k):
                with jax.named_scope(f"OP_{name}"):
                    return fn(ctx, *a, **k)
            return dataclasses.replace(od, fn=scoped)

        def __getattr__(self, k):
            return getattr(LOWERINGS, k)

    ir = loading.read(path)
    rewrite_quantized(ir, "exact", registry=LOWERINGS)
    prog = build(ir)
    prog.registry = Scoped()
    xs = [np.zeros([1 if d is None else d for d in v.shape], v.dtype) for v in ir.main_graph.inputs]
    def loss(p):
        outs = prog.apply(p, None, *xs)[0]
        return sum(jax.numpy.mean(jax.numpy.square(o.astype(np.float32))) for o in outs)

    with jax.enable_x64(_needs_x64(ir)):
        if grad:
            txt = jax.jit(jax.grad(loss)).lower(prog.params).as_text(debug_info=True)
        else:
            txt = jax.jit(prog.apply).lower(prog.params, None, *xs).as_text(debug_info=True)
    locs = {}
    for line in txt.splitlines():
        m = re.match(r"(#loc\d+) = loc\((.*)\)$", line.strip())
        if m:
            locs[m.group(1)] = m.group(2)

    # ops of a node's lowering: OP_<name>; a custom backward traced at
    # transpose time (fbjax.lower.depthwise_vjp) carries its own scope
    scope = r"OP_([A-Za-z0-9_.]+)|(depthwise_vjp_backward)"

    def family(ref, depth=0):
        v = locs.get(ref, "")
        m = re.search(scope, v)
        if m or depth > 8:
            return (m.group(1) or m.group(2)) if m else None
        for r in re.findall(r"#loc\d+", v):
            f = family(r, depth + 1)
            if f:
                return f
        return None

    count = collections.Counter()
    private = False
    for line in txt.splitlines():
        t = line.strip()
        if t.startswith("func.func"):
            private = t.startswith("func.func private")
        if t.startswith("#") or "stablehlo." not in t or " = " not in t:
            continue
        if private:  # a loop body or called function (shared by identical call sites): no node named
            count["(called functions)"] += 1
            continue
        m = re.search(scope, t)
        r = re.search(r"loc\((#loc\d+)\)\s*$", t)
        count[((m.group(1) or m.group(2)) if m else family(r.group(1)) if r else None) or "(none)"] += 1
    nodes = collections.Counter(n.op_name for n in ir.main_graph.nodes)
    return sum(count.values()), count, nodes


def hlo_table(paths, grad=False) -> str:
    lines = ["| model | nodes | StableHLO ops | ops/node | largest families (ops / nodes) |", "|---|---|---|---|---|"]
    for p in paths:
        total, count, nodes = hlo_by_family(p, grad)
        n = sum(nodes.values())
        top = ", ".join(f"{k} {v}/{nodes.get(k, 0)}" for k, v in count.most_common(4))
        lines.append(f"| {os.path.basename(p)[:-7]}{' (grad step)' if grad else ''} | {n} | {total} | {total / max(n, 1):.1f} | {top} |")
        print(lines[-1], flush=True)
    return "\n".join(lines)


def cases(only=None):
    out = []
    for p in sorted(glob.glob(os.path.join(SHARED, "*.tflite"))):
        out.append((os.path.basename(p)[:-7], p, "float", "call"))
    for p in sorted(glob.glob(os.path.join(ROOT, "tests/data/quant/models/*.tflite"))
                    + glob.glob(os.path.join(ROOT, "tests/data/quant_aeq/*.tflite"))):
        out.append((os.path.basename(p)[:-7], p, "quantized", "call"))
    hl = os.path.join(SHARED, "mediapipe_hand_landmark_lite.tflite")
    if os.path.exists(hl):
        out.append(("mediapipe_hand_landmark_lite (grad step)", hl, "grad", "grad"))
        # floors for comparison: the same step with every convolution a plain lax.conv_general_dilated
        # (what a hand-written JAX version of the network compiles; its steps are ~5x slower on CPU),
        # and that program at XLA's -O0
        out.append(("mediapipe_hand_landmark_lite (grad step, plain lax)", hl, "grad", "grad_plain"))
        out.append(("mediapipe_hand_landmark_lite (grad step, plain lax, -O0)", hl, "grad", "grad_plain_o0"))
    def hit(o, name):  # a substring, or the whole name when it ends with "$"
        return o[:-1] == name if o.endswith("$") else o in name
    return [c for c in out if not only or any(hit(o, c[0]) for o in only)]


def run_one(path, kind, timeout=600, tiered=None, root=ROOT):
    """One fresh process (empty caches) running fbjax from ``root``;
    ``tiered``: ``FBJAX_TIERED_COMPILE`` on/off (None: the environment's),
    with the tiers' run times recorded."""
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, FBJAX_CACHE_DIR=os.path.join(d, "jax"), PYTHONPATH=root)
        env.pop("FBJAX_NO_CACHE", None)
        env.pop("JAX_COMPILATION_CACHE_DIR", None)
        if tiered is not None:
            env["FBJAX_TIERED_COMPILE"] = "1" if tiered else "0"
        # cwd=root: `python -c` puts the working directory first on sys.path
        p = subprocess.run([sys.executable, "-c", _CHILD, os.path.abspath(path), kind, "tiers"], env=env,
                           capture_output=True, text=True, timeout=timeout, cwd=root)
    if p.returncode != 0:
        return {"error": p.stderr.strip()[-500:]}
    rec = json.loads(p.stdout.strip().splitlines()[-1])
    rec["fbjax_root"] = root
    return rec


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="*", help="substrings of model names (NAME$: that name only)")
    ap.add_argument("--repeat", type=int, default=1, help="fresh processes per model (the minimum is kept)")
    ap.add_argument("--json", help="write the records here")
    ap.add_argument("--md", help="write the markdown table here")
    ap.add_argument("--hlo", action="store_true", help="instead: StableHLO size per op family (in this process)")
    ap.add_argument("--compare", action="store_true",
                    help="each model with FBJAX_TIERED_COMPILE=0 and =1, alternating which runs first")
    ap.add_argument("--baseline", help="with --compare: the 'before' runs use fbjax from this checkout "
                    "(e.g. one of the main branch) instead of this tree with FBJAX_TIERED_COMPILE=0")
    a = ap.parse_args(argv)
    if a.hlo:
        sys.path.insert(0, ROOT)
        sel = cases(a.only)
        paths = [c[1] for c in sel if c[3] == "call"]
        grads = [c[1] for c in sel if c[3] == "grad"]
        print("| model | nodes | StableHLO ops | ops/node | largest families (ops / nodes) |\n|---|---|---|---|---|")
        md = hlo_table(paths) if paths else ""
        if grads:  # the grad step's program (forward and backward)
            md += ("\n" if md else "") + hlo_table(grads, grad=True)
        if a.md:
            with open(a.md, "w") as f:
                f.write(md + "\n")
        return
    rows = []
    with open("/proc/loadavg") as f:
        load0 = f.read().split()[0]
    def best(recs):
        ok = [r for r in recs if "error" not in r]
        return dict(min(ok, key=lambda r: r["first_call_s"]) if ok else recs[0])

    for i, (name, path, group, kind) in enumerate(cases(a.only)):
        if a.compare:
            recs = {False: [], True: []}
            for j in range(a.repeat):
                for t in ((False, True) if (i + j) % 2 == 0 else (True, False)):
                    if t or not a.baseline:
                        recs[t].append(run_one(path, kind, tiered=t))
                    else:
                        recs[t].append(run_one(path, kind, root=os.path.abspath(a.baseline)))
            rec = best(recs[True])
            rec["untiered"] = best(recs[False])
        else:
            rec = best([run_one(path, kind) for _ in range(a.repeat)])
        rec.update(model=name, group=group)
        rows.append(rec)
        print(json.dumps(rec), flush=True)
    with open("/proc/loadavg") as f:
        load1 = f.read().split()[0]

    def ms(r, k):
        return f"{r[k]:.1f}" if k in r else ""

    if a.compare:
        before = "before" if a.baseline else "untiered"
        lines = [f"| model | group | first call s, {before} | first call s, tiered | first tier call ms | "
                 "optimised ready after s | optimised call ms | grad step ms, before / after |",
                 "|---|---|---|---|---|---|---|---|"]
    else:
        lines = ["| model | group | first call s | load s | trace s | lower s | XLA compile s | tier | "
                 "first tier call ms | optimised ready after s | optimised call ms |",
                 "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['group']} | error: {r['error'][-80:]} |")
            continue
        if a.compare:
            u = r["untiered"]
            old = f"{u['first_call_s']:.2f}" if "error" not in u else "error"
            lines.append(f"| {r['model']} | {r['group']} | {old} | {r['first_call_s']:.2f} | "
                         f"{ms(r, 'first_tier_call_ms')} | "
                         f"{r.get('optimised_wait_s', 0.0):.1f} | {ms(r, 'optimised_call_ms')} | "
                         f"{ms(u, 'grad_step_ms')} / {ms(r, 'grad_step_ms')} |")
            continue
        lines.append(f"| {r['model']} | {r['group']} | {r['first_call_s']:.2f} | {r['load_s']:.2f} | "
                     f"{r['trace_s']:.2f} | {r['lower_s']:.2f} | {r['compile_s']:.2f} | {r.get('tier', '')} | "
                     f"{ms(r, 'first_tier_call_ms')} | {r.get('optimised_wait_s', 0.0):.1f} | "
                     f"{ms(r, 'optimised_call_ms')} |")
    lines.append(f"\nload average {load0} -> {load1} (1 min); command: python benchmarks/compile_time.py"
                 + (" --compare" if a.compare else "") + (f" --baseline {a.baseline}" if a.baseline else "")
                 + (f" --only {' '.join(a.only)}" if a.only else "") + f" --repeat {a.repeat}")
    md = "\n".join(lines)
    print(md)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    if a.md:
        with open(a.md, "w") as f:
            f.write(md + "\n")


if __name__ == "__main__":
    main()
