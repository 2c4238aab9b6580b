"""A/B of fbjax's native CPU attention kernel against XLA's attention, interleaved in one process.

    python benchmarks/attention_ab.py BUNDLE.litertlm [--batches 1,8] [--rounds 7] [--steps 8]

Loads the LLM bundle twice (layer scan on, the default), with ``KernelOptions(native_attention=True)``
and ``False``, and times per batch size: one prefill call (``n`` tokens, the prefill signature's
length) and a decode step (mean of ``--steps`` steps at positions 130..), each round running both
variants in turn. Prints the median and the minimum over rounds of each, and their ratio (XLA /
native; above 1: the kernel is faster). The machine is shared: the minimum is the figure least
affected by other processes. Set ``FBJAX_NO_CACHE=1`` to time freshly traced programs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402

import fbjax  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=8)
    a = ap.parse_args(argv)
    bundles = {na: fbjax.load(a.bundle, kernel_options=fbjax.KernelOptions(native_attention=na)) for na in (True, False)}
    for batch in (int(x) for x in a.batches.split(",")):
        state = {}
        for na, b in bundles.items():
            r = b._runner
            kv = r.prefill(b.params, r.zeros(batch), np.ones((batch, r.n), np.int32), np.zeros(batch, np.int32))
            state[na] = kv

        def prefill(na):
            b = bundles[na]
            r = b._runner
            t = time.perf_counter()
            kv = r.prefill(b.params, state[na], np.ones((batch, r.n), np.int32), np.zeros(batch, np.int32))
            jax.block_until_ready(kv)
            state[na] = kv
            return time.perf_counter() - t

        def decode(na):
            b = bundles[na]
            r = b._runner
            kv = state[na]
            t = time.perf_counter()
            for i in range(a.steps):
                _, _, kv = r.decode_rows(b.params, kv, np.full(batch, 5, np.int32), np.full(batch, 130 + i, np.int32))
            jax.block_until_ready(kv)
            state[na] = kv
            return (time.perf_counter() - t) / a.steps

        for f in (prefill, decode):  # compile and warm both
            f(True), f(False)
        res = {(f.__name__, na): [] for f in (prefill, decode) for na in (True, False)}
        for rnd in range(a.rounds):
            for f in (prefill, decode):
                for na in ((True, False) if rnd % 2 == 0 else (False, True)):
                    res[(f.__name__, na)].append(f(na))
        for name in ("prefill", "decode"):
            n, x = np.array(res[(name, True)]) * 1e3, np.array(res[(name, False)]) * 1e3
            print(f"batch {batch} {name}: native median {np.median(n):.1f} ms (min {n.min():.1f}); "
                  f"xla median {np.median(x):.1f} ms (min {x.min():.1f}); xla/native median "
                  f"{np.median(x) / np.median(n):.2f}, min {x.min() / n.min():.2f}", flush=True)


if __name__ == "__main__":
    main()
