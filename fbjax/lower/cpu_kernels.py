"""fbjax's native CPU kernels for integer matrix products and attention (XLA FFI custom calls).

(The attention kernel, ``cpu_attention.cc`` and :func:`attention`, reads a layer scan's stacked KV
caches in place for the ``odml.scaled_dot_product_attention`` composite:
:mod:`fbjax.lower.composites`; its source states its float32 order. The rest of this text is about
the integer kernels.)

XLA:CPU (jaxlib 0.10) has no integer matrix-product kernel: an int8 x int8
-> int32 ``dot_general`` becomes an int32 dot whose operands are first
written out widened to int32 (measured: 0.3-3 GB/s of int8 weights on this
project's 2-core machine, where a float32 matrix-vector product reads
~17 GB/s). The hybrid (dynamic-range) kernels of
:mod:`fbjax.lower.tflite_int.hybrid` spend a quantized LLM's decode step in
such products, so on the CPU backend they call the kernels of
``cpu_kernels.cc`` instead: each int8 (or packed int4) weight is read once,
widened in registers and multiplied and summed in int32 (AVX2
``vpmaddwd`` where the CPU has it; for blockwise int4, AVX-512 VNNI
``vpdpbusd`` on the nibbles where the CPU has it), split over XLA's
intra-op threads. The blockwise FULLY_CONNECTED (:func:`block_fc_f32`)
also quantizes its float input rows and scales its outputs inside the
kernel, in TFLite's float32 order (the XLA ops that did it cost as much as
the products at decode size).
Integer sums are exact in any order, so the results equal the XLA
lowering's bit for bit (``tests/test_cpu_kernels.py`` checks both against
numpy).

The C++ file is compiled on first use with the machine's C++ compiler
(``$CXX``, else ``c++``/``g++``) against the installed jaxlib's FFI headers
(``jax.ffi.include_dir()``), for this CPU (``-march=native``), into
``<fbjax cache>/native/`` (next to :func:`fbjax.options.default_cache_dir`),
keyed by the source, jaxlib's version, the compiler and the CPU; later
processes load the built library. Where no compiler works, or
``KernelOptions.native_kernels`` is False, the hybrid kernels keep XLA's
own integer dot (same bits, slower): :func:`available` says which, and
:func:`tag` names the choice in trace-cache keys.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Optional

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np

from ..options import default_cache_dir

__all__ = ["available", "tag", "int8_matmul", "int8_matmul_sym", "block_matmul", "block_fc", "block_fc_f32",
           "attention", "library_path"]

SOURCE = Path(__file__).with_name("cpu_kernels.cc")
#: the C++ sources compiled into the one library (``cpu_attention.cc``: the attention composite's kernel)
SOURCES = (SOURCE, Path(__file__).with_name("cpu_attention.cc"))
#: the headers they include (part of the library's key too)
HEADERS = (Path(__file__).with_name("cpu_parallel.h"),)
#: the FFI handlers the library exports (registered for the CPU platform under these names)
TARGETS = ("fbjax_int8_matmul", "fbjax_block_matmul", "fbjax_block_fc", "fbjax_block_fc_f32",
           "fbjax_int8_matmul_at", "fbjax_block_matmul_at", "fbjax_block_fc_at", "fbjax_block_fc_f32_at",
           "fbjax_attention", "fbjax_int8_matmul_sym", "fbjax_int8_matmul_sym_at")
_FLAGS = ["-O3", "-march=native", "-std=c++17", "-ffp-contract=off", "-shared", "-fPIC", "-w"]

_lock = threading.Lock()
_state: dict = {"tried": False, "lib": None, "tag": "xla", "why": None}


def _compiler() -> Optional[str]:
    for c in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if c and shutil.which(c):
            return shutil.which(c)
    return None


def _cpu_id() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
        lines = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags"))][:2]
        return "\n".join(lines)
    except OSError:
        return platform.processor() or platform.machine()


def library_path(cxx: str) -> Path:
    """Where the library built by ``cxx`` for these sources (:data:`SOURCES`), jaxlib and CPU lives."""
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    h = hashlib.sha256()
    for part in (*(src.read_bytes() for src in SOURCES + HEADERS), jaxlib.__version__.encode(), version.encode(), _cpu_id().encode(),
                 " ".join(_FLAGS).encode()):
        h.update(part)
        h.update(b"\0")
    root = Path(os.path.dirname(os.path.abspath(default_cache_dir()))) / "native"
    return root / f"cpu_kernels-{h.hexdigest()[:20]}.so"


def _build() -> Path:
    cxx = _compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler (set $CXX, or install g++)")
    out = library_path(cxx)
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        cmd = [cxx, *_FLAGS, "-I", jax.ffi.include_dir(), *map(str, SOURCES), "-o", tmp]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {r.stderr.strip()[-2000:]}")
        os.replace(tmp, out)  # atomic: concurrent builders (test workers) each write their own tmp
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def available() -> bool:
    """True when the kernels are built and registered with XLA for the CPU
    platform (built on the first call in a process; later calls are free).
    A failed build warns once (``RuntimeWarning``, saying why) and returns
    False: the callers keep XLA's integer dot."""
    if _state["tried"]:
        return _state["lib"] is not None
    with _lock:
        if not _state["tried"]:
            try:
                path = _build()
                lib = ctypes.CDLL(str(path))
                for name in TARGETS:
                    jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, name)), platform="cpu")
                _state["lib"], _state["tag"] = lib, "native:" + path.stem.split("-")[-1]
            except Exception as e:  # noqa: BLE001 - any failure: XLA's path, said once
                _state["why"] = f"{type(e).__name__}: {e}"
                warnings.warn(f"fbjax: the native CPU integer kernels are unavailable ({_state['why']}); "
                              "quantized matrix products use XLA's integer dot (same results, slower)",
                              RuntimeWarning, stacklevel=2)
            _state["tried"] = True
    return _state["lib"] is not None


def tag() -> str:
    """``"native:<build hash>"`` when the kernels are in use in this process, else ``"xla"``: part of
    fbjax's trace-cache keys, so a traced program that calls them is only reused where they exist."""
    return _state["tag"]


def _layer_operand(layer):
    return jnp.asarray(layer, jnp.int32).reshape(())


def int8_matmul(x, w, layer=None):
    """``y[r, o] = sum_i x[r, i] * w[o, i]`` exactly in int32.

    Args:
        x: int16 ``[R, I]`` (|x| <= 32767; fbjax passes quantized inputs minus zero points, |x| <= 255).
        w: int8 ``[O, I]``; with ``layer``, stacked weights ``[L, O, I]`` of which block ``layer`` is
            read in place (a layer scan's body: :mod:`fbjax.lower.layer_slice`).
        layer: None, or an int32 scalar in ``[0, L)``.

    Returns:
        int32 ``[R, O]``. The caller keeps ``|y| < 2**31`` (255 * 128 * I for fbjax's inputs: I < 2**16).
    Only on the CPU backend, after :func:`available` returned True.
    """
    if layer is not None:
        return jax.ffi.ffi_call("fbjax_int8_matmul_at", jax.ShapeDtypeStruct((x.shape[0], w.shape[1]), jnp.int32))(
            x.astype(jnp.int16), w, _layer_operand(layer))
    r, o = x.shape[0], w.shape[0]
    return jax.ffi.ffi_call("fbjax_int8_matmul", jax.ShapeDtypeStruct((r, o), jnp.int32))(
        x.astype(jnp.int16), w)


def int8_matmul_sym(x, w, layer=None):
    """:func:`int8_matmul` for symmetric rows: ``x`` int8 ``[R, I]`` (quantized with zero point 0, |x| <=
    127), ``w`` int8 ``[O, I]`` (or stacked ``[L, O, I]`` read at block ``layer``) -> int32 ``[R, O]``.
    On a CPU with AVX-512 VNNI, ``vpdpbusd`` (64 products an instruction, the weights offset by 128 and
    ``128 * sum(x)`` taken off after: the same integers); elsewhere a plain loop. Only on the CPU backend,
    after :func:`available`."""
    if layer is not None:
        return jax.ffi.ffi_call("fbjax_int8_matmul_sym_at",
                                jax.ShapeDtypeStruct((x.shape[0], w.shape[1]), jnp.int32))(
            x.astype(jnp.int8), w, _layer_operand(layer))
    return jax.ffi.ffi_call("fbjax_int8_matmul_sym", jax.ShapeDtypeStruct((x.shape[0], w.shape[0]), jnp.int32))(
        x.astype(jnp.int8), w)


def block_matmul(x, w, layer=None):
    """Per block ``k``: ``acc[k, r, o] = sum_c x[r, k, c] * w[o, k, c]`` and ``ksum[k, o] = sum_c w[o, k, c]``.

    Args:
        x: int16 ``[R, K, B]``.
        w: int8 or int4 ``[O, K, B]`` (int4 as XLA stores it, two per byte; ``B`` even, at most 1024);
            with ``layer``, stacked ``[L, O, K, B]`` read in place at block ``layer``.
        layer: None, or an int32 scalar in ``[0, L)``.

    Returns:
        (int32 ``[K, R, O]``, int32 ``[K, O]``). Only on the CPU backend, after :func:`available`.
    """
    r, k, b = x.shape
    if layer is not None:
        o = w.shape[1]
        return jax.ffi.ffi_call("fbjax_block_matmul_at", (jax.ShapeDtypeStruct((k, r, o), jnp.int32),
                                                          jax.ShapeDtypeStruct((k, o), jnp.int32)))(
            x.astype(jnp.int16), w, _layer_operand(layer))
    o = w.shape[0]
    return jax.ffi.ffi_call("fbjax_block_matmul", (jax.ShapeDtypeStruct((k, r, o), jnp.int32),
                                   jax.ShapeDtypeStruct((k, o), jnp.int32)))(x.astype(jnp.int16), w)


def block_fc(x, w, scale, layer=None):
    """TFLite's blockwise FULLY_CONNECTED sums (``fully_connected.cc`` ``EvalBlockwise4Bit``): per output
    ``o``, over the blocks ``k`` in order, ``out[r, o] += f32(sum_c x[r, k, c] * w[o, k, c]) * scale[o, k]``
    and ``kfsum[o] += scale[o, k] * f32(sum_c w[o, k, c])``, each float32 product and sum rounded on its
    own (no FMA).

    Args:
        x: int16 ``[R, K, B]`` (quantized inputs, zero point not subtracted).
        w: int8 or int4 ``[O, K, B]``; with ``layer``, stacked ``[L, O, K, B]`` read in place at block
            ``layer``.
        scale: float32 ``[O, K]`` (the block's own).
        layer: None, or an int32 scalar in ``[0, L)``.

    Returns:
        (float32 ``[R, O]``, float32 ``[O]``). Only on the CPU backend, after :func:`available`.
    """
    r = x.shape[0]
    if layer is not None:
        o = w.shape[1]
        return jax.ffi.ffi_call("fbjax_block_fc_at", (jax.ShapeDtypeStruct((r, o), jnp.float32),
                                                      jax.ShapeDtypeStruct((o,), jnp.float32)))(
            x.astype(jnp.int16), w, jnp.asarray(scale, jnp.float32), _layer_operand(layer))
    o = w.shape[0]
    return jax.ffi.ffi_call("fbjax_block_fc", (jax.ShapeDtypeStruct((r, o), jnp.float32),
                                               jax.ShapeDtypeStruct((o,), jnp.float32)))(
        x.astype(jnp.int16), w, jnp.asarray(scale, jnp.float32))


def attention(q, k, v, mask, layers, scale: float, cap: Optional[float] = None):
    """Scaled dot-product attention with grouped-query heads, reading the key/value caches in place
    (``cpu_attention.cc``; its header states the float32 order of the sums).

    Args:
        q: float32 ``[B, T, N, H]``.
        k, v: float32 ``[R, Lk, B0, S, K, H]``, ``[R, Lv, B0, S, K, H]`` with ``R * B0 == B`` and ``N``
            a multiple of ``K``: batch row ``b = r * B0 + b0`` reads ``k[r, layers[0], b0]`` and
            ``v[r, layers[1], b0]`` (a layer scan's stacked caches, with the rows of a ``vmap`` in front,
            read in place); query head ``n`` reads head ``n // (N / K)``.
        mask: float32 ``[Bm, Nm, T, S]`` (additive; ``Bm`` divides ``B``, batch row ``b`` reads mask row
            ``b // (B / Bm)``; ``Nm`` is 1 or ``N``), or None.
        layers: int32 ``[2]``: the blocks of ``k`` and ``v`` (in ``[0, Lk)``, ``[0, Lv)``).
        scale: the logits' factor; cap: None, or the soft cap (``cap * tanh(x / cap)``, before the mask).

    Returns:
        float32 ``[B, T, N, H]``: ``softmax(cap(scale * q k^T) + mask) v`` per head. Only on the CPU
        backend, after :func:`available` returned True.
    """
    m = jnp.zeros((0,), jnp.float32) if mask is None else jnp.asarray(mask, jnp.float32)
    return jax.ffi.ffi_call("fbjax_attention", jax.ShapeDtypeStruct(q.shape, jnp.float32))(
        jnp.asarray(q, jnp.float32), k, v, m, jnp.asarray(layers, jnp.int32).reshape(2),
        scale=np.float32(scale), cap=np.float32(0.0 if cap is None else cap))


def block_fc_f32(x, w, scale, layer=None):
    """TFLite's blockwise FULLY_CONNECTED (``EvalBlockwise4Bit``) without the bias, from the float input:
    each row of ``x`` quantized asymmetrically (``AsymmetricQuantizeFloats``, as
    :func:`fbjax.lower.tflite_int.hybrid.asymmetric_quantize`: ``q``, ``s``, ``zp``), the sums of
    :func:`block_fc` in their order, then ``out = (sum - f32(zp) * kfsum) * s``, each float32 operation
    rounded on its own: the bits of :func:`fbjax.lower.tflite_int.hybrid._fc_blockwise` less its bias add.

    Args:
        x: float32 ``[R, K * B]``.
        w: int8 or int4 ``[O, K, B]`` (int4 packed two per byte; ``B`` at most 1024, even for int4); with
            ``layer``, stacked ``[L, O, K, B]`` read in place at block ``layer``.
        scale: float32 ``[O, K]`` (the block's own); with ``layer`` also stacked ``[L, O, K]``, read in
            place at block ``layer`` like the weights.
        layer: None, or an int32 scalar in ``[0, L)``.

    Returns:
        float32 ``[R, O]``. Only on the CPU backend, after :func:`available`. On a CPU with AVX-512 VNNI,
        one input row and packed int4 weights with ``B % 32 == 0`` (the decode step of a
        ``dynamic_int4_block32`` LLM) take a ``vpdpbusd`` path that sums 16 output channels at once.
    """
    r = x.shape[0]
    if layer is not None:
        return jax.ffi.ffi_call("fbjax_block_fc_f32_at", jax.ShapeDtypeStruct((r, w.shape[1]), jnp.float32))(
            jnp.asarray(x, jnp.float32), w, jnp.asarray(scale, jnp.float32), _layer_operand(layer))
    o = w.shape[0]
    return jax.ffi.ffi_call("fbjax_block_fc_f32", jax.ShapeDtypeStruct((r, o), jnp.float32))(
        jnp.asarray(x, jnp.float32), w, jnp.asarray(scale, jnp.float32))
