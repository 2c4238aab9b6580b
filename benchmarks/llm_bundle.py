"""LLM bundles: decode tokens/s and time to first token, fbjax against the LiteRT-LM runtime, side by side.

    python benchmarks/llm_bundle.py [BUNDLE ...] [--repeat 11] [--json OUT]

Needs both fbjax and the runtime (``pip install litert-lm-api``, the generator
environment of tests/data/llm_bundles/generate.py with ``pip install -e .``).
Default bundles: the float fixtures ``tests/data/llm_bundles/{llama_sp,gemma_hf}.litertlm``
(random weights, 2 layers, width 128, 64-position KV cache), prompt
``"Hello there"`` without template, greedy, generation to the full KV cache
(58 new tokens).

* runtime: ``litert_lm.Engine(bundle, cache_dir=":nocache")`` (CPU backend,
  XNNPACK), a session per run, ``run_prefill([prompt])`` then
  ``run_decode_async()``: time to first token = until the first streamed
  piece, decode tokens/s = ``(pieces - 1) / (t_last - t_first)``. Its Python
  API runs one prompt per session: no batch.
* fbjax ``stream``: ``fbjax.load(bundle).stream(prompt)`` (one jitted decode
  step per token, stop tokens checked per token, text decoded per piece),
  after a warm-up run (load + the first call's compile time reported apart);
  the same two figures.
* fbjax batch: ``bundle.generate([prompt] * B)`` (one row per prompt, the
  same step loop under ``vmap``): ``B * new tokens / time`` (prefill included).

Figures are wall-clock medians of ``--repeat`` runs (11); the runtime and fbjax
stream runs alternate in one process, so background load hits both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "tests", "data", "llm_bundles")
DEFAULT = [os.path.join(DATA, n) for n in ("llama_sp.litertlm", "gemma_hf.litertlm")]
PROMPT = "Hello there"


def _stamps(gen, t0) -> dict:
    stamps = [time.perf_counter() for _ in gen]
    return {"ttft_s": stamps[0] - t0, "decode_tps": (len(stamps) - 1) / (stamps[-1] - stamps[0]),
            "tokens": len(stamps)}


def interleaved(path: str, repeat: int) -> tuple[dict, dict]:
    """Runtime and fbjax stream runs alternated (which goes first alternates too), so background load hits
    both alike; per side the median of each figure."""
    import litert_lm

    import fbjax

    greedy = litert_lm.SamplerConfig(top_k=1, top_p=1.0, temperature=1.0, seed=0)
    t = time.perf_counter()
    b = fbjax.load(path)
    list(b.stream(PROMPT, template=False))
    first_call = time.perf_counter() - t
    rt, fj = [], []
    with litert_lm.Engine(path, cache_dir=":nocache") as eng:
        def run_rt():
            with eng.create_session(apply_prompt_template=False, sampler_config=greedy) as s:
                t0 = time.perf_counter()
                s.run_prefill([PROMPT])
                return _stamps(s.run_decode_async(), t0)

        def run_fj():
            t0 = time.perf_counter()
            return _stamps(b.stream(PROMPT, template=False), t0)

        run_rt()  # warm-up
        for i in range(repeat):
            pair = (run_rt, run_fj) if i % 2 == 0 else (run_fj, run_rt)
            for fn in pair:
                (rt if fn is run_rt else fj).append(fn())
    med = lambda runs: {k: float(np.median([r[k] for r in runs])) for k in runs[0]}  # noqa: E731
    out_fj = med(fj)
    out_fj["load_and_first_call_s"] = first_call
    return med(rt), out_fj


def fbjax_batch(path: str, batch: int, repeat: int) -> dict:
    import fbjax

    b = fbjax.load(path)
    prompts = [PROMPT] * batch
    out = b.generate(prompts, template=False, return_tokens=True)  # warm-up (compiles the batch's programs)
    n = sum(len(g.tokens) for g in out)
    best = float(np.median([_time(lambda: b.generate(prompts, template=False)) for _ in range(repeat)]))
    return {"batch": batch, "tokens": n, "tps": n / best, "seconds": best}


def _time(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bundles", nargs="*", default=DEFAULT)
    ap.add_argument("--repeat", type=int, default=11)
    ap.add_argument("--json", default=os.path.join(HERE, "llm_bundle_results.json"))
    args = ap.parse_args()
    import jax

    rows = []
    for path in args.bundles:
        rt, fs = interleaved(path, args.repeat)
        b1 = fbjax_batch(path, 1, args.repeat)
        b8 = fbjax_batch(path, 8, args.repeat)
        rows.append({"bundle": os.path.basename(path), "runtime": rt, "fbjax_stream": fs, "fbjax_batch1": b1,
                     "fbjax_batch8": b8,
                     "ratio_decode_tps_fbjax_stream_over_runtime": fs["decode_tps"] / rt["decode_tps"],
                     "ratio_ttft_fbjax_over_runtime": fs["ttft_s"] / rt["ttft_s"],
                     "ratio_tps_fbjax_batch8_over_runtime": b8["tps"] / rt["decode_tps"]})
    from importlib.metadata import version

    res = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs (shared)",
           "jax_backend": jax.default_backend(), "jax": jax.__version__, "litert_lm": version("litert-lm-api"),
           "load_average": os.getloadavg(), "command": "python benchmarks/llm_bundle.py", "prompt": PROMPT,
           "rows": rows}
    json.dump(res, open(args.json, "w"), indent=1)
    print("| bundle | runtime decode tok/s | fbjax stream decode tok/s | ratio | runtime TTFT ms | fbjax TTFT ms "
          "| fbjax batch 1 tok/s | fbjax batch 8 tok/s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['bundle']} | {r['runtime']['decode_tps']:.0f} | {r['fbjax_stream']['decode_tps']:.0f} | "
              f"{r['ratio_decode_tps_fbjax_stream_over_runtime']:.2f} | {r['runtime']['ttft_s'] * 1e3:.1f} | "
              f"{r['fbjax_stream']['ttft_s'] * 1e3:.1f} | {r['fbjax_batch1']['tps']:.0f} | "
              f"{r['fbjax_batch8']['tps']:.0f} |")


if __name__ == "__main__":
    main()
