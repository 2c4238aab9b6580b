"""A/B timing of fbjax's prepared inference program against the plain jitted
``Model.apply`` and the reference runtime, interleaved in one process.

    python benchmarks/ab.py [--runs 20] [--batch 32] [--only NAME ...] [--light NAME ...]

For each model: batch-1 latency of ``Model.__call__`` ("prepared": weights
relaid, constants computed ahead, values read twice materialized, see
:mod:`fbjax.executors.planner`), of ``jax.jit(Model.apply)`` ("apply", the
program before those preparations) and of LiteRT / onnxruntime (2 threads);
with ``--batch N``, the same for ``fbjax.load(path, batch_size=N)`` against N
times LiteRT's batch-1 time. Each round runs every variant once, in an order
that alternates, and the figures are the *minimum* over rounds: the machine
is shared, and the minimum is what is least affected by other processes
(medians are printed too). Results are also checked against the reference
runtime (max abs diff / max abs reference).
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SHARED = os.path.join(ROOT, "..", "shared", "models", "tflite")


def _tuple(y):
    return y if isinstance(y, (tuple, list)) else (y,)


def _rounds(fns: dict, runs: int) -> dict:
    ts = {k: [] for k in fns}
    items = list(fns.items())
    for r in range(runs):
        for k, f in (items if r % 2 else items[::-1]):
            t = time.perf_counter()
            f()
            ts[k].append(time.perf_counter() - t)
    return ts


def _fmt(ts: dict, scale: float = 1e3) -> str:
    return " | ".join(f"{k} min {scale * min(v):.2f} med {scale * float(np.median(v)):.2f}" for k, v in ts.items())


def ab_model(path: str, *, runs: int, batch: int, light: bool = False) -> dict:
    import jax

    import fbjax
    from fbjax import bench

    block = jax.block_until_ready
    if light:
        import onnx

        om = onnx.load(bench.light_onnx_path(path))
        soft = [n for n in om.graph.node if n.op_type == "Softmax"]
        if soft:  # compare the logits (see benchmarks/README.md)
            om.graph.output.append(onnx.helper.make_tensor_value_info(soft[-1].input[0], onnx.TensorProto.FLOAT, None))
        tmp = tempfile.mkdtemp(prefix="fbjax-ab-")
        onnx_path = os.path.join(tmp, "m.onnx")
        onnx.save(om, onnx_path)
        m = fbjax.load(bench._onnx_to_rten(om))
        other = bench._ORT(onnx_path, 2, [s.name for s in m.inputs])
        check = [len(om.graph.output) - 1] if soft else None
        name = path
    else:
        m = fbjax.load(path)
        other = bench._LiteRT(path, 2)
        check = None
        name = os.path.splitext(os.path.basename(path))[0]
    xs = bench._inputs(m.inputs)
    plain = jax.jit(m.apply, compiler_options=fbjax.cache.compiler_options())
    ys, yp, ref = _tuple(block(m(*xs))), _tuple(block(plain(m.params, *xs))), list(other(*xs))
    if check is not None:
        ys, yp, ref = [ys[i] for i in check], [yp[i] for i in check], [ref[i] for i in check]
    rec = {"model": name, "err_prepared": bench._rel_err(ys, ref), "err_apply": bench._rel_err(yp, ref)}
    ts = _rounds({"prepared": lambda: block(m(*xs)), "apply": lambda: block(plain(m.params, *xs)),
                  "other": lambda: other(*xs)}, runs)
    rec["b1_ms"] = {k: 1e3 * min(v) for k, v in ts.items()}
    rec["b1_ratio"] = {k: min(ts[k]) / min(ts["other"]) for k in ("prepared", "apply")}
    print(f"{name} b1: {_fmt(ts)} | ratio prepared {rec['b1_ratio']['prepared']:.2f} apply "
          f"{rec['b1_ratio']['apply']:.2f} | err {rec['err_prepared']:.1e} / {rec['err_apply']:.1e}", flush=True)
    if batch > 1 and not light:
        mb = fbjax.load(path, batch_size=batch)
        xb = bench._inputs(m.inputs, batch=batch, seed=1)
        plain_b = jax.jit(mb.apply, compiler_options=fbjax.cache.compiler_options())
        block(mb(*xb)), block(plain_b(mb.params, *xb))
        tb = _rounds({"prepared": lambda: block(mb(*xb)), "apply": lambda: block(plain_b(mb.params, *xb))},
                     max(3, runs // 4))
        other_b = batch * min(ts["other"])
        rec["b%d_ms" % batch] = {k: 1e3 * min(v) for k, v in tb.items()}
        rec["throughput_ratio"] = {k: other_b / min(v) for k, v in tb.items()}
        print(f"{name} b{batch}: {_fmt(tb)} | other {1e3 * other_b:.1f} (32 x b1 min) | throughput ratio "
              f"prepared {rec['throughput_ratio']['prepared']:.2f} apply {rec['throughput_ratio']['apply']:.2f}",
              flush=True)
    return rec


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--batch", type=int, default=0)
    p.add_argument("--only", nargs="*", help="substrings of .tflite model names")
    p.add_argument("--light", nargs="*", default=[], help="onnx light model names (vs onnxruntime)")
    args = p.parse_args(argv)
    from fbjax.bench import geomean

    models = sorted(glob.glob(os.path.join(SHARED, "*.tflite")))
    if args.only is not None:
        models = [m for m in models if any(s in m for s in args.only)]
    recs = [ab_model(m, runs=args.runs, batch=args.batch) for m in models]
    recs += [ab_model(n, runs=args.runs, batch=0, light=True) for n in args.light]
    for group, sel in (("tflite", [r for r in recs if r["model"] not in args.light]),
                       ("light", [r for r in recs if r["model"] in args.light])):
        if not sel:
            continue
        b1 = {v: geomean(r["b1_ratio"][v] for r in sel) for v in ("prepared", "apply")}
        line = f"geomean {group} ({len(sel)}): b1 ratio prepared {b1['prepared']:.2f} apply {b1['apply']:.2f}"
        thr = [r["throughput_ratio"] for r in sel if "throughput_ratio" in r]
        if thr:
            line += (f"; throughput ratio prepared {geomean(t['prepared'] for t in thr):.2f}"
                     f" apply {geomean(t['apply'] for t in thr):.2f}")
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
