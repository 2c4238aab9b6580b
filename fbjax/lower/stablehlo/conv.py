"""StableHLO windowed contractions: ``stablehlo.convolution`` and the
TensorFlow extension ``stablehlo.resize_bilinear`` of the prototype format."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ... import op_rules
from .. import kernels
from ._util import ints, out_shape, pairs, register

OP_SET = "stablehlo"


def _convolution_batch(node, carrying, batch) -> None:
    a = node.attrs
    if op_rules.carries(node, carrying)[1:2] == [True]:
        raise op_rules.refusal(node, "takes a batch-carrying kernel")
    if int(a.get("input_batch_dimension", 0)) != 0 or int(a.get("output_batch_dimension", 0)) != 0 \
            or int(a.get("batch_group_count", 1) or 1) != 1:
        raise op_rules.refusal(node, "does not keep the batch as dimension 0 (input/output_batch_dimension, "
                               "batch_group_count)")


@register(OP_SET, "stablehlo.convolution", batch=_convolution_batch)
def convolution(ctx, lhs, rhs, *, window_strides=None, padding=None, lhs_dilation=None, rhs_dilation=None,
                window_reversal=None, input_batch_dimension=0, input_feature_dimension=1,
                input_spatial_dimensions=(), kernel_input_feature_dimension=0,
                kernel_output_feature_dimension=1, kernel_spatial_dimensions=(), output_batch_dimension=0,
                output_feature_dimension=1, output_spatial_dimensions=(), feature_group_count=1,
                batch_group_count=1):
    """``stablehlo.convolution`` with any dimension numbers, in the operands'
    own layouts (``lax.conv_general_dilated`` with explicit dimension numbers,
    no transposes): strides, padding (may be negative), lhs (base) and rhs
    (window) dilation, window reversal (the kernel's spatial dims flagged
    true are reversed), feature and batch groups; the result type is the
    output tensor's. Depthwise convolutions (one input feature per group,
    same layout in and out) go through the shared
    :func:`fbjax.lower.kernels.depthwise_conv`, which picks shifted
    multiply-adds on CPU.

    Raises:
        ModelFormatError: dimension numbers inconsistent with the ranks.
    """
    isd, ksd, osd = ints(input_spatial_dimensions), ints(kernel_spatial_dimensions), ints(output_spatial_dimensions)
    n = len(isd)
    if len(ksd) != n or len(osd) != n or np.ndim(lhs) != n + 2 or np.ndim(rhs) != n + 2:
        raise ctx.error(
            f"spatial dimensions {isd} / {ksd} / {osd} do not fit operands of rank {np.ndim(lhs)} and {np.ndim(rhs)}"
        )
    rev = [bool(b) for b in np.asarray(window_reversal if window_reversal is not None else [], bool).reshape(-1)]
    flip = tuple(k for k, r in zip(ksd, rev) if r)
    if flip:
        rhs = lax.rev(rhs, flip)
    dn = lax.ConvDimensionNumbers(
        lhs_spec=(int(input_batch_dimension), int(input_feature_dimension)) + isd,
        rhs_spec=(int(kernel_output_feature_dimension), int(kernel_input_feature_dimension)) + ksd,
        out_spec=(int(output_batch_dimension), int(output_feature_dimension)) + osd,
    )
    ws = ints(window_strides) or (1,) * n
    ld = ints(lhs_dilation) or (1,) * n
    rd = ints(rhs_dilation) or (1,) * n
    fg, bg = int(feature_group_count) or 1, int(batch_group_count) or 1
    ib, if_, ob, of = int(input_batch_dimension), int(input_feature_dimension), int(output_batch_dimension), \
        int(output_feature_dimension)
    ki, ko = int(kernel_input_feature_dimension), int(kernel_output_feature_dimension)
    if (fg > 1 and bg == 1 and fg == lhs.shape[if_] and rhs.shape[ki] == 1 and all(d == 1 for d in ld)
            and (ib, if_, isd) == (ob, of, osd) and np.dtype(lhs.dtype) == np.dtype(rhs.dtype) == ctx.out_dtype(0)
            and np.issubdtype(ctx.out_dtype(0), np.floating)):
        # Depthwise: the shared kernel (shifted multiply-adds on CPU, where XLA's
        # grouped convolution is slow), in the input's own layout.
        order = sorted(range(n), key=lambda i: isd[i])  # spatial dims as they appear in the input
        letters = "DHWXYZUV"[:n] if n <= 8 else None
        if letters is not None:
            spec = [""] * (n + 2)
            spec[ib], spec[if_] = "N", "C"
            for j, i in enumerate(order):
                spec[isd[i]] = letters[j]
            w = jnp.transpose(rhs, tuple(ksd[i] for i in order) + (ko, ki))
            w = w.reshape(w.shape[:-1])
            pads = pairs(padding, n)
            return kernels.depthwise_conv(
                lhs, w, window_strides=[ws[i] for i in order], padding=[pads[i] for i in order],
                rhs_dilation=[rd[i] for i in order], lhs_spec="".join(spec), backend=ctx.backend,
                options=kernels.kernel_options(ctx),
            )
    return lax.conv_general_dilated(
        lhs, rhs, window_strides=ws, padding=pairs(padding, n), lhs_dilation=ld, rhs_dilation=rd,
        dimension_numbers=dn, feature_group_count=fg, batch_group_count=bg, preferred_element_type=ctx.out_dtype(0),
    )


@register(OP_SET, "stablehlo.resize_bilinear")
def resize_bilinear(ctx, images, size=None, *, align_corners=False, half_pixel_centers=False):
    """``RESIZE_BILINEAR`` of the prototype format (not a StableHLO spec op):
    TensorFlow ``ResizeBilinear`` on NHWC ``images``; the output size is the
    output tensor's H and W (``size``, if given, must agree). Source
    coordinates follow :func:`fbjax.lower.kernels.linear_resize_coords`.
    """
    oshape = out_shape(ctx)
    if np.ndim(images) != 4 or len(oshape) != 4:
        raise ctx.error(f"expects NHWC images, got rank {np.ndim(images)}")
    h, w = oshape[1], oshape[2]
    if size is not None and isinstance(size, np.ndarray) and tuple(int(s) for s in size.reshape(-1)) != (h, w):
        raise ctx.error(f"size input {size.tolist()} disagrees with the output shape {oshape}")
    ih, iw = int(images.shape[1]), int(images.shape[2])
    coords = [
        kernels.linear_resize_coords(ih, h, align_corners=bool(align_corners), half_pixel_centers=bool(half_pixel_centers)),
        kernels.linear_resize_coords(iw, w, align_corners=bool(align_corners), half_pixel_centers=bool(half_pixel_centers)),
    ]
    return kernels.resize_linear(images, (1, 2), coords).astype(ctx.out_dtype(0))
