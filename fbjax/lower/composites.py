"""Composite lowerings: litert-torch's ``odml.*`` composites as JAX's own primitives.

litert-torch (formerly AI Edge Torch) marks attention and normalisations as
``stablehlo.composite`` ops (TFLite ``STABLEHLO_COMPOSITE``) that carry a
name, FlexBuffer attributes and a decomposition subgraph. The
``stablehlo.composite`` lowering (:mod:`fbjax.lower.stablehlo.control`) runs
either the decomposition op by op or, when the load option
``composites`` asks for it (:class:`fbjax.options.LoadOptions`), the
function registered here under the composite's name, on the composite's
inputs, with its attributes as keywords.

Registry: :data:`COMPOSITES`, keyed ``("composite", name)`` with the name as
litert-torch writes it; the numpy twins are :mod:`fbjax.reference.composites`.
Facts declared at registration: ``check(node) -> reason or None`` (a
composite this lowering cannot take, e.g. an attribute it does not know,
runs its decomposition instead; ``fbjax.load`` warns, :func:`refused`) and ``xnnpack_kernel``
(LiteRT's default CPU delegate runs the composite as one kernel, so the
default mode ``"litert"`` fuses it too).

The composites litert-torch writes (its source, ``litert_torch/``:
``generative/layers/scaled_dot_product_attention.py``,
``generative/layers/normalization.py``,
``_convert/fx_passes/build_aten_composite_pass.py``,
``_convert/fx_passes/optimize_layout_transposes_pass/layout_rewrite.py``,
``backend/lowerings/_rand.py``), and what fbjax does with them:

* ``odml.scaled_dot_product_attention`` (``scale``, optional ``logit_cap``):
  :func:`scaled_dot_product_attention`, ``jax.nn.dot_product_attention``, or
  on CPU fbjax's kernel (:func:`fbjax.lower.cpu_kernels.attention`), which
  reads a layer scan's stacked KV caches in place; XNNPACK's kernel (``VisitScaledDotAttentionCompositeNode`` in LiteRT's
  ``tflite/delegates/xnnpack/xnnpack_delegate.cc``).
* ``odml.rms_norm`` (``epsilon``): :func:`rms_norm`.
* ``odml.group_norm`` (``num_groups``, ``epsilon``, ``channel_axis``, and
  ``reduction_axes`` for a true group norm; without ``reduction_axes`` it is
  litert-torch's layer norm): :func:`group_norm`.
* ``odml.embedding_lookup``, ``odml.upsample_bilinear2d``,
  ``tfl.resize_nearest_neighbor``, ``aten.gelu.default``,
  ``aten.hardswish.default``, ``aten.avg_pool2d.default``: one op each,
  whose decomposition XLA already runs as one fused loop; they run their
  decomposition in every mode.
* ``odml.random_uniform``, ``odml.random_standard_normal``: random draws;
  the decomposition carries the generator, so it always runs.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._registry import Registry
from ..formats.tflite_stablehlo import composite_attrs
from ..options import kernel_options
from . import cpu_kernels
from .layer_slice import LayerSlice, materialize

OP_SET = "composite"
#: ``("composite", name) -> fn(ctx, *inputs, **attributes)``.
COMPOSITES = Registry("composite lowering")
register = functools.partial(COMPOSITES.register, OP_SET)
# The composites' own fact (``OpDef.fact``): xnnpack_kernel: LiteRT's default
# CPU delegate (XNNPACK) runs this composite as one kernel instead of its
# decomposition, so ``fbjax.load(..., composites="litert")`` (the default)
# runs it fused too: a bool, or ``fn(node) -> bool`` when XNNPACK takes only
# some nodes (float32 ones...).
# layer_slices: input positions at which the lowering takes one block of a
#     layer scan's stacked array (:class:`fbjax.lower.layer_slice.LayerSlice`)
#     instead of an array (the attention's key and value caches, read in place
#     by fbjax's CPU kernel); ``stablehlo.composite`` passes the blocks through
#     at these positions (:func:`layer_slices`) and materializes the others.
COMPOSITES.declare_facts(OP_SET, xnnpack_kernel=False, layer_slices=())

__all__ = ["COMPOSITES", "OP_SET", "register", "choose", "refused", "fuses", "layer_slices",
           "scaled_dot_product_attention", "rms_norm", "group_norm"]


def fuses(opdef, mode: str, node) -> bool:
    """Whether ``mode`` (``"litert"``, ``"fused"``, ``"decomposed"``; see
    :func:`fbjax.load`) runs ``node``, a composite registered as ``opdef``,
    fused."""
    if mode == "fused":
        return True
    if mode == "litert":
        x = opdef.fact("xnnpack_kernel")
        return bool(x(node) if callable(x) else x)
    return False


def _decide(node, mode: str):
    """``(fn, attributes, None)`` to run the composite ``node`` fused under
    ``mode``; ``(None, None, reason)`` when ``mode`` would fuse it but its
    lowering refuses it; ``(None, None, None)`` when ``mode`` keeps its
    decomposition."""
    opdef = COMPOSITES.get(OP_SET, str(node.attrs.get("name", "")))
    if opdef is None or not fuses(opdef, mode, node):
        return None, None, None
    attrs = composite_attrs(node.attrs.get("composite_attributes", b""), node.location)
    unknown = sorted(set(attrs) - set(opdef.attr_names))
    reason = f"attributes {unknown} not known to fbjax" if unknown else (opdef.check(node) if opdef.check else None)
    if reason:
        return None, None, reason
    return opdef.fn, attrs, None


def choose(ctx, name: str, blob, mode: str):
    """``(fn, attributes)`` when the composite node ``ctx.node`` (named
    ``name``, attributes ``blob``) runs fused under ``mode``, else None (run
    the decomposition: the mode keeps it, or the registered ``check`` or an
    attribute the lowering does not know refuses it; :func:`refused` lists
    those for load's warning).

    Raises:
        ModelFormatError: the attributes are not a FlexBuffer map.
    """
    fn, attrs, _ = _decide(ctx.node, mode)
    return None if fn is None else (fn, attrs)


def refused(ir, mode: str) -> list:
    """``[(node, reason)]``: the composite nodes of ``ir`` that ``mode``
    would fuse but that run their decomposition because their lowering
    refuses them (an unknown attribute, shapes it does not take);
    :func:`fbjax.loading.lower` warns about each at load.

    Raises:
        ModelFormatError: a composite's attributes are not a FlexBuffer map.
    """
    out = []
    for node in ir.iter_nodes():
        if node.op_name == "stablehlo.composite":
            _, _, reason = _decide(node, mode)
            if reason:
                out.append((node, reason))
    return out


def layer_slices(node) -> tuple:
    """The ``layer_slices`` fact of the composite lowering registered under the name of ``node`` (a
    ``stablehlo.composite``), () when none is: the input positions at which it takes a
    :class:`~fbjax.lower.layer_slice.LayerSlice` (the ``stablehlo.composite`` lowering materializes
    them when the mode runs the decomposition)."""
    opdef = COMPOSITES.get(OP_SET, str(node.attrs.get("name", "")))
    return () if opdef is None else tuple(opdef.fact("layer_slices"))


def _shape(v):
    return None if v is None or v.shape is None else tuple(v.shape)


def _sdpa_check(node):
    ins = list(node.inputs)
    if len(ins) not in (3, 4) or any(v is None for v in ins[:3]):
        return f"takes query, key, value and an optional mask, got {len(ins)} inputs"
    q, k, v = (_shape(x) for x in ins[:3])
    if any(s is None or len(s) != 4 for s in (q, k, v)):
        return f"query, key and value must be rank 4 (BTNH, BSKH, BSKH), got {q}, {k}, {v}"
    if k != v or (q[-1] is not None and q[-1] != k[-1]):
        return f"key {k} and value {v} must match, with query {q}'s head size"
    if None not in (q[2], k[2]) and q[2] % k[2]:
        return f"query heads ({q[2]}) are not a multiple of key/value heads ({k[2]})"
    if any(np.dtype(x.dtype).kind != "f" for x in ins[:3]):
        return "query, key and value must be float"
    if len(ins) == 4 and ins[3] is not None:
        m = _shape(ins[3])
        if np.dtype(ins[3].dtype).kind != "f":
            return "the mask must be a float (additive) mask"
        if m is None or len(m) > 4 or (len(m) >= 3 and m[-3] not in (1, q[2])):
            return f"mask shape {m} does not broadcast over [B, N, T, S]"
    return None


def _xnnpack_takes_sdpa(node) -> bool:
    """What LiteRT's XNNPACK delegate checks before taking the attention
    composite (``VisitDotAttentionNode``): float32 query, key, value, mask
    and output; rank-4 query; one head size; the mask's last dimension the
    keys' length; query heads a multiple of key heads. Other nodes stay
    with LiteRT's builtin kernel, i.e. the decomposition."""
    ins = [v for v in node.inputs if v is not None]
    vals = ins + [v for v in node.outputs if v is not None]
    if len(ins) not in (3, 4) or any(v.shape is None or np.dtype(v.dtype) != np.float32 for v in vals):
        return False
    q, k, v = (tuple(x.shape) for x in ins[:3])
    if len(q) != 4 or len(k) != 4 or len(v) != 4 or not q[-1] == k[-1] == v[-1] or q[2] % k[2]:
        return False
    return len(ins) == 3 or ins[3].shape[-1] == k[1] == v[1]


@register("odml.scaled_dot_product_attention", xnnpack_kernel=_xnnpack_takes_sdpa, check=_sdpa_check,
          layer_slices=(1, 2))
def scaled_dot_product_attention(ctx, query, key, value, mask=None, *, scale=None, logit_cap=None):
    """``odml.scaled_dot_product_attention``: ``softmax(cap(scale * Q K^T) +
    mask) V`` per head, as LiteRT's XNNPACK delegate runs the composite.

    Args:
        query: ``[B, T, N, H]`` (BTNH).
        key, value: ``[B, S, K, H]``; ``N`` a multiple of ``K``: query head
            ``n`` reads key/value head ``n // (N / K)`` (multi-query for
            ``K == 1``, grouped-query otherwise; PyTorch's
            ``repeat_interleave``). Either may be a
            :class:`~fbjax.lower.layer_slice.LayerSlice` (a layer scan's
            stacked caches: the ``layer_slices`` fact).
        mask: optional additive float mask broadcasting to ``[B, N, T, S]``
            (litert-torch passes ``[1, 1, T, S]`` with 0 / ``-inf``); absent:
            no mask (XNNPACK's reading; litert-torch's own decomposition of
            a mask-less composite is causal).
        scale: float32; default ``1 / sqrt(H)``.
        logit_cap: optional soft cap: logits become ``cap * tanh(logits /
            cap)`` before the mask is added.

    Returns:
        ``[B, T, N, H]`` in the query's dtype. On CPU (``KernelOptions``
        ``native_kernels`` and ``native_attention``, the kernels built), for
        float32 query, key, value and mask: fbjax's kernel
        (:func:`fbjax.lower.cpu_kernels.attention`, float32 sums in the order
        its source states), reading stacked caches in place; its derivatives
        are XLA's path's. Otherwise, without ``logit_cap``,
        ``jax.nn.dot_product_attention`` (its native grouped-query support,
        float32 logits and softmax; float16 operands are widened to float32
        on CPU, whose XLA has no float16 dot with a float32 result); with
        it, the same computation written out in float32 with the cap.
    """
    h = np.shape(query)[-1]
    s = float(np.float32(1.0 / math.sqrt(h) if scale is None else scale))
    cap = None if logit_cap is None else float(np.float32(logit_cap))
    if _native_attention(ctx, query, key, value, mask):
        q = jnp.asarray(query)
        k6, v6 = _kv6(key), _kv6(value)
        layers = jnp.stack([jnp.asarray(x.index if isinstance(x, LayerSlice) else 0, jnp.int32).reshape(())
                            for x in (key, value)])
        b, t, n, _ = q.shape
        m = None
        if mask is not None:
            m = jnp.asarray(mask, jnp.float32)
            m = m.reshape((1,) * (4 - m.ndim) + tuple(m.shape))
            m = jnp.broadcast_to(m, tuple(m.shape[:2]) + (t, k6.shape[3]))
        return _attention_native(q, k6, v6, m, layers, s, cap)
    q, k, v = jnp.asarray(query), jnp.asarray(materialize(key)), jnp.asarray(materialize(value))
    bias = None if mask is None else jnp.asarray(mask, jnp.float32)
    backend = str(getattr(ctx, "backend", "cpu"))
    return _xla_attention(q, k, v, bias, s, cap, backend)


def _xla_attention(q, k, v, bias, s: float, cap, backend: str = "cpu"):
    """The attention by XLA's ops: ``q`` ``[B, T, N, H]``, ``k``, ``v`` ``[B, S, K, H]``, ``bias`` None
    or broadcasting to ``[B, N, T, S]``, ``s`` the scale, ``cap`` None or the soft cap."""
    dt = q.dtype
    h = q.shape[-1]
    if cap is None:
        # XLA:CPU has no float16 x float16 -> float32 dot, which jax.nn.dot_product_attention asks for
        cdt = jnp.float32 if dt == jnp.float16 and backend.startswith("cpu") else dt
        q, k, v = q.astype(cdt), k.astype(cdt), v.astype(cdt)
        return jax.nn.dot_product_attention(q, k, v, bias=bias, scale=s).astype(dt)
    b, t, n, _ = q.shape
    kh = k.shape[2]
    g = n // kh
    qg = q.reshape(b, t, kh, g, h).astype(jnp.float32) * s
    logits = jnp.einsum("btkgh,bskh->bkgts", qg, k.astype(jnp.float32)).reshape(b, n, t, -1)
    logits = jnp.tanh(logits / cap) * cap
    if bias is not None:
        logits = logits + bias.reshape((1,) * (4 - bias.ndim) + bias.shape)
    probs = jax.nn.softmax(logits, axis=-1).reshape(b, kh, g, t, -1)
    out = jnp.einsum("bkgts,bskh->btkgh", probs, v.astype(jnp.float32))
    return out.reshape(b, t, n, h).astype(dt)


def _native_attention(ctx, query, key, value, mask) -> bool:
    """Run the attention in fbjax's CPU kernel: the program's backend is the CPU,
    ``KernelOptions.native_kernels`` and ``native_attention`` are on, the kernels built, and the
    operands are what the kernel takes (float32 query ``[B, T, N, H]``, key and value ``[B, S, K, H]``
    alike (arrays or blocks of stacked arrays), ``N`` a multiple of ``K``, a
    float32 mask broadcasting to ``[B, N, T, S]``)."""
    backend = getattr(ctx, "backend", None) or jax.default_backend()
    ko = kernel_options(ctx)
    if not (backend == "cpu" and ko.native_kernels and ko.native_attention):
        return False
    q, k, v = np.shape(query), tuple(key.shape), tuple(value.shape)
    if len(q) != 4 or len(k) != 4 or k != v or q[0] != k[0] or q[3] != k[3] or k[2] == 0 or q[2] % k[2]:
        return False
    if any(np.dtype(x.dtype) != np.float32 for x in (query, key, value)):
        return False
    if mask is not None:
        m = np.shape(mask)
        if np.dtype(mask.dtype) != np.float32 or len(m) > 4:
            return False
        m = (1,) * (4 - len(m)) + tuple(m)
        if m[0] not in (1, q[0]) or m[1] not in (1, q[2]) or m[2] not in (1, q[1]) or m[3] not in (1, k[1]):
            return False
    return cpu_kernels.available()


def _kv6(x):
    """Key or value as the kernel's ``[R, L, B0, S, K, H]``: a block of stacked ``[L, B0, S, K, H]``
    with ``R = 1``, an array ``[B, S, K, H]`` as ``L = R = 1``."""
    if isinstance(x, LayerSlice):
        st = jnp.asarray(x.stacked)
        return st.reshape((1,) + tuple(st.shape))
    x = jnp.asarray(x)
    return x.reshape((1, 1) + tuple(x.shape))


@functools.lru_cache(maxsize=None)
def _kernel(scale: float, cap, has_mask: bool):
    """The kernel call for ``(q, k6, v6, mask, layers)`` (mask an empty array when ``has_mask`` is False),
    with its ``vmap`` rule: mapped rows join the batch (rows of stacked caches ``[A, R, L, ...]``
    become ``[A * R, L, ...]``, read in place)."""

    @jax.custom_batching.custom_vmap
    def kernel(q, k, v, m, layers):
        return cpu_kernels.attention(q, k, v, m if has_mask else None, layers, scale, cap)

    @kernel.def_vmap
    def rule(axis_size, in_batched, q, k, v, m, layers):
        qb, kb, vb, mb, lb = in_batched
        if lb or not (kb and vb):  # (not how fbjax calls it) example by example
            args, batched = (q, k, v, m, layers), in_batched

            def one(xs):
                it = iter(xs)
                return kernel(*[next(it) if bt else a for a, bt in zip(args, batched)])

            return lax.map(one, tuple(a for a, bt in zip(args, batched) if bt)), True
        if not qb:
            q = jnp.broadcast_to(q, (axis_size,) + q.shape)
        b = q.shape[1]
        qj = q.reshape((-1,) + q.shape[2:])
        kj, vj = k.reshape((-1,) + k.shape[2:]), v.reshape((-1,) + v.shape[2:])
        if has_mask:
            if mb:
                m = m.reshape((-1,) + m.shape[2:])  # [A * Bm, ...]: row a * B + i reads a * Bm + i // (B / Bm)
            elif m.shape[0] != 1:
                m = jnp.tile(m, (axis_size, 1, 1, 1))
        out = kernel(qj, kj, vj, m, layers)
        return out.reshape((axis_size, b) + out.shape[1:]), True

    return kernel


@functools.partial(jax.custom_jvp, nondiff_argnums=(5, 6))
def _attention_native(q, k6, v6, m, layers, scale: float, cap):
    """fbjax's CPU attention kernel on ``q`` ``[B, T, N, H]``, ``k6``, ``v6`` ``[R, L, B0, S, K, H]``,
    ``m`` None or ``[Bm, Nm, T, S]``, blocks ``layers`` (int32 ``[2]``: of ``k6``, of ``v6``);
    derivatives: those of :func:`_xla_attention`."""
    mm = jnp.zeros((0,), jnp.float32) if m is None else m
    return _kernel(scale, cap, m is not None)(q, k6, v6, mm, layers)


@_attention_native.defjvp
def _attention_native_jvp(scale, cap, primals, tangents):
    q, k6, v6, m, layers = primals
    out = _attention_native(q, k6, v6, m, layers, scale, cap)

    def xla(q, k6, v6, *mask):
        k, v = (lax.dynamic_index_in_dim(x, layers[i], axis=1, keepdims=False) for i, x in enumerate((k6, v6)))
        k, v = (x.reshape((-1,) + x.shape[2:]) for x in (k, v))
        bias = None
        if mask:
            bias = mask[0]
            if bias.shape[0] not in (1, q.shape[0]):
                bias = jnp.repeat(bias, q.shape[0] // bias.shape[0], axis=0)
        return _xla_attention(q, k, v, bias, scale, cap)

    prim = (q, k6, v6) + (() if m is None else (m,))
    tans = tuple(tangents[:3]) + (() if m is None else (tangents[3],))
    _, t = jax.jvp(xla, prim, tans)
    return out, t


def _norm_check(node):
    if any(v is None or v.shape is None for v in node.inputs) or not node.inputs:
        return "input shapes must be known"
    if any(np.dtype(v.dtype).kind != "f" for v in node.inputs):
        return "inputs must be float"
    return None


@register("odml.rms_norm", check=_norm_check)
def rms_norm(ctx, x, weight=None, *, epsilon=1e-6):
    """``odml.rms_norm``: ``x / sqrt(mean(x^2, last axis) + epsilon) *
    weight``, computed in float32 (litert-torch's ``rms_norm_with_hlfb``
    normalises ``x.float()``), returned in ``x``'s dtype.

    Args:
        x: ``[..., C]``.
        weight: ``[C]`` (litert-torch passes ``1 + weight`` for zero-centred
            norms: it is an input of the composite already).
        epsilon: float32.

    litert-torch's ``RMSNorm(with_scale=True)`` multiplies by a learned
    ``final_scale`` inside the decomposition that the composite does not
    name as an input; XNNPACK never fuses ``odml.rms_norm``, so the default
    mode keeps the decomposition and such files stay exact.
    """
    xf = jnp.asarray(x).astype(jnp.float32)
    eps = float(np.float32(epsilon))
    y = xf * lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    if weight is not None:
        y = y * jnp.asarray(weight).astype(jnp.float32)
    return y.astype(jnp.asarray(x).dtype)


@register("odml.group_norm", check=_norm_check)
def group_norm(ctx, x, weight, bias, *, num_groups=1, epsilon=1e-5, channel_axis=1, reduction_axes=None):
    """``odml.group_norm``: group normalisation (PyTorch ``group_norm``), or
    litert-torch's layer norm, which it writes under the same name.

    Args:
        x: the input.
        weight, bias: per-channel scale and offset.
        num_groups: groups the channel axis splits into.
        epsilon: float32.
        channel_axis: the channel axis (litert-torch's NHWC layout pass
            writes 3).
        reduction_axes: present (``[channel_axis]``) for a true group norm;
            absent for litert-torch's ``layer_norm_with_hlfb``, which marks
            ``F.layer_norm`` over the trailing ``weight.ndim`` axes as
            ``num_groups=1, channel_axis=1`` (LiteRT's GPU delegate tells the
            two apart the same way).

    Group norm: mean and (biased) variance per batch element and group, over
    every non-batch axis of the group's channels; layer norm: over the
    trailing ``weight.ndim`` axes. Computed in float32, returned in ``x``'s
    dtype.
    """
    x = jnp.asarray(x)
    xf = x.astype(jnp.float32)
    w = jnp.asarray(weight).astype(jnp.float32)
    b = jnp.asarray(bias).astype(jnp.float32)
    eps = float(np.float32(epsilon))
    if reduction_axes is None:
        axes = tuple(range(x.ndim - w.ndim, x.ndim))
        mean = jnp.mean(xf, axis=axes, keepdims=True)
        var = jnp.mean(jnp.square(xf - mean), axis=axes, keepdims=True)
        return ((xf - mean) * lax.rsqrt(var + eps) * w + b).astype(x.dtype)
    c = int(channel_axis) % x.ndim
    ch, g = x.shape[c], int(num_groups)
    if ch % g:
        raise ctx.error(f"{ch} channels do not split into {g} groups")
    xg = xf.reshape(x.shape[:c] + (g, ch // g) + x.shape[c + 1:])
    axes = tuple(i for i in range(1, xg.ndim) if i != c)
    mean = jnp.mean(xg, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(xg - mean), axis=axes, keepdims=True)
    y = ((xg - mean) * lax.rsqrt(var + eps)).reshape(x.shape)
    shape = [1] * x.ndim
    shape[c] = ch
    return (y * w.reshape(shape) + b.reshape(shape)).astype(x.dtype)
