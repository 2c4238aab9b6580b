"""One executor per Model, chosen at load (:mod:`fbjax.executors`, issue 16).

The oracle for each kind is what the kind is for: a model with run state
gets the stateful executor, a tiny model the plain jit, a convolution whose
weight can be relaid on CPU the prepared program, a fixed batch whose
activations exceed the chunk budget the chunked executor. Results are not
compared here (tests/test_inference.py and tests/test_call_overhead.py do,
per kind); these tests check the choice, that it does not change after
calls, and that the state lives in the run, not on the program.
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest

import fbjax
from fbjax import executors
from fbjax.formats.tflite_builder import single_op_model

F32 = np.float32
CONTROL = Path(__file__).parent / "data" / "tflite_builtins"


def _conv_bytes():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 3, 3, 4)).astype(F32)
    b = rng.standard_normal(8).astype(F32)
    return single_op_model("CONV_2D", [(1, 6, 6, 4), w, b], options=dict(padding="SAME", stride_h=1, stride_w=1),
                           output_shapes=[(1, 6, 6, 8)])


def test_tiny_model_runs_the_plain_jit_and_keeps_it():
    m = fbjax.load(single_op_model("ADD", [(2, 3), (2, 3)]))
    ex = m.executor
    assert ex.name == "jit" and isinstance(ex, executors.Jit) and not ex.stateful
    a = np.ones((2, 3), F32)
    np.testing.assert_array_equal(m(a, a), 2 * a)  # 1 + 1 is exact
    assert m.executor is ex  # chosen once


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the prepared program is for XLA:CPU")
def test_relayable_conv_runs_the_prepared_program_on_cpu():
    m = fbjax.load(_conv_bytes())
    assert m.executor.name in ("cpu_prepared", "trace_cache")
    assert isinstance(m.executor, executors.CpuPrepared) and list(m.executor.layouts) == ["const1"]
    m(np.zeros((1, 6, 6, 4), F32))
    assert isinstance(m.executor, executors.CpuPrepared)


def _fixture(name: str) -> Path:
    """A committed fixture in :data:`CONTROL`: the test fails, not
    skips, when it is missing."""
    path = CONTROL / name
    assert path.is_file(), f"committed fixture {path} missing"
    return path


def test_model_with_variables_runs_the_stateful_executor_and_state_stays_in_the_run():
    m = fbjax.load(_fixture("resource_variables.tflite"))
    assert m.executor.name == "stateful" and m.executor.stateful and m.state
    before = {k: np.asarray(v) for k, v in m.state.items()}
    m(np.ones((2, 3), F32))
    assert any(not np.array_equal(before[k], np.asarray(m.state[k])) for k in before)  # the variables moved
    # the program carries no run state of its own: Program.apply threads it
    assert not {"_state", "_state_ready", "_var_names"} & set(vars(m.program))
    outs, new = m.program.apply(m.params, before, np.ones((2, 3), F32))
    assert set(new) == set(before) and len(outs) == len(m.outputs)


def test_program_apply_without_state_refuses_stateful_ops():
    m = fbjax.load(_fixture("resource_variables.tflite"))
    with pytest.raises(fbjax.ModelFormatError, match="resource variables"):
        m.program.apply(m.params, None, np.ones((2, 3), F32))


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="chunks are for XLA:CPU")
def test_fixed_large_batch_runs_in_chunks():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((4, 3, 3, 4)).astype(F32)
    data = single_op_model("CONV_2D", [(1, 6, 6, 4), w, None], options=dict(padding="SAME", stride_h=1, stride_w=1),
                           output_shapes=[(1, 6, 6, 4)])
    assert fbjax.load(data, batch_size=4).executor.name != "chunked"  # 4 tiny images fit in the default budget
    two_images = fbjax.KernelOptions(chunk_bytes=2 * 2 * 6 * 6 * 4 * 4)  # two images' in + out
    m = fbjax.load(data, batch_size=4, kernel_options=two_images)
    assert m.executor.name == "chunked" and m.executor.k == 2 and m.executor.batch == 4
