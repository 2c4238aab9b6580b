"""ONNX ``LSTM`` and ``GRU`` via ``lax.scan`` (layout 0: ``[seq, batch, ...]``).

Gate orders are ONNX's: LSTM ``i, o, f, c``; GRU ``z, r, h``. Directions
``Forward``, ``Reverse``, ``Bidirectional`` (weights stacked on dim 0).
Default activations only (sigmoid / tanh): rten-convert rejects others.
``sequence_lens`` (per batch entry, may be dynamic) masks the steps past each
entry's length: the state stops changing and ``Y`` is zero there; the
reverse direction runs over each entry's own valid prefix, reversed.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from .. import kernels
from ..registry import register
from ._util import OP_SET

_DIRS = {"Forward": 1, "Reverse": 1, "Bidirectional": 2}


def _scan(step, carry0, xw, reverse, lens):
    """Run ``step(carry, x_t) -> (carry, h_t)`` over time; masked when ``lens`` is given.

    The carry's first element is the hidden state [batch, H]; ``Y`` rows past
    an entry's length are zero and its state is frozen there.
    """
    if lens is None:
        return lax.scan(step, carry0, xw, reverse=reverse)
    seq = xw.shape[0]
    t = jnp.arange(seq, dtype=jnp.int32)[:, None]  # [seq, 1]
    lens = jnp.asarray(lens).astype(jnp.int32)[None, :]  # [1, batch]
    valid = t < lens
    if reverse:  # reverse each entry's valid prefix (an involution; identity past the end)
        src = jnp.where(valid, lens - 1 - t, t)
        xw = jnp.take_along_axis(xw, src[..., None], axis=0)

    def masked(carry, inp):
        x_t, m = inp
        new, h = step(carry, x_t)
        mm = m[:, None]
        new = jax.tree_util.tree_map(lambda a, b: jnp.where(mm, a, b), new, carry)
        return new, jnp.where(mm, h, jnp.zeros_like(h))

    carry, ys = lax.scan(masked, carry0, (xw, valid))
    if reverse:
        ys = jnp.take_along_axis(ys, src[..., None], axis=0)
    return carry, ys


def _mm(ctx, a, b):
    return jnp.matmul(a, b, precision=kernels.precision(ctx))


@register(OP_SET, "LSTM")
def LSTM(ctx, X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None, *,
         direction="Forward", hidden_size=0):
    """ONNX ``LSTM``: returns ``(Y [seq, dirs, batch, H], Y_h [dirs, batch, H], Y_c)``."""
    X = jnp.asarray(X)
    seq, batch, _ = X.shape
    H = int(hidden_size) or R.shape[-1]
    nd = _DIRS[direction]
    ys, hs, cs = [], [], []
    for d in range(nd):
        w, r = W[d], R[d]
        b = B[d][:4 * H] + B[d][4 * H:] if B is not None else jnp.zeros((4 * H,), X.dtype)
        p = P[d] if P is not None else jnp.zeros((3 * H,), X.dtype)
        h0 = initial_h[d] if initial_h is not None else jnp.zeros((batch, H), X.dtype)
        c0 = initial_c[d] if initial_c is not None else jnp.zeros((batch, H), X.dtype)
        xw = _mm(ctx, X, w.T) + b  # [seq, batch, 4H]

        def step(carry, xt, r=r, p=p):
            h, c = carry
            g = xt + _mm(ctx, h, r.T)
            i, o, f, cc = jnp.split(g, 4, axis=-1)
            i = jax.nn.sigmoid(i + p[:H] * c)
            f = jax.nn.sigmoid(f + p[2 * H:] * c)
            c2 = f * c + i * jnp.tanh(cc)
            o = jax.nn.sigmoid(o + p[H:2 * H] * c2)
            h2 = o * jnp.tanh(c2)
            return (h2, c2), h2

        reverse = direction == "Reverse" or d == 1
        (h, c), y = _scan(step, (h0, c0), xw, reverse, sequence_lens)
        ys.append(y)
        hs.append(h)
        cs.append(c)
    return jnp.stack(ys, 1), jnp.stack(hs), jnp.stack(cs)


@register(OP_SET, "GRU")
def GRU(ctx, X, W, R, B=None, sequence_lens=None, initial_h=None, *, direction="Forward", hidden_size=0,
        linear_before_reset=False):
    """ONNX ``GRU``: returns ``(Y [seq, dirs, batch, H], Y_h [dirs, batch, H])``."""
    X = jnp.asarray(X)
    seq, batch, _ = X.shape
    H = int(hidden_size) or R.shape[-1]
    nd = _DIRS[direction]
    ys, hs = [], []
    for d in range(nd):
        w, r = W[d], R[d]
        bw = B[d][:3 * H] if B is not None else jnp.zeros((3 * H,), X.dtype)
        br = B[d][3 * H:] if B is not None else jnp.zeros((3 * H,), X.dtype)
        h0 = initial_h[d] if initial_h is not None else jnp.zeros((batch, H), X.dtype)
        xw = _mm(ctx, X, w.T) + bw

        def step(h, xt, r=r, br=br):
            xz, xr, xh = jnp.split(xt, 3, axis=-1)
            rz, rr, rh = r[:H], r[H:2 * H], r[2 * H:]
            z = jax.nn.sigmoid(xz + _mm(ctx, h, rz.T) + br[:H])
            rg = jax.nn.sigmoid(xr + _mm(ctx, h, rr.T) + br[H:2 * H])
            if linear_before_reset:
                hh = jnp.tanh(xh + rg * (_mm(ctx, h, rh.T) + br[2 * H:]))
            else:
                hh = jnp.tanh(xh + _mm(ctx, rg * h, rh.T) + br[2 * H:])
            h2 = (1 - z) * hh + z * h
            return h2, h2

        reverse = direction == "Reverse" or d == 1
        h, y = _scan(step, h0, xw, reverse, sequence_lens)
        ys.append(y)
        hs.append(h)
    return jnp.stack(ys, 1), jnp.stack(hs)
