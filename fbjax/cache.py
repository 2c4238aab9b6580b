"""Compilation settings fbjax applies: JAX's persistent compilation cache,
switched on by :func:`fbjax.load`, and the XLA:CPU options of the Model's jit
(:func:`compiler_options`).

Compiling a model (XLA:CPU, a few hundred ops) takes a second or more; the
compiled executable depends only on the traced program, so a second process
loading the same model can read it from disk instead. :func:`enable` points
JAX's persistent compilation cache at a user cache directory the first time a
model is loaded, unless the user decided otherwise:

* ``FBJAX_NO_CACHE=1`` (read once, at import, by
  :func:`fbjax.options.env_flag`'s rule): fbjax leaves JAX's configuration
  alone;
* a cache directory already configured for JAX (``jax.config.update(
  "jax_compilation_cache_dir", ...)`` or ``JAX_COMPILATION_CACHE_DIR``) is
  kept as it is, thresholds included;
* otherwise the directory is ``$FBJAX_CACHE_DIR``, else
  ``$XDG_CACHE_HOME/fbjax/jax`` (``~/.cache/fbjax/jax``), and the minimum
  compile time for an entry to be written is lowered to 0 s (JAX's default,
  1 s, would skip small models).

Weights are jit arguments (:mod:`fbjax.lower.build`), not constants, so cache
entries hold code, not the model's weights, and stay small.

Next to it, in ``<cache dir>/../traces``, fbjax keeps the *traced* program
(a serialized ``jax.export.Exported``: StableHLO bytecode, no Python
objects) of a model's prepared CPU program (:class:`fbjax.executors.trace_cache.TraceCached`), so a
second process skips tracing and lowering the graph too (about 0.6 s of a
0.9 s warm first call on the shared MediaPipe models). Its key
(:func:`trace_key`) covers the model file's bytes, the ``fbjax.load``
options (:meth:`fbjax.options.LoadOptions.cache_key`, the
:class:`~fbjax.options.KernelOptions` included: no module-level setting
changes a program), fbjax's own source code, the jax/jaxlib versions, the
backend and XLA options and the argument shapes and dtypes; models with user-registered (custom)
lowerings are never cached this way. Only used when fbjax chose the cache
directory (not under ``FBJAX_NO_CACHE`` or a user's own JAX cache setting).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from typing import Optional

import jax

from .lower import cpu_kernels
from .options import ENV, default_cache_dir

__all__ = ["enable", "default_cache_dir", "export_program", "cache_dir", "compiler_options", "trace_cache_dir", "trace_key",
           "load_exported", "save_exported", "checked_marked", "mark_checked", "lapack_init_skipped", "NO_YNN_FUSION"]

_state = {"done": False, "dir": None}


def _disabled() -> bool:
    return ENV["FBJAX_NO_CACHE"]


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


#: XLA option fbjax sets per jit on CPU (see :func:`compiler_options`), and
#: always for the CPU quick tier (:func:`fbjax.executors.tiered.quick_options`).
NO_YNN_FUSION = {"xla_cpu_experimental_ynn_fusion_type": ""}


def compiler_options(backend: Optional[str] = None, xla_defaults: Optional[bool] = None) -> Optional[dict]:
    """XLA compile options for :class:`fbjax.Model`'s ``jax.jit`` (``None``: XLA's defaults).

    On the CPU backend fbjax turns off XLA's YNNPACK library fusion
    (``xla_cpu_experimental_ynn_fusion_type=""``) for its own jit only:
    with jaxlib 0.10.2 the fusion runs convolutions 2-10x slower than XLA's
    own emitters on the shared models (1x1 convolutions at batch 32 ~10x;
    batch-1 latency of mediapipe_face_detection_short_range ~2x) and it
    miscompiles chains of grouped convolutions under ``jit``
    (``KernelOptions.depthwise_strategy``). Measured and checked
    against LiteRT on every shared model with ``benchmarks/run.py``.

    Left to XLA when ``XLA_FLAGS`` already names ``ynn_fusion_type`` (the
    user's choice wins) or ``xla_defaults`` (the model's
    ``KernelOptions.xla_defaults``; None: ``FBJAX_XLA_DEFAULTS``, read once
    at import into :data:`fbjax.options.ENV`). A ``jax.jit`` of
    ``model.apply`` written by the user gets XLA's defaults unless it passes
    ``compiler_options=fbjax.cache.compiler_options()``.
    """
    backend = backend or jax.default_backend()
    if xla_defaults is None:
        xla_defaults = ENV["FBJAX_XLA_DEFAULTS"]
    if backend != "cpu" or xla_defaults:
        return None
    if "ynn_fusion_type" in os.environ.get("XLA_FLAGS", ""):
        return None
    return dict(NO_YNN_FUSION)


# --- traced programs ---------------------------------------------------------------

def trace_cache_dir() -> Optional[str]:
    """``<fbjax's cache dir>/../traces`` when fbjax configured JAX's cache
    in this process (see :func:`enable`), else ``None`` (no trace cache)."""
    d = _state["dir"]
    if not d or cache_dir() != d:
        return None
    return os.path.join(os.path.dirname(os.path.abspath(d)), "traces")


_code: dict = {}


def _code_fingerprint() -> str:
    """Digest of fbjax's own ``.py`` files and the jax/jaxlib versions (once per process)."""
    if "v" not in _code:
        import jaxlib

        h = hashlib.blake2b(digest_size=20)
        h.update(f"jax {jax.__version__} jaxlib {getattr(jaxlib, '__version__', '?')}".encode())
        root = os.path.dirname(os.path.abspath(__file__))
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                if name.endswith(".py"):
                    path = os.path.join(dirpath, name)
                    h.update(os.path.relpath(path, root).encode())
                    with open(path, "rb") as f:
                        h.update(f.read())
        _code["v"] = h.hexdigest()
    return _code["v"]


def source_digest(source) -> Optional[str]:
    """blake2b of a model's bytes (a path or a bytes-like object); ``None`` if unreadable."""
    h = hashlib.blake2b(digest_size=20)
    try:
        if isinstance(source, (bytes, bytearray, memoryview)):
            h.update(source)
        else:
            with open(os.fspath(source), "rb") as f:
                for block in iter(lambda: f.read(1 << 24), b""):
                    h.update(block)
    except (OSError, TypeError):
        return None
    return h.hexdigest()


def trace_key(model_digest: str, load_options: tuple, args: tuple, extra: str = "") -> str:
    """The trace-cache key of a model's prepared CPU program: ``model_digest``
    (:func:`source_digest`), the ``fbjax.load`` options, the shapes, dtypes and
    tree structure of the jit arguments ``args``, ``extra`` (backend, compile
    options), fbjax's code and the jax versions. ``load_options`` carries every
    choice that changes the program (:meth:`fbjax.options.LoadOptions.cache_key`)."""
    leaves, tree = jax.tree_util.tree_flatten(args)
    avals = ";".join(f"{tuple(getattr(x, 'shape', ()))}:{getattr(x, 'dtype', type(x).__name__)}" for x in leaves)
    h = hashlib.blake2b(digest_size=20)
    for part in (model_digest, repr(load_options), str(tree), avals, extra, _code_fingerprint(),
                 str(bool(jax.config.jax_enable_x64))):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def export_program(fn, backend: str):
    """``jax.export.export(fn, platforms=(backend,))``, allowing the custom calls of fbjax's CPU
    kernels (:mod:`fbjax.lower.cpu_kernels`: :func:`load_exported` reads a program that calls them
    back only where they are built). Call the result with the arguments to trace."""
    from jax import export

    return export.export(fn, platforms=(backend,), disabled_checks=[
        export.DisabledSafetyCheck.custom_call(t) for t in cpu_kernels.TARGETS])


def load_exported(key: str):
    """The ``jax.export.Exported`` stored under ``key``, or ``None`` (absent,
    unreadable or from another JAX: the caller traces again)."""
    d = trace_cache_dir()
    if d is None:
        return None
    path = os.path.join(d, key + ".exported")
    try:
        with open(path, "rb") as f:
            data = f.read()
        from jax import export

        # a program that calls fbjax's CPU kernels runs only where they are registered (built here)
        if any(t.encode() in data for t in cpu_kernels.TARGETS) and not cpu_kernels.available():
            return None
        return export.deserialize(bytearray(data))
    except FileNotFoundError:
        return None
    except Exception:  # noqa: BLE001 - a damaged entry is a cache miss; drop it
        try:
            os.remove(path)
        except OSError:
            pass
        return None


@contextlib.contextmanager
def lapack_init_skipped(exported):
    """Context manager: while active, lowering a call to ``exported`` skips
    JAX's CPU LAPACK set-up when the module has no LAPACK custom call.

    JAX's lowering of ``Exported.call`` initializes the CPU LAPACK kernels
    (``jax._src.export._export._ensure_backends_initialized``), which imports
    ``scipy.linalg``: 0.1-0.5 s of a warm first call on this project's 2-core
    machines, for models that never use it. Modules that reference
    ``lapack_*`` targets (StableHLO linear algebra) keep the set-up (so does
    any module whose source locations contain the word). Does nothing when
    JAX's internals are not as expected.
    """
    ex = None
    try:
        from jax._src.export import _export as ex

        skip = callable(getattr(ex, "_ensure_backends_initialized", None)) and \
            b"lapack" not in bytes(exported.mlir_module_serialized)
    except Exception:  # noqa: BLE001 - another JAX: keep its behaviour
        skip = False
    if not skip:
        yield
        return
    orig = ex._ensure_backends_initialized
    ex._ensure_backends_initialized = lambda platforms: None
    try:
        yield
    finally:
        ex._ensure_backends_initialized = orig


def checked_marked(key: str) -> bool:
    """Whether an earlier process recorded (:func:`mark_checked`) that the
    load-time checks keyed ``key`` (:func:`trace_key`) passed: a file fbjax
    traced before without error, under the same options and code."""
    d = trace_cache_dir()
    return d is not None and os.path.exists(os.path.join(d, key + ".checked"))


def mark_checked(key: str) -> None:
    """Record that the load-time checks keyed ``key`` passed (errors are
    ignored: without the marker the next process checks again)."""
    d = trace_cache_dir()
    if d is None:
        return
    try:
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, key + ".checked"), "wb"):
            pass
    except OSError:
        pass


def save_exported(key: str, exported) -> None:
    """Store ``exported`` under ``key`` (atomically; errors are ignored: the cache is optional)."""
    d = trace_cache_dir()
    if d is None:
        return
    try:
        os.makedirs(d, exist_ok=True)
        tmp = os.path.join(d, f".{key}.{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            f.write(exported.serialize())
        os.replace(tmp, os.path.join(d, key + ".exported"))
    except Exception:  # noqa: BLE001 - unwritable directory, serialization limits: run without
        pass
