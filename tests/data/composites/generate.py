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

``gqa_softcap.tflite`` / ``.npz``: the same with 4 query heads over 2 KV
heads and ``logit_softcap=3`` (the composite carries ``logit_cap``).
``group_norm.tflite`` / ``.npz``: a conv net with ``nn.GroupNorm(2, 8)``
converted by ``litert_torch.convert`` with ``ENABLE_GROUP_NORM_COMPOSITE``
(keys ``in``, ``torch``, ``builtin``, ``xnnpack``). Usage:
``generate.py [mqa|gqa_softcap|group_norm ...]`` (default: all).

What the run printed for ``mqa`` (litert-torch 0.10.0, ai-edge-litert
2.3.0): max |builtin - torch| logits 2.83 (prefill) and 3.04 (decode), max
|xnnpack - torch| 1.7e-6 for both; for ``gqa_softcap`` every oracle agrees
with PyTorch within 1.3e-6 and for ``group_norm`` within 3e-7. The converter's decomposition of the one-KV-head
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


def gqa_softcap_config() -> cfg.ModelConfig:
    """As :func:`mqa_config` with 4 query heads over 2 KV heads and attention logits soft-capped at
    3 (``logit_softcap``: the composite carries ``logit_cap``)."""
    config = mqa_config()
    attn = cfg.AttentionConfig(num_heads=4, head_dim=16, num_query_groups=2, rotary_base=10000,
                               rotary_percentage=1.0, logit_softcap=3.0)
    block = config.block_config(0)
    block = cfg.TransformerBlockConfig(attn_config=attn, ff_config=block.ff_config,
                                       pre_attention_norm_config=block.pre_attention_norm_config,
                                       post_attention_norm_config=block.post_attention_norm_config)
    return cfg.ModelConfig(vocab_size=VOCAB, num_layers=1, max_seq_len=KV_LEN, embedding_dim=WIDTH,
                           block_configs=block, final_norm_config=config.final_norm_config,
                           lm_head_share_weight_with_embedding=False)


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


def decoder(name: str, config: cfg.ModelConfig, seed: int) -> None:
    """Convert a one-block decoder, record its oracles in ``<name>.npz`` (see the module docstring)."""
    export_config = ExportConfig(output_logits_on_prefill=True)
    model = build(config, seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = converter.convert_to_tflite(model, tmp, name, [PREFILL], KV_LEN, quantize="none", config=config,
                                           export_config=export_config)
        data = open(path, "rb").read()
    dst = os.path.join(HERE, f"{name}.tflite")
    with open(dst, "wb") as f:
        f.write(data)
    builtin = litert.Interpreter(model_path=dst,
                                 experimental_op_resolver_type=litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    xnnpack = litert.Interpreter(model_path=dst)  # the default resolver: XNNPACK delegate
    rng = np.random.default_rng(2026 + seed)
    arrays = {}
    for key in builtin.get_signature_list():
        details = builtin.get_signature_runner(key).get_input_details()
        n = int(details["tokens"]["shape"][-1])
        start = 0 if key.startswith("prefill") else DECODE_POS
        ins = {}
        for iname, d in details.items():
            shape, dtype = tuple(d["shape"]), d["dtype"]
            if iname == "tokens":
                ins[iname] = rng.integers(0, VOCAB, shape).astype(dtype)
            elif iname == "input_pos":
                ins[iname] = np.arange(start, start + n).reshape(shape).astype(dtype)
            else:
                ins[iname] = rng.standard_normal(shape).astype(dtype)
        arrays.update({f"{key}/in/{k}": v for k, v in ins.items()})
        for tag, interp in (("builtin", builtin), ("xnnpack", xnnpack)):
            res = interp.get_signature_runner(key)(**ins)
            arrays.update({f"{key}/{tag}/{k}": np.asarray(v) for k, v in res.items()})
        arrays.update({f"{key}/torch/{k}": v for k, v in torch_outputs(model, config, ins, export_config).items()})
        for tag in ("builtin", "xnnpack"):
            d = np.abs(arrays[f"{key}/{tag}/logits"] - arrays[f"{key}/torch/logits"]).max()
            print(f"{name} {key}: max |{tag} - torch| logits {d:.3g}")
    np.savez_compressed(os.path.join(HERE, f"{name}.npz"), **arrays)
    print(f"{name}.tflite: {len(data) / 1e3:.0f} kB; signatures {list(builtin.get_signature_list())}")


class GroupNormNet(torch.nn.Module):
    """NCHW [1, 3, 8, 8] -> 3x3 conv to 8 channels -> GroupNorm(2 groups) -> SiLU -> 1x1 conv to 4."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.norm = torch.nn.GroupNorm(2, 8, eps=1e-5)
        self.head = torch.nn.Conv2d(8, 4, 1)

    def forward(self, x):
        return self.head(torch.nn.functional.silu(self.norm(self.conv(x))))


def group_norm() -> None:
    """``group_norm.tflite`` / ``.npz``: :class:`GroupNormNet` converted by ``litert_torch.convert``
    with ``ENABLE_GROUP_NORM_COMPOSITE`` (the NHWC ``odml.group_norm`` composite with
    ``reduction_axes``); keys ``in``, ``torch``, ``builtin``, ``xnnpack``."""
    import litert_torch

    litert_torch.config.enable_group_norm_composite = True
    torch.manual_seed(11)
    net = GroupNormNet().eval()
    with torch.no_grad():
        net.norm.weight.uniform_(0.5, 1.5)
        net.norm.bias.normal_(0.0, 0.5)
    x = np.random.default_rng(5).standard_normal((1, 3, 8, 8)).astype(np.float32)
    dst = os.path.join(HERE, "group_norm.tflite")
    litert_torch.convert(net, (torch.from_numpy(x),)).export(dst)
    arrays = {"in": x}
    with torch.no_grad():
        arrays["torch"] = net(torch.from_numpy(x)).numpy()
    for tag, kw in (("builtin", dict(experimental_op_resolver_type=litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)),
                    ("xnnpack", {})):
        interp = litert.Interpreter(model_path=dst, **kw)
        interp.allocate_tensors()
        interp.set_tensor(interp.get_input_details()[0]["index"], x)
        interp.invoke()
        arrays[tag] = interp.get_tensor(interp.get_output_details()[0]["index"])
        print(f"group_norm: max |{tag} - torch| {np.abs(arrays[tag] - arrays['torch']).max():.3g}")
    np.savez_compressed(os.path.join(HERE, "group_norm.npz"), **arrays)
    print(f"group_norm.tflite: {os.path.getsize(dst) / 1e3:.0f} kB")


def main(only=()) -> None:
    jobs = {"mqa": lambda: decoder("mqa", mqa_config(), 7),
            "gqa_softcap": lambda: decoder("gqa_softcap", gqa_softcap_config(), 8),
            "group_norm": group_norm}
    for name, job in jobs.items():
        if not only or name in only:
            job()


if __name__ == "__main__":
    main(sys.argv[1:])  # optional fixture names: only those
