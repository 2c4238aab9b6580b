"""Compilation settings fbjax applies: JAX's persistent compilation cache,
switched on by :func:`fbjax.load`, and the XLA:CPU options of the Model's jit
(:func:`compiler_options`).

Compiling a model (XLA:CPU, a few hundred ops) takes a second or more; the
compiled executable depends only on the traced program, so a second process
loading the same model can read it from disk instead. :func:`enable` points
JAX's persistent compilation cache at a user cache directory the first time a
model is loaded, unless the user decided otherwise:

* ``FBJAX_NO_CACHE=1`` (any non-empty value but ``0``): fbjax leaves JAX's
  configuration alone;
* a cache directory already configured for JAX (``jax.config.update(
  "jax_compilation_cache_dir", ...)`` or ``JAX_COMPILATION_CACHE_DIR``) is
  kept as it is, thresholds included;
* otherwise the directory is ``$FBJAX_CACHE_DIR``, else
  ``$XDG_CACHE_HOME/fbjax/jax`` (``~/.cache/fbjax/jax``), and the minimum
  compile time for an entry to be written is lowered to 0 s (JAX's default,
  1 s, would skip small models).

Weights are jit arguments (:mod:`fbjax.lower.build`), not constants, so cache
entries hold code, not the model's weights, and stay small.
"""

from __future__ import annotations

import os
from typing import Optional

import jax

__all__ = ["enable", "default_cache_dir", "cache_dir", "compiler_options"]

_state = {"done": False, "dir": None}


def default_cache_dir() -> str:
    """``$FBJAX_CACHE_DIR``, else ``$XDG_CACHE_HOME/fbjax/jax``, else ``~/.cache/fbjax/jax``."""
    env = os.environ.get("FBJAX_CACHE_DIR")
    if env:
        return os.path.expanduser(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fbjax", "jax")


def _disabled() -> bool:
    v = os.environ.get("FBJAX_NO_CACHE", "")
    return v not in ("", "0")


def cache_dir() -> Optional[str]:
    """The persistent cache directory JAX uses now (``None``: no cache)."""
    return jax.config.jax_compilation_cache_dir


def enable(path: Optional[str] = None, *, force: bool = False) -> Optional[str]:
    """Turn on JAX's persistent compilation cache (see the module docstring).

    Called by :func:`fbjax.load`; does the work once per process.

    Args:
        path: cache directory; default :func:`default_cache_dir`.
        force: set ``path`` even if JAX already has a cache directory or
            ``FBJAX_NO_CACHE`` is set (for tests and tools).

    Returns:
        the directory JAX caches in, or ``None`` when caching is off.
    """
    if _state["done"] and not force:
        return cache_dir()
    _state["done"] = True
    if not force and (_disabled() or cache_dir() is not None):
        return cache_dir()
    path = path or default_cache_dir()
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return cache_dir()  # unwritable home: run without a cache
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    try:  # a process that compiled before now: let JAX re-read the setting
        from jax._src import compilation_cache as _cc

        if getattr(_cc, "_cache", None) is None:
            _cc.reset_cache()
    except (ImportError, AttributeError):  # private API moved: the setting still applies to new processes
        pass
    _state["dir"] = path
    return path


#: XLA option fbjax sets per jit on CPU (see :func:`compiler_options`).
_NO_YNN = {"xla_cpu_experimental_ynn_fusion_type": ""}


def compiler_options(backend: Optional[str] = None) -> Optional[dict]:
    """XLA compile options for :class:`fbjax.Model`'s ``jax.jit`` (``None``: XLA's defaults).

    On the CPU backend fbjax turns off XLA's YNNPACK library fusion
    (``xla_cpu_experimental_ynn_fusion_type=""``) for its own jit only:
    with jaxlib 0.10.2 the fusion runs convolutions 2-10x slower than XLA's
    own emitters on the shared models (1x1 convolutions at batch 32 ~10x;
    batch-1 latency of mediapipe_face_detection_short_range ~2x) and it
    miscompiles chains of grouped convolutions under ``jit``
    (:data:`fbjax.lower.kernels.DEPTHWISE_STRATEGY`). Measured and checked
    against LiteRT on every shared model with ``benchmarks/run.py``.

    Left to XLA when ``XLA_FLAGS`` already names ``ynn_fusion_type`` (the
    user's choice wins) or ``FBJAX_XLA_DEFAULTS=1``. A ``jax.jit`` of
    ``model.apply`` written by the user gets XLA's defaults unless it passes
    ``compiler_options=fbjax.cache.compiler_options()``.
    """
    backend = backend or jax.default_backend()
    if backend != "cpu" or os.environ.get("FBJAX_XLA_DEFAULTS", "") not in ("", "0"):
        return None
    if "ynn_fusion_type" in os.environ.get("XLA_FLAGS", ""):
        return None
    return dict(_NO_YNN)
