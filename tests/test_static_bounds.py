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

from conftest import require  # noqa: E402
onnx = require("onnx")
ort = require("onnxruntime")
require("rten_convert")

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
    # unbound, the error names the graph input to bind and how (API and CLI)
    with pytest.raises(fbjax.UnsupportedOperatorError) as e:
        fbjax.load(rten)
    assert "depends on the model's inputs ('axes')" in str(e.value)
    assert "constant_inputs={'axes': array}" in str(e.value) and "--constant-input axes=FILE.npy" in str(e.value)


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


def _loop_graph(data_dependent: bool, trip: int = 6):
    """``Loop`` with one state ``s`` (``s = s * 1.5 + x``) and one scan output
    (``s * i``); with ``data_dependent`` the body's condition is
    ``sum(s) < 20`` (so the iterations run depend on ``x``), else the
    condition input passed through."""
    b_in = [helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("s_in", TensorProto.FLOAT, [3])]
    body_nodes = [
        helper.make_node("Mul", ["s_in", "k15"], ["s_mul"]),
        helper.make_node("Add", ["s_mul", "x"], ["s_out"]),
        helper.make_node("Cast", ["i"], ["i_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["s_out", "i_f"], ["scan"]),
    ]
    if data_dependent:
        body_nodes += [helper.make_node("ReduceSum", ["s_out"], ["tot"], keepdims=0),
                       helper.make_node("Less", ["tot", "limit"], ["c_out"])]
    else:
        body_nodes += [helper.make_node("Identity", ["c_in"], ["c_out"])]
    body = helper.make_graph(body_nodes, "body", b_in, [
        helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
        helper.make_tensor_value_info("s_out", TensorProto.FLOAT, [3]),
        helper.make_tensor_value_info("scan", TensorProto.FLOAT, [3])])  # k15, limit, x: captured
    nodes = [helper.make_node("Loop", ["M", "c0", "s0"], ["s_final", "scans"], body=body)]
    g = helper.make_graph(nodes, "loop", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                          [helper.make_tensor_value_info("s_final", TensorProto.FLOAT, [3]),
                           helper.make_tensor_value_info("scans", TensorProto.FLOAT, [None, 3])],
                          [numpy_helper.from_array(np.array(trip, np.int64), "M"),
                           numpy_helper.from_array(np.array(True), "c0"),
                           numpy_helper.from_array(np.zeros(3, np.float32), "s0"),
                           numpy_helper.from_array(np.array(1.5, np.float32), "k15")]
                          + ([numpy_helper.from_array(np.array(20.0, np.float32), "limit")] if data_dependent else []))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def test_loop_scan_outputs_full_trip_count_jitted_matches_onnxruntime():
    m = _loop_graph(False)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    model = fbjax.load(convert(m))
    f = jax.jit(lambda x: model.apply(model.params, x))
    x = np.array([0.5, -1.0, 2.0], np.float32)
    want = sess.run(None, {"x": x})
    got = f(x)
    for g_, w in zip(got, want):  # ~6 multiply-adds of values up to ~40: float32 rounding
        np.testing.assert_allclose(np.asarray(g_), w, rtol=1e-6, atol=1e-5)


def test_loop_scan_outputs_data_dependent_static_bounds_matches_onnxruntime():
    m = _loop_graph(True)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    rten = convert(m)
    with pytest.raises(fbjax.FbjaxError, match=r"static_bounds=True"):
        fbjax.load(rten)(np.ones(3, np.float32))  # refused as loaded (at load or at the first call)
    model = fbjax.load(rten, static_bounds=True)
    assert [o.name for o in model.outputs] == ["s_final", "scans", "scans:valid_count"]
    f = jax.jit(jax.vmap(lambda x: model.apply(model.params, x)))
    xs = np.array([[0.5, 0.2, 0.1], [1.0, 2.0, 1.5], [4.0, 3.0, 5.0], [0.01, 0.02, 0.0]], np.float32)
    s_final, scans, count = f(xs)
    runs = []
    for k, x in enumerate(xs):
        w_final, w_scans = sess.run(None, {"x": x})
        runs.append(len(w_scans))
        assert int(count[k]) == len(w_scans)
        np.testing.assert_allclose(np.asarray(s_final[k]), w_final, rtol=1e-6, atol=1e-5)
        np.testing.assert_allclose(np.asarray(scans[k])[:len(w_scans)], w_scans, rtol=1e-6, atol=1e-5)
        assert (np.asarray(scans[k])[len(w_scans):] == 0).all()
        r_final, r_scans, r_count = reference.run(model, x)
        assert int(r_count) == len(w_scans)
        np.testing.assert_allclose(r_scans, np.asarray(scans[k]), rtol=1e-6, atol=1e-5)
    assert len(set(runs)) > 1  # the iterations run differ between the examples


def _resize_graph(scales, roi_input: bool, mode: str):
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 5])]
    inits = [numpy_helper.from_array(np.array(scales, np.float32), "scales")]
    if roi_input:
        ins.append(helper.make_tensor_value_info("roi", TensorProto.FLOAT, [8]))
    else:
        inits.append(numpy_helper.from_array(np.array([0, 0, 0, 0, 1, 1, 1, 1], np.float32), "roi"))
    node = helper.make_node("Resize", ["x", "roi", "scales"], ["y"], mode=mode,
                            coordinate_transformation_mode="half_pixel")
    g = helper.make_graph([node], "r", ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("scales,roi_input,mode", [
    ([1, 1, 2, 2], True, "linear"),     # roi a graph input (refused at load before: "input 1 must be known")
    ([1, 1, 2, 1], False, "linear"),    # W unchanged
    ([1, 2, 1, 1], False, "nearest"),   # only the channel axis changes
    ([1, 1, 1, 2], True, "nearest"),
])
def test_resize_roi_input_and_unchanged_axes_match_onnxruntime(scales, roi_input, mode):
    m = _resize_graph(scales, roi_input, mode)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    model = fbjax.load(convert(m))
    x = np.random.default_rng(0).standard_normal((1, 2, 4, 5)).astype(np.float32)
    feed = {"x": x}
    if roi_input:
        feed["roi"] = np.array([0, 0, 0.1, 0.2, 1, 1, 0.9, 0.8], np.float32)  # ignored outside tf_crop_and_resize
    want = sess.run(None, feed)[0]
    got = np.asarray(model(*feed.values()))
    assert got.shape == want.shape
    # linear: up to 4 products summed in float32, |x| < 5: a few ulps of 5
    np.testing.assert_allclose(got, want, rtol=0, atol=8 * np.finfo(np.float32).eps * 5)
    ref = reference.run(model, *feed.values())[0]
    np.testing.assert_allclose(ref, want, rtol=0, atol=8 * np.finfo(np.float32).eps * 5)


NODE_CASES = ["test_nonmaxsuppression_center_point_box_format", "test_nonmaxsuppression_flipped_coordinates",
              "test_nonmaxsuppression_identical_boxes", "test_nonmaxsuppression_iou_threshold_boundary",
              "test_nonmaxsuppression_limit_output_size", "test_nonmaxsuppression_single_box",
              "test_nonmaxsuppression_suppress_by_IOU", "test_nonmaxsuppression_suppress_by_IOU_and_scores",
              "test_nonmaxsuppression_two_batches", "test_nonmaxsuppression_two_classes", "test_nonzero_example"]


@pytest.fixture(scope="module")
def node_suite():
    from onnx.backend.test.case.node import collect_testcases

    # the whole suite (~8 s): collect_testcases keeps one module-level list, filled once per
    # process, which a filtered first call would leave holding only that op's cases
    cases = collect_testcases(None)
    return {tc.name: tc for tc in cases if tc.name in NODE_CASES}


@pytest.mark.parametrize("name", NODE_CASES)
def test_node_suite_static_bounds_jitted(node_suite, name):
    """The ONNX node-suite cases of NonMaxSuppression and NonZero, boxes,
    scores and NonZero's input run-time (jitted) arguments, NMS's
    max_output_boxes_per_class / thresholds (graph inputs in these cases)
    bound with ``constant_inputs``: the first ``count`` entries equal the
    expected output, the rest are -1 (as loaded, these cases need their
    boxes/scores bound at load time)."""
    tc = node_suite[name]
    rten = convert(tc.model)
    names = [i.name for i in tc.model.graph.input]
    for inputs, outputs in tc.data_sets:
        xs = [np.asarray(numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else x) for x in inputs]
        xs = [x.astype(np.int32) if x.dtype.kind in "iub" else x.astype(np.float32) for x in xs]
        bind = dict(zip(names[2:], xs[2:])) if "nonmax" in name else {}
        model = fbjax.load(rten, static_bounds=True, constant_inputs=bind)
        xs = xs[:2] if bind else xs
        f = jax.jit(lambda *a: model.apply(model.params, *a))
        want = np.asarray(outputs[0])
        got, count = (np.asarray(y) for y in f(*xs))
        axis = 0 if "nonmax" in name else 1
        assert int(count) == want.shape[axis]
        np.testing.assert_array_equal(np.take(got, range(int(count)), axis=axis), want)
        assert (np.take(got, range(int(count), got.shape[axis]), axis=axis) == -1).all()


def _topk_graph():
    """TopK over the last axis of ``x [1, 8]`` with ``k`` = the number of
    elements of ``x`` above 0.5 (computed by the graph)."""
    nodes = [helper.make_node("Greater", ["x", "half"], ["m"]),
             helper.make_node("Cast", ["m"], ["mi"], to=TensorProto.INT64),
             helper.make_node("ReduceSum", ["mi"], ["k0"], keepdims=0),
             helper.make_node("Reshape", ["k0", "one"], ["k"]),
             helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=1, largest=1)]
    g = helper.make_graph(nodes, "topk", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                          [helper.make_tensor_value_info("values", TensorProto.FLOAT, [1, None]),
                           helper.make_tensor_value_info("indices", TensorProto.INT64, [1, None])],
                          [numpy_helper.from_array(np.array(0.5, np.float32), "half"),
                           numpy_helper.from_array(np.array([1], np.int64), "one")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def test_topk_computed_k_static_bounds_matches_onnxruntime():
    m = _topk_graph()
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    rten = convert(m)
    model = fbjax.load(rten, static_bounds=True)
    assert [o.name for o in model.outputs][-1].endswith(":valid_count")
    f = jax.jit(lambda x: model.apply(model.params, x))
    ks = []
    for seed in range(4):
        x = np.random.default_rng(seed).random((1, 8)).astype(np.float32)
        w_vals, w_idx = sess.run(None, {"x": x})
        vals, idx, count = (np.asarray(y) for y in f(x))
        c = int(count)
        ks.append(c)
        assert c == w_vals.shape[1] and vals.shape == idx.shape == (1, 8)
        np.testing.assert_array_equal(vals[:, :c], w_vals)  # selected, not computed: exact
        np.testing.assert_array_equal(idx[:, :c], w_idx)
        assert (idx[:, c:] == -1).all() and (vals[:, c:] == 0).all()
        r_vals, r_idx, r_count = reference.run(model, x)
        assert int(r_count) == c
        np.testing.assert_array_equal(r_idx, idx)
    assert len(set(ks)) > 1
