"""Tiered compilation of the CPU executors (:mod:`fbjax.executors.tiered`, issue 19 item 4).

The first call of a large enough program runs a quickly compiled tier (the
prepared executors: the program lowered with the plain kernel choices,
``kernels="quick"``) and the optimised program is swapped in once a
background thread has traced and compiled it. The oracle for results is a
float64 numpy convolution, or fbjax's numpy reference interpreter (float64
sums): the tiers compute differently lowered and fused programs, so each is
held to the float32 summation bound, never to the other's bits; for the
tiers, the tier attribute and the persistent-cache marker a second process
reads.

Tiering is the ``tiered_compile=True`` load option (off by default: the
rest of the suite, and tests/test_determinism.py, run without it).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

import fbjax
import fbjax.reference
from fbjax import executors
from fbjax.executors import tiered, trace_cache
from fbjax.formats.tflite_builder import TFLiteBuilder, single_op_model

from conftest import ROOT, abs_magnitude, assert_within, gamma

F32 = np.float32
#: single-op models stand in for large ones: tiered from one node on
SMALL = fbjax.KernelOptions(tiered_min_nodes=1)

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="tiered compilation is CPU-only")


def _conv(w, b):
    return single_op_model("CONV_2D", [(1, 6, 6, 4), w, b], options=dict(padding="SAME", stride_h=1, stride_w=1),
                           output_shapes=[(1, 6, 6, 8)])


def _conv_ref(x, w, b):
    """float64 SAME 3x3 convolution, TFLite weights [O, H, W, I]: (value, sum of |terms|)."""
    xp = np.pad(x.astype(np.float64), [(0, 0), (1, 1), (1, 1), (0, 0)])
    out = np.zeros(x.shape[:3] + (w.shape[0],)) + b
    mag = np.zeros_like(out) + np.abs(b)
    for i in range(3):
        for j in range(3):
            patch = xp[:, i:i + x.shape[1], j:j + x.shape[2], :]
            out += np.einsum("nhwc,oc->nhwo", patch, w[:, i, j, :].astype(np.float64))
            mag += np.einsum("nhwc,oc->nhwo", np.abs(patch), np.abs(w[:, i, j, :]).astype(np.float64))
    return out, mag


@pytest.fixture
def tiering(monkeypatch):
    # the user cache may hold the optimised program from an earlier run (the marker test is below)
    monkeypatch.setattr(trace_cache, "optimised_marked", lambda key: False)


@pytest.mark.parametrize("kind", ["conv", "add"])
def test_first_call_runs_a_tier_then_the_optimised_program(tiering, kind):
    rng = np.random.default_rng(0)
    if kind == "conv":  # the prepared CPU executor
        w = rng.standard_normal((8, 3, 3, 4)).astype(F32)
        b = rng.standard_normal(8).astype(F32)
        m = fbjax.load(_conv(w, b), tiered_compile=True, kernel_options=SMALL)
        x = rng.standard_normal((1, 6, 6, 4)).astype(F32)
        ref, mag = _conv_ref(x, w, b)
        bound = gamma(37) * mag  # 36 products and the bias per output
        xs = (x,)
        call = None  # known after the first call: the trace cache's program or the prepared jit
    else:  # the plain jit executor (its unchecked fast path)
        m = fbjax.load(single_op_model("ADD", [(2, 3), (2, 3)]), tiered_compile=True, kernel_options=SMALL)
        xs = tuple(rng.standard_normal((2, 3)).astype(F32) for _ in range(2))
        ref = xs[0].astype(np.float64) + xs[1]
        bound = gamma(1) * (np.abs(xs[0]) + np.abs(xs[1]))  # one rounding
        call = m.executor.jitted_leaves
        assert m.executor.name == "jit"
    assert call is None or (isinstance(call, executors.TieredCall) and call.tier is None)
    assert_within(m(*xs), ref, bound, "first tier")
    if call is None:
        ex = m.executor
        call = ex._cached_call if ex.name == "trace_cache" else ex.call
        assert isinstance(call, executors.TieredCall)
    assert call.tier in ("quick", "optimised")  # optimised already if the background compile won the race
    m.wait_optimised(timeout=120)  # the public wait (what fbjax.infer does after its first step)
    assert call.tier == "optimised"
    assert call.wait(timeout=0) == "optimised"
    assert_within(m(*xs), ref, bound, "optimised tier")


@pytest.mark.parametrize("kind", ["conv", "add"])
def test_skip_quick_tier_compiles_the_optimised_program_first(tiering, kind, monkeypatch):
    """Model.skip_quick_tier (what fbjax.infer calls before its first step):
    the first call compiles no quick tier and already runs the optimised
    program; once a call ran, it changes nothing."""
    quick_compiles = []
    real_start = executors.TieredCall._start
    monkeypatch.setattr(executors.TieredCall, "_start", lambda self, args: (quick_compiles.append(1), real_start(self, args)))
    rng = np.random.default_rng(1)
    if kind == "conv":
        w = rng.standard_normal((8, 3, 3, 4)).astype(F32)
        b = rng.standard_normal(8).astype(F32)
        m = fbjax.load(_conv(w, b), tiered_compile=True, kernel_options=SMALL)
        x = rng.standard_normal((1, 6, 6, 4)).astype(F32)
        ref, mag = _conv_ref(x, w, b)
        bound, xs = gamma(37) * mag, (x,)
    else:
        m = fbjax.load(single_op_model("ADD", [(2, 3), (2, 3)]), tiered_compile=True, kernel_options=SMALL)
        xs = tuple(rng.standard_normal((2, 3)).astype(F32) for _ in range(2))
        ref = xs[0].astype(np.float64) + xs[1]
        bound = gamma(1) * (np.abs(xs[0]) + np.abs(xs[1]))
    m.skip_quick_tier()
    assert_within(m(*xs), ref, bound, "first call")
    ex = m.executor
    call = {"trace_cache": lambda: ex._cached_call, "cpu_prepared": lambda: ex.call, "jit": lambda: ex.jitted_leaves}[ex.name]()
    assert isinstance(call, executors.TieredCall)  # tiered executor, but its first call compiled the optimised program
    assert call.tier == "optimised" and call.thread is None and not quick_compiles
    m.skip_quick_tier()  # after a call: nothing changes
    assert_within(m(*xs), ref, bound, "second call")
    # a model called before skip_quick_tier keeps its tiers
    m2 = fbjax.load(single_op_model("ADD", [(2, 3), (2, 3)]), tiered_compile=True, kernel_options=SMALL)
    m2(*[np.ones((2, 3), F32)] * 2)
    m2.skip_quick_tier()
    assert quick_compiles and m2.executor.jitted_leaves.tier in ("quick", "optimised")
    m2.wait_optimised(timeout=120)


def test_wait_optimised_returns_at_once_before_any_call_and_untiered(tiering):
    """Model.wait_optimised starts nothing: before the first call there is no
    compile to wait for; without tiering it is a no-op."""
    m = fbjax.load(single_op_model("ADD", [(2, 3), (2, 3)]), tiered_compile=True, kernel_options=SMALL)
    m.wait_optimised(timeout=0)
    assert m.executor.jitted_leaves.tier is None  # no compile was started by waiting
    m2 = fbjax.load(single_op_model("ADD", [(2, 3), (2, 3)]))  # tiered_compile off: the default
    assert not isinstance(m2.executor.jitted_leaves, executors.TieredCall)
    x = np.ones((2, 3), F32)
    np.testing.assert_array_equal(np.asarray(m2(x, x)), 2 * x)  # one exact rounding: 1 + 1
    m2.wait_optimised()


def _grouped_chain():
    """Depthwise 3x3 (stride 1, then stride 2 with multiplier 2), a 2-group
    3x3 convolution, a 2x2 max pool and a 1x1 convolution: the CPU kernel
    choices of convolutions (shifted depthwise, per-group convolutions) and a
    chain of grouped convolutions (what XLA:CPU's YNNPACK fusion
    miscompiles), with a relaid 1x1 weight so the prepared executor runs it.
    Returns ``(tflite bytes, float32 sums per output: the lengths of the
    chain's dot products and bias adds)``."""
    rng = np.random.default_rng(7)
    b = TFLiteBuilder()
    x = b.add_input((1, 8, 8, 4), name="x")

    def op(name, ins, shape, **options):
        out = b.add_tensor(shape)
        consts = [b.add_constant(rng.standard_normal(a.shape).astype(F32)) if isinstance(a, np.ndarray) else a
                  for a in ins]
        b.add_op(name, consts, [out], options=options)
        return out

    same1 = dict(padding="SAME", stride_h=1, stride_w=1)
    h = op("DEPTHWISE_CONV_2D", [x, np.zeros((1, 3, 3, 4)), np.zeros(4)], (1, 8, 8, 4), depth_multiplier=1, **same1)
    h = op("DEPTHWISE_CONV_2D", [h, np.zeros((1, 3, 3, 8)), np.zeros(8)], (1, 4, 4, 8), depth_multiplier=2,
           padding="SAME", stride_h=2, stride_w=2)
    h = op("CONV_2D", [h, np.zeros((8, 3, 3, 4)), np.zeros(8)], (1, 4, 4, 8), **same1)  # 2 groups
    h = op("MAX_POOL_2D", [h], (1, 2, 2, 8), padding="VALID", stride_h=2, stride_w=2, filter_height=2,
           filter_width=2)
    h = op("CONV_2D", [h, np.zeros((3, 1, 1, 8)), np.zeros(3)], (1, 2, 2, 3), **same1)
    b.add_output(h)
    return b.build(), (9 + 1) + (9 + 1) + (36 + 1) + (8 + 1)


def test_quick_tier_runs_the_plain_kernel_choices(tiering):
    """The quick program lowers depthwise and grouped convolutions as one
    grouped ``conv_general_dilated`` each (depthwise ones up to
    ``KernelOptions.quick_shifted_min_output`` outputs); the optimised program takes the
    CPU paths (shifted depthwise, one convolution per group). Both tiers' values are held to
    the numpy reference (float64 sums) within the float32 rounding of the
    chain's sums (``abs_magnitude``: |weights| times |inputs|), plus one
    float32 rounding per op on the reference's side."""
    src, n_sum = _grouped_chain()
    m = fbjax.load(src, tiered_compile=True, kernel_options=SMALL)
    ex = m.executor
    assert ex.name == "trace_cache" and ex.quick is not None
    x = np.random.default_rng(8).standard_normal((1, 8, 8, 4)).astype(F32)
    spec = jax.ShapeDtypeStruct(x.shape, x.dtype)
    quick = str(ex.quick.trace(*ex.args(m.params), spec).jaxpr)
    best = str(ex.jitted.trace(*ex.args(m.params), spec).jaxpr)
    grouped = lambda text: sorted(int(g) for g in re.findall(r"feature_group_count=(\d+)", text) if g != "1")
    assert grouped(quick) == [2, 4, 4], grouped(quick)  # the 2-group conv, both depthwise
    assert grouped(best) == [], grouped(best)  # per-group convolutions, shifted depthwise
    # the first depthwise (256 outputs) large enough to stay shifted
    m2 = fbjax.load(src, tiered_compile=True, kernel_options=SMALL.replace(quick_shifted_min_output=200))
    ex2 = m2.executor
    assert grouped(str(ex2.quick.trace(*ex2.args(m2.params), spec).jaxpr)) == [2, 4]

    ref = fbjax.reference.run(src, x)[0]
    bound = (gamma(n_sum) + gamma(5)) * abs_magnitude(m, x)
    assert_within(m(x), ref, bound, "quick tier")
    call = ex._cached_call
    assert isinstance(call, executors.TieredCall) and call.quick is ex.quick
    assert call.wait(timeout=120) == "optimised"
    assert ex.exported is not None  # exported in the background, for the next process
    assert_within(m(x), ref, bound, "optimised tier")


def test_kernels_option_is_checked():
    from fbjax import loading
    from fbjax.lower.build import build
    ir = loading.read(single_op_model("ADD", [(2, 3), (2, 3)]))
    assert build(ir, backend="cpu", options={"kernels": "quick"}).kernel_backend == "cpu_quick"
    assert build(ir, backend="gpu", options={"kernels": "quick"}).kernel_backend == "gpu"  # plain there anyway
    assert build(ir, backend="cpu").kernel_backend == "cpu"
    with pytest.raises(ValueError, match="kernels='fast'"):
        build(ir, backend="cpu", options={"kernels": "fast"})


def test_other_signature_falls_back_to_the_jit(tiering):
    m = fbjax.load(single_op_model("ADD", [(1, 3), (1, 3)]), batch_size=None,  # any batch
                   tiered_compile=True, kernel_options=SMALL)
    a = np.ones((2, 3), F32)
    np.testing.assert_array_equal(np.asarray(m(a, a)), 2 * a)  # exact: 1 + 1
    b = np.full((5, 3), 0.5, F32)
    np.testing.assert_array_equal(np.asarray(m(b, b)), 2 * b)  # another batch: the plain jit traces it


def test_when_tiering_applies():
    # the quick tier keeps YNNPACK fusion off (it miscompiles grouped-convolution chains) whatever XLA_FLAGS says
    assert tiered.quick_options() == dict(tiered.QUICK_XLA_OPTIONS, xla_cpu_experimental_ynn_fusion_type="")
    m = fbjax.load(single_op_model("ADD", [(2, 3), (2, 3)]), tiered_compile=True)
    assert m.program.backend == "cpu"
    assert not tiered.worth_tiering(m.program, True)  # one node: compiles fast, keeps the jit's faster dispatch
    assert not isinstance(m.executor.jitted_leaves, executors.TieredCall)
    m = fbjax.load(single_op_model("ADD", [(2, 3), (2, 3)]), tiered_compile=True, kernel_options=SMALL)
    assert tiered.worth_tiering(m.program, True)
    assert not tiered.worth_tiering(m.program, False)  # the option off (the default)
    assert not tiered.worth_tiering(dataclasses.replace(m.program, backend="gpu"), True)  # CPU only
    assert not isinstance(fbjax.load(single_op_model("ADD", [(2, 3), (2, 3)])).executor.jitted_leaves,
                          executors.TieredCall)
    assert isinstance(fbjax.load(single_op_model("ADD", [(2, 3), (2, 3)]), tiered_compile=True, kernel_options=SMALL)
                      .executor.jitted_leaves, executors.TieredCall)


def test_tiered_compile_option_is_checked_and_keys_the_trace_cache():
    from fbjax.options import ENV, ENV_FLAGS, LoadOptions, env_flag
    assert ENV_FLAGS["FBJAX_TIERED_COMPILE"][0] is False  # off unless the environment says so
    assert LoadOptions().tiered_compile is ENV["FBJAX_TIERED_COMPILE"]
    assert LoadOptions(tiered_compile=True, kernel_options=SMALL).tiered_compile is True
    with pytest.raises(fbjax.InputError, match="tiered_compile"):
        LoadOptions(tiered_compile="yes")
    # part of the options every cache key is made of
    assert LoadOptions(tiered_compile=True).cache_key() != LoadOptions().cache_key()
    for v, want in [("1", True), ("yes", True), ("on", True), ("0", False), ("false", False), (" No ", False),
                    ("off", False), ("", False)]:
        assert env_flag("X", default=not want, environ={"X": v}) is want, v
    assert env_flag("X", default=True, environ={}) is True


_CHILD = """
import json, sys
import numpy as np
import fbjax
from fbjax.executors import tiered, trace_cache
from fbjax.formats.tflite_builder import single_op_model
rng = np.random.default_rng(0)
w = rng.standard_normal((8, 3, 3, 4)).astype(np.float32)
b = rng.standard_normal(8).astype(np.float32)
m = fbjax.load(single_op_model("CONV_2D", [(1, 6, 6, 4), w, b], options=dict(padding="SAME", stride_h=1,
               stride_w=1), output_shapes=[(1, 6, 6, 8)]), tiered_compile=True,
               kernel_options=fbjax.KernelOptions(tiered_min_nodes=1))
x = np.ones((1, 6, 6, 4), np.float32)
m(x)
call = m.executor._cached_call
tier = call.tier if isinstance(call, tiered.TieredCall) else "plain"
if isinstance(call, tiered.TieredCall):
    call.wait(120)
print(json.dumps({"executor": m.executor.name, "tier": tier}))
"""


def test_second_process_compiles_the_optimised_program_directly(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("FBJAX_NO_CACHE", "JAX_COMPILATION_CACHE_DIR")}
    env.update(FBJAX_CACHE_DIR=str(tmp_path / "c" / "jax"), PYTHONPATH=str(ROOT))
    recs = []
    for _ in range(2):
        p = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
        recs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    assert recs[0]["executor"] == "trace_cache"
    assert recs[0]["tier"] in ("quick", "optimised")  # tiered: nothing cached yet
    assert recs[1]["tier"] == "plain"  # the first process marked the optimised executable as cached
    assert list((tmp_path / "c" / "traces").glob("*.optimised"))


@pytest.mark.parametrize("called_before", [False, True])
def test_infer_runs_its_steps_on_the_optimised_program(tiering, called_before):
    """fbjax.infer's steps run the optimised program: on a model not called
    yet its first step compiles it directly (no quick tier, no background
    thread); on a model whose first call compiled the quick tier, the steps
    after the first wait for it. Either way calls run it when infer returns,
    and each example is within the float32 bound of the float64 convolution."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((8, 3, 3, 4)).astype(F32)
    b = rng.standard_normal(8).astype(F32)
    m = fbjax.load(_conv(w, b), batch_size=None, tiered_compile=True, kernel_options=SMALL)
    xs = rng.standard_normal((5, 6, 6, 4)).astype(F32)
    if called_before:
        m(xs[:1])
    got = np.asarray(fbjax.infer(m, xs, step_size=1, progress=False))
    ex = m.executor
    call = ex._cached_call if ex.name == "trace_cache" else getattr(ex, "call", None)
    assert isinstance(call, executors.TieredCall) and call.tier == "optimised", (ex.name, call)
    assert (call.thread is not None) == called_before  # the quick tier's background compile, only then
    for i in range(len(xs)):
        ref, mag = _conv_ref(xs[i:i + 1], w, b)
        assert_within(got[i:i + 1], ref, gamma(37) * mag, f"example {i}")


def test_another_signature_goes_to_the_plain_jit_without_trying_the_tier():
    """Issue 28 item 6: a TieredCall whose first call had one signature runs
    calls of another on the plain jit directly; asking the compiled tier
    first cost ~1.3 ms per call in a raised and caught TypeError (a
    batch-polymorphic model called at batch 1, then by fbjax.infer at batch
    2: iris landmark at 0.8x its loop). The first signature still runs the
    tier."""
    from fbjax.executors.tiered import TieredCall

    call = TieredCall(jax.jit(lambda w, x: x * w[0]))
    w = (np.float32(2.0),)
    one, two = np.ones((1, 3), np.float32), np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(call(w, one), 2 * one)
    call.wait()
    tried = []
    compiled = call._compiled

    def counting(*args):
        tried.append(np.shape(args[-1]))
        return compiled(*args)

    call._compiled = counting
    np.testing.assert_array_equal(call(w, two), 2 * two)
    np.testing.assert_array_equal(call(w, one), 2 * one)
    assert tried == [(1, 3)]  # the batch-2 call never asked the tier's executable
