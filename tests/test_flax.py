"""fbjax.flax.to_nnx: an imported model fine-tuned through Flax NNX.

Checked by effect: a few nnx.Optimizer steps lower the loss, only the
nnx.Param weights move (the Frozen ones are bit-identical), the module's
outputs agree with ``Model.__call__`` on its weights (within the float32
summation bound: two differently compiled programs), and its state survives an
orbax checkpoint round trip. Skipped where flax (an optional extra) is absent.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import require  # noqa: E402
require("flax")
optax = require("optax")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

import fbjax  # noqa: E402
import fbjax.flax as fbflax  # noqa: E402
from fbjax.formats.tflite_builder import TFLiteBuilder  # noqa: E402

F32 = np.float32


def _mlp() -> bytes:
    rng = np.random.default_rng(0)
    b = TFLiteBuilder()
    x = b.add_input((1, 3), name="x", shape_signature=(-1, 3))
    h = b.add_tensor((1, 16), name="h", shape_signature=(-1, 16))
    y = b.add_tensor((1, 1), name="y", shape_signature=(-1, 1))
    b.add_op("FULLY_CONNECTED", [x, b.add_tensor(data=rng.standard_normal((16, 3)).astype(F32), name="l1/w"),
                                 b.add_tensor(data=np.zeros(16, F32), name="l1/b")], [h],
             options=dict(fused_activation_function="RELU"))
    b.add_op("FULLY_CONNECTED", [h, b.add_tensor(data=rng.standard_normal((1, 16)).astype(F32) * 0.1, name="l2/w"),
                                 b.add_tensor(data=np.zeros(1, F32), name="l2/b")], [y],
             options=dict(fused_activation_function="NONE"))
    b.add_output(y)
    return b.build()


def _mlp_error_bound(params, x) -> np.ndarray:
    """Elementwise bound on the float32 rounding error of ``_mlp`` at ``x``.

    Each FULLY_CONNECTED output is a sum of n products (n = 3, then 16):
    any summation order lies within ``gamma_n * sum|a_i b_i|`` of the exact
    sum (``gamma_n = n u / (1 - n u)``, ``u = 2**-24``), plus half an ULP for
    the bias add; ReLU is 1-Lipschitz, so layer 1's bound reaches layer 2
    through ``|W2|``.
    """
    u = 2.0 ** -24
    gamma = lambda n: n * u / (1 - n * u)  # noqa: E731
    w1, w2 = (np.abs(np.asarray(params[k], np.float64)) for k in ("l1/w", "l2/w"))
    x64 = np.asarray(x, np.float64)
    h = np.maximum(x64 @ np.asarray(params["l1/w"], np.float64).T + np.asarray(params["l1/b"], np.float64), 0)
    e1 = gamma(3) * (np.abs(x64) @ w1.T) + u * h
    y = h @ np.asarray(params["l2/w"], np.float64).T
    return e1 @ w2.T + gamma(16) * (np.abs(h) @ w2.T) + u * np.abs(y)


def _assert_same_mlp(a, b, params, x) -> None:
    """Two XLA programs (the NNX module's jit and ``Model.__call__``'s) may sum
    in different orders: each is within the float32 bound of the exact result,
    so they differ by at most twice it."""
    err = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
    bound = 2 * _mlp_error_bound(params, x)
    assert np.all(err <= bound), f"max error {err.max():.3g}, bound there {bound.ravel()[err.argmax()]:.3g}"


def test_to_nnx_fine_tunes_with_nnx_optimizer():
    model = fbjax.load(_mlp())
    net = fbflax.to_nnx(model, include="l2/*")
    assert isinstance(net.weights["l2/w"], nnx.Param)
    assert isinstance(net.weights["l1/w"], fbflax.Frozen) and not isinstance(net.weights["l1/w"], nnx.Param)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((32, 3)).astype(F32)
    y = np.sin(x.sum(axis=1, keepdims=True)).astype(F32)
    _assert_same_mlp(net(x), model(x), model.params, x)
    frozen_before = np.asarray(net.weights["l1/w"][...]).copy()

    opt = nnx.Optimizer(net, optax.adam(0.05), wrt=nnx.Param)

    def loss_fn(m):
        return jnp.mean((m(x) - y) ** 2)

    @nnx.jit
    def step(m, o):
        loss, grads = nnx.value_and_grad(loss_fn)(m)
        o.update(m, grads)
        return loss

    grads = nnx.grad(loss_fn)(net)
    leaves = jax.tree_util.tree_leaves_with_path(nnx.state(grads))
    assert leaves and all("l2/" in jax.tree_util.keystr(p) for p, _ in leaves), "gradients of frozen weights"
    l0 = float(loss_fn(net))
    for _ in range(30):
        step(net, opt)
    l1 = float(loss_fn(net))
    assert l1 < 0.7 * l0, (l0, l1)
    np.testing.assert_array_equal(np.asarray(net.weights["l1/w"][...]), frozen_before)
    assert not np.array_equal(np.asarray(net.weights["l2/w"][...]), np.asarray(model.params["l2/w"]))
    # the module's weights go back to the file
    again = fbjax.load(net.save())
    _assert_same_mlp(again(x), net(x), net.params_dict(), x)


def test_nnx_state_checkpoint_round_trip(tmp_path):
    model = fbjax.load(_mlp())
    net = fbflax.to_nnx(model)
    graphdef, state = nnx.split(net)
    changed = jax.tree.map(lambda v: v + 1.0, state)
    nnx.update(net, changed)
    x = np.ones((2, 3), F32)
    want = np.asarray(net(x))
    try:
        import orbax.checkpoint as ocp
    except ImportError:
        pytest.skip("orbax-checkpoint not installed")
    ckpt = ocp.StandardCheckpointer()
    ckpt.save(tmp_path / "ckpt", nnx.state(net))
    ckpt.wait_until_finished()
    fresh = fbflax.to_nnx(fbjax.load(_mlp()))
    restored = ckpt.restore(tmp_path / "ckpt", nnx.state(fresh))
    nnx.update(fresh, restored)
    np.testing.assert_array_equal(np.asarray(fresh(x)), want)
