"""TFLite builtin ops for the numpy reference interpreter, plus shared helpers.

The op functions live in the family modules (``elementwise``, ``conv``,
``pool``, ``shape``, ``reduce``, ``quant``, ``resize``, ``custom``), which
:mod:`fbjax.reference` imports explicitly. This package only holds what
several families share: fused activations, window geometry (TF SAME/VALID
padding), kernel-tap extraction, and the refusal of quantized integer kernels.

Everything here is plain numpy, written independently of :mod:`fbjax.lower`.
"""

from __future__ import annotations

import numpy as np

from ...errors import UnsupportedOperatorError

#: ``ActivationFunctionType`` names, in schema order.
ACTIVATIONS = ("NONE", "RELU", "RELU_N1_TO_1", "RELU6", "TANH", "SIGN_BIT")


def fused_activation(ctx, x: np.ndarray, name: str) -> np.ndarray:
    """Apply a fused activation the way TFLite's float/int32 kernels do.

    TFLite clamps to ``CalculateActivationRange(activation)`` (kernel_util.h):
    RELU -> [0, inf), RELU6 -> [0, 6], RELU_N1_TO_1 -> [-1, 1]. Every other
    value, TANH and SIGN_BIT included, yields the unbounded range, so those two
    are *no-ops* in ADD/SUB/MUL/DIV/CONV_2D/DEPTHWISE_CONV_2D/FULLY_CONNECTED/
    pooling (checked against LiteRT 2.3.0, with and without XNNPACK). Only the
    recurrent kernels apply tanh/signbit, and none of them is implemented here.
    """
    if name in ("NONE", "TANH", "SIGN_BIT"):
        return x
    if name == "RELU":
        return np.maximum(x, 0)
    if name == "RELU6":
        return np.clip(x, 0, 6)
    if name == "RELU_N1_TO_1":
        return np.clip(x, -1, 1)
    raise ctx.error(f"unknown fused_activation_function {name!r}; expected one of {', '.join(ACTIVATIONS)}")


def reject_quantized(ctx) -> None:
    """Refuse quantized integer tensors: the reference only has float kernels.

    Computing an int8 kernel in float would silently disagree with TFLite's
    fixed-point rounding, which is worse for an oracle than refusing.
    """
    for v in list(ctx.inputs) + list(ctx.outputs):
        if v is not None and v.quant is not None and np.issubdtype(np.dtype(v.dtype), np.integer):
            raise UnsupportedOperatorError(
                [ctx.node.key],
                detail=(
                    f"{ctx.node.location}: tensor {v.name!r} is quantized {np.dtype(v.dtype).name}; "
                    "the numpy reference implements this op for float tensors only."
                ),
            )


def require_float(ctx, *arrays: np.ndarray) -> None:
    """Refuse non-float inputs to a float-only kernel."""
    reject_quantized(ctx)
    for a in arrays:
        if a is not None and not np.issubdtype(a.dtype, np.floating):
            raise UnsupportedOperatorError(
                [ctx.node.key],
                detail=f"{ctx.node.location}: {a.dtype.name} inputs are not supported by the numpy reference.",
            )


def to_out(ctx, y, i: int = 0) -> np.ndarray:
    """Cast a result (usually float64) to the dtype of node output ``i``."""
    return np.asarray(y).astype(ctx.out_dtype(i), copy=False)


def positive_int(ctx, name: str, value) -> int:
    """An attribute that must be an integer >= 1 (strides, dilations, sizes)."""
    v = int(value)
    if v < 1:
        raise ctx.error(f"{name} must be >= 1, got {v}")
    return v


def window_geometry(ctx, padding: str, size: int, k: int, stride: int, dilation: int = 1):
    """Output size and (before, after) padding of one spatial dim.

    TF convention (kernels/padding.h): SAME gives ``out = ceil(in / stride)``,
    VALID ``out = ceil((in - eff_k + 1) / stride)`` with
    ``eff_k = (k - 1) * dilation + 1``; the total padding is
    ``max((out - 1) * stride + eff_k - in, 0)`` with ``before = total // 2`` and
    the odd pixel after.

    Returns:
        ``(out, before, after)``.
    """
    eff = (k - 1) * dilation + 1
    if padding == "SAME":
        out = -(-size // stride)
    elif padding == "VALID":
        out = (size - eff) // stride + 1
    else:
        raise ctx.error(f"unknown padding {padding!r}; expected 'SAME' or 'VALID'")
    if out < 1:
        raise ctx.error(
            f"a window of {k} (dilation {dilation}) does not fit an input of {size} with {padding} padding"
        )
    total = max((out - 1) * stride + eff - size, 0)
    return out, total // 2, total - total // 2


def nhwc_taps(x: np.ndarray, kh: int, kw: int, sh: int, sw: int, dh: int, dw: int,
              pads, out_hw, fill=0.0):
    """Yield ``(i, j, tap)`` for each kernel tap of a 2-D window over NHWC ``x``.

    ``tap[n, y, x, c] = xpad[n, y*sh + i*dh, x*sw + j*dw, c]`` where ``xpad`` is
    ``x`` padded with ``fill`` by ``pads = ((top, bottom), (left, right))``.
    This is im2col one tap at a time: each tap is a strided view, no per-pixel
    Python loop.
    """
    (pt, pb), (pl, pr) = pads
    oh, ow = out_hw
    xp = np.pad(x, ((0, 0), (pt, pb), (pl, pr), (0, 0)), constant_values=fill)
    for i in range(kh):
        for j in range(kw):
            y0, x0 = i * dh, j * dw
            yield i, j, xp[:, y0:y0 + (oh - 1) * sh + 1:sh, x0:x0 + (ow - 1) * sw + 1:sw, :]
