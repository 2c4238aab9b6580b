"""ONNX to ``.rten`` in one step: ``fbjax convert model.onnx model.rten``.

rten-convert 0.22 writes a Softmax / LogSoftmax whose ONNX node leaves out
``axis`` with ``axis=0`` (the RTen schema's default), where ONNX means -1
(opset >= 13) or 1 with 2-D coercion (opset < 13); fbjax, like RTen, runs
what the ``.rten`` file says, so such a file computes something else than
the ONNX model (:func:`fbjax.formats.rten.read` warns where the result is
constant). :func:`convert` first states ONNX's defaults in a copy of the
model (:func:`make_defaults_explicit`), says what it stated, refuses to write
a file whose meaning would still change (a default a single ``axis``
cannot state) unless told to, then runs rten-convert on the stated model.

From Python::

    from fbjax.convert import convert, make_defaults_explicit

    report = convert("model.onnx", "model.rten")   # what was stated, what rten-convert said
    m, changed, left = make_defaults_explicit(onnx.load("model.onnx"))  # the pre-pass alone

Needs the ``onnx`` and ``rten-convert`` packages: ``pip install 'fbjax[onnx]'``.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tempfile
from typing import Optional

from .errors import InputError

__all__ = ["make_defaults_explicit", "convert", "ConvertReport", "ConversionRefused"]

#: rten-convert's version whose defaults the pre-pass knows (the one fbjax's tests run)
RTEN_CONVERT_VERSION = "0.22.0"


def _onnx():
    try:
        import onnx
    except ImportError:
        raise InputError("converting ONNX models needs the onnx and rten-convert packages: "
                         "pip install 'fbjax[onnx]'") from None
    return onnx


class ConversionRefused(InputError):
    """The converted file would not mean what the ONNX model means (the
    message names the nodes); ``allow_changed_meaning=True`` writes it anyway."""


class ConversionFailed(InputError):
    """rten-convert exited with an error; the message summarises its output
    (:func:`summarize_log`), :attr:`log` holds all of it."""

    def __init__(self, message: str, log: str = ""):
        super().__init__(message)
        self.log = log


def summarize_log(log: str) -> list:
    """rten-convert's output ``log`` in fbjax's words, one line per distinct
    message: its warnings (``WARNING: ...``, repeated prefixes dropped), the
    operators it could not convert (``Error converting operator ...``), and
    of each Python traceback only its last line (the exception), each with
    how often it occurred. Lines of no such kind are kept as they are."""
    import collections
    import re

    counts: dict = collections.Counter()
    lines = log.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        if not line:
            continue
        if line.startswith("Traceback (most recent call last)"):  # skip to the exception line
            while i < len(lines) and (lines[i].startswith((" ", "\t")) or not lines[i].strip()):
                i += 1
            if i < len(lines):
                exc = lines[i].strip()
                i += 1
                name, _, msg = exc.partition(": ")
                counts[f"rten-convert stopped: {msg or name} ({name.rsplit('.', 1)[-1]})"] += 1
            continue
        m = re.match(r"(?:WARNING: )+(.*)", line)
        if m:
            counts[f"warning: {m.group(1)}"] += 1
            continue
        m = re.match(r'Error converting operator "(.*?)": (.*)', line)
        if m:
            counts[f"not converted: {m.group(2)}" + (f" (node {m.group(1)!r})" if m.group(1) else "")] += 1
            continue
        counts[line] += 1
    return [k + (f" (x{n})" if n > 1 else "") for k, n in counts.items()]


#: Ops whose ``axis`` default rten-convert 0.22 replaces: its converter reads
#: ``get_attr("axis", "int", 0)`` for Softmax and LogSoftmax, i.e. the RTen
#: schema default 0, where ONNX says -1 (opset >= 13) or 1 with 2-D coercion
#: (opset < 13). Hardmax has the same ONNX default (not in the RTen schema).
_SOFTMAX_LIKE = ("Softmax", "LogSoftmax", "Hardmax")


def _opset(model) -> int:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return int(o.version)
    return 1


def _shapes(graph, outer: dict) -> dict:
    """name -> tuple of dims (int, or None when unknown) for every typed value of ``graph``."""
    shapes = dict(outer)
    for v in list(graph.input) + list(graph.value_info) + list(graph.output):
        t = v.type.tensor_type
        if v.type.HasField("tensor_type") and t.HasField("shape"):
            shapes[v.name] = tuple(d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim)
    for init in graph.initializer:
        shapes[init.name] = tuple(init.dims)
    return shapes


def make_defaults_explicit(model):
    """State the ONNX default ``axis`` of Softmax / LogSoftmax / Hardmax nodes
    that leave it out (semantics-preserving; applied before rten-convert).

    rten-convert 0.22 writes a missing ``axis`` as 0, which is not ONNX's
    default, so such a file computes something else than the ONNX model.
    This pass adds the attribute ONNX defines, so the converted file keeps
    the ONNX meaning:

    * opset >= 13: ``axis = -1`` (a single-axis softmax over the last axis).
    * opset < 13: ``axis = 1`` with the input *coerced to 2-D*
      ``[d0, d1 * d2 * ...]``; that is a single-axis softmax over axis 1 only
      when the input has rank 2, or every dim after axis 1 is 1 (then the
      flattened group holds only axis 1; e.g. ``[1, 1000, 1, 1]``). Then
      ``axis = 1`` is stated. Where the rank or those dims are unknown, or
      the coercion would flatten several axes of size > 1, the node is left
      unchanged (a single ``axis`` cannot express it) and noted.

    Nodes in subgraphs (If/Loop bodies) are handled the same way. Shapes come
    from ONNX shape inference with data propagation (as rten-convert runs it).

    Args:
        model: an ``onnx.ModelProto`` (not modified).

    Returns:
        ``(model, changed, left)``: a modified copy (``model`` itself when
        nothing changed), the changed nodes and the nodes left unchanged, each
        as ``"<op> <node name or output>: <what>"`` strings.
    """
    onnx = _onnx()

    def candidates(graph):
        for node in graph.node:
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    yield from candidates(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for g in a.graphs:
                        yield from candidates(g)
            if node.domain in ("", "ai.onnx") and node.op_type in _SOFTMAX_LIKE \
                    and not any(a.name == "axis" for a in node.attribute):
                yield node

    if next(candidates(model.graph), None) is None:  # nothing to state: skip the copy and shape inference
        return model, [], []
    opset = _opset(model)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(out, data_prop=True)
    except Exception:  # noqa: BLE001 - shapes unknown: only opset >= 13 nodes change
        inferred = out
    changed, left = [], []

    def walk(graph, inferred_graph, outer):
        shapes = _shapes(inferred_graph, outer)
        for node, inode in zip(graph.node, inferred_graph.node):
            for a, ia in zip(node.attribute, inode.attribute):  # subgraphs first
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g, ia.g, shapes)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for g, ig in zip(a.graphs, ia.graphs):
                        walk(g, ig, shapes)
            if node.domain not in ("", "ai.onnx") or node.op_type not in _SOFTMAX_LIKE:
                continue
            if any(a.name == "axis" for a in node.attribute):
                continue
            where = f"{node.op_type} {node.name or node.output[0]}"
            if opset >= 13:
                node.attribute.append(onnx.helper.make_attribute("axis", -1))
                changed.append(f"{where}: axis=-1 (opset {opset} default)")
                continue
            shape = shapes.get(node.input[0])
            if shape is None:
                left.append(f"{where}: opset {opset}, input rank unknown; 2-D coercion not expressible")
            elif len(shape) == 2 or (len(shape) > 2 and all(d == 1 for d in shape[2:])):
                node.attribute.append(onnx.helper.make_attribute("axis", 1))
                changed.append(f"{where}: axis=1 (opset {opset} default; input {shape}, coercion is one axis)")
            else:
                left.append(f"{where}: opset {opset}, input {shape}: 2-D coercion flattens several axes")

    walk(out.graph, inferred.graph, {})
    return (out if changed else model), changed, left


@dataclasses.dataclass
class ConvertReport:
    """What :func:`convert` did.

    Attributes:
        stated: ``"<op> <node>: <what>"`` per node whose ONNX default was stated.
        left: nodes whose meaning the ``.rten`` file does not keep (non-empty
            only with ``allow_changed_meaning=True``).
        out: the ``.rten`` path written.
        log: rten-convert's own output.
    """

    stated: list
    left: list
    out: str
    log: str = ""


def convert(src, dst: Optional[str] = None, *, allow_changed_meaning: bool = False,
            rten_convert_args: tuple = ()) -> ConvertReport:
    """Convert an ONNX model to ``.rten`` with ONNX's defaults stated first.

    Args:
        src: the ``.onnx`` file.
        dst: the ``.rten`` to write (default: ``src`` with ``.rten``).
        allow_changed_meaning: write the file even where a default cannot be
            stated (an opset < 13 Softmax whose 2-D coercion flattens
            several axes): the file then computes something else there.
        rten_convert_args: extra arguments for rten-convert (``("--v1",)``).

    Returns:
        :class:`ConvertReport`.

    Raises:
        InputError: onnx or rten-convert missing (says what to install),
            ``src`` missing or not ONNX.
        ConversionFailed: rten-convert failing (its output summarised; all of it in ``.log``).
        ConversionRefused: nodes whose meaning would change, without
            ``allow_changed_meaning``; nothing is written.
    """
    onnx = _onnx()
    src = os.fspath(src)
    dst = os.fspath(dst) if dst is not None else os.path.splitext(src)[0] + ".rten"
    if not os.path.isfile(src):
        raise InputError(f"{src}: no such file")
    try:
        model = onnx.load(src)
    except Exception as e:  # protobuf's DecodeError and friends
        raise InputError(f"{src}: not an ONNX model onnx can read ({type(e).__name__}: {e})") from None
    fixed, stated, left = make_defaults_explicit(model)
    if left and not allow_changed_meaning:
        raise ConversionRefused(
            f"{src}: not converted: rten-convert would write {len(left)} node(s) with another meaning than "
            f"ONNX's, and no attribute can state it: {'; '.join(left)}. Rewrite those nodes in the .onnx (e.g. "
            "a Reshape to 2-D around the Softmax), or pass --allow-changed-meaning to write the file anyway")
    folder = os.path.dirname(os.path.abspath(dst))
    if not os.path.isdir(folder):
        raise InputError(f"{dst}: folder {folder} does not exist (create it first)")
    try:
        import rten_convert  # noqa: F401 (checked here, run in a subprocess below)
    except ImportError:
        raise InputError("converting ONNX models needs rten-convert: pip install 'fbjax[onnx]'") from None
    with tempfile.TemporaryDirectory() as tmp:
        path = src
        if fixed is not model:
            path = os.path.join(tmp, os.path.basename(src))
            onnx.save(fixed, path)
        run = subprocess.run(
            [sys.executable, "-c", "import sys; from rten_convert.converter import main; "
             "sys.argv[0] = 'rten-convert'; sys.exit(main())", *rten_convert_args, path, dst],
            capture_output=True, text=True)
    log = (run.stdout + run.stderr).strip()
    if run.returncode != 0 or not os.path.isfile(dst):
        raise ConversionFailed(f"{src}: rten-convert failed (exit {run.returncode}): "
                               f"{'; '.join(summarize_log(log)) or '(no output)'}", log)
    return ConvertReport(stated, left, dst, log)
