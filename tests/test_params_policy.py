"""Load-time IR policies: which constants become trainable params
(:func:`fbjax.lower.build.is_param`) and the batch rewrite's
(:func:`fbjax.passes.shapes.set_batch_size`) pass-through ops.

Oracles: JAX itself for the exported function (``fn(x)`` versus the model
written from it and loaded back); for the batch rewrite, the same file loaded
at its own batch 1 and run sample by sample (the batch-N model must compute
each sample as the batch-1 model does: the rewrite only changes shapes).

Tolerances, derived from what is computed (``conftest.gamma``): the small
CNN below sums 27 products, then (ReLU and max-pool add no rounding) 512: two
programs (fbjax's and JAX's) each lie within ``gamma_539`` times the CNN run
on ``|x|`` and ``|W|`` of the exact result, so they differ by at most twice
that. Batch-N versus batch-1 runs of the same lowering (XLA may pick other
loop tilings for another batch): the Conv's 27-product sums to twice
``gamma_27``, carried through the Softmax's slope (``conftest.softmax_bound``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import fbjax
from fbjax.errors import InputError
from fbjax.export import to_stablehlo_flatbuffer
from fbjax.ir import Value
from fbjax.lower.build import is_param

from conftest import abs_magnitude, assert_within, gamma, softmax_bound, require

RNG = np.random.default_rng(7)
W_CONV = RNG.normal(size=(3, 3, 3, 8)).astype(np.float32) * 0.5
W_DENSE = RNG.normal(size=(8 * 8 * 8, 4)).astype(np.float32) * 0.1


def _cnn(x):
    """conv -> ReLU (``jnp.maximum(h, 0.)``: a scalar 0.0 constant) ->
    2x2 max-pool (``reduce_window`` with a scalar ``-inf`` init) -> dense."""
    h = lax.conv_general_dilated(x, jnp.asarray(W_CONV), (1, 1), "SAME",
                                 dimension_numbers=("NHWC", "HWIO", "NHWC"))
    h = jnp.maximum(h, 0.0)
    h = lax.reduce_window(h, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    return h.reshape(h.shape[0], -1) @ jnp.asarray(W_DENSE)


def _x(n):
    return RNG.normal(size=(n, 16, 16, 3)).astype(np.float32)


@pytest.fixture(scope="module")
def cnn_file():
    return to_stablehlo_flatbuffer(_cnn, _x(1))


def test_is_param_rule():
    """Float constants of rank >= 1 with finite values only."""
    def v(data):
        data = np.asarray(data)
        return Value("c", data.dtype, data.shape, None, data)

    assert is_param(v(np.ones((3,), np.float32)))
    assert is_param(v(np.ones((1,), np.float16)))  # rank 1 with one element: a weight
    assert not is_param(v(np.float32(0.0)))  # scalar: operator constant
    assert not is_param(v(np.float32(-np.inf)))
    assert not is_param(v(np.array([0.0, -np.inf], np.float32)))  # a mask
    assert not is_param(v(np.array([1.0, np.nan], np.float32)))
    assert not is_param(v(np.ones((3,), np.int32)))
    assert not is_param(Value("a", np.dtype(np.float32), (3,), None, None))  # an activation


def test_scalar_operator_constants_are_not_params(cnn_file):
    """The ReLU threshold 0.0 and the max-pool's -inf init are not params;
    the conv and dense weights are, and the model still computes ``_cnn``."""
    m = fbjax.load(cnn_file)
    shapes = sorted(np.shape(p) for p in m.params.values())
    assert shapes == [(3, 3, 3, 8), (512, 4)], shapes
    x = _x(1)
    assert_within(m(x), _cnn(x), 2 * gamma(27 + 512) * abs_magnitude(m, x), "fbjax vs JAX")


def test_adamw_step_keeps_params_finite_and_saves(cnn_file, tmp_path):
    """One AdamW step (weight decay multiplies every param: ``-inf`` would
    become NaN) leaves finite params, and ``Model.save`` writes them."""
    optax = require("optax")
    m = fbjax.load(cnn_file)
    x, y = _x(2)[:1], RNG.normal(size=(1, 4)).astype(np.float32)

    def loss(p):
        return jnp.mean((m.apply(p, x) - y) ** 2)

    opt = optax.adamw(1e-2, weight_decay=0.1)
    params = jax.tree_util.tree_map(jnp.asarray, m.params)
    updates, _ = opt.update(jax.grad(loss)(params), opt.init(params), params)
    new = optax.apply_updates(params, updates)
    assert all(bool(jnp.all(jnp.isfinite(p))) for p in new.values())
    assert float(loss(new)) < float(loss(params))
    path = tmp_path / "cnn.stablehlo.flatbuf"
    m.save(path, params=new)
    m2 = fbjax.load(path)
    assert_within(m2(x), m.apply(new, x), 2 * gamma(27 + 512) * abs_magnitude(m, x, params=new),
                  "saved and reloaded vs apply(new)")


# --- batch rewrite: pass-through ops (ONNX Dropout / Identity in .rten) ---------

def _dropout_rten(softmax_axis=1):
    """Conv -> Dropout (opset 9, with its mask output: ONNX shape inference
    leaves the mask's shape unknown) -> Identity -> Softmax."""
    onnx = require("onnx")
    require("rten_convert")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from rten_convert_tools import convert

    h, T = onnx.helper, onnx.TensorProto
    w = onnx.numpy_helper.from_array(RNG.normal(size=(4, 3, 3, 3)).astype(np.float32), "W")
    nodes = [h.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]),
             h.make_node("Dropout", ["c"], ["d", "mask"], ratio=0.5),
             h.make_node("Identity", ["d"], ["i"]),
             h.make_node("Softmax", ["i"], ["y"], axis=softmax_axis)]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 6, 6])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 4, 6, 6])], [w])
    return convert(h.make_model(g, opset_imports=[h.make_opsetid("", 9)]))


def test_dropout_and_identity_pass_the_batch_through():
    """Failed before with "(Dropout) computes 'mask' of shape None from the
    batch"; now batch 3 equals three batch-1 runs."""
    data = _dropout_rten()
    from fbjax.formats import read_model

    drop = [n for n in read_model(data).main_graph.nodes if n.op_name == "Dropout"][0]
    assert drop.outputs[1].shape is None  # the file leaves the mask's shape unknown
    m1 = fbjax.load(data)
    x = RNG.normal(size=(3, 3, 6, 6)).astype(np.float32)
    want = np.concatenate([np.asarray(m1(x[i:i + 1])) for i in range(3)])
    # the Conv's 27-product sums (no bias) in two orders, at most 2 gamma_27 |x| * |W| apart, then Softmax
    # over the 4 channels
    (w,) = m1.params.values()
    mag = np.asarray(jax.lax.conv_general_dilated(np.abs(x), np.abs(np.asarray(w)), (1, 1), [(1, 1), (1, 1)]),
                     np.float64)
    bound = softmax_bound(want, 2 * gamma(27) * mag.max(axis=1, keepdims=True), n=4)
    for bs in (None, 3):
        mb = fbjax.load(data, batch_size=bs)
        assert mb.inputs[0].shape[0] == bs
        assert_within(mb(x), want, bound, f"batch {bs} vs batch-1 runs")


def test_softmax_over_the_batch_axis_is_refused():
    """A Softmax along axis 0 (what rten-convert 0.22 writes for an ONNX
    Softmax without ``axis``) would mix the samples: refused, naming it."""
    data = _dropout_rten(softmax_axis=0)
    with pytest.warns(UserWarning, match="softmax"):  # fbjax's warning about a size-1 softmax axis
        with pytest.raises(InputError, match=r"\(Softmax\) works along the batch dimension"):
            fbjax.load(data, batch_size=None)


@pytest.mark.slow
def test_squeezenet_rten_batch_polymorphic():
    """rten-convert's squeezenet (onnx's light model; Dropout with a mask of
    unknown shape): with the Softmax axis stated (the converter would write
    0), batch 2 equals two batch-1 runs; without it the load is refused."""
    onnx = require("onnx")
    require("rten_convert")
    from fbjax import bench
    from fbjax.convert import make_defaults_explicit

    path = bench.light_onnx_path("squeezenet")
    assert Path(path).exists(), f"{path}: the onnx wheel (test extra) ships its light models"
    with pytest.warns(UserWarning, match="softmax"):
        with pytest.raises(InputError, match=r"\(Softmax\) works along the batch dimension"):
            fbjax.load(bench._onnx_to_rten(path), batch_size=None)
    fixed, changed, _ = make_defaults_explicit(onnx.load(path))
    assert changed
    data = bench._onnx_to_rten(fixed)
    m1, mb = fbjax.load(data), fbjax.load(data, batch_size=None)
    x = RNG.normal(size=(2, 3, 224, 224)).astype(np.float32)
    # Model.apply, jitted: Model.__call__'s prepared CPU program returned NaN for
    # some inputs of this model at the time of writing (reported separately).
    f1, fb = jax.jit(m1.apply), jax.jit(mb.apply)
    want = np.concatenate([np.asarray(f1(m1.params, x[i:i + 1])) for i in range(2)])
    got = np.asarray(fb(mb.params, x))
    assert got.shape == (2, 1000, 1, 1) and np.all(np.isfinite(want))
    # The constant-fill weights make all 1000 logits the same computation (they come out equal: the
    # softmax is uniform), so only each program's float32 softmax of equal logits differs. With logits
    # near 7e9 (an ULP is 512) a summation-order bound on the logits would make the softmax bound vacuous:
    # this test checks the batch rewrite, not the logits' rounding.
    assert np.all(want == want.flat[0]), "the logits are no longer all equal: compare them instead"
    assert_within(got, want, softmax_bound(want, 0.0, n=1000), "batch 2 vs batch-1 runs (uniform softmax)")
