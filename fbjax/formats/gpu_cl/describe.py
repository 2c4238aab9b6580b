"""What ``fbjax inspect`` shows of a ``.bin`` and how a user names one of its nodes."""

from __future__ import annotations

from ...ir import ModelIR
from .._text import format_bytes
from .nodes import GpuNode


def _variant(ir: ModelIR, node: GpuNode) -> str:
    for n in ir.main_graph.nodes:
        if n.attrs.get("gpu_index") == node.index and "variant" in n.attrs:
            return str(n.attrs["variant"])
    return ""


def _listed_name(node: GpuNode) -> str:
    """A node's name as ``fbjax inspect`` lists it: its ops joined by ``" -> "``."""
    return " -> ".join(f"{op} {i}" for op, i in node.ops)


def find_node(ir: ModelIR, key: str) -> GpuNode:
    """The node a user names: its position (``"3"``), its name as stored
    (``"conv 12 linked : relu 13"``) or as ``fbjax inspect`` lists it
    (``"conv 12 -> relu 13"``), or the name of its first op (``"conv 12"``).

    Raises:
        KeyError: no node matches; the message lists a few names.
    """
    nodes = ir.metadata["nodes"]
    key = key.strip()
    if key.isdigit() and int(key) < len(nodes):
        return nodes[int(key)]
    for n in nodes:
        if key in (n.name, n.name.split(" linked : ")[0], _listed_name(n)):
            return n
    raise KeyError(f"no node {key!r}; give a position 0..{len(nodes) - 1} or a name such as "
                   f"{', '.join(repr(n.name.split(' linked : ')[0]) for n in nodes[:3])}")


def describe(ir: ModelIR) -> str:
    """What ``fbjax inspect`` prints for a ``.bin``: generation, precision, storage, nodes, tensors, weights."""
    md = ir.metadata
    lines = [f"generation: {md['generation']}  precision: {md['precision']}  storage: {md['storage_type']}"]
    if md.get("driver_version") is not None or md.get("binary_programs"):
        progs = md.get("binary_programs", [])
        lines.append(f"driver version: {md.get('driver_version') or '(none)'}; compiled programs: {len(progs)} "
                     f"({format_bytes(sum(n for _, n in progs))}), kept as stored")
    weight_bytes = sum(o.flat.nbytes for n in md["nodes"] for o in n.objects.values())
    lines.append(f"weight objects: {format_bytes(weight_bytes)} stored; decoded weights: "
                 f"{sum(w.value.data.size for w in md['weights']):,} values")
    lines.append(f"nodes ({len(md['nodes'])}):")
    for n in md["nodes"]:
        ops = _listed_name(n)
        var = _variant(ir, n)
        lines.append(f"  [{n.index}] {ops}" + (f"  ({var})" if var else "")
                     + f"  in {n.input_ids} out {n.output_ids}  work group {n.work_group_size} grid {n.grid_size}"
                     + (f"  program {n.fingerprint:#018x}" if n.fingerprint is not None else ""))
        for name, o in sorted(n.objects.items()):
            lines.append(f"        {name}: {o.kind} {o.dtype.name} x {o.flat.size} ({format_bytes(o.flat.nbytes)}) "
                         + " ".join(f"{k}={v}" for k, v in o.info.items()))
        args = {k: v for k, v in n.ints.items() if not k.startswith(("src_tensor", "dst_tensor", "task_size"))}
        if args or n.floats:
            lines.append("        args: " + " ".join(f"{k}={v}" for k, v in {**args, **n.floats}.items()))
    lines.append("tensors:")
    for v in ir.main_graph.values:
        if v.data is None and v.index >= 0:
            lines.append(f"  id {v.index}: {v.name} {list(v.shape)}")
    return "\n".join(lines)
