"""numpy twins of :mod:`fbjax.lower.composites`, name for name.

Written from what litert-torch marks each composite as (its
``litert_torch/generative/layers`` modules) and from LiteRT's XNNPACK
kernel for ``odml.scaled_dot_product_attention``, not from the lowering: no
jax, nothing from :mod:`fbjax.lower`. float64 throughout, results in the
output's dtype. :func:`choose` picks these or the decomposition as the JAX
side does, for :func:`fbjax.reference.run`'s ``composites`` mode.
"""

from __future__ import annotations

import functools
import math
import warnings

import numpy as np

from .._registry import Registry
from ..formats.tflite_stablehlo import composite_attrs

OP_SET = "composite"
#: ``("composite", name) -> fn(ctx, *inputs, **attributes)`` (numpy).
COMPOSITES = Registry("composite reference")
register = functools.partial(COMPOSITES.register, OP_SET)
# The composites' own fact (``OpDef.fact``): xnnpack_kernel: LiteRT's default
# CPU delegate (XNNPACK) runs this composite as one kernel instead of its
# decomposition, so ``fbjax.load(..., composites="litert")`` (the default)
# runs it fused too: a bool, or ``fn(node) -> bool`` when XNNPACK takes only
# some nodes (float32 ones...).
COMPOSITES.declare_facts(OP_SET, xnnpack_kernel=False)


def choose(ctx, name: str, blob, mode: str):
    """``(fn, attributes)`` when ``mode`` (``"litert"``, ``"fused"``,
    ``"decomposed"``) runs the composite ``name`` fused, else None; a
    composite with attributes the twin does not declare runs its
    decomposition (with a warning)."""
    opdef = COMPOSITES.get(OP_SET, name)
    if opdef is None or mode == "decomposed":
        return None
    x = opdef.fact("xnnpack_kernel")
    if mode == "litert" and not (x(ctx.node) if callable(x) else x):
        return None
    attrs = composite_attrs(blob, ctx.node.location)
    unknown = sorted(set(attrs) - set(opdef.attr_names))
    if unknown:
        warnings.warn(f"{ctx.node.location}: composite {name!r} runs its decomposition: attributes {unknown} "
                      "not known to fbjax", stacklevel=2)
        return None
    return opdef.fn, attrs


def _softmax(x):
    m = np.max(x, axis=-1, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=-1, keepdims=True)


def _xnnpack_takes(node) -> bool:
    """LiteRT's XNNPACK delegate takes the attention composite when every
    tensor is float32, the query is rank 4 with the keys' head size, the
    query heads are a multiple of the key heads and a mask's last dimension
    is the keys' length."""
    ins = [v for v in node.inputs if v is not None]
    tensors = ins + [v for v in node.outputs if v is not None]
    if not 3 <= len(ins) <= 4 or any(t.shape is None or np.dtype(t.dtype) != np.float32 for t in tensors):
        return False
    q, k, v = ins[0].shape, ins[1].shape, ins[2].shape
    ok = len(q) == len(k) == len(v) == 4 and q[3] == k[3] == v[3] and q[2] % k[2] == 0
    return ok and (len(ins) == 3 or ins[3].shape[-1] == k[1] == v[1])


@register("odml.scaled_dot_product_attention", xnnpack_kernel=_xnnpack_takes)
def scaled_dot_product_attention(ctx, query, key, value, mask=None, *, scale=None, logit_cap=None):
    """Per query head ``n`` (BTNH) and its key/value head ``n // (N / K)``
    (BSKH): ``softmax(cap(scale * q . k) + mask) . v``."""
    q, k, v = (np.asarray(a, np.float64) for a in (query, key, value))
    b, t, n, h = q.shape
    kh = k.shape[2]
    s = float(np.float32(1.0 / math.sqrt(h) if scale is None else scale))
    heads = np.arange(n) // (n // kh)
    kk, vv = k[:, :, heads, :], v[:, :, heads, :]  # [B, S, N, H]
    logits = np.einsum("btnh,bsnh->bnts", q * s, kk)
    if logit_cap is not None:
        cap = float(np.float32(logit_cap))
        logits = np.tanh(logits / cap) * cap
    if mask is not None:
        logits = logits + np.asarray(mask, np.float64)
    out = np.einsum("bnts,bsnh->btnh", _softmax(logits), vv)
    return out.astype(ctx.out_dtype(0))


@register("odml.rms_norm")
def rms_norm(ctx, x, weight=None, *, epsilon=1e-6):
    """``x / sqrt(mean(x^2) + epsilon) * weight`` over the last axis."""
    xf = np.asarray(x, np.float64)
    y = xf / np.sqrt(np.mean(xf * xf, axis=-1, keepdims=True) + float(np.float32(epsilon)))
    if weight is not None:
        y = y * np.asarray(weight, np.float64)
    return y.astype(ctx.out_dtype(0))


@register("odml.group_norm")
def group_norm(ctx, x, weight, bias, *, num_groups=1, epsilon=1e-5, channel_axis=1, reduction_axes=None):
    """Group norm over ``num_groups`` groups of ``channel_axis`` (statistics
    per batch element and group); without ``reduction_axes``, litert-torch's
    layer norm over the trailing ``weight.ndim`` axes."""
    xf = np.asarray(x, np.float64)
    w, b = np.asarray(weight, np.float64), np.asarray(bias, np.float64)
    eps = float(np.float32(epsilon))
    if reduction_axes is None:
        axes = tuple(range(xf.ndim - w.ndim, xf.ndim))
        mean = xf.mean(axis=axes, keepdims=True)
        var = ((xf - mean) ** 2).mean(axis=axes, keepdims=True)
        return ((xf - mean) / np.sqrt(var + eps) * w + b).astype(ctx.out_dtype(0))
    c = int(channel_axis) % xf.ndim
    ch, g = xf.shape[c], int(num_groups)
    if ch % g:
        raise ctx.error(f"{ch} channels do not split into {g} groups")
    xg = xf.reshape(xf.shape[:c] + (g, ch // g) + xf.shape[c + 1:])
    axes = tuple(i for i in range(1, xg.ndim) if i != c)
    mean = xg.mean(axis=axes, keepdims=True)
    var = ((xg - mean) ** 2).mean(axis=axes, keepdims=True)
    y = ((xg - mean) / np.sqrt(var + eps)).reshape(xf.shape)
    shape = [1] * xf.ndim
    shape[c] = ch
    return (y * w.reshape(shape) + b.reshape(shape)).astype(ctx.out_dtype(0))
