"""The routes an int8 matrix-vector product can take on XLA:CPU, side by side (issue 34 item 3).

    python benchmarks/int_matmul_routes.py [--rows 1] [--repeats 20]

For the shapes of a SmolLM2-135M-shaped LLM (an MLP matrix 1536 x 576 and
the LM head 49152 x 576, int8 weights, int8-range activations) each route
is jitted and timed in this one process (best of ``--repeats`` calls); the
GB/s column is the int8 weight bytes over that time. Every route's int32
result is checked equal to the first's (integer sums: exact in any order;
the float routes are exact here because every partial sum stays below
2**24). Routes:

* ``native``: fbjax's CPU kernel (:mod:`fbjax.lower.cpu_kernels`), the default;
* ``fused reduce``: the hybrid kernels' XLA form before it (a chunked
  multiply-reduce, weight rows in blocks for large matrices);
* ``int8 dot``: ``dot_general`` int8 x int8 -> int32, with XLA's YNNPACK
  fusion off (fbjax's default) and on (XLA's default), and with the
  oneDNN and XNNPACK library-fusion flags this jaxlib has;
* ``f32 dot``: weights converted to float32 inside the program, then a
  float dot; ``bf16 dot``: the same in bfloat16.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a clone
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

from fbjax.lower import cpu_kernels  # noqa: E402
from fbjax.lower.tflite_int import hybrid  # noqa: E402

NO_YNN = {"xla_cpu_experimental_ynn_fusion_type": ""}
FLAGS = {
    "YNNPACK fusion off (fbjax's default)": NO_YNN,
    "XLA's defaults": None,
    "ynn_fusion_type=DOT": {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"},
    "onednn_fusion_type=DOT": {"xla_cpu_experimental_onednn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"},
    "xnn_fusion_type=DOT": {"xla_cpu_experimental_xnn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"},
    "use_onednn": {"xla_cpu_use_onednn": True},
}


def _dot(q, w, dtype):
    return lax.dot_general(q.astype(dtype), w.astype(dtype), (((1,), (1,)), ((), ())),
                           preferred_element_type=jnp.int32 if dtype == jnp.int8 else jnp.float32).astype(jnp.int32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1, help="activation rows (1: a decode step at batch 1)")
    ap.add_argument("--repeats", type=int, default=20, help="timed calls per route (the best is reported)")
    a = ap.parse_args()
    if not cpu_kernels.available():
        sys.exit("the native kernels did not build; see the warning above")
    rng = np.random.default_rng(0)
    for o, i in [(1536, 576), (49152, 576)]:
        w = jnp.asarray(rng.integers(-127, 128, (o, i), dtype=np.int8))
        q = jnp.asarray(rng.integers(-128, 128, (a.rows, i)).astype(np.int32))
        z = jnp.zeros((a.rows,), jnp.int32)
        routes = [("native", lambda q, z, w: hybrid._int_matmul_native(q, z, w), NO_YNN),
                  ("fused reduce", lambda q, z, w: hybrid._int_matmul(q, z, w), NO_YNN)]
        routes += [(f"int8 dot, {k}", lambda q, z, w: _dot(q, w, jnp.int8), v) for k, v in FLAGS.items()]
        routes += [("f32 dot, YNNPACK fusion off", lambda q, z, w: _dot(q, w, jnp.float32), NO_YNN),
                   ("f32 dot, XLA's defaults", lambda q, z, w: _dot(q, w, jnp.float32), None),
                   ("bf16 dot, XLA's defaults", lambda q, z, w: _dot(q, w, jnp.bfloat16), None)]
        print(f"\n{o} x {i} int8 weights ({w.nbytes / 1e6:.1f} MB), {a.rows} row(s)")
        ref = None
        for name, fn, opts in routes:
            j = jax.jit(fn, compiler_options=opts)
            out = np.asarray(j(q, z, w))
            ref = out if ref is None else ref
            assert np.array_equal(out, ref), f"{name}: a different result"
            best = float("inf")
            for _ in range(a.repeats):
                t = time.perf_counter()
                j(q, z, w).block_until_ready()
                best = min(best, time.perf_counter() - t)
            print(f"  {name:44s} {best * 1e3:9.3f} ms  {w.nbytes / best / 1e9:6.2f} GB/s", flush=True)


if __name__ == "__main__":
    main()
