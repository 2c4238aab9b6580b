"""Generate the composite fixtures of tests/test_tflite_composites.py with litert-torch.

Run in a separate generator environment (the tests need neither torch nor
litert-torch)::

    python3 -m venv /work/genenv-composite
    /work/genenv-composite/bin/pip install torch litert-torch ai-edge-litert
    # torch 2.14.1, litert-torch 0.10.0, ai-edge-litert 2.3.0
    /work/genenv-composite/bin/python tests/data/composites/generate.py

``mqa.tflite``: a one-block decoder-only model built with litert-torch's
generative API (``model_builder.DecoderOnlyModel``), seeded random weights,
converted by ``converter.convert_to_tflite`` with one prefill length (8), a
32-entry KV cache in the default layout (K and V ``[1, 32, 1, 16]``) and the
prefill logits as an output (``output_logits_on_prefill=True``):

* attention with 4 query heads that all share one KV head (multi-query,
  ``num_query_groups=1``), head size 16, rotary embedding: written as an
  ``odml.scaled_dot_product_attention`` composite ``[1, T, 4, 16]`` x
  ``[1, 32, 1, 16]`` with a ``[1, 1, T, 32]`` mask;
* pre-attention layer norm (``odml.group_norm`` without ``reduction_axes``:
  litert-torch's layer norm), post-attention and final RMS norms
  (``odml.rms_norm``), GELU-tanh gated MLP; width 64, vocab 64.

``mqa.npz`` holds, for each signature (``prefill_8`` at positions 0..7,
``decode`` at position 13), on seeded inputs (random tokens and random KV
caches): ``<signature>/in/<name>``; ``<signature>/torch/<name>``: PyTorch's
own module (``model(tokens, input_pos, kv_cache)``, the module the file was
converted from) on the same inputs; ``<signature>/builtin/<name>``: LiteRT's
signature runner with the builtin kernels and no delegate
(``BUILTIN_WITHOUT_DEFAULT_DELEGATES``: the decomposition, op by op);
``<signature>/xnnpack/<name>``: LiteRT's default resolver (the XNNPACK
delegate, which runs the attention composite as one kernel).

What the run printed (litert-torch 0.10.0, ai-edge-litert 2.3.0): max
|builtin - torch| logits 3.84 (prefill) and 2.77 (decode), max |xnnpack -
torch| 1.7e-6 and 1.9e-6. The converter's decomposition of the one-KV-head
attention turns K [1, 32, 1, 16] into K^T [1, 1, 16, 32] with a RESHAPE
(a transpose was meant), so the builtin kernels multiply scrambled keys.
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
PREFILL, KV_LEN, VOCAB, WIDTH = 8, 32, 64, 64
DECODE_POS = 13


def mqa_config() -> cfg.ModelConfig:
    attn = cfg.AttentionConfig(num_heads=4, head_dim=16, num_query_groups=1, rotary_base=10000,
                               rotary_percentage=1.0)
    ff = cfg.FeedForwardConfig(type=cfg.FeedForwardType.GATED,
                               activation=cfg.ActivationConfig(cfg.ActivationType.GELU_TANH), intermediate_size=128)
    layer_norm = cfg.NormalizationConfig(type=cfg.NormalizationType.LAYER_NORM, epsilon=1e-5)
    rms = cfg.NormalizationConfig(type=cfg.NormalizationType.RMS_NORM, epsilon=1e-6)
    block = cfg.TransformerBlockConfig(attn_config=attn, ff_config=ff, pre_attention_norm_config=layer_norm,
                                       post_attention_norm_config=rms)
    return cfg.ModelConfig(vocab_size=VOCAB, num_layers=1, max_seq_len=KV_LEN, embedding_dim=WIDTH,
                           block_configs=block, final_norm_config=rms, lm_head_share_weight_with_embedding=False)


def build(config: cfg.ModelConfig, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = model_builder.DecoderOnlyModel(config, mask_cache_size=KV_LEN).eval()
    with torch.no_grad():  # weights of order 1 / sqrt(fan-in), norm scales around 1: logits of order 1
        for _, p in model.named_parameters():
            if p.ndim >= 2:
                p.normal_(0.0, 1.0 / np.sqrt(p.shape[-1]))
            else:
                p.uniform_(0.5, 1.5)
    return model


def torch_outputs(model, config, ins: dict, export_config: ExportConfig) -> dict:
    """The PyTorch module on the signature's inputs, keyed like the signature's outputs."""
    n = config.num_layers
    caches = tuple(kv_utils.KVCacheEntry(torch.from_numpy(ins[f"kv_cache_k_{i}"]),
                                         torch.from_numpy(ins[f"kv_cache_v_{i}"])) for i in range(n))
    with torch.no_grad():
        res = model(torch.from_numpy(ins["tokens"]), torch.from_numpy(ins["input_pos"]), kv_utils.KVCache(caches),
                    export_config=export_config)
    out = {"logits": res["logits"].numpy()}
    for i, e in enumerate(res["kv_cache"].caches):
        out[f"kv_cache_k_{i}"], out[f"kv_cache_v_{i}"] = e.k_cache.numpy(), e.v_cache.numpy()
    return out


def main() -> None:
    config = mqa_config()
    export_config = ExportConfig(output_logits_on_prefill=True)
    model = build(config, 7)
    with tempfile.TemporaryDirectory() as tmp:
        path = converter.convert_to_tflite(model, tmp, "mqa", [PREFILL], KV_LEN, quantize="none", config=config,
                                           export_config=export_config)
        data = open(path, "rb").read()
    dst = os.path.join(HERE, "mqa.tflite")
    with open(dst, "wb") as f:
        f.write(data)
    builtin = litert.Interpreter(model_path=dst,
                                 experimental_op_resolver_type=litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    xnnpack = litert.Interpreter(model_path=dst)  # the default resolver: XNNPACK delegate
    rng = np.random.default_rng(2026)
    arrays = {}
    for key in builtin.get_signature_list():
        details = builtin.get_signature_runner(key).get_input_details()
        n = int(details["tokens"]["shape"][-1])
        start = 0 if key.startswith("prefill") else DECODE_POS
        ins = {}
        for name, d in details.items():
            shape, dtype = tuple(d["shape"]), d["dtype"]
            if name == "tokens":
                ins[name] = rng.integers(0, VOCAB, shape).astype(dtype)
            elif name == "input_pos":
                ins[name] = np.arange(start, start + n).reshape(shape).astype(dtype)
            else:
                ins[name] = rng.standard_normal(shape).astype(dtype)
        arrays.update({f"{key}/in/{k}": v for k, v in ins.items()})
        for tag, interp in (("builtin", builtin), ("xnnpack", xnnpack)):
            res = interp.get_signature_runner(key)(**ins)
            arrays.update({f"{key}/{tag}/{k}": np.asarray(v) for k, v in res.items()})
        arrays.update({f"{key}/torch/{k}": v for k, v in torch_outputs(model, config, ins, export_config).items()})
        for tag in ("builtin", "xnnpack"):
            d = np.abs(arrays[f"{key}/{tag}/logits"] - arrays[f"{key}/torch/logits"]).max()
            print(f"{key}: max |{tag} - torch| logits {d:.3g}")
    np.savez_compressed(os.path.join(HERE, "mqa.npz"), **arrays)
    print(f"mqa.tflite: {len(data) / 1e3:.0f} kB; signatures {list(builtin.get_signature_list())}")


if __name__ == "__main__":
    main()
