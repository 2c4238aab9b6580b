"""The graph's tensor descriptors (``tensors[]``: id, BHWDC shape, storage) as IR values, and the graph's
inputs and outputs."""

from __future__ import annotations

import numpy as np

from ...errors import ModelFormatError
from ...ir import Value
from .. import verify as _verify
from .generations import Generation


def tensor_values(graph, label: str) -> dict[int, Value]:
    """``{tensor id: Value}``: float32 ``[B, H, W, C]`` values named ``"t<id>"``, one per graph tensor.

    Raises:
        ModelFormatError: a tensor without a shape, a non-positive size, a 3-D tensor (D > 1), a repeated id.
    """
    out = {}
    for i in range(graph.TensorsLength()):
        t = graph.Tensors(i)
        d = t.Desc()
        s = d.Shape() if d is not None else None
        if s is None:
            raise ModelFormatError(f"{label}tensors[{i}] has no shape")
        b, h, w, dd, c = s.B(), s.H(), s.W(), s.D(), s.C()
        shape = (b, h, w, c)
        _verify.check_shape(shape, f"{label}tensors[{i}] (id {t.Id()})")
        if min(shape) < 1 or dd not in (0, 1):
            raise ModelFormatError(f"{label}tensors[{i}] (id {t.Id()}) has shape BHWDC {[b, h, w, dd, c]}; "
                                   "fbjax reads 2-D tensors with positive sizes")
        if t.Id() in out:
            raise ModelFormatError(f"{label}tensor id {t.Id()} appears twice in tensors")
        out[t.Id()] = Value(f"t{t.Id()}", np.dtype(np.float32), shape, index=t.Id())
    return out


def get(values: dict, vid: int, where: str) -> Value:
    """The value of tensor id ``vid``.

    Raises:
        ModelFormatError: no tensor has that id.
    """
    v = values.get(vid)
    if v is None:
        raise ModelFormatError(f"{where} refers to tensor id {vid}, which is not in tensors")
    return v


def graph_io(graph, gen: Generation, values: dict, label: str) -> tuple[list, list]:
    """The graph's input and output values, renamed as the generation names them: by ``input_refs`` /
    ``output_refs`` (the TFLite tensor indices they stand for), or ``"id<value id>"`` (seed).

    Raises:
        ModelFormatError: refs and ids of different lengths, an unknown tensor id.
    """
    in_ids = [int(x) for x in graph.InputIdsAsNumpy()] if graph.InputIdsLength() else []
    out_ids = [int(x) for x in graph.OutputIdsAsNumpy()] if graph.OutputIdsLength() else []
    if not gen.refs:
        in_names, out_names = [f"id{i}" for i in in_ids], [f"id{i}" for i in out_ids]
    else:
        in_refs = [int(x) for x in graph.InputRefsAsNumpy()] if graph.InputRefsLength() else []
        out_refs = [int(x) for x in graph.OutputRefsAsNumpy()] if graph.OutputRefsLength() else []
        if len(in_refs) != len(in_ids) or len(out_refs) != len(out_ids):
            raise ModelFormatError(f"{label}input_refs/output_refs ({len(in_refs)}/{len(out_refs)}) do not match "
                                   f"input_ids/output_ids ({len(in_ids)}/{len(out_ids)})")
        in_names, out_names = [str(r) for r in in_refs], [str(r) for r in out_refs]
    inputs = []
    for vid, name in zip(in_ids, in_names):
        v = get(values, vid, f"{label}input_ids")
        v.name = name
        inputs.append(v)
    outputs = []
    for vid, name in zip(out_ids, out_names):
        v = get(values, vid, f"{label}output_ids")
        if v not in inputs:
            v.name = name
        outputs.append(v)
    return inputs, outputs
