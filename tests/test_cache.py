"""fbjax/cache.py: JAX's persistent compilation cache switched on by fbjax.load."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest

import fbjax
import fbjax.options
from fbjax import cache

ROOT = Path(__file__).resolve().parents[1]

_CHILD = """
import sys, numpy as np, fbjax, fbjax.cache
m = fbjax.load(sys.argv[1])
m(np.zeros((1, 1), np.float32))
print(fbjax.cache.cache_dir())
"""


def _child(model, **env):
    e = {k: v for k, v in os.environ.items()
         if k not in ("FBJAX_NO_CACHE", "FBJAX_CACHE_DIR", "JAX_COMPILATION_CACHE_DIR")}
    e.update(env, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", _CHILD, model], env=e, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def sine(shared_models_dir):
    return str(shared_models_dir / "tflm_sine_float.tflite")


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.delenv("FBJAX_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache.default_cache_dir() == str(tmp_path / "fbjax" / "jax")
    monkeypatch.setenv("FBJAX_CACHE_DIR", str(tmp_path / "x"))
    assert cache.default_cache_dir() == str(tmp_path / "x")


def test_load_fills_cache_dir(sine, tmp_path):
    d = tmp_path / "c"
    assert _child(sine, FBJAX_CACHE_DIR=str(d)) == str(d)
    assert any(d.iterdir()), "compiled executables should be written (min compile time lowered to 0)"


def test_opt_out(sine, tmp_path):
    d = tmp_path / "c"
    assert _child(sine, FBJAX_CACHE_DIR=str(d), FBJAX_NO_CACHE="1") == "None"
    assert not d.exists()


def test_user_setting_wins(sine, tmp_path):
    mine, theirs = tmp_path / "fbjax", tmp_path / "user"
    assert _child(sine, FBJAX_CACHE_DIR=str(mine), JAX_COMPILATION_CACHE_DIR=str(theirs)) == str(theirs)
    assert not mine.exists()


def test_enable_force_in_process(tmp_path, monkeypatch):
    old = (jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs,
           jax.config.jax_persistent_cache_min_entry_size_bytes)
    # fbjax's record of the directory it set, restored too: with only JAX's setting put back, the
    # trace cache (cache.trace_cache_dir) stayed off for every later test in the process
    monkeypatch.setitem(cache._state, "dir", cache._state["dir"])
    monkeypatch.setitem(cache._state, "done", cache._state["done"])
    try:
        assert cache.enable(str(tmp_path / "f"), force=True) == str(tmp_path / "f")
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "f")
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 0
    finally:
        jax.config.update("jax_compilation_cache_dir", old[0])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", old[1])
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", old[2])


def test_compiler_options(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "")
    assert cache.compiler_options("cpu", False) == {"xla_cpu_experimental_ynn_fusion_type": ""}
    assert cache.compiler_options("gpu", False) is None
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT")
    assert cache.compiler_options("cpu", False) is None  # the user's flag wins
    monkeypatch.setenv("XLA_FLAGS", "")
    assert cache.compiler_options("cpu", True) is None  # KernelOptions(xla_defaults=True)
    # FBJAX_XLA_DEFAULTS is the option's default, read once at import (options.ENV)
    monkeypatch.setitem(fbjax.options.ENV, "FBJAX_XLA_DEFAULTS", True)
    assert cache.compiler_options("cpu") is None and fbjax.KernelOptions().xla_defaults is True
    monkeypatch.setitem(fbjax.options.ENV, "FBJAX_XLA_DEFAULTS", False)
    assert cache.compiler_options("cpu") == {"xla_cpu_experimental_ynn_fusion_type": ""}


def test_compiler_options_accepted_by_xla():
    import jax.numpy as jnp
    import numpy as np

    if jax.default_backend() != "cpu":
        pytest.skip("the option is for XLA:CPU")
    opts = cache.compiler_options("cpu")
    f = jax.jit(lambda x: x @ x, compiler_options=opts)
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    # integers below 2**24 throughout (products <= 225, sums <= 900): exact in any summation order
    np.testing.assert_array_equal(np.asarray(f(jnp.asarray(x))), x @ x)


# --- traced programs (fbjax.cache.trace_cache_dir) -------------------------------

_TRACE_CHILD = """
import sys, json, jax, numpy as np, fbjax, fbjax.cache
from fbjax.bench import _inputs
m = fbjax.load(sys.argv[1])
xs = _inputs(m.inputs)
y = m(*xs)
scipy_linalg = "scipy.linalg" in sys.modules  # JAX's LAPACK set-up imports it
ref = jax.jit(m.apply, compiler_options=fbjax.cache.compiler_options(m.program.backend))(m.params, *xs)  # the plain jit of Model.apply
ys, rs = (y, ref) if isinstance(y, tuple) else ((y,), (ref,))
fast = m.executor
print(json.dumps({"diff": max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(ys, rs)),
                  "cached": fast.name == "trace_cache" and fast.runs_exported, "scipy_linalg": scipy_linalg,
                  "traces": fbjax.cache.trace_cache_dir()}))
"""


def _trace_child(model, **env):
    import json

    e = {k: v for k, v in os.environ.items()
         if k not in ("FBJAX_NO_CACHE", "FBJAX_CACHE_DIR", "JAX_COMPILATION_CACHE_DIR")}
    e.update(env, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # one compiled program (no quick first tier: tiered_compile is off by default), so "diff" compares
    # identical programs
    e.pop("FBJAX_TIERED_COMPILE", None)
    p = subprocess.run([sys.executable, "-c", _TRACE_CHILD, model], env=e, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def _first_trace(shared_models_dir, tmp_path):
    """(model path, cache dir, record) of a first process that traced
    mediapipe_face_detection_short_range into an empty cache (CPU only)."""
    if jax.default_backend() != "cpu":
        pytest.skip("the prepared program (and its trace cache) is CPU-only")
    model = str(shared_models_dir / "mediapipe_face_detection_short_range.tflite")
    d = tmp_path / "c" / "jax"
    return model, d, _trace_child(model, FBJAX_CACHE_DIR=str(d))


def test_trace_cache_reused_across_processes(shared_models_dir, tmp_path):
    """The second process runs the stored Exported program; results equal the plain jit exactly."""
    model, d, first = _first_trace(shared_models_dir, tmp_path)
    traces = Path(first["traces"])
    entries = list(traces.glob("*.exported"))
    assert len(entries) == 1, "the first process should store its traced program"
    stamp = entries[0].stat().st_mtime_ns
    second = _trace_child(model, FBJAX_CACHE_DIR=str(d))
    assert first["cached"] and second["cached"]
    assert first["diff"] == 0.0 and second["diff"] == 0.0
    assert entries[0].stat().st_mtime_ns == stamp, "a hit must not rewrite the entry"
    assert len(list(traces.glob("*.exported"))) == 1
    assert not second["scipy_linalg"], "a model without linear algebra should not pay JAX's LAPACK set-up"


def test_linalg_setup_skipped_only_when_unused():
    """cache.lapack_init_skipped replaces JAX's LAPACK set-up for programs
    without LAPACK custom calls only; a program that solves a linear system
    keeps it and still runs (its result checked against numpy). (The name
    avoids the word the check looks for: source locations are in the
    module.)"""
    import jax.numpy as jnp
    import numpy as np
    from jax import export
    from jax._src.export import _export as ex

    orig = ex._ensure_backends_initialized
    f32 = jax.ShapeDtypeStruct
    plain = export.export(jax.jit(lambda a: jnp.sin(a) @ a), platforms=["cpu"])(f32((3, 3), jnp.float32))
    solve = export.export(jax.jit(jnp.linalg.solve), platforms=["cpu"])(f32((3, 3), jnp.float32),
                                                                        f32((3,), jnp.float32))
    with cache.lapack_init_skipped(plain):
        assert ex._ensure_backends_initialized is not orig
    assert ex._ensure_backends_initialized is orig
    a = np.array([[4, 1, 0], [1, 3, 1], [0, 1, 2]], np.float32)
    b = np.array([1, 2, 3], np.float32)
    with cache.lapack_init_skipped(solve):
        assert ex._ensure_backends_initialized is orig
        x = np.asarray(jax.jit(solve.call)(a, b))
    np.testing.assert_allclose(x, np.linalg.solve(a.astype(np.float64), b), rtol=1e-5)


def test_trace_cache_damaged_entry_is_a_miss(shared_models_dir, tmp_path):
    model, d, first = _first_trace(shared_models_dir, tmp_path)
    (entry,) = Path(first["traces"]).glob("*.exported")
    entry.write_bytes(b"not an exported program")
    again = _trace_child(model, FBJAX_CACHE_DIR=str(d))
    assert again["diff"] == 0.0 and again["cached"]
    assert entry.read_bytes() != b"not an exported program", "the damaged entry is replaced"


def test_trace_key_depends_on_model_options_and_shapes():
    import numpy as np

    args = ({"w": np.zeros((3, 3), np.float32)}, np.zeros((1, 4), np.float32))
    k = cache.trace_key("m", ("tflite", 1), args)
    assert k == cache.trace_key("m", ("tflite", 1), args)
    assert k != cache.trace_key("other model", ("tflite", 1), args)
    assert k != cache.trace_key("m", ("tflite", 2), args)
    assert k != cache.trace_key("m", ("tflite", 1), ({"w": np.zeros((3, 4), np.float32)}, args[1]))
    assert k != cache.trace_key("m", ("tflite", 1), (args[0], np.zeros((1, 4), np.float16)))


def test_no_trace_cache_without_fbjax_cache_dir(shared_models_dir, tmp_path):
    model = str(shared_models_dir / "mediapipe_face_detection_short_range.tflite")
    out = _trace_child(model, FBJAX_CACHE_DIR=str(tmp_path / "c"), FBJAX_NO_CACHE="1")
    assert out["traces"] is None and not out["cached"] and out["diff"] == 0.0


def test_trace_key_follows_kernel_options():
    """A program traced under one kernel option is not reused under another:
    the options are part of the load options every trace key hashes, field
    by field (no module-level setting is read)."""
    import numpy as np

    from fbjax.options import KernelOptions, LoadOptions

    args = (np.zeros((1, 4), np.float32),)
    keys = {cache.trace_key("m", LoadOptions(kernel_options=KernelOptions(**kw)).cache_key(), args)
            for kw in ({}, {"depthwise_strategy": "conv"}, {"depthwise_strategy": "shifted"}, {"precision": "high"},
                       {"small_conv_taps": 0}, {"compact_backward": False}, {"chunk_bytes": 1 << 20},
                       {"xla_defaults": True}, {"conv_weight_layout": "OHWI"})}
    assert len(keys) == 9
    default = LoadOptions().cache_key()
    assert cache.trace_key("m", default, args) == cache.trace_key("m", LoadOptions().cache_key(), args)
