"""The blockwise int4 FULLY_CONNECTED of a SmolLM2-135M-shaped decode step, kernel level, two routes in one process.

    python benchmarks/int4_kernel.py [--rows 1 8 128] [--repeats 5]

Routes (both give the same bits; checked here on every shape):

* ``xla+block_fc``: the route before ``fbjax_block_fc_f32``: XLA ops quantize the input row
  (:func:`fbjax.lower.tflite_int.hybrid.asymmetric_quantize`), ``fbjax_block_fc`` sums the blocks
  (AVX2 ``vpmaddwd``), XLA ops scale the outputs;
* ``block_fc_f32``: the whole of it in ``fbjax_block_fc_f32`` (AVX-512 VNNI path where the CPU has it).

Figures, per number of input rows ``R`` (1: decode; 8: a batch of 8 decoding; 128: a prefill):

* per shape (``576->960`` fused Q/K/V, ``576->576`` attention output, ``576->3072`` fused gate/up,
  ``1536->576`` down, ``576->49152`` LM head): microseconds per call, from one jit of 20 chained calls on
  the same weights (in cache after the first), and the weight + scale bytes per microsecond;
* ``token``: one decode step's 121 products with distinct weights (30 layers x 4 + the LM head: 67 MB of
  int4 weights and 17 MB of float32 scales, more than the caches hold), one jit: the time of a token's
  matrix products, the best of ``--repeats`` runs of 5.
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from fbjax.lower import cpu_kernels
from fbjax.lower.tflite_int import hybrid

SHAPES = [(576, 960, 30), (576, 576, 30), (576, 3072, 30), (1536, 576, 30), (576, 49152, 1)]  # (I, O, per token)
BS = 32


def old_route(x, w, s):
    """The previous lowering's operations (hybrid._fc_blockwise before fbjax_block_fc_f32), bias left out."""
    q, sc, z = hybrid.asymmetric_quantize(x)
    out, kf = cpu_kernels.block_fc(q.reshape(x.shape[0], w.shape[1], BS), w, s)
    out = out - hybrid._rounded(z.astype(jnp.float32)[:, None] * kf[None, :])  # its FMA-proof rounding
    return hybrid._rounded(out * sc[:, None])


def new_route(x, w, s):
    return cpu_kernels.block_fc_f32(x, w, s)


def chained(f, n=20):
    def g(x, w, s):
        for _ in range(n):
            y = f(x, w, s)
            x = x + 1e-30 * y[0, 0]  # a data dependence: the calls run one after the other
        return x
    return jax.jit(g)


def best_of(f, args, runs):
    jax.block_until_ready(f(*args))
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        jax.block_until_ready(f(*args))
        ts.append(time.perf_counter() - t)
    return min(ts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 128])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    assert cpu_kernels.available(), cpu_kernels._state["why"]
    rng = np.random.default_rng(0)
    print(f"load average {os.getloadavg()[0]:.2f}; {os.cpu_count()} CPUs")
    for r in args.rows:
        print(f"R = {r}")
        for i, o, _ in SHAPES:
            w = jnp.asarray(rng.integers(-8, 8, (o, i // BS, BS)).astype(np.int8)).astype(jnp.int4)
            s = jnp.asarray(rng.random((o, i // BS)).astype(np.float32) * 0.01)
            x = jnp.asarray(rng.standard_normal((r, i)).astype(np.float32))
            a, b = jax.jit(old_route)(x, w, s), jax.jit(new_route)(x, w, s)
            assert np.array_equal(np.asarray(a).view(np.int32), np.asarray(b).view(np.int32)), (r, i, o)
            n = 20 if r * o < 2e5 else 4
            t_old = best_of(chained(old_route, n), (x, w, s), args.repeats) / n
            t_new = best_of(chained(new_route, n), (x, w, s), args.repeats) / n
            mb = o * i * (0.5 + 4 / BS) / 1e6
            print(f"  {i}->{o}: xla+block_fc {t_old * 1e6:9.1f} us  block_fc_f32 {t_new * 1e6:9.1f} us  "
                  f"({t_old / t_new:.2f}x; {mb / t_new / 1e3:.1f} GB/s)")
        ws = [(jnp.asarray(rng.integers(-8, 8, (o, i // BS, BS)).astype(np.int8)).astype(jnp.int4),
               jnp.asarray(rng.random((o, i // BS)).astype(np.float32) * 0.01))
              for layer in range(30) for i, o, per in SHAPES if per == 30 or layer == 0]
        xs = {i: jnp.asarray(rng.standard_normal((r, i)).astype(np.float32)) for i in (576, 1536)}
        nbytes = sum(w.size // 2 + s.size * 4 for w, s in ws)
        for name, f in (("xla+block_fc", old_route), ("block_fc_f32", new_route)):
            @jax.jit
            def token(xs, ws, f=f):
                acc = jnp.float32(0)
                for w, s in ws:
                    acc = acc + f(xs[w.shape[1] * BS] + acc * 1e-30, w, s)[0, 0]
                return acc
            t = min(best_of(token, (xs, ws), 5) for _ in range(args.repeats))
            print(f"  token ({nbytes / 1e6:.0f} MB, distinct weights), {name}: {t * 1e3:.2f} ms "
                  f"({nbytes / t / 1e9:.1f} GB/s)")


if __name__ == "__main__":
    main()
