"""numpy twins of ``stablehlo.sort``, ``while``, ``case``, ``composite``
and ``rng_bit_generator``."""

from __future__ import annotations

import functools

import numpy as np

from ...op_rules import Region, n_in, n_out
from .. import composites
from ..registry import register
from ._util import ints

OP_SET = "stablehlo"


@register(OP_SET, "stablehlo.sort",
          regions={"comparator": Region(lambda n: (2 * n_in(n), 1), scalar=True)})
def sort(ctx, *inputs, dimension=-1, is_stable=False, comparator=-1):
    """Stable merge sort of each 1-D slice along ``dimension`` with the
    comparator body called on scalar pairs (``comparator(lhs0, rhs0, ...)``)."""
    xs = [np.asarray(x) for x in inputs]
    if xs[0].ndim == 0:
        return xs
    d = int(dimension) % xs[0].ndim
    moved = [np.moveaxis(x, d, -1) for x in xs]
    outs = [np.empty_like(m) for m in moved]

    def before(i, j, cols):
        args = []
        for c in cols:
            args += [c[i], c[j]]
        return bool(np.asarray(ctx.call_graph(int(comparator), *args)[0]))

    for idx in np.ndindex(*moved[0].shape[:-1]):
        cols = [m[idx] for m in moved]
        order = sorted(range(len(cols[0])), key=functools.cmp_to_key(
            lambda i, j: -1 if before(i, j, cols) else (1 if before(j, i, cols) else 0)))
        for o, c in zip(outs, cols):
            o[idx] = c[order]
    return [np.moveaxis(o, -1, d) for o in outs]


@register(OP_SET, "stablehlo.while",
          regions={"cond": Region(lambda n: (n_in(n), 1)), "body": Region(lambda n: (n_in(n), n_in(n)))})
def while_(ctx, *operands, cond=-1, body=-1):
    """Apply ``body`` while ``cond`` is true."""
    state = [np.asarray(x) for x in operands]
    while bool(np.asarray(ctx.call_graph(int(cond), *state)[0])):
        state = [np.asarray(v, s.dtype) for v, s in zip(ctx.call_graph(int(body), *state), state)]
    return state


@register(OP_SET, "stablehlo.case")
def case(ctx, index, *operands, branches=()):
    """Branch ``index`` (out of range: the last one) on the other operands."""
    br = ints(branches)
    i = int(np.asarray(index).reshape(()))
    if not 0 <= i < len(br):
        i = len(br) - 1
    return [np.asarray(v) for v in ctx.call_graph(br[i], *operands)]


@register(OP_SET, "stablehlo.composite",
          regions={"decomposition": Region(lambda n: (n_in(n), n_out(n)))})
def composite(ctx, *inputs, name="", decomposition=-1, composite_attributes=b"", version=0):
    """The numpy twin registered under ``name`` (:mod:`fbjax.reference.composites`)
    when the run's ``composites`` mode fuses it, else the decomposition graph
    on the inputs."""
    chosen = composites.choose(ctx, name, composite_attributes, getattr(ctx.run, "composites", "litert"))
    if chosen is not None:
        fn, attrs = chosen
        return [np.asarray(fn(ctx, *inputs, **attrs))]
    return [np.asarray(v) for v in ctx.call_graph(int(decomposition), *inputs)]


# --- rng_bit_generator: XLA's THREE_FRY and PHILOX bit generators ---------------------

_M32 = np.uint64(0xFFFFFFFF)
_RNG_ALGORITHMS = {"DEFAULT": "PHILOX", "THREEFRY": "THREE_FRY", "THREE_FRY": "THREE_FRY", "PHILOX": "PHILOX"}


def _lo_hi(u64):
    u64 = np.asarray(u64, np.uint64)
    return (u64 & _M32).astype(np.uint32), (u64 >> np.uint64(32)).astype(np.uint32)


def _u64(lo, hi):
    return (np.asarray(hi, np.uint64) << np.uint64(32)) | np.asarray(lo, np.uint64)


def _threefry2x32(key, x0, x1):
    """Threefry-2x32 with 20 rounds (Salmon et al. 2011) of the counter
    words ``x0``, ``x1`` (uint32 arrays) under the 64-bit ``key`` (low word
    first)."""
    k0, k1 = (np.uint32(k) for k in _lo_hi(key))
    ks = (k0, k1, np.uint32(k0 ^ k1 ^ np.uint32(0x1BD11BDA)))
    rotations = ((13, 15, 26, 6), (17, 29, 16, 24))
    with np.errstate(over="ignore"):
        x0, x1 = x0 + ks[0], x1 + ks[1]
        for i in range(5):
            for r in rotations[i % 2]:
                x0 = x0 + x1
                x1 = ((x1 << np.uint32(r)) | (x1 >> np.uint32(32 - r))) ^ x0
            x0 = x0 + ks[(i + 1) % 3]
            x1 = x1 + ks[(i + 2) % 3] + np.uint32(i + 1)
    return x0, x1


def _philox4x32(x, key):
    """Philox-4x32 with 10 rounds (Salmon et al. 2011) of the four counter
    words ``x`` (uint32 arrays) under the 64-bit ``key`` (low word first)."""
    k0, k1 = (np.uint32(k) for k in _lo_hi(key))
    x = list(x)
    with np.errstate(over="ignore"):
        for _ in range(10):
            p0 = x[0].astype(np.uint64) * np.uint64(0xD2511F53)
            p1 = x[2].astype(np.uint64) * np.uint64(0xCD9E8D57)
            x = [(p1 >> np.uint64(32)).astype(np.uint32) ^ x[1] ^ k0, (p1 & _M32).astype(np.uint32),
                 (p0 >> np.uint64(32)).astype(np.uint32) ^ x[3] ^ k1, (p0 & _M32).astype(np.uint32)]
            k0, k1 = k0 + np.uint32(0x9E3779B9), k1 + np.uint32(0xBB67AE85)
    return x


def _counters(start, n):
    """``start + [0, n)`` as uint64 (wrapping), and whether each one wrapped."""
    with np.errstate(over="ignore"):
        c = np.uint64(start) + np.arange(n, dtype=np.uint64)
    return c, c < np.uint64(start)


def _threefry_split(shape) -> tuple:
    """XLA's split of a 32-bit output shape into two halves (one per
    Threefry output word): the first even dimension, else the first largest
    one; ``()`` counts as ``(1,)``."""
    shape = tuple(shape) or (1,)
    even = [i for i, d in enumerate(shape) if d % 2 == 0]
    d = even[0] if even else int(np.argmax(shape))
    return shape, d


def _threefry(key, counter, shape, width):
    """(bits, number of counters used) for THREE_FRY."""
    if width == 64:
        n = int(np.prod(shape, dtype=np.int64))
        c, _ = _counters(counter, n)
        o0, o1 = _threefry2x32(key, *_lo_hi(c))
        return _u64(o0, o1).reshape(shape), n
    full, d = _threefry_split(shape)
    half = full[:d] + (-(-full[d] // 2),) + full[d + 1:]
    n = int(np.prod(half, dtype=np.int64))
    c, _ = _counters(counter, n)
    o0, o1 = _threefry2x32(key, *_lo_hi(c))
    # word 0 and word 1 of each counter are neighbours along the split dimension
    bits = np.stack([o0.reshape(half), o1.reshape(half)], axis=d + 1)
    bits = bits.reshape(half[:d] + (2 * half[d],) + half[d + 1:])
    bits = np.take(bits, np.arange(full[d]), axis=d)
    return bits.reshape(shape), n


def _philox(key, lo, hi, shape, width):
    """(bits, new counter low word, new counter high word) for PHILOX: a
    128-bit counter ``hi:lo``, each value giving 4 x 32 (or 2 x 64) bits."""
    n = int(np.prod(shape, dtype=np.int64))
    per = 4 if width == 32 else 2
    m = -(-n // per)
    c, wrapped = _counters(lo, m)
    with np.errstate(over="ignore"):
        chi = np.where(wrapped, np.uint64(hi) + np.uint64(1), np.uint64(hi)).astype(np.uint64)
    y = _philox4x32(list(_lo_hi(c)) + list(_lo_hi(chi)), key)
    words = y if width == 32 else [_u64(y[0], y[1]), _u64(y[2], y[3])]
    bits = np.stack(words, axis=1).reshape(-1)[:n].reshape(shape)
    new_lo, new_wrapped = _counters(lo, m + 1)
    with np.errstate(over="ignore"):
        new_hi = np.uint64(hi) + np.uint64(1) if bool(new_wrapped[m]) else np.uint64(hi)
    return bits, new_lo[m], new_hi


@register(OP_SET, "stablehlo.rng_bit_generator")
def rng_bit_generator(ctx, initial_state, *, rng_algorithm="DEFAULT", algorithm=None):
    """(output_state, output) of XLA's bit generators, bit for bit.

    ``initial_state``'s bytes are read as little-endian 64-bit words (a
    ``ui32[4]`` state is the ``ui64[2]`` one, low word first), and the new
    state is written back in the same type and shape.

    * THREE_FRY (``ui64[2]`` = key, counter): Threefry-2x32-20 of the
      counters ``counter + i``; 64-bit outputs are ``word1:word0`` of counter
      ``i`` in row-major order; 32-bit outputs pair the two words of a
      counter along XLA's split dimension (the first even one, else the first
      largest), counters running over the halved shape. The counter advances
      by the number of counters used.
    * PHILOX (``ui64[2]`` = key, counter low word, with the *key* as the
      counter's high word, as XLA does; ``ui64[3]`` = key, counter low, high):
      Philox-4x32-10 of the 128-bit counters ``counter + i``, the four words
      (two 64-bit values) of each in order; the counter advances by the number
      used (its high word is not stored for a two-word state).
    * DEFAULT is PHILOX (what XLA CPU picks; checked through the lowering).

    Outputs of 8 or 16 bits are the low bits of the 32-bit output of the
    same shape (JAX's convention, which the lowering follows); signed types
    get the unsigned bits. Layouts were checked against XLA CPU through
    ``lax.rng_bit_generator``; the three-word PHILOX state could not be (JAX
    takes 128-bit states only).

    Raises:
        ModelFormatError: an unknown algorithm, a state size the algorithm
            does not take, a non-integer output, or a dynamic output shape.
    """
    alg = str(algorithm if algorithm is not None else rng_algorithm).upper()
    if alg not in _RNG_ALGORITHMS:
        raise ctx.error(f"unknown rng algorithm {alg!r}")
    alg = _RNG_ALGORITHMS[alg]
    state = np.asarray(initial_state)
    if state.dtype.kind not in "ui" or state.nbytes % 8:
        raise ctx.error(f"initial_state {state.dtype}{state.shape} is not a whole number of 64-bit words")
    words = np.ascontiguousarray(state).view(state.dtype.newbyteorder("<")).view("<u8").astype(np.uint64).reshape(-1)
    if len(words) != 2 and not (alg == "PHILOX" and len(words) == 3):
        raise ctx.error(f"{alg} takes a 128-bit{' or 192-bit' if alg == 'PHILOX' else ''} state, "
                        f"got {64 * len(words)} bits")
    out = ctx.outputs[1]
    if out is None or out.shape is None or any(s is None for s in out.shape):
        raise ctx.error("output 1 needs a static shape")
    shape, dt = tuple(int(s) for s in out.shape), np.dtype(out.dtype)
    if dt.kind not in "ui":
        raise ctx.error(f"output type {dt} is not an integer type")
    width = 64 if dt.itemsize == 8 else 32
    key = words[0]
    if alg == "THREE_FRY":
        bits, used = _threefry(key, words[1], shape, width)
        with np.errstate(over="ignore"):
            new = np.array([key, words[1] + np.uint64(used)], np.uint64)
    else:
        hi = words[2] if len(words) == 3 else key
        bits, lo, hi = _philox(key, words[1], hi, shape, width)
        new = np.array([key, lo, hi][:len(words)], np.uint64)
    bits = bits.astype(np.dtype(f"u{dt.itemsize}")).view(dt) if width == 32 else bits.view(dt)
    new = new.astype("<u8").view(state.dtype.newbyteorder("<")).astype(state.dtype).reshape(state.shape)
    return [new, bits]
