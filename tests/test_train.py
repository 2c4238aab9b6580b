"""fbjax.trainable and the fine-tuning example.

The split is checked by name (globs, regexes, predicates, include and
exclude); training through it is checked by what must change (the trainable
weights, and the loss going down on a problem with a known solution) and
what must not (the frozen weights, which receive no gradient at all).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fbjax
from fbjax.formats.tflite_builder import TFLiteBuilder
from fbjax.train import merge
from conftest import require  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
F32 = np.float32


def _mlp() -> bytes:
    rng = np.random.default_rng(0)
    b = TFLiteBuilder()
    x = b.add_input((4, 3), name="x")
    h = b.add_tensor((4, 8), name="h")
    y = b.add_tensor((4, 2), name="y")
    w1 = b.add_tensor(data=rng.standard_normal((8, 3)).astype(F32), name="dense_1/kernel")
    b1 = b.add_tensor(data=np.zeros(8, F32), name="dense_1/bias")
    w2 = b.add_tensor(data=rng.standard_normal((2, 8)).astype(F32) * 0.3, name="dense_2/kernel")
    b2 = b.add_tensor(data=np.zeros(2, F32), name="dense_2/bias")
    b.add_op("FULLY_CONNECTED", [x, w1, b1], [h], options=dict(fused_activation_function="RELU6"))
    b.add_op("FULLY_CONNECTED", [h, w2, b2], [y], options=dict(fused_activation_function="NONE"))
    b.add_output(y)
    return b.build()


def test_trainable_selects_by_name():
    params = {k: np.zeros(1) for k in ["dense_1/kernel", "dense_1/bias", "dense_2/kernel", "dense_2/bias"]}
    t, f = fbjax.trainable(params, include="dense_2/*")
    assert sorted(t) == ["dense_2/bias", "dense_2/kernel"] and sorted(f) == ["dense_1/bias", "dense_1/kernel"]
    t, f = fbjax.trainable(params, exclude=["*bias"])
    assert sorted(t) == ["dense_1/kernel", "dense_2/kernel"]
    t, f = fbjax.trainable(params, include=re.compile(r"_1/"), exclude=lambda n: n.endswith("kernel"))
    assert list(t) == ["dense_1/bias"] and len(f) == 3
    t, f = fbjax.trainable(params)
    assert len(t) == 4 and not f
    assert set(merge(t, f)) == set(params)
    with pytest.raises(TypeError):
        fbjax.trainable(params, include=[3])


def test_trainable_casts_only_the_trainable_part():
    params = {"a": jnp.ones(2, jnp.float16), "b": jnp.ones(2, jnp.float16)}
    t, f = fbjax.trainable(params, include="a", dtype=jnp.float32)
    assert t["a"].dtype == jnp.float32 and f["b"].dtype == jnp.float16


def test_grad_and_optax_update_only_the_trainable_part():
    optax = require("optax")
    model = fbjax.load(_mlp())
    t, frozen = fbjax.trainable(model.params, include="dense_2/*")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 3)).astype(F32)
    target = rng.standard_normal((4, 2)).astype(F32)

    def loss(tr):
        return jnp.mean((model.apply(merge(frozen, tr), x) - target) ** 2)

    g = jax.grad(loss)(t)
    assert set(g) == {"dense_2/kernel", "dense_2/bias"}
    assert all(float(jnp.abs(v).max()) > 0 for v in g.values())
    opt = optax.adam(0.05)
    state = opt.init(t)
    l0 = float(loss(t))

    @jax.jit
    def step(tr, st):
        grads = jax.grad(loss)(tr)
        upd, st = opt.update(grads, st, tr)
        return optax.apply_updates(tr, upd), st

    for _ in range(100):
        t, state = step(t, state)
    # the last layer is linear in its weights: least squares on 4 points, 18
    # unknowns, so the loss can go to ~0; a broken gradient would not get there
    assert float(loss(t)) < 0.05 * l0
    # saving only the trainable part keeps the frozen weights
    again = fbjax.load(model.save(None, t))
    np.testing.assert_array_equal(np.asarray(again.params["dense_1/kernel"]),
                                  np.asarray(model.params["dense_1/kernel"]))
    np.testing.assert_allclose(np.asarray(again.params["dense_2/kernel"]), np.asarray(t["dense_2/kernel"]))


def test_finetune_example_short(tmp_path):
    """examples/finetune.py for 5 steps: runs end to end, writes the PNG, the
    model and a LiteRT check within the float32 bound the example derives
    (logits to 1e-4 of their magnitude, through the sigmoid's slope)."""
    require("optax")
    require("matplotlib")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "finetune.py"), "--steps", "5", "--eval", "2",
                        "--out-dir", str(tmp_path)], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert (tmp_path / "loss.png").stat().st_size > 1000
    assert (tmp_path / "finetuned.tflite").is_file()
    report = json.loads((tmp_path / "report.json").read_text())
    assert np.isfinite(report["loss_before"]) and np.isfinite(report["loss_after"])
    if "litert_max_rel_err" in report:  # the per-element float32 bound the example derives (examples/finetune.py)
        assert report["litert_error_over_bound"] <= 1.0, report


def test_trainable_include_matching_nothing_is_an_error():
    """A typo'd include pattern would train nothing, silently: ValueError
    with a few names to pick from. Patterns that match keep working, and a
    list fails on the pattern that matches nothing."""
    params = {"conv2d/Kernel": np.zeros(3), "conv2d/Bias": np.zeros(1), "segment/Kernel": np.zeros(2)}
    for bad in ("*head*", "Conv2d/*", re.compile("^head"), lambda n: False, ["conv2d/*", "*typo*"]):
        with pytest.raises(ValueError, match="matches none of the 3 param names"):
            fbjax.trainable(params, include=bad)
    train, frozen = fbjax.trainable(params, include=["conv2d/*"], exclude="*Bias")
    assert set(train) == {"conv2d/Kernel"} and set(frozen) == {"conv2d/Bias", "segment/Kernel"}
    assert fbjax.trainable(params, exclude="*nothing*")[0].keys() == params.keys()  # exclude may match nothing
