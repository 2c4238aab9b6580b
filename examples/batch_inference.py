"""Batch inference sharded over every available device, with throughput.

Loads a model stored with batch 1 as a batch-polymorphic function
(``fbjax.load(path, batch_size=None)``), runs a stream of examples through it
with ``fbjax.infer`` (a 1-D ``jax.sharding.Mesh`` over all devices, the batch
split with ``NamedSharding``, weights replicated, results streamed to an
``.npz``), checks a few results against one-at-a-time runs, and prints the
throughput after a warm-up (compilation excluded).

    python examples/batch_inference.py                      # all devices of the default backend
    python examples/batch_inference.py --host-devices 1,8   # CPU: 1 vs 8 forced host devices, side by side

``--host-devices`` re-runs this script once per count with
``XLA_FLAGS=--xla_force_host_platform_device_count=N`` (CPU only) and prints
a table; forced host devices share the machine's cores, so the speed-up is
bounded by the core count.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

try:  # a fresh clone without `pip install .`: use the repository's fbjax
    import fbjax  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(args) -> dict:
    import jax

    import fbjax
    from fbjax.data import DEFAULT_MODEL

    path = args.model or DEFAULT_MODEL
    model = fbjax.load(path, batch_size=None)
    shape = tuple(model.inputs[0].shape[1:])
    n_dev = len(jax.devices())
    batch = args.batch_size or 8 * n_dev
    rng = np.random.default_rng(0)
    # a stream of examples: generated lazily, never all in memory at once
    examples = (rng.random(shape, dtype=np.float32) for _ in range(args.n))
    print(f"model {os.path.basename(path)}: input {model.inputs[0]}; {n_dev} device(s) "
          f"({jax.default_backend()}), batch {batch}")

    warm = np.random.default_rng(1).random((batch, *shape), dtype=np.float32)
    t0 = time.perf_counter()
    fbjax.infer(model, warm, step_size=batch, progress=False)  # compile once
    t_compile = time.perf_counter() - t0

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.npz")
        t0 = time.perf_counter()
        fbjax.infer(model, examples, step_size=batch, out=out, progress=not args.no_progress)
        dt = time.perf_counter() - t0
        with np.load(out) as z:
            first = z[z.files[0]]
            assert first.shape[0] == args.n, first.shape
            # check: example 0 again, alone, with the batch-1 model
            x0 = np.random.default_rng(0).random(shape, dtype=np.float32)
            single = fbjax.load(path)(x0[None])
            single = single[0] if isinstance(single, tuple) else single
            err = float(np.max(np.abs(first[0] - np.asarray(single)[0])))
    res = {"devices": n_dev, "batch": batch, "examples": args.n, "seconds": dt,
           "throughput": args.n / dt, "compile_s": t_compile, "max_err_vs_single": err}
    print(f"{args.n} examples in {dt:.2f} s: {args.n / dt:.1f} examples/s on {n_dev} device(s) "
          f"(first call incl. compilation {t_compile:.1f} s; max |batched - single| {err:.2g})")
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="model file stored with batch 1 (default: the bundled selfie segmentation)")
    ap.add_argument("-n", type=int, default=128, help="number of examples (default 128)")
    ap.add_argument("--batch-size", type=int, help="examples per step (default 8 per device)")
    ap.add_argument("--host-devices", metavar="N,M,...",
                    help="CPU: run once per forced host-device count and compare")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--json", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if not args.host_devices:
        res = run(args)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f)
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in [int(c) for c in args.host_devices.split(",")]:
            env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={n}", JAX_PLATFORMS="cpu")
            j = os.path.join(tmp, f"{n}.json")
            cmd = [sys.executable, os.path.abspath(__file__), "-n", str(args.n), "--json", j, "--no-progress"]
            if args.model:
                cmd += ["--model", args.model]
            if args.batch_size:
                cmd += ["--batch-size", str(args.batch_size)]
            print(f"--- {n} forced host device(s)")
            subprocess.run(cmd, env=env, check=True)
            with open(j) as f:
                rows.append(json.load(f))
    print(f"\n{'devices':>8} {'batch':>6} {'examples/s':>11} {'speed-up':>9}")
    for r in rows:
        print(f"{r['devices']:>8} {r['batch']:>6} {r['throughput']:>11.1f} {r['throughput'] / rows[0]['throughput']:>8.2f}x")
    print(f"(machine: {os.cpu_count()} CPU cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
