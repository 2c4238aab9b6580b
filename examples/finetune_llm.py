"""Fine-tune a decoder-only LLM file through its prefill signature, save it, check it in LiteRT.

    python examples/finetune_llm.py               # 150 Adam steps, ~10 s on 2 idle CPU cores (28 s at load 7)
    python examples/finetune_llm.py --steps 5     # smoke test

The model is the tiny random-weight gemma of ``tests/data/llm`` (litert-torch
export: 2 layers, width 128, vocab 256, transposed KV cache, mask input; its
``prefill_16`` signature also returns the logits of all 16 positions). The
synthetic task: sequences that count up by a step of 1, 2 or 3 from a random
start (mod 256); the next-token cross-entropy over positions 1..15 is
minimised through ``model.signature("prefill_16").apply(params, ...)`` with
``jax.grad`` and optax, every float weight trained.

Then ``model.save`` writes the tuned weights into the same file layout
(prefill and decode subgraphs share them), LiteRT's signature runners run the
saved file, and its logits are compared with fbjax's for the tuned params
(the example exits with status 1 if they differ by more than 1e-4 relative
to max(1, |logit|)); and ``fbjax.generate`` continues a counting prompt with
the tuned weights.

Needs ``optax`` (``pip install '.[examples]'``); the LiteRT check needs
``ai-edge-litert`` (skipped with a message without it); ``--plot loss.png``
needs matplotlib.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import fbjax

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = os.path.join(HERE, "..", "tests", "data", "llm", "gemma_f32.tflite")
T, VOCAB = 16, 256


def batch(rng, n):
    start = rng.integers(0, VOCAB, (n, 1))
    step = rng.integers(1, 4, (n, 1))
    return ((start + step * np.arange(T)[None, :]) % VOCAB).astype(np.int32)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=150, help="Adam steps (default 150; e.g. 3 for a quick check)")
    ap.add_argument("--batch", type=int, default=8, help="sequences per step (default 8)")
    ap.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate (default 3e-3)")
    ap.add_argument("--plot", default=None, metavar="PNG", help="write the loss curve here")
    args = ap.parse_args()

    model = fbjax.load(MODEL)
    pre = model.signature("prefill_16")
    spec = {s.name: s for s in pre.inputs}
    fixed = {n: jnp.zeros(s.shape, s.dtype) for n, s in spec.items() if n.startswith("kv_cache_")}
    fixed["input_pos"] = jnp.arange(T, dtype=jnp.int32)
    s = jnp.arange(spec["mask"].shape[-1])
    fixed["mask"] = jnp.where(s[None, :] <= jnp.arange(T)[:, None], 0.0, -jnp.inf).reshape(spec["mask"].shape)

    def loss_one(params, tokens):  # tokens [T]
        logits = pre.apply(params, **fixed, tokens=tokens[None])["logits"][0, :-1]
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[1:, None], -1))

    def loss(params, tokens):  # a batch through the batch-1 signature: vmap
        return jnp.mean(jax.vmap(loss_one, in_axes=(None, 0))(params, tokens))

    opt = optax.adam(args.lr)
    params = dict(model.params)
    state = opt.init(params)

    @jax.jit
    def step(params, state, tokens):
        value, grads = jax.value_and_grad(loss)(params, tokens)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    rng = np.random.default_rng(0)
    held = batch(np.random.default_rng(1), 64)
    eval_loss = jax.jit(loss)
    print(f"held-out next-token loss before: {float(eval_loss(params, held)):.3f} (ln 256 = {np.log(256):.3f})")
    curve, t0 = [], time.perf_counter()
    for i in range(args.steps):
        params, state, value = step(params, state, batch(rng, args.batch))
        curve.append(float(value))
        if i % 25 == 0 or i == args.steps - 1:
            print(f"step {i:4d}  train loss {curve[-1]:.3f}  ({time.perf_counter() - t0:.1f} s)")
    print(f"held-out next-token loss after:  {float(eval_loss(params, held)):.3f}")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        plt.plot(curve)
        plt.xlabel("step")
        plt.ylabel("next-token loss")
        plt.savefig(args.plot)
        print(f"wrote {args.plot}")

    prompt = [10, 12, 14, 16]
    print(f"generate with the tuned weights: {prompt} -> "
          f"{fbjax.generate(model, prompt, 8, params=params).tolist()}")

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "tuned.tflite")
        model.save(path, {k: np.asarray(v) for k, v in params.items()})
        print(f"saved the tuned model ({os.path.getsize(path)} bytes, in a temporary folder)")
        try:
            from ai_edge_litert import interpreter as litert
        except ImportError:
            print("ai-edge-litert is not installed: LiteRT check skipped")
            return 0
        interp = litert.Interpreter(
            model_path=path, experimental_op_resolver_type=litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
        ins = {k: np.asarray(v) for k, v in fixed.items()}
        ins["tokens"] = held[:1]
        want = interp.get_signature_runner("prefill_16")(**ins)["logits"]
        got = np.asarray(pre.apply(params, **ins)["logits"])
        err = float(np.max(np.abs(got - want) / np.maximum(1.0, np.abs(want))))
        print(f"LiteRT on the saved file vs fbjax, prefill logits: max relative error {err:.2e}")
        if err > 1e-4:
            print("MISMATCH")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
