"""Train the rank-8 LoRA fixtures of tests/test_finetune.py and record the LiteRT-LM runtime running the merged bundles.

Two steps, in two environments::

    python tests/data/llm_bundles/lora.py train OUT          # fbjax's environment (with optax)
    /work/genenv-llm/bin/python tests/data/llm_bundles/lora.py record OUT   # litert-lm 0.18.1 (see generate.py)

``train`` fits a rank-8, alpha-16 LoRA (:mod:`fbjax.finetune`, on every
attention and feed-forward matrix) so that the gemma fixture continues
:data:`PROMPT` with :data:`TARGET` and stops, on three bases: the float
``gemma_hf.litertlm``, and the same bundle with its model section replaced by
``tests/data/llm/gemma_q8.tflite`` (litert-torch ``dynamic_int8``) and
``gemma_q4b32.tflite`` (``dynamic_int4_block32``), whose integer weights stay
as stored (QLoRA: the adapters run beside the hybrid kernels). It saves the
adapters (``lora_adapters.npz``, committed: the test merges them again and
compares the saved bytes with the recorded sha256), writes each merged
bundle to OUT (quantized weights re-quantized on the file's grid) and the
losses, the re-quantization error and how far the merged quantized model's
logits moved from the float merge's into ``lora_text.json``. ``record``
runs each merged bundle in the runtime (greedy, no template) and adds its
text.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
LLM = os.path.join(os.path.dirname(HERE), "llm")
PROMPT, TARGET = "Hello there", " the model runs on phones and in the cloud."
#: variant -> the model section put in gemma_hf.litertlm (None: its own float model)
BASES = {"f32": None, "int8": "gemma_q8.tflite", "int4": "gemma_q4b32.tflite"}
RANK, ALPHA, STEPS, LR, SEED = 8, 16.0, 60, 1e-2, 0
INCLUDE = ["*attention*", "*feed_forward*"]
RECORD = os.path.join(HERE, "lora_text.json")


def base_bundle(variant: str):
    """The bundle a variant trains on (fbjax's environment)."""
    import fbjax
    from fbjax.formats import llm_container as fmt

    src = os.path.join(HERE, "gemma_hf.litertlm")
    if BASES[variant] is None:
        return fbjax.load(src)
    with open(os.path.join(LLM, BASES[variant]), "rb") as f:
        return fbjax.load(fmt.write_bundle(fmt.read_bundle(src), f.read()))


def train_step(b, text: str, opt):
    """The jitted Adam step ``(lora, state) -> (lora, state, loss)`` of adapters on ``b`` learning
    ``text`` (stop token appended); ``b``'s own weights stay as they are."""
    import jax
    import optax

    @jax.jit
    def step(lora, state):
        value, grads = jax.value_and_grad(lambda l: b.loss(b.params, [text], lora=l, add_stop=True))(lora)
        updates, state = opt.update(grads, state)
        return optax.apply_updates(lora, updates), state, value
    return step


def train(out: str) -> None:
    """Train, merge and save the three variants into OUT; write the adapters and lora_text.json."""
    import time

    import jax
    import numpy as np
    import optax

    from fbjax import finetune

    os.makedirs(out, exist_ok=True)
    text = PROMPT + TARGET
    rec = {"prompt": PROMPT, "target": TARGET, "rank": RANK, "alpha": ALPHA, "steps": STEPS, "lr": LR,
           "include": INCLUDE, "variants": {}}
    arrays = {}
    for variant in BASES:
        b = base_bundle(variant)
        lora = finetune.lora_init(b, rank=RANK, alpha=ALPHA, include=INCLUDE, key=jax.random.key(SEED))
        opt = optax.adam(LR)
        state = opt.init(lora)
        step = train_step(b, text, opt)

        losses, t0 = [], time.perf_counter()
        for _ in range(STEPS):
            lora, state, value = step(lora, state)
            losses.append(float(value))
        secs = time.perf_counter() - t0
        final = float(b.loss(b.params, [text], lora=lora, add_stop=True))
        merged = finetune.merge_lora(b, b.params, lora)
        data = b.save(None, merged)
        name = f"lora_{variant}.litertlm"
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
        v = {"bundle": name, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
             "trainable": lora.num_parameters, "loss_first": losses[0], "loss_final": final,
             "train_s": round(secs, 2)}
        import fbjax

        re = fbjax.load(data)
        v["fbjax_text"] = re.generate(PROMPT, template=False)
        if variant != "f32":
            err = finetune.requantization_error(b, finetune.merge_lora(b, b.params, lora, requantize=False))
            v["requant_max_steps"] = max(e["max_steps"] for e in err.values())
            v["requant_clipped"] = sum(e["clipped"] for e in err.values())
            v["requant_values"] = int(sum(np.size(merged[n]) for n in err))
            v["requant_max_abs"] = max(e["max_abs"] for e in err.values())
            v["lora_delta_max_abs"] = max(e["delta_max_abs"] for e in err.values())
            v["loss_merged_quantized"] = float(re.loss(re.params, [text], add_stop=True))
            # the merged, re-quantized model's logits against the float merge's (QLoRA forward: stored
            # integer weights + the float side path), on the text's positions
            lg = lambda bb, p, l: jax.vmap(lambda t: finetune._row_logits_prefill(  # noqa: E731
                bb._runner.pre, finetune._with_lora(bb.model, p, l)[1] if l is not None else bb.model.program,
                finetune.lora_params(p, l) if l is not None else p, bb.model.buffers, t, 1, 16))(
                np.asarray([(b.encode(text) + [2] + [0] * 16)[:16]], np.int32))
            ref, got = np.asarray(lg(b, b.params, lora)), np.asarray(lg(re, re.params, None))
            v["logits_max_abs_dev"] = float(np.max(np.abs(got - ref)))
            v["logits_max_abs"] = float(np.max(np.abs(ref)))
        rec["variants"][variant] = v
        for i, (n, (a, bb)) in enumerate(sorted(lora.adapters.items())):
            arrays[f"{variant}/{i}/name"] = np.asarray(n)
            arrays[f"{variant}/{i}/A"] = np.asarray(a)
            arrays[f"{variant}/{i}/B"] = np.asarray(bb)
        print(variant, json.dumps(v), flush=True)
    np.savez_compressed(os.path.join(HERE, "lora_adapters.npz"), **arrays)
    json.dump(rec, open(RECORD, "w"), indent=1, ensure_ascii=False)


def record(out: str) -> None:
    """Run each merged bundle of OUT in the LiteRT-LM runtime (greedy session, no template, as
    generate.py's ``run_runtime``) and add its text to ``lora_text.json`` (the generator environment)."""
    import litert_lm

    rec = json.load(open(RECORD))
    greedy = litert_lm.SamplerConfig(top_k=1, top_p=1.0, temperature=1.0, seed=0)
    for variant, v in rec["variants"].items():
        path = os.path.join(out, v["bundle"])
        data = open(path, "rb").read()
        assert hashlib.sha256(data).hexdigest() == v["sha256"], f"{path} is not the bundle train wrote"
        with litert_lm.Engine(path, cache_dir=":nocache") as eng:
            with eng.create_session(apply_prompt_template=False, sampler_config=greedy) as s:
                s.run_prefill([PROMPT])
                v["runtime_pieces"] = [r.texts[0] for r in s.run_decode_async()]
        v["runtime_text"] = "".join(v["runtime_pieces"])
        print(variant, repr(v["runtime_text"]), flush=True)
    rec["litert_lm"] = __import__("importlib.metadata").metadata.version("litert-lm-api")
    json.dump(rec, open(RECORD, "w"), indent=1, ensure_ascii=False)


if __name__ == "__main__":
    {"train": train, "record": record}[sys.argv[1]](sys.argv[2])
