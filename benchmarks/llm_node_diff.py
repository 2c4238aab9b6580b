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
path = sys.argv[1]; key = sys.argv[2] if len(sys.argv) > 2 else "decode"
model = fbjax.load(path, **({"composites": sys.argv[3]} if len(sys.argv) > 3 else {}))
sig = model.signature(key)
rng = np.random.default_rng(0)
ins = {}
for s in sig.inputs:
    if s.name == "tokens": ins[s.name] = rng.integers(300, 30000, s.shape).astype(s.dtype)
    elif s.name == "input_pos": ins[s.name] = (np.arange(int(np.prod(s.shape))) + 40).reshape(s.shape).astype(s.dtype)
    elif s.name == "mask":
        m = np.full(s.shape, -np.inf, np.float32); m[..., :41] = 0; ins[s.name] = m.astype(s.dtype)
    else: ins[s.name] = (rng.standard_normal(s.shape) * 0.5).astype(s.dtype)
interp = litert.Interpreter(model_path=path, experimental_preserve_all_tensors=True,
                            experimental_op_resolver_type=litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
lit_out = interp.get_signature_runner(key)(**ins)
gi = model.ir.signatures[key].graph_index
worst = collections.defaultdict(float); first = {}
run = Run(model.params)
for node in model.ir.graphs[gi].nodes:
    try:
        args = [None if v is None else np.asarray(v.data) if v.data is not None else interp.get_tensor(v.index, gi) for v in node.inputs]
        ctx = LowerContext(node, model.ir, model.program, run)
        od = model.program.registry.get(node.op_set, node.op_name)
        got = call_op(od, ctx, args, node.attrs)
        got = got if isinstance(got, (tuple, list)) else (got,)
        for o, g in zip(node.outputs, got):
            if o is None: continue
            want = interp.get_tensor(o.index, gi)
            g = np.asarray(g).reshape(want.shape)
            if want.dtype.kind == "f":
                d = float(np.max(np.abs(g.astype(np.float64) - want))) if want.size else 0.0
            else:
                d = float(np.max(np.abs(g.astype(np.int64) - want.astype(np.int64)))) if want.size else 0.0
            k = f"{node.op_set}:{node.op_name}"
            if d > worst[k]: worst[k] = d
            if d > 0 and k not in first: first[k] = (node.location, d, float(np.max(np.abs(want))) if want.size else 0)
    except Exception as e:
        print("ERR", node.op_name, type(e).__name__, str(e)[:200])
for k, v in sorted(worst.items(), key=lambda kv: -kv[1]):
    print(f"{k:40s} max|diff| {v:.3g}   first: {first.get(k)}")
got = model.signature(key)(**ins)
for k in lit_out:
    print("output", k, float(np.max(np.abs(np.asarray(got[k]) - lit_out[k]))))
print("--- inside the decompositions (their last invocation's tensors)")
for nm in ["odml.rms_norm", "odml.scaled_dot_product_attention"]:
    n0 = [n for n in model.ir.graphs[gi].nodes if n.attrs.get("name") == nm][0]
    d = n0.attrs.get("decomposition")
    for node in model.ir.graphs[d].nodes:
        try:
            args = [None if v is None else np.asarray(v.data) if v.data is not None else interp.get_tensor(v.index, d) for v in node.inputs]
            ctx = LowerContext(node, model.ir, model.program, run)
            od = model.program.registry.get(node.op_set, node.op_name)
            got = call_op(od, ctx, args, node.attrs)
            got = got if isinstance(got, (tuple, list)) else (got,)
            want = interp.get_tensor(node.outputs[0].index, d)
            g = np.asarray(got[0]).reshape(want.shape)
            print(nm, node.op_name, want.shape, float(np.max(np.abs(g.astype(np.float64) - want))) if want.dtype.kind == "f" else "int")
        except Exception as e:
            print("ERR", nm, node.op_name, type(e).__name__, str(e)[:150])
