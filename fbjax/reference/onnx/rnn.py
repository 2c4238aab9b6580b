"""numpy twins of :mod:`fbjax.lower.onnx.rnn`: explicit time loops (float64)."""

from __future__ import annotations

import numpy as np

from ..registry import register
from ._util import OP_SET, out


def _sig(x):
    return 1.0 / (1.0 + np.exp(-x))


def _order(seq, reverse, lens, b):
    n = int(lens[b]) if lens is not None else seq
    return list(range(n - 1, -1, -1)) if reverse else list(range(n))


@register(OP_SET, "LSTM")
def LSTM(ctx, X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None, *,
         direction="Forward", hidden_size=0):
    """numpy ONNX ``LSTM`` (gates i, o, f, c; peepholes i, o, f)."""
    X = np.asarray(X, np.float64)
    seq, batch, _ = X.shape
    H = int(hidden_size) or R.shape[-1]
    nd = 2 if direction == "Bidirectional" else 1
    Y = np.zeros((seq, nd, batch, H))
    Yh = np.zeros((nd, batch, H))
    Yc = np.zeros((nd, batch, H))
    for d in range(nd):
        w, r = np.asarray(W[d], np.float64), np.asarray(R[d], np.float64)
        bb = np.asarray(B[d], np.float64) if B is not None else np.zeros(8 * H)
        p = np.asarray(P[d], np.float64) if P is not None else np.zeros(3 * H)
        for b in range(batch):
            h = np.asarray(initial_h[d, b], np.float64) if initial_h is not None else np.zeros(H)
            c = np.asarray(initial_c[d, b], np.float64) if initial_c is not None else np.zeros(H)
            for t in _order(seq, direction == "Reverse" or d == 1, sequence_lens, b):
                g = w @ X[t, b] + r @ h + bb[:4 * H] + bb[4 * H:]
                i = _sig(g[:H] + p[:H] * c)
                f = _sig(g[2 * H:3 * H] + p[2 * H:] * c)
                c = f * c + i * np.tanh(g[3 * H:])
                o = _sig(g[H:2 * H] + p[H:2 * H] * c)
                h = o * np.tanh(c)
                Y[t, d, b] = h
            Yh[d, b], Yc[d, b] = h, c
    return [out(ctx, Y, 0), out(ctx, Yh, 1), out(ctx, Yc, 2)][:len(ctx.outputs)]


@register(OP_SET, "GRU")
def GRU(ctx, X, W, R, B=None, sequence_lens=None, initial_h=None, *, direction="Forward", hidden_size=0,
        linear_before_reset=False):
    """numpy ONNX ``GRU`` (gates z, r, h)."""
    X = np.asarray(X, np.float64)
    seq, batch, _ = X.shape
    H = int(hidden_size) or R.shape[-1]
    nd = 2 if direction == "Bidirectional" else 1
    Y = np.zeros((seq, nd, batch, H))
    Yh = np.zeros((nd, batch, H))
    for d in range(nd):
        w, r = np.asarray(W[d], np.float64), np.asarray(R[d], np.float64)
        bb = np.asarray(B[d], np.float64) if B is not None else np.zeros(6 * H)
        wb, rb = bb[:3 * H], bb[3 * H:]
        for b in range(batch):
            h = np.asarray(initial_h[d, b], np.float64) if initial_h is not None else np.zeros(H)
            for t in _order(seq, direction == "Reverse" or d == 1, sequence_lens, b):
                xw = w @ X[t, b] + wb
                z = _sig(xw[:H] + r[:H] @ h + rb[:H])
                rr = _sig(xw[H:2 * H] + r[H:2 * H] @ h + rb[H:2 * H])
                if linear_before_reset:
                    hh = np.tanh(xw[2 * H:] + rr * (r[2 * H:] @ h + rb[2 * H:]))
                else:
                    hh = np.tanh(xw[2 * H:] + r[2 * H:] @ (rr * h) + rb[2 * H:])
                h = (1 - z) * hh + z * h
                Y[t, d, b] = h
            Yh[d, b] = h
    return [out(ctx, Y, 0), out(ctx, Yh, 1)][:len(ctx.outputs)]
