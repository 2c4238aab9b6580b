"""Fused recurrent ops (numpy reference): LSTM, UNIDIRECTIONAL_SEQUENCE_LSTM,
RNN, UNIDIRECTIONAL_SEQUENCE_RNN as explicit Python loops over time in
float64, written from ``lstm_eval.cc`` / ``basic_rnn.cc`` (see the JAX
module's docstring for the equations). Initial states: the variable tensors,
zeros."""

from __future__ import annotations

import numpy as np

from . import reject_quantized, to_out
from ..registry import register


def _act(ctx, x, name):
    return {"NONE": lambda v: v, "RELU": lambda v: np.maximum(v, 0), "RELU6": lambda v: np.clip(v, 0, 6),
            "RELU_N1_TO_1": lambda v: np.clip(v, -1, 1), "TANH": np.tanh,
            "SIGN_BIT": lambda v: np.signbit(v).astype(v.dtype)}[name](x)


def _sig(x):
    return 1 / (1 + np.exp(-x))


def _f(v):
    return None if v is None else np.asarray(v, np.float64)


def _lstm_step(ctx, ins, x, h, c, act, cell_clip, proj_clip):
    w = [_f(v) for v in ins[1:18]]
    wxi, wxf, wxc, wxo, whi, whf, whc, who, wci, wcf, wco, bi, bf, bc, bo, pw, pb = w
    ln = [_f(v) for v in list(ins[20:24]) + [None] * (4 - len(ins[20:24]))]

    def pre(wx, wh, peep, cc, lnc, b):
        z = x @ wx.T + h @ wh.T
        if peep is not None:
            z = z + peep * cc
        if lnc is not None:
            m = z.mean(-1, keepdims=True)
            z = (z - m) / np.sqrt(((z - m) ** 2).mean(-1, keepdims=True) + 1e-8) * lnc
        return z if b is None else z + b

    f = _sig(pre(wxf, whf, wcf, c, ln[1], bf))
    i = 1 - f if wxi is None else _sig(pre(wxi, whi, wci, c, ln[0], bi))
    g = _act(ctx, pre(wxc, whc, None, c, ln[2], bc), act)
    c = f * c + i * g
    if cell_clip > 0:
        c = np.clip(c, -cell_clip, cell_clip)
    o = _sig(pre(wxo, who, wco, c, ln[3], bo))
    h = o * _act(ctx, c, act)
    if pw is not None:
        h = h @ pw.T + (0 if pb is None else pb)
        if proj_clip > 0:
            h = np.clip(h, -proj_clip, proj_clip)
    return h, c


@register("tflite", "UNIDIRECTIONAL_SEQUENCE_LSTM")
def UNIDIRECTIONAL_SEQUENCE_LSTM(ctx, *ins, fused_activation_function="TANH", cell_clip=0.0, proj_clip=0.0,
                                 time_major=False, asymmetric_quantize_inputs=False,
                                 diagonal_recurrent_tensors=False):
    """Loop over time steps."""
    reject_quantized(ctx)
    x = _f(ins[0])
    if not time_major:
        x = np.swapaxes(x, 0, 1)
    h, c = _f(ins[18]), _f(ins[19])
    ys = []
    for t in range(x.shape[0]):
        h, c = _lstm_step(ctx, ins, x[t], h, c, fused_activation_function, float(cell_clip), float(proj_clip))
        ys.append(h)
    y = np.stack(ys)
    return to_out(ctx, y if time_major else np.swapaxes(y, 0, 1))


@register("tflite", "LSTM")
def LSTM(ctx, *ins, fused_activation_function="TANH", cell_clip=0.0, proj_clip=0.0, kernel_type="FULL",
         asymmetric_quantize_inputs=False):
    """One step."""
    reject_quantized(ctx)
    if kernel_type != "FULL":
        raise ctx.error(f"LSTM kernel_type {kernel_type} is not supported (only FULL)")
    h, _ = _lstm_step(ctx, ins, _f(ins[0]), _f(ins[18]), _f(ins[19]), fused_activation_function,
                      float(cell_clip), float(proj_clip))
    return to_out(ctx, h)


@register("tflite", "RNN")
def RNN(ctx, x, w, r, b, h, *, fused_activation_function="NONE", asymmetric_quantize_inputs=False):
    """``act(W x + R h + b)``."""
    reject_quantized(ctx)
    y = _act(ctx, _f(x) @ _f(w).T + _f(h) @ _f(r).T + _f(b), fused_activation_function)
    return [to_out(ctx, y), to_out(ctx, y, 1)] if len(ctx.outputs) > 1 else to_out(ctx, y)


@register("tflite", "UNIDIRECTIONAL_SEQUENCE_RNN")
def UNIDIRECTIONAL_SEQUENCE_RNN(ctx, x, w, r, b, h, *, time_major=False, fused_activation_function="NONE",
                                asymmetric_quantize_inputs=False):
    """Loop over time steps."""
    reject_quantized(ctx)
    x = _f(x)
    if not time_major:
        x = np.swapaxes(x, 0, 1)
    h = _f(h)
    ys = []
    for t in range(x.shape[0]):
        h = _act(ctx, x[t] @ _f(w).T + h @ _f(r).T + _f(b), fused_activation_function)
        ys.append(h)
    y = np.stack(ys)
    return to_out(ctx, y if time_major else np.swapaxes(y, 0, 1))


@register("tflite", "BIDIRECTIONAL_SEQUENCE_RNN")
def BIDIRECTIONAL_SEQUENCE_RNN(ctx, x, fw_w, fw_r, fw_b, fw_h, bw_w, bw_r, bw_b, bw_h, aux=None, fw_aux_w=None,
                               bw_aux_w=None, *, time_major=False, fused_activation_function="NONE",
                               merge_outputs=False, asymmetric_quantize_inputs=False):
    """Forward loop, backward loop from the last step, optional concat."""
    reject_quantized(ctx)
    x = _f(x)
    if not time_major:
        x = np.swapaxes(x, 0, 1)
    T = x.shape[0]
    outs = []
    for w, r, b, h, order in ((fw_w, fw_r, fw_b, fw_h, range(T)), (bw_w, bw_r, bw_b, bw_h, range(T - 1, -1, -1))):
        h = _f(h)
        y = [None] * T
        for t in order:
            h = _act(ctx, x[t] @ _f(w).T + h @ _f(r).T + _f(b), fused_activation_function)
            y[t] = h
        y = np.stack(y)
        outs.append(y if time_major else np.swapaxes(y, 0, 1))
    if merge_outputs:
        return [to_out(ctx, np.concatenate(outs, -1))]
    return [to_out(ctx, outs[0]), to_out(ctx, outs[1], 1)]


@register("tflite", "SVDF")
def SVDF(ctx, x, weights_feature, weights_time, bias=None, state=None, *, rank=1,
         fused_activation_function="NONE", asymmetric_quantize_inputs=False):
    """One SVDF step with explicit loops over batch and filters."""
    reject_quantized(ctx)
    x, wf, wt = _f(x), _f(weights_feature), _f(weights_time)
    B = x.shape[0]
    F, M = wt.shape
    r = int(rank)
    st = _f(state).reshape(B, F, M)
    out = np.zeros((B, F // r))
    for b in range(B):
        for f in range(F):
            col = np.concatenate([st[b, f, 1:], [x[b] @ wf[f]]])
            out[b, f // r] += col @ wt[f]
    if bias is not None:
        out = out + _f(bias)
    return to_out(ctx, _act(ctx, out, fused_activation_function))


@register("tflite", "BIDIRECTIONAL_SEQUENCE_LSTM")
def BIDIRECTIONAL_SEQUENCE_LSTM(ctx, *ins, fused_activation_function="TANH", cell_clip=0.0, proj_clip=0.0,
                                merge_outputs=False, time_major=True, asymmetric_quantize_inputs=False):
    """Forward and backward LSTM loops, optional concat."""
    reject_quantized(ctx)
    x = _f(ins[0])
    if not time_major:
        x = np.swapaxes(x, 0, 1)
    T = x.shape[0]
    outs = []
    for w, (h, c), order in ((ins[1:18], ins[35:37], range(T)), (ins[18:35], ins[37:39], range(T - 1, -1, -1))):
        layout = [None] + list(w)  # _lstm_step reads inputs 1..17 and 20..23
        h, c = _f(h), _f(c)
        y = [None] * T
        for t in order:
            h, c = _lstm_step(ctx, layout, x[t], h, c, fused_activation_function, float(cell_clip),
                              float(proj_clip))
            y[t] = h
        y = np.stack(y)
        outs.append(y if time_major else np.swapaxes(y, 0, 1))
    if merge_outputs:
        return [to_out(ctx, np.concatenate(outs, -1))]
    return [to_out(ctx, outs[0]), to_out(ctx, outs[1], 1)]
