"""``Model.save`` for RTen (``fbjax.formats.rten_writer``) and ``stablehlo.flatbuf``
(``fbjax.formats.stablehlo_writer``): new weights patched into the file's bytes.

Models: a small ONNX Conv/MatMul graph converted by rten-convert 0.22 (v2 with
its weights in the tensor-data segment and a small inline bias, and the v1
layout with everything inline), and a JAX MLP exported with
``fbjax.export.to_stablehlo_flatbuffer`` with its weights as constants.

Oracles: the reloaded file run by fbjax must equal the original model run on
the new params (the jitted call vs the eager apply: float32 sums in two
orders, within twice the summation bound ``conftest.gamma`` of the chain);
onnxruntime on the ONNX model rebuilt with the new weights (independent
runtime, the same bound); and the file bytes themselves: outside the updated weights'
byte ranges (located by searching the *old* file for the old weights' bytes,
not through the writer) nothing changes, inside them the new values sit.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fbjax  # noqa: E402
from fbjax.errors import InputError  # noqa: E402
from conftest import abs_magnitude, assert_within, gamma, require  # noqa: E402

RNG = np.random.default_rng(7)


def _span(old: bytes, arr: np.ndarray) -> tuple:
    """(start, end) of ``arr``'s little-endian bytes in ``old``; they must occur once."""
    b = np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<")).tobytes()
    start = old.find(b)
    assert start >= 0, "weight bytes not found in the file"
    assert old.find(b, start + 1) < 0, "weight bytes occur twice: the span is ambiguous"
    return start, start + len(b)


def _check_bytes(old: bytes, new: bytes, changed: dict) -> None:
    """``changed``: name -> (old stored array, new stored array)."""
    assert len(new) == len(old)
    allowed = np.zeros(len(old), bool)
    for name, (o, n) in changed.items():
        s, e = _span(old, o)
        allowed[s:e] = True
        assert new[s:e] == np.ascontiguousarray(n).astype(n.dtype.newbyteorder("<")).tobytes(), name
    diff = np.frombuffer(old, np.uint8) != np.frombuffer(new, np.uint8)
    assert diff.any()
    assert not (diff & ~allowed).any(), f"bytes changed outside the weights: {np.flatnonzero(diff & ~allowed)[:10]}"


# --- RTen ----------------------------------------------------------------------------

try:  # the RTen tests need onnx and rten-convert; the StableHLO ones do not
    from onnx import TensorProto, helper, numpy_helper
except ImportError:  # pragma: no cover - optional test dependency
    TensorProto = helper = numpy_helper = None


def _onnx_model(w, b, m):
    """Conv(3x3, pads 1) + bias -> Relu -> MatMul over the last axis."""
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["r"]),
         helper.make_node("MatMul", ["r", "m"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 5, 6])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"), numpy_helper.from_array(m, "m")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


W = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
B = RNG.standard_normal(4).astype(np.float32)  # 4 elements: inline even in v2
M = RNG.standard_normal((5, 6)).astype(np.float32)
X = RNG.standard_normal((1, 3, 5, 5)).astype(np.float32)


@pytest.fixture(scope="module", params=["v2", "v1"])
def rten_file(request):
    require("onnx")
    require("rten_convert")
    from rten_convert_tools import convert

    data = convert(_onnx_model(W, B, M), v1=request.param == "v1")
    assert (data[:4] == b"RTEN") == (request.param == "v2")
    return data


def test_rten_save_new_weights(rten_file, tmp_path):
    model = fbjax.load(rten_file)
    assert set(model.params) == {"w", "b", "m"}
    new = {k: np.asarray(v) + 0.25 * RNG.standard_normal(v.shape).astype(np.float32)
           for k, v in model.params.items()}
    path = tmp_path / "new.rten"
    data = model.save(path, new)
    assert path.read_bytes() == data
    _check_bytes(rten_file, data, {"w": (W, new["w"]), "b": (B, new["b"]), "m": (M, new["m"])})
    reloaded = fbjax.load(path)
    got = np.asarray(reloaded(X))
    for k, v in new.items():  # the file now holds exactly the new float32 weights
        np.testing.assert_array_equal(np.asarray(reloaded.params[k]), v)
    want = np.asarray(model.apply({k: np.asarray(v) for k, v in new.items()}, X))
    # jitted (reloaded) vs eager (apply), or vs onnxruntime: two float32 summation orders of the Conv's
    # 3*3*3 products plus bias, then (ReLU adds nothing) the MatMul's 5: each within gamma_33 of the
    # model run on |x| and |weights| (conftest.abs_magnitude)
    bound = 2 * gamma(28 + 5) * abs_magnitude(model, X, params=new)
    assert_within(got, want, bound, "reloaded rten vs apply(new)")
    assert not np.allclose(got, np.asarray(model(X)))  # the new weights matter
    ort = require("onnxruntime")
    sess = ort.InferenceSession(_onnx_model(new["w"], new["b"], new["m"]).SerializeToString(),
                                providers=["CPUExecutionProvider"])
    assert_within(got, sess.run(None, {"x": X})[0], bound, "reloaded rten vs onnxruntime")


def test_rten_save_subset_and_dtype_cast(rten_file):
    """Only the named weight changes; float64 values are stored as float32."""
    model = fbjax.load(rten_file)
    m64 = RNG.standard_normal((5, 6))
    data = model.save(None, {"m": m64})
    _check_bytes(rten_file, data, {"m": (M, m64.astype(np.float32))})
    np.testing.assert_array_equal(np.asarray(fbjax.load(data).params["w"]), W)


def test_rten_unchanged_params_keep_the_bytes(rten_file):
    model = fbjax.load(rten_file)
    assert model.save() == rten_file
    assert model.save(None, {"w": W.copy()}) == rten_file


def test_rten_wrong_shape_is_input_error(rten_file):
    model = fbjax.load(rten_file)
    with pytest.raises(InputError, match="'w'.*shape"):
        model.save(None, {"w": np.zeros((4, 3, 3, 2), np.float32)})
    with pytest.raises(InputError, match="not a weight"):
        model.save(None, {"nope": np.zeros(3, np.float32)})


def _if_model(wt, we):
    """If(c): x + wt (then) / x * we (else); each weight a Constant node inside its branch."""
    def branch(name, op, w):
        return helper.make_graph(
            [helper.make_node("Constant", [], [name], value=numpy_helper.from_array(w, name)),
             helper.make_node(op, ["x", name], [name + "_o"])],
            name + "_g", [], [helper.make_tensor_value_info(name + "_o", TensorProto.FLOAT, [20])])
    g = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=branch("wt", "Add", wt),
                          else_branch=branch("we", "Mul", we))],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [20]),
              helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [20])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("v1", [False, True], ids=["v2", "v1"])
def test_rten_save_weights_inside_if_branches(v1):
    """Constants of nested graphs are found in the graph numbering the frontend uses."""
    require("onnx")
    require("rten_convert")
    from rten_convert_tools import convert

    wt, we = RNG.standard_normal(20).astype(np.float32), RNG.standard_normal(20).astype(np.float32)
    old = convert(_if_model(wt, we), v1=v1)
    model = fbjax.load(old)
    assert len(model.ir.graphs) == 3 and set(model.params) == {"wt", "we"}
    new = {"wt": wt + 1.0, "we": we * 2.0}
    data = model.save(None, new)
    _check_bytes(old, data, {"wt": (wt, new["wt"]), "we": (we, new["we"])})
    r = fbjax.load(data)
    x = RNG.standard_normal(20).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(r(x, np.array(1, np.int32))), x + new["wt"])
    np.testing.assert_array_equal(np.asarray(r(x, np.array(0, np.int32))), x * new["we"])


# --- StableHLO -----------------------------------------------------------------------

W1 = RNG.standard_normal((5, 8)).astype(np.float32)
B1 = RNG.standard_normal(8).astype(np.float32)
W2 = RNG.standard_normal((8, 3)).astype(np.float16)  # stored as float16: rounded on save
XS = RNG.standard_normal((4, 5)).astype(np.float32)


@pytest.fixture(scope="module")
def shlo_file():
    import jax.numpy as jnp
    from fbjax.export import to_stablehlo_flatbuffer

    def mlp(x):
        h = jnp.maximum(x @ W1 + B1, 0.0)
        return h @ jnp.asarray(W2).astype(jnp.float32)  # a float16 constant + convert

    return to_stablehlo_flatbuffer(mlp, XS)


def _shlo_names(model):
    """params key of each of W1, B1, W2 (the exporter names constants itself)."""
    out = {}
    for k, v in model.params.items():
        v = np.asarray(v)
        for name, ref in (("w1", W1), ("b1", B1), ("w2", W2)):
            if v.shape == ref.shape and np.array_equal(v, ref.astype(v.dtype)):
                out[name] = k
    assert set(out) == {"w1", "b1", "w2"}, (sorted(model.params), out)
    return out


def test_stablehlo_save_new_weights(shlo_file):
    model = fbjax.load(shlo_file)
    names = _shlo_names(model)
    # only the three weights (the exporter's other float constants, e.g. relu's 0.0, are params too)
    new = {k: np.asarray(model.params[k]) + 0.25 * RNG.standard_normal(model.params[k].shape).astype(np.float32)
           for k in names.values()}
    data = model.save(None, new)
    stored = {"w1": W1, "b1": B1, "w2": W2}
    _check_bytes(shlo_file, data,
                 {n: (stored[n], new[k].astype(stored[n].dtype)) for n, k in names.items()})
    reloaded = fbjax.load(data)
    # float16 weight: the file holds the rounded values, so compare with the rounded params
    rounded = dict(model.params)
    rounded.update({k: new[k].astype(stored[n].dtype).astype(new[k].dtype) for n, k in names.items()})
    got = np.asarray(reloaded(XS))
    for k, v in rounded.items():  # the file holds the new (float16-rounded) weights, the rest as before
        np.testing.assert_array_equal(np.asarray(reloaded.params[k]), v)
    want = np.asarray(model.apply(rounded, XS))
    # x @ W1 (5 products) + B1, ReLU, @ W2 (8): two summation orders, each within gamma_14 of the MLP
    # run on |x| and |weights|
    assert_within(got, want, 2 * gamma(5 + 1 + 8) * abs_magnitude(model, XS, params=rounded),
                  "reloaded stablehlo vs apply(rounded)")
    assert not np.allclose(got, np.asarray(model(XS)))


def test_stablehlo_unchanged_params_keep_the_bytes(shlo_file):
    model = fbjax.load(shlo_file)
    assert model.save() == shlo_file


def test_stablehlo_wrong_shape_is_input_error(shlo_file):
    model = fbjax.load(shlo_file)
    k = _shlo_names(model)["w1"]
    with pytest.raises(InputError, match=f"{k!r}.*shape"):
        model.save(None, {k: np.zeros((5, 7), np.float32)})


def test_writers_refuse_other_formats(rten_file, shlo_file):
    from fbjax.formats import rten_writer, stablehlo_writer

    with pytest.raises(InputError, match="cannot write a 'rten'"):
        stablehlo_writer.write(fbjax.load(rten_file).ir, {})
    with pytest.raises(InputError, match="cannot write a 'stablehlo'"):
        rten_writer.write(fbjax.load(shlo_file).ir, {})
