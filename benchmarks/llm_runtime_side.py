"""The LiteRT-LM runtime's side of the LLM bundle benchmark: load, time to first token, decode tokens/s, peak RSS.

    python benchmarks/llm_runtime_side.py BUNDLE [--threads 2] [--prompt-tokens 64] [--new-tokens 128]
        [--processes N] [--cache-dir :nocache] [--text OUT.json]

Needs only the runtime (``pip install litert-lm-api``; the generator environment of
``benchmarks/make_llm_bundles.py``), not fbjax, so the side-by-side benchmark can run it in a subprocess of
another interpreter. Prints one JSON object on stdout.

One measurement (default): in this process, ``litert_lm.Engine(BUNDLE, backend=Backend.CPU(thread_count=T),
cache_dir=...)`` (``load_s``: the constructor's wall time), then one session without the prompt template,
greedy (``SamplerConfig(top_k=1, top_p=1, temperature=1, seed=0)``), ``max_output_tokens=--new-tokens``:
``run_prefill([prompt])`` then ``run_decode_async()``; ``ttft_s`` = from the prefill call to the first streamed
piece, ``decode_tps`` = ``(pieces - 1) / (t_last - t_first)``. The runtime's own counters
(``enable_benchmark=True``, ``Session.get_benchmark_info``) come along: ``prefill_tokens`` (start token
included), ``decode_tokens``, its TTFT and tokens/s. ``peak_rss_mb``: ``getrusage(RUSAGE_SELF).ru_maxrss``
at the end (what ``/usr/bin/time -v`` reports as "Maximum resident set size"). ``--repeat R`` runs R more
sessions on the same engine (warm figures, ``warm``: their medians).

The prompt: the longest word prefix of :data:`TEXT` that ``engine.tokenize`` maps to at most
``--prompt-tokens`` tokens (``prompt`` and ``prompt_tokens`` in the output; the runtime adds the start token,
its ``prefill_tokens`` counts it).

``--processes N``: runs N such measurements, each its own process under ``/usr/bin/time -v`` (its peak RSS
parsed from there), and prints every run and the medians, with the load average before and after.

``--text OUT.json``: instead, records the runtime's greedy text for :data:`TEXT_PROMPTS` (no template,
``--text-tokens`` new tokens each, 32 by default): per prompt ``engine.tokenize(prompt)`` and the streamed
pieces (one per decode step; the Python API gives text, not token ids), and ``ids``: each piece's token id where
``engine.tokenize`` maps it back to one token that detokenizes to it (else null).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time

TEXT = ("The quick brown fox jumps over the lazy dog and then runs back home to the farm where the old man "
        "and his children study the story of a great river that goes down to the sea near the city on the "
        "north side of the country where many people live and work every day with their friends and family "
        "in small houses under the tree by the mountain road while the sun shines on the green field")
TEXT_PROMPTS = ["Hello there", "The quick brown fox jumps over the lazy dog",
                "Models run on phones and in the cloud, and people tune them for their own tasks every day."]


def _engine(bundle: str, threads: int, cache_dir: str, benchmark: bool):
    import litert_lm

    return litert_lm.Engine(bundle, backend=litert_lm.Backend.CPU(thread_count=threads), cache_dir=cache_dir,
                            enable_benchmark=benchmark)


def prompt_of(engine, n: int) -> tuple[str, int]:
    """The longest word prefix of TEXT with at most ``n`` tokens, and its token count."""
    words = TEXT.split()
    best = ("", 0)
    for k in range(1, len(words) + 1):
        text = " ".join(words[:k])
        m = len(engine.tokenize(text))
        if m > n:
            break
        best = (text, m)
    return best


def _greedy():
    import litert_lm

    return litert_lm.SamplerConfig(top_k=1, top_p=1.0, temperature=1.0, seed=0)


def one_session(engine, prompt: str, new_tokens: int) -> dict:
    with engine.create_session(apply_prompt_template=False, sampler_config=_greedy(),
                               max_output_tokens=new_tokens) as s:
        t0 = time.perf_counter()
        s.run_prefill([prompt])
        stamps, pieces = [], []
        for r in s.run_decode_async():
            stamps.append(time.perf_counter())
            pieces.append(r.texts[0])
        rec = {"ttft_s": stamps[0] - t0, "pieces": len(pieces),
               "decode_tps": (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else float("nan"),
               "total_s": stamps[-1] - t0}
        try:
            info = s.get_benchmark_info()
            rec.update(prefill_tokens=info.last_prefill_token_count, decode_tokens=info.last_decode_token_count,
                       runtime_ttft_s=info.time_to_first_token_in_second,
                       runtime_prefill_tps=info.last_prefill_tokens_per_second,
                       runtime_decode_tps=info.last_decode_tokens_per_second)
        except RuntimeError as e:  # benchmark info off or unavailable
            rec["benchmark_info_error"] = str(e)
        rec["text_head"] = "".join(pieces)[:120]
    return rec


def measure(args) -> dict:
    t = time.perf_counter()
    eng = _engine(args.bundle, args.threads, args.cache_dir, benchmark=True)
    load_s = time.perf_counter() - t
    with eng:
        prompt, n = prompt_of(eng, args.prompt_tokens)
        first = one_session(eng, prompt, args.new_tokens)
        warm = [one_session(eng, prompt, args.new_tokens) for _ in range(args.repeat)]
    out = {"bundle": args.bundle, "threads": args.threads, "cache_dir": args.cache_dir, "load_s": load_s,
           "prompt": prompt, "prompt_tokens": n, "new_tokens": args.new_tokens, **first,
           "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if warm:
        out["warm"] = {k: statistics.median(r[k] for r in warm)
                       for k in ("ttft_s", "decode_tps", "pieces", "total_s", "runtime_ttft_s", "runtime_decode_tps")
                       if all(k in r for r in warm)}
    return out


def processes(args) -> dict:
    """``args.processes`` runs of :func:`measure`, each its own process under ``/usr/bin/time -v``."""
    cmd = [sys.executable, os.path.abspath(__file__), args.bundle, "--threads", str(args.threads),
           "--prompt-tokens", str(args.prompt_tokens), "--new-tokens", str(args.new_tokens),
           "--cache-dir", args.cache_dir, "--repeat", str(args.repeat)]
    timed = os.path.exists("/usr/bin/time")
    runs, load_before = [], os.getloadavg()
    for _ in range(args.processes):
        p = subprocess.run((["/usr/bin/time", "-v"] if timed else []) + cmd, capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"runtime run failed ({p.returncode}):\n{p.stderr[-3000:]}")
        rec = json.loads(p.stdout.strip().splitlines()[-1])
        m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr)
        if m:
            rec["time_v_max_rss_mb"] = int(m.group(1)) / 1024
        rec["load_average"] = os.getloadavg()
        runs.append(rec)
    keys = ["load_s", "ttft_s", "decode_tps", "peak_rss_mb"] + (["time_v_max_rss_mb"] if timed else [])
    keys += [k for k in ("runtime_ttft_s", "runtime_decode_tps") if k in runs[0]]
    return {"bundle": args.bundle, "processes": args.processes, "load_average_before": load_before,
            "load_average_after": os.getloadavg(), "median": {k: statistics.median(r[k] for r in runs) for k in keys},
            "runs": runs}


def _piece_id(engine, piece: str):
    """The token id of one streamed piece where it is recoverable: ``engine.tokenize(piece)`` is one id that
    detokenizes back to the piece (byte-level BPE: distinct tokens are distinct byte strings); else None."""
    ids = engine.tokenize(piece)
    return ids[0] if len(ids) == 1 and engine.detokenize(ids) == piece else None


def texts(args) -> dict:
    with _engine(args.bundle, args.threads, args.cache_dir, benchmark=False) as eng:
        rec = {"bundle": os.path.basename(args.bundle), "new_tokens": args.text_tokens,
               "start_token": eng.bos_token_id, "stop_tokens": eng.eos_token_ids, "prompts": {}}
        for p in TEXT_PROMPTS:
            with eng.create_session(apply_prompt_template=False, sampler_config=_greedy(),
                                    max_output_tokens=args.text_tokens) as s:
                s.run_prefill([p])
                pieces = [r.texts[0] for r in s.run_decode_async()]
            rec["prompts"][p] = {"tokens": eng.tokenize(p), "pieces": pieces,
                                 "ids": [_piece_id(eng, x) for x in pieces], "text": "".join(pieces)}
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bundle")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=0, help="more sessions on the same engine (warm figures)")
    ap.add_argument("--cache-dir", default=":nocache", help="the runtime's cache_dir (':nocache': none)")
    ap.add_argument("--processes", type=int, default=0, help="N runs, each its own process under /usr/bin/time -v")
    ap.add_argument("--text", help="record the greedy text of TEXT_PROMPTS into this JSON file instead")
    ap.add_argument("--text-tokens", type=int, default=32)
    args = ap.parse_args()
    if not os.path.exists(args.bundle):
        raise SystemExit(f"no bundle at {args.bundle}: make one with benchmarks/make_llm_bundles.py")
    if args.text:
        rec = texts(args)
        allrec = json.load(open(args.text)) if os.path.exists(args.text) else {}
        allrec[rec["bundle"]] = rec
        json.dump(allrec, open(args.text, "w"), indent=1, ensure_ascii=False)
        print(json.dumps(rec, ensure_ascii=False))
    elif args.processes:
        print(json.dumps(processes(args)))
    else:
        print(json.dumps(measure(args)))


if __name__ == "__main__":
    main()
