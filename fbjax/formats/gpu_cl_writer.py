"""Write a loaded TFLite GPU delegate ``.bin`` back with new weights (``Model.save``).

Every weight fbjax decodes from a GPU weight object keeps its element type and
the object its size, so the new file is the original bytes with only the
updated weights' floats overwritten in place, through the same index maps
(:func:`fbjax.formats.gpu_cl.weight_index`) the reader decoded them with:
channel padding, the other weights sharing an object (the 3x3 depthwise
kernel's packed biases), the kernels' code and every other byte stay as they
were, in whatever schema generation the file has. Values are cast to the
object's element type (float16 objects round them).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ..errors import InputError
from ..ir import ModelIR, Value
from ._writing import check_writable

__all__ = ["write"]


def write(ir: ModelIR, updates: Mapping[Value, np.ndarray], *, requantize: str = "file", registry=None) -> bytes:
    """The ``.bin`` bytes of ``ir``'s source file with some weights replaced.

    Args:
        ir: a model read by :func:`fbjax.formats.gpu_cl.read`.
        updates: IR constant (a decoded weight) -> new values, its TFLite-layout shape.
        requantize: accepted for :meth:`fbjax.Model.save`'s signature; GPU
            weights are float, so it changes nothing.
        registry: accepted for :func:`fbjax.formats.write_model`'s signature
            (the op registry; this writer needs no op facts).

    Returns:
        the new file's bytes.

    Raises:
        InputError: a constant that is not a decoded GPU weight, a shape
            mismatch, a value a float16 object cannot hold.
    """
    check_writable(ir, "gpu_cl", "GPU delegate", requantize, needs_buffer=False)
    out = bytearray(ir.buffer)
    refs = {id(w.value): w for w in ir.metadata["weights"]}
    nodes = ir.metadata["nodes"]
    staged: dict = {}  # (node, object) -> flat values being rewritten
    for v, x in updates.items():
        ref = refs.get(id(v))
        if ref is None:
            raise InputError(f"save: {v.name!r} is not a weight stored in a GPU object of this file")
        x = np.asarray(x)
        if x.shape != ref.index.shape:
            raise InputError(f"save: {v.name!r} has shape {x.shape}, the file's weight is {ref.index.shape}")
        obj = nodes[ref.node].objects[ref.object]
        flat = staged.get((ref.node, ref.object))
        if flat is None:
            flat = staged[(ref.node, ref.object)] = obj.flat.copy()
        cast = x.astype(obj.dtype)
        if not np.all(np.isfinite(cast)):
            raise InputError(f"save: {v.name!r} has values a {obj.dtype.name} object cannot hold "
                             f"(largest magnitude {float(np.max(np.abs(x)))})")
        flat[ref.index] = cast
    for (node, name), flat in staged.items():
        obj = nodes[node].objects[name]
        raw = flat.astype(obj.dtype).tobytes()
        out[obj.offset:obj.offset + len(raw)] = raw
    return bytes(out)
