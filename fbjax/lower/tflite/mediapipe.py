"""MediaPipe custom ops: the pooling pair as LiteRT runs them (XNNPACK is their only
runtime kernel): ``MaxPoolingWithArgmax2D`` and ``MaxUnpooling2D``; and the
geometry ops ``Landmarks2TransformMatrix``, ``TransformLandmarks`` and
``TransformTensorBilinear`` / ``TransformTensor`` (MediaPipe's own kernels,
versions 1 and 2; see the section at the end).

Options are a raw ``TfLitePoolParams`` struct (little-endian int32
``padding`` (1 SAME, 2 VALID), ``stride_width``, ``stride_height``,
``filter_width``, ``filter_height``, ...), which the frontend passes as
``custom_options`` bytes. The argmax output is declared float32 but holds,
bit for bit, the uint32 index *within the pooling window*, column-major (``dx *
filter_height + dy``, first maximum in that order on ties) -- XNNPACK's argmax-pooling convention, checked
against ai-edge-litert; MaxUnpooling2D reads the same encoding.
"""

from __future__ import annotations

import struct

import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import kernels
from ..registry import register


def pool_params(ctx, custom_options):
    """``(padding, (sh, sw), (kh, kw))`` from the raw TfLitePoolParams bytes."""
    raw = bytes(custom_options or b"")
    if len(raw) < 20:
        raise ctx.error(f"custom options are {len(raw)} bytes; expected a TfLitePoolParams struct (>= 20)")
    pad, sw, sh, fw, fh = struct.unpack("<5i", raw[:20])
    if pad not in (1, 2) or min(sw, sh, fw, fh) < 1:
        raise ctx.error(f"invalid pool params padding={pad} strides={sh}x{sw} filter={fh}x{fw}")
    return ("SAME" if pad == 1 else "VALID"), (sh, sw), (fh, fw)


def _geometry(ctx, hw, padding, strides, window):
    pads = kernels.explicit_padding(padding, hw, window, strides)
    out = [kernels.conv_output_size(n, k, s, 1, p) for n, k, s, p in zip(hw, window, strides, pads)]
    return pads, out


@register("tflite.custom", "MaxPoolingWithArgmax2D", differentiable=True)
def MaxPoolingWithArgmax2D(ctx, x, *, custom_options=b""):
    """Max pooling (NHWC) returning the values and the window-relative argmax
    (uint32 bits in a float32 tensor, see the module docstring)."""
    padding, strides, window = pool_params(ctx, custom_options)
    x = jnp.asarray(x)
    (pt, pb), (pl, pr) = (pads := _geometry(ctx, x.shape[1:3], padding, strides, window))[0]
    oh, ow = pads[1]
    xp = jnp.pad(x, ((0, 0), (pt, pb), (pl, pr), (0, 0)), constant_values=-jnp.inf)
    taps = [lax.slice(xp, (0, dy, dx, 0), (x.shape[0], dy + (oh - 1) * strides[0] + 1,
                                            dx + (ow - 1) * strides[1] + 1, x.shape[3]), (1, strides[0], strides[1], 1))
            for dx in range(window[1]) for dy in range(window[0])]  # column-major, as XNNPACK
    t = jnp.stack(taps)
    idx = jnp.argmax(t, axis=0).astype(jnp.uint32)
    return jnp.max(t, axis=0), lax.bitcast_convert_type(idx, jnp.float32)


@register("tflite.custom", "MaxUnpooling2D")
def MaxUnpooling2D(ctx, x, indices, *, custom_options=b""):
    """Scatter each pooled value to the position its window-relative index
    names (zeros elsewhere); output size from the file's output tensor, or
    the TF output size of a transposed window."""
    padding, strides, window = pool_params(ctx, custom_options)
    x = jnp.asarray(x)
    idx = lax.bitcast_convert_type(jnp.asarray(indices, jnp.float32), jnp.uint32).astype(jnp.int32)
    rec = ctx.outputs[0].shape if ctx.outputs and ctx.outputs[0] is not None else None
    if rec is not None and len(rec) == 4 and None not in rec[1:3]:
        hw = (int(rec[1]), int(rec[2]))
    elif padding == "SAME":
        hw = (x.shape[1] * strides[0], x.shape[2] * strides[1])
    else:
        hw = ((x.shape[1] - 1) * strides[0] + window[0], (x.shape[2] - 1) * strides[1] + window[1])
    (pt, _), (pl, _) = kernels.explicit_padding(padding, hw, window, strides)
    n, ih, iw, c = x.shape
    big = (n, pt + (ih - 1) * strides[0] + window[0] + hw[0], pl + (iw - 1) * strides[1] + window[1] + hw[1], c)
    out = jnp.zeros(big, x.dtype)
    for dy in range(window[0]):
        for dx in range(window[1]):
            k = dx * window[0] + dy
            sl = (slice(None), slice(dy, dy + (ih - 1) * strides[0] + 1, strides[0]),
                  slice(dx, dx + (iw - 1) * strides[1] + 1, strides[1]), slice(None))
            out = out.at[sl].add(jnp.where(idx == k, x, 0))
    return out[:, pt:pt + hw[0], pl:pl + hw[1], :]


# --- MediaPipe geometry custom ops -----------------------------------------------------------
# Landmarks2TransformMatrix, TransformLandmarks, TransformTensorBilinear (custom code
# "TransformTensor" for version 1). Their options are flexbuffer maps (decoded into
# attributes); the operator code's version (``ctx.node.version``) selects the variant:
# the two versions differ in input layout, options and, for TransformTensorBilinear,
# a half-pixel correction of the matrix. MediaPipe's kernels compute in float32, so do these.

def _subset(ctx, idx, n):
    """Landmark indices named by a flat list of pairs (an odd tail pairs with
    itself: the union of the pairs is just the list)."""
    idx = [int(i) for i in np.asarray(idx if idx is not None else [], np.int64).reshape(-1)]
    if not idx:
        raise ctx.error("the landmark subset is empty")
    bad = [i for i in idx if not 0 <= i < n]
    if bad:
        raise ctx.error(f"landmark subset indices {bad} are outside [0, {n})")
    return np.asarray(idx, np.int32)


def _landmark_index(ctx, name, i, n):
    i = int(i)
    if not 0 <= i < n:
        raise ctx.error(f"{name}={i} is outside [0, {n})")
    return i


def _rotate(x, y, a):
    c, s = jnp.cos(a), jnp.sin(a)
    return x * c - y * s, x * s + y * c


def _mat3(rows):
    return jnp.stack([jnp.stack([jnp.asarray(v, jnp.float32) for v in r]) for r in rows])


@register("tflite.custom", "Landmarks2TransformMatrix")
def Landmarks2TransformMatrix(ctx, landmarks, *, input_hw=None, output_hw=None, dimensions=3,
                              landmarks_range=0, bbox_size_multiplier=1.0, left_rotation_idx=0,
                              right_rotation_idx=1, subset=None, subset_idxs=None,
                              target_rotation_radians=0.0, output_height=0, output_width=0,
                              scale_x=1.0, scale_y=1.0):
    """The ``[1, 4, 4]`` float32 matrix mapping output-crop pixels to input
    pixels for the crop that the landmark subset spans, rotated so that the
    left/right rotation landmarks are level (MediaPipe
    ``landmarks_to_transform_matrix.cc``).

    Version 1: landmarks ``[1, 1, 1, N*3]`` (``dimensions`` must be 3);
    options ``input_hw``, ``output_hw``, ``landmarks_range``,
    ``bbox_size_multiplier``, ``subset``; result
    ``to_absolute @ R @ S @ to_relative`` (3x3) embedded in 4x4.
    Version 2: landmarks ``[1, N, D]`` (D >= 2); options ``subset_idxs``,
    ``target_rotation_radians``, ``output_height``/``output_width``,
    ``scale_x``/``scale_y``; result ``Shift(center) Rot(-r) Scale Shift(-out/2)``.

    Raises:
        ModelFormatError: bad options (sizes, indices, dimensions).
    """
    x = jnp.asarray(landmarks, jnp.float32)
    f32 = np.float32
    if ctx.node.version >= 2:
        d = x.shape[-1] if x.ndim else 0
        if d < 2:
            raise ctx.error(f"landmarks of shape {list(x.shape)}: the last dimension must hold >= 2 coordinates")
        pts = x.reshape(-1, d)
        n = pts.shape[0]
        idx = _subset(ctx, subset_idxs, n)
        li = _landmark_index(ctx, "left_rotation_idx", left_rotation_idx, n)
        ri = _landmark_index(ctx, "right_rotation_idx", right_rotation_idx, n)
        ow, oh = f32(output_width), f32(output_height)
        if not (ow > 0 and oh > 0):
            raise ctx.error(f"output size {output_height}x{output_width} must be positive")
        r = f32(target_rotation_radians) - jnp.arctan2(pts[ri, 1] - pts[li, 1], pts[ri, 0] - pts[li, 0])
        rx, ry = _rotate(pts[idx, 0], pts[idx, 1], r)
        x0, x1, y0, y1 = jnp.min(rx), jnp.max(rx), jnp.min(ry), jnp.max(ry)
        cx, cy = _rotate((x0 + x1) / 2, (y0 + y1) / 2, -r)
        c, s = jnp.cos(-r), jnp.sin(-r)
        sx = f32(scale_x) * (x1 - x0) / ow
        sy = f32(scale_y) * (y1 - y0) / oh
        zero, one = f32(0), f32(1)
        # Shift(c) @ Rot(-r) @ Scale(sx, sy) @ Shift(-ow/2, -oh/2), multiplied out
        m = _mat3([[c * sx, -s * sy, zero, cx - (c * sx * ow - s * sy * oh) / 2],
                   [s * sx, c * sy, zero, cy - (s * sx * ow + c * sy * oh) / 2],
                   [zero, zero, one, zero],
                   [zero, zero, zero, one]])
        return m.reshape(1, 4, 4)
    if int(dimensions) != 3:
        raise ctx.error(f"dimensions={dimensions}; version 1 supports 3 only")
    if x.size % 3:
        raise ctx.error(f"landmarks of shape {list(x.shape)} are not a multiple of 3 values")
    pts = x.reshape(-1, 3)
    n = pts.shape[0]
    idx = _subset(ctx, subset, n)
    li = _landmark_index(ctx, "left_rotation_idx", left_rotation_idx, n)
    ri = _landmark_index(ctx, "right_rotation_idx", right_rotation_idx, n)
    ihw = [int(v) for v in np.asarray(input_hw if input_hw is not None else [], np.int64).reshape(-1)]
    ohw = [int(v) for v in np.asarray(output_hw if output_hw is not None else [], np.int64).reshape(-1)]
    if len(ihw) != 2 or len(ohw) != 2 or min(ihw + ohw) < 1 or min(ohw) < 2:
        raise ctx.error(f"input_hw={ihw}, output_hw={ohw}: expected [h, w] pairs (output >= 2)")
    rng = f32(landmarks_range)
    if not rng > 0:
        raise ctx.error(f"landmarks_range={landmarks_range} must be positive")
    a = -jnp.arctan((pts[ri, 1] - pts[li, 1]) / (pts[ri, 0] - pts[li, 0]))
    rx, ry = _rotate(pts[idx, 0], pts[idx, 1], a)
    x0, x1 = jnp.minimum(jnp.min(rx), f32(1e5)), jnp.maximum(jnp.max(rx), f32(-1e5))
    y0, y1 = jnp.minimum(jnp.min(ry), f32(1e5)), jnp.maximum(jnp.max(ry), f32(-1e5))
    mult = f32(bbox_size_multiplier)
    bw, bh = (x1 - x0) * mult, (y1 - y0) * mult
    mx, my = _rotate((x1 + x0) / 2, (y1 + y0) / 2, -a)
    zero, one = f32(0), f32(1)
    c, s = jnp.cos(-a), jnp.sin(-a)
    scale = _mat3([[bw / rng, zero, zero], [zero, bh / rng, zero], [zero, zero, one]])
    rot = _mat3([[c, -s, mx / rng * 2 - 1], [s, c, my / rng * 2 - 1], [zero, zero, one]])
    (ih, iw), (oh, ow) = ihw, ohw
    to_rel = _mat3([[f32(2 / (ow - 1)), zero, -one], [zero, f32(2 / (oh - 1)), -one], [zero, zero, one]])
    to_abs = _mat3([[f32((iw - 1) / 2), zero, f32((iw - 1) / 2)],
                    [zero, f32((ih - 1) / 2), f32((ih - 1) / 2)], [zero, zero, one]])
    m = to_abs @ rot @ scale @ to_rel
    out = _mat3([[m[0, 0], m[0, 1], zero, m[0, 2]],
                 [m[1, 0], m[1, 1], zero, m[1, 2]],
                 [m[2, 0], m[2, 1], m[2, 2], zero],
                 [zero, zero, zero, one]])
    return out.reshape(1, 4, 4)


@register("tflite.custom", "TransformLandmarks")
def TransformLandmarks(ctx, landmarks, matrix, *, dimensions=None, scale=1.0):
    """Apply the 2-D part of a ``[1, 4, 4]`` matrix to every landmark:
    ``x' = m00 x + m01 y + m03 * scale``, ``y' = m10 x + m11 y + m13 * scale``,
    other coordinates unchanged (MediaPipe ``transform_landmarks.cc``).

    Version 1: landmarks ``[1, H, W, C]`` with ``C % dimensions == 0``
    (``dimensions`` 2 or 3), option ``scale`` (!= 0). Version 2: landmarks
    ``[1, N, D]`` (``D`` = last dim), scale 1.
    """
    x = jnp.asarray(landmarks, jnp.float32)
    m = jnp.asarray(matrix, jnp.float32).reshape(-1)
    if m.shape[0] != 16:
        raise ctx.error(f"matrix has {m.shape[0]} values; expected a [1, 4, 4] matrix")
    if ctx.node.version >= 2:
        d, k = x.shape[-1], jnp.float32(1)
    else:
        d, k = int(dimensions) if dimensions is not None else 0, jnp.float32(scale)
        if d not in (2, 3) or x.shape[-1] % d:
            raise ctx.error(f"dimensions={dimensions} must be 2 or 3 and divide the last dim of {list(x.shape)}")
        if float(scale) == 0:
            raise ctx.error("scale must not be 0")
    if d < 2:
        raise ctx.error(f"landmarks of shape {list(x.shape)} hold fewer than 2 coordinates each")
    pts = x.reshape(-1, d)
    px, py = pts[:, 0], pts[:, 1]
    nx = m[0] * px + m[1] * py + m[3] * k
    ny = m[4] * px + m[5] * py + m[7] * k
    return pts.at[:, 0].set(nx).at[:, 1].set(ny).reshape(x.shape)


@register("tflite.custom", ["TransformTensorBilinear", "TransformTensor"])
def TransformTensorBilinear(ctx, data, matrix, *, mode="bilinear", output_size=None):
    """Resample ``data`` (``[B, H, W, C]`` float32) on the grid that a
    ``[1, 4, 4]`` matrix maps output pixels to: input coordinate
    ``(m00 ox + m01 oy + m03, m10 ox + m11 oy + m13)``; zero outside
    ``[0, W-1] x [0, H-1]``; bilinear inside with zero-valued neighbours past
    the edge (MediaPipe ``transform_tensor_bilinear.cc``).

    Version 2 (custom code ``TransformTensorBilinear``) first shifts the
    translation by ``(m00 + m01 - 1) / 2`` (and likewise for y); version 1
    (code ``TransformTensor``) does not, and requires ``mode="bilinear"``.
    Output size: the output tensor's shape, else ``output_size = [h, w]``.
    """
    x = jnp.asarray(data, jnp.float32)
    if x.ndim != 4:
        raise ctx.error(f"data of shape {list(x.shape)}: expected [B, H, W, C]")
    m = jnp.asarray(matrix, jnp.float32).reshape(-1)
    if m.shape[0] != 16:
        raise ctx.error(f"matrix has {m.shape[0]} values; expected a [1, 4, 4] matrix")
    v2 = ctx.node.version >= 2
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if not v2 and mode != "bilinear":
        raise ctx.error(f"mode={mode!r}; only 'bilinear' exists")
    rec = ctx.outputs[0].shape if ctx.outputs and ctx.outputs[0] is not None else None
    if rec is not None and len(rec) == 4 and None not in rec[1:3]:
        oh, ow = int(rec[1]), int(rec[2])
    elif output_size is not None and np.asarray(output_size).size == 2:
        oh, ow = (int(v) for v in np.asarray(output_size).reshape(-1))
    else:
        raise ctx.error("no output size: neither the output tensor's shape nor output_size gives it")
    xr = [m[0], m[1], m[3]]
    yr = [m[4], m[5], m[7]]
    if v2:
        xr[2] = xr[2] + xr[0] * 0.5 + xr[1] * 0.5 - 0.5
        yr[2] = yr[2] + yr[0] * 0.5 + yr[1] * 0.5 - 0.5
    b, h, w, c = x.shape
    oy, ox = jnp.meshgrid(jnp.arange(oh, dtype=jnp.float32), jnp.arange(ow, dtype=jnp.float32), indexing="ij")
    tx = xr[0] * ox + xr[1] * oy + xr[2]
    ty = yr[0] * ox + yr[1] * oy + yr[2]
    inside = (tx >= 0) & (tx <= w - 1) & (ty >= 0) & (ty <= h - 1)
    x0f, y0f = jnp.floor(tx), jnp.floor(ty)
    fx, fy = (tx - x0f)[..., None], (ty - y0f)[..., None]
    # one zero row/column past the far edges: the only out-of-image neighbours
    # an inside sample can touch are x0+1 == W and y0+1 == H
    xp = jnp.pad(x, ((0, 0), (0, 1), (0, 1), (0, 0)))
    x0 = jnp.clip(x0f, 0, w - 1).astype(jnp.int32)
    y0 = jnp.clip(y0f, 0, h - 1).astype(jnp.int32)
    q00, q01 = xp[:, y0, x0], xp[:, y0, x0 + 1]
    q10, q11 = xp[:, y0 + 1, x0], xp[:, y0 + 1, x0 + 1]
    upper = (1 - fx) * q00 + fx * q01
    lower = (1 - fx) * q10 + fx * q11
    out = fy * lower + (1 - fy) * upper
    return jnp.where(inside[None, ..., None], out, jnp.float32(0))
