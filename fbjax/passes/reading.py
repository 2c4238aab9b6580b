"""The read step: a reader's IR completed from the ops' facts in a registry.

The readers (:mod:`fbjax.formats`) sit below the op registry and know no
op's semantics; what a file's meaning depends on per op is declared at the
op's registration (:class:`fbjax._registry.OpDef`) and applied here, right
after reading, by :func:`read`, the one read step: :func:`fbjax.loading.read`
(what :func:`fbjax.load`, ``fbjax inspect`` and :mod:`fbjax.precision` run,
registry :data:`fbjax.lower.LOWERINGS`) and the numpy reference
(:data:`fbjax.reference.REFERENCE`) both call it, so both refuse or complete
a file alike, and :func:`fbjax.lower.build.build` takes only what it returns
(:attr:`fbjax.ir.ModelIR.completed`):

* :func:`check_regions`: every graph an operator runs (a WHILE body, a
  REDUCE computation, an IF branch...) takes and returns as many values as
  the operator hands it and expects back (the ``regions`` fact);
* :func:`fill_dtypes`: output dtypes a file leaves open (RTen values that
  ONNX shape inference did not type) from the ``out_dtype`` fact.
"""

from __future__ import annotations

import re

import numpy as np

from typing import Optional

from ..errors import ModelFormatError
from ..formats import read_model
from ..ir import ModelIR, Node

__all__ = ["read", "check_regions", "fill_dtypes", "complete"]


def read(source, registry, format: Optional[str] = None) -> ModelIR:  # noqa: A002 - read_model's name
    """The completed IR of ``source``: a path or bytes, read by its format's
    reader (:func:`fbjax.formats.read_model`, ``format`` None: detected), or
    a :class:`~fbjax.ir.ModelIR` already read or built (completed in place),
    with ``registry``'s facts applied (:func:`complete`).

    Raises:
        ModelFormatError: the file is not a valid model of its format, or a
            node contradicts its op's declared regions.
    """
    ir = source if isinstance(source, ModelIR) else read_model(source, format)
    return complete(ir, registry)


def complete(ir: ModelIR, registry) -> ModelIR:
    """Check the region arities, then fill the open output dtypes (in place),
    and mark ``ir`` :attr:`~fbjax.ir.ModelIR.completed`. Called by
    :func:`read` only (``tests/test_layering.py`` checks it).

    Raises:
        ModelFormatError: see :func:`check_regions`.
    """
    check_regions(ir, registry)
    fill_dtypes(ir, registry)
    ir.completed = True
    return ir


_TRAILING_INDEX = re.compile(r"^(.*?)(\d+)$")


def _kind_of(graph_name: str) -> str:
    """``"STABLEHLO_WHILE3"`` -> ``"STABLEHLO_WHILE"`` (the converter's naming)."""
    m = _TRAILING_INDEX.match(graph_name or "")
    return (m.group(1) if m else graph_name or "").rstrip("_").upper()


def _op_kind(node: Node) -> str:
    prefix = node.op_set + "."
    if node.op_name.startswith(prefix):  # "stablehlo.while" -> "STABLEHLO_WHILE", as converters name bodies
        return (node.op_set + "_" + node.op_name[len(prefix):]).upper()
    return node.op_name.upper()


def check_regions(ir: ModelIR, registry) -> None:
    """Check every region body's arity against its operator's ``regions``
    fact (:class:`fbjax.op_rules.Region`; the rules come from each op's
    spec: a TFLite ``WHILE`` body takes and returns the N loop values and its
    ``cond`` returns one bool (``kernels/while.cc``); a StableHLO ``reduce``
    computation with N inputs and N init values takes 2N scalars and returns
    N...). The readers already check that each graph index is in range and
    that no graph calls itself (:func:`fbjax.formats.verify.check_call_graph`).

    Raises:
        ModelFormatError: a required region is missing
            (:attr:`fbjax.op_rules.Region.required`), or a region graph takes or returns another number of
            values than its operator passes or expects (the file's writer
            pointed the attribute at the wrong graph), naming the operator,
            the region, the graph, the arity found and the one expected, and,
            where one exists, a graph of the right arity whose name marks it
            as this operator's (TensorFlow's converter names region graphs
            ``STABLEHLO_WHILE3``, ``STABLEHLO_REDUCE2``...), the likely
            intended body.
    """
    graphs = ir.graphs
    for gi, g in enumerate(graphs):
        for node in (g.nodes if g is not None else ()):
            od = registry.get(node.op_set, node.op_name)
            rules = od.regions if od is not None else None
            if not rules:
                continue
            for attr, rule in rules.items():
                if attr not in node.attrs:
                    if getattr(rule, "required", False):
                        raise ModelFormatError(f"{node.location} ({node.op_name}): the {attr} graph is missing")
                    continue
                idx = int(node.attrs[attr])
                if not 0 <= idx < len(graphs) or graphs[idx] is None:
                    continue  # range: checked by the reader (verify.check_call_graph)
                want_in, want_out = rule.arity(node)
                body = graphs[idx]
                got_in, got_out = len(body.inputs), len(body.outputs)
                bad_in = want_in is not None and got_in != want_in
                bad_out = want_out is not None and got_out != want_out
                if not (bad_in or bad_out):
                    continue
                what = (f"takes {got_in} inputs, the operator passes {want_in}" if bad_in
                        else f"returns {got_out} values, the operator expects {want_out}")
                where = node.location if node.location.endswith(")") else f"{node.location} ({node.op_name})"
                msg = (f"{where}: {attr} is subgraph {idx} ({body.name!r}), which "
                       f"{what}. The file is malformed: its writer pointed {attr} at the wrong subgraph.")
                kind = _op_kind(node)
                likely = [k for k, h in enumerate(graphs)
                          if h is not None and k != idx and k != gi and _kind_of(h.name) == kind
                          and (want_in is None or len(h.inputs) == want_in)
                          and (want_out is None or len(h.outputs) == want_out)
                          and not any(int(node.attrs.get(a, -1)) == k for a in rules if a != attr)]
                if likely:
                    names = ", ".join(f"{k} ({graphs[k].name!r})" for k in likely[:3])
                    msg += (f" Subgraph {names} has the right arity and is named like this operator's "
                            f"regions: probably the intended {attr}; re-convert the model, or fix the index "
                            "in the file.")
                raise ModelFormatError(msg)


def fill_dtypes(ir: ModelIR, registry) -> None:
    """Give every value whose dtype the file leaves open (None) one, in place.

    Graphs are completed callee first (an ONNX ``If``/``Loop`` output takes
    its body's output dtype), nodes in order; an output takes its op's
    ``out_dtype`` fact (``fn(node, k) -> dtype or None``) when the op has one
    and it answers, else the dtype of the op's first typed input (float32
    when none is). Values still open after that (graph inputs, captures)
    are float32. Files whose values are all typed (TFLite, StableHLO) are
    left as they are.
    """
    f32 = np.dtype(np.float32)
    if not any(v.dtype is None for g in ir.graphs if g is not None for v in g.values):
        return
    done: set = set()

    def graph(gi: int) -> None:
        if gi in done or not 0 <= gi < len(ir.graphs) or ir.graphs[gi] is None:
            return
        done.add(gi)
        g = ir.graphs[gi]
        for n in g.nodes:
            for refs in n.regions.values():
                for r in refs:
                    graph(int(r))
            od = registry.get(n.op_set, n.op_name)
            rule = od.out_dtype if od is not None else None
            known = [v.dtype for v in n.inputs if v is not None and not isinstance(v, list) and v.dtype is not None]
            first = known[0] if known else f32
            for k, o in enumerate(n.outputs):
                if o is None or o.dtype is not None:
                    continue
                dt = rule(n, k, ir.graphs) if rule is not None else None
                o.dtype = np.dtype(first if dt is None else dt)
        for v in list(g.values) + list(g.inputs):
            if v is not None and v.dtype is None:
                v.dtype = f32

    for gi in range(len(ir.graphs)):
        graph(gi)
