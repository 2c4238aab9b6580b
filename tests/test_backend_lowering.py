"""Lowering choices follow the backend the program is built for (issue 19 item 2).

On CPU fbjax lowers depthwise convolutions as shifted multiply-adds, small
first-layer convolutions as sums over kernel taps, other grouped
convolutions per group (or as one batched matrix product when 1x1), small
pools as shifted slices; ``Model.__call__`` runs the prepared inference
program and large batches in chunks. On every other backend the plain
``jax.lax`` lowering is used. Here each program is built for "gpu"/"tpu"
on the CPU (``build(ir, backend=...)``), checked to be the plain lowering,
and run on the CPU against the CPU lowering.

Tolerance: both programs compute the same sums in float32 in another order;
each op's result then differs by at most about ``K * 2**-24`` relative
(``K`` the longest accumulation), as a random walk ``sqrt(K) * 2**-24``;
over ``depth`` ops ``4 * 2**-24 * sqrt(K * depth)`` (as
:func:`fbjax.precision.error_bound` for rounding), relative to the output's
largest magnitude.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import jax
import numpy as np
import pytest

import fbjax
from fbjax.formats import tflite_builder
from fbjax.cache import compiler_options
from fbjax.loading import read
from fbjax.lower.build import build
from fbjax.executors.planner import plan, worth_preparing
from fbjax.executors.chunked import select_chunks

DATA = Path(__file__).parent / "data"
BUILTINS = DATA / "tflite_builtins"
SHARED = Path(__file__).resolve().parents[2] / "shared" / "models" / "tflite"
EPS32 = 2.0 ** -24


def _grouped_conv_model(c_in, groups, k, c_out=8):
    """A CONV_2D with ``groups`` groups (weights ``[O, k, k, C_in/groups]``)."""
    w = np.random.default_rng(3).standard_normal((c_out, k, k, c_in // groups)).astype(np.float32)
    b = np.random.default_rng(4).standard_normal((c_out,)).astype(np.float32)
    return tflite_builder.single_op_model("CONV_2D", [(1, 9, 9, c_in), w, b], {"padding": "SAME", "stride_w": 1, "stride_h": 1},
                                   output_shapes=[(1, 9, 9, c_out)])


CASES = {
    "depthwise": BUILTINS / "depthwise_conv_2d.tflite",
    "small_conv": BUILTINS / "conv_2d.tflite",
    "transpose_conv": BUILTINS / "transpose_conv_same.tflite",
    "grouped_3x3": lambda: _grouped_conv_model(8, 2, 3),
    "grouped_1x1": lambda: _grouped_conv_model(8, 4, 1),
}


def _source(case):
    src = CASES[case]
    return src() if callable(src) else str(src)


def _run(prog, xs):
    outs, _ = jax.jit(prog.apply, compiler_options=compiler_options("cpu"))(prog.params, None, *xs)
    return [np.asarray(o) for o in outs]


def _check_same(a, b, k, depth, what):
    tol = 4 * EPS32 * math.sqrt(k * depth)
    for u, v in zip(a, b):
        scale = float(np.max(np.abs(v))) or 1.0
        err = float(np.max(np.abs(u.astype(np.float64) - v)))
        assert err <= tol * scale, f"{what}: max err {err:.3g} > {tol:.3g} * {scale:.3g}"


def _convs(jaxpr_text):
    return [int(g) for g in re.findall(r"feature_group_count=(\d+)", jaxpr_text)]


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("backend", ["gpu", "tpu"])
def test_accelerator_lowering_is_plain_lax_and_agrees_with_cpu(case, backend):
    src = _source(case)
    ir_cpu, ir_acc = read(src), read(src)
    cpu, acc = build(ir_cpu, backend="cpu"), build(ir_acc, backend=backend)
    g = ir_cpu.main_graph
    xs = [np.random.default_rng(0).standard_normal(v.shape).astype(np.float32) for v in g.inputs]
    convs_cpu = _convs(str(jax.make_jaxpr(cpu.apply)(cpu.params, None, *xs)))
    convs_acc = _convs(str(jax.make_jaxpr(acc.apply)(acc.params, None, *xs)))
    n_conv = sum(1 for n in g.nodes if "CONV" in n.op_name)
    # accelerator: one lax convolution per conv node, grouped ones as XLA's grouped convolution
    assert len(convs_acc) == n_conv, (case, convs_acc)
    if case in ("depthwise", "grouped_3x3", "grouped_1x1"):
        assert max(convs_acc) > 1 and (not convs_cpu or max(convs_cpu) == 1), (convs_acc, convs_cpu)
    if case in ("depthwise", "small_conv", "grouped_1x1"):
        assert not convs_cpu, f"{case}: the CPU lowering should avoid lax.conv here"  # shifted / taps / dot
    # nothing CPU-specific is prepared for the accelerator program
    assert plan(acc) == ({}, {}) and not worth_preparing(acc)
    k = max(int(np.prod(v.shape[1:])) for n in g.nodes for v in n.inputs[1:2] if v is not None and v.data is not None)
    _check_same(_run(acc, xs), _run(cpu, xs), k, len(g.nodes), f"{case} {backend} vs cpu")


def test_chunked_batches_are_cpu_only():
    """The chunked executor (``fbjax.executors.chunked.select_chunks``) leaves a
    model built for another backend alone (its batch runs as one XLA call);
    on CPU it splits the same batch."""
    path = str(BUILTINS / "conv_2d.tflite")
    m_cpu = fbjax.load(path, batch_size=8)
    make = lambda k: fbjax.load(path, batch_size=k)  # noqa: E731
    assert select_chunks(m_cpu.program, m_cpu.inputs, m_cpu.outputs, make, 8, budget=1) is not None  # chunked on CPU
    m_gpu = fbjax.load(path, batch_size=8)
    m_gpu.program.backend = "gpu"
    assert select_chunks(m_gpu.program, m_gpu.inputs, m_gpu.outputs, make, 8, budget=1) is None


SHARED_MODEL = SHARED / "mediapipe_face_detection_short_range.tflite"


@pytest.mark.skipif(not SHARED_MODEL.exists(), reason="../shared/models/tflite is absent")
@pytest.mark.slow
def test_shared_model_accelerator_lowering_agrees_with_cpu():
    """A whole MediaPipe detector (depthwise, 3-channel first conv, pools):
    the plain lax program equals the CPU program within summation order."""
    ir_cpu, ir_acc = read(str(SHARED_MODEL)), read(str(SHARED_MODEL))
    cpu, acc = build(ir_cpu, backend="cpu"), build(ir_acc, backend="gpu")
    xs = [np.random.default_rng(0).random(v.shape, dtype=np.float32) for v in ir_cpu.main_graph.inputs]
    k = max(int(np.prod(v.shape[1:])) for n in ir_cpu.main_graph.nodes for v in n.inputs[1:2]
            if v is not None and v.data is not None)
    _check_same(_run(acc, xs), _run(cpu, xs), k, len(ir_cpu.main_graph.nodes), "short_range gpu vs cpu")
