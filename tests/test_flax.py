"""fbjax.flax.to_nnx: an imported model fine-tuned through Flax NNX.

Checked by effect: a few nnx.Optimizer steps lower the loss, only the
nnx.Param weights move (the Frozen ones are bit-identical), the module's
outputs equal ``model.apply`` on its weights, and its state survives an
orbax checkpoint round trip. Skipped where flax (an optional extra) is absent.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("flax")
optax = pytest.importorskip("optax")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

import fbjax  # noqa: E402
import fbjax.flax as fbflax  # noqa: E402
from fbjax.testing import TFLiteBuilder  # noqa: E402

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


def test_to_nnx_fine_tunes_with_nnx_optimizer():
    model = fbjax.load(_mlp())
    net = fbflax.to_nnx(model, include="l2/*")
    assert isinstance(net.weights["l2/w"], nnx.Param)
    assert isinstance(net.weights["l1/w"], fbflax.Frozen) and not isinstance(net.weights["l1/w"], nnx.Param)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((32, 3)).astype(F32)
    y = np.sin(x.sum(axis=1, keepdims=True)).astype(F32)
    np.testing.assert_array_equal(np.asarray(net(x)), np.asarray(model(x)))
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
    np.testing.assert_allclose(np.asarray(again(x)), np.asarray(net(x)), rtol=1e-6, atol=1e-6)


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
