"""ONNX convolutions and matrix products in native NCHW / OIHW layouts.

Convolutions go through :mod:`fbjax.lower.kernels` with
``dimension_numbers`` (``NCH``/``NCHW``/``NCDHW``): no transposes of
activations. Padding follows the RTen schema: ``auto_pad`` ``"Same"`` (the
schema default, also ONNX SAME_LOWER as written by rten-convert) is
computed as SAME_UPPER; ``"NotSet"`` uses ``pads`` laid out
``[begin_0, begin_1, ..., end_0, end_1, ...]``.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ... import op_rules
from .. import kernels
from ..registry import register
from ._util import OP_SET, ints, spatial_letters


def conv_padding(ctx, auto_pad, pads, in_sizes, k_sizes, strides, dilations):
    """``[(before, after)]`` per spatial dim from RTen ``auto_pad`` / ``pads``."""
    n = len(in_sizes)
    if auto_pad == "Same":
        return [kernels.same_padding(i, k, s, d) for i, k, s, d in zip(in_sizes, k_sizes, strides, dilations)]
    p = ints(pads)
    if not any(p):  # rten-convert writes [0, 0, 0, 0] when ONNX pads are absent, whatever the rank
        p = [0] * (2 * n)
    if len(p) != 2 * n:
        raise ctx.error(f"pads has {len(p)} values, expected {2 * n} for {n} spatial dimensions")
    return [(p[i], p[i + n]) for i in range(n)]


def _per_dim(ctx, name, v, n):
    v = ints(v) or [1] * n
    if (len(v) == 1 and n > 1) or (len(v) != n and all(x == 1 for x in v)):
        # rten-convert writes its default [1, 1] when ONNX strides/dilations are absent
        v = [v[0]] * n
    if len(v) != n:
        raise ctx.error(f"{name} has {len(v)} values, expected {n}")
    return v


def _conv(ctx, X, W, *, auto_pad, pads, groups, strides, dilations, preferred=None):
    X = jnp.asarray(X)
    n = X.ndim - 2
    if n < 1:
        raise ctx.error(f"input has rank {X.ndim}; Conv needs N, C and at least one spatial dim")
    if np.ndim(W) != X.ndim:
        raise ctx.error(f"weights {tuple(np.shape(W))} have rank {np.ndim(W)}, the input {tuple(X.shape)} "
                        f"rank {X.ndim}: they must match")
    sp = spatial_letters(n)
    strides = _per_dim(ctx, "strides", strides, n)
    dilations = _per_dim(ctx, "dilations", dilations, n)
    groups = int(groups) or 1  # schema default 0 means "not set"
    rhs = "OI" + sp
    if preferred is None and n == 2:
        rhs = kernels.weight_layout(ctx, 1, rhs)  # HWIO when relaid for XLA:CPU (fbjax.executors.planner)
    ksz = [int(W.shape[rhs.index(c)]) for c in sp]
    pad = conv_padding(ctx, auto_pad, pads, X.shape[2:], ksz, strides, dilations)
    C, w_in = X.shape[1], W.shape[rhs.index("I")]
    if C != w_in * groups:
        raise ctx.error(f"input has {C} channels but weights {tuple(W.shape)} with {groups} group(s) expect "
                        f"{w_in * groups}")
    if groups > 1 and groups == C and w_in == 1 and preferred is None and n == 2 and rhs[:2] == "OI":
        # Depthwise: the shared kernel picks the fast strategy per backend.
        w = jnp.transpose(jnp.asarray(W)[:, 0], (1, 2, 0))  # [kh, kw, C*M]
        return kernels.depthwise_conv(X, w, window_strides=strides, padding=pad, rhs_dilation=dilations,
                                      lhs_spec="NC" + sp, backend=getattr(ctx, "backend", None),
                                      options=kernels.kernel_options(ctx))
    dn = ("NC" + sp, rhs, "NC" + sp)
    if preferred is not None:
        return lax.conv_general_dilated(X, W, strides, pad, rhs_dilation=dilations, dimension_numbers=dn,
                                        feature_group_count=groups, preferred_element_type=preferred)
    return kernels.conv(X, W, window_strides=strides, padding=pad, dimension_numbers=dn,
                        rhs_dilation=dilations, feature_group_count=groups, backend=getattr(ctx, "backend", None),
                        options=kernels.kernel_options(ctx))


def _bias(y, B):
    if B is None:
        return y
    return y + jnp.reshape(B, (1, -1) + (1,) * (y.ndim - 2))


@register(OP_SET, "Conv", weights=((1, "OIHW"), (2, "O")))
def Conv(ctx, X, W, B=None, *, auto_pad="Same", pads=None, groups=0, strides=None, dilations=None):
    """ONNX ``Conv`` (1-3 spatial dims), NCHW input, OIHW weights, optional bias.

    Args:
        X: ``[N, C, *spatial]``; W: ``[M, C / groups, *kernel]``; B: ``[M]``.
        auto_pad: ``"Same"`` (schema default; SAME_UPPER) or ``"NotSet"``.
        groups: 0 (schema default, absent) is treated as 1.

    Returns:
        ``[N, M, *out_spatial]``.
    """
    y = _conv(ctx, X, W, auto_pad=auto_pad, pads=pads, groups=groups, strides=strides, dilations=dilations)
    return _bias(y, B)


@register(OP_SET, "ConvInteger", out_dtype=op_rules.int32_out, differentiable=False)
def ConvInteger(ctx, x, w, x_zero_point=None, w_zero_point=None, *, auto_pad="Same", pads=None, groups=0,
                strides=None, dilations=None):
    """ONNX ``ConvInteger``: int32 convolution of ``(x - x_zp)`` and ``(w - w_zp)``.

    Zero-point padding semantics: padded positions hold ``x_zp`` (they are
    zero after the subtraction), as in onnxruntime.
    """
    xi = jnp.asarray(x).astype(jnp.int32)
    wi = jnp.asarray(w).astype(jnp.int32)
    if x_zero_point is not None:
        xi = xi - jnp.asarray(x_zero_point).astype(jnp.int32)
    if w_zero_point is not None:
        zp = jnp.asarray(w_zero_point).astype(jnp.int32)
        wi = wi - (zp.reshape((-1,) + (1,) * (wi.ndim - 1)) if zp.ndim == 1 else zp)
    return _conv(ctx, xi, wi, auto_pad=auto_pad, pads=pads, groups=groups, strides=strides,
                 dilations=dilations, preferred=jnp.int32)


@register(OP_SET, "ConvTranspose")
def ConvTranspose(ctx, X, W, B=None, *, strides=None, auto_pad="NotSet", pads=None, groups=1,
                  output_padding=None):
    """ONNX ``ConvTranspose`` (dilations 1; rten-convert rejects others).

    Args:
        X: ``[N, C, *spatial]``; W: ``[C, M / groups, *kernel]``; B: ``[M]``.
        auto_pad: ``"NotSet"`` (schema default here) uses ``pads``;
            ``"Same"`` makes ``out = in * stride`` with the extra padding
            at the end (SAME_UPPER).
        output_padding: extra size added at the end of each spatial dim.

    Output size: ``stride * (in - 1) + output_padding + k - pad_begin - pad_end``.
    """
    X = jnp.asarray(X)
    W = jnp.asarray(W)
    n = X.ndim - 2
    if np.ndim(W) != X.ndim:
        raise ctx.error(f"weights {tuple(np.shape(W))} have rank {np.ndim(W)}, the input {tuple(X.shape)} "
                        f"rank {X.ndim}: they must match")
    sp = spatial_letters(n)
    strides = _per_dim(ctx, "strides", strides, n)
    groups = int(groups) or 1
    opad = ints(output_padding) or [0] * n
    ksz = [int(d) for d in W.shape[2:]]
    ins = [int(d) for d in X.shape[2:]]
    if auto_pad == "Same":
        pad = []
        for i, k, s, op in zip(ins, ksz, strides, opad):
            total = max(s * (i - 1) + op + k - i * s, 0)
            pad.append((total // 2, total - total // 2))
    else:
        p = ints(pads)
        if not any(p):
            p = [0] * (2 * n)
        if len(p) != 2 * n:
            raise ctx.error(f"pads has {len(p)} values, expected {2 * n}")
        pad = [(p[i], p[i + n]) for i in range(n)]
    outs = [s * (i - 1) + op + k - a - b for i, k, s, op, (a, b) in zip(ins, ksz, strides, opad, pad)]
    C = X.shape[1]
    if W.shape[0] != C:
        raise ctx.error(f"weights {tuple(W.shape)} do not match {C} input channels")
    if groups > 1:  # [C, M/g, k] -> [C/g, M, k]: group-major output channels
        cg, mg = C // groups, W.shape[1]
        W = W.reshape((groups, cg, mg) + tuple(ksz)).transpose((1, 0, 2) + tuple(range(3, 3 + n)))
        W = W.reshape((cg, groups * mg) + tuple(ksz))
    y = kernels.conv_transpose(X, W, strides=strides, padding=pad, output_sizes=outs,
                               dimension_numbers=("NC" + sp, "IO" + sp, "NC" + sp), feature_group_count=groups, backend=getattr(ctx, "backend", None),
                               options=kernels.kernel_options(ctx))
    return _bias(y, B)


def _matmul_batch(node, carrying, batch) -> None:
    ins = node.inputs
    carries = op_rules.carries(node, carrying)
    ra, rb = op_rules.rank(ins[0]), op_rules.rank(ins[1])
    if carries[1] and not (carries[0] and ra == rb and (ra or 0) >= 3):
        raise op_rules.refusal(node, "multiplies by a batch-carrying right operand that is not batched like the left")


@register(OP_SET, "MatMul", weights=((0, "MK"), (1, "KN")), batch=_matmul_batch)
def MatMul(ctx, A, B):
    """ONNX ``MatMul`` (numpy ``matmul`` semantics, float32 accumulation at full precision)."""
    return jnp.matmul(A, B, precision=kernels.precision(ctx), preferred_element_type=kernels.accumulation_dtype(A, B))


@register(OP_SET, "MatMulInteger", out_dtype=op_rules.int32_out, differentiable=False)
def MatMulInteger(ctx, A, B, a_zero_point=None, b_zero_point=None):
    """ONNX ``MatMulInteger``: int32 ``(A - a_zp) @ (B - b_zp)``; zero points per
    row of A / per column of B when 1-D."""
    a = jnp.asarray(A).astype(jnp.int32)
    b = jnp.asarray(B).astype(jnp.int32)
    if a_zero_point is not None:
        zp = jnp.asarray(a_zero_point).astype(jnp.int32)
        a = a - (zp.reshape(-1, 1) if zp.ndim == 1 and zp.size > 1 else zp)
    if b_zero_point is not None:
        b = b - jnp.asarray(b_zero_point).astype(jnp.int32)
    return jnp.matmul(a, b, preferred_element_type=jnp.int32)


def _gemm_batch(node, carrying, batch) -> None:
    if op_rules.carries(node, carrying)[1:2] == [True] or node.attrs.get("transpose_a"):
        raise op_rules.refusal(node, "contracts the batch dimension (transposed or batch-carrying operand)")


@register(OP_SET, "Gemm", weights=((0, "MK"), (1, "KN"), (2, "N")), batch=_gemm_batch)
def Gemm(ctx, A, B, C=None, *, alpha=0.0, beta=0.0, transpose_a=False, transpose_b=False):
    """ONNX ``Gemm``: ``alpha * A' @ B' + beta * C`` (schema defaults alpha = beta = 0;
    rten-convert writes ONNX's 1.0)."""
    A = jnp.asarray(A)
    B = jnp.asarray(B)
    if A.ndim != 2 or B.ndim != 2:
        raise ctx.error(f"Gemm takes 2-D A and B, got shapes {tuple(A.shape)} and {tuple(B.shape)}")
    ka, kb = (0 if transpose_a else 1), (1 if transpose_b else 0)
    if A.shape[ka] != B.shape[kb]:
        raise ctx.error(f"A{'^T' if transpose_a else ''} {tuple(A.shape)} and B{'^T' if transpose_b else ''} "
                        f"{tuple(B.shape)} do not multiply")
    # contraction dims named, not transposes: XLA:CPU copies a transposed operand per call
    y = lax.dot_general(A, B, (((ka,), (kb,)), ((), ())), precision=kernels.precision(ctx),
                        preferred_element_type=kernels.accumulation_dtype(A, B))
    y = y * jnp.asarray(alpha, y.dtype)
    if C is not None:
        y = y + jnp.asarray(beta, y.dtype) * jnp.asarray(C, y.dtype)
    return y


def _einsum_batch(node, carrying, batch) -> None:
    carries = op_rules.carries(node, carrying)
    eq = str(node.attrs.get("equation", "")).replace(" ", "")
    lhs, _, out = eq.partition("->")
    terms = lhs.split(",")
    lead = {t[:1] for t, c in zip(terms, carries) if c}
    others = "".join(t for t, c in zip(terms, carries) if not c)
    if not out or len(lead) != 1 or out[:1] not in lead or not out[:1].isalpha() or out[:1] in others:
        raise op_rules.refusal(node, f"does not keep the batch as the leading subscript ({eq!r})")


@register(OP_SET, "Einsum", batch=_einsum_batch)
def Einsum(ctx, *Inputs, equation=""):
    """ONNX ``Einsum`` (numpy einsum equation, full precision)."""
    if not equation:
        raise ctx.error("Einsum has no equation")
    return jnp.einsum(equation.replace(" ", ""), *Inputs, precision=kernels.precision(ctx),
                      preferred_element_type=kernels.accumulation_dtype(*Inputs))
