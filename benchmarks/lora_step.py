"""One LoRA training step on a realistic-size LLM bundle: trainable values, step time, peak RSS.

    /usr/bin/time -v python benchmarks/lora_step.py BUNDLE [--tokens 32] [--rank 8] [--steps 3] [--json OUT]
    /usr/bin/time -v python benchmarks/lora_step.py BUNDLE --full [--tokens 32] [--steps 2]   # every weight, float mode
        [--save TUNED.litertlm]   # then bundle.save of the tuned weights (integer ones re-quantized on the file's grid)

Loads the bundle (e.g. ``benchmarks/make_llm_bundles.py``'s SmolLM2-135M-shaped
int8 ``.litertlm``), puts rank-``r`` (alpha 16) adapters on every attention
and MLP matrix (the ``include`` patterns below; on an int8 bundle these are
integer weight buffers: QLoRA, :mod:`fbjax.finetune`), and times
``jax.value_and_grad`` of :meth:`fbjax.LlmBundle.loss` on one text of
``--tokens`` tokens plus an optax Adam update, jitted with the params and the
weight buffers as arguments. Prints the trainable-value count, the first
step's seconds (trace + compile + run) and the later steps' seconds (the
mean of ``--steps - 1`` warm steps). Peak RSS: ``/usr/bin/time -v``'s
"Maximum resident set size" of the whole process.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

INCLUDE = ["*attention*", "*self_attn*", "*feed_forward*", "*mlp*"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle", help="an LLM bundle (.litertlm / LLM .task)")
    ap.add_argument("--tokens", type=int, default=32, help="tokens of the training text (default 32)")
    ap.add_argument("--rank", type=int, default=8, help="LoRA rank (default 8)")
    ap.add_argument("--steps", type=int, default=3, help="steps to run, the first one compiling (default 3)")
    ap.add_argument("--json", default=None, help="write the figures to this JSON file")
    ap.add_argument("--lr", type=float, default=1e-5, help="--full: Adam's learning rate (default 1e-5)")
    ap.add_argument("--save", default=None, metavar="PATH",
                    help="with --full: write the tuned bundle here (LlmBundle.save: weights the file stores as "
                         "integers re-quantized on its grid) and report how far the stored weights moved")
    ap.add_argument("--full", action="store_true",
                    help="full fine-tuning instead: every float param of the bundle loaded with quantized='float' "
                         "(the integer weights become float params), Adam on all of them")
    args = ap.parse_args(argv)

    import jax
    import numpy as np
    import optax

    import fbjax
    from fbjax import finetune

    t0 = time.perf_counter()
    b = fbjax.load(args.bundle, quantized="float" if args.full else "exact")
    load_s = time.perf_counter() - t0
    if args.full:
        return _full(args, b, load_s)
    names = list(b.params) + list(b.model.buffers)
    include = [p for p in INCLUDE if any(__import__("fnmatch").fnmatchcase(n, p) for n in names)]
    lora = finetune.lora_init(b, rank=args.rank, include=include, key=jax.random.key(0))
    words = "the model runs on phones and in the cloud and people tune them for their own tasks every day".split()
    text = " ".join(words[i % len(words)] for i in range(4 * args.tokens))
    ids = b.encode(text)[:args.tokens]
    text = b.decode(ids[1:])
    opt = optax.adam(1e-3)
    state = opt.init(lora)

    @jax.jit
    def step(lora, state, params, buffers):
        value, grads = jax.value_and_grad(lambda l: b.loss(params, [text], lora=l, buffers=buffers))(lora)
        updates, state = opt.update(grads, state)
        return optax.apply_updates(lora, updates), state, value

    times, losses = [], []
    for _ in range(args.steps):
        t = time.perf_counter()
        lora, state, value = step(lora, state, b.params, b.model.buffers)
        losses.append(float(value))
        times.append(time.perf_counter() - t)
    quantized = sum(n in b.model.buffers for n in lora.adapters)
    out = {"bundle": os.path.basename(args.bundle), "load_s": round(load_s, 2), "adapters": len(lora.adapters),
           "adapters_on_quantized": quantized, "rank": args.rank, "trainable": lora.num_parameters,
           "tokens": len(b.encode(text)), "first_step_s": round(times[0], 2),
           "step_s": round(float(np.mean(times[1:])), 3) if len(times) > 1 else None, "losses": losses,
           "loss_path": "prefill" if "logits" in [s.name for s in b._runner.pre.outputs] else "decode steps"}
    print(json.dumps(out))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


def _full(args, b, load_s: float) -> int:
    """``--full``: one Adam step on every float param (float mode), timed like the LoRA steps."""
    import jax
    import numpy as np
    import optax

    words = "the model runs on phones and in the cloud and people tune them for their own tasks every day".split()
    text = " ".join(words[i % len(words)] for i in range(4 * args.tokens))
    text = b.decode(b.encode(text)[:args.tokens][1:])
    opt = optax.adam(args.lr)
    params = dict(b.params)
    state = opt.init(params)

    @jax.jit
    def step(params, state, buffers):
        value, grads = jax.value_and_grad(lambda p: b.loss(p, [text], buffers=buffers))(params)
        updates, state = opt.update(grads, state)
        return optax.apply_updates(params, updates), state, value

    times, losses = [], []
    for _ in range(args.steps):
        t = time.perf_counter()
        params, state, value = step(params, state, b.model.buffers)
        losses.append(float(value))
        times.append(time.perf_counter() - t)
    out = {"bundle": os.path.basename(args.bundle), "mode": "full, quantized='float'", "load_s": round(load_s, 2),
           "trainable": int(sum(np.size(v) for v in b.params.values())), "tokens": len(b.encode(text)),
           "first_step_s": round(times[0], 2),
           "step_s": round(float(np.mean(times[1:])), 3) if len(times) > 1 else None, "losses": losses}
    if args.save:
        t = time.perf_counter()
        b.save(args.save, {k: np.asarray(v) for k, v in params.items()})
        out["save_s"] = round(time.perf_counter() - t, 2)
        out["saved"] = args.save
        # how the stored weights moved: the saved file's values (exact mode: the integers and their scales,
        # dequantized) against the original's, and against the float-tuned weights they stand for
        import fbjax

        tuned = fbjax.load(args.save, quantized="float")
        moved = [float(np.max(np.abs(np.asarray(tuned.params[k]) - np.asarray(b.params[k]))))
                 for k in b.params if np.size(b.params[k]) > 4096]
        off = [float(np.max(np.abs(np.asarray(tuned.params[k]) - np.asarray(params[k]))))
               for k in b.params if np.size(b.params[k]) > 4096]
        out["max_abs_change_of_stored_weights"] = max(moved) if moved else None
        out["max_abs_stored_minus_tuned"] = max(off) if off else None
        # the integers themselves (exact mode): the share of the file's integer weights the tuning moved
        orig, new = fbjax.load(args.bundle), fbjax.load(args.save)
        ints = [k for k in orig.model.buffers if k in new.model.buffers]
        changed = sum(int(np.sum(np.asarray(orig.model.buffers[k]) != np.asarray(new.model.buffers[k]))) for k in ints)
        total = sum(int(np.size(orig.model.buffers[k])) for k in ints)
        out["integer_weights_changed"] = changed
        out["integer_weights_total"] = total
        out["lr"] = args.lr
    print(json.dumps(out))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
