"""TFLite HASHTABLE_LOOKUP, added with its lowering and its numpy twin only
(issue 27: a new TFLite op touches its lowering file and its twin file).

Oracle: LiteRT's builtin kernel (``kernels/hashtable_lookup.cc``) on the same
hand-built model; the values are moved, never computed, so every
implementation returns them bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

import fbjax
import fbjax.reference
from conftest import litert_run
from fbjax.formats.tflite_builder import TFLiteBuilder

KEYS = np.array([-7, 2, 3, 10, 41], np.int32)  # sorted, as the kernel's binary search needs


def _model(values: np.ndarray, n: int) -> bytes:
    b = TFLiteBuilder()
    lookup = b.add_input((n,), np.int32)
    keys = b.add_constant(KEYS)
    vals = b.add_constant(values)
    out = b.add_tensor((n,) + values.shape[1:], values.dtype)
    hits = b.add_tensor((n,), np.uint8)
    b.add_op("HASHTABLE_LOOKUP", [lookup, keys, vals], [out, hits])
    b.add_output(out)
    b.add_output(hits)
    return b.build()


@pytest.mark.parametrize("values", [
    np.arange(15, dtype=np.float32).reshape(5, 3) * 0.5 - 2,  # float rows
    np.arange(5, dtype=np.int32) * 100 + 1,  # scalar rows
], ids=["float_rows", "int_scalars"])
def test_hashtable_lookup_matches_litert(values):
    lookup = np.array([3, 4, -7, 41, 10, 0, 2, 99], np.int32)  # hits and misses, first and last key
    data = _model(values, len(lookup))
    want_out, want_hits = litert_run(data, [lookup])
    # independent of both implementations: the spec's answer, spelled out
    rows = {int(k): values[i] for i, k in enumerate(KEYS)}
    spec_hits = np.array([int(int(k) in rows) for k in lookup], np.uint8)
    np.testing.assert_array_equal(want_hits, spec_hits)
    for i, k in enumerate(lookup):
        np.testing.assert_array_equal(want_out[i], rows.get(int(k), np.zeros_like(values[0])))
    got_out, got_hits = fbjax.load(data)(lookup)
    np.testing.assert_array_equal(np.asarray(got_out), want_out)
    np.testing.assert_array_equal(np.asarray(got_hits), want_hits)
    assert np.asarray(got_hits).dtype == np.uint8 and np.asarray(got_out).dtype == values.dtype
    ref_out, ref_hits = fbjax.reference.run(data, lookup)
    np.testing.assert_array_equal(ref_out, want_out)
    np.testing.assert_array_equal(ref_hits, want_hits)


def test_hashtable_lookup_follows_a_batch_of_keys():
    """The lookup keys carry the batch (batch_size=None); the table does not."""
    values = np.arange(10, dtype=np.float32).reshape(5, 2)
    m = fbjax.load(_model(values, 1), batch_size=None)
    lookup = np.array([2, 5, 41], np.int32)
    out, hits = m(lookup)
    np.testing.assert_array_equal(np.asarray(hits), [1, 0, 1])
    np.testing.assert_array_equal(np.asarray(out), [values[1], [0, 0], values[4]])


def test_hashtable_lookup_gradient_reaches_the_looked_up_rows():
    """d sum(out * c) / d values: each table row gets the sum of ``c`` over the
    lookups that hit it (the op moves rows, so the derivative is a scatter-add
    of the cotangent; missed keys contribute nothing). Worked out by hand from
    the lookup, not from fbjax."""
    import jax
    import jax.numpy as jnp

    values = np.arange(15, dtype=np.float32).reshape(5, 3)
    lookup = np.array([3, 3, 99, 41, -7], np.int32)  # row 2 twice, a miss, rows 4 and 0
    m = fbjax.load(_model(values, len(lookup)))
    (key,) = [k for k, v in m.params.items() if np.asarray(v).dtype == np.float32]
    c = np.arange(1, 16, dtype=np.float32).reshape(5, 3)

    def loss(p):
        out, _ = m.apply(p, lookup)
        return jnp.sum(out * c)

    g = np.asarray(jax.grad(loss)(m.params)[key])
    want = np.zeros_like(values)
    for i, k in enumerate(lookup):
        hit = np.flatnonzero(KEYS == k)
        if hit.size:
            want[hit[0]] += c[i]
    np.testing.assert_array_equal(g, want)  # sums of at most two small integers: exact in float32
