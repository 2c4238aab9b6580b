"""numpy twins of :mod:`fbjax.lower.onnx.conv`: direct (tap by tap) convolution
in float64, NCHW / OIHW, and matrix products."""

from __future__ import annotations

import itertools

import numpy as np

from ... import op_rules
from ..registry import register
from ._util import OP_SET, ints, out, pad_pairs, per_dim


def conv_nchw(x, w, strides, pads, dilations, groups):
    """Direct grouped convolution: x [N, C, *S], w [M, C/g, *K] -> [N, M, *O] (float64 or int64)."""
    n = x.ndim - 2
    acc_t = np.float64 if x.dtype.kind == "f" or w.dtype.kind == "f" else np.int64
    xp = np.pad(x.astype(acc_t), [(0, 0), (0, 0)] + [tuple(p) for p in pads])
    ksz = w.shape[2:]
    osz = [(xp.shape[2 + i] - (ksz[i] - 1) * dilations[i] - 1) // strides[i] + 1 for i in range(n)]
    N, C = x.shape[:2]
    M = w.shape[0]
    cg, mg = C // groups, M // groups
    y = np.zeros((N, M) + tuple(max(o, 0) for o in osz), acc_t)
    for g in range(groups):
        xs = xp[:, g * cg:(g + 1) * cg]
        ws = w[g * mg:(g + 1) * mg].astype(acc_t)
        for tap in itertools.product(*[range(k) for k in ksz]):
            sl = tuple(slice(t * d, t * d + (o - 1) * s + 1, s) for t, d, o, s in zip(tap, dilations, osz, strides))
            patch = xs[(slice(None), slice(None)) + sl]  # [N, cg, *O]
            y[:, g * mg:(g + 1) * mg] += np.einsum("nc...,mc->nm...", patch, ws[(slice(None), slice(None)) + tap])
    return y


def _conv_args(X, W, auto_pad, pads, groups, strides, dilations):
    n = X.ndim - 2
    strides, dilations = per_dim(strides, n), per_dim(dilations, n)
    pp = pad_pairs(auto_pad, pads, X.shape[2:], W.shape[2:], strides, dilations)
    return strides, pp, dilations, int(groups) or 1


@register(OP_SET, "Conv")
def Conv(ctx, X, W, B=None, *, auto_pad="Same", pads=None, groups=0, strides=None, dilations=None):
    """numpy ONNX ``Conv``."""
    s, p, d, g = _conv_args(X, W, auto_pad, pads, groups, strides, dilations)
    y = conv_nchw(np.asarray(X), np.asarray(W), s, p, d, g)
    if B is not None:
        y = y + np.asarray(B).reshape((1, -1) + (1,) * (y.ndim - 2))
    return out(ctx, y)


@register(OP_SET, "ConvInteger", out_dtype=op_rules.int32_out)
def ConvInteger(ctx, x, w, x_zero_point=None, w_zero_point=None, *, auto_pad="Same", pads=None, groups=0,
                strides=None, dilations=None):
    """numpy ONNX ``ConvInteger`` (int64 accumulation)."""
    xi = np.asarray(x, np.int64) - (np.asarray(x_zero_point, np.int64) if x_zero_point is not None else 0)
    wi = np.asarray(w, np.int64)
    if w_zero_point is not None:
        zp = np.asarray(w_zero_point, np.int64)
        wi = wi - (zp.reshape((-1,) + (1,) * (wi.ndim - 1)) if zp.ndim == 1 else zp)
    s, p, d, g = _conv_args(xi, wi, auto_pad, pads, groups, strides, dilations)
    return out(ctx, conv_nchw(xi, wi, s, p, d, g))


@register(OP_SET, "ConvTranspose")
def ConvTranspose(ctx, X, W, B=None, *, strides=None, auto_pad="NotSet", pads=None, groups=1,
                  output_padding=None):
    """numpy ONNX ``ConvTranspose`` by scattering each input tap (float64)."""
    X = np.asarray(X, np.float64)
    W = np.asarray(W, np.float64)
    n = X.ndim - 2
    s = per_dim(strides, n)
    g = int(groups) or 1
    op = ints(output_padding) or [0] * n
    ksz, ins = W.shape[2:], X.shape[2:]
    if auto_pad == "Same":
        pp = []
        for i, k, st, o in zip(ins, ksz, s, op):
            t = max(st * (i - 1) + o + k - i * st, 0)
            pp.append((t // 2, t - t // 2))
    else:
        p = ints(pads)
        p = p if any(p) else [0] * (2 * n)
        pp = [(p[i], p[i + n]) for i in range(n)]
    full = [st * (i - 1) + k + o for i, k, st, o in zip(ins, ksz, s, op)]
    N, C = X.shape[:2]
    cg, mg = C // g, W.shape[1]
    y = np.zeros((N, g * mg) + tuple(full))
    for gi in range(g):
        for tap in itertools.product(*[range(k) for k in ksz]):
            contrib = np.einsum("nc...,cm->nm...", X[:, gi * cg:(gi + 1) * cg],
                                W[(slice(gi * cg, (gi + 1) * cg), slice(None)) + tap])
            sl = tuple(slice(t, t + (i - 1) * st + 1, st) for t, i, st in zip(tap, ins, s))
            y[(slice(None), slice(gi * mg, (gi + 1) * mg)) + sl] += contrib
    crop = tuple(slice(a, f - b) for (a, b), f in zip(pp, full))
    y = y[(slice(None), slice(None)) + crop]
    if B is not None:
        y = y + np.asarray(B).reshape((1, -1) + (1,) * n)
    return out(ctx, y)


@register(OP_SET, "MatMul")
def MatMul(ctx, A, B):
    """numpy ONNX ``MatMul`` (float64)."""
    return out(ctx, np.matmul(np.asarray(A, np.float64), np.asarray(B, np.float64)))


@register(OP_SET, "MatMulInteger", out_dtype=op_rules.int32_out)
def MatMulInteger(ctx, A, B, a_zero_point=None, b_zero_point=None):
    """numpy ONNX ``MatMulInteger``."""
    a = np.asarray(A, np.int64)
    b = np.asarray(B, np.int64)
    if a_zero_point is not None:
        zp = np.asarray(a_zero_point, np.int64)
        a = a - (zp.reshape(-1, 1) if zp.ndim == 1 and zp.size > 1 else zp)
    if b_zero_point is not None:
        b = b - np.asarray(b_zero_point, np.int64)
    return out(ctx, a @ b)


@register(OP_SET, "Gemm")
def Gemm(ctx, A, B, C=None, *, alpha=0.0, beta=0.0, transpose_a=False, transpose_b=False):
    """numpy ONNX ``Gemm``."""
    a = np.asarray(A, np.float64)
    b = np.asarray(B, np.float64)
    y = alpha * ((a.T if transpose_a else a) @ (b.T if transpose_b else b))
    if C is not None:
        y = y + beta * np.asarray(C, np.float64)
    return out(ctx, y)


@register(OP_SET, "Einsum")
def Einsum(ctx, *Inputs, equation=""):
    """numpy ONNX ``Einsum``."""
    return out(ctx, np.einsum(equation.replace(" ", ""), *[np.asarray(x, np.float64) for x in Inputs]))
