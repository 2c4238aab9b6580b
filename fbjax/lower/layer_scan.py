"""Find a graph's repeated blocks (an LLM's transformer layers), so that the
lowering runs them as one ``jax.lax.scan`` body instead of unrolling them.

A quantized LLM's signature is a prefix (embedding lookup, rotary tables,
mask), ``L`` blocks of the same operators on different weights (the
layers), and a suffix (final norm, LM head). Traced as it is, every block
is lowered, optimised and compiled on its own: the first call's time and
the compiled program's size grow with the depth (SmolLM2-135M: 30 layers,
~1,300 nodes a signature). Run as a scan over the layers' stacked weights,
the block is traced and compiled once.

The blocks are found from the graph alone, never from tensor names:

1. each node gets a structural code: its op, attributes (a region by the
   structure of the graph it names), and for each operand its kind, shape,
   dtype and quantization -- the data of a constant counts, except for a
   *stackable* constant (a float weight that becomes a param, an integer
   weight buffer), whose values may differ from block to block;
2. the longest run of period ``P`` in the sequence of codes (nodes
   ``s .. s + L*P``, node ``s + k*P + j`` with the code of ``s + j``) is the
   candidate, scored by the nodes it saves, ``P * (L - 1)``;
3. its data flow must be the same in every block (:func:`_plan`): each
   operand of block ``k`` is made inside block ``k`` by the same relative
   node, or by block ``k - 1`` (a *carry*: the residual stream), or is the
   same value for every block (*shared*: read from before the region), or
   one value per block (*per-layer*: a KV-cache input, a weight); a value
   of block ``k`` read after the region (a KV-cache output, the last
   hidden state) is a *per-layer output*. Anything else (block ``k + 2``
   reading block ``k``) and the region is not scanned.

Operands at load-time positions (an op's ``static_inputs``) must be shared.
Quantization parameters must be equal in every block, except on the inputs
an op lists in its ``layer_quant`` fact (a hybrid kernel's weight scales),
which the scan body reads as per-layer arrays
(:meth:`fbjax.lower.build.LowerContext.quant_scale`).

This module reads the IR and the registry it is handed; the lowering
(:meth:`fbjax.lower.build.Program.eval_graph`) runs the plan.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from ..ir import Graph, ModelIR, Value

__all__ = ["LayerScan", "find_layer_scan", "MIN_SAVED_NODES"]

#: a region is scanned only when unrolling it would trace at least this many more nodes than the scan
#: (a 2-layer test model's 40-node blocks do; a model with a few repeated ops does not)
MIN_SAVED_NODES = 24


@dataclass
class LayerScan:
    """A region of ``count`` blocks of ``period`` nodes from ``graph.nodes[start]`` on.

    The body is block 0's nodes; the Values named below are block 0's (the
    lowering binds them to each block's arrays in turn).

    Attributes:
        nodes: the graph's nodes in the order the plan runs them
            (:func:`hoisted_order`: integer index arithmetic first).
        start, period, count: the region of ``nodes`` (``count >= 2`` blocks).
        carry: ``(v_in, v_out)`` pairs: block 0 reads ``v_in`` (made before
            the region: the scan's initial carry), block ``k + 1`` reads
            block ``k``'s ``v_out`` in its place.
        per_layer: ``[v_0, ..., v_{L-1}]`` groups: the Values block ``k``
            reads at one operand position, one per block (graph inputs,
            stackable constants, values made before the region).
        outputs: ``[v_0, ..., v_{L-1}]`` groups: Values of each block read
            after the region or returned by the graph.
        quant: ids of block-0 constant Values whose quantization scales the
            body reads per layer (their groups are in ``per_layer``).
        final: ``(v, c)`` pairs: the last block's Value ``v``, read after the
            region, is carry ``c``'s final value (not a per-layer output).
    """

    nodes: list
    start: int
    period: int
    count: int
    carry: list = field(default_factory=list)
    per_layer: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    quant: set = field(default_factory=set)
    final: list = field(default_factory=list)

    @property
    def stop(self) -> int:
        """The index of the first node after the region."""
        return self.start + self.period * self.count


def _digest(a) -> str:
    a = np.ascontiguousarray(a)
    return hashlib.blake2b(a.tobytes(), digest_size=12).hexdigest() + f"{a.dtype.str}{a.shape}"


def _frozen(x):
    """A hashable, exact stand-in for an attribute value."""
    if isinstance(x, np.ndarray):
        return ("nd", _digest(x))
    if isinstance(x, dict):
        return ("d",) + tuple((k, _frozen(v)) for k, v in sorted(x.items(), key=lambda kv: str(kv[0])))
    if isinstance(x, (list, tuple)):
        return ("l",) + tuple(_frozen(v) for v in x)
    if isinstance(x, (bytes, bytearray)):
        return ("b", hashlib.blake2b(bytes(x), digest_size=12).hexdigest())
    if isinstance(x, np.generic):
        return ("g", x.dtype.str, x.item())
    return x if isinstance(x, (int, float, str, bool, type(None))) else ("r", repr(x))


def _quant_key(v: Value, vary: bool):
    q = v.quant
    if q is None:
        return None
    scale = np.asarray(q.scale)
    return (scale.shape, int(q.quantized_dimension), int(q.block_size), _digest(np.asarray(q.zero_point)),
            None if vary else _digest(scale))


def _spec(v: Value):
    return (None if v.shape is None else tuple(v.shape), np.dtype(v.dtype).str if v.dtype is not None else None)


class _Coder:
    """Structural codes of nodes (step 1 of the module docstring), memoised per Value and region graph."""

    def __init__(self, model: ModelIR, registry, stackable: Callable[[Value], bool]):
        self.model, self.registry, self.stackable = model, registry, stackable
        self._const: dict = {}
        self._graph: dict = {}

    def const(self, v: Value) -> str:
        key = self._const.get(id(v))
        if key is None:
            key = self._const[id(v)] = _digest(np.asarray(v.data))
        return key

    def graph(self, index: int):
        """The structure of region graph ``index``, constants by value (its nodes run as they are)."""
        if index in self._graph:
            return self._graph[index]
        self._graph[index] = ("cycle", index)  # a region naming itself: compared by index
        g = self.model.graphs[index]
        where = {id(v): ("in", i) for i, v in enumerate(g.inputs)}
        parts = [tuple(_spec(v) for v in g.inputs)]
        for j, n in enumerate(g.nodes):
            ins = []
            for v in n.inputs:
                if v is None:
                    ins.append(None)
                elif id(v) in where:
                    ins.append(where[id(v)])
                elif v.is_constant:
                    ins.append(("c", self.const(v), _quant_key(v, False)))
                else:
                    ins.append(("?", _spec(v)))
            parts.append((self.node(n, exact=True), tuple(ins)))
            for o, v in enumerate(n.outputs):
                if v is not None:
                    where[id(v)] = (j, o)
        parts.append(tuple(where.get(id(v), ("?",)) for v in g.outputs))
        self._graph[index] = key = tuple(parts)
        return key

    def node(self, n, *, exact: bool = False):
        """The code of node ``n``: op, attributes, operand and result kinds; with
        ``exact`` every constant by value (region graphs)."""
        od = self.registry.get(n.op_set, n.op_name)
        static = set(od.static_inputs) if od is not None else set()
        vary = set(od.fact("layer_quant")) if od is not None and not exact else set()
        regions = {k: tuple(self.graph(i) for i in ix) for k, ix in n.regions.items()}
        attrs = tuple((k, regions[k] if k in regions else _frozen(a)) for k, a in sorted(n.attrs.items()))
        ins = []
        for i, v in enumerate(n.inputs):
            if v is None:
                ins.append(None)
            elif v.is_constant and (exact or i in static or not self.stackable(v)):
                ins.append(("c", self.const(v), _quant_key(v, False)))
            elif v.is_constant:
                ins.append(("w", _spec(v), v.storage_bits, _quant_key(v, i in vary)))
            else:
                ins.append(("v", _spec(v), _quant_key(v, False)))
        outs = tuple(None if v is None else (_spec(v), _quant_key(v, False)) for v in n.outputs)
        return (n.op_set, n.op_name, n.version, attrs, tuple(ins), outs)


def _runs(codes: np.ndarray):
    """Candidate regions ``(saved, start, period, length)``, best first: for each period ``P``
    the longest stretch of positions ``i`` with ``codes[i] == codes[i + P]``."""
    n = len(codes)
    out = []
    for p in range(1, n // 2 + 1):
        eq = codes[:-p] == codes[p:]
        if not eq.any():
            continue
        padded = np.concatenate([[False], eq, [False]])
        edges = np.flatnonzero(padded[1:] != padded[:-1])
        starts, stops = edges[0::2], edges[1::2]
        lengths = stops - starts
        k = int(np.argmax(lengths))
        r = int(lengths[k])
        count = (r + p) // p
        if count >= 2:
            out.append((p * (count - 1), int(starts[k]), p, r + p))
    out.sort(key=lambda t: (-t[0], t[2]))
    return out


def _integral(v: Value) -> bool:
    return v.dtype is not None and (np.issubdtype(np.dtype(v.dtype), np.integer) or np.dtype(v.dtype) == np.bool_)


#: results of at most this many elements count as index arithmetic (:func:`hoisted_order`), whatever their dtype
SMALL_ELEMENTS = 64


def _small(v: Value) -> bool:
    return v.static_shape and int(np.prod(v.shape, dtype=np.int64)) <= SMALL_ELEMENTS


def hoisted_order(graph: Graph) -> list:
    """``graph.nodes`` with the integer index arithmetic on the graph's integer inputs
    first, the other nodes after it, each part in file order (still a topological
    order). A node is hoisted when every operand is a constant, an integer graph
    input or a hoisted node's result, and every result is an integer or boolean
    tensor or has at most :data:`SMALL_ELEMENTS` values (index arithmetic done in
    float): a converter may place index values every block reads (the KV-cache
    write position made from ``input_pos``) inside the first block, which then has
    nodes the others lack."""
    early = {id(v) for v in graph.inputs if _integral(v)}
    first, rest = [], []
    for n in graph.nodes:
        if (all(v is None or v.is_constant or id(v) in early for v in n.inputs)
                and all(o is None or _integral(o) or _small(o) for o in n.outputs)):
            first.append(n)
            early.update(id(o) for o in n.outputs if o is not None)
        else:
            rest.append(n)
    return first + rest


def _plan(graph: Graph, nodes: list, registry, start: int, period: int, count: int,
          stackable: Callable[[Value], bool]) -> Optional[LayerScan]:
    """The data flow of blocks ``start + k * period`` of ``nodes`` (module docstring,
    step 3), or None when it is not the same in every block."""
    stop = start + period * count
    made = {}  # id(Value) -> (block, relative node, output)
    for k in range(count):
        for j in range(period):
            for o, v in enumerate(nodes[start + k * period + j].outputs):
                if v is not None:
                    made[id(v)] = (k, j, o)
    body = nodes[start:start + period]
    slot_kind: dict = {}  # (j, i) -> ("in", j', o) | ("carry", j', o) | ("shared", v) | ("layer", [v_k])
    carry_init: dict = {}  # (j', o) -> block 0's Value in its place
    for j in range(period):
        od = registry.get(body[j].op_set, body[j].op_name)
        static = set(od.static_inputs) if od is not None else set()
        for i in range(len(body[j].inputs)):
            vs = [nodes[start + k * period + j].inputs[i] for k in range(count)]
            if any(v is None for v in vs):
                if not all(v is None for v in vs):
                    return None
                continue
            src = [made.get(id(v)) for v in vs]
            if all(s is not None and s[0] == k for k, s in enumerate(src)):
                if len({s[1:] for s in src}) != 1:
                    return None
                slot_kind[(j, i)] = ("in",) + src[0][1:]
                continue
            if src[0] is None and all(s is not None and s[0] == k - 1 for k, s in enumerate(src) if k):
                pos = {s[1:] for s in src[1:]}
                if len(pos) != 1:
                    return None
                (pos,) = pos
                if carry_init.setdefault(pos, vs[0]) is not vs[0]:
                    return None  # one carried value, two initial values
                slot_kind[(j, i)] = ("carry",) + pos
                continue
            if any(s is not None for s in src):
                return None  # a value of another block than k or k - 1, or k - 1 for some blocks only
            if all(v is vs[0] for v in vs) or (
                    all(v.is_constant and not stackable(v) for v in vs)
                    and len({_digest(np.asarray(v.data)) for v in vs}) == 1):
                # one value, or constants of equal contents (a converter's per-layer copy of a shape):
                # the body reads block 0's
                slot_kind[(j, i)] = ("shared", vs[0])
                continue
            if i in static:
                return None  # a load-time operand that differs between blocks
            consts = [v.is_constant for v in vs]
            if any(consts) and not (all(consts) and all(stackable(v) for v in vs)):
                return None
            slot_kind[(j, i)] = ("layer", vs)
    # values of block k read after the region (or graph outputs), or by block k + 1 outside a carry slot
    readers: dict = {}
    for idx, n in enumerate(nodes):
        for i, v in enumerate(n.inputs):
            if v is not None and id(v) in made:
                readers.setdefault(id(v), []).append((idx, i))
    outputs_of_graph = {id(v) for v in graph.outputs if v is not None}
    out_blocks: dict = {}  # (j, o) -> the blocks whose value there is read after the region
    for vid, (k, j, o) in made.items():
        if vid in outputs_of_graph:
            out_blocks.setdefault((j, o), set()).add(k)
        for idx, i in readers.get(vid, ()):
            if idx >= stop:
                out_blocks.setdefault((j, o), set()).add(k)
                continue
            kr, jr = divmod(idx - start, period)
            kind = slot_kind.get((jr, i))
            if kr == k and kind is not None and kind[0] == "in":
                continue
            if kr == k + 1 and kind is not None and kind[0] == "carry" and kind[1:] == (j, o):
                continue
            return None
    def block_value(k, j, o):
        return nodes[start + k * period + j].outputs[o]

    plan = LayerScan(nodes, start, period, count)
    plan.carry = [(carry_init[pos], block_value(0, *pos)) for pos in sorted(carry_init)]
    # the body binds block 0's Values: each may stand for one thing only
    bound = {id(v_in): ("carry", pos) for pos, v_in in carry_init.items()}
    if len(bound) != len(carry_init):
        return None
    shared = set()
    quant_ok = set()
    for (j, i), kind in sorted(slot_kind.items(), key=lambda kv: kv[0]):
        if kind[0] == "shared":
            shared.add(id(kind[1]))
        elif kind[0] == "layer":
            group = kind[1]
            prev = bound.get(id(group[0]))
            if prev is None:
                bound[id(group[0])] = ("layer", tuple(map(id, group)))
                plan.per_layer.append(group)
            elif prev != ("layer", tuple(map(id, group))):
                return None
            od = registry.get(body[j].op_set, body[j].op_name)
            if od is not None and i in od.fact("layer_quant"):
                quant_ok.add(id(group[0]))
            elif group[0].quant is not None and len({_quant_key(v, False) for v in group}) != 1:
                return None  # per-layer scales where the op reads them as load-time constants
    if shared & set(bound):
        return None
    plan.quant = {vid for vid in quant_ok
                  if any(len({_quant_key(v, False) for v in g}) > 1 for g in plan.per_layer if id(g[0]) == vid)}
    # the last block's carried value (the hidden state the suffix reads) comes from the final carry
    carried_out = {pos: c for c, pos in enumerate(sorted(carry_init))}
    out_pos = []
    for pos, ks in sorted(out_blocks.items()):
        if ks == {count - 1} and pos in carried_out:
            plan.final.append((block_value(count - 1, *pos), carried_out[pos]))
        else:
            out_pos.append(pos)
    plan.outputs = [[block_value(k, j, o) for k in range(count)] for (j, o) in out_pos]
    return plan


def find_layer_scan(model: ModelIR, index: int, registry, stackable: Callable[[Value], bool], *,
                    min_saved: int = MIN_SAVED_NODES) -> Optional[LayerScan]:
    """The repeated blocks of ``model.graphs[index]`` to run as one scan, or None.

    Args:
        registry: the lowering registry (``static_inputs``, the ``layer_quant`` fact).
        stackable: whether a constant may differ between blocks (the lowering's
            params and weight buffers, which it stacks per block).
        min_saved: the fewest nodes the scan must save (:data:`MIN_SAVED_NODES`).

    Returns:
        the :class:`LayerScan` saving the most nodes whose data flow is the same in
        every block (module docstring), or None.
    """
    graph = model.graphs[index]
    if len(graph.nodes) < 2 * 2:
        return None
    nodes = hoisted_order(graph)
    coder = _Coder(model, registry, stackable)
    ids: dict = {}
    codes = np.array([ids.setdefault(coder.node(n), len(ids)) for n in nodes], np.int64)
    for saved, s0, p, span in _runs(codes)[:8]:
        if saved < min_saved:
            break
        for shift in range(p):
            count = (span - shift) // p
            if count < 2 or p * (count - 1) < min_saved:
                break
            plan = _plan(graph, nodes, registry, s0 + shift, p, count, stackable)
            if plan is not None:
                return plan
    return None
