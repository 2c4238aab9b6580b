"""The program ``Model.__call__`` runs on CPU (:mod:`fbjax.executors.planner`, :mod:`fbjax.executors.cpu_prepared`).

On CPU, ``Model.__call__`` runs a program whose ungrouped CONV_2D weights are
passed in ``HWIO`` (made once from ``Model.params``), while ``Model.apply``
and ``Model.params`` keep the file's ``OHWI``. Both paths are compared here
on the same inputs: they compute the same products, summed in orders that
XLA's tiling picks per program and per CPU, so each is within the float32
summation bound ``gamma_n * sum|a_i b_i|`` (``conftest.gamma``, ``n`` the
products plus the bias) of the exact result and they differ by at most twice
it. Elementwise-only programs are bounded op by op (each IEEE operation
rounds once; a contracted multiply-add rounds less). LiteRT checks the relaid path itself in
``test_tflite_ops.py`` / ``test_tflite_models.py`` (they call the Model).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fbjax
from fbjax.executors.planner import plan
from fbjax.formats.tflite_builder import TFLiteBuilder, single_op_model

from conftest import assert_within, gamma, require

F32 = np.float32

#: the executors that run the prepared CPU program (fbjax.executors)
_PREPARED = ("cpu_prepared", "trace_cache")

cpu_only = pytest.mark.skipif(jax.default_backend() != "cpu", reason="weights are relaid on the CPU backend only")


def _conv_model(rng, x_shape, o, kh, kw, groups=1, stride=1, dil=1, padding="SAME"):
    cin = x_shape[3]
    w = rng.standard_normal((o, kh, kw, cin // groups)).astype(F32)
    b = rng.standard_normal(o).astype(F32)
    eff_h, eff_w = (kh - 1) * dil + 1, (kw - 1) * dil + 1
    if padding == "SAME":
        oh, ow = -(-x_shape[1] // stride), -(-x_shape[2] // stride)
    else:
        oh, ow = (x_shape[1] - eff_h) // stride + 1, (x_shape[2] - eff_w) // stride + 1
    return single_op_model(
        "CONV_2D", [x_shape, w, b],
        options=dict(padding=padding, stride_h=stride, stride_w=stride, dilation_h_factor=dil,
                     dilation_w_factor=dil, fused_activation_function="RELU6"),
        output_shapes=[(x_shape[0], oh, ow, o)])


def _pre_activation_magnitude(m, x) -> np.ndarray:
    """``|x| * |w| + |b|`` of a single-convolution model (before its fused
    RELU6, which would clip the magnitude): the model run on ``|x|`` and
    ``|params|`` with the input and the bias scaled by ``2**-30`` (exact, and
    small enough that RELU6 never clips), scaled back."""
    s = 2.0 ** -30
    p = {k: np.abs(np.asarray(v)) * (s if np.ndim(v) == 1 else 1) for k, v in m.params.items()}
    y = m.apply(p, np.abs(x) * F32(s))
    return np.asarray(y[0] if isinstance(y, (tuple, list)) else y, np.float64) / s


def _conv_close(a, b, m, x, n, what=""):
    """Two summation orders of a convolution of ``n`` terms per output
    (products plus bias), each within ``gamma_n * (|x| * |w| + |b|)`` of
    exact; RELU6 is 1-Lipschitz."""
    assert_within(a, b, 2 * gamma(n) * _pre_activation_magnitude(m, x), what)


CASES = {
    "3x3-same-stride2": dict(x_shape=(2, 9, 8, 5), o=7, kh=3, kw=3, stride=2),
    "1x1": dict(x_shape=(1, 6, 6, 16), o=8, kh=1, kw=1),
    "5x3-valid-dilated": dict(x_shape=(1, 12, 11, 3), o=4, kh=5, kw=3, dil=2, padding="VALID"),
    "3x3-valid-to-1x1-wide": dict(x_shape=(1, 3, 3, 32), o=300, kh=3, kw=3, padding="VALID"),
}


@cpu_only
@pytest.mark.parametrize("name", sorted(CASES))
def test_relaid_call_equals_native_apply(name):
    rng = np.random.default_rng(sorted(CASES).index(name))
    m = fbjax.load(_conv_model(rng, **CASES[name]))
    assert m.executor.name in _PREPARED and list(m.executor.layouts) == ["const1"]
    assert m.params["const1"].shape[0] == CASES[name]["o"]  # still OHWI
    x = rng.standard_normal(m.inputs[0].shape).astype(F32)
    c = CASES[name]
    _conv_close(m(x), jax.jit(m.apply)(m.params, x), m, x, c["kh"] * c["kw"] * c["x_shape"][3] + 1, name)


@cpu_only
def test_relaid_copy_follows_params():
    rng = np.random.default_rng(7)
    m = fbjax.load(_conv_model(rng, (1, 6, 5, 3), 4, 3, 3))
    x = rng.standard_normal((1, 6, 5, 3)).astype(F32)
    ref = jax.jit(m.apply)
    y0 = np.asarray(m(x))
    m.params = {k: v * 2 for k, v in m.params.items()}  # a new dict
    y1 = np.asarray(m(x))
    _conv_close(y1, ref(m.params, x), m, x, 28, "new params dict")
    assert not np.allclose(y0, y1)
    m.params["const1"] = -m.params["const1"]  # one entry replaced in place
    y2 = np.asarray(m(x))
    _conv_close(y2, ref(m.params, x), m, x, 28, "weight replaced in place")
    assert not np.allclose(y1, y2)
    m.params["const2"] = m.params["const2"] + 1  # a bias (not relaid) replaced in place
    _conv_close(m(x), ref(m.params, x), m, x, 28, "bias replaced in place")


@cpu_only
def test_grouped_conv_is_not_relaid():
    rng = np.random.default_rng(3)
    m = fbjax.load(_conv_model(rng, (1, 6, 6, 8), 4, 3, 3, groups=2))
    assert m.executor.name == "jit"  # nothing to relay, no value read twice
    x = rng.standard_normal((1, 6, 6, 8)).astype(F32)
    _conv_close(m(x), jax.jit(m.apply)(m.params, x), m, x, 3 * 3 * 4 + 1, "grouped")


@cpu_only
def test_float16_weights_through_dequantize_are_relaid():
    rng = np.random.default_rng(5)

    def fp16_conv(weight_is_output: bool) -> bytes:
        b = TFLiteBuilder()
        xi = b.add_input((1, 6, 7, 3), name="x")
        w16 = b.add_tensor(data=rng.standard_normal((4, 3, 3, 3)).astype(np.float16), name="w_fp16")
        w32 = b.add_tensor((4, 3, 3, 3), name="w")
        y = b.add_tensor((1, 6, 7, 4), name="y")
        b.add_op("DEQUANTIZE", [w16], [w32])
        b.add_op("CONV_2D", [xi, w32, -1], [y], options=dict(padding="SAME", stride_h=1, stride_w=1))
        b.add_output(y)
        if weight_is_output:
            b.add_output(w32)
        return b.build()

    m = fbjax.load(fp16_conv(False))
    assert m.executor.name in _PREPARED and list(m.executor.layouts) == ["w_fp16"]
    x = rng.standard_normal((1, 6, 7, 3)).astype(F32)
    # 3*3*3 products, no bias; the float16 -> float32 DEQUANTIZE is exact
    _conv_close(m(x), jax.jit(m.apply)(m.params, x), m, x, 27, "float16 weights")
    # the same weight also read by another node (here a graph output): kept native
    m2 = fbjax.load(fp16_conv(True))
    assert m2.executor.name not in _PREPARED or not m2.executor.layouts
    y2, w2 = m2(x)
    r2, rw2 = jax.jit(m2.apply)(m2.params, x)
    _conv_close(y2, r2, m2, x, 27, "float16 weights, also an output")
    assert w2.shape == (4, 3, 3, 3)  # the DEQUANTIZE output keeps the file's layout
    np.testing.assert_array_equal(np.asarray(w2), np.asarray(rw2))  # float16 -> float32 is exact in any program


def test_plan_is_empty_off_cpu():
    m = fbjax.load(_conv_model(np.random.default_rng(1), (1, 5, 5, 2), 3, 3, 3))
    assert plan(m.program, backend="gpu") == ({}, {})
    assert plan(m.program, backend="tpu") == ({}, {})


def _residual_chain_model(rng, shape=(2, 5, 6, 4), blocks=3):
    """x -> [a = ADD(x, c_k) (fused RELU); y = MUL(a, d_k); x = ADD(a, y)] * blocks:
    every ``a`` is read twice, the pattern of MobileNet/BlazeFace residuals."""
    b = TFLiteBuilder()
    x = b.add_input(shape, name="x")
    for k in range(blocks):
        c = b.add_tensor(data=rng.standard_normal(shape[-1]).astype(F32), name=f"c{k}")
        d = b.add_tensor(data=rng.standard_normal(shape[-1]).astype(F32), name=f"d{k}")
        a = b.add_tensor(shape, name=f"a{k}")
        y = b.add_tensor(shape, name=f"y{k}")
        z = b.add_tensor(shape, name=f"z{k}")
        b.add_op("ADD", [x, c], [a], options=dict(fused_activation_function="RELU"))
        b.add_op("MUL", [a, d], [y])
        b.add_op("ADD", [a, y], [z])
        x = z
    b.add_output(x)
    return b.build()


def _residual_chain_bound(m, x) -> np.ndarray:
    """Bound on ``|program_a - program_b|`` for ``_residual_chain_model``:
    elementwise ops only, each IEEE operation rounds once (``u = 2**-24``
    relative; a contracted ``a + a * d`` rounds less), so with ``e`` the
    error carried in: ``a = relu(x + c)``: ``e + u|x + c|``; ``y = a d``:
    ``|d| e_a + u|a d|``; ``z = a + y``: ``e_a + e_y + u|z|``; twice that
    for two programs. Evaluated in float64 (non-finite inputs give
    non-finite values, checked for equality instead)."""
    u = 2.0 ** -24
    v = np.asarray(x, np.float64)
    e = np.zeros_like(v)
    with np.errstate(invalid="ignore", over="ignore"):
        for k in range(len([p for p in m.params if p.startswith("c")])):
            c, d = (np.asarray(m.params[f"{n}{k}"], np.float64) for n in "cd")
            s_ = v + c
            a = np.maximum(s_, 0)
            e_a = np.where(np.isneginf(s_), 0.0, e + u * np.abs(s_))  # relu(-inf) is 0 in any program
            y = a * d
            e_y = np.abs(d) * e_a + u * np.abs(y)
            v = a + y
            e = e_a + e_y + u * np.abs(v)
    return 2 * e


@cpu_only
def test_values_read_twice_are_materialized_with_equal_results():
    rng = np.random.default_rng(11)
    shape = (2, 32, 32, 8)  # 64 KiB activations: smaller ones are left to XLA (KernelOptions.small_activation_bytes)
    m = fbjax.load(_residual_chain_model(rng, shape=shape))
    assert m.executor.name in _PREPARED and not m.executor.layouts
    x = rng.standard_normal(shape).astype(F32)
    text = m.executor.lower(m.params, x).as_text()
    assert text.count("divide") >= 3  # one x / 1.0 per block's `a`
    # x / 1.0 is x exactly, but the two programs are fused (and FMA-contracted) differently by XLA
    # (fbjax's compile options vs its defaults): equal up to the elementwise rounding bound
    assert_within(m(x), jax.jit(m.apply)(m.params, x), _residual_chain_bound(m, x), "materialized vs apply")
    xs = np.array([np.nan, np.inf, -np.inf, -0.0, 1e-40, -3.5], F32)
    xs = np.resize(xs, x.size).reshape(x.shape)
    assert_within(m(xs), jax.jit(m.apply)(m.params, xs), _residual_chain_bound(m, xs), "special values")


def test_nothing_is_prepared_off_cpu():
    from fbjax.executors.planner import worth_preparing

    m = fbjax.load(_residual_chain_model(np.random.default_rng(2), shape=(2, 32, 32, 8)))
    assert worth_preparing(m.program, backend="cpu")
    assert not worth_preparing(m.program, backend="gpu")
    small = fbjax.load(_residual_chain_model(np.random.default_rng(2)))
    assert small.executor.name == "jit"  # tiny activations: nothing gained, call overhead saved


@cpu_only
def test_large_batch_runs_in_chunks_with_equal_results(monkeypatch):
    import fbjax.model
    import fbjax.executors.chunked

    rng = np.random.default_rng(13)
    data = _residual_chain_model(rng, shape=(1, 5, 6, 4))
    m = fbjax.load(data, batch_size=8)
    assert m.executor.name != "chunked"  # 8 tiny images fit in the budget
    loads = []
    load = fbjax.model.load

    def make(source, **kw):
        loads.append(kw["batch_size"])
        return load(source, **kw)

    m = fbjax.load(data, batch_size=8, kernel_options=fbjax.KernelOptions(chunk_bytes=2 * 5 * 6 * 4 * 4 * 3))  # ~2/chunk
    monkeypatch.setattr(fbjax.model, "load", make)  # counts the loads of the chunk model
    assert m.executor.name == "chunked" and m.executor.k == 2
    x = rng.standard_normal((8, 5, 6, 4)).astype(F32)
    y = m(x)
    assert loads == [2] and y.shape == (8, 5, 6, 4)
    # batch-2 chunks vs the batch-8 program: elementwise only, within the op-by-op rounding bound
    assert_within(y, jax.jit(m.apply)(m.params, x), _residual_chain_bound(m, x), "chunks vs apply")
    m.params = {k: v * 0.5 for k, v in m.params.items()}  # the batch-8 model's params are used
    assert_within(m(x), jax.jit(m.apply)(m.params, x), _residual_chain_bound(m, x), "chunks vs apply, new params")


@cpu_only
def test_constant_weights_computed_ahead_and_relaid_equal_apply():
    """ONNX light squeezenet: every weight is a ConstantOfShape fill feeding a
    Conv; they are computed once (jit arguments), relaid to HWIO for the
    ungrouped convolutions, and the result equals ``Model.apply``'s."""
    require("onnx")
    require("rten_convert")
    import onnx

    from fbjax import bench

    path = bench.light_onnx_path("squeezenet")
    assert __import__("os").path.exists(path), f"{path}: the onnx wheel (test extra) ships its light models"
    with pytest.warns(UserWarning, match="axis of size 1"):  # rten-convert's axis-0 Softmax (the logits are compared)
        m = fbjax.load(bench._onnx_to_rten(onnx.load(path)))
    assert m.executor.name in _PREPARED and m.executor.registry.constant and m.executor.ahead_layouts
    x = np.random.default_rng(0).random(m.inputs[0].shape, dtype=np.float32)
    y, r = m(x), jax.jit(m.apply)(m.params, x)
    for a, b in zip(y if isinstance(y, tuple) else (y,), r if isinstance(r, tuple) else (r,)):
        # the file's only output is that Softmax over an axis of size 1: exp(z - z) / exp(z - z) is
        # exactly 1 for any finite logit in any program, so exact equality also checks the logits are finite
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_softmax_input_is_computed_once():
    """light squeezenet with its Softmax axis stated (fbjax.convert): its
    weights are constant fills, so on a normal(0, 1) input the logits reach
    ~7e9, where one float32 ulp is 512. XLA:CPU (fbjax's compile options)
    fused the global average pool into both the softmax's max and its exp
    with different summation orders, every ``exp(x - max)`` underflowed and
    ``Model.__call__`` returned NaN for some inputs. The prepared program
    computes a softmax input once (ops registered ``reads_input_twice``, :func:`fbjax.executors.planner.fan_out_values`): the outputs
    are finite and each sums to 1 (to float32 rounding of 1000 terms)."""
    require("onnx")
    require("rten_convert")
    import onnx

    from fbjax import bench
    from fbjax.convert import make_defaults_explicit
    from fbjax.executors.planner import fan_out_values

    path = bench.light_onnx_path("squeezenet")
    assert __import__("os").path.exists(path), f"{path}: the onnx wheel (test extra) ships its light models"
    m = fbjax.load(bench._onnx_to_rten(make_defaults_explicit(onnx.load(path))[0]))
    soft = next(n for n in m.ir.main_graph.nodes if n.op_name == "Softmax")
    assert id(soft.inputs[0]) in fan_out_values(m.program)
    x = np.random.default_rng(7).normal(size=(2, 3, 224, 224)).astype(np.float32)
    zeros = np.zeros((1, 3, 224, 224), np.float32)
    for v in (zeros, x[1:2], zeros, x[0:1]):  # the order that gave NaN on x[0:1]
        y = np.asarray(m(v))
        assert np.all(np.isfinite(y)) and abs(float(y.sum()) - 1) < 1e-4


@pytest.mark.parametrize("window,strides,padding", [((3, 3), (2, 2), ((1, 1), (1, 1))),
                                                   ((2, 2), (2, 2), ((0, 0), (0, 0))),
                                                   ((3, 1), (1, 1), ((0, 2), (1, 0))),
                                                   ((4, 4), (3, 2), ((1, 2), (0, 3)))])
def test_shifted_window_reduce_equals_reduce_window(window, strides, padding):
    """The CPU pool path (strided slices) and lax.reduce_window (other
    backends) agree: max exactly; sums within the float32 summation-order
    bound (the tap order differs)."""
    from jax import lax

    from fbjax.lower import kernels

    x = np.random.default_rng(0).uniform(-1, 1, (2, 3, 9, 8)).astype(np.float32)
    full_w, full_s = (1, 1) + window, (1, 1) + strides
    full_p = ((0, 0), (0, 0)) + padding
    ref_max = lax.reduce_window(x, -np.inf, lax.max, full_w, full_s, full_p)
    got_max = kernels.shifted_window_reduce(x, np.float32(-np.inf), jnp.maximum, window=window, strides=strides,
                                            padding=padding, spatial_axes=(2, 3))
    np.testing.assert_array_equal(np.asarray(got_max), np.asarray(ref_max))
    ref_sum = lax.reduce_window(x, np.float32(0), lax.add, full_w, full_s, full_p)
    got_sum = kernels.shifted_window_reduce(x, np.float32(0), jnp.add, window=window, strides=strides,
                                            padding=padding, spatial_axes=(2, 3))
    # each order's sum of k taps is within gamma_k * sum|x| of the exact sum (u = 2**-24), so two orders
    # differ by at most twice that
    k, u = int(np.prod(window)), 2.0 ** -24
    abs_sum = np.asarray(lax.reduce_window(np.abs(x).astype(np.float64), 0.0, lax.add, full_w, full_s, full_p))
    bound = 2 * k * u / (1 - k * u) * abs_sum
    err = np.abs(np.asarray(got_sum, np.float64) - np.asarray(ref_sum, np.float64))
    assert np.all(err <= bound), f"max error {err.max():.3g} over the summation-order bound"
    assert kernels.use_shifted_window("cpu", window) and not kernels.use_shifted_window("gpu", window)
