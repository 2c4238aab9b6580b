"""``Model.__call__``'s per-call path (issue 8).

On small models the Python around the jitted program is a large part of a
call (``tflm_sine_float``: ~35 us per call, of which ~24 us is a bare
``jax.jit(model.apply)(params, x)``). ``__call__`` now passes the params as a
tuple of leaves and, for a model without prepared program
(``Model.executor.name == "jit"``), leaves the input checks to the jit dispatch: a new
input signature is checked when it is traced (``Model._apply_leaves``) and
inputs that need converting go through ``Model.check_inputs`` as before.
These tests check that every behaviour of the checked call is kept: the
oracle is the plain jit of ``Model.apply`` on the inputs converted as the
docstring says (same program, same XLA: results are compared exactly);
the vmapped and the CPU-prepared programs are other programs, compared
within the float32 summation bound (``conftest.gamma``).
"""

from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fbjax
from fbjax.errors import InputError
from fbjax.formats.tflite_builder import single_op_model

from conftest import abs_magnitude, assert_within, gamma

F32 = np.float32
SINE = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "models", "tflite", "tflm_sine_float.tflite")


def _fc_bytes(batch=2):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 4)).astype(F32)
    b = rng.standard_normal(3).astype(F32)
    return single_op_model("FULLY_CONNECTED", [(batch, 4), w, b], output_shapes=[(batch, 3)])


@pytest.fixture(scope="module")
def fc_bytes():
    return _fc_bytes()


def _ref(m, params, *xs):
    return np.asarray(m.executor.jitted(params, *xs))  # the plain jit of Model.apply


def _x(shape=(2, 4), dtype=F32, seed=1):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def test_matching_inputs_skip_the_python_checks(fc_bytes, monkeypatch):
    m = fbjax.load(fc_bytes)
    assert m.executor.name == "jit"  # tiny model: the plain program
    x = _x()
    np.testing.assert_array_equal(m(x), _ref(m, m.params, x))
    calls = []
    orig = m.check_inputs
    monkeypatch.setattr(m, "check_inputs", lambda inputs: calls.append(1) or orig(inputs))
    for _ in range(3):
        np.testing.assert_array_equal(m(x), _ref(m, m.params, x))
        np.testing.assert_array_equal(m(jnp.asarray(x)), _ref(m, m.params, x))
    assert calls == []  # numpy and jax arrays of the spec's shape and dtype: no check in Python
    assert not m.checks_inputs


@pytest.mark.parametrize("bad, match", [
    ((np.zeros((2, 5), F32),), "shape"),
    ((np.zeros((1, 4), F32),), "shape"),
    ((np.zeros((2, 4), np.complex64),), "dtype"),
    ((np.zeros((2, 4), F32), np.zeros((2, 4), F32)), "input"),
    ((), "input"),
    (("abc",), "is a str"),  # named as a str, not "has shape ()" (issue 15)
])
def test_bad_inputs_raise_input_error_every_time(fc_bytes, bad, match):
    m = fbjax.load(fc_bytes)
    x = _x()
    m(x)
    for _ in range(2):  # the failed trace is not cached as a success
        with pytest.raises(InputError, match=match):
            m(*bad)
    assert not m.checks_inputs  # a wrong call does not slow down the next ones
    np.testing.assert_array_equal(m(x), _ref(m, m.params, x))


@pytest.mark.parametrize("make", [
    lambda x: x.astype(np.int32),  # int -> float32: cast (same_kind)
    lambda x: x.tolist(),  # nested lists: np.asarray, then cast
    lambda x: jnp.asarray(x, jnp.float16),  # float16 -> float32
], ids=["int32", "list", "float16"])
def test_inputs_that_need_converting_are_converted(fc_bytes, make):
    m = fbjax.load(fc_bytes)
    x = _x() * 3
    y = make(x)
    conv = np.asarray(y).astype(F32)
    if np.issubdtype(np.asarray(y).dtype, np.integer):  # integer data for a float input: said once
        with pytest.warns(UserWarning, match="is float32 but got int32 data: it is cast as is"):
            np.testing.assert_array_equal(m(y), _ref(m, m.params, conv))
    for _ in range(2):
        np.testing.assert_array_equal(m(y), _ref(m, m.params, conv))
    assert m.checks_inputs  # from now on every call is checked first
    np.testing.assert_array_equal(m(x), _ref(m, m.params, x))


def test_weakly_typed_input_is_checked_and_converted(fc_bytes):
    m = fbjax.load(fc_bytes)
    w = jnp.broadcast_to(jnp.asarray(0.5), (2, 4))  # a weakly typed float32 array
    assert w.aval.weak_type
    y = m(w)
    np.testing.assert_array_equal(y, _ref(m, m.params, np.full((2, 4), 0.5, F32)))
    assert not y.aval.weak_type  # as the checked call (the program gets a strongly typed input)


def test_float64_input_without_x64_is_rounded_as_before(fc_bytes):
    m = fbjax.load(fc_bytes)
    x = np.random.default_rng(2).standard_normal((2, 4))  # float64
    np.testing.assert_array_equal(m(x), _ref(m, m.params, x.astype(F32)))


def test_params_replaced_or_updated_in_place_take_effect(fc_bytes):
    m = fbjax.load(fc_bytes)
    x = _x()
    first = np.asarray(m(x))
    new = {k: v * 2 for k, v in m.params.items()}
    m.params = new
    y = np.asarray(m(x))
    np.testing.assert_array_equal(y, _ref(m, new, x))
    assert not np.array_equal(y, first)
    k = sorted(m.params)[0]
    m.params[k] = -m.params[k]  # in place
    np.testing.assert_array_equal(m(x), _ref(m, m.params, x))
    m.params = dict(m.params, extra=jnp.ones(3))  # a name that is not a weight (a typo): refused, as by apply
    with pytest.raises(fbjax.InputError, match="not weights of this model"):
        m(x)
    m.params = {k: v for k, v in m.params.items() if k != "extra"}
    np.testing.assert_array_equal(m(x), _ref(m, m.params, x))
    missing = {k: v for i, (k, v) in enumerate(m.params.items()) if i}
    m.params = missing
    with pytest.raises(fbjax.InputError, match="params lacks 1"):
        m(x)


def test_dynamic_batch_and_no_params():
    m = fbjax.load(_fc_bytes(batch=1), batch_size=None)
    assert m.inputs[0].shape[0] is None
    for n in (1, 5, 1):
        x = _x((n, 4), seed=n)
        np.testing.assert_array_equal(m(x), _ref(m, m.params, x))
    with pytest.raises(InputError, match="shape"):
        m(_x((3, 5)))
    add = fbjax.load(single_op_model("ADD", [(2, 3), (2, 3)]))
    assert add.params == {}
    a, b = _x((2, 3), seed=3), _x((2, 3), seed=4)
    np.testing.assert_array_equal(add(a, b), a + b)
    with pytest.raises(InputError, match="input"):
        add(a)


def test_under_vmap(fc_bytes):
    m = fbjax.load(fc_bytes)
    xs = _x((3, 2, 4))
    y = jax.vmap(m)(xs)
    # the batched program may sum the 4 products and the bias in another order than three separate
    # ones: each is within gamma_5 * (|x| |W| + |b|) of the exact result, so they differ by twice that
    bound = 2 * gamma(5) * np.stack([abs_magnitude(m, x) for x in xs])
    assert_within(y, np.stack([_ref(m, m.params, x) for x in xs]), bound, "vmap vs separate calls")


def test_prepared_program_gets_params_as_sequences():
    """The prepared CPU program (:class:`fbjax.executors.cpu_prepared.CpuPrepared`)
    takes the params it uses as a tuple and the relaid ones as a list:
    the relaid params' original entries are not passed at all."""
    if jax.default_backend() != "cpu":
        pytest.skip("the prepared program exists on the CPU backend only")
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 3, 3, 4)).astype(F32)
    b = rng.standard_normal(8).astype(F32)
    m = fbjax.load(single_op_model("CONV_2D", [(1, 6, 6, 4), w, b],
                                   options=dict(padding="SAME", stride_h=1, stride_w=1),
                                   output_shapes=[(1, 6, 6, 8)]))
    fast = m.executor
    assert fast.name in ("cpu_prepared", "trace_cache") and list(fast.layouts) == ["const1"]
    used, relaid, _, _ = fast.args(m.params)
    assert isinstance(used, tuple) and isinstance(relaid, list)
    assert len(used) == len(m.params) - 1 and len(relaid) == 1
    assert relaid[0].shape == (3, 3, 4, 8)  # HWIO
    x = _x((1, 6, 6, 4))
    ref = np.asarray(m.apply(m.params, x))
    # HWIO (prepared, fbjax's compile options) vs OHWI (XLA's defaults): 3*3*4 products and the bias
    # summed in two orders, each within gamma_37 * (|x| * |w| + |b|) of the exact result
    assert_within(m(x), ref, 2 * gamma(37) * abs_magnitude(m, x), "prepared program vs apply")
    assert fast.args(m.params)[1] is relaid  # cached while the params entry is the same array


def _min_us(fn, x, blocks=15, n=300):
    best = float("inf")
    for _ in range(blocks):
        t = time.perf_counter()
        for _ in range(n):
            jax.block_until_ready(fn(x))
        best = min(best, (time.perf_counter() - t) / n)
    return best * 1e6


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(SINE), reason="needs ../shared/models/tflite/tflm_sine_float.tflite")
def test_call_is_about_a_bare_jit_call():
    """Timing, so behind ``slow``: the per-call time of ``Model.__call__`` on
    the 3-layer MLP is within 30 % + 3 us of a bare
    ``jax.jit(model.apply)(params, x)`` call (minimum over blocks, both
    measured alternately; before issue 8 it was ~1.45x)."""
    m = fbjax.load(SINE)
    j = jax.jit(m.apply)
    x = np.full((1, 1), 0.5, F32)
    bare = lambda x: j(m.params, x)  # noqa: E731
    jax.block_until_ready((m(x), bare(x)))
    t_model, t_bare = [], []
    for _ in range(3):
        t_model.append(_min_us(m, x))
        t_bare.append(_min_us(bare, x))
    assert min(t_model) <= 1.3 * min(t_bare) + 3.0, (t_model, t_bare)


def test_x64_model_keeps_64_bit_inputs():
    """A model with int64 tensors runs under a scoped ``enable_x64(True)``:
    int64 inputs go through unconverted, int32 ones are cast to int64."""
    m = fbjax.load(single_op_model("CAST", [(2, 3)], input_dtypes=[np.int64], output_dtypes=[np.float64]))
    assert m.x64 and not jax.config.jax_enable_x64
    big = np.array([[2**40 + 1, -3, 0], [7, 2**53, 1]], np.int64)
    y = m(big)
    assert y.dtype == np.float64 and not m.checks_inputs
    np.testing.assert_array_equal(y, big.astype(np.float64))
    small = np.arange(6, dtype=np.int32).reshape(2, 3)
    np.testing.assert_array_equal(m(small), small.astype(np.float64))
    assert m.checks_inputs
    np.testing.assert_array_equal(m(big), big.astype(np.float64))
