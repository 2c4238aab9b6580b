"""Fine-tuning LLM bundles from text (issue 37 items 5 and 6): ``bundle.loss``, LoRA adapters (float and
quantized weights), merged and written back into the bundle, run by the LiteRT-LM runtime.

The runtime's oracle is ``tests/data/llm_bundles/lora_text.json``: ``tests/data/llm_bundles/lora.py``
trained a rank-8 LoRA on the gemma fixture (float, and with its model section replaced by the int8 and
int4 litert-torch exports of tests/data/llm: QLoRA, integer weights kept), saved the adapters
(``lora_adapters.npz``), merged them into bundles and recorded what litert-lm 0.18.1 generated from
them. Here the adapters are merged again: the bytes must be the recorded ones (sha256), so the recorded
text is the runtime's output for what fbjax saves now.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fbjax
from fbjax import finetune
from fbjax.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "llm_bundles"
REC = json.loads((DATA / "lora_text.json").read_text())

_spec = importlib.util.spec_from_file_location("fbjax_lora_fixture", DATA / "lora.py")
LORA = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(LORA)


@pytest.fixture(scope="module")
def bundles():
    cache = {}

    def get(variant):
        if variant not in cache:
            cache[variant] = LORA.base_bundle(variant)
        return cache[variant]
    return get


def _log_softmax_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    logits = logits.astype(np.float64)
    m = logits.max(-1, keepdims=True)
    lse = (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))[..., 0]
    return lse - np.take_along_axis(logits, targets[..., None], -1)[..., 0]


def test_loss_equals_hand_made_prefill(bundles):
    """bundle.loss on one short text = the README's old hand-built prefill_16 call (tokens, positions,
    causal mask, empty cache) and a float64 cross-entropy of its logits; both are one float32 forward of
    the same graph, so they agree to float32 rounding of a mean of ~10 terms of size ~5."""
    b = bundles("f32")
    text = "the model runs on phones"
    ids = b.encode(text)
    pre = b.model.signature("prefill_16")
    spec = {s.name: s for s in pre.inputs}
    ins = {n: np.zeros(s.shape, s.dtype) for n, s in spec.items() if n.startswith("kv_cache_")}
    ins["tokens"] = np.zeros(spec["tokens"].shape, np.int32)
    ins["tokens"].reshape(-1)[:len(ids)] = ids
    ins["input_pos"] = np.arange(16, dtype=np.int32)
    ins["mask"] = np.where(np.arange(64)[None, :] <= np.arange(16)[:, None], 0.0, -np.inf).astype(
        np.float32).reshape(spec["mask"].shape)
    logits = np.asarray(pre(**ins)["logits"]).reshape(16, -1)[:len(ids) - 1]
    want = _log_softmax_nll(logits, np.asarray(ids[1:])).mean()
    got = float(b.loss(b.params, text))
    assert abs(got - want) <= 1e-5 * abs(want), (got, want)
    assert float(jax.jit(lambda p: b.loss(p, [text]))(b.params)) == pytest.approx(got, rel=1e-5)


def test_loss_chunks_equal_decode_steps(bundles):
    """A batch of two texts, one longer than a prefill chunk (16), padded: the prefill path (chunks,
    the KV cache carried between them) gives the same per-position logits as the decode signature fed
    one token at a time (lax.scan), the path llama-style bundles take; and the token-weighted mean equals
    the per-text losses' weighted mean."""
    b = bundles("f32")
    texts = ["the quick brown fox jumps over the lazy dog and people tune them for their own tasks every day",
             "hello there"]
    rows = finetune.text_tokens(b, texts)
    assert len(rows[0]) > 16 and len(rows[0]) <= 48
    r = b._runner
    toks = np.zeros(48, np.int32)
    toks[:len(rows[0])] = rows[0]
    pre = np.asarray(finetune._row_logits_prefill(r.pre, b.model.program, b.params, b.model.buffers,
                                                  jnp.asarray(toks), 3, 16))[:len(rows[0]) - 1]
    dec = np.asarray(finetune._row_logits_decode(r.dec, b.model.program, b.params, b.model.buffers,
                                                 jnp.asarray(toks[:len(rows[0])])))
    # float32 forward passes that sum attention over other lengths: bound |diff| by 1e-4 of the logits' size
    assert np.max(np.abs(pre - dec)) <= 1e-4 * np.max(np.abs(dec)), np.max(np.abs(pre - dec))
    each = [float(b.loss(b.params, t)) for t in texts]
    n = [len(x) - 1 for x in rows]
    assert float(b.loss(b.params, texts)) == pytest.approx((each[0] * n[0] + each[1] * n[1]) / sum(n), rel=1e-5)


def test_loss_refuses_what_it_cannot_take(bundles):
    b = bundles("f32")
    with pytest.raises(InputError, match="KV cache holds 64"):
        b.loss(b.params, " ".join(["the model runs on phones"] * 20))
    with pytest.raises(InputError, match="no texts"):
        b.loss(b.params, [])
    with pytest.raises(InputError, match="at least two"):
        b.loss(b.params, [""])
    with pytest.raises(InputError, match="matches no 2-D weight"):
        finetune.lora_init(b, include=["*no_such_weight*"])
    with pytest.raises(InputError, match="positive int"):
        finetune.lora_init(b, rank=0)


def test_lora_learns_a_sentence(bundles):
    """A rank-8 LoRA (B zero: the first loss is the base model's) trained with optax for 40 steps makes
    the float gemma fixture continue the prompt with the target sentence and stop."""
    b = bundles("f32")
    text = LORA.PROMPT + LORA.TARGET
    lora = finetune.lora_init(b, rank=8, include=LORA.INCLUDE, key=jax.random.key(1))
    assert lora.num_parameters == REC["variants"]["f32"]["trainable"] == sum(
        8 * sum(np.shape(b.params[n])) for n in lora.adapters)
    base = float(b.loss(b.params, text, add_stop=True))
    opt = optax.adam(1e-2)
    state = opt.init(lora)

    @jax.jit
    def step(lora, state):
        value, grads = jax.value_and_grad(lambda l: b.loss(b.params, text, lora=l, add_stop=True))(lora)
        updates, state = opt.update(grads, state)
        return optax.apply_updates(lora, updates), state, value

    first = None
    for _ in range(40):
        lora, state, value = step(lora, state)
        first = float(value) if first is None else first
    assert first == pytest.approx(base, rel=1e-5)
    assert float(b.loss(b.params, text, lora=lora, add_stop=True)) < 0.05 * base
    g = b.generate(LORA.PROMPT, template=False, params=finetune.lora_params(b.params, lora), return_tokens=True)
    assert g.text == LORA.TARGET.lstrip() and g.stopped == "stop_token"


def test_qlora_gradients_reach_every_adapter(bundles):
    """On the int8 bundle the adapted weights are integer buffers: the adapters run beside the hybrid
    kernels and every hybrid FULLY_CONNECTED passes gradients straight through (dx = g @ dequantize(W)).
    After one step (B no longer zero), every adapter's A and B get a nonzero gradient -- the first
    block's too, whose only way to the loss is through the later blocks' integer kernels; and with B zero
    the adapted model's loss is the base model's."""
    b = bundles("int8")
    text = LORA.PROMPT + LORA.TARGET
    lora = finetune.lora_init(b, rank=8, include=LORA.INCLUDE, key=jax.random.key(2))
    assert all(n in b.model.buffers for n in lora.adapters) and len(lora.adapters) == 10
    assert float(b.loss(b.params, text, lora=lora)) == float(b.loss(b.params, text))
    grad = jax.grad(lambda l: b.loss(b.params, text, lora=l))
    g0 = grad(lora)
    lora = jax.tree_util.tree_map(lambda x, d: x - 1e-2 * jnp.sign(d), lora, g0)
    for name, (da, db) in grad(lora).adapters.items():
        assert float(jnp.abs(da).max()) > 0 and float(jnp.abs(db).max()) > 0, name
    # the tied embedding / LM head is also read by a hybrid EMBEDDING_LOOKUP: no side path there
    with pytest.raises(InputError, match="EMBEDDING_LOOKUP input 1"):
        finetune.lora_init(b, include=["arith.constant*"])


def _recorded_lora(variant: str):
    z = np.load(DATA / "lora_adapters.npz")
    adapters, i = {}, 0
    while f"{variant}/{i}/name" in z:
        adapters[str(z[f"{variant}/{i}/name"])] = (z[f"{variant}/{i}/A"], z[f"{variant}/{i}/B"])
        i += 1
    return finetune.Lora(adapters, REC["alpha"])


@pytest.mark.parametrize("variant", ["f32", "int8", "int4"])
def test_merged_lora_bundle_runs_in_runtime(variant, bundles, tmp_path):
    """The committed adapters merged (quantized weights re-quantized on the file's grid) and saved give
    the bytes the runtime ran (sha256), and the runtime printed the target sentence. fbjax's greedy
    text of the saved bundle is the target too; for the float bundle its pieces equal the runtime's
    (the quantized ones run XNNPACK's int8 kernels in the runtime: see test_llm_bundles.py)."""
    rec = REC["variants"][variant]
    b = bundles(variant)
    lora = _recorded_lora(variant)
    assert len(lora.adapters) == 10 and lora.num_parameters == rec["trainable"]
    merged = finetune.merge_lora(b, b.params, lora)
    data = b.save(tmp_path / rec["bundle"], merged)
    assert hashlib.sha256(data).hexdigest() == rec["sha256"]
    assert rec["runtime_text"] == "".join(rec["runtime_pieces"]) == LORA.TARGET.lstrip()
    re = fbjax.load(tmp_path / rec["bundle"])
    assert re.generate(LORA.PROMPT, template=False) == LORA.TARGET.lstrip()
    if variant == "f32":
        assert list(re.stream(LORA.PROMPT, template=False)) == rec["runtime_pieces"]
        for n, (a, bb) in lora.adapters.items():
            want = np.asarray(b.params[n], np.float64) + REC["alpha"] / 8 * (bb.astype(np.float64) @ a)
            np.testing.assert_array_equal(np.asarray(re.params[n]), want.astype(np.float32))
    else:  # the integers saved are the float merge rounded on the file's grid (scales kept)
        for n in lora.adapters:
            assert n in re.model.buffers
            np.testing.assert_array_equal(np.asarray(re.model.buffers[n]).astype(np.int8), merged[n])
        # rounding to the nearest step moves a value inside the range by at most half a step, plus float32
        # rounding: of dequantize's q * scale at |q| <= 128 steps (128 * 2^-24 = 2^-17 steps) and of
        # w * f32(1 / scale) (two roundings, relative 2^-24 each): below 2^-16 steps; clipped ones further
        err = finetune.requantization_error(b, finetune.merge_lora(b, b.params, lora, requantize=False))
        assert max(e["max_steps_unclipped"] for e in err.values()) <= 0.5 + 2.0 ** -16
        assert all(e["max_steps"] >= e["max_steps_unclipped"] for e in err.values())
