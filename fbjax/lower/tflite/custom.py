"""MediaPipe custom ops found in TFLite files (op set ``tflite.custom``)."""

from __future__ import annotations

from .. import kernels
from ..registry import register
from .elementwise import require_unquantized


@register("tflite.custom", "Convolution2DTransposeBias")
def Convolution2DTransposeBias(ctx, x, w, b=None, *, padding="SAME", stride_w=1, stride_h=1):
    """MediaPipe ``Convolution2DTransposeBias``
    (``mediapipe/util/tflite/operations/transpose_conv_bias.cc``): transposed
    convolution plus bias.

    ``x`` NHWC ``[N, H, W, I]``, ``w`` ``[O, KH, KW, I]``, ``b`` ``[O]``.
    Output size per TF rules: ``SAME`` ``in * stride``, ``VALID``
    ``(in - 1) * stride + k`` -- or the file's recorded output size when it
    exceeds that by less than a stride (the extra positions hold only the
    bias), as XNNPACK does; padding before is the forward convolution's TF
    ``SAME`` padding of the output, ``max(k - stride, 0) // 2``, and 0 for
    ``VALID``. Returns ``[N, OH, OW, O]``.
    """
    require_unquantized(ctx, "Convolution2DTransposeBias")
    if x.ndim != 4 or w.ndim != 4:
        raise ctx.error(f"expected a 4-D input and 4-D OHWI weights, got shapes {x.shape} and {w.shape}")
    if w.shape[3] != x.shape[3]:
        raise ctx.error(f"weights expect {w.shape[3]} input channels, input has {x.shape[3]}")
    strides = (int(stride_h), int(stride_w))
    if min(strides) < 1:
        raise ctx.error(f"strides must be >= 1, got {strides}")
    ks = w.shape[1:3]
    if padding == "SAME":
        out = [i * s for i, s in zip(x.shape[1:3], strides)]
    elif padding == "VALID":
        out = [(i - 1) * s + k for i, s, k in zip(x.shape[1:3], strides, ks)]
    else:
        raise ctx.error(f"unsupported padding {padding!r} (expected 'SAME' or 'VALID')")
    # XNNPACK (LiteRT's only kernel for this op) sizes the output from the
    # file's output tensor: (out - k) % stride extra rows/cols of bias only.
    rec = ctx.outputs[0].shape if ctx.outputs and ctx.outputs[0] is not None else None
    if rec is not None and len(rec) == 4:
        for d in range(2):
            r = rec[1 + d]
            if r is not None and out[d] <= r < out[d] + strides[d]:
                out[d] = int(r)
    # Padding of the forward convolution that maps the output back to x.
    pads = kernels.explicit_padding(padding, out, ks, strides)
    y = kernels.conv_transpose(x, w, strides=strides, padding=pads, output_sizes=out,
                               dimension_numbers=("NHWC", "OHWI", "NHWC"), backend=getattr(ctx, "backend", None),
                               options=kernels.kernel_options(ctx))
    if b is not None:
        if tuple(b.shape) != (w.shape[0],):
            raise ctx.error(f"bias shape {tuple(b.shape)} does not match {w.shape[0]} output channels")
        y = y + b
    return y
