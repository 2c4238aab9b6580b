"""TFLite (de)quantization ops (``kernels/dequantize.cc``)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ..registry import register


def _float_input(node) -> bool:
    """DEQUANTIZE of a float (float16) value is an elementwise cast: it keeps its input's layout."""
    return node.inputs[0] is not None and np.dtype(node.inputs[0].dtype).kind == "f"


@register("tflite", "DEQUANTIZE", layout_passthrough=_float_input)
def DEQUANTIZE(ctx, x):
    """TFLite DEQUANTIZE (``reference_ops::Dequantize``) to float32.

    float16 inputs are widened; int8/uint8/int16 inputs with quantization
    parameters become ``(q - zero_point) * scale``, per-channel along
    ``quantized_dimension`` when there are several scales.
    """
    v = ctx.inputs[0]
    out_dtype = ctx.out_dtype(0) if ctx.outputs and ctx.outputs[0] is not None else np.dtype(np.float32)
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jnp.floating):
        return x.astype(out_dtype)
    q = v.quant if v is not None else None
    if q is None:
        raise ctx.error(f"{np.dtype(x.dtype).name} input has no quantization parameters")
    scale = np.asarray(q.scale, np.float32).reshape(-1)
    zp = np.asarray(q.zero_point).reshape(-1).astype(np.int32)
    if scale.size > 1:
        d = int(q.quantized_dimension)
        if not 0 <= d < x.ndim or x.shape[d] != scale.size:
            raise ctx.error(
                f"{scale.size} per-channel scales do not match dimension {d} of shape {tuple(x.shape)}"
            )
        bshape = [1] * x.ndim
        bshape[d] = scale.size
        scale, zp = scale.reshape(bshape), zp.reshape(bshape)
    else:
        scale, zp = scale.reshape(()), zp.reshape(())
    real = (x.astype(jnp.int32) - zp).astype(jnp.float32) * scale
    return real.astype(out_dtype)
