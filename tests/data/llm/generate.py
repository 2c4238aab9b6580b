"""Generate the tiny decoder-only LLM fixtures of tests/test_llm.py with litert-torch.

Run in a separate generator environment (the tests themselves need neither
torch nor litert-torch)::

    python3 -m venv /work/genenv-llm
    /work/genenv-llm/bin/pip install torch==2.14.1 torchvision==0.29.1
    /work/genenv-llm/bin/pip install litert-torch ai-edge-litert   # litert-torch 0.10.0, ai-edge-litert 2.3.0
    /work/genenv-llm/bin/python tests/data/llm/generate.py [llama|gemma ...]

Two architectures, both built with litert-torch's generative API
(``model_builder.DecoderOnlyModel``) from tiny configs (2 layers, width 128,
vocab 256), seeded random weights, converted by
``litert_torch.generative.utilities.converter.convert_to_tflite`` with one
prefill length (16) and a 64-entry KV cache:

* ``llama``: TinyLlama's block (RMS norm, SiLU-gated MLP, grouped-query
  attention with 4 heads over 2 KV groups, rotary embedding, separate LM
  head), the default KV layout (K and V ``[1, 64, 2, 32]``), causal mask
  built inside the model.
* ``gemma``: Gemma 1's block (zero-centred RMS norm, GELU-tanh-gated MLP,
  multi-query attention, embedding scaled by sqrt(width) and shared with the
  LM head), the transposed KV layout (K ``[1, 1, 64, 32]`` BNTH, V
  ``[1, 1, 32, 64]`` BNHT) and the attention mask as an input
  (``ExportConfig(mask_as_input=True)``); its prefill signature also
  returns the logits of every position (``output_logits_on_prefill=True``,
  what fine-tuning through prefill needs).

Each in ``quantize="none"`` (``*_f32``), ``"dynamic_int8"`` (``*_q8``) and
``"dynamic_int4_block32"`` (``*_q4b32``). ``<name>.npz`` holds LiteRT's
signature runner outputs (``Interpreter.get_signature_runner``, builtin
kernels without the XNNPACK delegate) on seeded inputs: keys
``<signature>/in/<name>`` and ``<signature>/out/<name>``, and, for the float
files, ``generate/prompts`` (4 prompts padded with -1), ``generate/tokens``:
32 greedy tokens per prompt from driving LiteRT's prefill and decode runners
step by step (prefill the first ``len - 1`` tokens padded to 16, then decode
from the last prompt token; masks: 0 at key positions <= the query's
position, ``-inf`` after, as litert-torch builds them).

litert-torch's LoRA module imports ``tensorflow.lite.python.
schema_py_generated`` without depending on TensorFlow; ai-edge-litert ships
the same generated bindings, registered under that name below.
"""

from __future__ import annotations

import os
import sys
import tempfile

import numpy as np


import torch
import torch._dynamo  # noqa: F401  (before the stand-in below: dynamo probes which packages exist)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/data
import litert_schema_shim  # noqa: E402

litert_schema_shim.install()

from ai_edge_litert import interpreter as litert  # noqa: E402
from litert_torch.generative.layers import kv_cache as kv_utils  # noqa: E402
import litert_torch.generative.layers.model_config as cfg  # noqa: E402
from litert_torch.generative.utilities import converter, model_builder  # noqa: E402
from litert_torch.generative.utilities.export_config import ExportConfig  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PREFILL, KV_LEN, VOCAB, WIDTH = 16, 64, 256, 128
QUANT = {"f32": "none", "q8": "dynamic_int8", "q4b32": "dynamic_int4_block32"}
PROMPTS = [[5, 17, 99, 3, 42, 7], [200], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17], [77, 31, 9]]
STEPS = 32


def llama_config() -> cfg.ModelConfig:
    attn = cfg.AttentionConfig(num_heads=4, head_dim=32, num_query_groups=2, rotary_base=10000,
                               rotary_percentage=1.0)
    ff = cfg.FeedForwardConfig(type=cfg.FeedForwardType.GATED, activation=cfg.ActivationConfig(cfg.ActivationType.SILU),
                               intermediate_size=256)
    norm = cfg.NormalizationConfig(type=cfg.NormalizationType.RMS_NORM)
    block = cfg.TransformerBlockConfig(attn_config=attn, ff_config=ff, pre_attention_norm_config=norm,
                                       post_attention_norm_config=norm)
    return cfg.ModelConfig(vocab_size=VOCAB, num_layers=2, max_seq_len=KV_LEN, embedding_dim=WIDTH,
                           block_configs=block, final_norm_config=norm, lm_head_share_weight_with_embedding=False)


def gemma_config() -> cfg.ModelConfig:
    attn = cfg.AttentionConfig(num_heads=4, head_dim=32, num_query_groups=1, rotary_base=10000,
                               rotary_percentage=1.0)
    ff = cfg.FeedForwardConfig(type=cfg.FeedForwardType.GATED,
                               activation=cfg.ActivationConfig(cfg.ActivationType.GELU_TANH), intermediate_size=256)
    norm = cfg.NormalizationConfig(type=cfg.NormalizationType.RMS_NORM, epsilon=1e-6, zero_centered=True)
    block = cfg.TransformerBlockConfig(attn_config=attn, ff_config=ff, pre_attention_norm_config=norm,
                                       post_attention_norm_config=norm)
    return cfg.ModelConfig(vocab_size=VOCAB, num_layers=2, max_seq_len=KV_LEN, embedding_dim=WIDTH,
                           embedding_scale=WIDTH ** 0.5, block_configs=block, final_norm_config=norm,
                           lm_head_use_bias=False)


ARCHS = {
    "llama": (llama_config, ExportConfig()),
    "gemma": (gemma_config, ExportConfig(kvcache_layout=kv_utils.KV_LAYOUT_TRANSPOSED, mask_as_input=True,
                                         output_logits_on_prefill=True)),
}


def build(config: cfg.ModelConfig, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = model_builder.DecoderOnlyModel(config, mask_cache_size=KV_LEN).eval()
    with torch.no_grad():  # weights of order 1 / sqrt(fan-in), norms around 1: logits of order 1
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.normal_(0.0, 1.0 / np.sqrt(p.shape[-1]))
            else:
                p.uniform_(0.5, 1.5) if "zero" not in name else p.zero_()
    return model


def causal_mask(rows: np.ndarray) -> np.ndarray:
    """``[1, 1, len(rows), KV_LEN]``: 0 where key position <= rows[t], -inf after."""
    s = np.arange(KV_LEN)
    return np.where(s[None, :] <= rows[:, None], 0.0, -np.inf).astype(np.float32)[None, None]


def interpreter(path: str):
    return litert.Interpreter(model_path=path,
                              experimental_op_resolver_type=litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)


def signature_io(interp, rng) -> dict:
    """Each signature run on seeded inputs: random tokens, positions 0.., random KV caches."""
    out = {}
    for key, io in interp.get_signature_list().items():
        runner = interp.get_signature_runner(key)
        details = runner.get_input_details()
        ins = {}
        n = int(details["tokens"]["shape"][-1])
        start = 0 if key.startswith("prefill") else 21  # decode at a position with 21 earlier entries
        pos = np.arange(start, start + n, dtype=np.int32)
        for name, d in details.items():
            shape, dtype = tuple(d["shape"]), d["dtype"]
            if name == "tokens":
                ins[name] = rng.integers(0, VOCAB, shape).astype(dtype)
            elif name == "input_pos":
                ins[name] = pos.reshape(shape).astype(dtype)
            elif name == "mask":
                ins[name] = causal_mask(pos).reshape(shape).astype(dtype)
            else:
                ins[name] = rng.standard_normal(shape).astype(dtype)
        res = runner(**ins)
        out.update({f"{key}/in/{k}": v for k, v in ins.items()})
        out.update({f"{key}/out/{k}": np.asarray(v) for k, v in res.items()})
    return out


def litert_generate(interp, prompt: list) -> np.ndarray:
    """Greedy tokens from LiteRT's runners driven step by step (see the module docstring)."""
    pre, dec = interp.get_signature_runner(f"prefill_{PREFILL}"), interp.get_signature_runner("decode")
    pdet, ddet = pre.get_input_details(), dec.get_input_details()
    kv = {k: np.zeros(d["shape"], d["dtype"]) for k, d in pdet.items() if k.startswith("kv_cache_")}
    toks = np.zeros((1, PREFILL), np.int32)
    toks[0, :len(prompt) - 1] = prompt[:-1]
    pos = np.arange(PREFILL, dtype=np.int32)
    ins = dict(kv, tokens=toks, input_pos=pos)
    if "mask" in pdet:
        ins["mask"] = causal_mask(pos)
    res = pre(**ins)
    kv = {k: res[k] for k in kv}
    tok, p, out = prompt[-1], len(prompt) - 1, []
    for _ in range(STEPS):
        ins = dict(kv, tokens=np.array([[tok]], np.int32), input_pos=np.array([p], np.int32))
        if "mask" in ddet:
            ins["mask"] = causal_mask(np.array([p]))
        res = dec(**ins)
        kv = {k: res[k] for k in kv}
        tok = int(np.argmax(res["logits"].reshape(-1)))
        out.append(tok)
        p += 1
    return np.asarray(out, np.int32)


def main(only=()) -> None:
    for seed, (arch, (make_config, export_config)) in enumerate(ARCHS.items()):
        if only and arch not in only:
            continue
        config = make_config()
        for suffix, quant in QUANT.items():
            model = build(config, seed)
            with tempfile.TemporaryDirectory() as tmp:
                path = converter.convert_to_tflite(model, tmp, arch, [PREFILL], KV_LEN, quantize=quant,
                                                   config=config, export_config=export_config)
                data = open(path, "rb").read()
            name = f"{arch}_{suffix}"
            dst = os.path.join(HERE, f"{name}.tflite")
            with open(dst, "wb") as f:
                f.write(data)
            interp = interpreter(dst)
            arrays = signature_io(interp, np.random.default_rng(1000 + seed))
            if quant == "none":
                arrays["generate/prompts"] = np.array([p + [-1] * (PREFILL + 1 - len(p)) for p in PROMPTS], np.int32)
                arrays["generate/tokens"] = np.stack([litert_generate(interp, p) for p in PROMPTS])
            np.savez_compressed(os.path.join(HERE, f"{name}.npz"), **arrays)
            print(f"{name}: {len(data) / 1e6:.2f} MB, signatures {list(interp.get_signature_list())}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])  # optional architecture names: only those
