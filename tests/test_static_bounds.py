"""Values that decide shapes (issue 15 item 6): ``fbjax.load(constant_inputs=)``
and the static-bound mode (``static_bounds=True``) for ONNX NonMaxSuppression
and NonZero whose inputs the graph computes, against onnxruntime on the
``.onnx`` (models built with the ``onnx`` helper API, converted with
rten-convert as the other ``.rten`` tests do)."""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("rten_convert")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import fbjax  # noqa: E402
from fbjax import reference  # noqa: E402
from rten_convert_tools import convert  # noqa: E402

CLASSES, GRID, MAX_PER_CLASS = 3, 8, 5


def _yolo_postprocess(seed: int = 0) -> onnx.ModelProto:
    """A YOLO-style head: an image ``[1, 3, 16, 16]`` -> a stride-2 convolution
    -> box (4 channels: ``[y1, x1, y2, x2]`` as cell offsets plus a learned
    size) and class-score (sigmoid) convolutions over an 8x8 grid -> ONNX
    NonMaxSuppression (max 5 per class, IoU 0.45, score 0.85). Boxes and
    scores are computed by the graph, so their values (and the number of
    selected boxes) are only known at run time."""
    rng = np.random.default_rng(seed)
    n = GRID * GRID
    ys, xs = np.meshgrid(np.arange(GRID), np.arange(GRID), indexing="ij")
    anchors = np.stack([ys, xs, ys, xs]).reshape(1, 4, n).astype(np.float32)  # cell corners
    size = np.array([0, 0, 3.5, 3.5], np.float32).reshape(1, 4, 1)
    inits = [
        numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.4).astype(np.float32), "w0"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32) * 0.1, "b0"),
        numpy_helper.from_array((rng.standard_normal((4, 8, 1, 1)) * 0.3).astype(np.float32), "wb"),
        numpy_helper.from_array((rng.standard_normal((CLASSES, 8, 1, 1)) * 0.8).astype(np.float32), "ws"),
        numpy_helper.from_array(np.array([1, 4, n], np.int64), "shape_b"),
        numpy_helper.from_array(np.array([1, CLASSES, n], np.int64), "shape_s"),
        numpy_helper.from_array(anchors, "anchors"),
        numpy_helper.from_array(size, "size"),
        numpy_helper.from_array(np.array([MAX_PER_CLASS], np.int64), "max_out"),
        numpy_helper.from_array(np.array([0.45], np.float32), "iou"),
        numpy_helper.from_array(np.array([0.85], np.float32), "score_thr"),
    ]
    nodes = [
        helper.make_node("Conv", ["image", "w0", "b0"], ["f"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("LeakyRelu", ["f"], ["fr"], alpha=0.1),
        helper.make_node("Conv", ["fr", "wb"], ["braw"], kernel_shape=[1, 1]),
        helper.make_node("Reshape", ["braw", "shape_b"], ["bflat"]),
        helper.make_node("Add", ["bflat", "anchors"], ["bpos"]),
        helper.make_node("Add", ["bpos", "size"], ["bsized"]),
        helper.make_node("Transpose", ["bsized"], ["boxes"], perm=[0, 2, 1]),  # [1, n, 4]
        helper.make_node("Conv", ["fr", "ws"], ["sraw"], kernel_shape=[1, 1]),
        helper.make_node("Sigmoid", ["sraw"], ["sig"]),
        helper.make_node("Reshape", ["sig", "shape_s"], ["scores"]),  # [1, C, n]
        helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_out", "iou", "score_thr"], ["selected"]),
    ]
    g = helper.make_graph(nodes, "yolo_post", [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("selected", TensorProto.INT64, [None, 3]),
                           helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, CLASSES, n])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


@pytest.fixture(scope="module")
def yolo():
    m = _yolo_postprocess()
    onnx.checker.check_model(m)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return m, convert(m), sess


def _images(k, seed=1):
    return np.random.default_rng(seed).standard_normal((k, 1, 3, 16, 16)).astype(np.float32)


def test_yolo_nms_is_refused_without_static_bounds(yolo):
    _, rten, _ = yolo
    with pytest.raises((fbjax.ModelFormatError, fbjax.UnsupportedOperatorError), match="known at load time"):
        fbjax.load(rten)(_images(1)[0])  # (at load or at the first call)


def test_yolo_nms_static_bounds_matches_onnxruntime(yolo):
    """Selected triples (the first ``count`` rows) equal onnxruntime's on 20
    images, and the rest are -1 padding; a few images whose scores sit within
    1e-5 of the threshold or of each other would be float-order sensitive,
    which these seeds avoid (asserted)."""
    _, rten, sess = yolo
    model = fbjax.load(rten, static_bounds=True)
    bound = CLASSES * MAX_PER_CLASS
    names = [o.name for o in model.outputs]
    assert names == ["selected", "scores", "selected:valid_count"]
    assert model.outputs[0].shape == (bound, 3) and model.outputs[2].shape == ()
    counts = []
    for x in _images(20):
        want_sel, want_scores = sess.run(None, {"image": x})
        sc = np.sort(want_scores[0], axis=-1)  # per class
        assert np.min(np.abs(sc - 0.85)) > 1e-5 and np.min(np.diff(sc, axis=-1)) > 1e-7  # no near-ties
        sel, scores, count = model(x)
        np.testing.assert_allclose(np.asarray(scores), want_scores, rtol=0, atol=1e-5)  # 8-term sums, float32
        c = int(count)
        counts.append(c)
        assert c == len(want_sel)
        np.testing.assert_array_equal(np.asarray(sel)[:c], want_sel)
        assert (np.asarray(sel)[c:] == -1).all()
    assert min(counts) < max(counts)  # the number selected really varies between images


def test_yolo_nms_static_bounds_vmaps_and_matches_reference(yolo):
    _, rten, sess = yolo
    model = fbjax.load(rten, static_bounds=True)
    xs = _images(4, seed=2)[:, 0][:, None]  # [4, 1, 3, 16, 16]
    f = jax.jit(jax.vmap(lambda x: model.apply(model.params, x)))
    sel, _, count = f(xs)
    assert sel.shape == (4, CLASSES * MAX_PER_CLASS, 3) and count.shape == (4,)
    for i in range(4):
        want = sess.run(None, {"image": xs[i]})[0]
        assert int(count[i]) == len(want)
        np.testing.assert_array_equal(np.asarray(sel[i])[:len(want)], want)
        ref_sel, _, ref_count = reference.run(model, xs[i])
        assert int(ref_count) == len(want)
        np.testing.assert_array_equal(ref_sel, np.asarray(sel[i]))


def _nonzero_graph():
    nodes = [helper.make_node("Greater", ["x", "t"], ["m"]), helper.make_node("NonZero", ["m"], ["idx"])]
    g = helper.make_graph(nodes, "nz", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5])],
                          [helper.make_tensor_value_info("idx", TensorProto.INT64, [2, None])],
                          [numpy_helper.from_array(np.array(0.5, np.float32), "t")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def test_nonzero_static_bounds_matches_onnxruntime():
    m = _nonzero_graph()
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    model = fbjax.load(convert(m), static_bounds=True)
    assert model.outputs[0].shape == (2, 15)
    f = jax.jit(lambda x: model.apply(model.params, x))
    for seed in range(5):
        x = np.random.default_rng(seed).random((3, 5)).astype(np.float32)
        want = sess.run(None, {"x": x})[0]
        idx, count = f(x)
        assert int(count) == want.shape[1]
        np.testing.assert_array_equal(np.asarray(idx)[:, :int(count)], want)
        assert (np.asarray(idx)[:, int(count):] == -1).all()
        ref_idx, ref_count = reference.run(model, x)
        np.testing.assert_array_equal(ref_idx, np.asarray(idx))


def _reduce_axes_graph():
    nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)]
    g = helper.make_graph(nodes, "rs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4]),
                                        helper.make_tensor_value_info("axes", TensorProto.INT64, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def test_constant_inputs_bind_reduce_axes():
    m = _reduce_axes_graph()
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    rten = convert(m)
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    model = fbjax.load(rten, constant_inputs={"axes": np.array([1])})
    assert [s.name for s in model.inputs] == ["x"]
    want = sess.run(None, {"x": x, "axes": np.array([1], np.int64)})[0]
    got = np.asarray(model(x))
    assert got.shape == (2, 4)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)  # sums of 3 float32 terms
    with pytest.raises(fbjax.InputError, match=r"\['axis'\] are not inputs of the model; its inputs are"):
        fbjax.load(rten, constant_inputs={"axis": np.array([1])})
    with pytest.raises(fbjax.InputError, match="dtype float32 does not cast"):
        fbjax.load(rten, constant_inputs={"axes": np.array([1.0], np.float32)})
    with pytest.raises(fbjax.InputError, match=r"shape \(2,\), the input is \(1,\)"):
        fbjax.load(rten, constant_inputs={"axes": np.array([1, 2])})


def test_cli_run_constant_input(tmp_path, capsys):
    from fbjax import cli

    m = _reduce_axes_graph()
    p = tmp_path / "rs.rten"
    p.write_bytes(convert(m))
    np.save(tmp_path / "axes.npy", np.array([2]))
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out.npz"
    assert cli.main(["run", str(p), "--constant-input", f"axes={tmp_path / 'axes.npy'}",
                     "--input", f"x={tmp_path / 'x.npy'}", "--output", str(out), "--repeat", "0"]) == 0
    with np.load(out) as z:
        np.testing.assert_allclose(z[z.files[0]], x.sum(2), rtol=0, atol=1e-6)
