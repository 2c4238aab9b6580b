"""TFLite control flow: WHILE, IF and CALL.

Converter-made models (``suite: control`` in
``tests/data/tflite_builtins/manifest.json``, written by
``tests/data/tflite_builtins/generate.py``): a WHILE loop whose trip count is
a model input, one whose exit depends on the data it updates, and nested
IFs. Each runs for several inputs (different trip counts, every branch
combination) against LiteRT, through both fbjax's JAX lowering (one jitted
function: the loop is ``lax.while_loop``, the branch ``lax.cond``) and the
numpy reference. A CALL model is built with :mod:`fbjax.formats.tflite_builder` because the
converter inlines calls; LiteRT has no CALL kernel, so numpy is its oracle. Tolerance 1e-5 relative (element-wise bodies; the
loops run at most a few dozen iterations, each adding float32 rounding that
LiteRT and XLA share up to the last ulp of ``sin``).
"""

from __future__ import annotations

import numpy as np
import pytest

import fbjax
from fbjax import reference

from conftest import assert_close, litert_run
from tflite_builtin_cases import DATA, MANIFEST, _as_list

RTOL = 1e-5


def _run_all(name, inputs):
    path = DATA / f"{name}.tflite"
    expected = litert_run(path, inputs)
    model = fbjax.load(path)
    for label, got in (("fbjax", _as_list(model(*inputs))), ("reference", _as_list(reference.run(path, *inputs)))):
        assert len(got) == len(expected)
        for k, (g, e) in enumerate(zip(got, expected)):
            assert_close(g, e, RTOL, f"{name}: {label} vs LiteRT, output {k}")
    return expected


def test_fixtures_contain_control_flow():
    for name, op in (("while_input_trip_count", "WHILE"), ("while_data_dependent", "WHILE"), ("nested_if", "IF")):
        assert op in MANIFEST[name]["ops"], name


@pytest.mark.parametrize("n", [0, 1, 3, 7])
def test_while_trip_count_from_input(n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    out = _run_all("while_input_trip_count", [x, np.array([n], np.int32)])
    if n == 0:  # zero iterations: the input comes back unchanged
        np.testing.assert_array_equal(out[0], x)


@pytest.mark.parametrize("scale", [0.01, 1.0, 30.0])
def test_while_exit_depends_on_data(scale):
    x = (np.linspace(-1, 1, 4) * scale).astype(np.float32)
    _run_all("while_data_dependent", [x])


@pytest.mark.parametrize("p,q", [(True, True), (True, False), (False, True), (False, False)])
def test_nested_if(p, q):
    x = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    _run_all("nested_if", [x, np.array([p]), np.array([q])])


def test_call():
    model = DATA / "call.tflite"  # written by generate.py --builder
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((2, 3)).astype(np.float32) for _ in range(2)]
    # LiteRT's builtin resolver has no CALL kernel ("Didn't find op for builtin
    # opcode 'CALL'"), so the oracle is the callee's plain numpy meaning.
    expected = [xs[0] * xs[1] + xs[0]]
    assert_close(_as_list(fbjax.load(model)(*xs))[0], expected[0], RTOL, "CALL fbjax")
    assert_close(_as_list(reference.run(model, *xs))[0], expected[0], RTOL, "CALL reference")


@pytest.mark.parametrize("name", ["keras_lstm", "keras_gru", "keras_bidirectional_lstm", "keras_simple_rnn"])
def test_keras_recurrent_layers(name):
    """Keras LSTM / GRU / bidirectional LSTM / SimpleRNN, which the converter
    turns into WHILE loops over the time steps (tolerance 1e-4: each step is
    a small matmul, see tests/test_tflite_builtins.py)."""
    assert "WHILE" in MANIFEST[name]["ops"]
    rng = np.random.default_rng(5)
    x = rng.standard_normal(MANIFEST[name]["inputs"][0][0]).astype(np.float32)
    path = DATA / f"{name}.tflite"
    expected = litert_run(path, [x])
    for label, got in (("fbjax", _as_list(fbjax.load(path)(x))), ("reference", _as_list(reference.run(path, x)))):
        for k, (g, e) in enumerate(zip(got, expected)):
            assert_close(g, e, 1e-4, f"{name}: {label} vs LiteRT, output {k}")


def test_resource_variables_three_calls():
    """A converter-made model with two resource variables (CALL_ONCE
    initialiser, VAR_HANDLE / READ_VARIABLE / ASSIGN_VARIABLE): three calls
    in a row on one fbjax.Model give LiteRT's outputs from one interpreter
    invoked three times; Model.state carries the variables; the pure
    Model.apply(params, x, state=...) returns (outputs, new_state) and
    replays the same sequence; the numpy reference gives the first call."""
    from ai_edge_litert.interpreter import Interpreter

    name = "resource_variables"
    assert {"CALL_ONCE", "VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE"} <= set(MANIFEST[name]["ops"])
    path = DATA / f"{name}.tflite"
    rng = np.random.default_rng(11)
    xs = [rng.standard_normal((2, 3)).astype(np.float32) for _ in range(3)]
    it = Interpreter(model_path=str(path))
    it.allocate_tensors()
    inp, out = it.get_input_details()[0]["index"], it.get_output_details()[0]["index"]
    expected = []
    for x in xs:
        it.set_tensor(inp, x)
        it.invoke()
        expected.append(np.array(it.get_tensor(out)))
    assert not np.allclose(expected[0], expected[2])  # the state matters

    model = fbjax.load(path)
    init = dict(model.state)
    assert set(init) and all(np.asarray(v).dtype == np.float32 for v in init.values())
    for k, x in enumerate(xs):
        assert_close(np.asarray(model(x)), expected[k], RTOL, f"call {k + 1}")
    state = init
    for k, x in enumerate(xs):
        y, state = model.apply(model.params, x, state=state)
        assert_close(np.asarray(y), expected[k], RTOL, f"pure apply, step {k + 1}")
    for key in state:
        assert_close(np.asarray(state[key]), np.asarray(model.state[key]), 0, f"state {key}")
    assert_close(_as_list(reference.run(path, xs[0]))[0], expected[0], RTOL, "reference, first call")


def test_resource_variables_gradient():
    """Gradients flow through ASSIGN_VARIABLE -> READ_VARIABLE within a call:
    ``jax.test_util.check_grads`` (float64, forward and reverse mode) of the
    pure ``Model.apply`` with respect to the input, the state held fixed."""
    import jax
    from jax.test_util import check_grads

    model = fbjax.load(DATA / "resource_variables.tflite")
    x = np.random.default_rng(2).standard_normal((2, 3))
    with jax.enable_x64(True):
        state = {k: jax.numpy.asarray(v, jax.numpy.float64) for k, v in model.state.items()}
        params = {k: jax.numpy.asarray(v, jax.numpy.float64) for k, v in model.params.items()}

        def f(x):
            y, new_state = model.apply(params, x, state=state)
            return y, new_state[sorted(new_state)[0]]

        check_grads(f, (jax.numpy.asarray(x),), order=1, modes=("fwd", "rev"), eps=1e-6)
        g = jax.grad(lambda x: f(x)[0].sum())(jax.numpy.asarray(x))
        assert float(abs(g).max()) > 0


# --- while_max_iterations: WHILE as a bounded, reverse-differentiable lax.scan ---

WHILE_FIXTURES = ["while_input_trip_count", "while_data_dependent", "keras_lstm", "keras_gru",
                  "keras_bidirectional_lstm", "keras_simple_rnn"]


def _while_inputs(name, n=None):
    rng = np.random.default_rng(7)
    specs = MANIFEST[name]["inputs"]
    xs = [rng.standard_normal(specs[0][0]).astype(np.float32)]
    if name == "while_input_trip_count":
        xs.append(np.array([5 if n is None else n], np.int32))
    return xs


@pytest.mark.parametrize("name", WHILE_FIXTURES)
def test_while_max_iterations_matches_while_loop(name):
    """The lax.scan lowering (64 steps, above every fixture's trip count)
    gives the lax.while_loop lowering's outputs. The two loop forms are
    different XLA programs (fusion, and with it FMA contraction and
    summation order, may differ by CPU): each is held to ``RTOL`` of LiteRT
    (the file's float32 tolerance), so they agree to ``2 * RTOL``."""
    assert "WHILE" in MANIFEST[name]["ops"]
    path = DATA / f"{name}.tflite"
    xs = _while_inputs(name)
    want = _as_list(fbjax.load(path)(*xs))
    got = _as_list(fbjax.load(path, while_max_iterations=64)(*xs))
    lit = litert_run(path, xs)
    assert len(got) == len(want) == len(lit)
    for k, (g, w, e) in enumerate(zip(got, want, lit)):
        assert np.all(np.isfinite(np.asarray(g)))
        assert_close(g, e, RTOL, f"{name}: scan vs LiteRT, output {k}")
        assert_close(w, e, RTOL, f"{name}: while_loop vs LiteRT, output {k}")
        assert_close(g, w, 2 * RTOL, f"{name}: scan vs while_loop, output {k}")


@pytest.mark.parametrize("name,n", [("while_input_trip_count", 3), ("while_input_trip_count", 7),
                                    ("while_data_dependent", None)])
def test_while_max_iterations_reverse_mode_gradient(name, n):
    """jax.grad (reverse mode) through a WHILE: finite, non-zero, and equal to
    a central finite difference along a random direction. The loop carries
    stay the file's float32 whatever the input, so the check is float32 with
    eps 1e-3: seven compounded steps make the third derivative large (eps
    1e-2 is 8e-3 off), at 1e-3 the truncation error is < 1e-4 relative and
    the rounding ~1e-7 / eps = 1e-4 relative; hence rtol 2e-3. The default lax.while_loop lowering
    has no reverse mode (checked too)."""
    import jax
    import jax.numpy as jnp

    path = DATA / f"{name}.tflite"
    xs = _while_inputs(name, n)
    model = fbjax.load(path, while_max_iterations=32)
    rng = np.random.default_rng(1)
    x = jnp.asarray(xs[0])
    w = jnp.asarray(rng.standard_normal(x.shape), jnp.float32)
    d = jnp.asarray(rng.standard_normal(x.shape), jnp.float32)

    def loss(x, m=model):
        return jnp.sum(m.apply(m.params, x, *xs[1:])[0] * w)

    g = jax.grad(loss)(x)
    assert bool(jnp.all(jnp.isfinite(g))) and float(jnp.abs(g).max()) > 0
    eps = 1e-3
    fd = (loss(x + eps * d) - loss(x - eps * d)) / (2 * eps)
    np.testing.assert_allclose(float(jnp.vdot(g, d)), float(fd), rtol=2e-3, atol=1e-3)
    with pytest.raises(ValueError, match="[Rr]everse-mode"):
        jax.grad(loss)(x, fbjax.load(path))  # lax.while_loop: forward mode only


def test_while_max_iterations_too_small_gives_nan():
    """A loop that still wants to run after N steps sets its float outputs to
    NaN (a too-small N is visible); N equal to the trip count is enough."""
    path = DATA / "while_input_trip_count.tflite"
    xs = _while_inputs("while_input_trip_count", 7)
    want = np.asarray(_as_list(fbjax.load(path)(*xs))[0])
    short = np.asarray(_as_list(fbjax.load(path, while_max_iterations=3)(*xs))[0])
    assert np.isnan(short).all()
    exact = np.asarray(_as_list(fbjax.load(path, while_max_iterations=7)(*xs))[0])
    # scan vs while_loop: two XLA programs, each within RTOL of LiteRT (test_while_trip_count_from_input)
    assert_close(exact, want, 2 * RTOL, "N == trip count")
    data = DATA / "while_data_dependent.tflite"
    x = _while_inputs("while_data_dependent")
    assert np.isnan(np.asarray(_as_list(fbjax.load(data, while_max_iterations=0)(*x))[0])).all()


def test_while_max_iterations_must_be_a_non_negative_int():
    for bad in (-1, 2.5, True):
        with pytest.raises(fbjax.InputError, match="while_max_iterations"):
            fbjax.load(DATA / "while_data_dependent.tflite", while_max_iterations=bad)
