"""Static-bound mode (issue 15 item 6) for TFLite ``WHERE`` and ``UNIQUE``
whose input the graph computes, against LiteRT's builtin kernels on small
models written with :class:`fbjax.formats.tflite_builder.TFLiteBuilder`.

``x [3, 4] float -> GREATER(x, 0.5) -> WHERE`` and ``x [10] float -> FLOOR ->
UNIQUE``: the number of true elements / distinct values varies with the
input, so the outputs are padded to the input size and a
``"<name>:valid_count"`` output says how many leading entries are valid.
NON_MAX_SUPPRESSION_V4/V5 need nothing here: TFLite defines them with
outputs padded to ``max_output_size`` and a count (tests/test_tflite_builtins.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fbjax  # noqa: E402
from fbjax import reference  # noqa: E402
from fbjax.formats.tflite_builder import TFLiteBuilder  # noqa: E402
from conftest import require  # noqa: E402
from helpers import where_model as _where_model  # noqa: E402


def _unique_model(idx_dtype=np.int32) -> bytes:
    b = TFLiteBuilder()
    x = b.add_input((10,), np.float32, name="x")
    f = b.add_tensor((10,), np.float32, name="f")
    y = b.add_tensor((1,), np.float32, name="y", shape_signature=(-1,))
    idx = b.add_tensor((10,), idx_dtype, name="idx")
    b.add_op("FLOOR", [x], [f])
    b.add_op("UNIQUE", [f], [y, idx], dict(idx_out_type="INT32" if idx_dtype == np.int32 else "INT64"))
    b.add_output(y)
    b.add_output(idx)
    return b.build()


def _litert(model: bytes, x: np.ndarray):
    require("ai_edge_litert", reason="LiteRT (ai-edge-litert, a test extra) is the oracle here")
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    it = Interpreter(model_content=model,
                     experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    out = []
    for d in it.get_output_details():
        shape = tuple(it._get_tensor_details(d["index"], 0)["shape"])  # resized by invoke
        # (LiteRT cannot read back a tensor of 0 elements: "Invalid tensor size")
        out.append(np.zeros(shape, d["dtype"]) if 0 in shape else np.array(it.get_tensor(d["index"])))
    return out


def _where_inputs(k: int) -> np.ndarray:
    """``k`` inputs with 0, 12 and random numbers of elements above 0.5."""
    rng = np.random.default_rng(0)
    xs = rng.random((k, 3, 4)).astype(np.float32)
    xs[0] = 0.0
    xs[1] = 1.0
    return xs


def _unique_inputs(k: int) -> np.ndarray:
    """``k`` inputs whose floors have 1, 10 and random numbers of distinct
    values (with -0.0 and 0.0 among them: one value)."""
    rng = np.random.default_rng(1)
    xs = rng.uniform(-3, 4, (k, 10)).astype(np.float32)
    xs[0] = 2.5
    xs[1] = np.arange(10, dtype=np.float32)[::-1] * 1.5
    xs[2, :4] = [-0.0, 0.3, 0.0, -0.0]
    xs[3, :3] = [0.3, 5.0, -0.0]  # 0.0 first, -0.0 (sorted before it) later
    return xs


def test_where_refused_at_load_without_static_bounds():
    with pytest.raises(fbjax.UnsupportedOperatorError, match="must be known at load time"):
        fbjax.load(_where_model())


def test_unique_refused_at_load_without_static_bounds():
    with pytest.raises(fbjax.UnsupportedOperatorError, match="must be known at load time"):
        fbjax.load(_unique_model())


def test_where_and_unique_on_constants_unchanged():
    """On inputs stored in the file, both modes give the exact sizes (known
    at load) and no count output: static-bound mode pads only computed inputs."""
    from fbjax.formats.tflite_builder import single_op_model as som

    cond = np.array([[True, False, True], [False, False, True]])
    x = np.array([3.0, 1.0, 3.0, 2.0, 1.0, 5.0], np.float32)
    for static in (False, True):
        m = fbjax.load(som("WHERE", [cond], output_shapes=[(3, 2)], output_dtypes=[np.int64]), static_bounds=static)
        assert len(m.outputs) == 1 and m.outputs[0].shape == (3, 2)
        np.testing.assert_array_equal(np.asarray(m()), [[0, 0], [0, 2], [1, 2]])
        m = fbjax.load(som("UNIQUE", [x], output_shapes=[(4,), (6,)], output_dtypes=[np.float32, np.int32]),
                       static_bounds=static)
        assert len(m.outputs) == 2
        y, idx = m()
        np.testing.assert_array_equal(np.asarray(y), [3.0, 1.0, 2.0, 5.0])
        np.testing.assert_array_equal(np.asarray(idx), [0, 1, 0, 2, 1, 3])


def test_where_static_bounds_matches_litert():
    model_bytes = _where_model()
    model = fbjax.load(model_bytes, static_bounds=True)
    assert [o.name for o in model.outputs] == ["coords", "coords:valid_count"]
    assert model.outputs[0].shape == (12, 2) and model.outputs[1].shape == ()
    assert np.dtype(model.outputs[0].dtype) == np.int64
    f = model  # jitted; int64 outputs under its scoped jax.enable_x64
    counts = []
    for x in _where_inputs(8):
        (want,) = _litert(model_bytes, x)
        coords, count = f(x)
        c = int(count)
        counts.append(c)
        assert c == len(want)
        np.testing.assert_array_equal(np.asarray(coords)[:c], want)
        assert (np.asarray(coords)[c:] == -1).all()
        ref_coords, ref_count = reference.run(model, x)
        assert int(ref_count) == c
        np.testing.assert_array_equal(ref_coords, np.asarray(coords))
    assert counts[0] == 0 and counts[1] == 12 and len(set(counts)) >= 4  # the count really varies


def test_where_static_bounds_vmaps():
    model = fbjax.load(_where_model(), static_bounds=True)
    xs = _where_inputs(5)
    with jax.enable_x64(True):  # (apply follows the caller's configuration: int64 coordinates)
        coords, count = jax.jit(jax.vmap(lambda x: model.apply(model.params, x)))(xs)
    assert coords.dtype == np.int64
    assert coords.shape == (5, 12, 2) and count.shape == (5,)
    for i in range(5):
        want = np.argwhere(xs[i] > 0.5)
        assert int(count[i]) == len(want)
        np.testing.assert_array_equal(np.asarray(coords[i])[:len(want)], want)
        assert (np.asarray(coords[i])[len(want):] == -1).all()


@pytest.mark.parametrize("idx_dtype", [np.int32, np.int64])
def test_unique_static_bounds_matches_litert(idx_dtype):
    model_bytes = _unique_model(idx_dtype)
    model = fbjax.load(model_bytes, static_bounds=True)
    assert [o.name for o in model.outputs] == ["y", "idx", "y:valid_count"]
    assert model.outputs[0].shape == (10,) and model.outputs[1].shape == (10,) and model.outputs[2].shape == ()
    f = model  # jitted; int64 outputs under its scoped jax.enable_x64
    counts = []
    for x in _unique_inputs(8):
        want_y, want_idx = _litert(model_bytes, x)
        y, idx, count = f(x)
        c = int(count)
        counts.append(c)
        assert c == len(want_y)
        np.testing.assert_array_equal(np.asarray(y)[:c], want_y)  # first-occurrence order, exact values
        np.testing.assert_array_equal(np.signbit(np.asarray(y)[:c]), np.signbit(want_y))  # the first one's zero
        assert (np.asarray(y)[c:] == 0).all()
        np.testing.assert_array_equal(np.asarray(idx), want_idx)
        assert np.asarray(idx).dtype == np.dtype(idx_dtype)
        ref_y, ref_idx, ref_count = reference.run(model, x)
        assert int(ref_count) == c
        np.testing.assert_array_equal(ref_y, np.asarray(y))
        np.testing.assert_array_equal(ref_idx, np.asarray(idx))
    assert counts[0] == 1 and counts[1] == 10 and len(set(counts)) >= 4  # the count really varies


def test_unique_static_bounds_vmaps():
    model = fbjax.load(_unique_model(), static_bounds=True)
    xs = _unique_inputs(6)
    y, idx, count = jax.jit(jax.vmap(lambda x: model.apply(model.params, x)))(xs)
    assert y.shape == (6, 10) and idx.shape == (6, 10) and count.shape == (6,)
    for i in range(6):
        fl = np.floor(xs[i])
        c = int(count[i])
        yi, ii = np.asarray(y[i]), np.asarray(idx[i])
        np.testing.assert_array_equal(yi[ii], fl)  # x == y[idx]
        assert c == len(np.unique(fl)) and len(set(yi[:c].tolist())) == c
        firsts = [int(np.flatnonzero(fl == v)[0]) for v in yi[:c]]
        assert firsts == sorted(firsts)  # in order of first appearance
