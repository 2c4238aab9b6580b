"""farmhash ``Fingerprint64`` (``farmhashna::Hash64``) for keys of up to 32
bytes, in numpy ``uint64`` arithmetic (wrapping), used by TFLite's
LSH_PROJECTION (``kernels/lsh_projection.cc`` hashes ``seed || item bytes``).
Shared by the JAX lowering (through a host callback) and the numpy reference:
the hash is a fixed public function, and LiteRT is the tests' oracle."""

from __future__ import annotations

import numpy as np

_K0 = np.uint64(0xC3A5C85C97CB3127)
_K1 = np.uint64(0xB492B66FBE98F273)
_K2 = np.uint64(0x9AE16A3B2F90404F)
_U = np.uint64


def _rot(v, s):
    return v if s == 0 else (v >> _U(s)) | (v << _U(64 - s))


def _f64(b, i):
    return _U(int.from_bytes(b[i:i + 8], "little"))


def _f32(b, i):
    return _U(int.from_bytes(b[i:i + 4], "little"))


def _len16(u, v, mul):
    a = (u ^ v) * mul
    a ^= a >> _U(47)
    b = (v ^ a) * mul
    b ^= b >> _U(47)
    return b * mul


def fingerprint64(b: bytes) -> int:
    """``Fingerprint64(b)`` as a signed int64 (``len(b) <= 32``)."""
    n = len(b)
    with np.errstate(over="ignore"):
        if n > 32:
            raise ValueError(f"keys of {n} bytes are not supported (at most 32)")
        if n > 16:
            mul = _K2 + _U(n * 2)
            a = _f64(b, 0) * _K1
            bb = _f64(b, 8)
            c = _f64(b, n - 8) * mul
            d = _f64(b, n - 16) * _K2
            h = _len16(_rot(a + bb, 43) + _rot(c, 30) + d, a + _rot(bb + _K2, 18) + c, mul)
        elif n >= 8:
            mul = _K2 + _U(n * 2)
            a = _f64(b, 0) + _K2
            bb = _f64(b, n - 8)
            c = _rot(bb, 37) * mul + a
            d = (_rot(a, 25) + bb) * mul
            h = _len16(c, d, mul)
        elif n >= 4:
            mul = _K2 + _U(n * 2)
            h = _len16(_U(n) + (_f32(b, 0) << _U(3)), _f32(b, n - 4), mul)
        elif n > 0:
            y = _U((b[0] + (b[n >> 1] << 8)) & 0xFFFFFFFF)
            z = _U((n + (b[n - 1] << 2)) & 0xFFFFFFFF)
            v = y * _K2 ^ z * _K0
            h = (v ^ (v >> _U(47))) * _K2
        else:
            h = _K2
    return int(np.asarray(h).view(np.int64))


def lsh_projection(hash_seeds: np.ndarray, x: np.ndarray, weight, sparse: bool) -> np.ndarray:
    """TFLite LSH_PROJECTION on numpy arrays (int32 output)."""
    seeds = np.asarray(hash_seeds, np.float32)
    x = np.ascontiguousarray(x)
    rows = [x[i].tobytes() for i in range(x.shape[0])]
    w = None if weight is None else np.asarray(weight, np.float32)
    num_hash, num_bits = seeds.shape
    bits = np.zeros((num_hash, num_bits), np.int32)
    for i in range(num_hash):
        for j in range(num_bits):
            sb = seeds[i, j].tobytes()
            score = 0.0
            for k, r in enumerate(rows):
                v = float(fingerprint64(sb + r))
                score += v if w is None else float(w[k]) * v
            bits[i, j] = 1 if score > 0 else 0
    if not sparse:
        return bits.reshape(-1)
    out = np.zeros(num_hash, np.int32)
    for i in range(num_hash):
        sig = 0
        for j in range(num_bits):
            sig = (sig << 1) | int(bits[i, j])
        out[i] = sig + i * (1 << num_bits)
    return out
