"""TFLite's hybrid (dynamic-range) kernels, bit for bit: op set ``"tflite.hybrid"``.

A hybrid op has float32 activations and int8 constant weights (symmetric,
per-tensor or per-channel scales). :func:`fbjax.passes.quantization.rewrite_quantized`
(``quantized="exact"``) moves FULLY_CONNECTED, CONV_2D, DEPTHWISE_CONV_2D,
BATCH_MATMUL and TRANSPOSE_CONV nodes whose weights are such constants into
this op set.
Each lowering reproduces LiteRT's builtin x86 kernel (without XNNPACK):

1. the float input is quantized on the fly to int8, one scale (and zero
   point) per block: per row of the flattened input for FULLY_CONNECTED and
   BATCH_MATMUL (the lhs), per image (``H*W*C`` values) for the convolutions;

   * symmetric (``tensor_utils::SymmetricQuantizeFloats``): ``range =
     max|x|``, ``s = range / 127``, ``q = round_half_away(x * (127 /
     range))`` clamped to [-127, 127], in float32 (an all-zero block gives
     ``s = 1``, ``q = 0``);
   * asymmetric (``AsymmetricQuantizeFloats``; FULLY_CONNECTED and
     BATCH_MATMUL with ``asymmetric_quantize_inputs``, CONV_2D with
     per-channel weights of distinct scales, DEPTHWISE_CONV_2D and
     TRANSPOSE_CONV always):
     ``rmin = min(0, min x)``, ``rmax = max(0, max x)``, scale ``(rmax -
     rmin) / 255`` in double from the float32 difference, zero point chosen
     in double (the end with the smaller error, ``round_half_away``, clamped
     to [-128, 127]), ``s = float32(scale)``, ``q = zp +
     round_half_away(x * float32(1 / s))`` (float32 product), clamped to
     [-128, 127];

2. ``acc = sum(q * w) - zp * sum(w)`` exactly in int32 (padded convolution
   taps read the zero point, i.e. real 0);
3. ``y = float32(acc) * float32(s * s_w) + bias`` with two float32 roundings
   (``s_w`` per output channel; DEPTHWISE_CONV_2D: ``(float32(acc) * s_w) *
   s + bias``), then the fused activation in float. TRANSPOSE_CONV instead
   scales and adds every single product in float (see its docstring).

On the CPU backend the integer products of steps 2 (and, for blockwise
int4 FULLY_CONNECTED, all three steps: input quantization, integer and
per-block float sums, output scaling) run in fbjax's native kernels (:mod:`fbjax.lower.cpu_kernels`; XLA:CPU has no
integer matrix product), elsewhere or with ``KernelOptions(native_kernels=False)``
in XLA; the same bits either way.

The per-block zero-point choice runs in float64 under a scoped
``jax.enable_x64`` (TFLite computes it in double; float32 could differ near
ties of the zero point). XLA rewrites division by a constant into a
multiplication by its reciprocal; :func:`_div` keeps a true division.
XLA:CPU contracts a multiply feeding an add into one FMA and reassociates
products with constants; :func:`_rounded` keeps TFLite's roundings and
product order. The numpy twins are in
:mod:`fbjax.reference.tflite_int.hybrid`.

Not implemented (those nodes keep running in float with dequantized
weights): UNIDIRECTIONAL_SEQUENCE_LSTM, SVDF, RNN (not attempted: their
float gate activations would also have to match LiteRT's exp/tanh bit for
bit); fused TANH / SIGN_BIT activations.

Also here: :func:`per_channel_quantize`, float -> int QUANTIZE with
per-channel output scales (called by the ``"tflite.int"`` QUANTIZE).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ...options import kernel_options
from .. import cpu_kernels, kernels
from ..layer_slice import LayerSlice
from ..registry import register
from .conv import _padding  # TF SAME/VALID -> explicit pads, errors naming the node

OP_SET = "tflite.hybrid"
_NHWC_OHWI = ("NHWC", "OHWI", "NHWC")
_F32 = np.float32


def _rounded(p):
    """``p`` unchanged, but opaque to the compiler, so that the float32
    rounding of the product that made it is kept: XLA:CPU/LLVM would
    otherwise contract it with a following add into one FMA, and XLA's
    algebraic simplifier reassociates products with constants
    (``(p * c) * s`` into ``p * (c * s)``, seen with a splat ``c``)."""
    return jnp.where(p != p, jnp.float32(np.nan), p)


def _div(num, const):
    """``num / const`` as a true division: XLA rewrites division by a
    constant into multiplication by its reciprocal, which is not correctly
    rounded. (``num - num`` is 0 for finite ``num``; XLA cannot fold it.)"""
    return num / (const + (num - num))


def _ints(w):
    """Integer weights as int32: the file's constants, or in float mode
    (:func:`fbjax.passes.quantization.rewrite_quantized`) the traced output of
    ``fbjax:QUANTIZE_WEIGHTS``."""
    return jnp.asarray(w).astype(jnp.int32)


#: up to this many input rows (decode steps, batches of them) a hybrid dense
#: kernel multiplies as one fused multiply-reduce over its integer weights,
#: weight rows outer (each weight read once, widened in registers, used for
#: every input row); more rows (prefill) go through XLA's dot, which first
#: writes the weights out widened to int32, once for all rows. On
#: litert-torch's SmolLM2-135M-shaped int8 decode step the fused form took
#: 0.43x the dot's time side by side (1 row), with the same bits (integer
#: sums).
REDUCE_MAX_ROWS = 16
#: weight rows per block of the fused multiply-reduce of a large matrix (see :func:`_int_matmul`; on the
#: 135M bundle's decode step, LM head [49152, 576]: 67 ms a step with blocks of 2048, 96 with 512, 120 with
#: 192, 127 unblocked)
_GEMV_BLOCK_ROWS = 2048


def _as_int8(w):
    """Integer weights as int8 (int4 buffers and float mode's traced weights: the values fit)."""
    w = jnp.asarray(w)
    return w if w.dtype == jnp.int8 else w.astype(jnp.int8)


def _fused_sum(a, w, chunk: int = 32):
    """``sum(a * int32(w), axis=-1)`` (integer; broadcasting) as one pass over
    ``w``: summed in chunks of ``chunk`` values, then over the chunks. A
    single long integer reduction is rewritten by XLA:CPU into a tree of
    reduce-windows, which first writes every product out ([R, O, I] int32);
    chunks of at most 32 keep the widening product fused into the
    reduction. Integer sums: the same result in any order."""
    n = w.shape[-1]
    wi = w.astype(jnp.int32)
    if n <= chunk or n % chunk:
        return jnp.sum(a * wi, axis=-1)
    lead = jnp.broadcast_shapes(a.shape[:-1], w.shape[:-1])
    prod = (a * wi).reshape(lead + (n // chunk, chunk))
    return jnp.sum(jnp.sum(prod, axis=-1), axis=-1)


@jax.custom_batching.custom_vmap
def _int_matmul(q, z, w):
    """``sum_i (q[r, i] - z[r]) * w[o, i]`` exactly in int32: ``q`` int32
    ``[R, I]`` in [-128, 127], ``z`` int32 ``[R]`` (zero points; zeros for
    symmetric rows), ``w`` integer ``[O, I]`` (int8, or int4 held two per
    byte). Few rows (decode): one fused multiply-reduce; more: an int8 x
    int8 -> int32 dot whose lhs carries a row of ones, so the weights' sums
    for the zero points come from the same pass. |result| <= 255 * 128 * I:
    exact for I < 2**16. Under ``vmap`` the batch joins the rows (one pass
    over the weights for every row of every example)."""
    if q.shape[0] <= REDUCE_MAX_ROWS:
        # [O, R] (weights outer): each weight row is read once and used for every row of q
        qz = (q - z[:, None])[None]
        w = jnp.asarray(w)
        o = w.shape[0]
        if o > _GEMV_BLOCK_ROWS and o % _GEMV_BLOCK_ROWS == 0:
            # many output rows (an LM head): blocks of rows in a loop, so that XLA:CPU's products stay in
            # cache instead of being written out for the whole matrix
            blocks = lax.map(lambda wb: _fused_sum(qz, wb[:, None]), w.reshape(-1, _GEMV_BLOCK_ROWS, w.shape[1]))
            return blocks.reshape(o, -1).T
        return _fused_sum(qz, w[:, None]).T
    lhs = jnp.concatenate([q, jnp.ones((1, q.shape[1]), q.dtype)], axis=0).astype(jnp.int8)
    both = lax.dot_general(lhs, _as_int8(w), (((1,), (1,)), ((), ())), preferred_element_type=jnp.int32)
    return both[:-1] - z[:, None] * both[-1][None, :]


def _rows_vmap(fn):
    """The ``vmap`` rule of an ``(q [R, I], z [R], w)`` matrix product: the batch joins the rows."""
    def rule(axis_size, in_batched, q, z, w):
        qb, zb, wb = in_batched
        if wb:  # per-example weights (not how fbjax calls it): example by example
            return lax.map(lambda a: fn(*a), (q if qb else jnp.broadcast_to(q, (axis_size,) + q.shape),
                                              z if zb else jnp.broadcast_to(z, (axis_size,) + z.shape), w)), True
        q = q if qb else jnp.broadcast_to(q, (axis_size,) + q.shape)
        z = z if zb else jnp.broadcast_to(z, (axis_size,) + z.shape)
        out = fn(q.reshape((-1, q.shape[-1])), z.reshape(-1), w)
        return out.reshape((axis_size, -1, out.shape[-1])), True
    fn.def_vmap(rule)
    return fn


_rows_vmap(_int_matmul)


@jax.custom_batching.custom_vmap
def _int_matmul_native(q, z, w):
    """:func:`_int_matmul` by fbjax's CPU kernel (:func:`fbjax.lower.cpu_kernels.int8_matmul`):
    the same int32 sums, each weight read once at the memory's speed, for any number of rows."""
    x = (q - z[:, None]).astype(jnp.int16)  # [-255, 255]
    w = jnp.asarray(w)
    if w.dtype == jnp.int4 and w.shape[1] % 2 == 0 and w.shape[1] <= 1024:  # packed per-channel int4
        return cpu_kernels.block_matmul(x[:, None], w[:, None])[0][0]
    return cpu_kernels.int8_matmul(x, _as_int8(w))


_rows_vmap(_int_matmul_native)


@jax.custom_batching.custom_vmap
def _int_matmul_sym(q, w, layer):
    """``sum_i q[r, i] * w[o, i]`` exactly in int32 for symmetrically quantized rows (``q`` int32 ``[R, I]``
    in [-127, 127], zero point 0) by :func:`fbjax.lower.cpu_kernels.int8_matmul_sym` (AVX-512 VNNI), ``w``
    int8 ``[O, I]``, or stacked ``[L, O, I]`` read at block ``layer`` (a layer scan's body; ``layer`` None
    otherwise is passed as -1). Under ``vmap`` the batch joins the rows."""
    x = q.astype(jnp.int8)
    if w.ndim == 3:
        return cpu_kernels.int8_matmul_sym(x, w, layer)
    return cpu_kernels.int8_matmul_sym(x, w)


@_int_matmul_sym.def_vmap
def _int_matmul_sym_vmap(axis_size, in_batched, q, w, layer):
    qb, wb, lb = in_batched
    q = q if qb else jnp.broadcast_to(q, (axis_size,) + q.shape)
    if wb or lb:  # per-example weights or blocks (not how fbjax calls it): example by example
        w = w if wb else jnp.broadcast_to(w, (axis_size,) + w.shape)
        layer = layer if lb else jnp.broadcast_to(layer, (axis_size,) + jnp.shape(layer))
        return lax.map(lambda a: _int_matmul_sym(*a), (q, w, layer)), True
    out = _int_matmul_sym(q.reshape((-1, q.shape[-1])), w, layer)
    return out.reshape((axis_size, -1, out.shape[-1])), True


@jax.custom_batching.custom_vmap
def _int_matmul_native_at(q, z, w, layer):
    """:func:`_int_matmul_native` on block ``layer`` of stacked weights ``w`` ``[L, O, I]``, which the
    kernel reads in place (a layer scan's body: :mod:`fbjax.lower.layer_slice`)."""
    x = (q - z[:, None]).astype(jnp.int16)
    if w.dtype == jnp.int4 and w.shape[2] % 2 == 0 and w.shape[2] <= 1024:  # packed per-channel int4
        return cpu_kernels.block_matmul(x[:, None], w[:, :, None], layer)[0][0]
    if w.dtype != jnp.int8:
        return _int_matmul_native(q, z, lax.dynamic_index_in_dim(w, layer, keepdims=False))
    return cpu_kernels.int8_matmul(x, w, layer)


@_int_matmul_native_at.def_vmap
def _int_matmul_native_at_vmap(axis_size, in_batched, q, z, w, layer):
    qb, zb, wb, lb = in_batched
    q = q if qb else jnp.broadcast_to(q, (axis_size,) + q.shape)
    z = z if zb else jnp.broadcast_to(z, (axis_size,) + z.shape)
    if wb or lb:  # per-example weights or blocks (not how fbjax calls it): example by example
        w = w if wb else jnp.broadcast_to(w, (axis_size,) + w.shape)
        layer = layer if lb else jnp.broadcast_to(layer, (axis_size,) + jnp.shape(layer))
        return lax.map(lambda a: _int_matmul_native_at(*a), (q, z, w, layer)), True
    out = _int_matmul_native_at(q.reshape((-1, q.shape[-1])), z.reshape(-1), w, layer)
    return out.reshape((axis_size, -1, out.shape[-1])), True


@jax.custom_batching.custom_vmap
def _block_matmul(q, w):
    """Per block ``k`` of ``bs`` inputs: ``acc[k, r, o] = sum_c q[r, k, c] *
    w[o, k, c]`` and ``ksum[k, o] = sum_c w[o, k, c]``, exactly in int32
    (``q`` int32 ``[R, blocks, bs]`` in [-128, 127], ``w`` ``[O, blocks,
    bs]`` int4/int8). Few rows: fused multiply-reduces; more: one int8 dot
    with a row of ones. Under ``vmap`` the batch joins the rows."""
    if q.shape[0] <= REDUCE_MAX_ROWS:
        wi = jnp.asarray(w).astype(jnp.int32)
        acc = _fused_sum(q[None], jnp.asarray(w)[:, None])  # [O, R, blocks]: weights outer, read once
        return jnp.transpose(acc, (2, 1, 0)), jnp.sum(wi, axis=-1).T
    rows = q.shape[0]
    lhs = jnp.concatenate([q, jnp.ones((1,) + q.shape[1:], q.dtype)], axis=0).astype(jnp.int8)
    both = lax.dot_general(lhs, _as_int8(w), (((2,), (2,)), ((1,), (1,))), preferred_element_type=jnp.int32)
    return both[:, :rows], both[:, rows]  # dot_general puts the block (batch) dimension first


def _blocks_vmap(fn):
    """The ``vmap`` rule of a blockwise product ``(q [R, blocks, bs], w)``: the batch joins the rows."""
    def rule(axis_size, in_batched, q, w):
        qb, wb = in_batched
        if wb:
            q = q if qb else jnp.broadcast_to(q, (axis_size,) + q.shape)
            return lax.map(lambda a: fn(*a), (q, w)), (True, True)
        if not qb:
            acc, ksum = fn(q, w)
            return (acc, ksum), (False, False)
        acc, ksum = fn(q.reshape((-1,) + q.shape[2:]), w)  # [blocks, B * R, O]
        acc = jnp.moveaxis(acc.reshape((acc.shape[0], axis_size, -1, acc.shape[-1])), 1, 0)
        return (acc, ksum), (True, False)
    fn.def_vmap(rule)
    return fn


_blocks_vmap(_block_matmul)


@jax.custom_batching.custom_vmap
def _block_fc_native(x2d, w, scale):
    """:func:`fbjax.lower.cpu_kernels.block_fc_f32`: float32 ``x2d`` ``[R, blocks * bs]``, ``w`` ``[O,
    blocks, bs]``, ``scale`` float32 ``[O, blocks]`` -> float32 ``[R, O]``, :func:`_fc_blockwise` without
    its bias (input quantization, the blockwise sums in TFLite's order and the output scaling, all in the
    kernel). Under ``vmap`` the batch joins the rows."""
    w = jnp.asarray(w)
    if w.dtype not in (jnp.int4, jnp.int8) or w.shape[-1] > 1024 or (w.dtype == jnp.int4 and w.shape[-1] % 2):
        w = _as_int8(w)
    return cpu_kernels.block_fc_f32(x2d, w, scale)


@_block_fc_native.def_vmap
def _block_fc_native_vmap(axis_size, in_batched, x2d, w, scale):
    xb, wb, sb = in_batched
    if wb or sb:
        x2d = x2d if xb else jnp.broadcast_to(x2d, (axis_size,) + x2d.shape)
        w = w if wb else jnp.broadcast_to(w, (axis_size,) + w.shape)
        scale = scale if sb else jnp.broadcast_to(scale, (axis_size,) + scale.shape)
        return lax.map(lambda a: _block_fc_native(*a), (x2d, w, scale)), True
    if not xb:
        return _block_fc_native(x2d, w, scale), False
    out = _block_fc_native(x2d.reshape((-1, x2d.shape[-1])), w, scale)
    return out.reshape((axis_size, -1, out.shape[-1])), True


@jax.custom_batching.custom_vmap
def _block_fc_native_at(x2d, w, scale, layer):
    """:func:`_block_fc_native` on block ``layer`` of stacked weights ``w`` ``[L, O, blocks, bs]``, read
    in place (``scale`` the block's own ``[O, blocks]``, or the stacked ``[L, O, blocks]`` read at ``layer``
    too). Under ``vmap`` the batch joins the rows."""
    if w.dtype not in (jnp.int4, jnp.int8) or w.shape[-1] > 1024 or (w.dtype == jnp.int4 and w.shape[-1] % 2):
        if scale.ndim == 3:
            scale = lax.dynamic_index_in_dim(scale, layer, keepdims=False)
        return _block_fc_native(x2d, lax.dynamic_index_in_dim(w, layer, keepdims=False), scale)
    return cpu_kernels.block_fc_f32(x2d, w, scale, layer)


@_block_fc_native_at.def_vmap
def _block_fc_native_at_vmap(axis_size, in_batched, x2d, w, scale, layer):
    xb, wb, sb, lb = in_batched
    if wb or sb or lb:
        x2d = x2d if xb else jnp.broadcast_to(x2d, (axis_size,) + x2d.shape)
        w = w if wb else jnp.broadcast_to(w, (axis_size,) + w.shape)
        scale = scale if sb else jnp.broadcast_to(scale, (axis_size,) + scale.shape)
        layer = layer if lb else jnp.broadcast_to(layer, (axis_size,) + jnp.shape(layer))
        return lax.map(lambda a: _block_fc_native_at(*a), (x2d, w, scale, layer)), True
    if not xb:
        return _block_fc_native_at(x2d, w, scale, layer), False
    out = _block_fc_native_at(x2d.reshape((-1, x2d.shape[-1])), w, scale, layer)
    return out.reshape((axis_size, -1, out.shape[-1])), True


def _native(ctx) -> bool:
    """Use fbjax's CPU kernels for this node's integer products: the program's backend is the CPU,
    ``KernelOptions.native_kernels`` is on and the kernels built (:func:`fbjax.lower.cpu_kernels.available`).
    Either way the sums are the same integers."""
    backend = getattr(ctx, "backend", None) or jax.default_backend()
    return backend == "cpu" and kernel_options(ctx).native_kernels and cpu_kernels.available()


def symmetric_quantize(x2d):
    """``SymmetricQuantizeFloats`` of each row of float32 ``x2d`` [R, N]:
    ``(q int32 [R, N], scale float32 [R])``."""
    x2d = jnp.asarray(x2d, jnp.float32)
    rng = jnp.max(jnp.abs(x2d), axis=1)
    zero = rng == 0
    safe = jnp.where(zero, jnp.float32(1), rng)
    scale = jnp.where(zero, jnp.float32(1), _div(safe, jnp.float32(127)))
    inv = jnp.float32(127) / safe
    q = lax.round(x2d * inv[:, None], lax.RoundingMethod.AWAY_FROM_ZERO)
    q = jnp.where(zero[:, None], jnp.float32(0), jnp.clip(q, -127, 127))
    return q.astype(jnp.int32), scale


def asymmetric_quantize(x2d):
    """``AsymmetricQuantizeFloats`` of each row of float32 ``x2d`` [R, N]:
    ``(q int32 [R, N], scale float32 [R], zero_point int32 [R])``."""
    x2d = jnp.asarray(x2d, jnp.float32)
    rmin = jnp.minimum(jnp.float32(0), jnp.min(x2d, axis=1))
    rmax = jnp.maximum(jnp.float32(0), jnp.max(x2d, axis=1))
    zero = rmin == rmax
    diff = jnp.where(zero, jnp.float32(1), rmax - rmin)  # float32 subtraction, as TFLite
    with jax.enable_x64(True):
        scale = _div(diff.astype(jnp.float64), 255.0)
        a = rmin.astype(jnp.float64) / scale
        b = rmax.astype(jnp.float64) / scale
        zp_d = jnp.where(128.0 + jnp.abs(a) < 127.0 + jnp.abs(b), -128.0 - a, 127.0 - b)
        zp_r = lax.round(zp_d, lax.RoundingMethod.AWAY_FROM_ZERO)
        zp = jnp.where(zp_d <= -128.0, -128.0, jnp.where(zp_d >= 127.0, 127.0, zp_r))
        zp = jnp.where(zero, 0.0, zp).astype(jnp.int32)
        s = jnp.where(zero, 1.0, scale).astype(jnp.float32)
        inv = (1.0 / s.astype(jnp.float64)).astype(jnp.float32)
    # The product is rounded to an integer first, then the zero point added
    # (verified on ties of zp + x * inv, where rounding the float sum differs).
    q = lax.round(x2d * inv[:, None], lax.RoundingMethod.AWAY_FROM_ZERO)
    q = jnp.clip(q, -256.0, 256.0).astype(jnp.int32) + zp[:, None]
    q = jnp.where(zero[:, None], 0, jnp.clip(q, -128, 127))
    return q.astype(jnp.int32), s, zp


def _quantize(x2d, asymmetric):
    if asymmetric:
        return asymmetric_quantize(x2d)
    q, s = symmetric_quantize(x2d)
    return q, s, None


def _activation(ctx, y, fused):
    if fused in (None, "NONE"):
        return y
    if fused == "RELU":
        return jnp.maximum(y, jnp.float32(0))
    if fused == "RELU6":
        return jnp.clip(y, jnp.float32(0), jnp.float32(6))
    if fused == "RELU_N1_TO_1":
        return jnp.clip(y, jnp.float32(-1), jnp.float32(1))
    raise ctx.error(f"fused activation {fused} is not supported by the hybrid kernels")


def _weight_scales(ctx, n):
    """The weights' scales broadcast to ``n`` output channels (numpy float32)."""
    v = ctx.inputs[1]
    if v.quant is None or np.asarray(v.quant.scale).size == 0:
        raise ctx.error(f"weights {v.name!r} have no quantization parameters")
    s = ctx.quant_scale(1).reshape(-1)  # numpy, or traced per block inside a layer scan (``layer_quant``)
    if s.size not in (1, n):
        raise ctx.error(f"{s.size} weight scales for {n} output channels")
    if np.any(np.asarray(v.quant.zero_point).reshape(-1) != 0):
        raise ctx.error(f"weights {v.name!r} have nonzero zero points; hybrid kernels need symmetric weights")
    if isinstance(s, np.ndarray):
        return np.broadcast_to(s, (n,)).astype(_F32)
    return jnp.broadcast_to(s, (n,)).astype(jnp.float32)


def _per_channel(ctx):
    """TFLite's CONV_2D test for the per-channel hybrid path: more than one
    weight scale, not all equal."""
    s = np.asarray(ctx.inputs[1].quant.scale, _F32).reshape(-1)
    return s.size > 1 and bool(np.any(s != s[0]))


_F32_DT = np.dtype(np.float32)


def _float_outputs(n) -> bool:
    return all(o is None or np.dtype(o.dtype) == _F32_DT for o in n.outputs)


def _int8_symmetric(v) -> bool:
    return np.dtype(v.dtype) == np.int8 and not np.any(np.asarray(v.quant.zero_point))


def dense_eligible(act: int = 0, *, per_tensor_only: bool = False, blockwise: bool = False):
    """The ``hybrid_eligible`` fact of the dense hybrid kernels: ``fn(node,
    weight) -> bool``, true when the node reads ``weight`` as its int8
    weights (input 1, zero point 0), its activation (input ``act``) is a
    float32 tensor computed at run time, its other inputs and its outputs
    are float32, its fused activation is one the kernel applies (NONE, RELU,
    RELU6, RELU_N1_TO_1) and its weights are in the DEFAULT format.
    ``per_tensor_only``: one weight scale only (BATCH_MATMUL);
    ``blockwise``: block-wise weight scales are read (FULLY_CONNECTED)."""

    def eligible(n, v) -> bool:
        ins = list(n.inputs)
        x = ins[act] if len(ins) > max(act, 1) else None
        return (x is not None and ins[1] is v and _int8_symmetric(v) and not x.is_constant
                and np.dtype(x.dtype) == _F32_DT and _float_outputs(n)
                and all(r is None or np.dtype(r.dtype) == _F32_DT for r in ins[max(act, 1) + 1:])
                and n.attrs.get("fused_activation_function", "NONE") in ("NONE", "RELU", "RELU6", "RELU_N1_TO_1")
                and n.attrs.get("weights_format", "DEFAULT") == "DEFAULT"
                and (not per_tensor_only or np.asarray(v.quant.scale).size == 1)
                and (not v.quant.block_size or blockwise))

    return eligible


def _lookup_eligible(n, v) -> bool:
    """``hybrid_eligible`` of EMBEDDING_LOOKUP: an int8 table (INT4 files
    unpacked to int8; zero point 0) as input 1 with one scale, block-wise
    scales, or one scale per row, and float32 outputs."""
    ins = list(n.inputs)
    s = np.asarray(v.quant.scale).reshape(-1)
    return (len(ins) == 2 and ins[1] is v and _int8_symmetric(v)
            and (s.size == 1 or v.quant.block_size > 0
                 or (v.quant.quantized_dimension == 0 and v.shape and s.size == v.shape[0]))
            and _float_outputs(n))


def _scale_out(acc, scale, bias):
    """``float32(acc) * scale (+ bias)`` with two float32 roundings."""
    y = acc.astype(jnp.float32) * scale
    if bias is not None:
        y = _rounded(y) + jnp.asarray(bias, jnp.float32)
    return y


@register(OP_SET, "FULLY_CONNECTED", differentiable=False, traced_weights=True,
          hybrid_eligible=dense_eligible(blockwise=True), layer_quant=(1,), layer_slices=(1,))
def FULLY_CONNECTED(ctx, x, w, b=None, *, fused_activation_function="NONE", weights_format="DEFAULT",
                    keep_num_dims=False, asymmetric_quantize_inputs=False):
    """Hybrid TFLite FULLY_CONNECTED (``fully_connected.cc`` ``EvalHybrid``).

    ``x`` float32 ``[..., I]`` (flattened to rows of ``I``), ``w`` int8
    ``[O, I]`` (scales per tensor or per ``O``), ``b`` float32 ``[O]``.
    Each row is quantized (asymmetrically with ``asymmetric_quantize_inputs``),
    ``y = f32(acc) * f32(s_row * s_w[o]) + b[o]``, fused activation.
    """
    if weights_format != "DEFAULT":
        raise ctx.error(f"weights_format {weights_format} is not supported")
    if isinstance(w, LayerSlice) and not _native(ctx):  # (a layer scan's block: XLA's path reads a copy)
        w = w.materialize()
    if np.ndim(w) != 2:
        raise ctx.error(f"weights must be [O, I], got {tuple(np.shape(w))}")
    o, i = np.shape(w)
    x = jnp.asarray(x, jnp.float32)
    if x.ndim == 0 or i == 0 or x.size % i:
        raise ctx.error(f"input of shape {tuple(x.shape)} does not flatten to rows of {i}")
    lead = tuple(x.shape[:-1]) if keep_num_dims else (x.size // i,)
    if ctx.inputs[1].quant.block_size:
        return _fc_blockwise(ctx, x.reshape(-1, i), w, b).reshape(lead + (o,))
    q, s, z = _quantize(x.reshape(-1, i), asymmetric_quantize_inputs)
    sym = z is None and _native(ctx) and np.dtype(getattr(w, "dtype", np.int8)) == np.int8
    z = jnp.zeros(q.shape[0], jnp.int32) if z is None else z
    if sym:  # symmetric rows, int8 weights: the VNNI kernel (the same int32 sums)
        acc = (_int_matmul_sym(q, w.stacked, w.index) if isinstance(w, LayerSlice)
               else _int_matmul_sym(q, jnp.asarray(w), jnp.int32(-1)))
    elif isinstance(w, LayerSlice):  # one block of a layer scan's stacked weights, read in place
        acc = _int_matmul_native_at(q, z, w.stacked, w.index)
    else:
        acc = (_int_matmul_native if _native(ctx) else _int_matmul)(q, z, w)
    scale = _rounded(s[:, None] * jnp.asarray(_weight_scales(ctx, o))[None, :])
    y = _activation(ctx, _scale_out(acc, scale, b), fused_activation_function)
    return y.reshape(lead + (o,))


def _conv_input(ctx, x, asymmetric):
    """Quantize each image; return ``q - zp`` (int32 NHWC) and the scales."""
    x = jnp.asarray(x, jnp.float32)
    if x.ndim != 4:
        raise ctx.error(f"expected a 4-D NHWC input, got {tuple(x.shape)}")
    q, s, z = _quantize(x.reshape(x.shape[0], -1), asymmetric)
    q = q.reshape(x.shape)
    if z is not None:
        q = q - z[:, None, None, None]
    return q, s


@register(OP_SET, "CONV_2D", differentiable=False, traced_weights=True, hybrid_eligible=dense_eligible())
def CONV_2D(ctx, x, w, b=None, *, padding="SAME", stride_w=1, stride_h=1,
            dilation_w_factor=1, dilation_h_factor=1, fused_activation_function="NONE"):
    """Hybrid TFLite CONV_2D (``conv.cc`` ``EvalHybrid`` / ``EvalHybridPerChannel``).

    ``x`` float32 NHWC, ``w`` int8 OHWI, ``b`` float32 ``[O]``. Each image is
    quantized: asymmetrically when the weights have per-channel scales that
    are not all equal (TFLite's per-channel path), else symmetrically;
    integer convolution (grouped when ``C_in`` is a multiple of ``I``),
    ``y = f32(acc) * f32(s_img * s_w[o]) + b[o]``, fused activation.
    """
    if np.ndim(w) != 4:
        raise ctx.error(f"expected OHWI weights, got {tuple(np.shape(w))}")
    q, s = _conv_input(ctx, x, _per_channel(ctx))
    c_in, o, i = q.shape[3], np.shape(w)[0], np.shape(w)[3]
    if i == 0 or c_in % i:
        raise ctx.error(f"input has {c_in} channels, not a multiple of the weights' {i}")
    strides = (int(stride_h), int(stride_w))
    dil = (int(dilation_h_factor), int(dilation_w_factor))
    pads = _padding(ctx, padding, q.shape[1:3], np.shape(w)[1:3], strides, dil)
    acc = lax.conv_general_dilated(q, _ints(w), strides, pads,
                                   rhs_dilation=dil, dimension_numbers=_NHWC_OHWI,
                                   feature_group_count=c_in // i, preferred_element_type=jnp.int32)
    scale = _rounded(s[:, None, None, None] * jnp.asarray(_weight_scales(ctx, o)))
    return _activation(ctx, _scale_out(acc, scale, b), fused_activation_function)


@register(OP_SET, "DEPTHWISE_CONV_2D", differentiable=False, traced_weights=True, hybrid_eligible=dense_eligible())
def DEPTHWISE_CONV_2D(ctx, x, w, b=None, *, padding="SAME", stride_w=1, stride_h=1, depth_multiplier=0,
                      dilation_w_factor=1, dilation_h_factor=1, fused_activation_function="NONE"):
    """Hybrid TFLite DEPTHWISE_CONV_2D (``depthwise_conv.cc``
    ``EvalHybridPerChannel``): each image quantized asymmetrically, weights
    ``[1, KH, KW, C*M]`` with scales along dimension 3, ``y = (f32(acc) *
    s_w[c]) * s_img + b[c]`` (three float32 roundings), fused activation.

    LiteRT 2.3.0 reads one scale per output channel even when the weights
    are per-tensor (out of bounds); here a single scale is broadcast.
    """
    if np.ndim(w) != 4 or np.shape(w)[0] != 1:
        raise ctx.error(f"expected [1, H, W, C*M] weights, got {tuple(np.shape(w))}")
    q, s = _conv_input(ctx, x, True)
    c, oc = q.shape[3], np.shape(w)[3]
    if c == 0 or oc % c:
        raise ctx.error(f"{oc} output channels are not a multiple of {c} input channels")
    strides = (int(stride_h), int(stride_w))
    dil = (int(dilation_h_factor), int(dilation_w_factor))
    pads = _padding(ctx, padding, q.shape[1:3], np.shape(w)[1:3], strides, dil)
    acc = kernels.depthwise_conv(q, _ints(w)[0], window_strides=strides,
                                 padding=pads, rhs_dilation=dil, lhs_spec="NHWC",
                                 backend=getattr(ctx, "backend", None),
                                 options=kernels.kernel_options(ctx)).astype(jnp.int32)
    y = _rounded(acc.astype(jnp.float32) * jnp.asarray(_weight_scales(ctx, oc))) * s[:, None, None, None]
    if b is not None:
        y = _rounded(y) + jnp.asarray(b, jnp.float32)
    return _activation(ctx, y, fused_activation_function)


@register(OP_SET, "BATCH_MATMUL", differentiable=False, traced_weights=True,
          hybrid_eligible=dense_eligible(per_tensor_only=True))
def BATCH_MATMUL(ctx, a, b, *, adj_x=False, adj_y=False, asymmetric_quantize_inputs=False):
    """Hybrid TFLite BATCH_MATMUL (``batch_matmul.cc`` ``EvalHybrid``): float32
    lhs ``a`` ``[..., M, K]``, int8 constant rhs ``b`` ``[..., K, N]``
    (per-tensor scale), batch dims broadcast. Each lhs row is quantized,
    ``y = f32(acc) * f32(s_row * s_b)``.
    """
    a = jnp.asarray(a, jnp.float32)
    if adj_x:
        a = jnp.swapaxes(a, -1, -2)
    bi = _ints(b)
    if adj_y:
        bi = jnp.swapaxes(bi, -1, -2)
    if a.ndim < 2 or bi.ndim < 2 or a.shape[-1] != bi.shape[-2]:
        raise ctx.error(f"shapes {tuple(a.shape)} and {tuple(bi.shape)} do not contract")
    k = a.shape[-1]
    q, s, z = _quantize(a.reshape(-1, k), asymmetric_quantize_inputs)
    q = q.reshape(a.shape)
    acc = jnp.matmul(q, jnp.asarray(bi), preferred_element_type=jnp.int32)
    if z is not None:
        col_sums = bi.sum(axis=-2)
        acc = acc - z.reshape(a.shape[:-1])[..., None] * col_sums[..., None, :]
    ws = _weight_scales(ctx, 1)[0]
    scale = _rounded(s * jnp.float32(ws)).reshape(a.shape[:-1])[..., None]
    return _scale_out(acc, scale, None)


@register(OP_SET, "TRANSPOSE_CONV", differentiable=False, static_inputs=(0,), traced_weights=True,
          hybrid_eligible=dense_eligible(act=2))  # (output_shape, weights, input, bias)
def TRANSPOSE_CONV(ctx, output_shape, w, x, b=None, *, padding="SAME", stride_w=1, stride_h=1,
                   fused_activation_function="NONE"):
    """Hybrid TFLite TRANSPOSE_CONV (``transpose_conv.cc`` ``EvalHybrid``).

    ``output_shape`` int32 [4] (static), ``w`` int8 ``[O, KH, KW, C]``,
    ``x`` float32 NHWC, ``b`` float32 ``[O]``. Each image is quantized
    asymmetrically (per-tensor weights too). TFLite then scatters in float:
    for each input pixel in
    raster order, each input channel and each tap, ``out[oy, ox, o] +=
    f32(f32(f32((q - zp) * w) * s_w[o]) * s_img)``; bias and fused activation
    follow. For one output element the additions come from input pixels in
    raster order, i.e. from taps in descending ``(ky, kx)`` order, channel by
    channel: that is the order of the loop here (taps unrolled, channels in a
    ``fori_loop``; a tap that misses the element adds 0.0, which is exact).
    Cost: ``KH * KW * C`` full-output additions.
    """
    oshape = [int(d) for d in np.asarray(output_shape).reshape(-1)]
    if len(oshape) != 4 or np.ndim(w) != 4 or jnp.ndim(x) != 4:
        raise ctx.error(f"expected 4-D output_shape, input and OHWI weights, got {oshape}, "
                        f"{tuple(jnp.shape(x))}, {tuple(np.shape(w))}")
    o, kh, kw, c_w = np.shape(w)
    q, s = _conv_input(ctx, x, True)
    n, h, wd, c = q.shape
    # output_shape's batch entry stays the file's 1 when fbjax.load(..., batch_size=...)
    # rewrote the batch (n may then be symbolic); the output follows the input's batch
    if c != c_w or oshape[0] not in (1, n) or oshape[3] != o:
        raise ctx.error(f"input {tuple(q.shape)}, weights {tuple(np.shape(w))} and output_shape {oshape} disagree")
    oh, ow = oshape[1], oshape[2]
    sh, sw = int(stride_h), int(stride_w)
    ph = _padding(ctx, padding, [oh], [kh], [sh], [1])[0][0]
    pw = _padding(ctx, padding, [ow], [kw], [sw], [1])[0][0]
    ws = jnp.asarray(_weight_scales(ctx, o))
    s_img = s[:, None, None, None]
    wi = _ints(w)
    out = jnp.zeros((n, oh, ow, o), jnp.float32)
    for ky in reversed(range(kh)):
        for kx in reversed(range(kw)):
            lo_y, lo_x = ky - ph, kx - pw
            cfg = [(0, 0, 0), (lo_y, oh - (h - 1) * sh - 1 - lo_y, sh - 1),
                   (lo_x, ow - (wd - 1) * sw - 1 - lo_x, sw - 1), (0, 0, 0)]
            w_tap = jnp.asarray(wi[:, ky, kx, :].T)  # [C, O]

            def body(ci, acc, w_tap=w_tap, cfg=cfg):
                qc = lax.dynamic_index_in_dim(q, ci, axis=3, keepdims=True)  # [N, H, W, 1]
                wc = lax.dynamic_index_in_dim(w_tap, ci, axis=0, keepdims=True)  # [1, O]
                t = _rounded((qc * wc).astype(jnp.float32) * ws) * s_img
                return acc + lax.pad(_rounded(t), jnp.float32(0), cfg)

            out = lax.fori_loop(0, c, body, out)
    if b is not None:
        out = out + jnp.asarray(b, jnp.float32)
    return _activation(ctx, out, fused_activation_function)


def per_channel_quantize(ctx, x):
    """float -> integer QUANTIZE whose output has per-channel scales
    (``reference_ops::PerChannelQuantize``, which the builtin kernel uses):
    ``q = round_half_away(float32(x / s[c])) + zp[c]`` clamped to the output
    type, ``c`` the index along ``quantized_dimension``. (Per-tensor QUANTIZE
    instead multiplies by the reciprocal and rounds half to even.) Called by
    the ``"tflite.int"`` QUANTIZE lowering. Non-finite inputs are not
    reproduced (TFLite's float -> int32 cast of them is undefined)."""
    vo = ctx.outputs[0]
    x = jnp.asarray(x, jnp.float32)
    s = np.asarray(vo.quant.scale, _F32).reshape(-1)
    z = np.asarray(vo.quant.zero_point).astype(np.int64).reshape(-1)
    axis = int(vo.quant.quantized_dimension)
    if not 0 <= axis < x.ndim or x.shape[axis] != s.size:
        raise ctx.error(f"{s.size} output scales along dimension {axis} of a {tuple(x.shape)} tensor")
    if z.size not in (1, s.size):
        raise ctx.error(f"{z.size} zero points for {s.size} scales")
    shape = [1] * x.ndim
    shape[axis] = s.size
    zb = np.broadcast_to(z, s.shape).reshape(shape).astype(np.int32)
    info = np.iinfo(np.dtype(vo.dtype))
    q = lax.round(_div(x, jnp.asarray(s.reshape(shape))), lax.RoundingMethod.AWAY_FROM_ZERO)
    # Clamp in float before the int32 conversion (huge values and inf), then add zp and clamp again.
    q = jnp.clip(q, -2.0 ** 31, 2.0 ** 31 - 256).astype(jnp.int32) + jnp.asarray(zb)
    return jnp.clip(q, int(info.min), int(info.max)).astype(np.dtype(vo.dtype))


def _fc_blockwise(ctx, x2d, w, b):
    """FULLY_CONNECTED with blockwise-quantized int4 weights (``fully_connected.cc``
    ``EvalBlockwise4Bit``): each input row quantized asymmetrically (``q``,
    ``s``, ``zp``); per output channel, over the blocks in order, ``out +=
    f32(sum_block(q * w)) * scale[o, blk]`` and ``kfsum += scale[o, blk] *
    f32(sum_block(w))`` in float32; then ``out = (out - f32(zp) * kfsum) * s
    + bias``. LiteRT applies no fused activation on this path; neither does
    fbjax."""
    v = ctx.inputs[1]
    bs = int(v.quant.block_size)
    o, i = np.shape(w)
    nb = i // bs
    scales = ctx.quant_scale(1).reshape(o, nb)  # numpy, or traced per block inside a layer scan
    # The kernel takes the float input (it quantizes the rows itself) and has no derivative rule, so its
    # input is a stop_gradient: this op is registered differentiable=False, and float mode's
    # straight-through routes the gradient to the float op, never using the hybrid forward's own.
    xf = lax.stop_gradient(jnp.asarray(x2d, jnp.float32))
    if isinstance(w, LayerSlice):  # one block of a layer scan's stacked weights, read in place (native only)
        blk = ctx.quant_scale_block(1) if hasattr(ctx, "quant_scale_block") else None
        if blk is not None and blk.index is w.index:  # the scales' block read in place too
            scales = jnp.asarray(blk.stacked, jnp.float32).reshape((-1, o, nb))
        out = _block_fc_native_at(xf, w.stacked.reshape((-1, o, nb, bs)), jnp.asarray(scales), w.index)
    elif _native(ctx):  # the whole of it in the kernel, the same float operations in the same order
        wb = jnp.asarray(w).reshape(o, nb, bs)  # int4/int8 as held (a buffer, a constant, or traced in float mode)
        out = _block_fc_native(xf, wb, jnp.asarray(scales))
    else:
        wb = jnp.asarray(w).reshape(o, nb, bs)
        q, s, z = asymmetric_quantize(x2d)
        rows = q.shape[0]
        acc, ksum = _block_matmul(q.reshape(rows, nb, bs), wb)  # [blocks, R, O]; [blocks, O]
        ksum = ksum.astype(jnp.float32)  # exact in float32

        def block(carry, xs):  # TFLite's order of float32 additions, one block after the other
            out, kfsum = carry
            acc_k, ksum_k, sk = xs
            return (out + _rounded(acc_k.astype(jnp.float32) * sk[None, :]), kfsum + _rounded(sk * ksum_k)), None

        # a scan, not a Python loop: one compiled body however many blocks (I / 32 of them)
        (out, kfsum), _ = lax.scan(block, (jnp.zeros((rows, o), jnp.float32), jnp.zeros(o, jnp.float32)),
                                   (acc, ksum, jnp.asarray(scales).T))
        out = out - _rounded(z.astype(jnp.float32)[:, None] * kfsum[None, :])
        out = _rounded(out * s[:, None])
    if b is not None:
        out = out + jnp.asarray(b, jnp.float32)[None, :]
    return out


def _row_scales(ctx, rows: int) -> np.ndarray:
    """EMBEDDING_LOOKUP's table scales: one per tensor, or one per row
    (``quantized_dimension`` 0), as float32 ``[rows]``."""
    v = ctx.inputs[1]
    s = np.asarray(v.quant.scale, _F32).reshape(-1)
    if s.size > 1 and (v.quant.quantized_dimension != 0 or s.size != rows):
        raise ctx.error(f"{s.size} table scales along dimension {v.quant.quantized_dimension}; "
                        f"EMBEDDING_LOOKUP takes one scale or one per row ({rows})")
    return np.broadcast_to(s, (rows,)).astype(_F32)


@register(OP_SET, "EMBEDDING_LOOKUP", differentiable=False, hybrid_eligible=_lookup_eligible)
def EMBEDDING_LOOKUP(ctx, ids, table):
    """Hybrid TFLite EMBEDDING_LOOKUP (``embedding_lookup.cc`` ``EvalHybrid``).

    ``ids`` int32 ``[N]``, ``table`` int8 (INT4 files: unpacked to int8)
    ``[rows, ...]`` with a per-tensor scale or one scale per row: output
    float32 ``[N, ...]`` = ``table[id] * scale[id]``. TFLite multiplies the
    integer by the scale in double and stores float32; the product of an
    8-bit integer and a float32 is exact in double, so this is the float32
    product (one rounding). An id outside ``[0, rows)`` is an error in
    TFLite; here it is clamped (a traced index cannot raise).
    """
    shape = tuple(np.shape(table))  # a numpy constant, or a weight buffer (traced; int4 held packed)
    rows = shape[0]
    q = ctx.inputs[1].quant
    idx = jnp.clip(jnp.asarray(ids, jnp.int32), 0, rows - 1)
    vals = jnp.take(jnp.asarray(table), idx, axis=0).astype(jnp.float32)  # only the looked-up rows widen
    if q.block_size:  # blockwise (int4, EvalBlockwise): row r's block k scaled by scale[r, k]
        per = jnp.take(jnp.asarray(np.asarray(q.scale, _F32).reshape(rows, -1)), idx, axis=0)
        per = jnp.repeat(per, q.block_size, axis=-1).reshape(vals.shape)
    else:
        per = jnp.take(jnp.asarray(_row_scales(ctx, rows)), idx, axis=0).reshape(idx.shape + (1,) * (len(shape) - 1))
    return vals * per
