"""Realistic-size LLM bundles: fbjax and the LiteRT-LM runtime side by side, each measurement its own process.

    python benchmarks/llm_realsize.py BUNDLE [BUNDLE ...] [--new-tokens 128] [--prompt-tokens 64]
                                      [--runtime-python /work/genenv-llm/bin/python] [--json OUT]

The bundles come from ``benchmarks/make_llm_bundles.py`` (random seeded
weights in a public architecture's shape; not committed). Per bundle, each
row below is a separate process run under ``/usr/bin/time -v`` (peak RSS:
its "Maximum resident set size"), so that one measurement's compiled
programs, caches and allocations do not reach another's:

* ``fbjax cold``: ``fbjax.load`` then the first generation with an empty
  compilation cache (``FBJAX_CACHE_DIR`` a fresh directory): load seconds,
  first-call seconds (the first token of a ``--prompt-tokens`` prompt: trace,
  compile and run of prefill and one decode step);
* ``fbjax warm``: the same in a second process on that now filled cache
  (what a user's second run costs), then, warmed up: time to first token
  (``TTFT``: prefill of the prompt and the first decode step, token ids in,
  the first id out), decode tokens/s over ``--new-tokens`` new tokens at
  batch 1 (``(n - 1) / (t_last - t_first)`` between the first and the last
  token's arrival), and a batch of 8 prompts of different lengths (the
  prompt's 64, 56, ..., 8 tokens) in one ``LlmBundle.generate``: total new
  tokens / seconds, prefill included (against batch 1's ``total_s``: the
  prompt's TTFT and all its new tokens, the same measure);
* ``fbjax b1``: a third process on the warm cache doing only what the
  runtime's process does (load, one prompt, batch 1): its peak RSS is the
  one to hold against the runtime's (batch 8 holds 8 KV caches);
* ``runtime``: ``benchmarks/llm_runtime_side.py`` run by ``--runtime-python``
  (the generator environment with ``litert-lm-api``): the same figures for
  the LiteRT-LM runtime (CPU backend), whose Python API has no batch.
  Its decode rate two ways: ``decode_tps`` from the streamed pieces'
  arrival (as fbjax's), and ``runtime_decode_tps``, the runtime's own
  counter (``Session.get_benchmark_info``). They differ where the first
  piece arrives late (its ``ttft_s`` well above its own
  ``runtime_ttft_s``) and the rest in a burst; ``total_s`` (prefill call to
  the last piece) says which one the wall clock agrees with.

The prompt is token ids (a seeded draw below the vocabulary's size, the start
token first), fed to fbjax through the session's token path so that both
sides see the same ids; stop tokens are not honoured on the fbjax side (the
decode loop runs all ``--new-tokens`` steps). Prints a markdown table and
writes the JSON (default ``benchmarks/llm_realsize_results.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _prompt(vocab: int, n: int, start) -> list:
    import numpy as np

    ids = [int(t) for t in np.random.default_rng(0).integers(min(300, vocab // 4), min(vocab, 30000), n)]
    return ([int(start)] + ids[:n - 1]) if start is not None else ids


def _child(path: str, mode: str, prompt_tokens: int, new_tokens: int, repeats: int = 3) -> dict:
    """One measurement process (see the module docstring); returns its figures."""
    t0 = time.perf_counter()
    import numpy as np

    import fbjax

    t_import = time.perf_counter() - t0
    t = time.perf_counter()
    b = fbjax.load(path)
    out = {"import_s": t_import, "load_s": time.perf_counter() - t}
    prompt = _prompt(b.vocab_size, prompt_tokens, b.start_token)
    runner = b._runner

    def first_token(ids, limit):
        s = b.session(top_k=1)
        it = s._decode_rows([ids], None)
        t = time.perf_counter()
        first = next(it)
        stamps = [time.perf_counter()]
        for _ in range(limit - 1):
            next(it)
            stamps.append(time.perf_counter())
        return stamps[0] - t, stamps, first

    t = time.perf_counter()
    ttft, _, _ = first_token(prompt, 1)
    out["first_call_s"] = time.perf_counter() - t
    if mode == "cold":
        return out
    ttfts, tps, totals = [], [], []
    for _ in range(repeats):
        ttft, stamps, _ = first_token(prompt, new_tokens)
        ttfts.append(ttft)
        tps.append((len(stamps) - 1) / (stamps[-1] - stamps[0]))
        totals.append(ttft + stamps[-1] - stamps[0])
    out["ttft_s"] = float(np.median(ttfts))
    out["decode_tps_batch1"] = float(np.median(tps))
    out["total_s"] = float(np.median(totals))  # the prompt's prefill and every new token: batch 8's measure
    if mode == "b1":  # the runtime's work only (one prompt, batch 1): its peak RSS is the comparable one
        return out
    rows = [prompt[:max(2, prompt_tokens - 8 * i)] for i in range(8)]

    def batch():
        s = b.session(top_k=1)
        it = s._decode_rows(rows, None)
        t = time.perf_counter()
        for _ in range(new_tokens):
            next(it)
        return time.perf_counter() - t

    batch()  # compiles the batch-8 programs
    secs = float(np.median([batch() for _ in range(repeats)]))
    out["batch8_tps"] = 8 * new_tokens / secs
    out["batch8_s"] = secs
    out["capacity"] = runner.capacity
    # the weight bytes one decode step reads: every buffer and param the decode graph's FULLY_CONNECTED
    # nodes take (the embedding table gives one row per token: not counted)
    prog = b.model.program
    g = b.model.ir.graphs[runner.dec.graph_index]
    names = {prog.buffer_of.get(id(v)) or prog.param_of.get(id(v)) for n in g.nodes if n.op_name == "FULLY_CONNECTED"
             for v in n.inputs[1:] if v is not None}

    def stored_bytes(x):  # int4 buffers hold two values per byte (their .nbytes counts one byte per value)
        return x.size // 2 if "int4" in str(x.dtype) else x.nbytes

    out["weight_bytes_per_token"] = int(sum(stored_bytes(b.model.buffers[k]) if k in b.model.buffers else
                                            b.model.params[k].nbytes for k in names if k is not None))
    return out


def bandwidth_gbs(gib: float = 1.0, repeats: int = 5) -> float:
    """This machine's read bandwidth: the best of ``repeats`` numpy sums over ``gib`` GiB (int64 view)."""
    import numpy as np

    a = np.ones(int(gib * 2 ** 30) // 8, np.int64)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a.sum()
        best = min(best, time.perf_counter() - t)
    return a.nbytes / best / 1e9


def _timed(cmd: list, env: dict) -> tuple[dict, float]:
    """Run ``cmd`` under ``/usr/bin/time -v``; its last stdout line is JSON. Returns (figures, peak RSS MB)."""
    p = subprocess.run(["/usr/bin/time", "-v"] + cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
    rss = float(re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr).group(1)) / 1024
    return json.loads(p.stdout.strip().splitlines()[-1]), rss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bundles", nargs="*")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per figure (the median is reported)")
    ap.add_argument("--runtime-python", default="/work/genenv-llm/bin/python",
                    help="a Python with litert-lm-api (skipped if absent)")
    ap.add_argument("--json", default=os.path.join(HERE, "llm_realsize_results.json"))
    ap.add_argument("--child", choices=("cold", "warm", "b1"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(args.bundles[0], args.child, args.prompt_tokens, args.new_tokens, args.repeats)))
        return
    rows = []
    bw = bandwidth_gbs()
    print(f"read bandwidth (numpy sum over 1 GiB): {bw:.1f} GB/s", flush=True)
    for path in args.bundles:
        row = {"bundle": os.path.basename(path), "size_mb": os.path.getsize(path) / 2 ** 20,
               "load_average_before": os.getloadavg()}
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, FBJAX_CACHE_DIR=cache, PYTHONPATH=ROOT)
            for mode in ("cold", "warm", "b1"):
                figs, rss = _timed([sys.executable, __file__, path, "--child", mode, "--new-tokens",
                                    str(args.new_tokens), "--prompt-tokens", str(args.prompt_tokens),
                                    "--repeats", str(args.repeats)], env)
                row[f"fbjax_{mode}"] = dict(figs, peak_rss_mb=rss)
                print(mode, json.dumps(row[f"fbjax_{mode}"]), flush=True)
        side = os.path.join(HERE, "llm_runtime_side.py")
        if os.path.exists(args.runtime_python) and os.path.exists(side):
            figs, rss = _timed([args.runtime_python, side, path, "--new-tokens", str(args.new_tokens),
                                "--prompt-tokens", str(args.prompt_tokens), "--repeat", "2"], dict(os.environ))
            row["runtime"] = dict(figs, peak_rss_mb=rss)
            print("runtime", json.dumps(row["runtime"]), flush=True)
        row["load_average_after"] = os.getloadavg()
        w = row["fbjax_warm"]
        row["decode_bandwidth_limit_tps"] = bw * 1e9 / w["weight_bytes_per_token"]
        row["fbjax_fraction_of_limit"] = w["decode_tps_batch1"] / row["decode_bandwidth_limit_tps"]
        if "runtime" in row and "decode_tps" in row["runtime"]:
            row["runtime_fraction_of_limit"] = row["runtime"]["decode_tps"] / row["decode_bandwidth_limit_tps"]
        rows.append(row)
    res = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
           "read_bandwidth_gbs": bw,
           "command": "python benchmarks/llm_realsize.py " + " ".join(sys.argv[1:]), "rows": rows}
    with open(args.json, "w") as f:
        json.dump(res, f, indent=1)
    print("| bundle | side | load s | first call s (cold / warm) | TTFT s | decode tok/s b1 | prompt + new tokens s "
          "| batch 8 tok/s (x batch 1's total) | peak RSS MB (b1 / cold / with batch 8) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        c, w, one = r["fbjax_cold"], r["fbjax_warm"], r["fbjax_b1"]
        b1_tps = args.new_tokens / w["total_s"]
        print(f"| {r['bundle']} | fbjax | {w['load_s']:.2f} | {c['first_call_s']:.1f} / {w['first_call_s']:.2f} | "
              f"{w['ttft_s']:.3f} | {w['decode_tps_batch1']:.1f} | {w['total_s']:.2f} | "
              f"{w['batch8_tps']:.1f} ({w['batch8_tps'] / b1_tps:.2f}x) | "
              f"{one['peak_rss_mb']:.0f} / {c['peak_rss_mb']:.0f} / {w['peak_rss_mb']:.0f} |")
        if "runtime" in r:
            rt = r["runtime"]
            warm = rt.get("warm") or {}
            nan = float("nan")
            print(f"| {r['bundle']} | runtime | {rt.get('load_s', nan):.2f} | - | "
                  f"{rt.get('ttft_s', nan):.3f} (own counter {rt.get('runtime_ttft_s', nan):.3f}; warm "
                  f"{warm.get('ttft_s', nan):.3f}) | {rt.get('decode_tps', nan):.1f} (own counter "
                  f"{rt.get('runtime_decode_tps', nan):.1f}; warm {warm.get('decode_tps', nan):.1f} / "
                  f"{warm.get('runtime_decode_tps', nan):.1f}) | {rt.get('total_s', nan):.2f} (warm "
                  f"{warm.get('total_s', nan):.2f}) | - | {rt['peak_rss_mb']:.0f} |")

if __name__ == "__main__":
    main()
