"""``fbjax.infer`` on litert-torch's batch-1 signatures (issue 17 item 1).

litert-torch's signatures have a fixed leading dimension of 1: no batch
dimension to rewrite. ``fbjax.infer(model.signature(key), examples)`` runs
them under ``jax.vmap`` over a stack of examples (each input without its
leading 1; rank-0/1 inputs such as positions whole). The oracle is a Python
loop of the signature's own single calls ``sig(**example)`` on the same
examples, and, for the fixtures' recorded example, LiteRT's signature runner.

Tolerance (vmapped versus single calls are different XLA programs; the
per-example math is the same): the batched program may order and fuse each
float32 sum differently. Every output element comes from chains of sums; a
sum of ``n`` terms in two orders differs by at most ``2 gamma_n`` times the sum
of its terms' magnitudes, and along the deepest chain the lengths add up (K
below, counted from the fixtures' configurations). Activations are
RMS/layer-normalised before every sum (weights of order ``1/sqrt(fan-in)``):
the magnitudes stay of order ``max(1, |output|)``, so the bound is
``2 gamma_K max(1, |ref|)``, 2.8e-4 for the LLM (seen: err/bound up to
0.04 on gemma's prefill logits, 0.002 on the ViT; ``pytest -s``). A
signature that mixed examples, dropped the size-1 dimension on the wrong
input or returned another example's row is off by order 1.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import fbjax

from conftest import assert_within, gamma
from helpers import K_VIT

HERE = os.path.dirname(__file__)
LLM = os.path.join(HERE, "data", "llm")
VISION = os.path.join(HERE, "data", "litert_torch")
RNG = np.random.default_rng(1717)

# LLM fixtures (tests/data/llm/generate.py): 2 blocks of width W = 128, 4 heads of dimension 32,
# MLP 256, KV length 64; per block the deepest chain: RMS norm (W), QKV projection (W), scores
# (32), softmax (64), the weighted sum of values (64), output projection (W), RMS norm (W), gated
# MLP in (W) and out (256); then the final norm (W) and the LM head (W)
K_LLM = 2 * (128 + 128 + 32 + 64 + 64 + 128 + 128 + 128 + 256) + 128 + 128


def _bound(ref, k: int):
    return 2 * gamma(k) * np.maximum(1.0, np.abs(np.asarray(ref, np.float64)))


def _recorded(name: str, key: str):
    z = np.load(os.path.join(LLM, f"{name}.npz"))
    ins = {k.split("/")[-1]: z[k] for k in z.files if k.startswith(f"{key}/in/")}
    outs = {k.split("/")[-1]: z[k] for k in z.files if k.startswith(f"{key}/out/")}
    return ins, outs


def _example_of(x, spec):
    """An input as one example: without the leading 1 of a rank >= 2 input."""
    return x[0] if len(spec.shape) >= 2 and spec.shape[0] == 1 else x


def _as_input(x, spec):
    return x[None] if len(spec.shape) >= 2 and spec.shape[0] == 1 else x


def _llm_examples(sig, n: int) -> list:
    """The fixture's recorded inputs first, then ``n - 1`` others: other tokens, a random KV cache."""
    rec, _ = _recorded("gemma_f32", sig.key)
    exs = [{s.name: _example_of(rec[s.name], s) for s in sig.inputs}]
    for _ in range(n - 1):
        ex = dict(exs[0])
        ex["tokens"] = RNG.integers(0, 256, ex["tokens"].shape).astype(ex["tokens"].dtype)
        for s in sig.inputs:
            if s.name.startswith("kv_cache_"):
                ex[s.name] = (0.5 * RNG.standard_normal(ex[s.name].shape)).astype(np.float32)
        exs.append(ex)
    return exs


def _loop(sig, exs: list) -> list:
    """The oracle: one call of the signature per example, outputs without the leading 1."""
    rows = [sig(**{s.name: _as_input(ex[s.name], s) for s in sig.inputs}) for ex in exs]
    return [np.stack([_example_of(np.asarray(r[s.name]), s) for r in rows]) for s in sig.outputs]


@pytest.fixture(scope="module")
def gemma():
    return fbjax.load(os.path.join(LLM, "gemma_f32.tflite"))


@pytest.mark.parametrize("key", ["prefill_16", "decode"])
def test_infer_on_a_batch1_llm_signature_equals_a_loop_of_calls(gemma, key):
    """gemma's signatures: tokens, positions (rank 1: given whole), a mask and 4 KV-cache tensors in; the
    updated caches and logits out. 3 examples in steps of 2 (the last step padded), given as dicts keyed
    by input name."""
    sig = gemma.signature(key)
    assert sig.has_fixed_shapes()
    exs = _llm_examples(sig, 3)
    got = fbjax.infer(sig, exs, step_size=2, progress=False)
    want = _loop(sig, exs)
    assert len(got) == len(sig.outputs)
    for s, g, w in zip(sig.outputs, got, want):
        assert g.shape == w.shape == (3, *s.shape[1:])
        assert_within(g, w, _bound(w, K_LLM), f"{key} {s.name}")
    # the recorded example against LiteRT's signature runner (the 1e-4 bound): the size-1
    # dimensions went back where the signature has them
    _, rec = _recorded("gemma_f32", key)
    for s, g in zip(sig.outputs, got):
        ref = _example_of(rec[s.name], s)
        assert np.max(np.abs(g[0] - ref) / np.maximum(1.0, np.abs(ref))) <= 1e-4, s.name
    # the examples differ, and so do their results (no example's row is another's)
    assert np.max(np.abs(got[-1][0] - got[-1][1])) > 0.1


def test_infer_takes_a_dict_of_stacked_inputs_and_tuples_in_signature_order(gemma):
    sig = gemma.signature("decode")
    exs = _llm_examples(sig, 2)
    stacked = {s.name: np.stack([ex[s.name] for ex in exs]) for s in sig.inputs}
    a = fbjax.infer(sig, stacked, progress=False)
    b = fbjax.infer(sig, [tuple(ex[s.name] for s in sig.inputs) for ex in exs], progress=False)
    for x, y in zip(a, b):  # the same jitted program on the same stacked batch
        np.testing.assert_array_equal(x, y)
    with pytest.raises(fbjax.InputError, match=r"missing \['mask'\]"):
        fbjax.infer(sig, {k: v for k, v in stacked.items() if k != "mask"}, progress=False)
    with pytest.raises(fbjax.InputError, match=r"unknown \['tokenz'\]"):
        fbjax.infer(sig, [dict(exs[0], tokenz=exs[0]["tokens"])], progress=False)
    with pytest.raises(fbjax.InputError, match=r"'tokens'.*has shape \(1, 1\), expected \(1,\)"):
        fbjax.infer(sig, [dict(exs[0], tokens=exs[0]["tokens"][None])], progress=False)


@pytest.fixture(scope="module")
def vit():
    return fbjax.load(os.path.join(VISION, "vit_f32.tflite"))


def test_infer_on_a_batch1_vision_signature_equals_a_loop_of_calls(vit):
    sig = vit.signature("serving_default")
    rec = np.load(os.path.join(VISION, "vit_f32.npz"))
    xs = np.concatenate([rec["x"], RNG.standard_normal((4, 3, 32, 32)).astype(np.float32)])
    got = fbjax.infer(sig, xs, step_size=2, progress=False)  # one input, one output: arrays
    assert got.shape == (5, 10)
    want = _loop(sig, [{"args_0": x} for x in xs])[0]
    assert_within(got, want, _bound(want, K_VIT), "vit serving_default")
    assert np.max(np.abs(got[0] - rec["litert"][0]) / np.maximum(1.0, np.abs(rec["litert"][0]))) <= 1e-4


def test_cli_infer_signature(tmp_path, vit):
    d = tmp_path / "samples"
    d.mkdir()
    xs = RNG.standard_normal((3, 3, 32, 32)).astype(np.float32)
    for i, x in enumerate(xs):
        np.savez(d / f"{i}.npz", args_0=x)
    out = tmp_path / "o.npz"
    cli = [sys.executable, "-m", "fbjax", "infer", os.path.join(VISION, "vit_f32.tflite"), "--input-dir", str(d),
           "--out", str(out), "--no-progress"]
    res = subprocess.run(cli + ["--signature", "serving_default"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    got = np.load(out)["output_0"]
    sig = vit.signature("serving_default")
    want = _loop(sig, [{"args_0": x} for x in xs])[0]
    assert_within(got, want, _bound(want, K_VIT), "fbjax infer --signature")
    bad = subprocess.run(cli + ["--signature", "nope"], capture_output=True, text=True)
    assert bad.returncode != 0 and "serving_default" in bad.stderr
