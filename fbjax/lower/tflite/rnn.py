"""TFLite fused recurrent ops, float path, with ``lax.scan`` over time:
LSTM (one step), UNIDIRECTIONAL_SEQUENCE_LSTM, RNN, UNIDIRECTIONAL_SEQUENCE_RNN.

Follows ``kernels/lstm.cc``, ``unidirectional_sequence_lstm.cc`` and
``lstm_eval.cc`` (float ``LstmStepFloat``): gates
``i = sigmoid(Wxi x + Whi h + wci * c + bi)`` (``1 - f`` without input
weights: CIFG), ``f`` likewise, ``g = act(Wxc x + Whc h + bc)``,
``c' = f * c + i * g`` (clipped to ``cell_clip`` when > 0), ``o = sigmoid(Wxo
x + Who h + wco * c' + bo)``, ``h' = o * act(c')``, then the optional
projection ``P h' + pb`` (clipped to ``proj_clip``). With layer-norm
coefficients each gate's pre-activation is normalised over the cell dim
(epsilon 1e-8), scaled by its coefficient, and the bias added after.
``act`` is the op's ``fused_activation_function`` applied as a real
activation (TANH is tanh, unlike the clamp-only fused activations of
element-wise ops). RNN: ``h' = act(W x + R h + b)`` (``kernels/basic_rnn.cc``,
``unidirectional_sequence_rnn.cc``).

The initial states are the op's variable tensors, zeros when the model is
called (LiteRT's state after ``allocate_tensors``); LiteRT also writes the
final state back into them, which a stateless JAX function does not keep.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from .. import kernels
from ..registry import register
from .elementwise import require_unquantized


def activation(ctx, x, name):
    """A recurrent op's ``fused_activation_function`` as a real activation."""
    if name == "NONE":
        return x
    if name == "RELU":
        return jnp.maximum(x, 0)
    if name == "RELU6":
        return jnp.clip(x, 0, 6)
    if name == "RELU_N1_TO_1":
        return jnp.clip(x, -1, 1)
    if name == "TANH":
        return jnp.tanh(x)
    if name == "SIGN_BIT":
        return jnp.where(jnp.signbit(x), jnp.ones_like(x), jnp.zeros_like(x))
    raise ctx.error(f"unsupported fused_activation_function {name!r}")


def _mm(ctx, x, w):  # x [B, K] @ w[N, K]^T
    return lax.dot_general(x, w, (((1,), (1,)), ((), ())), precision=kernels.precision(ctx),
                           preferred_element_type=kernels.accumulation_dtype(x, w))


def _ln(x, coef):
    m = jnp.mean(x, axis=-1, keepdims=True)
    v = jnp.mean(jnp.square(x - m), axis=-1, keepdims=True)
    return (x - m) / jnp.sqrt(v + 1e-8) * coef


def lstm_cell(ctx, w, act, cell_clip, proj_clip):
    """``step((h, c), x) -> ((h', c'), h')`` for the 24-input LSTM layout."""
    (wxi, wxf, wxc, wxo, whi, whf, whc, who, wci, wcf, wco, bi, bf, bc, bo, pw, pb,
     lni, lnf, lnc, lno) = w

    def gate(x, h, wx, wh, peep, c, ln, b):
        z = _mm(ctx, x, wx) + _mm(ctx, h, wh)
        if peep is not None:
            z = z + peep * c
        if ln is not None:
            z = _ln(z, ln)
        return z if b is None else z + b

    def step(carry, x):
        h, c = carry
        f = jax.nn.sigmoid(gate(x, h, wxf, whf, wcf, c, lnf, bf))
        i = 1 - f if wxi is None else jax.nn.sigmoid(gate(x, h, wxi, whi, wci, c, lni, bi))
        g = activation(ctx, gate(x, h, wxc, whc, None, c, lnc, bc), act)
        c2 = f * c + i * g
        if cell_clip > 0:
            c2 = jnp.clip(c2, -cell_clip, cell_clip)
        o = jax.nn.sigmoid(gate(x, h, wxo, who, wco, c2, lno, bo))
        h2 = o * activation(ctx, c2, act)
        if pw is not None:
            h2 = _mm(ctx, h2, pw)
            if pb is not None:
                h2 = h2 + pb
            if proj_clip > 0:
                h2 = jnp.clip(h2, -proj_clip, proj_clip)
        return (h2, c2), h2

    return step


def _lstm_weights(ins):
    # inputs 1..17 and 20..23 of the 24-input layout
    (wxi, wxf, wxc, wxo, whi, whf, whc, who, wci, wcf, wco, bi, bf, bc, bo, pw, pb) = ins[1:18]
    ln = list(ins[20:24]) + [None] * (4 - len(ins[20:24]))
    return (wxi, wxf, wxc, wxo, whi, whf, whc, who, wci, wcf, wco, bi, bf, bc, bo, pw, pb, *ln)


@register("tflite", "UNIDIRECTIONAL_SEQUENCE_LSTM")
def UNIDIRECTIONAL_SEQUENCE_LSTM(ctx, *ins, fused_activation_function="TANH", cell_clip=0.0, proj_clip=0.0,
                                 time_major=False, asymmetric_quantize_inputs=False,
                                 diagonal_recurrent_tensors=False):
    """TFLite UNIDIRECTIONAL_SEQUENCE_LSTM: 24 inputs (see module docstring;
    input 0 ``[T, B, I]`` when ``time_major`` else ``[B, T, I]``, inputs 18/19
    the output/cell state variables), output ``[T|B, B|T, n_output]``."""
    require_unquantized(ctx, "UNIDIRECTIONAL_SEQUENCE_LSTM")
    if diagonal_recurrent_tensors:
        raise ctx.error("diagonal_recurrent_tensors is not supported")
    x = jnp.asarray(ins[0])
    h0, c0 = ins[18], ins[19]
    step = lstm_cell(ctx, _lstm_weights(ins), fused_activation_function, float(cell_clip), float(proj_clip))
    xs = x if time_major else jnp.swapaxes(x, 0, 1)
    _, ys = lax.scan(step, (jnp.asarray(h0, x.dtype), jnp.asarray(c0, x.dtype)), xs)
    return ys if time_major else jnp.swapaxes(ys, 0, 1)


@register("tflite", "LSTM")
def LSTM(ctx, *ins, fused_activation_function="TANH", cell_clip=0.0, proj_clip=0.0, kernel_type="FULL",
         asymmetric_quantize_inputs=False):
    """TFLite LSTM (full kernel, one time step): input ``[B, I]``, the
    24-input layout of UNIDIRECTIONAL_SEQUENCE_LSTM, output ``[B, n_output]``.
    The 5-input BASIC kernel is refused."""
    require_unquantized(ctx, "LSTM")
    if kernel_type != "FULL":
        raise ctx.error(f"LSTM kernel_type {kernel_type} is not supported (only FULL)")
    x = jnp.asarray(ins[0])
    step = lstm_cell(ctx, _lstm_weights(ins), fused_activation_function, float(cell_clip), float(proj_clip))
    _, y = step((jnp.asarray(ins[18], x.dtype), jnp.asarray(ins[19], x.dtype)), x)
    return y


def _rnn_step(ctx, w, r, b, act):
    def step(h, x):
        h2 = activation(ctx, _mm(ctx, x, w) + _mm(ctx, h, r) + b, act)
        return h2, h2
    return step


@register("tflite", "RNN")
def RNN(ctx, x, w, r, b, h, *, fused_activation_function="NONE", asymmetric_quantize_inputs=False):
    """TFLite RNN (``basic_rnn.cc``): one step ``act(W x + R h + b)``;
    ``x [B, I]``, ``W [U, I]``, ``R [U, U]``, ``b [U]``, state ``h [B, U]``.
    Outputs the new hidden state (twice when the node lists two outputs)."""
    require_unquantized(ctx, "RNN")
    h2, y = _rnn_step(ctx, w, r, b, fused_activation_function)(jnp.asarray(h, x.dtype), x)
    return [h2, y] if len(ctx.outputs) > 1 else y


@register("tflite", "UNIDIRECTIONAL_SEQUENCE_RNN")
def UNIDIRECTIONAL_SEQUENCE_RNN(ctx, x, w, r, b, h, *, time_major=False, fused_activation_function="NONE",
                                asymmetric_quantize_inputs=False):
    """TFLite UNIDIRECTIONAL_SEQUENCE_RNN: :func:`RNN` over time with
    ``lax.scan``; ``x`` ``[T, B, I]`` if ``time_major`` else ``[B, T, I]``."""
    require_unquantized(ctx, "UNIDIRECTIONAL_SEQUENCE_RNN")
    x = jnp.asarray(x)
    xs = x if time_major else jnp.swapaxes(x, 0, 1)
    _, ys = lax.scan(_rnn_step(ctx, w, r, b, fused_activation_function), jnp.asarray(h, x.dtype), xs)
    return ys if time_major else jnp.swapaxes(ys, 0, 1)


@register("tflite", "BIDIRECTIONAL_SEQUENCE_RNN")
def BIDIRECTIONAL_SEQUENCE_RNN(ctx, x, fw_w, fw_r, fw_b, fw_h, bw_w, bw_r, bw_b, bw_h, aux=None, fw_aux_w=None,
                               bw_aux_w=None, *, time_major=False, fused_activation_function="NONE",
                               merge_outputs=False, asymmetric_quantize_inputs=False):
    """TFLite BIDIRECTIONAL_SEQUENCE_RNN (``bidirectional_sequence_rnn.cc``):
    a forward RNN over time and a backward one over the reversed sequence
    (its outputs stored at the original time positions); ``merge_outputs``
    concatenates them on the last axis into one output. Auxiliary inputs
    are refused."""
    require_unquantized(ctx, "BIDIRECTIONAL_SEQUENCE_RNN")
    if aux is not None:
        raise ctx.error("auxiliary inputs are not supported")
    x = jnp.asarray(x)
    xs = x if time_major else jnp.swapaxes(x, 0, 1)
    act = fused_activation_function
    _, yf = lax.scan(_rnn_step(ctx, fw_w, fw_r, fw_b, act), jnp.asarray(fw_h, x.dtype), xs)
    _, yb = lax.scan(_rnn_step(ctx, bw_w, bw_r, bw_b, act), jnp.asarray(bw_h, x.dtype), xs, reverse=True)
    if not time_major:
        yf, yb = jnp.swapaxes(yf, 0, 1), jnp.swapaxes(yb, 0, 1)
    return [jnp.concatenate([yf, yb], -1)] if merge_outputs else [yf, yb]


@register("tflite", "SVDF")
def SVDF(ctx, x, weights_feature, weights_time, bias=None, state=None, *, rank=1,
         fused_activation_function="NONE", asymmetric_quantize_inputs=False):
    """TFLite SVDF (``svdf.cc``, ``EvalFloatSVDF``), one step: the state
    ``[B, F * M]`` (viewed ``[B, F, M]``, zeros initially) shifts left by one
    along M and takes ``x @ weights_feature^T`` as its last column; each
    filter's state is dotted with its ``weights_time [F, M]`` row, groups of
    ``rank`` filters are summed into ``U = F / rank`` units, then bias and
    the fused activation. Output ``[B, U]``."""
    require_unquantized(ctx, "SVDF")
    x = jnp.asarray(x)
    f, m = weights_time.shape
    r = int(rank)
    if r < 1 or f % r:
        raise ctx.error(f"rank {rank} does not divide {f} filters")
    s = jnp.asarray(state, x.dtype).reshape(x.shape[0], f, m)
    s = jnp.concatenate([s[:, :, 1:], _mm(ctx, x, weights_feature)[:, :, None]], axis=2)
    scratch = jnp.sum(s * weights_time[None], axis=2)
    out = scratch.reshape(x.shape[0], f // r, r).sum(-1)
    if bias is not None:
        out = out + bias
    return activation(ctx, out, fused_activation_function)


@register("tflite", "BIDIRECTIONAL_SEQUENCE_LSTM")
def BIDIRECTIONAL_SEQUENCE_LSTM(ctx, *ins, fused_activation_function="TANH", cell_clip=0.0, proj_clip=0.0,
                                merge_outputs=False, time_major=True, asymmetric_quantize_inputs=False):
    """TFLite BIDIRECTIONAL_SEQUENCE_LSTM (48 inputs): input 0, forward
    weights 1-17 and backward weights 18-34 in the LSTM order, states 35-38
    (fw h, fw c, bw h, bw c); the backward LSTM runs over the reversed
    sequence with outputs at the original positions; ``merge_outputs``
    concatenates both on the last axis. Auxiliary inputs (39-47) are refused."""
    require_unquantized(ctx, "BIDIRECTIONAL_SEQUENCE_LSTM")
    if len(ins) > 39 and any(v is not None for v in ins[39:]):
        raise ctx.error("auxiliary inputs are not supported")
    x = jnp.asarray(ins[0])
    xs = x if time_major else jnp.swapaxes(x, 0, 1)
    ys = []
    for w, (h, c), rev in ((ins[1:18], ins[35:37], False), (ins[18:35], ins[37:39], True)):
        step = lstm_cell(ctx, tuple(w) + (None,) * 4, fused_activation_function, float(cell_clip),
                         float(proj_clip))
        _, y = lax.scan(step, (jnp.asarray(h, x.dtype), jnp.asarray(c, x.dtype)), xs, reverse=rev)
        ys.append(y if time_major else jnp.swapaxes(y, 0, 1))
    return [jnp.concatenate(ys, -1)] if merge_outputs else ys
