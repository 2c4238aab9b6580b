"""Gradients of every differentiable TFLite lowering: ``jax.test_util.check_grads``.

For each per-op model of ``tests/test_tflite_ops.py`` (built with
:mod:`fbjax.formats.tflite_builder`), plus a few models here for ops that file covers only
as fused activations, ``check_grads(order=1, modes=("fwd", "rev"))`` compares
the JVP and the VJP of ``model.apply`` with central finite differences, with
respect to every float model input and every weight in ``model.params``.

Precision: the checks run under ``jax.enable_x64`` with float64 inputs and
params, so finite differences with ``eps=1e-6`` are accurate to ~1e-10 and
the tolerance is check_grads' float64 default (1e-5). Models whose lowering
returns float32 whatever its input (DEQUANTIZE's output dtype is the file's
float32; detected as any float32 value in the traced jaxpr) are checked in float32 with ``eps=1e-3`` and tolerance 1e-2
(float32 finite differences carry ~1e-7 / 1e-3 = 1e-4 relative rounding
error). Inputs are standard normal, so with eps=1e-6 a step crosses a ReLU
kink or a max-pool tie with negligible probability (and the seeds are fixed).

Ops registered with ``differentiable=False`` are skipped on purpose;
:func:`test_every_differentiable_op_has_a_gradient_check` fails when a
registered differentiable op has no model here, so new lowerings get one.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import fbjax
from fbjax.formats._generated import tflite_generated as T
from fbjax.lower import LOWERINGS
from fbjax.formats.tflite_builder import TFLiteBuilder, single_op_model

import tflite_op_cases as op_tests
from helpers import COVERED_CUSTOM_OPS

F32 = np.float32


def _extra_unary(op, scale=2.0):
    def build(rng):
        x = (rng.standard_normal((2, 3, 5)) * scale).astype(F32)
        return op_tests.Built(single_op_model(op, [x.shape]), [x])
    return build


def _binary(op, shapes=((2, 3, 4), (2, 3, 4)), positive_b=False):
    def build(rng):
        a = rng.standard_normal(shapes[0]).astype(F32)
        b = rng.standard_normal(shapes[1]).astype(F32)
        if positive_b:
            b = np.abs(b) + 0.5  # keep DIV away from its pole
        out = np.broadcast_shapes(*shapes)
        m = single_op_model(op, list(shapes), options=dict(fused_activation_function="NONE"), output_shapes=[out])
        return op_tests.Built(m, [a, b])
    return build


def _densify(rng):
    """A dense-format 'sparse' constant -> DENSIFY -> ADD with the input."""
    x = rng.standard_normal((3, 4)).astype(F32)
    c = rng.standard_normal((3, 4)).astype(F32)
    b = TFLiteBuilder()
    xi = b.add_input((3, 4), name="x")
    ci = b.add_tensor(data=c, name="sparse_c")
    di = b.add_tensor((3, 4), name="dense_c")
    y = b.add_tensor((3, 4), name="y")
    b.add_op("DENSIFY", [ci], [di])
    b.add_op("ADD", [xi, di], [y], options=dict(fused_activation_function="NONE"))
    b.add_output(y)
    m = b.to_object()
    sp = T.SparsityParametersT()
    sp.traversalOrder = [0, 1]
    dims = []
    for n in (3, 4):
        d = T.DimensionMetadataT()
        d.format = T.DimensionType.DENSE
        d.denseSize = n
        dims.append(d)
    sp.dimMetadata = dims
    m.subgraphs[0].tensors[ci].sparsity = sp
    import flatbuffers

    builder = flatbuffers.Builder(4096)
    builder.Finish(m.Pack(builder), file_identifier=b"TFL3")
    return op_tests.Built(bytes(builder.Output()), [x])


EXTRA_CASES = [
    op_tests.Case("grad-sub", _binary("SUB", ((2, 3, 4), (3, 4)))),
    op_tests.Case("grad-div", _binary("DIV", positive_b=True)),
    *[op_tests.Case(f"grad-{op.lower()}", _extra_unary(op))
      for op in ["RELU", "RELU6", "RELU_N1_TO_1", "RELU_0_TO_1", "TANH"]],
    op_tests.Case("grad-densify", _densify),
]


def _ops_of(model_bytes) -> set:
    from fbjax.formats.tflite import read

    return {n.key for n in read(model_bytes).iter_nodes()}


def _select(cases) -> list:
    """One case per op, plus ADD once per fused activation (the fast default set);
    the rest run under ``-m slow``."""
    seen, out = set(), []
    for c in cases:
        built = c.make()
        # fused activations once each, on the cheap ADD (the conv lowerings share the same code)
        key = tuple(sorted(_ops_of(built.model))), c.id.split("-")[-1] if c.id.startswith("add-") \
            and c.id.split("-")[-1] in op_tests.ACTIVATIONS else ""
        keys = {(k, key[1]) for k in key[0]}
        if keys - seen:
            seen |= keys
            out.append(c)
    return out


ALL = op_tests.ALL_CASES + EXTRA_CASES
FAST = _select(ALL)

# The converter-made one-op models of tests/test_tflite_builtins.py
# (tests/data/tflite_builtins): one per builtin in the default run, the rest slow.
import tflite_builtin_cases as builtin_tests  # noqa: E402

# (the "state" suite's resource-variable models keep state between calls:
# not a pure function of params and inputs, so not checked here)
BUILTINS = {k: v for k, v in builtin_tests.MANIFEST.items() if v.get("suite", "builtins") != "state"}


def _builtin_split():
    covered = set()
    for c in FAST:
        covered |= {n for s_, n in _ops_of(c.make().model) if s_ == "tflite"}
    fast, slow = [], []
    for name in sorted(BUILTINS):
        op = BUILTINS[name]["op"]
        if op in covered:
            slow.append(name)
        else:
            covered.add(op)
            fast.append(name)
    return fast, slow


BUILTIN_FAST, BUILTIN_SLOW = _builtin_split()


def _check(case) -> None:
    built = case.make()
    _check_model(built.model, built.inputs)


def _is_float(dt) -> bool:
    return jnp.issubdtype(dt, jnp.floating)


def _check_model(model_src, inputs, modes=("fwd", "rev"), held=(), **load_kwargs) -> None:
    """check_grads of ``model_src`` w.r.t. its weights and its float inputs
    (except positions in ``held``: float-typed data that is not a value, such
    as MediaPipe's bit-cast argmax indices); ``load_kwargs`` go to
    :func:`fbjax.load`."""
    model = fbjax.load(model_src, **load_kwargs)  # a case that stops loading fails (a regression, not a skip)
    float_in = [i for i, x in enumerate(inputs)
                if np.issubdtype(np.asarray(x).dtype, np.floating) and i not in held]
    const_in = {i: x for i, x in enumerate(inputs) if i not in float_in}
    marked = sorted(f"{s_}:{n}" for s_, n in _ops_of(model_src) if not LOWERINGS.get(s_, n).differentiable)
    if marked:
        pytest.skip(f"registered differentiable=False: {', '.join(marked)}")
    if not float_in and not model.params:
        pytest.skip("nothing to differentiate: no float inputs or weights")
    with jax.enable_x64(model._x64):
        shapes = jax.eval_shape(model.apply, model.params, *inputs)
    shapes = shapes if isinstance(shapes, tuple) else (shapes,)
    keep = [k for k, o in enumerate(shapes) if _is_float(o.dtype)]
    if not keep:
        pytest.skip("no float output: nothing to check")

    def f(params, *xs):
        args = list(inputs)
        for i, x in zip(float_in, xs):
            args[i] = x
        for i, x in const_in.items():
            args[i] = x
        outs = model.apply(params, *args)
        outs = outs if isinstance(outs, tuple) else (outs,)
        return tuple(outs[k] for k in keep)

    with jax.enable_x64(True):
        p64 = {k: jnp.asarray(v, jnp.float64) for k, v in model.params.items()}
        x64 = [jnp.asarray(inputs[i], jnp.float64) for i in float_in]
        # any float32 intermediate (DEQUANTIZE to the file's float32) makes
        # float64 finite differences meaningless: use the float32 check then
        try:
            jaxpr = str(jax.make_jaxpr(f)(p64, *x64))
        except TypeError:  # float32 weights (DEQUANTIZE) meeting float64 inputs in one lax op
            jaxpr = "f32["
        if "f32[" not in jaxpr:
            check_grads(f, (p64, *x64), order=1, modes=modes, eps=1e-6)
            return
    p32 = {k: jnp.asarray(v, jnp.float32) for k, v in model.params.items()}
    x32 = [jnp.asarray(inputs[i], jnp.float32) for i in float_in]
    check_grads(f, (p32, *x32), order=1, modes=modes, eps=1e-3, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("case", FAST, ids=lambda c: c.id)
def test_check_grads(case):
    _check(case)


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in ALL if c not in FAST], ids=lambda c: c.id)
def test_check_grads_all_cases(case):
    _check(case)


FLOAT_OP_SETS = ("tflite", "tflite.custom")
#: op -> the test that checks its gradient
GRADIENT_CHECKED_ELSEWHERE = {
    ("tflite", "HASHTABLE_LOOKUP"):
        "tests/test_tflite_hashtable_lookup.py::test_hashtable_lookup_gradient_reaches_the_looked_up_rows",
    ("tflite.custom", "Roll"): "tests/test_tflite_roll.py::test_roll_gradient_is_the_inverse_roll",
}
STATE_OPS = ("VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE", "CALL_ONCE")


def _check_builtin(name) -> None:
    # WHILE: the bounded lax.scan lowering (reverse-differentiable); the
    # fixtures' loops run at most a few dozen iterations (< WHILE_MAX_ITERATIONS)
    load_kwargs = {"while_max_iterations": WHILE_MAX_ITERATIONS} if "WHILE" in BUILTINS[name]["ops"] else {}
    inputs = builtin_tests.case_inputs(name)
    # "halves" inputs sit exactly on ROUND's steps (to test ties against
    # LiteRT); for derivatives, move them off the discontinuities
    inputs = [x + np.asarray(0.25, x.dtype) if kind == "halves" else x
              for x, (_, _, kind) in zip(inputs, BUILTINS[name]["inputs"])]
    held = [i for i, (_, _, kind) in enumerate(BUILTINS[name]["inputs"]) if kind.startswith(("idx", "perm", "winidx"))]
    _check_model(builtin_tests.DATA / f"{name}.tflite", inputs, ("fwd", "rev"), held, **load_kwargs)


#: builtin fixture -> why its gradient check is expected to fail (limits of
#: JAX's autodiff reached by the current lowering; reported, not hidden): each
#: runs as a strict xfail, so a fix shows as XPASS and fails until its entry goes
BUILTIN_KNOWN: dict = {}
assert set(BUILTIN_KNOWN) <= set(BUILTINS), "BUILTIN_KNOWN names a fixture that no longer exists"


def _builtin_params(names) -> list:
    return [pytest.param(n, marks=pytest.mark.xfail(reason=BUILTIN_KNOWN[n], strict=True))
            if n in BUILTIN_KNOWN else n for n in names]
#: WHILE lowers by default to lax.while_loop, which JAX differentiates in
#: forward mode only; the WHILE fixtures are loaded with
#: ``while_max_iterations`` (a bounded lax.scan) and checked in both modes.
WHILE_MAX_ITERATIONS = 64


@pytest.mark.parametrize("name", _builtin_params(BUILTIN_FAST))
def test_check_grads_builtin(name):
    _check_builtin(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", _builtin_params(BUILTIN_SLOW))
def test_check_grads_builtin_all(name):
    _check_builtin(name)


def test_every_differentiable_op_has_a_gradient_check():
    covered = set()
    for c in ALL:
        covered |= _ops_of(c.make().model)
    for spec in BUILTINS.values():
        covered |= {("tflite.custom" if spec.get("suite") == "mediapipe" else "tflite", op) for op in spec["ops"]}
    # resource variables keep state between calls; they are not functions to differentiate
    covered |= {("tflite", op) for op in STATE_OPS}
    # MediaPipe geometry ops: checked by tests/test_tflite_mediapipe_ops.py::test_gradients
    covered |= {("tflite.custom", op) for op in COVERED_CUSTOM_OPS}
    # ops whose gradient is checked in their own test module (analytic gradients)
    covered |= set(GRADIENT_CHECKED_ELSEWHERE)
    registered = {d.key for d in LOWERINGS if d.op_set in FLOAT_OP_SETS}
    missing = sorted(f"{s}:{n}" for s, n in registered - covered
                     if LOWERINGS.get(s, n).differentiable)
    assert not missing, (
        f"differentiable TFLite lowerings without a gradient check: {missing}; add a per-op model in "
        "tests/test_tflite_ops.py (or here), or register the op with differentiable=False"
    )


def test_gradient_wrt_weights_is_not_zero():
    """check_grads would also pass for a lowering that cut the weights off the
    graph (both sides zero); the conv weights must get a non-zero gradient."""
    case = op_tests.CONV_CASES[0]
    built = case.make()
    model = fbjax.load(built.model)
    g = jax.grad(lambda p: jnp.sum(model.apply(p, *built.inputs) ** 2))(model.params)
    assert g and all(float(jnp.abs(v).max()) > 0 for v in g.values())


def test_integer_op_set_is_marked_non_differentiable():
    # Integer arithmetic (the bit-exact "tflite.int" kernels) has no gradient.
    marked = [d.name for d in LOWERINGS if d.op_set == "tflite.int" and d.differentiable]
    assert not marked, f"tflite.int ops registered as differentiable: {sorted(marked)}"
