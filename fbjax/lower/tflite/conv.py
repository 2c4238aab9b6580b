"""TFLite convolutions and fully connected layers, float path, native layouts.

Activations stay NHWC and weights OHWI (``[1, H, W, C*M]`` for depthwise,
``[O, I]`` for fully connected); layouts are passed to XLA through
``dimension_numbers`` / ``dot_general`` contraction dims, never transposed.
Reference kernels: TFLite ``kernels/conv.cc``, ``depthwise_conv.cc``,
``fully_connected.cc`` and ``kernels/padding.h``.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from .. import kernels
from ..registry import register
from .elementwise import apply_fused, require_unquantized

# fully_connected.cc refuses TANH and SIGN_BIT.
_FC_ACTIVATIONS = ("NONE", "RELU", "RELU_N1_TO_1", "RELU6")


def _padding(ctx, padding, in_hw, k_hw, strides, dilations):
    try:
        return kernels.explicit_padding(padding, in_hw, k_hw, strides, dilations)
    except ValueError as e:
        raise ctx.error(str(e)) from None


def _check_positive(ctx, **values):
    for name, v in values.items():
        if int(v) < 1:
            raise ctx.error(f"{name} must be >= 1, got {v}")


def _add_bias(y, b):
    return y if b is None else y + b


@register("tflite", "CONV_2D", weights=((1, "OHWI"), (2, "O")), bias_scale=(1, 2, 0))
def CONV_2D(ctx, x, w, b=None, *, padding="SAME", stride_w=1, stride_h=1,
            dilation_w_factor=1, dilation_h_factor=1, fused_activation_function="NONE"):
    """TFLite CONV_2D (``kernels/conv.cc``), float.

    ``x`` NHWC ``[N, H, W, C_in]``, ``w`` OHWI ``[O, KH, KW, I]``, optional
    bias ``[O]``; when ``C_in = groups * I`` with ``groups > 1`` it is a
    grouped convolution. TF ``SAME``/``VALID`` padding. Returns
    ``[N, OH, OW, O]``. ``Model.__call__`` on CPU may pass ``w`` relaid to
    ``HWIO`` (:mod:`fbjax.executors.planner`); the layout is then read from
    :func:`fbjax.lower.kernels.weight_layout` and stated in the
    ``dimension_numbers``.
    """
    require_unquantized(ctx, "CONV_2D")
    _check_positive(ctx, stride_w=stride_w, stride_h=stride_h,
                    dilation_w_factor=dilation_w_factor, dilation_h_factor=dilation_h_factor)
    if x.ndim != 4 or w.ndim != 4:
        raise ctx.error(f"expected a 4-D input and 4-D OHWI weights, got shapes {x.shape} and {w.shape}")
    rhs = kernels.weight_layout(ctx, 1, "OHWI")  # HWIO when relaid for XLA:CPU (fbjax.executors.planner)
    c_in, o, i = x.shape[3], w.shape[rhs.index("O")], w.shape[rhs.index("I")]
    if i == 0 or c_in % i:
        raise ctx.error(f"input has {c_in} channels, not a multiple of the weights' {i} input channels")
    groups = c_in // i
    if o % groups:
        raise ctx.error(f"{o} output channels do not split into {groups} groups")
    if b is not None and tuple(b.shape) != (o,):
        raise ctx.error(f"bias shape {tuple(b.shape)} does not match {o} output channels")
    strides = (int(stride_h), int(stride_w))
    dil = (int(dilation_h_factor), int(dilation_w_factor))
    k_hw = (w.shape[rhs.index("H")], w.shape[rhs.index("W")])
    pads = _padding(ctx, padding, x.shape[1:3], k_hw, strides, dil)
    y = kernels.conv(x, w, window_strides=strides, padding=pads, rhs_dilation=dil,
                     dimension_numbers=("NHWC", rhs, "NHWC"), feature_group_count=groups, backend=getattr(ctx, "backend", None),
                     options=kernels.kernel_options(ctx))
    return apply_fused(ctx, _add_bias(y, b), fused_activation_function)


@register("tflite", "DEPTHWISE_CONV_2D", bias_scale=(1, 2, 0))
def DEPTHWISE_CONV_2D(ctx, x, w, b=None, *, padding="SAME", stride_w=1, stride_h=1,
                      depth_multiplier=0, dilation_w_factor=1, dilation_h_factor=1,
                      fused_activation_function="NONE"):
    """TFLite DEPTHWISE_CONV_2D (``kernels/depthwise_conv.cc``), float.

    ``x`` NHWC ``[N, H, W, C]``, ``w`` ``[1, KH, KW, C*M]`` (output channel
    ``c*M + m`` reads input channel ``c``; the multiplier ``M`` comes from the
    shapes, ``depth_multiplier`` is redundant as in TFLite >= 2.0), optional
    bias ``[C*M]``. Returns ``[N, OH, OW, C*M]``. The strategy (grouped conv
    or shifted multiply-adds) follows :func:`fbjax.lower.kernels.depthwise_conv`.
    """
    require_unquantized(ctx, "DEPTHWISE_CONV_2D")
    _check_positive(ctx, stride_w=stride_w, stride_h=stride_h,
                    dilation_w_factor=dilation_w_factor, dilation_h_factor=dilation_h_factor)
    if x.ndim != 4 or w.ndim != 4 or w.shape[0] != 1:
        raise ctx.error(f"expected a 4-D input and [1, H, W, C*M] weights, got shapes {x.shape} and {w.shape}")
    c, oc = x.shape[3], w.shape[3]
    if c == 0 or oc % c:
        raise ctx.error(f"weights have {oc} output channels, not a multiple of the input's {c}")
    if b is not None and tuple(b.shape) != (oc,):
        raise ctx.error(f"bias shape {tuple(b.shape)} does not match {oc} output channels")
    strides = (int(stride_h), int(stride_w))
    dil = (int(dilation_h_factor), int(dilation_w_factor))
    pads = _padding(ctx, padding, x.shape[1:3], w.shape[1:3], strides, dil)
    y = kernels.depthwise_conv(
        x, w[0], window_strides=strides, padding=pads, rhs_dilation=dil, lhs_spec="NHWC",
        backend=getattr(ctx, "backend", None), options=kernels.kernel_options(ctx),
    )
    return apply_fused(ctx, _add_bias(y, b), fused_activation_function)


@register("tflite", "FULLY_CONNECTED", weights=((1, "OI"), (2, "O")), bias_scale=(1, 2, 0))
def FULLY_CONNECTED(ctx, x, w, b=None, *, fused_activation_function="NONE", weights_format="DEFAULT",
                    keep_num_dims=False, asymmetric_quantize_inputs=False):
    """TFLite FULLY_CONNECTED (``kernels/fully_connected.cc``), float.

    ``w`` is ``[O, I]``, ``b`` optional ``[O]``. Without ``keep_num_dims`` the
    input is flattened to ``[-1, I]`` and the result is ``[-1, O]``; with it
    the leading dims are kept: ``[..., O]``.
    """
    require_unquantized(ctx, "FULLY_CONNECTED")
    if weights_format != "DEFAULT":
        raise ctx.error(f"weights_format {weights_format} is only defined for quantized weights")
    if w.ndim != 2:
        raise ctx.error(f"weights must be 2-D [O, I], got shape {tuple(w.shape)}")
    o, i = w.shape
    x = jnp.asarray(x)
    if x.ndim == 0 or i == 0 or x.size % i:
        raise ctx.error(f"input of shape {tuple(x.shape)} does not flatten to rows of {i}")
    if keep_num_dims:
        if x.shape[-1] != i:
            raise ctx.error(f"keep_num_dims: input's last dim {x.shape[-1]} != weights' {i}")
        lead = x.shape[:-1]
        x2 = x.reshape(-1, i)
    else:
        lead = (x.size // i,)
        x2 = x.reshape(lead[0], i)
    if b is not None and tuple(b.shape) != (o,):
        raise ctx.error(f"bias shape {tuple(b.shape)} does not match {o} output units")
    y = lax.dot_general(x2, w, (((1,), (1,)), ((), ())), precision=kernels.precision(ctx),
                        preferred_element_type=kernels.accumulation_dtype(x2, w))
    y = _add_bias(y, b).reshape(tuple(lead) + (o,))
    return apply_fused(ctx, y, fused_activation_function, allowed=_FC_ACTIVATIONS)
