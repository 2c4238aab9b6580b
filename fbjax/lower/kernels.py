"""Shared JAX kernels used by every op set's lowerings.

Each kernel here is format-neutral: it takes arrays plus plain Python
parameters (sizes, strides, explicit padding pairs, layout strings) and knows
nothing about TFLite, ONNX or StableHLO attribute spellings. Op-set modules
translate their attributes into these parameters.

Contents:

* padding rules: :func:`same_padding` / :func:`explicit_padding` (TF/TFLite
  ``SAME``/``VALID``);
* convolution: :func:`conv` (any ``dimension_numbers``),
  :func:`conv_transpose`, :func:`depthwise_conv` (two strategies, see
  ``KernelOptions.depthwise_strategy``);
* pooling: :func:`max_pool`, :func:`avg_pool` (``lax.reduce_window``);
* resize coordinate maps: :func:`linear_resize_coords`,
  :func:`nearest_resize_indices`, and :func:`resize_linear` /
  :func:`resize_nearest` that apply them;
* fused activations: :func:`fused_activation`, :func:`activation_range`,
  :func:`clamp_to_activation_range`.

Kernel choices: the kernels taking ``backend`` (:func:`conv`,
:func:`depthwise_conv`, :func:`use_shifted_window`) take XLA:CPU's fast
paths when it is ``"cpu"`` (``None``: ``jax.default_backend()``) and the
plain ``jax.lax`` kernels for any other value (``"gpu"``, ``"tpu"``), but
for ``"cpu_quick"``, which a CPU program built with the ``kernels="quick"``
lowering option passes (``ctx.backend``, see
:data:`fbjax.lower.build.KERNEL_CHOICES`: the quick tier of
:mod:`fbjax.executors.tiered`): the plain kernels except large depthwise
convolutions (``KernelOptions.quick_shifted_min_output``).

Every choice and threshold that changes the computed program comes from the
program's :class:`fbjax.options.KernelOptions` (``options``: the lowerings
pass :func:`kernel_options` of their ``ctx``; None: the defaults), never from
a module global: it is part of every cache key.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..options import KernelOptions, kernel_options
from .depthwise_vjp import shifted_depthwise

def precision(ctx=None):
    """The ``jax.lax.Precision`` of convolutions and matrix products of the
    program ``ctx`` (a lowering context) belongs to
    (``KernelOptions.precision``; default ``HIGHEST``)."""
    return kernel_options(ctx).lax_precision


_ACTIVATIONS = ("NONE", "RELU", "RELU_N1_TO_1", "RELU6", "TANH", "SIGN_BIT")


# --- padding -----------------------------------------------------------------

_LOW_FLOATS = frozenset({np.dtype(np.float16), np.dtype(jnp.bfloat16)})


def ieee_divide(a, b):
    """Float ``a / b`` (broadcasting) rounded once per element, as IEEE 754
    division, TFLite's DIV kernel, ONNX ``Div`` (onnxruntime) and
    ``stablehlo.divide`` compute it.

    XLA's algebraic simplifier rewrites a division by a broadcast or a
    constant (``x / broadcast(y)``) into ``x * broadcast(1 / y)``: two
    roundings, 1 ulp off in about a third of the elements. The divisor goes
    through an optimization barrier at the result's shape, so XLA keeps the
    division. Shapes: ``a`` and ``b`` broadcast together; the result has
    their broadcast shape and dtype."""
    a, b = jnp.asarray(a), jnp.asarray(b)
    shape = jnp.broadcast_shapes(a.shape, b.shape)
    return jnp.divide(a, lax.optimization_barrier(jnp.broadcast_to(b, shape)))


def accumulation_dtype(*operands):
    """``preferred_element_type`` for a contraction: float32 when an operand is
    float16/bfloat16 (``fbjax.load(..., compute_dtype=...)``: products
    accumulate in float32, the result is float32), else ``None`` (the
    operands' own type)."""
    if any(np.dtype(getattr(o, "dtype", np.float32)) in _LOW_FLOATS for o in operands):
        return jnp.float32
    return None


def same_padding(in_size: int, kernel: int, stride: int = 1, dilation: int = 1) -> tuple[int, int]:
    """TF/TFLite ``SAME`` padding of one spatial dimension.

    ``out = ceil(in / stride)``,
    ``total = max((out - 1) * stride + (kernel - 1) * dilation + 1 - in, 0)``,
    ``before = total // 2``; the odd extra element goes after (TFLite
    ``kernels/padding.h``, ``ComputePaddingWithOffset``).
    """
    out = -(-in_size // stride)
    total = max((out - 1) * stride + (kernel - 1) * dilation + 1 - in_size, 0)
    return total // 2, total - total // 2


def explicit_padding(
    padding: str,
    in_sizes: Sequence[int],
    kernel_sizes: Sequence[int],
    strides: Sequence[int],
    dilations: Optional[Sequence[int]] = None,
) -> list[tuple[int, int]]:
    """``[(before, after)]`` per spatial dimension for ``"SAME"`` / ``"VALID"``.

    Raises:
        ValueError: ``padding`` is neither.
    """
    dilations = dilations or [1] * len(in_sizes)
    if padding == "VALID":
        return [(0, 0)] * len(in_sizes)
    if padding == "SAME":
        return [same_padding(i, k, s, d) for i, k, s, d in zip(in_sizes, kernel_sizes, strides, dilations)]
    raise ValueError(f"unsupported padding {padding!r} (expected 'SAME' or 'VALID')")


def conv_output_size(in_size: int, kernel: int, stride: int, dilation: int, pad: tuple[int, int]) -> int:
    """Output length of a strided, dilated, padded window along one dimension."""
    eff = (kernel - 1) * dilation + 1
    return max((in_size + pad[0] + pad[1] - eff) // stride + 1, 0)


# --- convolution -------------------------------------------------------------

def weight_layout(ctx, position: int, native: str) -> str:
    """Layout of the weight at input ``position`` of ``ctx``'s node.

    ``native`` (the file's layout) unless the program was built for
    inference with that weight relaid (``ctx.options["weight_layouts"]``:
    ``{id(Value): layout}``, see :mod:`fbjax.executors.planner`); the lowering
    then states the given layout in its ``dimension_numbers``.
    """
    layouts = (getattr(ctx, "options", None) or {}).get("weight_layouts")
    if not layouts or position >= len(ctx.inputs) or ctx.inputs[position] is None:
        return native
    return layouts.get(id(ctx.inputs[position]), native)


def conv(
    x,
    w,
    *,
    window_strides: Sequence[int],
    padding: Sequence[tuple[int, int]],
    dimension_numbers: tuple[str, str, str],
    rhs_dilation: Optional[Sequence[int]] = None,
    lhs_dilation: Optional[Sequence[int]] = None,
    feature_group_count: int = 1,
    precision=None,
    backend: Optional[str] = None,
    options: Optional[KernelOptions] = None,
):
    """N-d convolution in the operands' own layouts (``lax.conv_general_dilated``).

    ``dimension_numbers`` are layout strings such as
    ``("NHWC", "OHWI", "NHWC")``; grouped convolutions use
    ``feature_group_count`` (the kernel's ``I`` dimension is then
    ``C_in / groups``).

    On the CPU backend a grouped convolution never reaches XLA's grouped
    path, which is both slow there and, with jaxlib 0.10.2's YNNPACK fusion,
    miscompiled under ``jit`` (see ``KernelOptions.depthwise_strategy``):
    depthwise cases (one input channel per group) go through
    :func:`depthwise_conv`, other groupings through one convolution per
    group, concatenated; small ungrouped first layers go through kernel taps
    (``KernelOptions.small_conv_taps``: XLA:CPU's convolution runs them at
    ~8 GFLOP/s; hand_recrop's 256x256x3 -> 128x128x8 layer: 0.87 ms of a
    1.4 ms model, 0.29 ms as taps; 4x faster at batch 32; measured on the
    shared models, interleaved A/B, batch 1 / 32: hand_recrop (8 outputs)
    0.69x / 0.62x the time, face_landmark (16) 0.86x, selfie_segmentation
    (16) 0.90x / 0.90x; with 24 or 64 outputs 1.02-1.11x, and 5x5 kernels
    slower too, hence ``small_conv_max_out`` 16).
    Any other ``backend`` (``"cpu_quick"`` included: the CPU quick tier,
    compiled without YNNPACK fusion) gets one ``lax.conv_general_dilated``.
    ``options``: the program's :class:`~fbjax.options.KernelOptions` (None:
    defaults); ``precision`` None: its ``precision``.
    """
    options = kernel_options(options)
    precision = options.lax_precision if precision is None else precision
    groups = int(feature_group_count)
    lhs_spec, rhs_spec, out_spec = dimension_numbers
    undilated = lhs_dilation is None or all(int(d) == 1 for d in lhs_dilation)
    cpu = (backend or jax.default_backend()) == "cpu"
    if groups > 1 and undilated and cpu:
        return _grouped_conv_cpu(x, w, groups, window_strides, padding, dimension_numbers,
                                 rhs_dilation, precision, options)
    if cpu and groups == 1 and undilated and _taps_conv_applies(x, w, padding, dimension_numbers, options):
        return _taps_conv(x, w, window_strides, padding, rhs_dilation, rhs_spec)
    return lax.conv_general_dilated(
        x,
        w,
        window_strides=tuple(int(s) for s in window_strides),
        padding=[(int(a), int(b)) for a, b in padding],
        lhs_dilation=None if lhs_dilation is None else tuple(int(d) for d in lhs_dilation),
        rhs_dilation=None if rhs_dilation is None else tuple(int(d) for d in rhs_dilation),
        dimension_numbers=dimension_numbers,
        feature_group_count=int(feature_group_count),
        precision=precision,
        preferred_element_type=accumulation_dtype(x, w),
    )


def _taps_conv_applies(x, w, padding, dimension_numbers, options: KernelOptions) -> bool:
    lhs_spec, rhs_spec, out_spec = dimension_numbers
    if lhs_spec != "NHWC" or out_spec != "NHWC" or sorted(rhs_spec) != sorted("OHWI") or w.ndim != 4:
        return False
    kh, kw, ci, co = (w.shape[rhs_spec.index(c)] for c in "HWIO")
    return (0 < ci * kh * kw <= options.small_conv_taps and co <= options.small_conv_max_out
            and all(int(a) >= 0 and int(b) >= 0 for a, b in padding))


def _taps_conv(x, w, window_strides, padding, rhs_dilation, rhs_spec):
    """NHWC convolution as ``sum_{i,j,c} slice(x_padded)[..., c] * w[i, j, c, :]``
    (strided slices of the padded input, one multiply-add per kernel tap and
    input channel); ``w`` in any ``OHWI`` permutation. Same result as
    ``lax.conv_general_dilated`` up to float32 summation order."""
    w = jnp.transpose(w, [rhs_spec.index(c) for c in "HWIO"])
    if accumulation_dtype(x, w) is not None:  # reduced compute dtype: multiply-add in float32
        x, w = x.astype(jnp.float32), w.astype(jnp.float32)
    kh, kw, ci, co = w.shape
    n, h, wd, _ = x.shape
    (pt, pb), (pl, pr) = [(int(a), int(b)) for a, b in padding]
    sh, sw = (int(v) for v in window_strides)
    dh, dw = (1, 1) if rhs_dilation is None else (int(v) for v in rhs_dilation)
    oh = (h + pt + pb - (kh - 1) * dh - 1) // sh + 1
    ow = (wd + pl + pr - (kw - 1) * dw - 1) // sw + 1
    xp = jnp.pad(x, ((0, 0), (pt, pb), (pl, pr), (0, 0))) if pt or pb or pl or pr else x
    acc = None
    for i in range(kh):
        for j in range(kw):
            tap = lax.slice(xp, (0, i * dh, j * dw, 0), (n, i * dh + (oh - 1) * sh + 1,
                                                         j * dw + (ow - 1) * sw + 1, ci), (1, sh, sw, 1))
            for c in range(ci):
                term = tap[..., c:c + 1] * w[i, j, c]
                acc = term if acc is None else acc + term
    return acc


def _grouped_conv_cpu(x, w, groups, window_strides, padding, dimension_numbers, rhs_dilation, precision, options):
    lhs_spec, rhs_spec, out_spec = dimension_numbers
    c_axis, o_axis, i_axis = lhs_spec.index("C"), rhs_spec.index("O"), rhs_spec.index("I")
    spatial = [c for c in lhs_spec if c not in "NC"]
    if w.shape[i_axis] == 1 and x.shape[c_axis] == groups and out_spec == lhs_spec:
        # Depthwise: kernel -> [*spatial (lhs order), O] with O = C * M.
        order = [rhs_spec.index(c) for c in spatial] + [o_axis]
        wd = jnp.transpose(jnp.squeeze(w, i_axis), [a - (a > i_axis) for a in order])
        return depthwise_conv(x, wd, window_strides=window_strides, padding=padding,
                              rhs_dilation=rhs_dilation, lhs_spec=lhs_spec, strategy="shifted", options=options)
    pointwise = all(w.shape[rhs_spec.index(c)] == 1 for c in spatial) and all(
        int(s) == 1 for s in window_strides) and not any(int(a) or int(b) for a, b in padding)
    if pointwise and out_spec == lhs_spec:
        return _grouped_pointwise(x, w, groups, dimension_numbers, precision)
    xs = jnp.split(x, groups, axis=c_axis)
    ws = jnp.split(w, groups, axis=o_axis)
    outs = [
        lax.conv_general_dilated(
            xg, wg,
            window_strides=tuple(int(s) for s in window_strides),
            padding=[(int(a), int(b)) for a, b in padding],
            rhs_dilation=None if rhs_dilation is None else tuple(int(d) for d in rhs_dilation),
            dimension_numbers=dimension_numbers,
            precision=precision,
            preferred_element_type=accumulation_dtype(xg, wg),
        )
        for xg, wg in zip(xs, ws)
    ]
    return jnp.concatenate(outs, axis=out_spec.index("C"))


def _grouped_pointwise(x, w, groups, dimension_numbers, precision):
    """Grouped 1x1 convolution (stride 1, no padding) as one batched matrix
    product over the groups: ``out[g] = x[g] @ w[g]`` (channel ``g*I + i``
    of ``x`` feeds output channels ``g*(O/G) ...``), instead of one
    convolution per group and a concatenation (ShuffleNet: 4 groups, 32
    layers)."""
    lhs_spec, rhs_spec, _ = dimension_numbers
    c_axis = lhs_spec.index("C")
    o, i = w.shape[rhs_spec.index("O")], w.shape[rhs_spec.index("I")]
    # kernel -> [G, O/G, I] (its spatial dims are all 1)
    wk = jnp.transpose(w, [rhs_spec.index("O"), rhs_spec.index("I")]
                       + [rhs_spec.index(c) for c in rhs_spec if c not in "OI"]).reshape(groups, o // groups, i)
    xs = x.reshape(x.shape[:c_axis] + (groups, i) + x.shape[c_axis + 1:])
    if c_axis == 1:
        # channels-first: [G, O/G, N, *spatial], already [N, O, *spatial] in memory when N == 1
        y = lax.dot_general(wk, xs, (((2,), (2,)), ((0,), (1,))), precision=precision,
                            preferred_element_type=accumulation_dtype(x, w))
        perm = [2, 0, 1] + list(range(3, y.ndim))
        return jnp.transpose(y, perm).reshape(x.shape[:1] + (o,) + x.shape[2:])
    # dot_general: batch G, contract I -> [G, *other x dims, O/G]
    y = lax.dot_general(xs, wk, (((c_axis + 1,), (2,)), ((c_axis,), (0,))), precision=precision,
                        preferred_element_type=accumulation_dtype(x, w))
    # -> x's layout with the channel axis (G, O/G) in place of C
    perm = list(range(1, c_axis + 1)) + [0, y.ndim - 1] + list(range(c_axis + 1, y.ndim - 1))
    y = jnp.transpose(y, perm)
    return y.reshape(x.shape[:c_axis] + (o,) + x.shape[c_axis + 1:])


def conv_transpose(
    x,
    w,
    *,
    strides: Sequence[int],
    padding: Sequence[tuple[int, int]],
    output_sizes: Sequence[int],
    dimension_numbers: tuple[str, str, str],
    rhs_dilation: Optional[Sequence[int]] = None,
    feature_group_count: int = 1,
    precision=None,
    backend: Optional[str] = None,
    options: Optional[KernelOptions] = None,
):
    """Transposed (fractionally strided) convolution, scatter semantics.

    ``out[o] += x[i] * w[k]`` for every ``o = i * stride + k * dilation -
    padding_before`` inside ``[0, output_size)`` -- TFLite
    ``reference_ops::TransposeConv``, ONNX ``ConvTranspose``. ``w`` is laid
    out as ``dimension_numbers[1]`` says, with ``O`` the *output* channels
    of this op (no channel swap is done here); ``padding`` is the forward
    convolution's ``(before, after)`` per spatial dimension (only ``before``
    matters: ``output_sizes`` fixes the extent). Computed as a convolution
    of the stride-dilated input with the spatially flipped kernel
    (:func:`conv`; ``precision``, ``backend``, ``options`` as there).
    """
    rhs_spec = dimension_numbers[1]
    lhs_spec = dimension_numbers[0]
    spatial = [c for c in lhs_spec if c not in "NC"]
    k_axes = [rhs_spec.index(c) for c in spatial]
    in_axes = [lhs_spec.index(c) for c in spatial]
    rhs_dilation = list(rhs_dilation or [1] * len(spatial))
    pads, crops = [], []
    for ax, kax, s, d, (lo_f, _), out in zip(in_axes, k_axes, strides, rhs_dilation, padding, output_sizes):
        eff = (w.shape[kax] - 1) * d + 1
        lo = eff - 1 - lo_f
        hi = int(out) + eff - 2 - (x.shape[ax] - 1) * s - lo
        # lax pads may be negative (crop), but keep them >= 0 and crop after.
        pads.append((max(lo, 0), max(hi, 0)))
        crops.append((max(-lo, 0), int(out)))
    y = conv(
        x,
        lax.rev(w, k_axes),
        window_strides=[1] * len(spatial),
        padding=pads,
        dimension_numbers=dimension_numbers,
        lhs_dilation=strides,
        rhs_dilation=rhs_dilation,
        feature_group_count=feature_group_count,
        precision=precision,
        backend=backend,
        options=options,
    )
    out_spec = dimension_numbers[2]
    for c, (start, n) in zip(spatial, crops):
        ax = out_spec.index(c)
        if start or y.shape[ax] != n:
            y = lax.slice_in_dim(y, start, start + n, axis=ax)
    return y


def _output_size(x, w, lhs_spec, window_strides, rhs_dilation, padding) -> Optional[int]:
    """Elements of a depthwise convolution's output (None: a symbolic dimension)."""
    spatial = [c for c in lhs_spec if c not in "NC"]
    try:
        return int(x.shape[lhs_spec.index("N")]) * int(w.shape[-1]) * math.prod(
            conv_output_size(int(x.shape[lhs_spec.index(c)]), int(k), int(s), int(d), (int(p[0]), int(p[1])))
            for c, k, s, d, p in zip(spatial, w.shape[:len(spatial)], window_strides, rhs_dilation, padding))
    except (TypeError, jax.errors.ConcretizationTypeError):  # symbolic (jax.export) dimensions
        return None


def _depthwise_strategy(backend: Optional[str], strategy: Optional[str], options: KernelOptions,
                        out_size=None) -> str:
    """``strategy``, else ``options.depthwise_strategy``, else by backend
    (``out_size``: ``f() -> int or None``, the output's elements, for ``"cpu_quick"``)."""
    strategy = strategy or options.depthwise_strategy
    if strategy is None:
        backend = backend or jax.default_backend()
        if backend == "cpu_quick":
            n = out_size() if out_size is not None else None
            strategy = "shifted" if n is None or n > options.quick_shifted_min_output else "conv"
        else:
            strategy = "shifted" if backend == "cpu" else "conv"
    if strategy not in ("conv", "shifted"):
        raise ValueError(f"depthwise strategy must be None, 'conv' or 'shifted', not {strategy!r}")
    return strategy


def depthwise_conv(
    x,
    w,
    *,
    window_strides: Sequence[int],
    padding: Sequence[tuple[int, int]],
    rhs_dilation: Optional[Sequence[int]] = None,
    lhs_spec: str = "NHWC",
    backend: Optional[str] = None,
    strategy: Optional[str] = None,
    options: Optional[KernelOptions] = None,
):
    """Depthwise convolution with any depth multiplier.

    Args:
        x: input laid out as ``lhs_spec`` (``N``, ``C`` and spatial letters).
        w: kernel ``[*kernel_spatial, C * M]`` (spatial dims in the order
            they appear in ``lhs_spec``); output channel ``c * M + m`` reads
            input channel ``c`` (TFLite ``DEPTHWISE_CONV_2D`` weights
            ``[1, H, W, C*M]`` minus the leading 1).
        window_strides, padding, rhs_dilation: per spatial dimension;
            ``padding`` is explicit ``(before, after)`` pairs.
        backend: ``"cpu"`` (shifted), ``"gpu"``, ... (conv),
            ``"cpu_quick"`` (by output size, ``options.quick_shifted_min_output``:
            XLA:CPU runs a grouped convolution at ~0.1-0.3 GFLOP/s, a cost per
            kernel tap that grows with the output, while the shifted form
            costs ~1 ms of trace + lowering + ``-O0`` compile per tap
            whatever the output size; measured one layer per program:
            96x96x32 5x5 grouped 85 ms per call vs shifted 15 ms, 14x14x384
            5x5 18 vs 3 ms, 128x128x24 3x3 51 vs 5 ms): selects the strategy
            (see the module docstring).
        strategy: ``"conv"`` (``lax.conv_general_dilated`` with
            ``feature_group_count = C``) or ``"shifted"`` (sum over kernel
            taps of strided slices of the padded input times the tap's
            weights); default ``options.depthwise_strategy``, then by backend.
        options: the program's :class:`~fbjax.options.KernelOptions` (None:
            the defaults); also its ``precision`` and ``compact_backward``.

    Returns:
        output laid out as ``lhs_spec`` with ``C * M`` channels.
    """
    spatial = [c for c in lhs_spec if c not in "NC"]
    n_sp = len(spatial)
    c_axis = lhs_spec.index("C")
    in_ch = x.shape[c_axis]
    out_ch = w.shape[-1]
    if w.ndim != n_sp + 1 or in_ch == 0 or out_ch % in_ch:
        raise ValueError(
            f"depthwise kernel shape {tuple(w.shape)} does not fit input channels {in_ch}"
        )
    mult = out_ch // in_ch
    window_strides = [int(s) for s in window_strides]
    rhs_dilation = [int(d) for d in (rhs_dilation or [1] * n_sp)]
    options = kernel_options(options)
    if _depthwise_strategy(backend, strategy, options,
                           lambda: _output_size(x, w, lhs_spec, window_strides, rhs_dilation, padding)) == "conv":
        rhs_spec = "I" + "".join(spatial) + "O"
        return lax.conv_general_dilated(  # XLA's grouped path, on purpose
            x,
            w.reshape((1,) + tuple(w.shape)),
            window_strides=tuple(window_strides),
            padding=[(int(a), int(b)) for a, b in padding],
            rhs_dilation=tuple(rhs_dilation),
            dimension_numbers=(lhs_spec, rhs_spec, lhs_spec),
            feature_group_count=in_ch,
            precision=options.lax_precision,
            preferred_element_type=accumulation_dtype(x, w),
        )
    # Shifted multiply-add: out = sum_taps slice(pad(x), tap) * w[tap].
    if mult > 1:  # channel c*M+m reads input channel c
        x = jnp.repeat(x, mult, axis=c_axis)
    sp_axes = [lhs_spec.index(c) for c in spatial]
    cfg = [(0, 0, 0)] * x.ndim
    for ax, (lo, hi) in zip(sp_axes, padding):
        cfg[ax] = (int(lo), int(hi), 0)
    zero = jnp.zeros((), x.dtype)
    xp = lax.pad(x, zero, cfg)
    ksz = w.shape[:n_sp]
    out_sz = [
        conv_output_size(x.shape[ax], k, s, d, p)
        for ax, k, s, d, p in zip(sp_axes, ksz, window_strides, rhs_dilation, padding)
    ]
    out_shape = list(x.shape)
    for ax, o in zip(sp_axes, out_sz):
        out_shape[ax] = o
    dtype = accumulation_dtype(x, w) or jnp.result_type(x, w)  # reduced compute dtype: multiply-add in float32
    if 0 in out_sz:
        return jnp.zeros(out_shape, dtype)
    xp = xp.astype(dtype)
    wk = jnp.asarray(w).astype(dtype)
    # broadcast a tap's [1, .., 1, C*M] slice straight into the output when the
    # kernel's axes are in output order (NHWC); else through [taps, C*M]
    bdims = tuple(sp_axes) + (c_axis,)
    direct = list(bdims) == sorted(bdims)
    if not direct:
        wk = wk.reshape((-1, out_ch))
    # the taps' sum, with a compact custom backward under jax.grad (depthwise_vjp)
    return shifted_depthwise(xp, wk, kernel_size=ksz, strides=window_strides, dilation=rhs_dilation,
                             out_shape=out_shape, spatial_axes=sp_axes, channel_axis=c_axis, direct=direct,
                             compact=options.compact_backward)


# --- pooling -----------------------------------------------------------------

def _window(x, spatial_axes, sizes, default=1):
    full = [default] * x.ndim
    for ax, s in zip(spatial_axes, sizes):
        full[ax] = int(s)
    return tuple(full)


def _pads(x, spatial_axes, padding):
    full = [(0, 0)] * x.ndim
    for ax, p in zip(spatial_axes, padding):
        full[ax] = (int(p[0]), int(p[1]))
    return tuple(full)


def max_pool(x, *, window: Sequence[int], strides: Sequence[int], padding, spatial_axes: Sequence[int],
             dilation: Optional[Sequence[int]] = None):
    """Max over windows; padded positions never win (``lax.reduce_window``
    with ``-inf`` / the integer minimum as identity)."""
    dt = np.dtype(x.dtype)
    init = np.array(-np.inf if jnp.issubdtype(dt, jnp.floating) else np.iinfo(dt).min, dt)
    return lax.reduce_window(
        x, init, lax.max, _window(x, spatial_axes, window), _window(x, spatial_axes, strides),
        _pads(x, spatial_axes, padding),
        window_dilation=None if dilation is None else _window(x, spatial_axes, dilation),
    )


def valid_taps(in_size: int, k: int, s: int, d: int, pad: tuple[int, int]) -> np.ndarray:
    """Per output position along one dimension, how many of the window's
    ``k`` taps (stride ``s``, dilation ``d``, padding ``pad``) fall inside
    the input (the divisor of a padding-excluding average pool)."""
    n_out = conv_output_size(in_size, k, s, d, pad)
    pos = np.arange(n_out)[:, None] * s - pad[0] + np.arange(k)[None, :] * d
    return ((pos >= 0) & (pos < in_size)).sum(1)


_valid_taps = valid_taps  # older spelling, still used by callers


def avg_pool(x, *, window: Sequence[int], strides: Sequence[int], padding, spatial_axes: Sequence[int],
             count_include_pad: bool = False):
    """Average over windows (``lax.reduce_window`` sum / tap count).

    With ``count_include_pad=False`` (TFLite ``AVERAGE_POOL_2D``) the divisor
    is the number of in-bounds taps; else the full window size.
    """
    dt = np.dtype(x.dtype)
    s = lax.reduce_window(
        x, np.array(0, dt), lax.add, _window(x, spatial_axes, window), _window(x, spatial_axes, strides),
        _pads(x, spatial_axes, padding),
    )
    if count_include_pad:
        return s / np.array(int(np.prod(window)), dt)
    count = np.ones((), np.int64)
    for ax, k, st, p in zip(spatial_axes, window, strides, padding):
        c = valid_taps(x.shape[ax], int(k), int(st), 1, (int(p[0]), int(p[1])))
        shape = [1] * x.ndim
        shape[ax] = c.size
        count = count * c.reshape(shape)
    return s / count.astype(dt)


# --- resize ------------------------------------------------------------------

def _resize_scale(in_size: int, out_size: int, align_corners: bool) -> np.float32:
    if align_corners and out_size > 1:
        return np.float32(in_size - 1) / np.float32(out_size - 1)
    return np.float32(in_size) / np.float32(out_size)


def linear_resize_coords(in_size: int, out_size: int, *, align_corners: bool = False,
                         half_pixel_centers: bool = False):
    """TFLite bilinear source coordinates along one axis (float32 arithmetic).

    ``src = half_pixel ? (x + 0.5) * scale - 0.5 : x * scale``, ``scale =
    in/out`` (``(in-1)/(out-1)`` with ``align_corners`` and ``out > 1``);
    ``lo = max(floor(src), 0)``, ``hi = min(ceil(src), in - 1)``, weight of
    ``hi`` is ``src - lo`` (TFLite ``reference_ops::ResizeBilinear``,
    ``ComputeInterpolationValues``).

    Returns:
        ``(lo, hi, frac)``: int32, int32, float32 arrays of length ``out_size``.
    """
    scale = _resize_scale(in_size, out_size, align_corners)
    x = np.arange(out_size, dtype=np.float32)
    if half_pixel_centers:
        src = (x + np.float32(0.5)) * scale - np.float32(0.5)
    else:
        src = x * scale
    src = src.astype(np.float32)
    lo = np.maximum(np.floor(src), 0).astype(np.int32)
    hi = np.minimum(np.ceil(src), in_size - 1).astype(np.int32)
    frac = (src - lo.astype(np.float32)).astype(np.float32)
    return lo, hi, frac


def nearest_resize_indices(in_size: int, out_size: int, *, align_corners: bool = False,
                           half_pixel_centers: bool = False):
    """TFLite nearest-neighbour source index along one axis (float32).

    ``floor((x + (half_pixel ? 0.5 : 0)) * scale)`` (round half away from
    zero instead of floor with ``align_corners``), clamped to ``[0, in-1]``
    (TFLite ``reference_ops::ResizeNearestNeighbor``).
    """
    scale = _resize_scale(in_size, out_size, align_corners)
    off = np.float32(0.5 if half_pixel_centers else 0.0)
    src = ((np.arange(out_size, dtype=np.float32) + off) * scale).astype(np.float32)
    idx = np.sign(src) * np.floor(np.abs(src) + np.float32(0.5)) if align_corners else np.floor(src)
    return np.clip(idx, 0, in_size - 1).astype(np.int32)


def resize_linear(x, axes: Sequence[int], coords):
    """Separable linear interpolation: for each axis, ``coords`` gives
    ``(lo, hi, frac)`` and the result is ``x[lo] * (1 - frac) + x[hi] * frac``."""
    for ax, (lo, hi, frac) in zip(axes, coords):
        shape = [1] * x.ndim
        shape[ax] = len(frac)
        f = np.asarray(frac).reshape(shape).astype(np.dtype(x.dtype))
        a = jnp.take(x, np.asarray(lo), axis=ax)
        b = jnp.take(x, np.asarray(hi), axis=ax)
        x = a * (1 - f) + b * f
    return x


def resize_nearest(x, axes: Sequence[int], indices):
    """Gather ``x`` at static source indices along each of ``axes``."""
    for ax, idx in zip(axes, indices):
        x = jnp.take(x, np.asarray(idx), axis=ax)
    return x


# --- activations -------------------------------------------------------------

def fused_activation(x, name: str):
    """Apply a fused activation (TFLite ``ActivationFunctionType`` name) by
    its mathematical meaning.

    ``RELU``, ``RELU_N1_TO_1`` and ``RELU6`` clamp; ``TANH`` applies tanh;
    ``SIGN_BIT`` maps to 1 where the sign bit is set, else 0 (TFLite
    ``ApplyActivationToVector``, used by its RNN kernels). TFLite's float
    CONV/ADD/POOL... kernels instead only clamp: see
    :func:`clamp_to_activation_range`.

    Raises:
        ValueError: unknown name.
    """
    if name in ("TANH", "SIGN_BIT"):
        return jnp.tanh(x) if name == "TANH" else jnp.signbit(x).astype(x.dtype)
    return clamp_to_activation_range(x, name)


def activation_range(name: str) -> tuple[Optional[float], Optional[float]]:
    """``(low, high)`` clamp bounds of a fused activation, ``None`` = unbounded.

    As TFLite's ``CalculateActivationRange`` (``kernels/kernel_util.h``):
    ``RELU`` ``(0, inf)``, ``RELU6`` ``(0, 6)``, ``RELU_N1_TO_1`` ``(-1, 1)``;
    every other value, ``TANH`` and ``SIGN_BIT`` included, gives no bounds.

    Raises:
        ValueError: unknown name.
    """
    if name not in _ACTIVATIONS and name is not None:
        raise ValueError(f"unknown fused activation {name!r} (expected one of {', '.join(_ACTIVATIONS)})")
    return {"RELU": (0, None), "RELU6": (0, 6), "RELU_N1_TO_1": (-1, 1)}.get(name, (None, None))


def clamp_to_activation_range(x, name: str):
    """Clamp ``x`` to :func:`activation_range` ``(name)`` -- what TFLite's float
    kernels (CONV_2D, DEPTHWISE_CONV_2D, ADD, SUB, MUL, DIV, pooling) do with
    their ``fused_activation_function``: ``TANH``/``SIGN_BIT`` leave ``x``
    unchanged there."""
    lo, hi = activation_range(name)
    if lo is not None:
        x = jnp.maximum(x, jnp.array(lo, x.dtype))
    if hi is not None:
        x = jnp.minimum(x, jnp.array(hi, x.dtype))
    return x


# --- input checks ------------------------------------------------------------

def quantized_inputs(ctx, positions: Optional[Sequence[int]] = None) -> list[int]:
    """Positions of ``ctx``'s inputs that are integer tensors with quantization
    parameters (their values are not real numbers without rescaling)."""
    out = []
    for i, v in enumerate(ctx.inputs):
        if v is None or (positions is not None and i not in positions):
            continue
        if v.quant is not None and np.dtype(v.dtype).kind in "iu":
            out.append(i)
    return out


# --- pools as shifted strided slices (no reduce_window) -------------------------

def use_shifted_window(backend: Optional[str], window: Sequence[int], options: Optional[KernelOptions] = None) -> bool:
    """Whether a pool of ``window`` runs as :func:`shifted_window_reduce`
    (CPU, at most ``options.shifted_max_taps`` taps; ``options``: the
    program's :class:`~fbjax.options.KernelOptions`, None: defaults) rather
    than ``lax.reduce_window`` (other backends pick their own layouts)."""
    backend = backend or jax.default_backend()
    return backend == "cpu" and int(np.prod([int(w) for w in window])) <= kernel_options(options).shifted_max_taps


def shifted_window_reduce(x, init, op, *, window: Sequence[int], strides: Sequence[int], padding,
                          spatial_axes: Sequence[int]):
    """``reduce_window(x, init, op, ...)`` (dilation 1) as ``op`` over the
    window's taps, each a strided ``lax.slice`` of ``x`` padded with ``init``.

    Same result as the reduce_window for max/min (exact); for sums the
    additions run in tap order (row-major over the window), so float results
    may differ from reduce_window's in the last bits.

    Why (XLA:CPU, jaxlib 0.10.2): ``reduce-window`` gets the default row-major
    layout of its logical (NCHW) shape, so between convolutions, which XLA:CPU
    runs channels-last, every NCHW pool costs two layout copies of its input
    and output; pads, slices and elementwise ops take whatever layout their
    producer has, and the pool fuses into the producing elementwise fusion.
    ``padding`` is ``(lo, hi)`` per spatial axis; ``init`` a scalar of
    ``x``'s dtype (the identity of ``op``).
    """
    import itertools

    spatial_axes = [int(a) for a in spatial_axes]
    cfg = [(0, 0, 0)] * x.ndim
    for ax, (lo, hi) in zip(spatial_axes, padding):
        cfg[ax] = (int(lo), int(hi), 0)
    xp = lax.pad(x, np.asarray(init, x.dtype), cfg)
    out = [(xp.shape[ax] - int(k)) // int(s) + 1 for ax, k, s in zip(spatial_axes, window, strides)]
    acc = None
    for taps in itertools.product(*[range(int(k)) for k in window]):
        start, limit, step = [0] * x.ndim, list(xp.shape), [1] * x.ndim
        for ax, t, n, s in zip(spatial_axes, taps, out, strides):
            start[ax], limit[ax], step[ax] = t, t + (n - 1) * int(s) + 1, int(s)
        tap = lax.slice(xp, start, limit, step)
        acc = tap if acc is None else op(acc, tap)
    return acc


# --- vector tails of LiteRT's optimized kernels -----------------------------------------

def tail_mask(shape, k: int):
    """Where a LiteRT kernel with a ``k``-wide vector loop over the flat
    array runs its scalar tail: a boolean mask of ``shape``, True on the
    last ``size % k`` elements (flat order), or ``None`` when there is no
    tail. The mask is an iota compared with ``n - n % k`` (no constant of
    the tensor's size in the program). With a symbolic batch
    (``jax.export``): ``None`` when the static part of the size is a
    multiple of ``k`` (then every batch's size is); else the tail's start is
    computed at run time from the symbolic size ``n``, so each batch gets
    the kernel's order."""
    shape = tuple(shape)
    static = math.prod(int(d) for d in shape if isinstance(d, (int, np.integer)))
    if static % k == 0:
        return None
    n = math.prod(shape)
    return (jnp.arange(n) >= jnp.asarray(n - n % k)).reshape(shape)


def _iou_matrix(boxes):
    y1 = jnp.minimum(boxes[:, 0], boxes[:, 2])
    y2 = jnp.maximum(boxes[:, 0], boxes[:, 2])
    x1 = jnp.minimum(boxes[:, 1], boxes[:, 3])
    x2 = jnp.maximum(boxes[:, 1], boxes[:, 3])
    area = (y2 - y1) * (x2 - x1)
    iy = jnp.maximum(jnp.minimum(y2[:, None], y2[None]) - jnp.maximum(y1[:, None], y1[None]), 0)
    ix = jnp.maximum(jnp.minimum(x2[:, None], x2[None]) - jnp.maximum(x1[:, None], x1[None]), 0)
    inter = iy * ix
    union = area[:, None] + area[None] - inter
    ok = (area[:, None] > 0) & (area[None] > 0)
    return jnp.where(ok, inter / jnp.where(ok, union, 1), 0)


def nms(boxes, scores, max_out, iou_threshold, score_threshold, sigma, inclusive=False):
    """Greedy (soft-)non-max suppression shared by TFLite NMS V4/V5, detection
    post-processing and ONNX NonMaxSuppression (``non_max_suppression.cc``):
    boxes ``[N, 4]`` as ``[y1, x1, y2, x2]`` (either corner order), scores ``[N]``.

    Returns ``(indices int32 [max_out], scores [max_out], count int32)``;
    ``inclusive`` keeps scores equal to the threshold (detection
    post-processing's rule) instead of requiring them to exceed it."""
    boxes = jnp.asarray(boxes)
    scores = jnp.asarray(scores)
    iou = _iou_matrix(boxes)
    neg = jnp.asarray(-jnp.inf, scores.dtype)
    above = (lambda v: v >= score_threshold) if inclusive else (lambda v: v > score_threshold)
    cur = jnp.where(above(scores), scores, neg)
    scale = -0.5 / sigma if sigma > 0 else 0.0

    def step(k, st):
        cur, idx, sc, n, done = st
        i = jnp.argmax(cur)
        s = cur[i]
        take = (~done) & above(s)
        idx = idx.at[k].set(jnp.where(take, i, 0).astype(jnp.int32))
        sc = sc.at[k].set(jnp.where(take, s, 0).astype(sc.dtype))
        n = n + take.astype(jnp.int32)
        row = iou[i]
        f = jnp.where(row <= iou_threshold, jnp.exp(scale * row * row), 0).astype(cur.dtype)
        new = jnp.where(cur > neg, cur * f, neg)
        new = jnp.where(above(new), new, neg).at[i].set(neg)
        cur = jnp.where(take, new, cur)
        return cur, idx, sc, n, done | ~take

    init = (cur, jnp.zeros((max_out,), jnp.int32), jnp.zeros((max_out,), scores.dtype),
            jnp.zeros((), jnp.int32), jnp.zeros((), bool))
    _, idx, sc, n, _ = lax.fori_loop(0, max_out, step, init)
    return idx, sc, n
