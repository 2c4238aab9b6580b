"""Signatures as entry points: ``Model.signature(key)`` (issue 17 item 1).

A hand-built two-signature file in the shape of litert-torch's LLM exports:
subgraph 0 (``encode``) and subgraph 1 (``step``) read the same weight
buffer, and ``step``'s signature lists its inputs in another order than its
subgraph does. LiteRT's signature runner is the oracle.
"""

from __future__ import annotations

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fbjax
from fbjax.formats.tflite_builder import TFLiteBuilder
from conftest import require  # noqa: E402

RNG = np.random.default_rng(17)
W = RNG.standard_normal((3, 4)).astype(np.float32)
B = RNG.standard_normal(3).astype(np.float32)


def _two_signature_model() -> bytes:
    b = TFLiteBuilder()
    x = b.add_input([1, 4], name="x", shape_signature=[-1, 4])
    w = b.add_constant(W, name="dense/w")
    bias = b.add_constant(B, name="dense/b")
    y = b.add_tensor([1, 3], name="y", shape_signature=[-1, 3])
    b.add_op("FULLY_CONNECTED", [x, w, bias], [y])
    b.add_output(y)
    b.add_signature("encode", {"x": x}, {"y": y}, subgraph=0)
    b.add_subgraph("step")
    a = b.add_input([1, 4], name="a", shape_signature=[-1, 4])
    h = b.add_input([1, 3], name="h", shape_signature=[-1, 3])
    w1 = b.add_shared_constant(0, w)
    b1 = b.add_shared_constant(0, bias)
    t = b.add_tensor([1, 3], name="t", shape_signature=[-1, 3])
    out = b.add_tensor([1, 3], name="out", shape_signature=[-1, 3])
    b.add_op("FULLY_CONNECTED", [a, w1, b1], [t])
    b.add_op("ADD", [t, h], [out])
    b.add_output(out)
    b.add_signature("step", {"state": h, "inp": a}, {"next": out}, subgraph=1)  # not the subgraph's order
    b.set_subgraph(0)
    return b.build()


DATA = _two_signature_model()


def _litert(key: str, **inputs) -> dict:
    litert = require("ai_edge_litert.interpreter")
    interp = litert.Interpreter(model_content=DATA)
    runner = interp.get_signature_runner(key)
    return runner(**inputs)


def _close(got, want):
    """FULLY_CONNECTED over 4 terms (+ bias, + h): a few float32 roundings of values of order 1."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape
    assert np.max(np.abs(got - want) / np.maximum(1.0, np.abs(want))) <= 8 * 6 * np.finfo(np.float32).eps


def test_signatures_match_litert_signature_runner():
    model = fbjax.load(DATA)
    assert [k for k in model.signatures] == ["encode", "step"]
    step = model.signature("step")
    assert [s.name for s in step.inputs] == ["state", "inp"] and [s.name for s in step.outputs] == ["next"]
    assert step.inputs[1].shape == (None, 4)
    x = RNG.standard_normal((1, 4)).astype(np.float32)
    h = RNG.standard_normal((1, 3)).astype(np.float32)
    got = model.signature("encode")(x=x)
    assert list(got) == ["y"]
    _close(got["y"], _litert("encode", x=x)["y"])
    want = _litert("step", state=h, inp=x)["next"]
    _close(step(inp=x, state=h)["next"], want)
    _close(step(h, x)["next"], want)  # positional: the signature's order
    _close(step(h, inp=x)["next"], want)


def test_shared_weights_are_one_param_and_grad_reaches_them():
    model = fbjax.load(DATA)
    assert sorted(model.params) == ["dense/b", "dense/w"]  # subgraph 1's tensors on the same buffers
    step = model.signature("step")
    a = RNG.standard_normal((2, 4)).astype(np.float32)
    h = np.zeros((2, 3), np.float32)
    g = jax.jit(jax.grad(lambda p: jnp.sum(step.apply(p, inp=a, state=h)["next"])))(model.params)
    # d sum(a @ W.T + b) / dW[o, i] = sum_b a[b, i]; / db[o] = batch size
    np.testing.assert_allclose(np.asarray(g["dense/w"]), np.broadcast_to(a.sum(0), (3, 4)), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(g["dense/b"]), np.full(3, 2.0), rtol=1e-6)
    # new params change every signature: one pytree
    p2 = {**model.params, "dense/b": jnp.zeros(3)}
    y = model.signature("encode").apply(p2, a)["y"]
    np.testing.assert_allclose(np.asarray(y), a @ W.T, rtol=1e-5, atol=1e-6)


def test_signature_under_jit_vmap_and_infer():
    model = fbjax.load(DATA)
    step = model.signature("step")
    a = RNG.standard_normal((5, 1, 4)).astype(np.float32)
    h = RNG.standard_normal((5, 1, 3)).astype(np.float32)
    want = np.stack([_litert("step", state=h[i], inp=a[i])["next"] for i in range(5)])
    got = jax.vmap(lambda s, x: step(state=s, inp=x)["next"])(h, a)
    _close(got, want)
    got = jax.jit(lambda p, s, x: step.apply(p, s, x)["next"])(model.params, h[:, 0], a[:, 0])
    _close(got, want[:, 0])
    res = fbjax.infer(step, list(zip(h[:, 0], a[:, 0])), step_size=2)
    _close(res, want[:, 0])


def test_signature_errors():
    model = fbjax.load(DATA)
    with pytest.raises(fbjax.InputError, match=r"no signature 'decode'.*\['encode', 'step'\]"):
        model.signature("decode")
    step = model.signature("step")
    with pytest.raises(fbjax.InputError, match="has no input 'x'"):
        step(x=np.zeros((1, 4), np.float32))
    with pytest.raises(fbjax.InputError, match=r"missing input\(s\) \['inp'\]"):
        step(state=np.zeros((1, 3), np.float32))
    with pytest.raises(fbjax.InputError, match="input 'inp' has shape"):
        step(state=np.zeros((1, 3), np.float32), inp=np.zeros((1, 5), np.float32))


def test_cli_inspect_lists_and_run_runs_a_signature(tmp_path):
    path = tmp_path / "two.tflite"
    path.write_bytes(DATA)
    cli = [sys.executable, "-m", "fbjax"]
    out = subprocess.run(cli + ["inspect", str(path)], capture_output=True, text=True, check=True).stdout
    assert "signatures (2):" in out and "step  (graph 1)" in out
    assert "in  state: float32[?x3]" in out and "out next: float32[?x3]" in out
    h = RNG.standard_normal((1, 3)).astype(np.float32)
    np.save(tmp_path / "h.npy", h)
    res = subprocess.run(cli + ["run", str(path), "--signature", "step", "--input", f"state={tmp_path / 'h.npy'}",
                                "--repeat", "0", "--output", str(tmp_path / "o.npz")],
                         capture_output=True, text=True, check=True)
    assert "output next: float32[1x3]" in res.stdout
    o = np.load(tmp_path / "o.npz")["next"]
    assert o.shape == (1, 3)
    bad = subprocess.run(cli + ["run", str(path), "--signature", "nope"], capture_output=True, text=True)
    assert bad.returncode != 0 and "'encode', 'step'" in bad.stderr
