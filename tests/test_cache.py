"""fbjax/cache.py: JAX's persistent compilation cache switched on by fbjax.load."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest

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


def test_enable_force_in_process(tmp_path):
    old = (jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs,
           jax.config.jax_persistent_cache_min_entry_size_bytes)
    try:
        assert cache.enable(str(tmp_path / "f"), force=True) == str(tmp_path / "f")
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "f")
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 0
    finally:
        jax.config.update("jax_compilation_cache_dir", old[0])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", old[1])
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", old[2])


def test_compiler_options(monkeypatch):
    monkeypatch.delenv("FBJAX_XLA_DEFAULTS", raising=False)
    monkeypatch.setenv("XLA_FLAGS", "")
    assert cache.compiler_options("cpu") == {"xla_cpu_experimental_ynn_fusion_type": ""}
    assert cache.compiler_options("gpu") is None
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT")
    assert cache.compiler_options("cpu") is None  # the user's flag wins
    monkeypatch.setenv("XLA_FLAGS", "")
    monkeypatch.setenv("FBJAX_XLA_DEFAULTS", "1")
    assert cache.compiler_options("cpu") is None


def test_compiler_options_accepted_by_xla():
    import jax.numpy as jnp
    import numpy as np

    if jax.default_backend() != "cpu":
        pytest.skip("the option is for XLA:CPU")
    opts = cache.compiler_options("cpu")
    f = jax.jit(lambda x: x @ x, compiler_options=opts)
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    np.testing.assert_allclose(np.asarray(f(jnp.asarray(x))), x @ x, rtol=1e-6)
