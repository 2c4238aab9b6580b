"""The TFLite per-op cases: tiny one- or two-op models written with
:mod:`fbjax.formats.tflite_builder` and their random inputs (a helper module, not a test
module: ``tests/test_tflite_ops.py`` checks each against LiteRT, and
``tests/test_grads.py`` differentiates them).

A :class:`Case` is an id and a ``make()`` returning a :class:`Built`: the
model bytes, its inputs, optionally a numpy result (plain-numpy semantics:
strided slices, depth to space, pads, reshapes) and another model for the
oracle. Inputs are seeded by the case id.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from fbjax.formats.tflite_builder import TFLiteBuilder, single_op_model, transpose_conv_bias_options

F32 = np.float32


def _rng(case_id: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(case_id.encode()))


@dataclass
class Built:
    """A test model and its inputs.

    Attributes:
        model: the ``.tflite`` bytes under test.
        inputs: its inputs.
        numpy: plain-numpy outputs, when the semantics are obvious; checked
            against LiteRT to validate the test itself.
        oracle_model: a model LiteRT can run that must give the same result,
            where LiteRT rejects ``model`` itself (float CONV_2D and
            DEPTHWISE_CONV_2D without bias: LiteRT requires the bias, so the
            oracle is the same op with an explicit zero bias).
    """

    model: bytes
    inputs: list
    numpy: Optional[list] = None
    oracle_model: Optional[bytes] = None


@dataclass
class Case:
    """One op test: ``build(rng) -> Built``."""

    id: str
    build: Callable

    def make(self) -> Built:
        b = self.build(_rng(self.id))
        b.inputs = [np.asarray(x) for x in b.inputs]
        return b


def _out_size(n: int, k: int, stride: int, padding: str, dilation: int = 1) -> int:
    eff = (k - 1) * dilation + 1
    return -(-n // stride) if padding == "SAME" else (n - eff) // stride + 1


# --- convolutions and pools ---------------------------------------------------

def conv2d(h, w, cin, cout, kh, kw, sh, sw, padding, dh=1, dw=1, groups=1, bias=True,
           act="NONE", scale=1.0):
    def build(rng):
        x = (rng.standard_normal((1, h, w, cin)) * scale).astype(F32)
        wt = rng.standard_normal((cout, kh, kw, cin // groups)).astype(F32)
        oh, ow = _out_size(h, kh, sh, padding, dh), _out_size(w, kw, sw, padding, dw)

        def model(b):
            return single_op_model(
                "CONV_2D", [x.shape, wt, b],
                options=dict(padding=padding, stride_h=sh, stride_w=sw, dilation_h_factor=dh,
                             dilation_w_factor=dw, fused_activation_function=act),
                output_shapes=[(1, oh, ow, cout)])
        if bias:
            return Built(model(rng.standard_normal(cout).astype(F32)), [x])
        return Built(model(None), [x], oracle_model=model(np.zeros(cout, F32)))
    return build


def depthwise(h, w, cin, mult, kh, kw, sh, sw, padding, dh=1, dw=1, bias=True, act="NONE"):
    def build(rng):
        x = rng.standard_normal((1, h, w, cin)).astype(F32)
        wt = rng.standard_normal((1, kh, kw, cin * mult)).astype(F32)
        oh, ow = _out_size(h, kh, sh, padding, dh), _out_size(w, kw, sw, padding, dw)

        def model(b):
            return single_op_model(
                "DEPTHWISE_CONV_2D", [x.shape, wt, b],
                options=dict(padding=padding, stride_h=sh, stride_w=sw, depth_multiplier=mult,
                             dilation_h_factor=dh, dilation_w_factor=dw, fused_activation_function=act),
                output_shapes=[(1, oh, ow, cin * mult)])
        if bias:
            return Built(model(rng.standard_normal(cin * mult).astype(F32)), [x])
        return Built(model(None), [x], oracle_model=model(np.zeros(cin * mult, F32)))
    return build


def pool(op, h, w, c, kh, kw, sh, sw, padding, act="NONE"):
    def build(rng):
        x = rng.standard_normal((1, h, w, c)).astype(F32)
        oh, ow = _out_size(h, kh, sh, padding), _out_size(w, kw, sw, padding)
        m = single_op_model(
            op, [x.shape],
            options=dict(padding=padding, stride_h=sh, stride_w=sw, filter_height=kh,
                         filter_width=kw, fused_activation_function=act),
            output_shapes=[(1, oh, ow, c)])
        return Built(m, [x])
    return build


def transpose_conv_bias(h, w, cin, cout, kh, kw, sh, sw, padding):
    """MediaPipe's custom Convolution2DTransposeBias (input, weights [O,H,W,I], bias)."""
    def build(rng):
        x = rng.standard_normal((1, h, w, cin)).astype(F32)
        wt = rng.standard_normal((cout, kh, kw, cin)).astype(F32)
        b = rng.standard_normal(cout).astype(F32)
        if padding == "SAME":
            oh, ow = h * sh, w * sw
        else:
            oh, ow = (h - 1) * sh + kh, (w - 1) * sw + kw
        m = single_op_model(
            "Convolution2DTransposeBias", [x.shape, wt, b], custom=True,
            custom_options=transpose_conv_bias_options(padding, stride_w=sw, stride_h=sh),
            output_shapes=[(1, oh, ow, cout)])
        return Built(m, [x])
    return build


SIZES = [(7, 7), (8, 8), (6, 9)]  # odd, even, mixed (SAME stride 2 pads differently)
PADDINGS = ["SAME", "VALID"]

CONV_CASES = [
    *[Case(f"conv2d-{p}-s2-k3-{h}x{w}", conv2d(h, w, 3, 4, 3, 3, 2, 2, p)) for h, w in SIZES for p in PADDINGS],
    Case("conv2d-SAME-s2-k2-7x7", conv2d(7, 7, 3, 4, 2, 2, 2, 2, "SAME")),
    Case("conv2d-SAME-s2-k5-8x8", conv2d(8, 8, 3, 4, 5, 5, 2, 2, "SAME")),
    Case("conv2d-SAME-k3x2-s1x2-7x8", conv2d(7, 8, 3, 4, 3, 2, 1, 2, "SAME")),
    Case("conv2d-VALID-k1-s1-nobias", conv2d(5, 6, 4, 3, 1, 1, 1, 1, "VALID", bias=False)),
    Case("conv2d-SAME-dil2", conv2d(9, 9, 3, 4, 3, 3, 1, 1, "SAME", dh=2, dw=2)),
    Case("conv2d-VALID-dil2x3", conv2d(9, 10, 3, 4, 3, 3, 1, 1, "VALID", dh=2, dw=3)),
    Case("conv2d-grouped-6in-2per-group", conv2d(6, 6, 6, 6, 3, 3, 1, 1, "SAME", groups=3)),
    Case("conv2d-grouped-4in-2groups-3out-per-group-s2", conv2d(7, 7, 4, 6, 3, 3, 2, 2, "SAME", groups=2)),
]

DEPTHWISE_CASES = [
    *[Case(f"depthwise-{p}-s2-k3-{h}x{w}", depthwise(h, w, 3, 1, 3, 3, 2, 2, p)) for h, w in SIZES for p in PADDINGS],
    Case("depthwise-SAME-s2-k5-8x8", depthwise(8, 8, 4, 1, 5, 5, 2, 2, "SAME")),
    Case("depthwise-SAME-k3x2-s1x2-7x8", depthwise(7, 8, 3, 1, 3, 2, 1, 2, "SAME")),
    Case("depthwise-SAME-dil2", depthwise(9, 9, 3, 1, 3, 3, 1, 1, "SAME", dh=2, dw=2)),
    Case("depthwise-VALID-dil2x3", depthwise(9, 10, 3, 1, 3, 3, 1, 1, "VALID", dh=2, dw=3)),
    Case("depthwise-mult2-SAME", depthwise(6, 7, 3, 2, 3, 3, 1, 1, "SAME")),
    Case("depthwise-mult3-SAME-s2-nobias", depthwise(7, 7, 2, 3, 3, 3, 2, 2, "SAME", bias=False)),
]

POOL_CASES = [
    *[Case(f"{name}-{p}-s2-k3-{h}x{w}", pool(op, h, w, 3, 3, 3, 2, 2, p))
      for op, name in [("MAX_POOL_2D", "maxpool"), ("AVERAGE_POOL_2D", "avgpool")]
      for h, w in SIZES for p in PADDINGS],
    Case("maxpool-SAME-s2-k2-7x7", pool("MAX_POOL_2D", 7, 7, 3, 2, 2, 2, 2, "SAME")),
    Case("avgpool-SAME-s2-k2-7x7", pool("AVERAGE_POOL_2D", 7, 7, 3, 2, 2, 2, 2, "SAME")),
    Case("avgpool-SAME-s1-k3x2-5x6", pool("AVERAGE_POOL_2D", 5, 6, 2, 3, 2, 1, 1, "SAME")),
    Case("avgpool-VALID-global-8x8", pool("AVERAGE_POOL_2D", 8, 8, 5, 8, 8, 8, 8, "VALID")),
    Case("maxpool-SAME-s1-k3-relu6", pool("MAX_POOL_2D", 5, 5, 2, 3, 3, 1, 1, "SAME", act="RELU6")),
]

TRANSPOSE_CONV_CASES = [
    Case("transpose-conv-bias-SAME-k2-s2", transpose_conv_bias(5, 6, 3, 4, 2, 2, 2, 2, "SAME")),
    Case("transpose-conv-bias-SAME-k3-s2", transpose_conv_bias(5, 6, 3, 4, 3, 3, 2, 2, "SAME")),
    Case("transpose-conv-bias-SAME-k4-s2", transpose_conv_bias(4, 4, 2, 3, 4, 4, 2, 2, "SAME")),
    Case("transpose-conv-bias-VALID-k3-s2", transpose_conv_bias(5, 6, 3, 4, 3, 3, 2, 2, "VALID")),
    Case("transpose-conv-bias-SAME-k3-s1", transpose_conv_bias(5, 5, 3, 2, 3, 3, 1, 1, "SAME")),
]


# --- fused activations -----------------------------------------------------------

ACTIVATIONS = ["NONE", "RELU", "RELU_N1_TO_1", "RELU6", "TANH"]


def add(shape_a, shape_b, act="NONE", op="ADD", scale=4.0):
    def build(rng):
        a = (rng.standard_normal(shape_a) * scale).astype(F32)
        b = (rng.standard_normal(shape_b) * scale).astype(F32)
        out = np.broadcast_shapes(shape_a, shape_b)
        m = single_op_model(op, [shape_a, shape_b], options=dict(fused_activation_function=act),
                            output_shapes=[out])
        return Built(m, [a, b])
    return build


# inputs scaled (x4) so values fall on both sides of every clamp (+-1, 0, 6)
ACTIVATION_CASES = [
    *[Case(f"add-{a}", add((2, 3, 4, 5), (2, 3, 4, 5), a)) for a in ACTIVATIONS],
    *[Case(f"conv2d-{a}", conv2d(6, 6, 3, 4, 3, 3, 1, 1, "SAME", act=a, scale=2.0)) for a in ACTIVATIONS],
    Case("add-broadcast-RELU6", add((1, 4, 5, 3), (1, 1, 5, 1), "RELU6")),
    Case("mul-broadcast-NONE", add((1, 4, 5, 3), (3,), "NONE", op="MUL")),
    Case("depthwise-RELU6", depthwise(6, 6, 3, 1, 3, 3, 1, 1, "SAME", act="RELU6")),
]


# --- STRIDED_SLICE -----------------------------------------------------------------

SS_SHAPE = (3, 4, 5, 6)
# (id, begin, end, strides, masks, numpy index into x of shape SS_SHAPE)
STRIDED_SLICES = [
    ("basic", [0, 1, 1, 0], [3, 4, 5, 6], [1, 1, 2, 3], {}, np.s_[0:3, 1:4, 1:5:2, 0:6:3]),
    ("begin_mask", [2, 1, 3, 1], [3, 3, 5, 5], [1, 1, 1, 1], dict(begin_mask=0b0101),
     np.s_[:3, 1:3, :5, 1:5]),
    ("end_mask", [1, 1, 1, 1], [3, 0, 4, 0], [1, 1, 1, 2], dict(end_mask=0b1010),
     np.s_[1:3, 1:, 1:4, 1::2]),
    ("negative_indices", [-2, -3, 0, -4], [-1, -1, 5, 6], [1, 1, 1, 1], {},
     np.s_[-2:-1, -3:-1, 0:5, -4:6]),
    ("negative_strides", [2, 3, 4, 5], [0, 0, 0, 0], [-1, -1, -2, -3], {},
     np.s_[2:0:-1, 3:0:-1, 4:0:-2, 5:0:-3]),
    ("negative_strides_masks", [0, 0, 1, 4], [0, 0, 0, 0], [-1, -2, 1, -1],
     dict(begin_mask=0b0011, end_mask=0b1111), np.s_[::-1, ::-2, 1:, 4::-1]),
    ("negative_strides_negative_indices", [-1, -2, -1, -2], [-4, -5, -6, -7], [-2, -1, -3, -4], {},
     np.s_[-1:-4:-2, -2:-5:-1, -1:-6:-3, -2:-7:-4]),
    ("ellipsis_first", [0, 1], [0, 5], [1, 2], dict(ellipsis_mask=0b01), np.s_[..., 1:5:2]),
    ("ellipsis_middle", [1, 0, 2], [3, 0, 4], [1, 1, 1], dict(ellipsis_mask=0b010), np.s_[1:3, ..., 2:4]),
    ("new_axis", [0, 0, 1, 0, 0], [3, 0, 3, 5, 6], [1, 1, 1, 1, 1], dict(new_axis_mask=0b00010),
     np.s_[0:3, None, 1:3, 0:5, 0:6]),
    ("shrink_axis", [1, 0, 2, 0], [2, 4, 3, 6], [1, 1, 1, 1], dict(shrink_axis_mask=0b0101),
     np.s_[1, 0:4, 2, 0:6]),
    ("shrink_axis_negative", [0, 0, 0, -1], [3, 4, 5, 0], [1, 1, 1, 1], dict(shrink_axis_mask=0b1000),
     np.s_[0:3, 0:4, 0:5, -1]),
    ("shrink_with_masks_and_negative_stride", [0, 2, 1, 0], [0, 3, 4, 0], [-1, 1, 1, 2],
     dict(begin_mask=0b1001, end_mask=0b1001, shrink_axis_mask=0b0010), np.s_[::-1, 2, 1:4, ::2]),
    ("new_axis_and_ellipsis", [0, 0, 1], [0, 0, 3], [1, 1, 1], dict(new_axis_mask=0b001, ellipsis_mask=0b010),
     np.s_[None, ..., 1:3]),
    ("two_new_axes", [0, 1, 0], [0, 3, 0], [1, 1, 1], dict(new_axis_mask=0b101), np.s_[None, 1:3, None]),
    ("shrink_new_axis_ellipsis", [1, 0, 0], [2, 0, 0], [1, 1, 1],
     dict(shrink_axis_mask=0b001, new_axis_mask=0b010, ellipsis_mask=0b100), np.s_[1, None, ...]),
    # offset: end is relative to begin
    ("offset", [1, 0, 2, 1], [1, 4, 2, 3], [1, 1, 1, 1], dict(offset=True), np.s_[1:2, 0:4, 2:4, 1:4]),
]


def strided_slice(begin, end, strides, masks, index):
    def build(rng):
        x = rng.standard_normal(SS_SHAPE).astype(F32)
        expected = x[index]
        m = single_op_model(
            "STRIDED_SLICE",
            [x.shape, np.asarray(begin, np.int32), np.asarray(end, np.int32), np.asarray(strides, np.int32)],
            options=masks, output_shapes=[expected.shape])
        return Built(m, [x], numpy=[expected])
    return build


STRIDED_SLICE_CASES = [Case(f"strided-slice-{n}", strided_slice(b, e, s, mk, ix))
                       for n, b, e, s, mk, ix in STRIDED_SLICES]


# --- resize --------------------------------------------------------------------------

def resize_bilinear(in_hw, out_hw, align_corners=False, half_pixel_centers=False):
    def build(rng):
        x = rng.standard_normal((1, *in_hw, 2)).astype(F32)
        m = single_op_model(
            "RESIZE_BILINEAR", [x.shape, np.asarray(out_hw, np.int32)],
            options=dict(align_corners=align_corners, half_pixel_centers=half_pixel_centers),
            output_shapes=[(1, *out_hw, 2)])
        return Built(m, [x])
    return build


RESIZE_CASES = [
    Case(f"resize-bilinear-{mode}-{d}", resize_bilinear(i, o, **kw))
    for mode, kw in [("default", {}), ("align_corners", dict(align_corners=True)),
                     ("half_pixel_centers", dict(half_pixel_centers=True))]
    for d, i, o in [("up", (5, 6), (9, 13)), ("down", (9, 8), (4, 5)), ("up2x", (4, 4), (8, 8)),
                    ("down-to-1x3", (5, 6), (1, 3))]  # one output row: align_corners' (in-1)/(out-1) is undefined
]


# --- other ops -----------------------------------------------------------------------------

def fully_connected(in_shape, units, in_features=None, bias=True, keep_num_dims=False, act="NONE"):
    def build(rng):
        x = rng.standard_normal(in_shape).astype(F32)
        i = in_features or in_shape[-1]
        wt = rng.standard_normal((units, i)).astype(F32)
        b = rng.standard_normal(units).astype(F32) if bias else None
        if keep_num_dims:
            out = (*in_shape[:-1], units)
        else:
            out = (int(np.prod(in_shape)) // i, units)
        m = single_op_model("FULLY_CONNECTED", [x.shape, wt, b],
                            options=dict(keep_num_dims=keep_num_dims, fused_activation_function=act),
                            output_shapes=[out])
        expected = x.reshape(-1, i) @ wt.T.astype(np.float64) + (b if bias else 0)
        if act == "RELU":
            expected = np.maximum(expected, 0)
        return Built(m, [x], numpy=[expected.reshape(out)])
    return build


def unary(op, shape, scale=4.0):
    def build(rng):
        x = (rng.standard_normal(shape) * scale).astype(F32)
        return Built(single_op_model(op, [shape]), [x])
    return build


def mean(in_shape, axes, keep_dims):
    def build(rng):
        x = rng.standard_normal(in_shape).astype(F32)
        expected = x.astype(np.float64).mean(axis=tuple(axes), keepdims=keep_dims)
        m = single_op_model("MEAN", [x.shape, np.asarray(axes, np.int32)],
                            options=dict(keep_dims=keep_dims), output_shapes=[expected.shape])
        return Built(m, [x], numpy=[expected])
    return build


def pad(in_shape, paddings):
    def build(rng):
        x = rng.standard_normal(in_shape).astype(F32)
        expected = np.pad(x, paddings)
        m = single_op_model("PAD", [x.shape, np.asarray(paddings, np.int32)], output_shapes=[expected.shape])
        return Built(m, [x], numpy=[expected])
    return build


def prelu(in_shape, alpha_shape):
    def build(rng):
        x = rng.standard_normal(in_shape).astype(F32)
        alpha = rng.uniform(0.05, 0.5, alpha_shape).astype(F32)
        expected = np.where(x >= 0, x, alpha * x)
        m = single_op_model("PRELU", [x.shape, alpha], output_shapes=[x.shape])
        return Built(m, [x], numpy=[expected])
    return build


def depth_to_space(in_shape, block):
    def build(rng):
        n, h, w, c = in_shape
        x = rng.standard_normal(in_shape).astype(F32)
        oc = c // (block * block)
        expected = (x.reshape(n, h, w, block, block, oc).transpose(0, 1, 3, 2, 4, 5)
                    .reshape(n, h * block, w * block, oc))
        m = single_op_model("DEPTH_TO_SPACE", [x.shape], options=dict(block_size=block),
                            output_shapes=[expected.shape])
        return Built(m, [x], numpy=[expected])
    return build


def concatenation(shapes, axis, act="NONE"):
    def build(rng):
        xs = [(rng.standard_normal(s) * 4).astype(F32) for s in shapes]
        expected = np.concatenate(xs, axis=axis)
        if act == "RELU6":
            expected = np.clip(expected, 0, 6)
        m = single_op_model("CONCATENATION", list(shapes),
                            options=dict(axis=axis, fused_activation_function=act),
                            output_shapes=[expected.shape])
        return Built(m, xs, numpy=[expected])
    return build


def reshape(in_shape, new_shape, as_input=True, as_option=False):
    def build(rng):
        x = rng.standard_normal(in_shape).astype(F32)
        expected = x.reshape(new_shape)
        ins = [x.shape] + ([np.asarray(new_shape, np.int32)] if as_input else [])
        opts = dict(new_shape=list(new_shape)) if as_option else None
        m = single_op_model("RESHAPE", ins, options=opts, output_shapes=[expected.shape])
        return Built(m, [x], numpy=[expected])
    return build


def dequantize_fp16_add(shape):
    """float16 constant -> DEQUANTIZE -> ADD with the model input."""
    def build(rng):
        x = rng.standard_normal(shape).astype(F32)
        c = rng.standard_normal(shape).astype(np.float16)
        b = TFLiteBuilder()
        xi = b.add_input(shape, name="x")
        ci = b.add_tensor(data=c, name="c_fp16")
        cf = b.add_tensor(shape, name="c_fp32")
        y = b.add_tensor(shape, name="y")
        b.add_op("DEQUANTIZE", [ci], [cf])
        b.add_op("ADD", [xi, cf], [y], options=dict(fused_activation_function="NONE"))
        b.add_output(y)
        return Built(b.build(), [x], numpy=[x + c.astype(F32)])
    return build


def dequantize_fp16_conv():
    """float16 weights and bias -> DEQUANTIZE -> CONV_2D, as fp16 MediaPipe models are written."""
    def build(rng):
        x = rng.standard_normal((1, 6, 7, 3)).astype(F32)
        wt = rng.standard_normal((4, 3, 3, 3)).astype(np.float16)
        bias = rng.standard_normal(4).astype(np.float16)
        b = TFLiteBuilder()
        xi = b.add_input(x.shape, name="x")
        w16 = b.add_tensor(data=wt, name="w_fp16")
        b16 = b.add_tensor(data=bias, name="b_fp16")
        w32 = b.add_tensor(wt.shape, name="w")
        b32 = b.add_tensor(bias.shape, name="b")
        y = b.add_tensor((1, 3, 4, 4), name="y")
        b.add_op("DEQUANTIZE", [w16], [w32])
        b.add_op("DEQUANTIZE", [b16], [b32])
        b.add_op("CONV_2D", [xi, w32, b32], [y],
                 options=dict(padding="SAME", stride_h=2, stride_w=2, fused_activation_function="RELU"))
        b.add_output(y)
        return Built(b.build(), [x])
    return build


OTHER_CASES = [
    Case("fully-connected-2d-bias", fully_connected((3, 4), 5)),
    Case("fully-connected-2d-nobias", fully_connected((3, 4), 5, bias=False)),
    Case("fully-connected-3d-keep-num-dims", fully_connected((2, 3, 4), 5, keep_num_dims=True)),
    Case("fully-connected-3d-keep-num-dims-nobias", fully_connected((2, 3, 4), 5, bias=False, keep_num_dims=True)),
    Case("fully-connected-3d-flatten", fully_connected((2, 3, 4), 5)),
    Case("fully-connected-3d-flatten-to-12-features", fully_connected((2, 3, 4), 5, in_features=12)),
    Case("fully-connected-4d-flatten-relu", fully_connected((1, 2, 2, 4), 5, act="RELU")),
    Case("mean-hw-keep-dims", mean((1, 5, 6, 3), [1, 2], True)),
    Case("mean-hw-no-keep-dims", mean((1, 5, 6, 3), [1, 2], False)),
    Case("mean-last-negative-axis", mean((2, 5, 6), [-1], False)),
    Case("mean-all-keep-dims", mean((2, 3, 4), [0, 1, 2], True)),
    Case("pad-4d", pad((1, 4, 5, 3), [[0, 0], [1, 2], [2, 0], [0, 1]])),
    Case("pad-2d", pad((3, 4), [[2, 1], [0, 3]])),
    Case("prelu-alpha-per-channel", prelu((1, 4, 5, 3), (1, 1, 3))),
    Case("prelu-alpha-full", prelu((1, 4, 5, 3), (4, 5, 3))),
    Case("depth-to-space-b2", depth_to_space((1, 3, 4, 8), 2)),
    Case("depth-to-space-b3", depth_to_space((2, 2, 3, 18), 3)),
    Case("concatenation-channels", concatenation([(1, 2, 3, 1), (1, 2, 3, 2), (1, 2, 3, 3)], 3)),
    Case("concatenation-axis1", concatenation([(1, 1, 3, 2), (1, 2, 3, 2)], 1)),
    Case("concatenation-negative-axis", concatenation([(2, 3), (2, 4)], -1)),
    Case("reshape-shape-input", reshape((2, 3, 4), (4, -1))),
    Case("reshape-shape-input-rank1", reshape((2, 3, 4), (24,))),
    Case("reshape-options-only", reshape((2, 3, 4), (6, 4), as_input=False, as_option=True)),
    Case("hard-swish", unary("HARD_SWISH", (2, 3, 7))),
    Case("logistic", unary("LOGISTIC", (2, 3, 7))),
    Case("dequantize-fp16-add", dequantize_fp16_add((2, 3, 4))),
    Case("dequantize-fp16-conv-weights", dequantize_fp16_conv()),
]

ALL_CASES = (CONV_CASES + DEPTHWISE_CASES + POOL_CASES + TRANSPOSE_CONV_CASES + ACTIVATION_CASES
             + STRIDED_SLICE_CASES + RESIZE_CASES + OTHER_CASES)
