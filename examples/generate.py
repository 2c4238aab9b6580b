"""Generate tokens with a decoder-only LLM file from litert-torch: ``fbjax.generate``.

    python examples/generate.py                       # the tiny llama fixture, greedy and sampled
    python examples/generate.py MODEL.tflite --prompt 1,2,3 --max-new-tokens 32

The model is any ``.tflite`` from litert-torch's generative converter
(``prefill_N`` and ``decode`` signatures, the KV cache passed in and out, in
the default or the transposed layout, with or without a ``mask`` input);
by default the tiny random-weight llama of ``tests/data/llm`` (2 layers,
width 128, vocab 256, made by ``tests/data/llm/generate.py``), so the tokens
mean nothing. There is no tokenizer here: token ids in, token ids out.

It shows the signatures as entry points (``model.signature("decode")`` is a
callable with named inputs and outputs, like LiteRT's signature runner), a
greedy batch of prompts of different lengths (prefill + decode in one jitted
``lax.scan``; each row equals the same prompt run alone), and top-k sampling
from an explicit PRNG key.
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import numpy as np

import fbjax

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT = os.path.join(HERE, "..", "tests", "data", "llm", "llama_f32.tflite")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default=DEFAULT,
                    help="a .tflite with prefill_N and decode signatures (default: tests/data/llm/llama_f32.tflite)")
    ap.add_argument("--prompt", action="append", default=None, metavar="1,2,3",
                    help="a prompt's token ids (repeat for a batch); default: three prompts")
    ap.add_argument("--max-new-tokens", type=int, default=32, help="decode steps (default 32)")
    args = ap.parse_args()
    prompts = [[int(t) for t in p.split(",")] for p in args.prompt] if args.prompt else \
        [[5, 17, 99, 3, 42, 7], [200], [77, 31, 9]]

    model = fbjax.load(args.model)
    for key, sig in model.signatures.items():
        r = model.signature(key)
        print(f"signature {key!r} (graph {sig.graph_index}): inputs {[s.name for s in r.inputs]} "
              f"-> outputs {[s.name for s in r.outputs]}")

    # one decode step by hand: named inputs, a dict of named outputs
    dec = model.signature("decode")
    ins = {s.name: np.zeros(s.shape, s.dtype) for s in dec.inputs}
    ins["tokens"][...] = prompts[0][0]
    out = dec(**ins)
    print(f"one decode step from token {prompts[0][0]} at position 0: logits {out['logits'].shape}, "
          f"argmax {int(np.argmax(out['logits']))}")

    t = time.perf_counter()
    greedy = fbjax.generate(model, prompts, args.max_new_tokens)
    print(f"\ngreedy, batch of {len(prompts)} (first call, compiling: {time.perf_counter() - t:.1f} s)")
    for p, row in zip(prompts, greedy):
        print(f"  {p} -> {row.tolist()}")
    t = time.perf_counter()
    fbjax.generate(model, prompts, args.max_new_tokens)
    dt = time.perf_counter() - t
    print(f"  again (compiled): {dt * 1e3:.0f} ms, {len(prompts) * args.max_new_tokens / dt:.0f} tokens/s")
    alone = fbjax.generate(model, prompts[1], args.max_new_tokens)
    print(f"  prompt {prompts[1]} alone gives the same tokens: {bool((alone == greedy[1]).all())}")

    sampled = fbjax.generate(model, prompts, args.max_new_tokens, temperature=0.8, top_k=20,
                             key=jax.random.key(42))
    print("\nsampled (temperature 0.8, top-k 20, key 42)")
    for p, row in zip(prompts, sampled):
        print(f"  {p} -> {row.tolist()}")


if __name__ == "__main__":
    main()
