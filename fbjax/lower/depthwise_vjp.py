"""The CPU shifted-multiply-add depthwise convolution and its gradient program.

:func:`shifted_depthwise` is the core of :func:`fbjax.lower.kernels.depthwise_conv`'s
``"shifted"`` strategy: ``out = sum_taps slice(xp, tap) * w[tap]`` over the
kernel taps, ``xp`` the padded input (channels already repeated for a depth
multiplier, cast to the accumulation dtype).

Plain calls and forward mode get that sum unrolled (cheap elementwise code
XLA fuses into one loop). In a ``jax.grad`` program the unrolled sum is a
bad fit for XLA:CPU: its fusion pass treats the sum as cheap and copies it
into each of its consumers (the activation, the activation's derivative
masks, the next layer's weight gradient): mediapipe_hand_landmark_lite's
first ``jax.jit(jax.grad(loss))`` step compiled 16,456 optimised HLO
instructions, 8,370 of them copies of its 16 depthwise forward sums and
3,008 their autodiff backward (per tap a ``pad`` of the cotangent, the
transpose of a strided slice). Under reverse-mode differentiation the sum is
therefore a :func:`jax.custom_vjp` whose forward and backward are loops over
the kernel's first spatial axis (the other axes' taps unrolled in the body):
a loop's result stays in memory, and its body is compiled once:

* forward: the same terms added in the same order (``0 + t_0 + t_1 ...``);
* input gradient: the same shifted sum over the cotangent interleaved with
  ``stride - 1`` zeros and padded by ``(K - 1) * dilation`` (one
  ``lax.pad``), with the kernel flipped along every spatial axis
  (``d xp[p] = sum_t ct[(p - t d) / s] w[t]``);
* weight gradient: per tap, ``window(xp) * ct`` summed over every axis but
  the channels; one kernel row per loop step, in the input gradient's loop.

That grad program has 6,360 optimised HLO instructions instead of 16,456
(StableHLO: 5,114 ops instead of 7,164), and its first call took 6.9-8.1 s
instead of 12.3-15.8 s on the shared 2-core machine (load ~2; steady step
89-115 ms vs 98-119 ms), measured side by side with
``benchmarks/compile_time.py``.

Forward mode (``jax.jvp``, ``jax.jacfwd``, also around a ``jax.grad``) and
plain evaluation keep the unrolled lax code, whose JVP JAX derives itself:
a ``custom_vjp`` function cannot be differentiated in forward mode, and this
JAX (0.10) has no public ``custom_transpose`` that would let a
``custom_jvp`` with a hand-transposed linear tangent serve both modes. The
choice is made per call at trace time from the operands
(:func:`fbjax.lower.autodiff.linearized_only`). ``jax.linearize`` also
linearizes, and its linear function then runs forward mode through the
custom rule, which JAX refuses; ``KernelOptions(compact_backward=False)``
(``compact=False`` here) gives JAX's own derivative everywhere.
"""

from __future__ import annotations

from functools import partial
from typing import Sequence

import jax
import numpy as np
from jax import lax

from .autodiff import linearized_only


def _taps(xp, wk, ksz, strides, dilation, out_shape, sp_axes, c_axis, direct):
    """``sum_taps lax.slice(xp, tap) * w[tap]``, lax calls only (a 3x3 tap
    through jnp's indexing machinery costs ~20 ms of tracing per node).

    ``wk`` is ``[*ksz, C]`` when ``direct`` (its axes in the output's order:
    NHWC, a tap's weights broadcast straight in), else ``[taps, C]`` (taps
    in row-major order of ``ksz``)."""
    out_ch = out_shape[c_axis]
    out_sp = [out_shape[a] for a in sp_axes]
    bdims = tuple(sp_axes) + (c_axis,)
    acc = None
    for i, tap in enumerate(np.ndindex(*ksz)):
        if direct:
            w_tap = lax.broadcast_in_dim(lax.slice(wk, tuple(tap) + (0,), tuple(t + 1 for t in tap) + (out_ch,)),
                                         out_shape, bdims)
        else:
            w_tap = lax.broadcast_in_dim(lax.reshape(lax.slice(wk, (i, 0), (i + 1, out_ch)), (out_ch,)),
                                         out_shape, (c_axis,))
        term = lax.mul(_window(xp, sp_axes, tap, strides, dilation, out_sp), w_tap)
        acc = term if acc is None else lax.add(acc, term)
    return acc


def _window(xp, sp_axes, tap, strides, dilation, out_sp, row_axis=None):
    """The strided slice of ``xp`` that kernel tap ``tap`` multiplies
    (``row_axis``: that axis was already cut to the tap's rows)."""
    start = [0] * xp.ndim
    limit = list(xp.shape)
    step = [1] * xp.ndim
    for ax, t, s, d, o in zip(sp_axes, tap, strides, dilation, out_sp):
        if ax != row_axis:
            start[ax] = t * d
        limit[ax] = start[ax] + (o - 1) * s + 1
        step[ax] = s
    return lax.slice(xp, start, limit, step)


def _rows(xp, i, sp_axes, strides, dilation, out_sp):
    """``xp`` cut along the first spatial axis to the extent kernel row ``i``
    (a traced loop index) reads: ``[i * d, i * d + (o - 1) * s + 1)``."""
    ax, s, d, o = sp_axes[0], strides[0], dilation[0], out_sp[0]
    return lax.dynamic_slice_in_dim(xp, i * d, (o - 1) * s + 1, axis=ax)


def _row_taps(acc, xr, w_row, rest, strides, dilation, out_shape, sp_axes, c_axis):
    """``acc + sum_r window(xr, (0, *r)) * w_row[r]`` over the taps ``r`` of
    one kernel row (``xr`` already cut to that row, ``w_row`` ``[R, C]``),
    added one by one in row-major order."""
    out_ch = out_shape[c_axis]
    out_sp = [out_shape[a] for a in sp_axes]
    for r, tap in enumerate(np.ndindex(*rest)):
        w_tap = lax.broadcast_in_dim(lax.reshape(lax.slice_in_dim(w_row, r, r + 1, axis=0), (out_ch,)),
                                     out_shape, (c_axis,))
        acc = lax.add(acc, lax.mul(_window(xr, sp_axes, (0,) + tap, strides, dilation, out_sp, sp_axes[0]), w_tap))
    return acc


def _taps_loop(xp, wk, ksz, strides, dilation, out_shape, sp_axes, c_axis):
    """:func:`_taps`' sum (same terms, same order: ``0 + t_0 + t_1 + ...``)
    as a loop over the kernel's first spatial axis, the other axes' taps
    unrolled in its body. XLA:CPU keeps a loop's result in memory: unrolled,
    the sum is cheap elementwise code that XLA copies into each of its
    consumers in a gradient program (the activation, its derivative mask,
    the next layer's weight gradient): ~5 copies per depthwise node, half of
    hand_landmark_lite's compiled grad program."""
    out_ch = out_shape[c_axis]
    rest = ksz[1:]
    w3 = wk.reshape((ksz[0], int(np.prod(rest, dtype=int)), out_ch))
    out_sp = [out_shape[a] for a in sp_axes]

    def body(i, acc):
        xr = _rows(xp, i, sp_axes, strides, dilation, out_sp)
        w_row = lax.dynamic_index_in_dim(w3, i, 0, keepdims=False)
        return _row_taps(acc, xr, w_row, rest, strides, dilation, out_shape, sp_axes, c_axis)

    return lax.fori_loop(0, ksz[0], body, lax.full(out_shape, 0, xp.dtype))


@partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5, 6, 7, 8))
def _taps_vjp(xp, wk, ksz, strides, dilation, out_shape, sp_axes, c_axis, direct):
    return _taps(xp, wk, ksz, strides, dilation, out_shape, sp_axes, c_axis, direct)


def _taps_fwd(xp, wk, ksz, strides, dilation, out_shape, sp_axes, c_axis, direct):
    return _taps_loop(xp, wk, ksz, strides, dilation, out_shape, sp_axes, c_axis), (xp, wk)


def _taps_bwd(ksz, strides, dilation, out_shape, sp_axes, c_axis, direct, res, ct):
    """Both gradients in one loop over kernel rows: row ``i`` adds its taps'
    share of the input gradient (the flipped kernel's row ``i`` over the
    padded, stride-interleaved cotangent) and fills row ``i`` of the weight
    gradient (per tap, ``window(xp) * ct`` summed over all axes but the
    channels)."""
    with jax.named_scope("depthwise_vjp_backward"):  # traced at transpose time, outside the op's own scope
        return _grads(ksz, strides, dilation, out_shape, sp_axes, c_axis, res, ct)


def _grads(ksz, strides, dilation, out_shape, sp_axes, c_axis, res, ct):
    xp, wk = res
    n_sp = len(sp_axes)
    cfg = [(0, 0, 0)] * ct.ndim
    for ax, k, s, d in zip(sp_axes, ksz, strides, dilation):
        span = (ct.shape[ax] - 1) * s + 1
        cfg[ax] = ((k - 1) * d, xp.shape[ax] - span, s - 1)
    ctq = lax.pad(ct, lax.full((), 0, ct.dtype), cfg)
    out_ch = out_shape[c_axis]
    rest = ksz[1:]
    n_rest = int(np.prod(rest, dtype=int))
    # flipped along every spatial axis: [K0, R, C] with both axes reversed
    # (either layout of wk reshapes to it: taps in row-major order)
    w_flip = lax.rev(wk.reshape((ksz[0], n_rest, out_ch)), (0, 1)) if n_sp > 1 else \
        lax.rev(wk.reshape((ksz[0], 1, out_ch)), (0,))
    ones = (1,) * n_sp
    xp_sp = [xp.shape[a] for a in sp_axes]
    out_sp = [out_shape[a] for a in sp_axes]
    others = tuple(a for a in range(ct.ndim) if a != c_axis)

    def body(i, carry):
        d_xp, dw = carry
        cr = _rows(ctq, i, sp_axes, ones, dilation, xp_sp)
        d_xp = _row_taps(d_xp, cr, lax.dynamic_index_in_dim(w_flip, i, 0, keepdims=False), rest, ones, dilation,
                         tuple(xp.shape), sp_axes, c_axis)
        xr = _rows(xp, i, sp_axes, strides, dilation, out_sp)
        row = [lax.reshape(lax.reduce_sum(lax.mul(_window(xr, sp_axes, (0,) + tap, strides, dilation, out_sp,
                                                          sp_axes[0]), ct), others), (1, 1, out_ch))
               for tap in np.ndindex(*rest)]
        return d_xp, lax.dynamic_update_slice_in_dim(dw, lax.concatenate(row, 1), i, axis=0)

    d_xp, dw = lax.fori_loop(0, ksz[0], body, (lax.full(xp.shape, 0, xp.dtype),
                                                lax.full((ksz[0], n_rest, out_ch), 0, xp.dtype)))
    return d_xp, dw.reshape(wk.shape).astype(wk.dtype)


_taps_vjp.defvjp(_taps_fwd, _taps_bwd)


def _dim(d):
    """``d`` as a Python int, or unchanged when it is symbolic (a dynamic
    batch of ``jax.export``: only the spatial and channel sizes must be known)."""
    return int(d) if isinstance(d, (int, np.integer)) else d


def shifted_depthwise(xp, wk, *, kernel_size: Sequence[int], strides: Sequence[int], dilation: Sequence[int],
                      out_shape: Sequence[int], spatial_axes: Sequence[int], channel_axis: int, direct: bool,
                      compact: bool = True):
    """Depthwise convolution of an already padded input as shifted multiply-adds.

    Args:
        xp: input, padded along ``spatial_axes``, channels repeated to the
            output channels (channel ``c*M + m`` = input channel ``c``), in
            the accumulation dtype.
        wk: kernel ``[*kernel_size, C_out]`` when ``direct`` (spatial axes
            ascending before the channel axis, as NHWC), else
            ``[prod(kernel_size), C_out]``; same dtype as ``xp``.
        kernel_size, strides, dilation: per spatial axis.
        out_shape: the output's shape (``xp``'s layout).
        spatial_axes, channel_axis: axes of ``xp`` (and of the output).
        direct: ``wk``'s layout, see above.

    Returns:
        ``out[..] = sum_taps xp[strided slice at tap * dilation] * wk[tap]``,
        shape ``out_shape``, dtype of ``xp``. Under ``jax.grad``/``jax.vjp``
        (operands being linearized, no forward mode around them) and
        ``compact`` (``KernelOptions.compact_backward``): the same sum
        through a ``jax.custom_vjp`` with the loops and backward of this
        module's docstring.
    """
    args = (tuple(int(k) for k in kernel_size), tuple(int(s) for s in strides), tuple(int(d) for d in dilation),
            tuple(_dim(o) for o in out_shape), tuple(int(a) for a in spatial_axes), int(channel_axis), bool(direct))
    if compact and linearized_only(xp, wk):
        return _taps_vjp(xp, wk, *args)
    return _taps(xp, wk, *args)
