"""MediaPipe's geometry custom ops: Landmarks2TransformMatrix, TransformLandmarks,
TransformTensorBilinear (version 1 under the custom code ``TransformTensor``).

LiteRT ships no kernels for these ops (MediaPipe registers them in its own
resolver), so there is no runtime to compare with. Each op is checked instead,
in both versions, against

* the numpy reference twin (``fbjax.reference``), and
* a plain-Python transcription of the published formulas written here
  (float64 scalars, explicit loops and hand-multiplied matrices), and
* geometric properties that follow from the definitions (identity and pure
  translations, the crop matrix mapping the output crop onto the landmarks'
  bounding box, chaining ops in one model).

Models are written with :class:`fbjax.formats.tflite_builder.TFLiteBuilder`: flexbuffer
custom options and the operator code's version, which selects the variant.

Tolerances: the ops compute in float32 (as MediaPipe's kernels do) while the
transcriptions use float64. Matrix entries come from atan/cos/sin of float32
values and products of 3 or 4 matrices, so we allow ``rtol=1e-5`` plus an
absolute ``2e-5 * scale`` where ``scale`` is the largest magnitude involved
(image size in pixels): a few float32 ulps of the largest term. Bilinear
samples of values in [-1, 1] are compared at ``atol=1e-5``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import fbjax
from fbjax import reference
from fbjax.errors import ModelFormatError
from fbjax.formats.tflite_builder import TFLiteBuilder

from conftest import assert_within, bilinear_bound, gamma
from helpers import custom_op_model

def _as_list(y):
    return [np.asarray(v) for v in (y if isinstance(y, (list, tuple)) else [y])]


def _model(code, version, in_shapes, out_shape, options):
    """One custom op with model inputs ``in_shapes`` and one float32 output."""
    return custom_op_model(code, version, in_shapes, out_shape, options, description="fbjax tests: MediaPipe geometry op")


def _both(model, *inputs):
    """(fbjax, reference) first outputs."""
    return (_as_list(fbjax.load(model)(*inputs))[0], _as_list(reference.run(model, *inputs))[0])


def _bilinear_bound(img, m, out_hw) -> float:
    """float32 (fbjax, the numpy twin) vs float64 (the transcription) bilinear
    sampling of ``img`` through the affine ``m`` (``conftest.bilinear_bound``):
    the source coordinate takes two products, two sums and the half-pixel
    shift (6 roundings) of terms up to the largest extent times ``1 + max|m|``."""
    extent = max(max(out_hw), max(img.shape[1:3])) * (1 + float(np.abs(m).max()))
    return bilinear_bound(float(np.abs(img).max()), extent, coordinate_roundings=6)


def _close(got, want, scale=1.0, label=""):
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64),
                               rtol=1e-5, atol=2e-5 * scale, err_msg=label)


def _matmul(a, b):
    return [[sum(a[i][k] * b[k][j] for k in range(len(b))) for j in range(len(b[0]))] for i in range(len(a))]


# --- plain-Python transcriptions of the formulas -------------------------------------------------

def _rot(x, y, a):
    return x * math.cos(a) - y * math.sin(a), x * math.sin(a) + y * math.cos(a)


def _bbox(points, a):
    rx = [_rot(x, y, a) for x, y in points]
    xs, ys = [p[0] for p in rx], [p[1] for p in rx]
    return min(xs), max(xs), min(ys), max(ys)


def py_l2tm_v1(lm, *, input_hw, output_hw, landmarks_range, bbox_size_multiplier, left_rotation_idx,
               right_rotation_idx, subset, dimensions=3):
    p = [(float(lm[3 * i]), float(lm[3 * i + 1])) for i in range(len(lm) // 3)]
    (xl, yl), (xr, yr) = p[left_rotation_idx], p[right_rotation_idx]
    a = -math.atan((yr - yl) / (xr - xl))
    x0, x1, y0, y1 = _bbox([p[i] for i in subset], a)
    rng, k = float(landmarks_range), bbox_size_multiplier
    mx, my = _rot((x0 + x1) / 2, (y0 + y1) / 2, -a)
    s = [[(x1 - x0) * k / rng, 0, 0], [0, (y1 - y0) * k / rng, 0], [0, 0, 1]]
    r = [[math.cos(-a), -math.sin(-a), mx / rng * 2 - 1], [math.sin(-a), math.cos(-a), my / rng * 2 - 1], [0, 0, 1]]
    (ih, iw), (oh, ow) = input_hw, output_hw
    rel = [[2 / (ow - 1), 0, -1], [0, 2 / (oh - 1), -1], [0, 0, 1]]
    ab = [[(iw - 1) / 2, 0, (iw - 1) / 2], [0, (ih - 1) / 2, (ih - 1) / 2], [0, 0, 1]]
    m = _matmul(_matmul(_matmul(ab, r), s), rel)
    return np.array([[m[0][0], m[0][1], 0, m[0][2]], [m[1][0], m[1][1], 0, m[1][2]],
                     [m[2][0], m[2][1], m[2][2], 0], [0, 0, 0, 1]]).reshape(1, 4, 4)


def py_l2tm_v2(lm, *, subset_idxs, left_rotation_idx, right_rotation_idx, target_rotation_radians,
               output_height, output_width, scale_x, scale_y):
    p = [(float(v[0]), float(v[1])) for v in lm]
    (xl, yl), (xr, yr) = p[left_rotation_idx], p[right_rotation_idx]
    r = target_rotation_radians - math.atan2(yr - yl, xr - xl)
    x0, x1, y0, y1 = _bbox([p[i] for i in subset_idxs], r)
    cx, cy = _rot((x0 + x1) / 2, (y0 + y1) / 2, -r)

    def shift(tx, ty):
        return [[1, 0, 0, tx], [0, 1, 0, ty], [0, 0, 1, 0], [0, 0, 0, 1]]

    rot = [[math.cos(-r), -math.sin(-r), 0, 0], [math.sin(-r), math.cos(-r), 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]
    scl = [[scale_x * (x1 - x0) / output_width, 0, 0, 0], [0, scale_y * (y1 - y0) / output_height, 0, 0],
           [0, 0, 1, 0], [0, 0, 0, 1]]
    t = shift(cx, cy)
    for step in (rot, scl, shift(-output_width / 2, -output_height / 2)):
        t = _matmul(t, step)
    return np.array(t).reshape(1, 4, 4)


def py_transform_landmarks(lm, m, dims, scale):
    m = [float(v) for v in np.asarray(m).reshape(16)]
    flat = [float(v) for v in np.asarray(lm).reshape(-1)]
    out = list(flat)
    for i in range(0, len(flat), dims):
        x, y = flat[i], flat[i + 1]
        out[i] = m[0] * x + m[1] * y + m[3] * scale
        out[i + 1] = m[4] * x + m[5] * y + m[7] * scale
    return np.array(out).reshape(np.shape(lm))


def py_transform_tensor(img, m, out_hw, v2):
    m = [float(v) for v in np.asarray(m).reshape(16)]
    _, h, w, c = img.shape
    tx3, ty3 = m[3], m[7]
    if v2:
        tx3 += (m[0] + m[1] - 1) / 2
        ty3 += (m[4] + m[5] - 1) / 2
    out = np.zeros((1, out_hw[0], out_hw[1], c))

    def px(yy, xx, ch):
        return float(img[0, yy, xx, ch]) if 0 <= yy < h and 0 <= xx < w else 0.0

    for oy in range(out_hw[0]):
        for ox in range(out_hw[1]):
            sx, sy = m[0] * ox + m[1] * oy + tx3, m[4] * ox + m[5] * oy + ty3
            if not (0 <= sx <= w - 1 and 0 <= sy <= h - 1):
                continue
            x0, y0 = math.floor(sx), math.floor(sy)
            fx, fy = sx - x0, sy - y0
            for ch in range(c):
                up = (1 - fx) * px(y0, x0, ch) + fx * px(y0, x0 + 1, ch)
                lo = (1 - fx) * px(y0 + 1, x0, ch) + fx * px(y0 + 1, x0 + 1, ch)
                out[0, oy, ox, ch] = fy * lo + (1 - fy) * up
    return out


# --- Landmarks2TransformMatrix ----------------------------------------------------------------------

V1_OPTS = dict(input_hw=[40, 60], output_hw=[16, 24], dimensions=3, landmarks_range=32,
               bbox_size_multiplier=1.5, left_rotation_idx=1, right_rotation_idx=4, subset=[0, 2, 3, 5, 6])


def _landmarks_v1(seed, n=7):
    rng = np.random.default_rng(seed)
    lm = rng.uniform(4, 28, size=(n, 3)).astype(np.float32)
    lm[4, 0] = lm[1, 0] + rng.uniform(5, 10)  # right of the left landmark: a moderate angle
    return lm.reshape(1, 1, 1, n * 3)


@pytest.mark.parametrize("seed", [0, 1])
def test_landmarks2transformmatrix_v1(seed):
    lm = _landmarks_v1(seed)
    model = _model("Landmarks2TransformMatrix", 1, [lm.shape], (1, 4, 4), V1_OPTS)
    want = py_l2tm_v1(lm.reshape(-1), **V1_OPTS)
    for label, got in zip(("fbjax", "reference"), _both(model, lm)):
        assert got.shape == (1, 4, 4) and got.dtype == np.float32
        _close(got, want, scale=60, label=label)


def test_landmarks2transformmatrix_v1_level_pair_maps_centre_to_bbox_centre():
    """No rotation (left/right landmarks level): the output crop's centre
    pixel maps to the subset's bounding-box centre scaled from landmark range
    to input pixels."""
    lm = np.array([[2, 3, 0], [5, 10, 0], [12, 7, 0], [20, 10, 0], [9, 25, 0]], np.float32)
    opts = dict(V1_OPTS, left_rotation_idx=1, right_rotation_idx=3, subset=[0, 2, 4], bbox_size_multiplier=1.0)
    model = _model("Landmarks2TransformMatrix", 1, [(1, 1, 1, 15)], (1, 4, 4), opts)
    (ih, iw), (oh, ow), rng = opts["input_hw"], opts["output_hw"], opts["landmarks_range"]
    cx, cy = (2 + 12) / 2, (3 + 25) / 2
    for label, m in zip(("fbjax", "reference"), _both(model, lm.reshape(1, 1, 1, 15))):
        m = m.reshape(4, 4).astype(np.float64)
        centre = m @ [(ow - 1) / 2, (oh - 1) / 2, 0, 1]
        _close(centre[:2], [cx / rng * (iw - 1), cy / rng * (ih - 1)], scale=60, label=label)
        # the corners of the crop span the bounding box (rotation 0, multiplier 1)
        corner = m @ [ow - 1, oh - 1, 0, 1]
        _close(corner[:2] - centre[:2], [(12 - 2) / rng * (iw - 1) / 2, (25 - 3) / rng * (ih - 1) / 2],
               scale=60, label=label)


V2_OPTS = dict(subset_idxs=[0, 1, 2, 3, 4], left_rotation_idx=0, right_rotation_idx=3,
               target_rotation_radians=0.25, output_height=16, output_width=24, scale_x=1.2, scale_y=0.8)


@pytest.mark.parametrize("seed", [0, 1])
def test_landmarks2transformmatrix_v2(seed):
    lm = np.random.default_rng(seed).uniform(0, 50, size=(1, 6, 3)).astype(np.float32)
    model = _model("Landmarks2TransformMatrix", 2, [lm.shape], (1, 4, 4), V2_OPTS)
    want = py_l2tm_v2(lm[0], **V2_OPTS)
    for label, got in zip(("fbjax", "reference"), _both(model, lm)):
        _close(got, want, scale=50, label=label)


def test_landmarks2transformmatrix_v2_crop_covers_bbox():
    """Level landmarks, no target rotation, unit scales: the crop (0, 0) and
    (out_w, out_h) corners map onto the subset's bounding-box corners, through
    TransformLandmarks in the same model (the matrix feeds the second op)."""
    lm = np.array([[[10, 20, 0], [30, 5, 1], [18, 44, 2], [40, 20, 3]]], np.float32)
    opts = dict(V2_OPTS, subset_idxs=[0, 1, 2], right_rotation_idx=3, target_rotation_radians=0.0,
                scale_x=1.0, scale_y=1.0)
    b = TFLiteBuilder()
    x = b.add_input(lm.shape)
    pts = b.add_input((1, 3, 3))
    mat = b.add_tensor((1, 4, 4))
    out = b.add_tensor((1, 3, 3))
    b.add_op("Landmarks2TransformMatrix", [x], [mat], custom=True, custom_options=opts, version=2)
    b.add_op("TransformLandmarks", [pts, mat], [out], custom=True, version=2)
    b.add_output(out)
    b.add_output(mat)
    model = b.build()
    crop = np.array([[[0, 0, 7], [24, 16, 8], [12, 8, 9]]], np.float32)  # corners, centre; z passes
    want = np.array([[[10, 5, 7], [30, 44, 8], [20, 24.5, 9]]])
    for label, got in (("fbjax", _as_list(fbjax.load(model)(lm, crop))),
                       ("reference", _as_list(reference.run(model, lm, crop)))):
        _close(got[0], want, scale=50, label=label)
        _close(got[1], py_l2tm_v2(lm[0], **opts), scale=50, label=label)


# --- TransformLandmarks -----------------------------------------------------------------------------

def _random_matrix(rng):
    m = np.eye(4, dtype=np.float32)
    m[:2, :2] = rng.normal(size=(2, 2))
    m[:2, 3] = rng.uniform(-5, 5, size=2)
    m[2, 2] = rng.normal()
    return m.reshape(1, 4, 4)


@pytest.mark.parametrize("dims,scale", [(3, 2.5), (2, 1.0)])
def test_transform_landmarks_v1(dims, scale):
    rng = np.random.default_rng(dims)
    lm = rng.uniform(-10, 10, size=(1, 2, 3, 2 * dims)).astype(np.float32)
    m = _random_matrix(rng)
    model = _model("TransformLandmarks", 1, [lm.shape, (1, 4, 4)], lm.shape, dict(dimensions=dims, scale=scale))
    want = py_transform_landmarks(lm, m, dims, scale)
    for label, got in zip(("fbjax", "reference"), _both(model, lm, m)):
        assert got.shape == lm.shape
        _close(got, want, scale=50, label=label)
    if dims == 3:  # z untouched
        np.testing.assert_array_equal(got.reshape(-1, 3)[:, 2], lm.reshape(-1, 3)[:, 2])


def test_transform_landmarks_v2_identity_and_translation():
    lm = np.random.default_rng(3).uniform(-10, 10, size=(1, 5, 3)).astype(np.float32)
    model = _model("TransformLandmarks", 2, [lm.shape, (1, 4, 4)], lm.shape, {})
    eye = np.eye(4, dtype=np.float32).reshape(1, 4, 4)
    for label, got in zip(("fbjax", "reference"), _both(model, lm, eye)):
        np.testing.assert_array_equal(got, lm, err_msg=label)
    shift = eye.copy()
    shift[0, 0, 3], shift[0, 1, 3] = 3.0, -2.0
    for label, got in zip(("fbjax", "reference"), _both(model, lm, shift)):
        # products by 0 and 1 and sums of zeros are exact; only + t rounds (correctly): the same bits as numpy
        np.testing.assert_array_equal(got, lm + np.float32([3, -2, 0]), err_msg=label)
    m = _random_matrix(np.random.default_rng(4))
    for label, got in zip(("fbjax", "reference"), _both(model, lm, m)):
        _close(got, py_transform_landmarks(lm, m, 3, 1.0), scale=50, label=label)


def test_transform_landmarks_v1_scale_multiplies_translation():
    lm = np.zeros((1, 1, 1, 2), np.float32)
    m = np.eye(4, dtype=np.float32).reshape(1, 4, 4)
    m[0, 0, 3], m[0, 1, 3] = 1.5, 2.0
    model = _model("TransformLandmarks", 1, [lm.shape, (1, 4, 4)], lm.shape, dict(dimensions=2, scale=4.0))
    for label, got in zip(("fbjax", "reference"), _both(model, lm, m)):
        np.testing.assert_array_equal(got.reshape(2), [6.0, 8.0], err_msg=label)  # small integers: exact


# --- TransformTensorBilinear ------------------------------------------------------------------------

IMG = np.random.default_rng(7).uniform(-1, 1, size=(1, 4, 5, 2)).astype(np.float32)


def _tensor_model(version, out_hw):
    code = "TransformTensorBilinear" if version >= 2 else "TransformTensor"
    opts = dict(mode="bilinear", output_size=list(out_hw)) if version == 1 else dict(output_size=list(out_hw))
    return _model(code, version, [IMG.shape, (1, 4, 4)], (1, *out_hw, IMG.shape[3]), opts)


@pytest.mark.parametrize("version", [1, 2])
def test_transform_tensor_random_affine(version):
    """Rotation + scale + shift: part of the output falls outside the image
    (zeros), some samples touch the last row/column (zero neighbours)."""
    a = 0.3
    m = np.eye(4, dtype=np.float32).reshape(1, 4, 4)
    m[0, :2, :2] = [[0.7 * math.cos(a), -0.7 * math.sin(a)], [0.7 * math.sin(a), 0.7 * math.cos(a)]]
    m[0, 0, 3], m[0, 1, 3] = 0.6, -0.4
    out_hw = (6, 7)
    model = _tensor_model(version, out_hw)
    want = py_transform_tensor(IMG, m, out_hw, v2=version >= 2)
    assert (want == 0).any() and (want != 0).any()
    for label, got in zip(("fbjax", "reference"), _both(model, IMG, m)):
        assert got.shape == (1, 6, 7, 2)
        assert_within(got, want, _bilinear_bound(IMG, m, out_hw), f"{label} v{version}")


@pytest.mark.parametrize("version", [1, 2])
def test_transform_tensor_identity_and_integer_shift(version):
    """Identity copies the image (v2's half-pixel correction vanishes for unit
    scale); an integer shift moves it, with zeros where the source is outside."""
    model = _tensor_model(version, IMG.shape[1:3])
    eye = np.eye(4, dtype=np.float32).reshape(1, 4, 4)
    # unit scale and integer shifts: every source coordinate is an exact integer, the bilinear weights
    # are exactly 1 and 0, so each output is an input value exactly (or 0 outside)
    for label, got in zip(("fbjax", "reference"), _both(model, IMG, eye)):
        np.testing.assert_array_equal(got, IMG, err_msg=label)
    shift = eye.copy()
    shift[0, 0, 3], shift[0, 1, 3] = 1.0, 2.0  # output (ox, oy) reads input (ox + 1, oy + 2)
    want = np.zeros_like(IMG)
    want[:, :2, :4] = IMG[:, 2:, 1:]
    for label, got in zip(("fbjax", "reference"), _both(model, IMG, shift)):
        np.testing.assert_array_equal(got, want, err_msg=label)


def test_transform_tensor_v2_half_pixel_correction():
    """Scale 2 (output pixel = 2 input pixels): v2 samples at 2*o + 0.5, v1 at
    2*o: the two versions differ exactly by that half-pixel shift."""
    m = np.diag([2, 2, 1, 1]).astype(np.float32).reshape(1, 4, 4)
    v1 = _both(_tensor_model(1, (2, 2)), IMG, m)
    v2 = _both(_tensor_model(2, (2, 2)), IMG, m)
    x = IMG[0]
    want_v1 = x[[0, 2]][:, [0, 2]]
    want_v2 = (x[[0, 2]][:, [0, 2]] + x[[0, 2]][:, [1, 3]] + x[[1, 3]][:, [0, 2]] + x[[1, 3]][:, [1, 3]]) / 4
    for got in v1:  # integer source coordinates: weights 1 and 0, exact samples
        np.testing.assert_array_equal(got[0], want_v1)
    # four taps at weight 1/4 (exact) summed in some order: within gamma_4 * sum|tap| / 4 per side
    mag = (np.abs(x[[0, 2]][:, [0, 2]]) + np.abs(x[[0, 2]][:, [1, 3]]) + np.abs(x[[1, 3]][:, [0, 2]])
           + np.abs(x[[1, 3]][:, [1, 3]])) / 4
    for got in v2:
        assert_within(got[0], want_v2, 2 * gamma(4) * mag, "v2 half-pixel average")


def test_crop_pipeline_landmarks_to_tensor():
    """Landmarks2TransformMatrix (v2) feeding TransformTensorBilinear (v2) in one
    model: the result equals the transcription applied to the transcribed matrix."""
    img = np.random.default_rng(9).uniform(-1, 1, size=(1, 12, 10, 1)).astype(np.float32)
    lm = np.array([[[2, 3, 0], [8, 4, 0], [5, 9, 0], [3, 7, 0]]], np.float32)
    opts = dict(V2_OPTS, subset_idxs=[0, 1, 2], right_rotation_idx=1, output_height=5, output_width=4)
    b = TFLiteBuilder()
    x, pts = b.add_input(img.shape), b.add_input(lm.shape)
    mat, out = b.add_tensor((1, 4, 4)), b.add_tensor((1, 5, 4, 1))
    b.add_op("Landmarks2TransformMatrix", [pts], [mat], custom=True, custom_options=opts, version=2)
    b.add_op("TransformTensorBilinear", [x, mat], [out], custom=True, custom_options={}, version=2)
    b.add_output(out)
    model = b.build()
    want = py_transform_tensor(img, py_l2tm_v2(lm[0], **opts), (5, 4), v2=True)
    assert (want != 0).sum() > 10
    for label, got in (("fbjax", _as_list(fbjax.load(model)(img, lm))[0]),
                       ("reference", _as_list(reference.run(model, img, lm))[0])):
        # the matrix carries float32 error (~1e-6 px), amplified by image slopes <= 2 / px
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=label)


def test_bad_options_raise_model_format_error():
    model = _model("Landmarks2TransformMatrix", 1, [(1, 1, 1, 21)], (1, 4, 4), dict(V1_OPTS, dimensions=2))
    with pytest.raises(ModelFormatError, match="dimensions"):
        fbjax.load(model)(_landmarks_v1(0))
    model = _model("TransformLandmarks", 1, [(1, 1, 1, 4), (1, 4, 4)], (1, 1, 1, 4), dict(dimensions=3))
    with pytest.raises(ModelFormatError, match="dimensions"):
        fbjax.load(model)(np.zeros((1, 1, 1, 4), np.float32), np.zeros((1, 4, 4), np.float32))


# --- gradients ------------------------------------------------------------------------------------
# The ops compute in float32 whatever the input dtype (as MediaPipe's kernels), so the check is
# a float32 one: eps=2e-4, tolerance 1e-2 (float32 finite differences of O(1) values carry
# ~1e-7 / 2e-4 = 5e-4 rounding error). The sample points stay away from kinks and jumps
# (bounding-box ties; for TransformTensorBilinear the integer grid, where the bilinear weights
# switch pixels and the image edges where the output jumps to 0): a step of eps along
# check_grads' random tangent moves a sample by ~15 * eps = 3e-3 px, under the 0.0198 px margin.

def _grad_cases():
    rng = np.random.default_rng(11)
    lm1 = _landmarks_v1(0)
    lm2 = rng.uniform(0, 50, size=(1, 6, 3)).astype(np.float32)
    m = _random_matrix(rng)
    lmt = rng.uniform(-10, 10, size=(1, 5, 3)).astype(np.float32)
    a = 0.3
    mt = np.eye(4, dtype=np.float32).reshape(1, 4, 4)
    mt[0, :2, :2] = [[0.7 * math.cos(a), -0.7 * math.sin(a)], [0.7 * math.sin(a), 0.7 * math.cos(a)]]
    # every sample >= 0.0198 px from the integer grid (bilinear kinks, the image edges), v1 and v2
    mt[0, 0, 3], mt[0, 1, 3] = 0.51, -0.46
    return {
        "Landmarks2TransformMatrix_v1": (_model("Landmarks2TransformMatrix", 1, [lm1.shape], (1, 4, 4), V1_OPTS),
                                         [lm1]),
        "Landmarks2TransformMatrix_v2": (_model("Landmarks2TransformMatrix", 2, [lm2.shape], (1, 4, 4), V2_OPTS),
                                         [lm2]),
        "TransformLandmarks_v2": (_model("TransformLandmarks", 2, [lmt.shape, (1, 4, 4)], lmt.shape, {}), [lmt, m]),
        "TransformTensor_v1": (_tensor_model(1, (6, 7)), [IMG, mt]),
        "TransformTensorBilinear_v2": (_tensor_model(2, (6, 7)), [IMG, mt]),
    }


@pytest.mark.parametrize("name", sorted(_grad_cases()))
def test_gradients(name):
    from jax.test_util import check_grads

    model_bytes, inputs = _grad_cases()[name]
    model = fbjax.load(model_bytes)
    check_grads(lambda *xs: model.apply(model.params, *xs), tuple(inputs), order=1, modes=("fwd", "rev"),
                eps=2e-4, atol=1e-2, rtol=1e-2)


# --- float-path QUANTIZE reference (numpy twin; compared with LiteRT) ---------------------------------
# Kept here because it was written together with the ops above; the float path has no QUANTIZE
# lowering yet (fbjax/lower/tflite/quant.py), so only the reference is checked.

QX = np.array([[0.25, 0.75, -0.25, -0.75, 1.25, 100.0], [-100.0, 0.1, 0.3, -1.7, 2.5, 3.49]], np.float32)


@pytest.mark.parametrize("dtype,quant", [
    (np.int8, (0.5, 3)),        # ties (x / s = k + 0.5): half to even per tensor; saturation
    (np.uint8, (0.5, 128)),
    (np.int16, (0.01, 0)),
    (np.int8, dict(scale=[0.5, 0.25], zero_point=[0, 0], quantized_dimension=0)),  # ties away per channel
], ids=["int8", "uint8", "int16", "int8_per_channel"])
def test_quantize_float_reference_matches_litert(dtype, quant):
    from conftest import litert_run

    b = TFLiteBuilder()
    x = b.add_input(QX.shape)
    y = b.add_tensor(QX.shape, dtype, quant=quant)
    b.add_op("QUANTIZE", [x], [y])
    b.add_output(y)
    model = b.build()
    want = litert_run(model, [QX])[0]
    got = reference.run(model, QX)[0]
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)  # integers: exact
