"""Total tokens/s of `fbjax serve` for 8 concurrent clients vs 1 (issue 37 item 2).

Starts the server on a free localhost port in this process (fbjax.serving.server.ServerThread), warms it
up (one request per distinct prompt, so every program is compiled), then:

* 1 client: ``--requests`` completions one after another;
* N clients (threads, ``--clients``): each sends ``--requests`` completions, all at once;

every request non-streamed, greedy, ``max_tokens`` new tokens (fewer where a stop token comes first: the
tokens counted are the responses' ``usage.completion_tokens``). Prints tokens/s for both and their ratio,
and the same two figures for the engine alone (no HTTP: Engine.submit from threads), as JSON with --json.
Also the decode steps' own tokens/s (Engine.stats: tokens / seconds inside decode steps) and the seconds
spent prefilling: each request's prompt is prefilled alone, padded to the prefill signature's length, so with
a long prefill signature and few new tokens the prefills, not the decode steps, dominate both runs.

    python benchmarks/serve_throughput.py tests/data/llm_bundles/llama_hf_chat.litertlm
    python benchmarks/serve_throughput.py /work/bundles/smollm2-135m_int8.litertlm --max-tokens 16 --requests 1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import threading
import time

import httpx
import openai

import fbjax
from fbjax.serving.server import ServerThread

PROMPTS = ["Hello there", "The quick brown fox jumps over the lazy dog", "a",
           "Models run on phones and in the cloud, and people tune them for their own tasks every day.",
           "Once upon a time", "The weather today is", "In the beginning", "Here is a list of fruits:"]


def _clients(n: int, requests: int, one) -> tuple:
    """Run ``one(client_index, request_index) -> tokens`` from ``n`` threads at once; (tokens, seconds)."""
    counts = [0] * n
    barrier = threading.Barrier(n + 1)

    def run(i):
        barrier.wait()
        for j in range(requests):
            counts[i] += one(i, j)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return sum(counts), time.perf_counter() - t0


def _append(path: str, record: dict) -> None:
    """Add ``record`` to the JSON list in ``path`` (a new file: a list of one)."""
    try:
        with open(path) as f:
            records = json.load(f)
    except FileNotFoundError:
        records = []
    records.append(record)
    with open(path, "w") as f:
        json.dump(records, f, indent=1)
        f.write("\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle", help="a .litertlm or LLM .task bundle")
    ap.add_argument("--clients", type=int, default=8, help="concurrent clients (default 8)")
    ap.add_argument("--slots", type=int, default=None, help="engine slots (default: --clients)")
    ap.add_argument("--requests", type=int, default=2, help="requests per client")
    ap.add_argument("--max-tokens", type=int, default=32, help="new tokens per request (default 32)")
    ap.add_argument("--quantized", default="exact", choices=["exact", "float"], help="fbjax.load's quantized")
    ap.add_argument("--server-process", action="store_true",
                    help="measure over HTTP against `fbjax serve` in its own process (no engine-only figures): the "
                    "clients' threads then do not share the server's interpreter lock")
    ap.add_argument("--prompt-steps", type=int, default=None,
                    help="the engine's prompt_steps (prompts of at most this many ids go through decode steps; "
                    "default: a quarter of the prefill length; 0: every prompt prefilled)")
    ap.add_argument("--json", default=None, help="add the result to the JSON list in this file")
    a = ap.parse_args()
    load_before = list(os.getloadavg())
    if a.server_process:
        return separate_process(a, load_before)
    t0 = time.perf_counter()
    bundle = fbjax.load(a.bundle, quantized=a.quantized)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    with ServerThread(bundle, port=0, slots=a.slots or a.clients, prompt_steps=a.prompt_steps) as server:
        start_s = time.perf_counter() - t0
        server_prompt_steps = server.engine.prompt_steps
        c = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=3600)

        def http(i, j):
            p = PROMPTS[(i + j) % len(PROMPTS)]
            r = c.completions.create(model=server.model_id, prompt=p, max_tokens=a.max_tokens, temperature=0)
            return r.usage.completion_tokens

        def engine(i, j):
            p = PROMPTS[(i + j) % len(PROMPTS)]
            r = server.engine.submit(bundle.prompt_tokens(p, template=False), max_new_tokens=a.max_tokens,
                                     temperature=0)
            r.result()
            return len(r.tokens)

        t0 = time.perf_counter()
        _clients(1, 1, http)  # warm-up: first HTTP request, prefill shapes
        warm_s = time.perf_counter() - t0
        res = {}
        st = server.engine.stats

        def decode_phase(fn, n):
            """(tokens, seconds) of the clients' run, and the decode steps' own tokens/s in it."""
            before = dict(st)
            tok, sec = _clients(n, a.requests, fn)
            d = {k: st[k] - before[k] for k in st}
            return tok, sec, d["tokens"] / d["decode_s"], d["prefill_s"]

        for how, fn in (("http", http), ("engine", engine)):
            tok1, s1, dec1, pre1 = decode_phase(fn, 1)
            tokn, sn, decn, pren = decode_phase(fn, a.clients)
            res[how] = {"one_client_tokens": tok1, "one_client_s": round(s1, 3), "one_client_tps": round(tok1 / s1, 2),
                        "n_clients_tokens": tokn, "n_clients_s": round(sn, 3), "n_clients_tps": round(tokn / sn, 2),
                        "ratio": round((tokn / sn) / (tok1 / s1), 2),
                        "decode_steps_tps_one": round(dec1, 2), "decode_steps_tps_n": round(decn, 2),
                        "decode_steps_ratio": round(decn / dec1, 2), "prefill_s_one": round(pre1, 2),
                        "prefill_s_n": round(pren, 2)}
            print(f"{how:6s}: 1 client {tok1} tokens in {s1:.2f} s = {tok1 / s1:.1f} tokens/s; {a.clients} clients "
                  f"{tokn} tokens in {sn:.2f} s = {tokn / sn:.1f} tokens/s; ratio {res[how]['ratio']:.2f}x; "
                  f"in the decode steps alone {dec1:.1f} vs {decn:.1f} tokens/s ({decn / dec1:.2f}x); "
                  f"prefill {pre1:.2f} s vs {pren:.2f} s", flush=True)
    out = {"bundle": os.path.basename(a.bundle), "quantized": a.quantized,
           "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
           "backend": __import__("jax").default_backend(), "load_average_before": load_before,
           "clients": a.clients, "slots": a.slots or a.clients, "requests_per_client": a.requests,
           "max_tokens": a.max_tokens, "prompt_steps": server_prompt_steps, "load_s": round(load_s, 2),
           "engine_start_s": round(start_s, 2),
           "warm_up_s": round(warm_s, 2), **res}
    print(json.dumps(out))
    if a.json:
        _append(a.json, out)


def separate_process(a, load_before) -> None:
    """HTTP clients here, `fbjax serve` in a child process (started and stopped here)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "fbjax", "serve", a.bundle, "--port", str(port), "--slots",
                             str(a.slots or a.clients), "--quantized", a.quantized]
                            + ([] if a.prompt_steps is None else ["--prompt-steps", str(a.prompt_steps)]),
                            stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        while True:
            try:
                model = httpx.get(base + "/health", timeout=5).json()["model"]
                break
            except httpx.HTTPError:
                if proc.poll() is not None:
                    raise SystemExit(f"fbjax serve exited with {proc.returncode}")
                time.sleep(0.5)
        start_s = time.perf_counter() - t0
        c = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=3600)

        def http(i, j):
            p = PROMPTS[(i + j) % len(PROMPTS)]
            r = c.completions.create(model=model, prompt=p, max_tokens=a.max_tokens, temperature=0)
            return r.usage.completion_tokens

        _clients(1, 1, http)
        stats = lambda: httpx.get(base + "/health").json()["stats"]  # noqa: E731
        row = {}
        for n, key in ((1, "one"), (a.clients, "n")):
            before = stats()
            tok, sec = _clients(n, a.requests, http)
            after = stats()
            row[key] = (tok, sec, (after["tokens"] - before["tokens"]) / (after["decode_s"] - before["decode_s"]))
        (tok1, s1, dec1), (tokn, sn, decn) = row["one"], row["n"]
        res = {"one_client_tokens": tok1, "one_client_s": round(s1, 3), "one_client_tps": round(tok1 / s1, 2),
               "n_clients_tokens": tokn, "n_clients_s": round(sn, 3), "n_clients_tps": round(tokn / sn, 2),
               "ratio": round((tokn / sn) / (tok1 / s1), 2), "decode_steps_tps_one": round(dec1, 2),
               "decode_steps_tps_n": round(decn, 2), "decode_steps_ratio": round(decn / dec1, 2)}
        print(f"http to a separate `fbjax serve`: 1 client {tok1 / s1:.1f} tokens/s; {a.clients} clients "
              f"{tokn / sn:.1f} tokens/s; ratio {res['ratio']:.2f}x; decode steps alone {decn / dec1:.2f}x", flush=True)
    finally:
        proc.terminate()
        proc.wait(30)
    out = {"bundle": os.path.basename(a.bundle), "quantized": a.quantized, "server": "separate process",
           "machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "load_average_before": load_before,
           "clients": a.clients, "slots": a.slots or a.clients, "requests_per_client": a.requests,
           "max_tokens": a.max_tokens, "prompt_steps": a.prompt_steps, "server_start_s": round(start_s, 2), "http": res}
    print(json.dumps(out))
    if a.json:
        _append(a.json, out)


if __name__ == "__main__":
    main()
