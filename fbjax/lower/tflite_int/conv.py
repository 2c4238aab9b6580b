"""Integer-exact TFLite convolutions and matrix products (op set ``"tflite.int"``).

``acc = sum((q_in - zp_in) * (q_w - zp_w)) + bias`` in int32 (int64 for
16x8: int16 activations with int64 bias), rescaled per output channel with
``MultiplyByQuantizedMultiplier`` (double rounding; the int64 overload for
16x8), plus the output zero point, clamped to the fused activation's range
(TFLite ``reference_integer_ops::ConvPerChannel``, ``DepthwiseConvPerChannel``,
``FullyConnected``, ``TransposeConv``, ``reference_ops::BatchMatMul``).
Layouts are native (NHWC activations, OHWI weights) as in the float path.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import kernels
from ..registry import register
from . import fixedpoint as fp
from . import rounding
from ._common import (activation_range, clamp_cast, conv_multipliers, mbqm64, out_dtype, qparams,
                      require_x64, scale_zp)

OP_SET = "tflite.int"
_NHWC_OHWI = ("NHWC", "OHWI", "NHWC")

#: 8-bit CONV_2D, DEPTHWISE_CONV_2D and FULLY_CONNECTED: reproduce the builtin x86
#: kernels, whose gemm output stage rounds the final right shift's ties toward
#: +inf (:func:`.fixedpoint.mbqm` with ``ties_up``); False: the reference kernels'
#: ``RoundingDivideByPOT`` (ties away from zero), i.e. ``BUILTIN_REF``.
GEMM_ROUNDING = True


def _wide(ctx, what):
    """Accumulator dtype: int32, or int64 for int16 activations."""
    if np.dtype(ctx.inputs[0].dtype) == np.int16 or np.dtype(ctx.outputs[0].dtype) == np.int16:
        require_x64(ctx, what)
        return jnp.int64
    return jnp.int32


def _centered(ctx, x, v, acc, what):
    s, z = qparams(ctx, v, what)
    if z.size != 1:
        if np.any(z != z[0]):
            raise ctx.error(f"{what} has per-channel zero points, which TFLite does not support here")
    x = lax.convert_element_type(jnp.asarray(x), np.dtype(acc))
    return lax.sub(x, np.dtype(acc).type(int(z[0]))) if int(z[0]) else x


def _weights(ctx, w, v, acc):
    """Weights minus their zero point(s) (per-channel zero points broadcast
    along ``quantized_dimension``)."""
    s, z = qparams(ctx, v, "weights")
    w = lax.convert_element_type(jnp.asarray(w), np.dtype(acc))
    if not np.any(z):
        return w
    if z.size == 1:
        return lax.sub(w, np.dtype(acc).type(int(z[0])))
    shape = [1] * w.ndim
    shape[v.quant.quantized_dimension] = z.size
    return w - jnp.asarray(z.reshape(shape)).astype(acc)


def _requantize(ctx, acc, channels, fused, *, float_product=False, channel_axis=-1, int64_rescale=True,
                gemm_rounding=False, wide_gemm=False):
    """acc (int32/int64, channels along ``channel_axis``) -> output dtype.

    ``gemm_rounding``: an int32 accumulator's final shift rounds ties up
    (the gemm output stage) instead of away from zero; a bool, or a numpy
    bool per channel (the depthwise kernel's vector body and scalar tail).
    ``wide_gemm``: a 16x8 accumulator without an int64 bias is rescaled by
    the gemm output stage (ties of the final shift up) rather than
    ``RoundingDivideByPOT`` (LiteRT's int16 FULLY_CONNECTED)."""
    in_v, w_v, out_v = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
    mult, shift = conv_multipliers(ctx, in_v, w_v, out_v, channels, float_product=float_product)
    if channel_axis != -1:
        raise ValueError("channel axis must be last")
    _, z_out = scale_zp(ctx, out_v, "output")
    lo, hi = activation_range(ctx, fused, out_v)
    if acc.dtype == jnp.int64 and int64_rescale:
        y = mbqm64(acc, mult, shift)
        return clamp_cast(y + jnp.int32(z_out), lo, hi, out_dtype(ctx))
    if acc.dtype == jnp.int64:
        # 16x8 without an int64 bias: TFLite accumulates in int32 and uses
        # the 32-bit (double rounding) rescale; FULLY_CONNECTED's goes
        # through the gemm output stage, whose final shift rounds ties up
        # (verified on the a16w8 encoder: ties away were one step off on
        # -0.5 ties)
        acc, gemm_rounding = acc.astype(jnp.int32), wide_gemm
    return fp.requantize(acc, mult, shift, ties_up=gemm_rounding, offset=z_out, clamp=(lo, hi),
                         dtype=out_dtype(ctx))


def _int64_bias(ctx, pos):
    v = ctx.inputs[pos] if len(ctx.inputs) > pos else None
    return v is not None and np.dtype(v.dtype) == np.int64


def _bias(ctx, b, acc_dtype):
    return None if b is None else lax.convert_element_type(jnp.asarray(b), np.dtype(acc_dtype))


def _add_bias(acc, b):
    """``acc + b``, ``b`` along the last axis (one broadcast, no ``jnp`` dispatch)."""
    if b is None:
        return acc
    return lax.add(acc, lax.broadcast_in_dim(b, acc.shape, tuple(range(acc.ndim - b.ndim, acc.ndim))))


def _padding(ctx, padding, in_hw, k_hw, strides, dil):
    try:
        return kernels.explicit_padding(padding, in_hw, k_hw, strides, dil)
    except ValueError as e:
        raise ctx.error(str(e)) from None


@register(OP_SET, "CONV_2D", differentiable=False, fq_rounding=rounding.conv)
def CONV_2D(ctx, x, w, b=None, *, padding="SAME", stride_w=1, stride_h=1,
            dilation_w_factor=1, dilation_h_factor=1, fused_activation_function="NONE"):
    """Quantized TFLite CONV_2D (``reference_integer_ops::ConvPerChannel``).

    ``x`` int8/int16 NHWC, ``w`` int8 OHWI (per-tensor or per-channel along
    ``O``), ``b`` int32 (int64 for 16x8) ``[O]``. Grouped when ``C_in`` is a
    multiple of ``I``. Padded taps contribute zero (they read ``zp_in``).
    """
    acc_t = _wide(ctx, "CONV_2D")
    if x.ndim != 4 or w.ndim != 4:
        raise ctx.error(f"expected 4-D input and OHWI weights, got {tuple(x.shape)} and {tuple(w.shape)}")
    c_in, o, i = x.shape[3], w.shape[0], w.shape[3]
    if i == 0 or c_in % i:
        raise ctx.error(f"input has {c_in} channels, not a multiple of the weights' {i}")
    strides = (int(stride_h), int(stride_w))
    dil = (int(dilation_h_factor), int(dilation_w_factor))
    pads = _padding(ctx, padding, x.shape[1:3], w.shape[1:3], strides, dil)
    xc = _centered(ctx, x, ctx.inputs[0], acc_t, "input")
    wc = _weights(ctx, w, ctx.inputs[1], acc_t)
    acc = lax.conv_general_dilated(xc, wc, strides, pads, rhs_dilation=dil, dimension_numbers=_NHWC_OHWI,
                                   feature_group_count=c_in // i, preferred_element_type=acc_t)
    acc = _add_bias(acc, _bias(ctx, b, acc_t))
    return _requantize(ctx, acc, o, fused_activation_function, int64_rescale=_int64_bias(ctx, 2),
                       gemm_rounding=GEMM_ROUNDING)


@register(OP_SET, "DEPTHWISE_CONV_2D", differentiable=False, fq_rounding=rounding.conv)
def DEPTHWISE_CONV_2D(ctx, x, w, b=None, *, padding="SAME", stride_w=1, stride_h=1, depth_multiplier=0,
                      dilation_w_factor=1, dilation_h_factor=1, fused_activation_function="NONE"):
    """Quantized TFLite DEPTHWISE_CONV_2D (``DepthwiseConvPerChannel``):
    weights ``[1, KH, KW, C*M]``, per-channel scales along dimension 3."""
    acc_t = _wide(ctx, "DEPTHWISE_CONV_2D")
    if x.ndim != 4 or w.ndim != 4 or w.shape[0] != 1:
        raise ctx.error(f"expected 4-D input and [1, H, W, C*M] weights, got {tuple(x.shape)}, {tuple(w.shape)}")
    c, oc = x.shape[3], w.shape[3]
    if c == 0 or oc % c:
        raise ctx.error(f"{oc} output channels are not a multiple of {c} input channels")
    strides = (int(stride_h), int(stride_w))
    dil = (int(dilation_h_factor), int(dilation_w_factor))
    pads = _padding(ctx, padding, x.shape[1:3], w.shape[1:3], strides, dil)
    xc = _centered(ctx, x, ctx.inputs[0], acc_t, "input")
    wc = _weights(ctx, w, ctx.inputs[1], acc_t)
    acc = kernels.depthwise_conv(xc, wc[0], window_strides=strides, padding=pads, rhs_dilation=dil,
                                 lhs_spec="NHWC", backend=getattr(ctx, "backend", None),
                                 options=kernels.kernel_options(ctx))
    acc = acc.astype(acc_t)
    acc = _add_bias(acc, _bias(ctx, b, acc_t))
    # the 8-channel vector body rounds the final shift's ties up, the scalar
    # tail (last C % 8 channels) away from zero (verified with LiteRT's
    # intermediates on 28- and 36-channel layers)
    ties_up = GEMM_ROUNDING and (np.arange(oc) < oc - oc % 8 if oc % 8 else True)
    return _requantize(ctx, acc, oc, fused_activation_function, int64_rescale=_int64_bias(ctx, 2),
                       gemm_rounding=ties_up)


@register(OP_SET, "FULLY_CONNECTED", differentiable=False, fq_rounding=rounding.conv)
def FULLY_CONNECTED(ctx, x, w, b=None, *, fused_activation_function="NONE", weights_format="DEFAULT",
                    keep_num_dims=False, asymmetric_quantize_inputs=False, quantized_bias_type=None):
    """Quantized TFLite FULLY_CONNECTED (``reference_integer_ops::FullyConnected``).

    ``w`` ``[O, I]`` int8; per-tensor multiplier from the float32 product
    ``s_in * s_w`` (``GetQuantizedConvolutionMultipler``), per-channel ones
    in double. int16 inputs with ``quantized_bias_type`` int64 (or an int64
    bias): the reference kernel's requantization in double,
    ``round(acc * s_in * s_w[c] / s_out)`` (``fully_connected.cc``
    ``FullyConnectedInt16``/``FullyConnectedPerChannelInt16``).
    """
    acc_t = _wide(ctx, "FULLY_CONNECTED")
    if weights_format != "DEFAULT":
        raise ctx.error(f"weights_format {weights_format} is not supported")
    if w.ndim != 2:
        raise ctx.error(f"weights must be [O, I], got {tuple(w.shape)}")
    o, i = w.shape
    x = jnp.asarray(x)
    if x.ndim == 0 or i == 0 or x.size % i:
        raise ctx.error(f"input of shape {tuple(x.shape)} does not flatten to rows of {i}")
    lead = tuple(x.shape[:-1]) if keep_num_dims else (x.size // i,)
    xc = _centered(ctx, x.reshape(-1, i), ctx.inputs[0], acc_t, "input")
    wc = _weights(ctx, w, ctx.inputs[1], acc_t)
    acc = lax.dot_general(xc, wc, (((1,), (1,)), ((), ())), preferred_element_type=acc_t)
    acc = _add_bias(acc, _bias(ctx, b, acc_t))
    if acc_t == jnp.int64 and _fc16_float_requant(ctx, quantized_bias_type):
        return _fc16_requant_float(ctx, acc, o, fused_activation_function).reshape(lead + (o,))
    per_tensor = (ctx.inputs[1].quant is not None and not ctx.inputs[1].quant.per_channel
                  and acc_t == jnp.int32)
    y = _requantize(ctx, acc, o, fused_activation_function, float_product=per_tensor,
                    int64_rescale=_int64_bias(ctx, 2), gemm_rounding=GEMM_ROUNDING, wide_gemm=GEMM_ROUNDING)
    return y.reshape(lead + (o,))


def _fc16_float_requant(ctx, quantized_bias_type) -> bool:
    """Whether LiteRT runs an int16 x int8 FULLY_CONNECTED through the
    reference kernel (float requantization) instead of the optimized int32
    one: non-zero zero points, an int64 bias, or the ``quantized_bias_type``
    option INT64."""
    zps = [qparams(ctx, v, what)[1] for v, what in ((ctx.inputs[0], "input"), (ctx.inputs[1], "weights"),
                                                      (ctx.outputs[0], "output"))]
    qbt = None if quantized_bias_type is None else np.dtype(quantized_bias_type)
    return any(np.any(z) for z in zps) or _int64_bias(ctx, 2) or qbt == np.dtype(np.int64)


def _fc16_requant_float(ctx, acc, channels, fused):
    """``round(double(acc) * (double(s_in) * double(s_w[c]) / double(s_out)))``
    (round half away from zero), plus the output zero point, clamped."""
    s_in, _ = scale_zp(ctx, ctx.inputs[0], "input")
    s_out, z_out = scale_zp(ctx, ctx.outputs[0], "output")
    s_w, _ = qparams(ctx, ctx.inputs[1], "weights")
    eff = np.array([float(s_in) * float(w) / float(s_out)
                    for w in np.broadcast_to(s_w, (channels,))], np.float64)
    v = acc.astype(jnp.float64) * jnp.asarray(eff)
    t = jnp.trunc(v)
    r = t + jnp.where(jnp.abs(v - t) >= 0.5, jnp.sign(v), 0.0)
    y = jnp.clip(r, -(2.0 ** 31), 2.0 ** 31 - 1).astype(jnp.int32)
    lo, hi = activation_range(ctx, fused, ctx.outputs[0])
    return clamp_cast(y + jnp.int32(z_out), lo, hi, out_dtype(ctx))


@register(OP_SET, "TRANSPOSE_CONV", differentiable=False, static_inputs=(0,), fq_rounding=rounding.transpose_conv)
def TRANSPOSE_CONV(ctx, output_shape, w, x, b=None, *, padding="SAME", stride_w=1, stride_h=1,
                   fused_activation_function="NONE"):
    """Quantized TFLite TRANSPOSE_CONV (``reference_integer_ops::TransposeConv``).

    ``out[n, i*s - pad + t, oc] += (x[n, i, ic] - zp_in) * w[oc, t, ic]``;
    padding from ``ComputePaddingHeightWidth`` on the output size. Computed
    as a dilated correlation with the spatially flipped kernel.
    """
    in_v = ctx.inputs[2]
    acc_t = jnp.int64 if np.dtype(in_v.dtype) == np.int16 else jnp.int32
    if acc_t == jnp.int64:
        require_x64(ctx, "TRANSPOSE_CONV")
    oshape = [int(d) for d in np.asarray(output_shape).reshape(-1)]
    if len(oshape) != 4 or x.ndim != 4 or w.ndim != 4:
        raise ctx.error(f"expected 4-D output_shape, input and OHWI weights, got {oshape}, {x.shape}, {w.shape}")
    strides = (int(stride_h), int(stride_w))
    pads = []
    for ax in range(2):
        k, s, out, n = w.shape[1 + ax], strides[ax], oshape[1 + ax], x.shape[1 + ax]
        before = _padding(ctx, padding, [out], [k], [s], [1])[0][0]
        lo = k - 1 - before
        hi = out - ((n - 1) * s + 1) - lo + k - 1
        pads.append((lo, hi))
    qx = _scaled_in(ctx, x, in_v, acc_t)
    wc = _weights(ctx, w, ctx.inputs[1], acc_t)[:, ::-1, ::-1, :]
    acc = lax.conv_general_dilated(qx, wc, (1, 1), pads, lhs_dilation=strides, dimension_numbers=_NHWC_OHWI,
                                   preferred_element_type=acc_t)
    acc = _add_bias(acc, _bias(ctx, b, acc_t))
    o = w.shape[0]
    s_in, _ = scale_zp(ctx, in_v, "input")
    mult, shift = conv_multipliers(ctx, in_v, ctx.inputs[1], ctx.outputs[0], o)
    _, z_out = scale_zp(ctx, ctx.outputs[0], "output")
    lo, hi = activation_range(ctx, fused_activation_function, ctx.outputs[0])
    if acc_t != jnp.int64:
        return fp.requantize(acc, mult, shift, offset=z_out, clamp=(lo, hi), dtype=out_dtype(ctx))
    return clamp_cast(mbqm64(acc, mult, shift) + jnp.int32(z_out), lo, hi, out_dtype(ctx))


def _scaled_in(ctx, x, v, acc_t):
    return _centered(ctx, x, v, acc_t, "input")


@register(OP_SET, "BATCH_MATMUL", differentiable=False, fq_rounding=rounding.product)
def BATCH_MATMUL(ctx, a, b, *, adj_x=False, adj_y=False, asymmetric_quantize_inputs=False):
    """Quantized TFLite BATCH_MATMUL (``reference_ops::BatchMatMul``):
    ``sum((a - zp_a) * (b - zp_b))`` over the contraction, rescaled by
    ``QuantizeMultiplier(s_a * s_b / s_out)`` (float32 arithmetic), broadcasting batch dims."""
    acc_t = _wide(ctx, "BATCH_MATMUL")
    a = _centered(ctx, a, ctx.inputs[0], acc_t, "lhs")
    b = _centered(ctx, b, ctx.inputs[1], acc_t, "rhs")
    if adj_x:
        a = jnp.swapaxes(a, -1, -2)
    if adj_y:
        b = jnp.swapaxes(b, -1, -2)
    if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-2]:
        raise ctx.error(f"shapes {tuple(a.shape)} and {tuple(b.shape)} do not contract")
    acc = jnp.matmul(a, b, preferred_element_type=acc_t)
    s_a, _ = scale_zp(ctx, ctx.inputs[0], "lhs")
    s_b, _ = scale_zp(ctx, ctx.inputs[1], "rhs")
    s_o, z_o = scale_zp(ctx, ctx.outputs[0], "output")
    real = float(np.float32(np.float32(s_a) * np.float32(s_b)) / np.float32(s_o))
    m, sh = fp.quantize_multiplier(real)
    lo, hi = activation_range(ctx, "NONE", ctx.outputs[0])
    if acc_t != jnp.int64:  # RoundingDivideByPOT here (verified on the transformer fixture)
        return fp.requantize(acc, m, sh, offset=z_o, clamp=(lo, hi), dtype=out_dtype(ctx))
    return clamp_cast(mbqm64(acc, m, sh) + jnp.int32(z_o), lo, hi, out_dtype(ctx))
