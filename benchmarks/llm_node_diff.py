"""Where fbjax and LiteRT's builtin kernels part on a quantized LLM, node by node (issue 34 item 8).

    python benchmarks/llm_node_diff.py MODEL.tflite [SIGNATURE] [COMPOSITES]

Runs SIGNATURE (default ``decode``) of MODEL once in LiteRT's interpreter
with its builtin kernels and no delegates (``experimental_preserve_all_tensors``),
on seeded inputs (tokens, positions, a causal mask, KV caches drawn from
N(0, 0.25)). Then every node of the signature's graph is run by fbjax's
lowering on LiteRT's own input tensors, and its output compared with
LiteRT's: the largest |difference| per op (0: bit for bit). The same is
done inside the composites' decomposition subgraphs (on the tensors of
their last invocation). Finally the whole signature: fbjax's outputs
against LiteRT's, where the per-node differences have added up over the
layers. Needs ``ai-edge-litert``; no test depends on it.

Measured on benchmarks/make_llm_bundles.py's SmolLM2-135M-shaped int8 file:
README "Exactness at real size".
"""
import collections
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a clone
import fbjax  # noqa: E402
from ai_edge_litert import interpreter as litert  # noqa: E402
from fbjax._registry import call_op  # noqa: E402
from fbjax.lower.build import LowerContext, Run  # noqa: E402


def node_outputs(model, interp, node, graph: int, run) -> list:
    """(output value, fbjax's output, LiteRT's output) of ``node``, run by fbjax's lowering on LiteRT's
    own input tensors of ``graph``."""
    args = [None if v is None else np.asarray(v.data) if v.data is not None else interp.get_tensor(v.index, graph)
            for v in node.inputs]
    ctx = LowerContext(node, model.ir, model.program, run)
    got = call_op(model.program.registry.get(node.op_set, node.op_name), ctx, args, node.attrs)
    got = got if isinstance(got, (tuple, list)) else (got,)
    return [(o, np.asarray(g), interp.get_tensor(o.index, graph)) for o, g in zip(node.outputs, got) if o is not None]


def max_diff(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| (0 for an empty tensor), in float64 or int64."""
    if not want.size:
        return 0.0
    wide = np.float64 if want.dtype.kind == "f" else np.int64
    return float(np.max(np.abs(got.reshape(want.shape).astype(wide) - want.astype(wide))))


def seeded_inputs(sig) -> dict:
    """Tokens, positions 40.., a causal mask over the first 41 positions, KV caches from N(0, 0.25)."""
    rng = np.random.default_rng(0)
    ins = {}
    for s in sig.inputs:
        if s.name == "tokens":
            ins[s.name] = rng.integers(300, 30000, s.shape).astype(s.dtype)
        elif s.name == "input_pos":
            ins[s.name] = (np.arange(int(np.prod(s.shape))) + 40).reshape(s.shape).astype(s.dtype)
        elif s.name == "mask":
            m = np.full(s.shape, -np.inf, np.float32)
            m[..., :41] = 0
            ins[s.name] = m.astype(s.dtype)
        else:
            ins[s.name] = (rng.standard_normal(s.shape) * 0.5).astype(s.dtype)
    return ins


def main() -> None:
    path = sys.argv[1]
    key = sys.argv[2] if len(sys.argv) > 2 else "decode"
    model = fbjax.load(path, **({"composites": sys.argv[3]} if len(sys.argv) > 3 else {}))
    ins = seeded_inputs(model.signature(key))
    interp = litert.Interpreter(model_path=path, experimental_preserve_all_tensors=True,
                                experimental_op_resolver_type=litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    lit_out = interp.get_signature_runner(key)(**ins)
    gi = model.ir.signatures[key].graph_index
    run = Run(model.params)
    worst, first = collections.defaultdict(float), {}
    for node in model.ir.graphs[gi].nodes:
        k = f"{node.op_set}:{node.op_name}"
        for o, got, want in node_outputs(model, interp, node, gi, run):
            d = max_diff(got, want)
            worst[k] = max(worst[k], d)
            if d > 0 and k not in first:
                first[k] = (node.location, d, float(np.max(np.abs(want))) if want.size else 0.0)
    for k, v in sorted(worst.items(), key=lambda kv: -kv[1]):
        print(f"{k:40s} max|diff| {v:.3g}   first: {first.get(k)}")
    got = model.signature(key)(**ins)
    for k in lit_out:
        print("output", k, max_diff(np.asarray(got[k]), lit_out[k]))
    print("--- inside the decompositions (their last invocation's tensors)")
    for name in sorted({n.attrs.get("name") for n in model.ir.graphs[gi].nodes if n.op_name == "stablehlo.composite"}):
        d = next(n for n in model.ir.graphs[gi].nodes if n.attrs.get("name") == name).attrs["decomposition"]
        for node in model.ir.graphs[d].nodes:
            o, got, want = node_outputs(model, interp, node, d, run)[0]
            print(name, node.op_name, want.shape, max_diff(got, want))


if __name__ == "__main__":
    main()
