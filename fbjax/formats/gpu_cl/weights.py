"""Weight layouts: where each TFLite-layout weight element sits in a GPU weight object's data.

The delegate repacks every weight into a layout its kernels read (channels in
slices of 4, zero-padded); :func:`weight_index` gives, for each element of the
TFLite-layout weight, its position in the stored floats. The reader decodes
through it and :mod:`fbjax.formats.gpu_cl_writer` writes tuned values back
through the same map.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import ModelFormatError
from ...ir import Value
from .nodes import GpuObject


def slices(c: int) -> int:
    """Slices of 4 channels holding ``c`` channels."""
    return (c + 3) // 4


def weight_index(layout: str, shape: tuple, **kw) -> np.ndarray:
    """Index map of a weight layout: ``flat[index]`` is the TFLite-layout weight.

    ``index`` has the TFLite shape and holds, for each element, its position
    (in floats) in the object's stored data (channels padded to slices of 4).

    Layouts (TF 2.5 ``gpu/common/task/weights_conversion.h`` and the task
    classes):

    * ``"linear"`` ``[C]`` (or ``[1, 1, C]``): one float4 per channel slice.
    * ``"conv_i4o4"`` / ``"conv_o4i4"`` OHWI, ``group=G``: per group of G output
      slices, y, x, input slice, output slice in the group: 16 floats holding,
      for each of 4 input channels, 4 output channels (``i4o4``), or for each
      of 4 output channels, 4 input channels (``o4i4``).
    * ``"dw"`` ``[1, H, W, C]``: per channel slice, y, x: 4 channels.
    * ``"dw3x3"`` ``[1, 3, 3, C]`` and ``"dw3x3_bias"`` ``[C]``: per channel
      slice 9 float4 weights (row-major) then one float4 bias.
    * ``"fc"`` ``[O, I]``: 4x4 blocks, float index
      ``(i // 4) * Op * 4 + (o // 4) * 16 + (i % 4) * 4 + o % 4`` (Op = O
      padded to 4).
    * ``"transposed_thin"`` ``[1, KH, KW, I]`` (ConvolutionTransposedThin, one
      output channel): per input slice, y, x, a float4 of 4 input channels;
      then ``"transposed_thin_bias"``: one float4 of biases (``taps=KH*KW*slices``).
    """
    if layout == "linear":
        c = shape[-1]
        return np.arange(c).reshape(shape)
    if layout in ("conv_i4o4", "conv_o4i4", "transposed_ohwi_i4o4"):
        o_, kh, kw_, i_ = shape
        g = kw.get("group", 1)
        o = np.arange(o_)[:, None, None, None]
        y = np.arange(kh)[None, :, None, None]
        x = np.arange(kw_)[None, None, :, None]
        i = np.arange(i_)[None, None, None, :]
        si_n = slices(i_)
        os_, o4 = o // 4, o % 4
        gn, gs = os_ // g, os_ % g
        si, j = i // 4, i % 4
        base = ((((gn * kh + y) * kw_ + x) * si_n + si) * g + gs) * 16
        inner = j * 4 + o4 if layout != "conv_o4i4" else o4 * 4 + j
        return base + inner
    if layout == "dw":
        _, kh, kw_, c = shape
        y = np.arange(kh)[None, :, None, None]
        x = np.arange(kw_)[None, None, :, None]
        ch = np.arange(c)[None, None, None, :]
        return ((ch // 4 * kh + y) * kw_ + x) * 4 + ch % 4
    if layout == "dw3x3":
        _, kh, kw_, c = shape
        y = np.arange(3)[None, :, None, None]
        x = np.arange(3)[None, None, :, None]
        ch = np.arange(c)[None, None, None, :]
        return (ch // 4 * 10 + y * 3 + x) * 4 + ch % 4
    if layout == "dw3x3_bias":
        ch = np.arange(shape[0])
        return (ch // 4 * 10 + 9) * 4 + ch % 4
    if layout == "fc":
        o_, i_ = shape
        op = slices(o_) * 4
        o = np.arange(o_)[:, None]
        i = np.arange(i_)[None, :]
        return (i // 4) * op * 4 + (o // 4) * 16 + (i % 4) * 4 + o % 4
    if layout == "transposed_thin":  # one output channel: per input slice, y, x, a float4 of 4 input channels
        _, kh, kw_, i_ = shape
        y = np.arange(kh)[None, :, None, None]
        x = np.arange(kw_)[None, None, :, None]
        i = np.arange(i_)[None, None, None, :]
        return ((i // 4 * kh + y) * kw_ + x) * 4 + i % 4
    if layout == "transposed_thin_bias":  # then one float4 of biases
        return kw["taps"] * 4 + np.arange(shape[0])
    raise ValueError(f"unknown GPU weight layout {layout!r}")


@dataclass
class WeightRef:
    """Where a decoded weight lives: object, layout, index map (for write-back)."""

    node: int
    object: str
    layout: str
    index: np.ndarray
    value: Value


def decode(obj: GpuObject, layout: str, shape: tuple, where: str, **kw) -> tuple[np.ndarray, np.ndarray]:
    """``(weight as float32 of ``shape``, its index map)`` read from ``obj`` in ``layout``.

    Raises:
        ModelFormatError: the object holds fewer values than the layout needs (checked on the sizes before
            the index map is built).
    """
    n = 1
    for d in shape:
        n *= int(d)
    if n > obj.flat.size:  # each weight has its own slot: refuse before building a huge index map
        raise ModelFormatError(f"{where}: a {layout} weight of shape {list(shape)} has {n} values, "
                               f"but the object holds only {obj.flat.size}")
    idx = weight_index(layout, shape, **kw)
    if idx.size and int(idx.max()) >= obj.flat.size:
        raise ModelFormatError(f"{where}: a {layout} weight of shape {list(shape)} needs {int(idx.max()) + 1} values, "
                               f"but the object holds {obj.flat.size}")
    return obj.flat[idx].astype(np.float32), idx
