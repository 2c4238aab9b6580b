"""How far merging a LoRA into a quantized bundle moves it: the merged, re-quantized model against the
float merge (the QLoRA model: stored integer weights + the float side path), by learning rate.

    python benchmarks/lora_requant.py [--steps 100] [--lrs 0.01,0.003,0.001] [--json OUT]

On the gemma fixture with its model section replaced by the int8 and int4
(blocks of 32) litert-torch exports (``tests/data/llm_bundles/lora.py``'s
``base_bundle``), a rank-8 LoRA is trained on ``lora.py``'s sentence at each
learning rate; reported per run: the training loss, the merged re-quantized
bundle's loss on the sentence, the adapted values clipped at their channel's
or block's integer range (the file's scales kept), the largest move of an
unclipped value (steps), the largest LoRA delta, the largest logit
difference between the merged bundle and the float merge on the sentence's
16 positions, and the merged bundle's greedy text.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "data", "llm_bundles"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=100, help="Adam steps per run (default 100)")
    ap.add_argument("--lrs", default="0.01,0.003,0.001", help="comma-separated learning rates")
    ap.add_argument("--json", default=None, help="write the rows to this JSON file")
    args = ap.parse_args(argv)

    import jax
    import numpy as np
    import optax

    import fbjax
    import lora as L
    from fbjax import finetune

    rows = []
    text = L.PROMPT + L.TARGET
    for variant in ("int8", "int4"):
        b = L.base_bundle(variant)
        toks = np.asarray([(b.encode(text) + [2] + [0] * 16)[:16]], np.int32)

        def logits(bb, params, lora):
            program = finetune._with_lora(bb.model, params, lora)[1] if lora is not None else bb.model.program
            p = finetune.lora_params(params, lora) if lora is not None else params
            return np.asarray(jax.vmap(lambda t: finetune._row_logits_prefill(
                bb._runner.pre, program, p, bb.model.buffers, t, 1, 16))(toks))

        for lr in (float(x) for x in args.lrs.split(",")):
            lora = finetune.lora_init(b, rank=8, include=L.INCLUDE, key=jax.random.key(0))
            opt = optax.adam(lr)
            state = opt.init(lora)
            step = L.train_step(b, text, opt)

            for _ in range(args.steps):
                lora, state, value = step(lora, state)
            err = finetune.requantization_error(b, finetune.merge_lora(b, b.params, lora, requantize=False))
            re = fbjax.load(b.save(None, finetune.merge_lora(b, b.params, lora)))
            ref, got = logits(b, b.params, lora), logits(re, re.params, None)
            row = {"variant": variant, "lr": lr, "steps": args.steps, "loss": float(value),
                   "loss_merged": float(re.loss(re.params, [text], add_stop=True)),
                   "clipped": sum(e["clipped"] for e in err.values()),
                   "adapted_values": int(sum(np.size(b.model.buffers[n]) for n in err)),
                   "max_steps_unclipped": max(e["max_steps_unclipped"] for e in err.values()),
                   "delta_max_abs": max(e["delta_max_abs"] for e in err.values()),
                   "logits_max_abs_dev": float(np.abs(got - ref).max()), "logits_max_abs": float(np.abs(ref).max()),
                   "merged_text": re.generate(L.PROMPT, template=False)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
