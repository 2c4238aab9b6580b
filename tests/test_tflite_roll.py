"""TFLite's custom ``Roll`` (``tensorflow/lite/kernels/roll.cc``, ``tf.roll``).

LiteRT's default op resolver has no kernel for this custom op (TFLite
registers it among its optional custom ops), so there is no runtime to compare
with. The oracle is ``numpy.roll``, whose documented semantics are
``tf.roll``'s: each named axis rolled by its shift, wrapping around, a
negative shift toward index 0, a negative axis counted from the last, and the
shifts of an axis named twice added up. Rolling moves values and computes
none, so the lowering and the numpy twin must match it exactly. (The model
builder is ``parity_cases.roll_model``, whose parity case compares the two.)
"""

from __future__ import annotations

import numpy as np
import pytest

import fbjax
from fbjax import reference
from fbjax.errors import InputError, ModelFormatError

from parity_cases import roll_model

F32 = np.float32


def _expected(x, shift, axis):
    return np.roll(x, np.asarray(shift).reshape(-1).tolist(), np.asarray(axis).reshape(-1).tolist())


CASES = [  # (shape, shift, axis)
    ((2, 3, 5), 2, 2),  # scalars
    ((2, 3, 5), [1, -2], [1, 2]),  # a negative shift
    ((2, 3, 5), [7], [-1]),  # a negative axis, a shift longer than the axis
    ((4, 6), [1, 2, -4], [1, 1, 0]),  # axis 1 named twice: rolled by 3
    ((3, 4), [0], [1]),  # no move
]


@pytest.mark.parametrize("shape,shift,axis", CASES)
def test_roll_matches_numpy(shape, shift, axis):
    x = np.arange(int(np.prod(shape)), dtype=F32).reshape(shape) - 7.5
    model = roll_model(shape, shift, axis)
    want = _expected(x, shift, axis)
    assert not np.array_equal(want, x) or np.all(np.asarray(shift) == 0)  # the case moves something
    np.testing.assert_array_equal(np.asarray(fbjax.load(model)(x)), want)
    np.testing.assert_array_equal(np.asarray(reference.run(model, x)[0]), want)


def test_roll_integer_input_and_computed_shift():
    """An int32 tensor rolled by a shift the graph receives at call time."""
    x = np.arange(24, dtype=np.int32).reshape(4, 6)
    model = roll_model((4, 6), np.zeros((2,), np.int32), [1, 0], dtype=np.int32, shift_input=True)
    run = fbjax.load(model)
    for shift in ([1, 3], [-5, 2], [13, -1]):
        s = np.asarray(shift, np.int32)
        want = np.roll(x, shift, [1, 0])
        got = np.asarray(run(x, s))
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.asarray(reference.run(model, x, s)[0]), want)


def test_roll_follows_a_batch_unless_it_rolls_it():
    xs = np.random.default_rng(3).standard_normal((5, 3, 4)).astype(F32)
    m = fbjax.load(roll_model((1, 3, 4), [1, -1], [1, 2]), batch_size=None)
    np.testing.assert_array_equal(np.asarray(m(xs)), np.roll(xs, [1, -1], [1, 2]))
    with pytest.raises(InputError, match="Roll.*batch dimension"):
        fbjax.load(roll_model((1, 3, 4), [1], [0]), batch_size=None)


@pytest.mark.parametrize("shift,axis,msg", [([1, 2], [1], "shift has 2 elements and axis 1"),
                                            ([1], [3], "axis 3 is out of range for a rank-2")])
def test_roll_refuses_contradicting_operands(shift, axis, msg):
    model = roll_model((3, 4), shift, axis)
    x = np.zeros((3, 4), F32)
    with pytest.raises(ModelFormatError, match=msg):
        fbjax.load(model)(x)
    with pytest.raises(ModelFormatError, match=msg):
        reference.run(model, x)


def test_roll_gradient_is_the_inverse_roll():
    """d sum(roll(x) * c) / dx = roll(c) back by the same shifts (a roll is a
    permutation: its derivative moves the cotangent back), worked out with
    numpy from that rule, not from fbjax."""
    import jax
    import jax.numpy as jnp

    shift, axis = [2, -1, 3], [2, 1, -1]
    m = fbjax.load(roll_model((2, 3, 5), shift, axis))
    x = np.random.default_rng(5).standard_normal((2, 3, 5)).astype(F32)
    c = np.arange(30, dtype=F32).reshape(2, 3, 5)

    def loss(x):
        return jnp.sum(m.apply(m.params, x) * c)  # one output, no state: apply returns the array

    g = np.asarray(jax.grad(loss)(x))
    np.testing.assert_array_equal(g, np.roll(c, [-s for s in shift], axis))
