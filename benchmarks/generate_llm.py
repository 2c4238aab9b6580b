"""Decode tokens/s: fbjax.generate against LiteRT's decode runner in a Python loop, side by side.

    python benchmarks/generate_llm.py [MODEL.tflite ...] [--batch 1,8] [--steps 64]

Default models: the litert-torch fixtures ``tests/data/llm/{llama,gemma}_f32.tflite``.

* fbjax: ``fbjax.generate`` (prefill, then a jitted ``lax.scan`` of decode
  steps) after a warm-up call; decode tokens/s is measured as
  ``B * (S2 - S1) / (t(S2) - t(S1))`` from two runs of ``S1 = steps / 4``
  and ``S2 = steps`` new tokens, so the prefill's cost cancels out.
* LiteRT: ``Interpreter.get_signature_runner("decode")`` called once per
  token from Python (the KV cache passed in and out as numpy arrays, greedy
  argmax), the way the Python API drives it, default op resolver (XNNPACK)
  and the builtin kernels without it; one row (its decode signature has
  batch 1), so its tokens/s is that of batch 1.

Prints one table; run it on an otherwise idle machine (the figures are
wall-clock).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT = [os.path.join(HERE, "..", "tests", "data", "llm", f"{a}_f32.tflite") for a in ("llama", "gemma")]


def _best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def fbjax_decode_tps(path: str, batch: int, steps: int, repeat: int) -> tuple[float, float]:
    """(decode tokens/s, first-call seconds) of fbjax.generate with ``batch`` prompts."""
    import fbjax

    model = fbjax.load(path)
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(0, 200, 6)) for _ in range(batch)]
    s1 = max(1, steps // 4)
    t = time.perf_counter()
    fbjax.generate(model, prompts, steps)
    first = time.perf_counter() - t
    fbjax.generate(model, prompts, s1)
    t2 = _best(lambda: fbjax.generate(model, prompts, steps), repeat)
    t1 = _best(lambda: fbjax.generate(model, prompts, s1), repeat)
    return batch * (steps - s1) / max(t2 - t1, 1e-9), first


def litert_decode_tps(path: str, steps: int, repeat: int, builtin: bool) -> float:
    from ai_edge_litert import interpreter as litert

    kw = {"experimental_op_resolver_type": litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES} if builtin else {}
    interp = litert.Interpreter(model_path=path, **kw)
    dec = interp.get_signature_runner("decode")
    det = dec.get_input_details()
    kv0 = {k: np.zeros(d["shape"], d["dtype"]) for k, d in det.items() if k.startswith("kv_cache_")}
    kv_len = max(max(d["shape"]) for k, d in det.items() if k.startswith("kv_cache_"))

    def run():
        kv, tok = dict(kv0), 1
        for p in range(steps):
            ins = dict(kv, tokens=np.array([[tok]], np.int32), input_pos=np.array([p], np.int32))
            if "mask" in det:
                ins["mask"] = np.where(np.arange(kv_len) <= p, 0.0, -np.inf).astype(np.float32).reshape(
                    det["mask"]["shape"])
            out = dec(**ins)
            kv = {k: out[k] for k in kv}
            tok = int(np.argmax(out["logits"].reshape(-1)))

    run()
    return steps / _best(run, repeat)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", default=DEFAULT)
    ap.add_argument("--batch", default="1,8", help="comma-separated batch sizes for fbjax (default 1,8)")
    ap.add_argument("--steps", type=int, default=48, help="decode steps (<= the KV cache minus the prompt)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    import jax

    batches = [int(b) for b in args.batch.split(",")]
    print(f"backend {jax.default_backend()} ({jax.devices()[0].device_kind}), {os.cpu_count()} CPUs, "
          f"{args.steps} decode steps, best of {args.repeat}")
    print(f"| model | runner | batch | decode tokens/s | first call (s) |\n|---|---|---|---|---|")
    for path in args.models:
        name = os.path.basename(path)
        for b in batches:
            tps, first = fbjax_decode_tps(path, b, args.steps, args.repeat)
            print(f"| {name} | fbjax.generate | {b} | {tps:.0f} | {first:.1f} |", flush=True)
        for builtin in (False, True):
            tps = litert_decode_tps(path, args.steps, args.repeat, builtin)
            label = "LiteRT decode runner, Python loop" + (" (builtin kernels)" if builtin else " (XNNPACK)")
            print(f"| {name} | {label} | 1 | {tps:.0f} | |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
