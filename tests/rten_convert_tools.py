"""Convert ONNX models to .rten with rten-convert, in process.

Does what ``rten-convert model.onnx out.rten`` does (shape inference with data
propagation, ``graph_from_onnx_graph``, ``serialize_model``, v2 header and
64-byte aligned tensor-data segment) without a subprocess per model, so the
~900 convertible node-suite cases convert in seconds. ``v1=True`` writes the
headerless v1 layout with inline data, like ``rten-convert --v1``.

:func:`make_defaults_explicit` (:mod:`fbjax.convert`) is an
optional ONNX-level pre-pass that states attributes whose ONNX default
rten-convert 0.22 does not carry over (see its docstring);
``convert(model, explicit_defaults=True)`` applies it first.
"""

from __future__ import annotations

import contextlib
import io

import onnx
from rten_convert import converter as C
from rten_convert.errors import ConversionError
from rten_convert.tensor_data import TensorDataBuilder
from rten_convert.util import round_up


from fbjax.convert import make_defaults_explicit  # noqa: F401 (used below, and by the tests)


class ConvertError(Exception):
    """rten-convert refused the model (message: its error output)."""


def convert(model: onnx.ModelProto, *, v1: bool = False, infer_shapes: bool = True,
            explicit_defaults: bool = False) -> bytes:
    """The bytes of ``model`` converted to .rten by rten-convert.

    ``explicit_defaults=True`` runs :func:`make_defaults_explicit` first.

    Raises:
        ConvertError: rten-convert could not convert it.
    """
    if explicit_defaults:
        model = make_defaults_explicit(model)[0]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            if infer_shapes:
                model = onnx.shape_inference.infer_shapes(model, data_prop=True)
            graph = C.graph_from_onnx_graph(model.graph)
            tensor_data = None if v1 else TensorDataBuilder()
            data = C.serialize_model(graph, C.Metadata(description="fbjax test"), tensor_data)
    except (ConversionError, Exception) as e:  # rten-convert raises assorted errors
        raise ConvertError(f"{type(e).__name__}: {e}; {err.getvalue().strip()}") from None
    if v1:
        return bytes(data)
    out = io.BytesIO()
    header = 32
    toff = round_up(header + len(data), 64)
    C.write_header(out, header, len(data), toff)
    out.write(data)
    out.write(b"\0" * (toff - out.tell()))
    tensor_data.write(out)
    return out.getvalue()
