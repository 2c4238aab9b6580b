"""fbjax's native CPU integer kernels (fbjax/lower/cpu_kernels.cc) against numpy's int64 sums.

The kernels compute integer sums, exact in any order, so they must equal numpy's int64 products summed
(``|sum| < 2**31`` for every case below), bit for bit; the hybrid FULLY_CONNECTED lowering must give the
same int32 accumulators through them as through XLA's integer dot. A machine without a C++ compiler is
the one case where the kernels are absent: the tests say so and fail, since CI's machine has one.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fbjax.lower import cpu_kernels
from fbjax.lower.tflite_int import hybrid
from helpers import TOL, rel_err

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="CPU kernels: the CPU backend only")


@pytest.fixture(scope="module", autouse=True)
def built():
    assert cpu_kernels.available(), f"the kernels did not build: {cpu_kernels._state['why']}"


@pytest.mark.parametrize("r", [1, 2, 3, 4, 5, 8, 17, 128])
@pytest.mark.parametrize("o,i", [(7, 37), (96, 576), (33, 1536), (1, 16), (4096, 64)])
def test_int8_matmul_equals_numpy(r, o, i):
    rng = np.random.default_rng(r * 1000 + o + i)
    x = rng.integers(-255, 256, (r, i)).astype(np.int16)  # the hybrid kernels' range: q - zero point
    w = rng.integers(-128, 128, (o, i)).astype(np.int8)
    w[0, :] = -128  # the extremes
    x[0, :] = -255
    got = np.asarray(jax.jit(cpu_kernels.int8_matmul)(x, w))
    assert got.dtype == np.int32 and got.shape == (r, o)
    np.testing.assert_array_equal(got, x.astype(np.int64) @ w.astype(np.int64).T)


@pytest.mark.parametrize("r", [1, 3, 4, 8, 17, 128])
@pytest.mark.parametrize("o,i", [(7, 37), (96, 576), (33, 640), (5, 100)])
def test_int8_matmul_sym_equals_numpy(r, o, i):
    """The symmetric-row kernel (VNNI: weights offset by 128, then 128 * sum(x) taken off) gives the exact
    int32 products, also for I not a multiple of 64 and the extreme weight -128; with stacked weights it
    reads the block asked for."""
    rng = np.random.default_rng(r * 1000 + o + i)
    x = rng.integers(-127, 128, (r, i)).astype(np.int8)  # symmetric quantization: zero point 0
    w = rng.integers(-128, 128, (o, i)).astype(np.int8)
    w[0, :] = -128
    x[0, :] = -127
    want = x.astype(np.int64) @ w.astype(np.int64).T
    got = np.asarray(jax.jit(cpu_kernels.int8_matmul_sym)(x, w))
    assert got.dtype == np.int32 and got.shape == (r, o)
    np.testing.assert_array_equal(got, want)
    stacked = np.stack([w[::-1], w, w[:, ::-1]])
    got = np.asarray(jax.jit(cpu_kernels.int8_matmul_sym)(x, stacked, jnp.int32(1)))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", ["int8", "int4"])
@pytest.mark.parametrize("r,o,k,b", [(1, 64, 18, 32), (3, 5, 2, 32), (8, 33, 4, 64), (130, 9, 3, 16), (2, 3, 1, 46)])
def test_block_matmul_equals_numpy(dtype, r, o, k, b):
    rng = np.random.default_rng(r + o + k + b)
    lim = 8 if dtype == "int4" else 128
    x = rng.integers(-255, 256, (r, k, b)).astype(np.int16)
    w = rng.integers(-lim, lim, (o, k, b)).astype(np.int8)
    acc, ksum = jax.jit(cpu_kernels.block_matmul)(x, jnp.asarray(w).astype(getattr(jnp, dtype)))
    np.testing.assert_array_equal(np.asarray(acc), np.einsum("rkc,okc->kro", x.astype(np.int64), w.astype(np.int64)))
    np.testing.assert_array_equal(np.asarray(ksum), w.astype(np.int64).sum(-1).T)


@pytest.mark.parametrize("rows", [1, 6, 40])
def test_hybrid_products_same_through_kernel_and_xla(rows):
    """The hybrid kernels' two routes (native kernel; XLA's integer dot or fused multiply-reduce) give
    the same int32 sums, under vmap too (the batch joins the rows)."""
    rng = np.random.default_rng(rows)
    q = jnp.asarray(rng.integers(-128, 128, (rows, 96)).astype(np.int32))
    z = jnp.asarray(rng.integers(-128, 128, rows).astype(np.int32))
    w = jnp.asarray(rng.integers(-127, 128, (40, 96)).astype(np.int8))
    want = (np.asarray(q, np.int64) - np.asarray(z, np.int64)[:, None]) @ np.asarray(w, np.int64).T
    for fn in (hybrid._int_matmul_native, hybrid._int_matmul):
        np.testing.assert_array_equal(np.asarray(jax.jit(fn)(q, z, w)), want)
        batched = jax.jit(jax.vmap(fn, in_axes=(0, 0, None)))(q[None].repeat(2, 0), z[None].repeat(2, 0), w)
        np.testing.assert_array_equal(np.asarray(batched), np.stack([want, want]))


def test_no_compiler_falls_back_with_one_warning(monkeypatch, tmp_path):
    """Without a compiler the kernels are unavailable: one RuntimeWarning that says why, then False."""
    saved = dict(cpu_kernels._state)
    monkeypatch.setattr(cpu_kernels, "_compiler", lambda: None)
    cpu_kernels._state.update(tried=False, lib=None, tag="xla", why=None)
    try:
        with pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler"):
            assert cpu_kernels.available() is False
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert cpu_kernels.available() is False  # said once
        assert cpu_kernels.tag() == "xla"
    finally:
        cpu_kernels._state.clear()
        cpu_kernels._state.update(saved)


@pytest.mark.parametrize("dtype", ["int8", "int4"])
@pytest.mark.parametrize("r,o,k,b", [(1, 64, 18, 32), (5, 7, 3, 32), (9, 3, 2, 16)])
def test_block_fc_follows_tflite_order(dtype, r, o, k, b):
    """fbjax_block_fc's float32 sums in TFLite's EvalBlockwise4Bit order, against numpy float32 doing
    one rounded operation at a time (numpy does not contract a multiply and an add into an FMA)."""
    rng = np.random.default_rng(r * 7 + o + k)
    lim = 8 if dtype == "int4" else 128
    x = rng.integers(-128, 128, (r, k, b)).astype(np.int16)
    w = rng.integers(-lim, lim, (o, k, b)).astype(np.int8)
    scale = (rng.random((o, k)) * 0.02 + 1e-4).astype(np.float32)
    out, kfsum = jax.jit(cpu_kernels.block_fc)(x, jnp.asarray(w).astype(getattr(jnp, dtype)), scale)
    want = np.zeros((r, o), np.float32)
    kf = np.zeros(o, np.float32)
    acc = np.einsum("rkc,okc->kro", x.astype(np.int64), w.astype(np.int64)).astype(np.float32)  # exact: < 2**24
    ks = w.astype(np.int64).sum(-1).T.astype(np.float32)
    for kk in range(k):
        want = want + acc[kk] * scale[:, kk][None, :]
        kf = kf + scale[:, kk] * ks[kk]
    np.testing.assert_array_equal(np.asarray(out), want)
    np.testing.assert_array_equal(np.asarray(kfsum), kf)


@pytest.mark.parametrize("dtype", ["int4", "int8"])
@pytest.mark.parametrize("r,o,k,b", [(1, 576, 18, 32), (1, 37, 48, 32), (1, 5, 3, 64), (1, 17, 6, 96), (2, 33, 18, 32), (5, 20, 18, 32), (8, 16, 6, 64), (130, 9, 3, 32),
                                     (3, 7, 5, 16), (1, 3, 1, 46)])
@pytest.mark.parametrize("inputs", ["normal", "positive", "zero_row", "ties", "large"])
def test_block_fc_f32_equals_tflite_blockwise(dtype, r, o, k, b, inputs):
    """fbjax_block_fc_f32 (input quantization, blockwise sums and output scaling in one kernel; its int4
    one-row path with B % 32 == 0 sums 16 output channels at once with vpdpbusd where the CPU has AVX-512
    VNNI) against fbjax.reference's numpy model of EvalBlockwise4Bit (AsymmetricQuantizeFloats per row in
    float64/float32 as TFLite, then one rounded float32 operation at a time): equal bit for bit. The cases
    cover output counts that are not multiples of 16, unit counts (K * B / 32) that are not multiples of 4,
    blocks of 64 and 96 (several 32-value units per block), and the other paths (B = 16, odd B)."""
    from fbjax.reference.tflite_int import hybrid as ref

    rng = np.random.default_rng(r * 131 + o * 7 + k * 3 + b + len(inputs))
    lim = 8 if dtype == "int4" else 128
    x = rng.standard_normal((r, k * b)).astype(np.float32)
    if inputs == "positive":  # rmin = 0: the zero point at -128
        x = np.abs(x)
    elif inputs == "zero_row":  # an all-zero row: s = 1, zp = 0, q = 0
        x[0] = 0
    elif inputs == "ties":  # many values on a grid, so x * inv lands on halves more often
        x = np.round(x * 2) / 2
    elif inputs == "large":
        x = x * np.float32(3e4)
    w = rng.integers(-lim, lim, (o, k, b)).astype(np.int8)
    w[0, 0, :] = -lim  # the extremes
    scale = (rng.random((o, k)) * 0.02 + 1e-4).astype(np.float32)
    got = np.asarray(jax.jit(cpu_kernels.block_fc_f32)(x, jnp.asarray(w).astype(getattr(jnp, dtype)), scale))
    q, s, z = ref.quantize_blocks(x, True)
    acc = np.einsum("rkc,okc->kro", q.reshape(r, k, b), w.astype(np.int64)).astype(np.float32)  # exact: < 2**24
    ks = w.astype(np.int64).sum(-1).T.astype(np.float32)
    want = np.zeros((r, o), np.float32)
    kf = np.zeros(o, np.float32)
    for kk in range(k):  # numpy float32: one rounding per operation, no FMA
        want = want + acc[kk] * scale[:, kk][None, :]
        kf = kf + scale[:, kk] * ks[kk]
    want = (want - z.astype(np.float32)[:, None] * kf[None, :]) * s[:, None]
    assert got.dtype == np.float32 and got.shape == (r, o)
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))


@pytest.mark.parametrize("stacked_scale", [False, True])
def test_block_fc_f32_at_reads_the_block_in_place(stacked_scale):
    """block_fc_f32 with ``layer`` on stacked weights [L, O, K, B] (and scales, given the block's own
    [O, K] or stacked [L, O, K]) equals the call on that block's arrays, bit for bit, for each block."""
    rng = np.random.default_rng(11 + stacked_scale)
    n, o, k, b = 3, 40, 18, 32
    x = rng.standard_normal((1, k * b)).astype(np.float32)
    w8 = rng.integers(-8, 8, (n, o, k, b)).astype(np.int8)
    scale = (rng.random((n, o, k)) * 0.02 + 1e-4).astype(np.float32)
    ws = jnp.asarray(w8).astype(jnp.int4)
    at = jax.jit(cpu_kernels.block_fc_f32)
    for layer in range(n):
        want = np.asarray(at(x, jnp.asarray(w8[layer]).astype(jnp.int4), scale[layer]))
        got = np.asarray(at(x, ws, scale if stacked_scale else scale[layer], jnp.int32(layer)))
        np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))


def test_block_fc_native_under_vmap():
    """hybrid._block_fc_native's vmap rule: a batched input joins the rows of one kernel call, batched
    weights map over calls; either way each row's result is the one a call for that row alone gives
    (rows are quantized and summed independently), bit for bit."""
    rng = np.random.default_rng(3)
    k, b, o = 18, 32, 40
    x = rng.standard_normal((3, 2, k * b)).astype(np.float32)
    w = jnp.asarray(rng.integers(-8, 8, (o, k, b)).astype(np.int8)).astype(jnp.int4)
    scale = (rng.random((o, k)) * 0.02 + 1e-4).astype(np.float32)
    one = jax.jit(cpu_kernels.block_fc_f32)
    want = np.stack([np.concatenate([np.asarray(one(x[i, j:j + 1], w, scale)) for j in range(2)])
                     for i in range(3)])
    got = np.asarray(jax.jit(jax.vmap(hybrid._block_fc_native, in_axes=(0, None, None)))(x, w, scale))
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))
    ws = jnp.stack([w, w, w])
    got = np.asarray(jax.jit(jax.vmap(hybrid._block_fc_native, in_axes=(0, 0, None)))(x, ws, scale))
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))


@pytest.mark.parametrize("name,target", [("llama_q8", "fbjax_int8_matmul"), ("llama_q4b32", "fbjax_block_fc_f32")])
@pytest.mark.parametrize("native", [True, False])
def test_quantized_llm_programs_call_the_kernels_by_default(name, target, native):
    """The decode program of a quantized LLM calls the kernels on CPU (so tests/test_llm.py's LiteRT
    bit-exactness covers them), and not with KernelOptions(native_kernels=False)."""
    from pathlib import Path

    import fbjax

    path = Path(__file__).resolve().parent / "data" / "llm" / f"{name}.tflite"
    m = fbjax.load(path, kernel_options=fbjax.KernelOptions(native_kernels=native))
    dec = m.signature("decode")
    ins = {s.name: np.zeros(s.shape, s.dtype) for s in dec.inputs}
    text = jax.jit(lambda p, b, i: dec.apply(p, buffers=b, **i)).lower(m.params, m.buffers, ins).as_text()
    assert (target in text) == native


def test_export_of_a_quantized_model_carries_no_fbjax_custom_call(tmp_path):
    """An exported artifact must run without fbjax: jax_export refuses a program that calls the native
    kernels with an InputError saying how to load the model, and `fbjax export` loads it that way; the
    artifact then runs and gives the loaded model's int32-exact hybrid outputs (same integer sums, same
    float ops; the rest of the program compiled apart: compared within helpers.TOL, the bound the
    tests use between float32 programs of this size)."""
    from pathlib import Path

    import fbjax
    from fbjax.cli import main
    from fbjax.errors import InputError
    from fbjax.export import jax_export

    path = Path(__file__).resolve().parent / "data" / "llm" / "llama_q8.tflite"
    with pytest.raises(InputError, match="native_kernels=False"):
        jax_export(fbjax.load(path).signature("decode"))
    out = tmp_path / "decode.stablehlo"
    assert main(["export", str(path), "--signature", "decode", "--to", "stablehlo", str(out)]) == 0
    exported = jax.export.deserialize(out.read_bytes())
    assert not any(f"@{t}(" in exported.mlir_module() for t in cpu_kernels.TARGETS)
    m = fbjax.load(path)
    dec = m.signature("decode")
    ins = {s.name: np.zeros(s.shape, s.dtype) for s in dec.inputs}
    params = dict(np.load(str(out.with_suffix(".params.npz"))))
    got = exported.call(params, *[ins[s.name] for s in dec.inputs])
    want = dec(**ins)
    for k in want:  # two differently compiled float32 programs: the project's float32 model bound
        assert rel_err(got[k], want[k]) <= TOL, k
