"""Decoder-only LLM files from litert-torch's generative converter (issue 17).

Fixtures: ``tests/data/llm/<arch>_<quant>.tflite`` with LiteRT's outputs in
``<arch>_<quant>.npz``, made by ``tests/data/llm/generate.py`` (its
docstring describes both architectures and the saved keys). LiteRT's
signature runner (builtin kernels) is the oracle; the tests need neither
torch nor litert-torch, and LiteRT only for the save round trip.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fbjax
from conftest import require  # noqa: E402
from helpers import TOL, rel_err as _rel_err

HERE = os.path.join(os.path.dirname(__file__), "data", "llm")
ARCHS = ("llama", "gemma")
QUANTS = ("f32", "q8", "q4b32")
SIGNATURES = ("prefill_16", "decode")

def _path(name: str) -> str:
    return os.path.join(HERE, f"{name}.tflite")


_MODELS: dict = {}


def _model(name: str) -> fbjax.Model:
    if name not in _MODELS:
        _MODELS[name] = fbjax.load(_path(name))
    return _MODELS[name]


def _io(name: str, key: str):
    z = np.load(os.path.join(HERE, f"{name}.npz"))
    ins = {k.split("/")[-1]: z[k] for k in z.files if k.startswith(f"{key}/in/")}
    outs = {k.split("/")[-1]: z[k] for k in z.files if k.startswith(f"{key}/out/")}
    return ins, outs




@pytest.mark.parametrize("key", SIGNATURES)
@pytest.mark.parametrize("quant", QUANTS)
@pytest.mark.parametrize("arch", ARCHS)
def test_every_signature_matches_litert(arch, quant, key):
    name = f"{arch}_{quant}"
    model = _model(name)
    ins, want = _io(name, key)
    got = model.signature(key)(**ins)
    assert list(got) == list(want) or sorted(got) == sorted(want)
    for k in want:
        assert _rel_err(got[k], want[k]) <= TOL, k


@pytest.mark.parametrize("key", SIGNATURES)
@pytest.mark.parametrize("name", ["llama_q8", "gemma_q8", "llama_q4b32", "gemma_q4b32"])
def test_hybrid_kernels_bit_exact_with_litert(name, key):
    """Every hybrid node of both signatures (per-channel int8 and blockwise int4 FULLY_CONNECTED with
    LiteRT's on-the-fly input quantization, int8 / int4 EMBEDDING_LOOKUP), fed LiteRT's own input
    tensors (``experimental_preserve_all_tensors``), gives LiteRT's builtin kernels' output bit for bit,
    jitted, with its weights as constants and as traced arguments in the form ``Model.buffers`` holds
    them (int8, int4 packed), and so does its numpy twin in fbjax.reference."""
    litert = require("ai_edge_litert.interpreter")
    from fbjax._registry import call_op
    from fbjax.lower.build import LowerContext, Run
    from fbjax.reference import REFERENCE, ReferenceContext, ReferenceRun

    model = _model(name)
    ins, _ = _io(name, key)
    interp = litert.Interpreter(model_path=_path(name), experimental_preserve_all_tensors=True,
                                experimental_op_resolver_type=litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    interp.get_signature_runner(key)(**ins)
    gi = model.ir.signatures[key].graph_index
    seen = set()
    for node in model.ir.graphs[gi].nodes:
        if node.op_set != "tflite.hybrid":
            continue
        seen.add(node.op_name)
        args = [None if v is None else np.asarray(v.data) if v.data is not None else interp.get_tensor(v.index, gi)
                for v in node.inputs]
        dyn = [i for i, v in enumerate(node.inputs) if v is not None and v.data is None]
        ctx = LowerContext(node, model.ir, model.program, Run(model.params))
        od = model.program.registry.get(node.op_set, node.op_name)

        def kernel(*d, args=args, dyn=dyn, od=od, ctx=ctx, node=node):
            a = list(args)
            for i, x in zip(dyn, d):
                a[i] = x
            return call_op(od, ctx, a, node.attrs)

        want = interp.get_tensor(node.outputs[0].index, gi)
        got = np.asarray(jax.jit(kernel)(*[args[i] for i in dyn])).reshape(want.shape)
        np.testing.assert_array_equal(got, want, err_msg=node.location)
        # the weights as the programs take them: traced arguments, held as Model.buffers (int4 packed)
        bufs = {i: model.buffers[model.program.buffer_of[id(v)]] for i, v in enumerate(node.inputs)
                if v is not None and id(v) in model.program.buffer_of}
        assert bufs, f"{node.location}: its integer weights are not a weight buffer"
        traced = sorted(set(dyn) | set(bufs))
        feed = [bufs[i] if i in bufs else args[i] for i in traced]
        got = np.asarray(jax.jit(functools.partial(kernel, dyn=traced))(*feed))
        np.testing.assert_array_equal(got.reshape(want.shape), want, err_msg=f"{node.location} (weights as buffers)")
        ref = call_op(REFERENCE.get(node.op_set, node.op_name), ReferenceContext(node, model.ir, ReferenceRun()), args, node.attrs)
        np.testing.assert_array_equal(np.asarray(ref).reshape(want.shape), want, err_msg=node.location)
    assert seen == {"FULLY_CONNECTED", "EMBEDDING_LOOKUP"}


def test_llm_signatures_and_layouts():
    """The two architectures' signature specs: default vs transposed KV layout, mask input, shared weights."""
    llama, gemma = _model("llama_f32"), _model("gemma_f32")
    dec = {s.name: s for s in llama.signature("decode").inputs}
    assert dec["kv_cache_k_0"].shape == (1, 64, 2, 32) and "mask" not in dec  # BTNH
    dec = {s.name: s for s in gemma.signature("decode").inputs}
    assert dec["kv_cache_k_0"].shape == (1, 1, 64, 32) and dec["kv_cache_v_0"].shape == (1, 1, 32, 64)  # BNTH/BNHT
    assert dec["mask"].shape == (1, 1, 1, 64)
    # the weights both signatures read are one params entry each (no '#1' copies of subgraph 1's tensors)
    assert not [k for k in llama.params if "#" in k]
    of = llama.program.param_of
    per_graph = [{of[id(v)] for v in llama.ir.graphs[s.graph_index].values if id(v) in of}
                 for s in llama.signatures.values()]
    # prefill (no logits: the LM head and the last block's attention output are dead there) reads a subset
    # of decode's entries: the same params, not copies
    assert len(per_graph[0]) >= 8 and per_graph[0] < per_graph[1]


def _prompts(name: str):
    z = np.load(os.path.join(HERE, f"{name}.npz"))
    return [[int(t) for t in row if t >= 0] for row in z["generate/prompts"]], z["generate/tokens"]


@pytest.mark.parametrize("arch", ARCHS)
def test_generate_greedy_matches_litert_step_by_step(arch):
    """32 greedy tokens for 4 prompts of 1 to 17 tokens, in one batch and one by one, equal those of
    LiteRT's prefill and decode runners driven step by step (tests/data/llm/generate.py)."""
    model = _model(f"{arch}_f32")
    prompts, want = _prompts(f"{arch}_f32")
    got = fbjax.generate(model, prompts, 32)
    assert got.shape == (4, 32) and got.dtype == np.int32
    np.testing.assert_array_equal(got, want)
    for p, row in zip(prompts, want):
        np.testing.assert_array_equal(fbjax.generate(model, p, 32), row)


def test_generate_sampling():
    model = _model("llama_f32")
    prompts, greedy = _prompts("llama_f32")
    # top-1 sampling is greedy whatever the temperature and key
    got = fbjax.generate(model, prompts[:2], 32, temperature=0.7, top_k=1, key=jax.random.key(3))
    np.testing.assert_array_equal(got, greedy[:2])
    a = fbjax.generate(model, prompts[:2], 32, temperature=1.0, key=jax.random.key(5))
    b = fbjax.generate(model, prompts[:2], 32, temperature=1.0, key=jax.random.key(5))
    c = fbjax.generate(model, prompts[:2], 32, temperature=1.0, key=jax.random.key(6))
    np.testing.assert_array_equal(a, b)  # an explicit key: reproducible
    assert (a != c).any() and (a != greedy[:2]).any()  # 64 draws from 256 tokens at temperature 1
    assert a.min() >= 0 and a.max() < 256
    with pytest.raises(fbjax.InputError, match="prompt 0 is empty"):
        fbjax.generate(model, [[]], 4)
    with pytest.raises(fbjax.InputError, match="top_k needs temperature > 0"):
        fbjax.generate(model, [1, 2], 4, top_k=3)


@pytest.mark.parametrize("arch", ARCHS)
def test_generate_long_prompts_prefill_in_chunks(arch):
    """Prompts longer than prefill_16 + 1 tokens are prefilled 16 positions at
    a time. The oracle: the same prompts prefilled one token at a time
    through the decode signature (prefill="decode"), a path checked here
    against LiteRT's tokens on the fixture's short prompts. llama computes
    its causal mask from input_pos inside the graph, gemma takes it as an
    input; 18, 33 and 47 tokens take 2, 2 and 3 chunks (the last of 47
    starts at 32: 46 positions to fill), one batch with a short prompt.
    Tokens, not logits, are compared: at every step of these prompts the
    best logit leads the second by >= 1.9e-3 of its size (measured), 19x
    TOL, so float32 rounding in either path cannot change an argmax."""
    model = _model(f"{arch}_f32")
    short, want = _prompts(f"{arch}_f32")
    np.testing.assert_array_equal(fbjax.generate(model, short, 8, prefill="decode"), want[:, :8])
    rng = np.random.default_rng(1)
    prompts = [list(rng.integers(0, 256, k)) for k in (18, 33, 47)] + [short[0]]
    chunked = fbjax.generate(model, prompts, 16)
    np.testing.assert_array_equal(chunked, fbjax.generate(model, prompts, 16, prefill="decode"))
    np.testing.assert_array_equal(chunked[3], want[0, :16])  # the short prompt's tokens as LiteRT's
    with pytest.raises(fbjax.InputError, match="exceed the KV cache"):
        fbjax.generate(model, [list(range(70))], 4)


@pytest.mark.parametrize("arch", ARCHS)
def test_generate_refuses_to_run_past_the_kv_cache(arch):
    """Both fixtures hold 64 cache positions (llama: default layout, no mask
    input; gemma: transposed layout with a mask). A 2-token prompt decodes
    from position 1: 63 new tokens fill the cache, 64 would write past it
    (llama returned 100 tokens, the last ones 0, before the check read the
    cache shapes)."""
    model = _model(f"{arch}_f32")
    with pytest.raises(fbjax.InputError, match=r"exceed the KV cache \(64 positions\): ask for at most 63"):
        fbjax.generate(model, [1, 2], 64)
    assert fbjax.generate(model, [1, 2], 63).shape == (63,)


def _params_read(model, graph_index: int) -> set:
    """Names of the params that graph ``graph_index`` and the bodies it calls (composite decompositions,
    control flow) read."""
    of, todo, seen, names = model.program.param_of, [graph_index], set(), set()
    while todo:
        gi = todo.pop()
        if gi in seen:
            continue
        seen.add(gi)
        g = model.ir.graphs[gi]
        names |= {of[id(v)] for v in g.values if id(v) in of}
        for n in g.nodes:
            todo += [int(v) for k, v in n.attrs.items()
                     if (k == "decomposition" or k.endswith("subgraph_index")) and np.ndim(v) == 0]
    return names


def _next_token_loss(sig, params, tokens, ins):
    out = sig.apply(params, **dict(ins, tokens=tokens))
    logits = out["logits"][0, :-1]
    logp = jax.nn.log_softmax(logits, -1)
    return -jnp.mean(jnp.take_along_axis(logp, tokens[0, 1:, None], -1))


def test_grad_of_next_token_loss_reaches_every_weight():
    """jax.grad through the prefill signature (gemma: prefill returns logits) reaches every float
    weight, and its directional derivative agrees with a central difference."""
    model = _model("gemma_f32")
    pre = model.signature("prefill_16")
    ins, _ = _io("gemma_f32", "prefill_16")
    ins = {k: (np.zeros_like(v) if k.startswith("kv_cache_") else v) for k, v in ins.items()}
    tokens = ins.pop("tokens")
    loss = jax.jit(lambda p: _next_token_loss(pre, p, tokens, ins))
    g = jax.jit(jax.grad(lambda p: _next_token_loss(pre, p, tokens, ins)))(model.params)
    assert sorted(g) == sorted(model.params)
    # the weights: params of more than one element (the converter also writes float [1] constants, a 0
    # concatenated into index vectors: no gradient flows there) that prefill reads (decode's composite
    # bodies hold one constant of their own)
    read = {k for k in _params_read(model, model.signatures["prefill_16"].graph_index)
            if np.size(model.params[k]) > 1}
    assert len(read) >= 15
    dead = [k for k in read if not np.any(np.asarray(g[k])) or not np.all(np.isfinite(np.asarray(g[k])))]
    assert not dead, dead
    # directional derivative along the normalised gradient: (L(p + h d) - L(p - h d)) / 2h = |g|
    norm = float(np.sqrt(sum(float(np.sum(np.asarray(v, np.float64) ** 2)) for v in g.values())))
    h = 1e-2
    plus = {k: model.params[k] + h * g[k] / norm for k in g}
    minus = {k: model.params[k] - h * g[k] / norm for k in g}
    fd = (float(loss(plus)) - float(loss(minus))) / (2 * h)
    # curvature error O(h^2 |L'''|) plus float32 loss rounding (~1e-7 / 2h): a few percent at most
    assert abs(fd - norm) <= 0.05 * norm, (fd, norm)


def test_save_then_litert_runs_fbjax_outputs(tmp_path):
    """One gradient step on every weight, Model.save, LiteRT's signature runners on the saved file
    give fbjax's outputs for the new weights (both signatures)."""
    litert = require("ai_edge_litert.interpreter")
    model = fbjax.load(_path("gemma_f32"))
    pre = model.signature("prefill_16")
    ins, _ = _io("gemma_f32", "prefill_16")
    tokens = ins["tokens"]
    rest = {k: v for k, v in ins.items() if k != "tokens"}
    g = jax.jit(jax.grad(lambda p: _next_token_loss(pre, p, tokens, rest)))(model.params)
    new = {k: np.asarray(model.params[k] - 0.5 * g[k], np.float32) for k in g}
    path = tmp_path / "tuned.tflite"
    model.save(path, new)
    interp = litert.Interpreter(model_path=str(path),
                                experimental_op_resolver_type=litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    moved = 0.0
    for key in SIGNATURES:
        x, before = _io("gemma_f32", key)
        want = interp.get_signature_runner(key)(**x)
        got = model.signature(key).apply(new, **x)
        for k in want:
            assert _rel_err(got[k], want[k]) <= TOL, (key, k)
        moved = max(moved, _rel_err(want["logits"], before["logits"]) if "logits" in want else moved)
    assert moved > 1e-3  # the saved file really carries new weights


def test_cli_generate():
    prompts, want = _prompts("llama_f32")
    res = subprocess.run([sys.executable, "-m", "fbjax", "generate", _path("llama_f32"), "--prompt-tokens",
                          ",".join(map(str, prompts[0])), "--max-new-tokens", "8"],
                         capture_output=True, text=True, check=True)
    line = [ln for ln in res.stdout.splitlines() if ln.startswith("prompt ")][0]
    assert line.endswith("-> " + ",".join(map(str, want[0][:8])))
    assert "tokens/s" in res.stdout


def _litert_agrees(litert, path, model) -> tuple:
    """LiteRT's builtin kernels run every signature of the file at ``path``
    on llama_q8's recorded inputs as ``model`` does (within :data:`TOL`);
    returns (LiteRT's outputs, the recorded outputs), each keyed by signature."""
    interp = litert.Interpreter(model_path=str(path),
                                experimental_op_resolver_type=litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    want, before = {}, {}
    for key in SIGNATURES:
        x, before[key] = _io("llama_q8", key)
        want[key] = interp.get_signature_runner(key)(**x)
        got = model.signature(key)(**x)
        for k in want[key]:
            assert _rel_err(got[k], want[key][k]) <= TOL, (key, k)
    return want, before


def _stored_ranges(raw: bytes) -> list:
    """[start, end) of every buffer's bytes in a .tflite file: after the flatbuffer (offset/size) or inline."""
    from fbjax.formats._generated import tflite_generated as T

    m = T.Model.GetRootAs(raw, 0)
    out = []
    for i in range(m.BuffersLength()):
        b = m.Buffers(i)
        if b.Offset() > 1:
            out.append((b.Offset(), b.Offset() + b.Size()))
        elif b.DataLength():
            start = b._tab.Vector(b._tab.Offset(4))
            out.append((start, start + b.DataLength()))
    return out


_LM_HEAD = "Linear_lm_head;"  # decode's int8 lm_head weight: a buffer after the flatbuffer, read by decode only
_SHARED = ("arith.constant15", "arith.constant36")  # prefill's and decode's names of the int8 embedding table's buffer
_NORM = "arith.constant12"  # a float32 RMS-norm weight


@pytest.mark.parametrize("mode,requantize,weight", [
    ("exact", "file", _LM_HEAD), ("float", "file", _LM_HEAD),
    ("float", "per_channel", _LM_HEAD),  # new scales: the flatbuffer is packed again
])
def test_save_buffers_after_the_flatbuffer(tmp_path, mode, requantize, weight):
    """litert-torch keeps the quantized LLM's weights after the flatbuffer (Buffer.offset/size). Model.save
    writes them back in that layout: the new weights reload exactly, LiteRT's signature runners on the
    saved file give fbjax's outputs, and when no size changes the bytes outside the replaced buffers are
    the file's own."""
    litert = require("ai_edge_litert.interpreter")
    src = _path("llama_q8")
    raw = open(src, "rb").read()
    assert any(a >= len(raw) // 4 for a, _ in _stored_ranges(raw)), "the fixture no longer stores buffers by offset"
    model = fbjax.load(src, quantized=mode)
    assert model.save(None, model.params) == raw  # (c) nothing changed: the file's own bytes
    if mode == "exact":  # the int8 weight given as integers: stored as they are
        head = [v for v in model.ir.graphs[1].values if v.name.endswith(weight) and v.quant is not None][0]
        key, q = head.name, np.asarray(head.data)
        new_head = np.clip(-q.astype(np.int16), -127, 127).astype(np.int8)
    else:  # dequantized floats: re-quantized with the file's (or new per-channel) scales
        key = [k for k in model.params if k.endswith(weight)][0]
        new_head = -np.asarray(model.params[key]) * np.float32(1.5 if requantize == "per_channel" else 1.0)
    new_norm = np.asarray(model.params[_NORM]) * np.float32(0.75)
    path = tmp_path / "tuned.tflite"
    out = model.save(path, {key: new_head, _NORM: new_norm}, requantize=requantize)
    assert open(path, "rb").read() == out
    # (a) fbjax reads the new weights back exactly
    again = fbjax.load(path, quantized=mode)
    np.testing.assert_array_equal(np.asarray(again.params[_NORM]), new_norm)
    if mode == "exact":
        got = [v for v in again.ir.graphs[1].values if v.name == head.name][0].data
        np.testing.assert_array_equal(np.asarray(got), new_head)
    elif requantize == "file":  # -q * s is representable: the same scales hold it exactly
        np.testing.assert_array_equal(np.asarray(again.params[key]), new_head)
    else:  # new symmetric scales max|x| / 127: within half a step of the given values
        step = np.max(np.abs(new_head), axis=1, keepdims=True) / 127
        assert np.all(np.abs(np.asarray(again.params[key]) - new_head) <= 0.5 * step * (1 + 1e-6))
    if requantize == "file":  # (c) same sizes: only the two replaced buffers' bytes differ
        assert len(out) == len(raw)
        diff = np.flatnonzero(np.frombuffer(out, np.uint8) != np.frombuffer(raw, np.uint8))
        inside = np.zeros(len(raw), bool)
        for a, b in _stored_ranges(raw):
            inside[a:b] = True
        assert diff.size and inside[diff].all()
        assert len({r for r in _stored_ranges(raw) if np.any((diff >= r[0]) & (diff < r[1]))}) == 2
    else:  # the flatbuffer is packed again, the weights still follow it by offset
        assert max(a for a, _ in _stored_ranges(out)) > len(out) // 2
    # (b) LiteRT's builtin kernels run the saved file as fbjax (default, exact mode) runs it
    want, before = _litert_agrees(litert, path, fbjax.load(path))
    # the saved file carries the new weights: decode (which reads them) moves
    assert _rel_err(want["decode"]["logits"], before["decode"]["logits"]) > 1e-2


def test_save_shared_int8_weight_once_in_exact_mode(tmp_path):
    """litert-torch's prefill and decode subgraphs read one buffer for each weight they share, under
    their own tensor names. In exact mode (int8 weights given as integers) that buffer is one weight
    with one name, prefill's: saving it writes the buffer once, in place, and both signatures of the
    saved file read the new values (fbjax and LiteRT's builtin kernels); decode's name is refused
    with the name to use."""
    src = _path("llama_q8")
    raw = open(src, "rb").read()
    model = fbjax.load(src)
    pre_name, dec_name = _SHARED

    def table(m, gi, name):
        return [v for v in m.ir.graphs[gi].values if v.name == name and v.quant is not None][0]

    old = table(model, 0, pre_name)
    assert table(model, 1, dec_name).data is old.data  # one buffer: the reader gives both tensors one array
    assert old.data.shape == (256, 128) and old.data.dtype == np.int8  # the int8 embedding table
    new = np.clip(-old.data.astype(np.int16), -127, 127).astype(np.int8)
    with pytest.raises(fbjax.InputError, match=f"one weight, named '{pre_name}'"):
        model.save(None, {dec_name: new})
    path = tmp_path / "tuned.tflite"
    out = model.save(path, {pre_name: new})
    # written once, in place: same size, only the bytes of one stored buffer differ
    assert len(out) == len(raw)
    diff = np.flatnonzero(np.frombuffer(out, np.uint8) != np.frombuffer(raw, np.uint8))
    changed = {r for r in _stored_ranges(raw) if np.any((diff >= r[0]) & (diff < r[1]))}
    assert diff.size and len(changed) == 1 and next(iter(changed))[1] - next(iter(changed))[0] == new.nbytes
    again = fbjax.load(path)
    a, b = table(again, 0, pre_name), table(again, 1, dec_name)
    assert a.data is b.data  # still one buffer
    np.testing.assert_array_equal(np.asarray(a.data), new)
    litert = require("ai_edge_litert.interpreter")
    want, before = _litert_agrees(litert, path, again)
    for key in SIGNATURES:
        # every signature moved: it reads the new table (a negated embedding changes every output)
        assert max(_rel_err(want[key][k], before[key][k]) for k in want[key]) > 1e-2, key


_SHARDED = """
import sys, numpy as np, jax, fbjax
assert len(jax.devices()) == 4, jax.devices()
m = fbjax.load(sys.argv[1])
prompts = [[5, 17, 99], [200], [1, 2, 3, 4, 5, 6], [7, 7], [9, 8, 7, 6, 5]]   # 5 rows: padded to 8 over 4 devices
np.save(sys.argv[2], fbjax.generate(m, prompts, 12))
np.save(sys.argv[3], fbjax.generate(m, prompts, 12, temperature=1.0, key=jax.random.key(4)))
"""


def test_generate_sharded_over_devices_equals_one_device(tmp_path):
    """On 4 forced host devices the batch of prompts is split over a mesh
    (5 rows padded to 8): the greedy and the sampled tokens equal the
    one-device run's (same program per row, same per-row keys)."""
    script = tmp_path / "sharded.py"
    script.write_text(_SHARDED)
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.pathsep + env.get(
        "PYTHONPATH", "")
    r = subprocess.run([sys.executable, str(script), _path("llama_f32"), str(tmp_path / "g.npy"),
                        str(tmp_path / "s.npy")], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    model = _model("llama_f32")
    prompts = [[5, 17, 99], [200], [1, 2, 3, 4, 5, 6], [7, 7], [9, 8, 7, 6, 5]]
    np.testing.assert_array_equal(np.load(tmp_path / "g.npy"), fbjax.generate(model, prompts, 12))
    np.testing.assert_array_equal(np.load(tmp_path / "s.npy"),
                                  fbjax.generate(model, prompts, 12, temperature=1.0, key=jax.random.key(4)))
