"""Load-time check of region bodies: every subgraph an operator runs (a WHILE
body, a REDUCE computation, an IF branch...) takes and returns as many values
as the operator hands it and expects back.

The readers already check that each subgraph index is in range and that no
subgraph calls itself (:func:`fbjax.formats.verify.check_call_graph`); this
adds the arities, which depend on the operator's semantics:

* TFLite ``WHILE`` (``kernels/while.cc``): ``cond`` takes the N loop values
  and returns one bool; ``body`` takes and returns N values; the op has N
  outputs.
* TFLite ``IF`` (``if.cc``): both branches take the inputs after the
  condition and return one value per output. ``CALL`` takes the op's inputs
  and returns its outputs; ``CALL_ONCE``'s init graph takes nothing.
* StableHLO (``stablehlo.while``, ``reduce``, ``reduce_window``, ``sort``,
  ``scatter``, ``composite``; the StableHLO spec's region signatures): a
  ``while`` body takes and returns the N operands and its ``cond`` returns
  one value; a ``reduce``/``reduce_window`` computation with N inputs and N
  init values takes 2N scalars and returns N; a ``sort`` comparator takes 2
  per operand and returns 1; a ``scatter`` update takes 2 per updated
  operand and returns 1 per operand; a ``composite`` decomposition takes the
  op's inputs and returns its outputs.

A mismatch means the file contradicts itself (a converter wrote the wrong
subgraph index): :class:`~fbjax.errors.ModelFormatError` at load, naming the
operator, the region, the subgraph index, the arity found and the one
expected, and, where one exists, a subgraph of the right arity whose name
marks it as this operator's (TensorFlow's converter names region subgraphs
``STABLEHLO_WHILE3``, ``STABLEHLO_REDUCE2``...), the likely intended body.
Both the JAX lowering and the numpy reference read the IR through the
readers, so both refuse such a file.
"""

from __future__ import annotations

import re
from typing import Callable, NamedTuple, Optional

from ..errors import ModelFormatError
from ..ir import ModelIR, Node

#: a region's expected ``(inputs, outputs)`` given its node; None: not checked
Arity = Callable[[Node], tuple[Optional[int], Optional[int]]]


class Region(NamedTuple):
    """What fbjax knows of one region attribute of an op (the one table of
    it: the readers' arity check here, and the ``scalar_regions`` fact the
    lowerings declare from :func:`scalar_regions`)."""

    #: the body's expected ``(inputs, outputs)`` given the node
    arity: Arity
    #: a scalar computation (reduction body, sort comparator, scatter
    #: update): it never sees a batch dimension
    scalar: bool = False


def _n_in(n: Node) -> int:
    return len(n.inputs)


def _n_out(n: Node) -> int:
    return len(n.outputs)


#: (op_set, op_name) -> {attribute naming a subgraph: its :class:`Region`}
RULES: dict[tuple[str, str], dict[str, Region]] = {
    ("tflite", "WHILE"): {"cond_subgraph_index": Region(lambda n: (_n_in(n), 1)),
                          "body_subgraph_index": Region(lambda n: (_n_in(n), _n_in(n)))},
    ("tflite", "IF"): {"then_subgraph_index": Region(lambda n: (_n_in(n) - 1, _n_out(n))),
                       "else_subgraph_index": Region(lambda n: (_n_in(n) - 1, _n_out(n)))},
    ("tflite", "CALL"): {"subgraph": Region(lambda n: (_n_in(n), _n_out(n)))},
    ("tflite", "CALL_ONCE"): {"init_subgraph_index": Region(lambda n: (0, None))},
    ("stablehlo", "stablehlo.while"): {"cond": Region(lambda n: (_n_in(n), 1)),
                                       "body": Region(lambda n: (_n_in(n), _n_in(n)))},
    ("stablehlo", "stablehlo.reduce"): {"computation": Region(lambda n: (_n_in(n), _n_in(n) // 2), scalar=True)},
    ("stablehlo", "stablehlo.reduce_window"): {
        "computation": Region(lambda n: (_n_in(n), _n_in(n) // 2), scalar=True)},
    ("stablehlo", "stablehlo.sort"): {"comparator": Region(lambda n: (2 * _n_in(n), 1), scalar=True)},
    ("stablehlo", "stablehlo.scatter"): {
        "update_computation": Region(lambda n: (2 * (_n_in(n) - 1) // 2, _n_out(n)), scalar=True)},
    ("stablehlo", "stablehlo.composite"): {"decomposition": Region(lambda n: (_n_in(n), _n_out(n)))},
}


def scalar_regions(op_set: str, op_name: str) -> tuple:
    """The region attributes of ``(op_set, op_name)`` whose bodies are scalar
    computations (:attr:`Region.scalar`), for the op's ``scalar_regions``
    registry fact."""
    return tuple(a for a, r in RULES.get((op_set, op_name), {}).items() if r.scalar)


_TRAILING_INDEX = re.compile(r"^(.*?)(\d+)$")


def _kind_of(graph_name: str) -> str:
    """``"STABLEHLO_WHILE3"`` -> ``"STABLEHLO_WHILE"`` (the converter's naming)."""
    m = _TRAILING_INDEX.match(graph_name or "")
    return (m.group(1) if m else graph_name or "").rstrip("_").upper()


def _op_kind(node: Node) -> str:
    if node.op_set == "stablehlo" and node.op_name.startswith("stablehlo."):
        return "STABLEHLO_" + node.op_name[len("stablehlo."):].upper()
    return node.op_name.upper()


def check_regions(ir: ModelIR) -> None:
    """Check every region body's arity against its operator (see the module
    docstring for the rules).

    Raises:
        ModelFormatError: a region subgraph takes or returns another number
            of values than its operator passes or expects.
    """
    graphs = ir.graphs
    for gi, g in enumerate(graphs):
        for node in g.nodes:
            rules = RULES.get((node.op_set, node.op_name))
            if not rules:
                continue
            for attr, rule in rules.items():
                if attr not in node.attrs:
                    continue
                idx = int(node.attrs[attr])
                if not 0 <= idx < len(graphs):
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
                          if k != idx and k != gi and _kind_of(h.name) == kind
                          and (want_in is None or len(h.inputs) == want_in)
                          and (want_out is None or len(h.outputs) == want_out)
                          and not any(int(node.attrs.get(a, -1)) == k for a in rules if a != attr)]
                if likely:
                    names = ", ".join(f"{k} ({graphs[k].name!r})" for k in likely[:3])
                    msg += (f" Subgraph {names} has the right arity and is named like this operator's "
                            f"regions: probably the intended {attr}; re-convert the model, or fix the index "
                            "in the file.")
                raise ModelFormatError(msg)
