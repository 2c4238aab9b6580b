"""Building the IR: each stored node becomes one IR node of op set ``"gpu_cl"`` for its own op plus one per
linked (fused element-wise) op, read through the op table (:data:`.kernels.KERNELS`)."""

from __future__ import annotations

import os
from collections import Counter

import numpy as np

from ...errors import ModelFormatError, UnsupportedOperatorError
from ...ir import Graph, ModelIR, Node, Value
from .. import verify as _verify
from .generations import Generation, detect_generation, precision_storage, programs
from .kernels import KERNELS, OP_SET, Kernel, KernelCall, unsupported
from .nodes import GpuNode, parse_nodes
from .tensors import get, graph_io, tensor_values
from .weights import WeightRef, decode


def binary_links(node: GpuNode) -> list[bool]:
    """For each linked op (1-based position N), whether it reads a runtime second tensor: the node's
    arguments name one for it (``second_tensor_link<N>`` / ``src_data_1_link<N>``: int arguments of a tensor
    reference, or a tensor object holding no data). An object of that name holding data is a constant
    operand, not a tensor the node reads."""
    out = []
    for n in range(1, len(node.ops)):
        names = (f"second_tensor_link{n}", f"src_data_1_link{n}")
        objs = [node.objects[k] for k in names if k in node.objects]
        named = bool(objs) or any(k.startswith(tuple(f"{m}_" for m in names)) for k in node.ints)
        out.append(named and not any(o.flat.size for o in objs))
    return out


class _Builder:
    def __init__(self, gen: Generation, label: str):
        self.gen = gen
        self.label = label
        self.all_values: list[Value] = []
        self.nodes: list[Node] = []
        self.weights: list[WeightRef] = []

    def const(self, node: GpuNode, obj_name: str, layout: str, shape: tuple, pname: str, **kw) -> Value:
        where = f"{self.label}node {node.index} ({node.name})"
        obj = node.objects.get(obj_name)
        if obj is None:
            raise ModelFormatError(f"{where}: object {obj_name!r} is missing")
        data, idx = decode(obj, layout, shape, f"{where}: {obj_name}", **kw)
        v = Value(pname if "/" in pname else f"{node.ops[0][0]} {node.ops[0][1]}/{pname}", np.dtype(np.float32),
                  tuple(shape), data=data)
        self.all_values.append(v)
        self.weights.append(WeightRef(node.index, obj_name, layout, idx, v))
        return v

    def temp(self, like: Value, name: str) -> Value:
        v = Value(name, like.dtype, like.shape)
        self.all_values.append(v)
        return v


def _count(n: int, lo_hi: tuple) -> bool:
    lo, hi = lo_hi
    return lo <= n and (hi is None or n <= hi)


def _check_objects(node: GpuNode, where: str) -> None:
    """Every weight object belongs to the kernel's own op or to a linked op (``<name>_link<N>``)."""
    owned = set(KERNELS[node.ops[0][0]].objects)
    for n, (lop, _) in enumerate(node.ops[1:], start=1):
        owned.update(f"{o}_link{n}" for o in KERNELS[lop].link_objects)
    extra = sorted(set(node.objects) - owned)
    if extra:
        raise unsupported(where, node.ops[0][0], f"object(s) {', '.join(map(repr, extra))} fbjax does not read")


def _lower_node(b: _Builder, node: GpuNode, values: dict) -> None:
    """Append the IR nodes of one stored node (its own op, then each linked op) to ``b``.

    Raises:
        ModelFormatError: the node's tensors contradict its op table entries.
        UnsupportedOperatorError: a variant fbjax does not read.
    """
    where = f"{b.label}node {node.index} ({node.name})"
    op, _gid = node.ops[0]
    kernel: Kernel = KERNELS[op]
    ins = [get(values, i, where) for i in node.input_ids]
    outs = [get(values, i, where) for i in node.output_ids]
    if len(outs) != 1:
        raise ModelFormatError(f"{where}: has {len(outs)} outputs; GPU kernels write one tensor")
    binary = binary_links(node)
    for n, (lop, _lid) in enumerate(node.ops[1:], start=1):
        lk = KERNELS[lop]
        if not lk.linkable:
            raise ModelFormatError(f"{where}: {lop} is linked (fused after another kernel), which only element-wise "
                                   "ops are")
        n_link = 1 + binary[n - 1]
        if not _count(n_link, lk.link_inputs):
            if n_link < lk.link_inputs[0] and lk.few_inputs:
                raise unsupported(where, lop, f"{lk.few_inputs}, linked")
            raise ModelFormatError(f"{where}: linked op {n} ({lop}) reads {n_link} tensor(s); it takes "
                                   f"{lk.link_inputs[0]}" + ("" if lk.link_inputs[1] == lk.link_inputs[0]
                                                             else f" to {lk.link_inputs[1]}"))
    _check_objects(node, where)
    n_main = len(ins) - sum(binary)
    if not _count(n_main, kernel.inputs):
        if 1 <= n_main < kernel.inputs[0] and kernel.few_inputs:
            raise unsupported(where, op, kernel.few_inputs)
        lo, hi = kernel.inputs
        raise ModelFormatError(f"{where}: {len(ins)} inputs leave {n_main} for {op} after {sum(binary)} for its "
                               f"linked ops; {op} reads {lo}" + ("" if hi == lo else " or more" if hi is None
                                                                else f" to {hi}"))
    main_ins, link_ins = ins[:n_main], ins[n_main:]
    out = outs[0]
    chain_out = out if len(node.ops) == 1 else b.temp(out, f"{node.name}/{op}")

    def const(*args, **kw):
        return b.const(node, *args, **kw)

    attrs, extra = kernel.read(KernelCall(node, op, 0, main_ins, chain_out, where, const))
    attrs["gpu_node"] = node.name
    attrs["gpu_index"] = node.index
    loc = f"node {node.index} ({node.name})"
    b.nodes.append(Node(OP_SET, op, [*main_ins, *extra], [chain_out], attrs, location=loc))
    cur = chain_out
    k = 0
    for n, (lop, _lid) in enumerate(node.ops[1:], start=1):
        dst = out if n == len(node.ops) - 1 else b.temp(out, f"{node.name}/{lop}")
        lin = [cur]
        if binary[n - 1]:
            lin.append(link_ins[k])
            k += 1
        lattrs, lextra = KERNELS[lop].read(KernelCall(node, lop, n, lin, dst, where, const))
        lattrs["gpu_node"] = node.name
        lattrs["gpu_index"] = node.index
        b.nodes.append(Node(OP_SET, lop, [*lin, *lextra], [dst], lattrs, location=f"{loc}, linked op {n}"))
        cur = dst


def _check_order(nodes: list, inputs: list, label: str) -> None:
    """Every node input is a graph input, a constant or an earlier node's output."""
    ready = {id(v) for v in inputs}
    for n in nodes:
        for v in n.inputs:
            if v is not None and v.data is None and id(v) not in ready:
                raise ModelFormatError(f"{label}{n.location} reads {v.name}, which no earlier node writes "
                                       "(nodes out of order, or a tensor never computed)")
        ready.update(id(v) for v in n.outputs)


def _raise_unsupported(gnodes: list, label: str, variants: list) -> None:
    """One error listing every op type the table lacks and every variant fbjax does not read."""
    unknown = [(n, op) for n in gnodes for op, _ in n.ops if op not in KERNELS]
    if not unknown and not variants:
        return
    counts = Counter((OP_SET, op) for _, op in unknown)
    for e in variants:
        counts.update({tuple(k.split(":", 1)): c for k, c in e.ops.items()})
    parts = []
    if unknown:
        parts.append(f"{label}GPU node(s) of a kind fbjax does not read: "
                     + "; ".join(f"node {n.index} ({n.name!r}): {op}" for n, op in unknown[:10])
                     + ("" if len(unknown) <= 10 else f"; and {len(unknown) - 10} more"))
    parts += [e.detail for e in variants[:10]]
    if len(variants) > 10:
        parts.append(f"and {len(variants) - 10} more node(s) of variants fbjax does not read.")
    raise UnsupportedOperatorError(counts, detail=" ".join(parts))


def read(source) -> ModelIR:
    """Parse a serialized GPU delegate model into the IR (op set ``"gpu_cl"``).

    Args:
        source: path or bytes.

    Returns:
        a :class:`ModelIR` with ``format="gpu_cl"``; ``metadata`` holds
        ``generation``, ``precision``, ``storage_type``, the parsed ``nodes``
        (:class:`~.nodes.GpuNode`), ``weights`` (:class:`~.weights.WeightRef`, for
        write-back), ``driver_version`` (str, or None before TF 2.7) and
        ``binary_programs`` (``[(fingerprint, size in bytes)]`` of the
        compiled programs, TF 2.7 and LiteRT).

    Raises:
        ModelFormatError: no generation matches, or the file contradicts
            itself (a missing object, a weight object too small for the
            tensors' channel counts, an unknown tensor id, a node reading more
            or fewer tensors than its op takes).
        UnsupportedOperatorError: op types the table lacks, or kernel variants
            fbjax does not decode; every one in the file is listed.
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        buf, path = bytes(source), None
    else:
        path = os.fspath(source)
        with open(path, "rb") as f:
            buf = f.read()
    label = f"{path}: " if path else ""
    # its messages name the file already; parsing errors past the verifier: the readers' one policy
    with _verify.corrupt_file_errors(path or "<bytes>", "GPU delegate file", prefix_errors=False):
        gen = detect_generation(buf, path)
        root = gen.root(buf)
        graph = gen.graph(root)
        b = _Builder(gen, label)
        values = tensor_values(graph, label)
        b.all_values.extend(values.values())
        gnodes = parse_nodes(graph, gen, label)
        variants = []
        for node in gnodes:
            if any(op not in KERNELS for op, _ in node.ops):
                continue  # listed with every other gap below
            try:
                _lower_node(b, node, values)
            except UnsupportedOperatorError as e:
                variants.append(e)
        _raise_unsupported(gnodes, label, variants)
        inputs, outputs = graph_io(graph, gen, values, label)
        _check_order(b.nodes, inputs, label)
        g = Graph("main", inputs, outputs, b.nodes, b.all_values)
        prec, storage = precision_storage(gen, root, graph)
        meta = {"generation": gen.name, "precision": prec, "storage_type": storage,
                "nodes": gnodes, "weights": b.weights, "size": len(buf)}
        meta["driver_version"], meta["binary_programs"] = programs(gen, root)
    return ModelIR("gpu_cl", [g], description=f"TFLite GPU delegate (OpenCL) serialized model, generation {gen.name}",
                   source=path, buffer=buf, metadata=meta)
