"""Make realistic-size ``.litertlm`` LLM bundles for the side-by-side benchmark (issue 34): a public
architecture configuration, seeded random weights, exported by litert-torch, bundled by litert-lm-builder.

Nothing here is committed but this script: the bundles are 100-200 MB (135M) or ~1-2 GB (1B). Run it in a
separate generator environment (fbjax needs none of these packages)::

    python3 -m venv /work/genenv-llm
    /work/genenv-llm/bin/pip install torch==2.14.1 torchvision==0.29.1 litert-torch==0.10.0 \\
        ai-edge-litert==2.3.0 litert-lm-builder litert-lm-api litert-lm==0.18.1 sentencepiece tokenizers
    # resolved (2026-12-07): torch 2.14.1, litert-torch 0.10.0, ai-edge-litert 2.3.0, ai-edge-quantizer 0.10.0,
    # litert-lm / litert-lm-api / litert-lm-builder 0.18.1, tokenizers 0.23.3, sentencepiece 0.2.3
    /work/genenv-llm/bin/python benchmarks/make_llm_bundles.py [OUT_DIR] [--config smollm2-135m]
        [--quant int8 int4] [--prefill 128] [--kv 256]

Measured (2-core machine, load average 12-14 from other jobs, ``nice -n 5``): each 135M quantization
exports in 7 min (411 s int8, 429 s int4; the two torch.export traces and MLIR lowerings take 1.3 min each),
peak RSS 3.9 GB (f32: 596 s, the same RSS); the bundles are 142.7 MB (int8), 79.1 MB (int4), 541.3 MB
(f32). The runtime's side of the benchmark: ``benchmarks/llm_runtime_side.py BUNDLE --processes 3`` in this
environment.

``OUT_DIR`` defaults to ``/work/bundles``. Written there, per configuration ``C`` and quantization ``Q``:

* ``C_Q.litertlm``: the bundle (TFLite PREFILL_DECODE model, HF tokenizer, LlmMetadata, ExecutorMetadata);
* ``C_Q.tflite``: the same model outside the bundle (for ``ai_edge_litert``'s Interpreter / ``fbjax inspect``);
* ``C_tokenizer.json``: the tokenizer (shared by every quantization of ``C``);
* ``manifest.json``: per bundle its size, the export and bundling seconds, and the signatures with their inputs
  and outputs (name, shape, dtype) as ``ai_edge_litert.interpreter.Interpreter.get_signature_list`` and the
  signature runners report them.

Configurations (``--config``; values of the public HuggingFace ``config.json``):

* ``smollm2-135m`` (default): HuggingFaceTB/SmolLM2-135M, ``LlamaForCausalLM``: 30 layers, hidden 576,
  intermediate 1536 (SiLU-gated MLP), 9 query heads over 3 KV heads, head_dim 64, vocabulary 49152,
  ``rope_theta`` 100000, ``tie_word_embeddings`` true, RMS norm eps 1e-5, ``max_position_embeddings`` 8192.
  The same as litert-torch's ``examples/smollm/smollm.py`` ``get_model_config_v2``.
* ``llama3.2-1b``: meta-llama/Llama-3.2-1B, ``LlamaForCausalLM``: 16 layers, hidden 2048, intermediate 8192,
  32 query heads over 8 KV heads, head_dim 64, vocabulary 128256, ``rope_theta`` 500000 with the ``llama3``
  rope scaling (factor 32, low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 8192),
  tied embeddings, RMS norm eps 1e-5 (litert-torch's ``examples/llama/llama.py`` rope). 1.24 G parameters: the
  float32 torch model alone is 4.9 GB; the 135M export peaked at 3.9 GB RSS (7x its 0.54 GB of float32
  weights), so expect ~35 GB here: not run on the 24 GB development machine (its tokenizer of 128256 entries
  and a 1-layer model of this config were checked to build and run).

Model: ``litert_torch.generative.utilities.model_builder.DecoderOnlyModel`` built from that config (as
``tests/data/llm/generate.py`` does for its tiny ones), weights drawn from a seeded normal of std
``1 / sqrt(fan-in)`` (norm scales uniform in [0.5, 1.5]), converted by ``converter.convert_to_tflite`` with
one prefill signature per ``--prefill`` length (default 128: a 64-token prompt and its start token fit one
call), a KV cache of ``--kv`` positions (default 256: 64 prompt + 128 new tokens fit), the default KV layout
(K and V ``[1, KV, kv_heads, head_dim]``, no mask input; the mask is built inside the model), and
``quantize="dynamic_int8"`` (``int8``) or ``"dynamic_int4_block32"`` (``int4``), ``"none"`` (``f32``).

Tokenizer: a HuggingFace ``tokenizers`` byte-level BPE (GPT-2 / SmolLM2 style: ``ByteLevel`` pre-tokenizer
and decoder, no prefix space) trained here on :func:`corpus` (seeded sentences of common English words plus
seeded pseudo-words, enough distinct pairs for the trainer to reach the full size) to exactly the model's
vocabulary (49152 or 128256 entries), so every id the model can emit decodes and any text encodes (bytes).
Special tokens as SmolLM2's: ``<|endoftext|>`` 0, ``<|im_start|>`` 1, ``<|im_end|>`` 2.

LlmMetadata: start token 1 (``<|im_start|>``), stop tokens 0 and 2, ``max_num_tokens`` = ``--kv``, greedy
sampler params (top-k 1), ChatML prompt templates (``<|im_start|>user\\n`` ... ``<|im_end|>\\n``), generic
model type. ExecutorMetadata: every KV buffer ``kv_cache_{k,v}_{i}`` with ``sequence_axis: 1`` (the
runtime needs it to see the cache length of the default layout; as ``tests/data/llm_bundles/generate.py``).

litert-torch's LoRA module imports ``tensorflow.lite.python.schema_py_generated``;
``tests/data/litert_schema_shim.py`` stands ai-edge-litert's identical bindings in for it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
QUANT = {"f32": "none", "int8": "dynamic_int8", "int4": "dynamic_int4_block32"}
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
START, STOPS = 1, (0, 2)

#: public HuggingFace config.json values (see the module docstring)
CONFIGS = {
    "smollm2-135m": dict(layers=30, hidden=576, intermediate=1536, heads=9, kv_heads=3, head_dim=64,
                         vocab=49152, rope_theta=100000, rope_scaling=None, eps=1e-5, max_pos=8192, seed=135),
    "llama3.2-1b": dict(layers=16, hidden=2048, intermediate=8192, heads=32, kv_heads=8, head_dim=64,
                        vocab=128256, rope_theta=500000,
                        rope_scaling=dict(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                          original_max_position_embeddings=8192),
                        eps=1e-5, max_pos=131072, seed=1000),
}

_ENGLISH = (
    "the of and to a in is it you that he was for on are with as I his they be at one have this from or had by "
    "hot word but what some we can out other were all there when up use your how said an each she which do their "
    "time if will way about many then them write would like so these her long make thing see him two has look "
    "more day could go come did number sound no most people my over know water than call first who may down side "
    "been now find any new work part take get place made live where after back little only round man year came "
    "show every good me give our under name very through just form sentence great think say help low line differ "
    "turn cause much mean before move right boy old too same tell does set three want air well also play small "
    "end put home read hand port large spell add even land here must big high such follow act why ask men change "
    "went light kind off need house picture try us again animal point mother world near build self earth father "
    "head stand own page should country found answer school grow study still learn plant cover food sun four "
    "between state keep eye never last let thought city tree cross farm hard start might story saw far sea draw "
    "left late run while press close night real life few north open seem together next white children begin got "
    "walk example ease paper group always music those both mark often letter until mile river car feet care "
    "second book carry took science eat room friend began idea fish mountain stop once base hear horse cut sure "
    "watch color face wood main enough plain girl usual young ready above ever red list though feel talk bird "
    "soon body dog family direct pose leave song measure door product black short numeral class wind question "
    "happen complete ship area half rock order fire south problem piece told knew pass since top whole king "
    "space heard best hour better true during hundred five remember step early hold west ground interest reach "
    "fast verb sing listen six table travel less morning ten simple several vowel toward war lay against pattern "
    "slow center love person money serve appear road map rain rule govern pull cold notice voice unit power town "
    "fine certain fly fall lead cry dark machine note wait plan figure star box noun field rest correct able "
    "pound done beauty drive stood contain front teach week final gave green oh quick develop ocean warm free "
    "minute strong special mind behind clear tail produce fact street inch multiply nothing course stay wheel "
    "full force blue object decide surface deep moon island foot system busy test record boat common gold "
    "possible plane stead dry wonder laugh thousand ago ran check game shape equate hot miss brought heat snow "
    "tire bring yes distant fill east paint language among model phone cloud tune task token prompt network "
    "weights file bundle chat user assistant answer data small fox jumps lazy brown hello there").split()
_SYLLABLES = [c + v for c in "bcdfghjklmnprstvwxyz" for v in ("a", "e", "i", "o", "u", "ai", "ou", "ee")]


def corpus(n_pseudo: int, seed: int = 0) -> list[str]:
    """Lines of training text: 20000 seeded sentences of :data:`_ENGLISH` words (capitalised, punctuated,
    some digits) and ``n_pseudo`` distinct seeded pseudo-words of 2-5 syllables, 12 per line."""
    rng = random.Random(seed)
    lines = []
    for _ in range(20000):
        words = [rng.choice(_ENGLISH) for _ in range(rng.randint(4, 16))]
        if rng.random() < 0.2:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 2025)))
        lines.append(" ".join(words).capitalize() + rng.choice(".?!,;:"))
    seen, pseudo = set(), []
    while len(pseudo) < n_pseudo:
        w = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 5)))
        if w not in seen:
            seen.add(w)
            pseudo.append(w)
    lines += [" ".join(pseudo[i:i + 12]) for i in range(0, len(pseudo), 12)]
    return lines


def train_tokenizer(vocab: int, out: str) -> None:
    """A byte-level BPE of exactly ``vocab`` entries (see the module docstring), saved as ``tokenizer.json``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(n_pseudo=vocab * 2), trainer)
    if tok.get_vocab_size() != vocab:
        raise SystemExit(f"tokenizer has {tok.get_vocab_size()} entries, not {vocab}: enlarge the corpus")
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    for i in range(vocab):  # every id decodes
        tok.decode([i], skip_special_tokens=False)
    tok.save(out)


def model_config(c: dict):
    import litert_torch.generative.layers.model_config as cfg

    attn = cfg.AttentionConfig(num_heads=c["heads"], head_dim=c["head_dim"], num_query_groups=c["kv_heads"],
                               rotary_base=c["rope_theta"], rotary_percentage=1.0)
    ff = cfg.FeedForwardConfig(type=cfg.FeedForwardType.GATED, activation=cfg.ActivationConfig(cfg.ActivationType.SILU),
                               intermediate_size=c["intermediate"])
    norm = cfg.NormalizationConfig(type=cfg.NormalizationType.RMS_NORM, epsilon=c["eps"])
    block = cfg.TransformerBlockConfig(attn_config=attn, ff_config=ff, pre_attention_norm_config=norm,
                                       post_attention_norm_config=norm)
    extra = {}  # ModelConfig's default build_rope unless the config scales the rope
    if c["rope_scaling"]:
        from functools import partial

        import torch
        from litert_torch.generative.examples.llama import llama

        s = c["rope_scaling"]
        extra["build_rope"] = partial(llama._build_llama3_rope_cache, condense_ratio=1, dtype=torch.float32,
                                      device=torch.device("cpu"), factor=s["factor"],
                                      low_freq_factor=s["low_freq_factor"], high_freq_factor=s["high_freq_factor"],
                                      max_seq_len=s["original_max_position_embeddings"])
    return cfg.ModelConfig(vocab_size=c["vocab"], num_layers=c["layers"], max_seq_len=c["max_pos"],
                           embedding_dim=c["hidden"], block_configs=block, final_norm_config=norm,
                           lm_head_share_weight_with_embedding=True, **extra)


def build(config, seed: int, kv: int):
    import torch
    from litert_torch.generative.utilities import model_builder

    torch.manual_seed(seed)
    model = model_builder.DecoderOnlyModel(config, mask_cache_size=kv).eval()
    with torch.no_grad():  # weights of order 1 / sqrt(fan-in), norms around 1: logits of order 1
        for _, p in model.named_parameters():
            if p.ndim >= 2:
                p.normal_(0.0, 1.0 / np.sqrt(p.shape[-1]))
            else:
                p.uniform_(0.5, 1.5)
    return model


def llm_metadata(path: str, kv: int) -> None:
    from google.protobuf import text_format
    from litert_lm_builder.runtime.proto import llm_metadata_pb2

    msg = llm_metadata_pb2.LlmMetadata()
    msg.start_token.token_ids.ids.append(START)
    for s in STOPS:
        msg.stop_tokens.add().token_ids.ids.append(s)
    msg.max_num_tokens = kv
    msg.sampler_params.type = msg.sampler_params.TOP_P
    msg.sampler_params.k = 1
    msg.sampler_params.p = 0.95
    msg.sampler_params.temperature = 1.0
    msg.sampler_params.seed = 0
    text_format.Parse('user { prefix: "<|im_start|>user\\n" suffix: "<|im_end|>\\n" } '
                      'model { prefix: "<|im_start|>assistant\\n" suffix: "<|im_end|>\\n" }', msg.prompt_templates)
    msg.llm_model_type.generic_model.SetInParent()
    open(path, "wb").write(msg.SerializeToString())


def executor_metadata(path: str, layers: int) -> None:
    from litert_lm_builder.runtime.proto import executor_metadata_pb2

    msg = executor_metadata_pb2.ExecutorMetadata()
    for i in range(layers):
        for kv, t in (("k", 1), ("v", 2)):  # TYPE_GLOBAL_KEY_CACHE, TYPE_GLOBAL_VALUE_CACHE
            b = msg.llm_executor_metadata.state_buffers.add()
            name = f"kv_cache_{kv}_{i}"
            b.prefill_input_name = b.prefill_output_name = b.decode_input_name = b.decode_output_name = name
            b.type = t
            b.sequence_axis = 1
    open(path, "wb").write(msg.SerializeToString())


def build_litertlm(out: str, tflite: str, tokenizer: str, meta: str, exec_meta: str) -> None:
    import litert_lm_builder as lb

    b = lb.LitertLmFileBuilder()
    b.add_system_metadata(lb.Metadata(key="Authors", value="fbjax benchmarks (random weights)",
                                      dtype=lb.DType.STRING))
    b.add_tflite_model(tflite, lb.TfLiteModelType.PREFILL_DECODE)
    b.add_hf_tokenizer(tokenizer)
    b.add_llm_metadata(meta, supports_thinking=False, supports_function_calling=False)
    b.add_executor_metadata(exec_meta)
    with open(out, "wb") as f:
        b.build(f, validate_metadata=True)


def signatures(tflite: str) -> dict:
    """``{signature: {"inputs": {name: [shape, dtype]}, "outputs": {...}}}`` from ai_edge_litert."""
    from ai_edge_litert import interpreter as litert

    interp = litert.Interpreter(model_path=tflite)
    out = {}
    for key in interp.get_signature_list():
        r = interp.get_signature_runner(key)
        out[key] = {side: {n: [list(map(int, d["shape"])), np.dtype(d["dtype"]).name] for n, d in det.items()}
                    for side, det in (("inputs", r.get_input_details()), ("outputs", r.get_output_details()))}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", nargs="?", default="/work/bundles")
    ap.add_argument("--config", default="smollm2-135m", choices=sorted(CONFIGS))
    ap.add_argument("--quant", nargs="+", default=["int8", "int4"], choices=sorted(QUANT))
    ap.add_argument("--prefill", nargs="+", type=int, default=[128])
    ap.add_argument("--kv", type=int, default=256)
    ap.add_argument("--layers", type=int, default=None,
                    help="override the configuration's layer count (the bundle is named C-Nl_Q: a 1B-class "
                         "configuration with fewer layers, to measure what each layer adds where the full "
                         "model's export does not fit this machine)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    c = dict(CONFIGS[args.config])
    if args.layers is not None:
        c["layers"] = args.layers
        args.config = f"{args.config}-{args.layers}l"

    import torch
    import torch._dynamo  # noqa: F401  (before the shim: dynamo probes which packages exist)

    sys.path.insert(0, os.path.join(HERE, "..", "tests", "data"))
    import litert_schema_shim

    litert_schema_shim.install()
    from litert_torch.generative.utilities import converter
    from litert_torch.generative.utilities.export_config import ExportConfig

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    tok = os.path.join(args.out, f"{args.config}_tokenizer.json")
    if not os.path.exists(tok):
        t = time.perf_counter()
        train_tokenizer(c["vocab"], tok)
        print(f"tokenizer: {c['vocab']} entries, {time.perf_counter() - t:.1f} s", flush=True)
    man_path = os.path.join(args.out, "manifest.json")
    manifest = json.load(open(man_path)) if os.path.exists(man_path) else {}
    config = model_config(c)
    for q in args.quant:
        name = f"{args.config}_{q}"
        t0 = time.perf_counter()
        model = build(config, c["seed"], args.kv)
        with tempfile.TemporaryDirectory(dir=args.out) as tmp:
            path = converter.convert_to_tflite(model, tmp, name, list(args.prefill), args.kv, quantize=QUANT[q],
                                               config=config, export_config=ExportConfig())
            del model
            tflite = os.path.join(args.out, f"{name}.tflite")
            os.replace(path, tflite)
            t1 = time.perf_counter()
            meta, exe = os.path.join(tmp, "meta.pb"), os.path.join(tmp, "exec.pb")
            llm_metadata(meta, args.kv)
            executor_metadata(exe, c["layers"])
            bundle = os.path.join(args.out, f"{name}.litertlm")
            build_litertlm(bundle, tflite, tok, meta, exe)
            t2 = time.perf_counter()
        manifest[name] = {"config": args.config, "architecture": {k: v for k, v in c.items() if k != "seed"},
                          "seed": c["seed"], "quantize": QUANT[q], "prefill": args.prefill, "kv_cache": args.kv,
                          "bundle": bundle, "bundle_bytes": os.path.getsize(bundle), "tflite": tflite,
                          "tflite_bytes": os.path.getsize(tflite), "export_s": round(t1 - t0, 1),
                          "bundle_s": round(t2 - t1, 1), "tokenizer": tok, "start_token": START,
                          "stop_tokens": list(STOPS), "signatures": signatures(tflite)}
        json.dump(manifest, open(man_path, "w"), indent=1)
        print(f"{name}: {os.path.getsize(bundle) / 1e6:.1f} MB, export {t1 - t0:.0f} s, bundle {t2 - t1:.1f} s, "
              f"signatures {list(manifest[name]['signatures'])}", flush=True)


if __name__ == "__main__":
    main()
