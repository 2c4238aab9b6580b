"""How each integer kernel rounds its output, for float mode's fake quantization.

In ``quantized="float"`` mode (:func:`fbjax.passes.quantization.prepare`) an op
without an integer-exact forward runs in float and its quantized output is
fake-quantized (:mod:`.fake_quant`). These functions, declared as the
``fq_rounding`` fact of the ``"tflite.int"`` lowering they describe, give
the ``fbjax:FAKE_QUANT`` attributes (``rounding``, ``offset``,
``pre_shift``, ``gain``, ``tail_away``) that round that float output as the
integer kernel (the exact mode's lowering) rounds it: ties half-even for
float->int QUANTIZE, up for the gemm output stage of 8-bit CONV_2D /
DEPTHWISE_CONV_2D / FULLY_CONNECTED, away from zero elsewhere; the SRDHM
pre-rounding before a right shift, the optimized MEAN's zero-point term,
the 16x8 kernels' 15-bit multiplier.

Each takes ``(node, orig)``: ``orig`` maps ``id(Value)`` to the
``(QuantParams, integer dtype)`` the activations and quantized constants
had before the rewrite. JAX-free (load time).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ... import quantmath as qm
from ...ir import Node, QuantParams

HALF_AWAY = {"rounding": "half_away"}


def _scale_zp(q: QuantParams) -> tuple[np.float32, int]:
    zp = np.asarray(q.zero_point).reshape(-1)
    return np.float32(np.asarray(q.scale, np.float32).reshape(-1)[0]), int(zp[0]) if zp.size else 0


def _io(n: Node, orig: dict, x_pos: int = 0) -> Optional[tuple]:
    """``(x, y, (qi, dti), (qo, dto))`` for input ``x_pos`` and output 0
    when both were quantized, else None."""
    x = n.inputs[x_pos] if len(n.inputs) > x_pos else None
    y = n.outputs[0] if n.outputs else None
    if x is None or y is None or id(x) not in orig or id(y) not in orig:
        return None
    return x, y, orig[id(x)], orig[id(y)]


def _weight_quant(n: Node, orig: dict) -> Optional[QuantParams]:
    w = n.inputs[1] if len(n.inputs) > 1 else None
    return orig[id(w)][0] if w is not None and id(w) in orig else None


def _conv_pre_shift(n: Node, qi: QuantParams, qo: QuantParams, orig: dict):
    """Right shifts of ``QuantizeMultiplier(s_in * s_w[c] / s_out)`` per
    output channel (0 where the multiplier shifts left): an int, or a tuple
    along the last axis for per-channel weights."""
    qw = _weight_quant(n, orig)
    if qw is None or np.asarray(qw.scale).size == 0:
        return 0
    si, so = _scale_zp(qi)[0], _scale_zp(qo)[0]
    sw = np.asarray(qw.scale, np.float32).reshape(-1)
    if n.op_name == "FULLY_CONNECTED" and sw.size == 1:
        reals = [float(np.float32(si) * sw[0]) / float(so)]  # float32 product (per-tensor FC)
    else:
        reals = [float(si) * float(c) / float(so) for c in sw]
    shifts = tuple(max(-int(e), 0) for e in qm.quantize_multipliers(reals)[1])
    return shifts[0] if len(shifts) == 1 or len(set(shifts)) == 1 else shifts


def _gain15(n: Node, qi: QuantParams, qo: QuantParams, orig: dict):
    """Per output channel, the int64 ``MultiplyByQuantizedMultiplier``'s
    effective multiplier (cut to 15 bits) over ``s_in * s_w[c] / s_out``: a
    float, a tuple along the last axis, or None without weight scales."""
    qw = _weight_quant(n, orig)
    if qw is None or np.asarray(qw.scale).size == 0:
        return None
    si, so = _scale_zp(qi)[0], _scale_zp(qo)[0]
    reals = [float(si) * float(c) / float(so) for c in np.asarray(qw.scale, np.float32).reshape(-1)]
    ms, es = qm.quantize_multipliers(reals)
    gains = []
    for r, m, e in zip(reals, ms.tolist(), es.tolist()):
        reduced = (m + (1 << 15)) >> 16 if m < 0x7FFF0000 else 0x7FFF
        gains.append(float(reduced * 2.0 ** (e - 15) / r) if r else 1.0)
    return gains[0] if len(set(gains)) == 1 else tuple(gains)


def _conv16_rounding(n: Node, qi: QuantParams, qo: QuantParams, orig: dict) -> dict:
    """16x8 CONV_2D / DEPTHWISE_CONV_2D / FULLY_CONNECTED, as the exact
    lowerings (:mod:`.conv`). FULLY_CONNECTED through the reference kernel
    (int64 bias, zero points): one rounding in double, half away. CONV_2D /
    DEPTHWISE_CONV_2D with an int64 bias: the int64
    ``MultiplyByQuantizedMultiplier``, whose multiplier is cut to 15 bits
    (relative error up to 2^-16, i.e. up to half a step on 16-bit outputs):
    ``gain`` = effective / exact multiplier per channel, one rounding, ties
    up. Otherwise the 32-bit rescale (two roundings, as 8-bit)."""
    b = n.inputs[2] if len(n.inputs) > 2 else None
    qw = _weight_quant(n, orig)
    if qw is None or np.asarray(qw.scale).size == 0:
        return dict(HALF_AWAY)
    int64_bias = b is not None and id(b) in orig and orig[id(b)][1] == np.int64
    if n.op_name == "FULLY_CONNECTED":
        qbt = n.attrs.get("quantized_bias_type")
        zps = [np.asarray(q.zero_point) for q in (qi, qw, qo)]
        qbt64 = qbt is not None and str(getattr(qbt, "name", qbt)).lower() == "int64"
        if int64_bias or any(np.any(z) for z in zps) or qbt64:
            # reference FullyConnected(PerChannel)Int16: round(acc * s_in*s_w/s_out) in double
            return dict(HALF_AWAY)
    if not int64_bias:
        return {"rounding": "half_away", "pre_shift": _conv_pre_shift(n, qi, qo, orig)}
    return {"rounding": "half_up", "gain": _gain15(n, qi, qo, orig)}


def conv(n: Node, orig: dict) -> dict:
    """CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED. 8-bit: the builtin
    kernels' SRDHM (rounds to 2^shift of a step), then the output stage's
    right shift with ties toward +inf (``fixedpoint.mbqm(..., ties_up=True)``); the
    depthwise scalar tail after the 8-channel body rounds away. 16x8:
    :func:`_conv16_rounding`."""
    io = _io(n, orig)
    if io is None:
        return dict(HALF_AWAY)
    _, y, (qi, dti), (qo, dto) = io
    if dti.itemsize == 1 and dto.itemsize == 1:
        out = {"rounding": "half_up", "pre_shift": _conv_pre_shift(n, qi, qo, orig)}
        c = y.shape[-1] if y.shape else None
        if n.op_name == "DEPTHWISE_CONV_2D" and c and c % 8:
            out["tail_away"] = int(c % 8)  # scalar tail after the 8-channel body (tflite_int.conv)
        return out
    if dti.itemsize == 2 and dto.itemsize == 2:
        return _conv16_rounding(n, qi, qo, orig)
    return dict(HALF_AWAY)


def transpose_conv(n: Node, orig: dict) -> dict:
    """TRANSPOSE_CONV (inputs: output_shape, weights, x, bias): 16-bit ->
    int64 rescale (15-bit multiplier, ties up), 8-bit ->
    ``MultiplyByQuantizedMultiplier``."""
    io = _io(n, orig, x_pos=2)
    if io is None:
        return dict(HALF_AWAY)
    _, _, (qi, dti), (qo, dto) = io
    if not (dti.itemsize == 1 and dto.itemsize == 1):
        g = _gain15(n, qi, qo, orig)
        return {"rounding": "half_up", "gain": g} if g is not None else dict(HALF_AWAY)
    return {"rounding": "half_away", "pre_shift": _conv_pre_shift(n, qi, qo, orig)}


def product(n: Node, orig: dict) -> dict:
    """MUL, BATCH_MATMUL: ``MultiplyByQuantizedMultiplier(acc, s_a*s_b/s_out)``:
    SRDHM rounds to 2^shift of a step, then RoundingDivideByPOT to the step;
    16x8 BATCH_MATMUL: int64 accumulator and 15-bit multiplier."""
    io = _io(n, orig)
    if io is None or len(n.inputs) < 2 or n.inputs[1] is None:
        return dict(HALF_AWAY)
    _, _, (qi, dti), (qo, dto) = io
    w = n.inputs[1]
    qw = orig[id(w)][0] if id(w) in orig else None
    if qw is None or np.asarray(qw.scale).size != 1:
        return dict(HALF_AWAY)
    sa, sb, so = _scale_zp(qi)[0], _scale_zp(qw)[0], _scale_zp(qo)[0]
    real = float(np.float32(np.float32(sa * sb) / so))
    m, e = qm.quantize_multiplier(real)
    if n.op_name == "BATCH_MATMUL" and not (dti.itemsize == 1 and dto.itemsize == 1):
        reduced = (m + (1 << 15)) >> 16 if m < 0x7FFF0000 else 0x7FFF
        return {"rounding": "half_up", "gain": float(reduced * 2.0 ** (e - 15) / real) if real else 1.0}
    return {"rounding": "half_away", "pre_shift": int(-e) if e < 0 else 0}


def quantize(n: Node, orig: dict) -> dict:
    """QUANTIZE. float -> int: the builtin AffineQuantize rounds half to even
    (FAKE_QUANT's default: no attributes). int -> int requantization:
    ``MBQM(q - zp_in, s_in/s_out) + zp_out``; the optimized 8-bit Requantize's
    vector body shifts half up."""
    x = n.inputs[0] if n.inputs else None
    if x is None or id(x) not in orig:
        return {}
    io = _io(n, orig)
    if io is None:
        return dict(HALF_AWAY)
    _, _, (qi, dti), (qo, dto) = io
    _, e = qm.quantize_multiplier(float(_scale_zp(qi)[0]) / float(_scale_zp(qo)[0]))
    eight_bit = dti.itemsize == 1 and dto.itemsize == 1
    return {"rounding": "half_up" if eight_bit else "half_away", "pre_shift": int(-e) if e < 0 else 0}


def _mean_axes(n: Node, x) -> Optional[tuple]:
    ax = n.inputs[1] if len(n.inputs) > 1 else None
    if ax is None or ax.data is None or x.shape is None:
        return None
    nd = len(x.shape)
    return tuple(sorted({int(a) % nd for a in np.asarray(ax.data).reshape(-1)}))


def mean(n: Node, orig: dict) -> dict:
    """MEAN. The optimized 8-bit kernel over H, W with keep_dims: raw code
    sum, bias from a separately rounded zero-point term
    (``pool._mean_or_sum``); otherwise the reference kernel's rescale by
    ``s_in / s_out`` with the count folded into the shift."""
    io = _io(n, orig)
    if io is None:
        return dict(HALF_AWAY)
    x, _, (qi, dti), (qo, dto) = io
    axes = _mean_axes(n, x)
    keep = bool(n.attrs.get("keep_dims", False))
    if axes is None:
        return dict(HALF_AWAY)
    si, zi = _scale_zp(qi)
    so, _ = _scale_zp(qo)
    if len(x.shape) == 4 and axes == (1, 2) and keep and dti.itemsize == 1 and dto.itemsize == 1:
        f32 = np.float32
        c = float(f32(f32(f32(zi) * si) / so))
        return {"rounding": "half_up", "offset": c}
    dims = [x.shape[a] for a in axes]
    if any(d is None for d in dims):
        return dict(HALF_AWAY)
    cnt = int(np.prod(dims)) if dims else 1
    _, s = qm.quantize_multiplier(float(si) / float(so))
    shift = min(cnt.bit_length() - 1, 32, 31 + s)
    s = s - shift
    return {"rounding": "half_away", "pre_shift": int(-s) if s < 0 else 0}
