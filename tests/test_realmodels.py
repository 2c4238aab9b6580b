"""Real trained models from PyPI packages, and small models of the same
structure (issue 20).

* microWakeWord (``pymicro-wakeword`` 2.5.0, Apache-2.0; the four int8
  ``.tflite`` files are committed in ``tests/data/realmodels`` with a NOTICE):
  streaming models whose state lives in int8 resource variables
  (VAR_HANDLE, READ_VARIABLE/ASSIGN_VARIABLE, CALL_ONCE). Default
  ``quantized="exact"`` mode against LiteRT's builtin kernels
  (``BUILTIN_WITHOUT_DEFAULT_DELEGATES``) over a 100-frame stream: every
  output and, after every frame, every state variable bit for bit; and
  ``fbjax inspect``'s op histogram equals the loaded model's.
* silero-vad (``silero-vad`` 6.2.3, MIT): ONNX models with LSTMs inside If
  branches (rten-convert writes the omitted ``sequence_lens`` as a capture
  named ``''``) and If branches that Pad by a main-graph initializer. The
  four package variants run through rten-convert + fbjax against
  onnxruntime over 3 calls with the recurrent state fed back, when the
  package is installed (``pip install --no-deps silero-vad==6.2.3``; 1-3 MB
  files, not committed); a small ONNX model of the same structure, built
  here, always runs.
* Files whose declared output shapes are wrong (PaddlePaddle exports declare
  scalar outputs), and reductions over empty sets.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import warnings
from collections import Counter
from pathlib import Path

import jax
import numpy as np
import pytest

import fbjax
import fbjax.reference
from conftest import require  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

DATA = Path(__file__).resolve().parent / "data" / "realmodels"
WAKEWORD = ["alexa", "hey_jarvis", "hey_mycroft", "okay_nabu"]


# --- 1. microWakeWord: int8 resource variables in exact mode ----------------------------------------------

def _stream(n_frames, shape, seed):
    """Feature frames as the microfrontend gives them: int8 codes of the
    models' input scale (0.102, zero point -128: 0..26 real): a fixed
    spectrum plus slow bursts and noise. The detectors stay mostly near 0 on
    such input (output codes 0..6), so the tests compare the carried state
    (every int8 streaming buffer) as well as the outputs."""
    rng = np.random.default_rng(seed)
    base = rng.integers(-128, -40, size=shape[-1])
    frames = []
    for t in range(n_frames):
        burst = 60 * np.sin(np.pi * t / 25) ** 2
        x = base + burst + rng.normal(0, 12, size=shape)
        frames.append(np.clip(np.rint(x), -128, 127).astype(np.int8))
    return frames


@pytest.mark.parametrize("name", WAKEWORD)
def test_wakeword_stream_bit_exact(name):
    """100 frames, one fbjax.Model and one LiteRT interpreter (builtin
    kernels) each keeping its own state: outputs equal frame by frame, and
    after each frame fbjax's ``Model.state`` equals the values LiteRT's
    READ_VARIABLE tensors hold on the next invoke (the state it carried)."""
    require("ai_edge_litert")
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    path = DATA / f"{name}.tflite"
    it = Interpreter(model_path=str(path), experimental_preserve_all_tensors=True,
                     experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    it.allocate_tensors()
    din, dout = it.get_input_details()[0], it.get_output_details()[0]
    model = fbjax.load(path)  # quantized="exact", the default
    ir = model.ir
    read_of = {}  # LiteRT tensor name of each READ_VARIABLE output -> variable name
    handle_name = {id(n.outputs[0]): n.attrs["shared_name"].decode() for n in ir.main_graph.nodes
                   if n.op_name == "VAR_HANDLE"}
    for n in ir.main_graph.nodes:
        if n.op_name == "READ_VARIABLE":
            assert n.op_set == "tflite" and np.dtype(n.outputs[0].dtype) == np.int8
            read_of[n.outputs[0].name] = handle_name[id(n.inputs[0])]
    assert len(read_of) >= 6 and set(read_of.values()) == set(model.state)
    tensor_index = {d["name"]: d["index"] for d in it.get_tensor_details()}
    assert all(np.asarray(v).dtype == np.int8 for v in model.state.values())

    frames = _stream(100, tuple(din["shape"]), seed=len(name))
    outs_lr, outs_fb = [], []
    prev_state = {k: np.asarray(v) for k, v in model.state.items()}
    for t, x in enumerate(frames):
        it.set_tensor(din["index"], x)
        it.invoke()
        for tname, var in read_of.items():  # what LiteRT read this frame = what fbjax carried in
            np.testing.assert_array_equal(prev_state[var], it.get_tensor(tensor_index[tname]),
                                          err_msg=f"{name}: state {var} before frame {t}")
        outs_lr.append(np.array(it.get_tensor(dout["index"])))
        outs_fb.append(np.asarray(model(x)))
        prev_state = {k: np.asarray(v) for k, v in model.state.items()}
    lr, fb = np.stack(outs_lr), np.stack(outs_fb)
    assert fb.dtype == lr.dtype == np.uint8
    np.testing.assert_array_equal(fb, lr, err_msg=f"{name}: outputs over 100 frames")
    # the stream exercises the state: the state changes, and it matters
    assert any(np.any(prev_state[k] != np.asarray(v)) for k, v in fbjax.load(path).state.items())


def test_wakeword_state_matters_and_apply_replays():
    """The pure ``Model.apply(params, x, state=...)`` replays the stream from
    the initial state (same outputs as the stateful calls), and a fresh
    state gives different outputs than a carried one on the same frame."""
    path = DATA / "hey_mycroft.tflite"
    model = fbjax.load(path)
    init = dict(model.state)
    frames = _stream(30, (1, 3, 40), seed=3)
    called = [np.asarray(model(x)) for x in frames]
    step = jax.jit(lambda st, x: model.apply(model.params, x, state=st))
    state = init
    replay = []
    for x in frames:
        y, state = step(state, x)
        replay.append(np.asarray(y))
    np.testing.assert_array_equal(np.stack(replay), np.stack(called))
    for k in state:
        np.testing.assert_array_equal(np.asarray(state[k]), np.asarray(model.state[k]), err_msg=k)
    fresh = [np.asarray(step(init, x)[0]) for x in frames[-5:]]
    assert any(not np.array_equal(a, b) for a, b in zip(fresh, called[-5:]))


@pytest.mark.parametrize("name", WAKEWORD)
def test_wakeword_inspect_agrees_with_load(name, capsys):
    """``fbjax inspect``'s operator histogram equals the op names of the
    loaded model (every subgraph, the CALL_ONCE initialiser included) and
    says nothing is unsupported."""
    from fbjax.cli import main

    path = DATA / f"{name}.tflite"
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    block = out.split("operators (", 1)[1].split("unsupported:", 1)
    hist = Counter({m.group(2): int(m.group(1)) for m in re.finditer(r"^\s+(\d+)\s+(\S+)\s*$", block[0], re.M)})
    loaded = Counter(n.op_name for n in fbjax.load(path).ir.iter_nodes())
    assert hist == loaded
    assert {"READ_VARIABLE", "ASSIGN_VARIABLE", "VAR_HANDLE", "CALL_ONCE"} <= set(hist)
    assert block[1].strip().startswith("none")


# --- 2/3. silero-vad through rten-convert ----------------------------------------------------------------

SILERO_VARIANTS = ["silero_vad", "silero_vad_16k_op15", "silero_vad_half", "silero_vad_op18_ifless"]


def _silero_dir():
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        return None
    d = Path(list(spec.submodule_search_locations)[0]) / "data"
    return d if d.is_dir() else None


def _ort_vs_fbjax_chained(onnx_model, feeds_fn, n_calls, state_names, rtol_abs):
    """Run ``onnx_model`` in onnxruntime and (rten-convert ->) fbjax for
    ``n_calls`` calls, each feeding back its own recurrent outputs
    (``state_names``: input name -> output name); returns the max abs errors
    of every output per call."""
    ort = require("onnxruntime")
    from rten_convert_tools import convert

    sess = ort.InferenceSession(onnx_model.SerializeToString(), providers=["CPUExecutionProvider"])
    model = fbjax.load(convert(onnx_model))
    in_names = [s.name for s in model.inputs]
    out_names = [o.name for o in sess.get_outputs()]
    st_ort, st_fb = {}, {}
    errs = []
    for k in range(n_calls):
        feeds = feeds_fn(k)
        o_ort = dict(zip(out_names, sess.run(None, {**feeds, **st_ort})))
        args = {**feeds, **st_fb}
        o_fb = model(*[np.asarray(args[n]).astype(np.int32) if np.asarray(args[n]).dtype == np.int64
                       else args[n] for n in in_names])
        o_fb = dict(zip([s.name for s in model.outputs], o_fb if isinstance(o_fb, tuple) else (o_fb,)))
        err = {n: float(np.max(np.abs(np.asarray(o_fb[n], np.float64) - o_ort[n]))) for n in out_names}
        errs.append(err)
        assert all(e <= rtol_abs for e in err.values()), f"call {k + 1}: {err}"
        st_ort = {i: o_ort[o] for i, o in state_names.items()}
        st_fb = {i: np.asarray(o_fb[o]) for i, o in state_names.items()}
    return errs


@pytest.mark.parametrize("variant", SILERO_VARIANTS)
def test_silero_vad_package_models(variant):
    """The silero-vad package's ONNX files through rten-convert + fbjax vs
    onnxruntime: 3 calls of 512 samples at 16 kHz, the recurrent state fed
    back; outputs and state within 1e-4 absolute (the issue's bound: float32
    STFT/conv/LSTM chains of a few thousand terms, whose state reaches
    magnitudes of a few units; observed 1.7e-6 to 6.3e-5)."""
    d = _silero_dir()
    if d is None:
        pytest.skip("silero-vad is not installed: `pip install --no-deps silero-vad==6.2.3` (MIT; its wheel "
                    "carries the ONNX files, 1-3 MB each, not committed here)")
    onnx = require("onnx")
    m = onnx.load(str(d / f"{variant}.onnx"))
    names = {i.name for i in m.graph.input}
    rng = np.random.default_rng(0)
    t = np.arange(512) / 16000.0

    def feeds(k):
        x = 0.3 * np.sin(2 * np.pi * 220 * (t + k * 512 / 16000)) + 0.05 * rng.standard_normal(512)
        f = {"input": x.astype(np.float32)[None]}
        if "sr" in names:
            f["sr"] = np.array(16000, np.int64)
        if k == 0:
            f["state"] = np.zeros((2, 1, 128), np.float32)
        return f

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the If whose 8 kHz branch cannot run on 512 samples warns)
        _ort_vs_fbjax_chained(m, feeds, 3, {"state": "stateN"}, 1e-4)


def _silero_like(pads_from_input=False):
    """An ONNX model shaped like silero-vad's decoder: ``If(sr == 16000)``
    whose two branches Pad the input by a main-graph initializer (captured
    constant, as in ``silero_vad_op18_ifless.onnx``) and run an LSTM with
    ``sequence_lens`` omitted (``''``, which rten-convert writes as a
    capture named ``''``), returning the output and the new (h, c).
    ``pads_from_input``: the pads come from the graph input ``pads`` instead
    (not known at load time in either branch)."""
    from onnx import TensorProto as TP, helper as H, numpy_helper as nh

    rng = np.random.default_rng(1)
    T, I, P, Hd = 3, 6, 2, 5
    inits = [nh.from_array((0.4 * rng.standard_normal(s)).astype(np.float32), n) for n, s in
             [("W", (1, 4 * Hd, I + P)), ("R", (1, 4 * Hd, Hd)), ("B", (1, 8 * Hd))]]
    inits += [nh.from_array(np.array([0, 0, 0, 0, 0, P], np.int64), "pads_back"),
              nh.from_array(np.array([0, 0, P, 0, 0, 0], np.int64), "pads_front"),
              nh.from_array(np.array(16000, np.int64), "sr16k")]

    def branch(tag, pads, scale):
        nodes = [H.make_node("Pad", ["x", pads], [f"{tag}_xp"], name=f"{tag}_pad"),
                 H.make_node("LSTM", [f"{tag}_xp", "W", "R", "B", "", "h", "c"],
                             [f"{tag}_y", f"{tag}_hN", f"{tag}_cN"], hidden_size=Hd, name=f"{tag}_lstm"),
                 H.make_node("Squeeze", [f"{tag}_y", f"{tag}_ax"], [f"{tag}_ys"]),
                 H.make_node("Mul", [f"{tag}_ys", f"{tag}_k"], [f"{tag}_out"])]
        consts = [H.make_node("Constant", [], [f"{tag}_ax"], value=nh.from_array(np.array([1], np.int64))),
                  H.make_node("Constant", [], [f"{tag}_k"], value=nh.from_array(np.array(scale, np.float32)))]
        outs = [H.make_tensor_value_info(f"{tag}_{n}", TP.FLOAT, None) for n in ("out", "hN", "cN")]
        return H.make_graph(consts + nodes, tag, [], outs)

    pa, pb = ("pads", "pads") if pads_from_input else ("pads_back", "pads_front")
    g = H.make_graph(
        [H.make_node("Equal", ["sr", "sr16k"], ["is16k"]),
         H.make_node("If", ["is16k"], ["out", "hN", "cN"], then_branch=branch("then", pa, 1.0),
                     else_branch=branch("else", pb, 0.5))],
        "silero_like",
        [H.make_tensor_value_info("x", TP.FLOAT, [T, 1, I]), H.make_tensor_value_info("sr", TP.INT64, []),
         H.make_tensor_value_info("h", TP.FLOAT, [1, 1, Hd]), H.make_tensor_value_info("c", TP.FLOAT, [1, 1, Hd])]
        + ([H.make_tensor_value_info("pads", TP.INT64, [6])] if pads_from_input else []),
        [H.make_tensor_value_info(n, TP.FLOAT, None) for n in ("out", "hN", "cN")],
        inits)
    return H.make_model(g, opset_imports=[H.make_opsetid("", 17)], ir_version=8)


def test_silero_like_if_lstm_captures():
    """The committed-structure model: the rten file really has a capture
    named '' (what broke loading), fbjax loads it, and 3 chained calls per
    branch (sr 16000 and 8000) match onnxruntime within 1e-5 (an 8-term
    LSTM, 3 steps, float32: errors ~1e-7)."""
    require("onnx")
    from rten_convert_tools import convert

    from fbjax.formats._generated import rten_generated as R

    m = _silero_like()
    data = convert(m)
    root = R.ModelT.InitFromObj(R.Model.GetRootAs(data, int.from_bytes(data[8:16], "little")))
    seen = []

    def walk(g):
        for node in g.nodes or []:
            attrs = getattr(node.data, "attrs", None)
            for key in ("thenBranch", "elseBranch"):
                sub = getattr(attrs, key, None)
                if sub is not None:
                    seen.extend((sub.nodes[i].name or b"").decode() for i in (sub.captures if sub.captures is not None else []))
                    walk(sub)

    walk(root.graph)
    assert "" in seen, f"rten-convert no longer writes a '' capture: {seen}"
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal((3, 1, 6)).astype(np.float32) for _ in range(3)]
    for sr in (16000, 8000):
        def feeds(k, sr=sr):
            f = {"x": xs[k], "sr": np.array(sr, np.int64)}
            if k == 0:
                f.update(h=np.zeros((1, 1, 5), np.float32), c=np.zeros((1, 1, 5), np.float32))
            return f

        _ort_vs_fbjax_chained(m, feeds, 3, {"h": "hN", "c": "cN"}, 1e-5)


def test_if_branches_static_input_error_lists_both():
    """Pads that depend on a graph input are not known at load time in
    either branch: the error names both Pad nodes (was: one), and it comes
    at load (the static-input check), not at the first call."""
    require("onnx")
    from rten_convert_tools import convert

    with pytest.raises(fbjax.UnsupportedOperatorError) as e:
        fbjax.load(convert(_silero_like(pads_from_input=True)))
    msg = str(e.value)
    assert "then_pad" in msg and "else_pad" in msg, msg
    assert e.value.ops == {"onnx:Pad": 2}


# --- 4. declared output shapes lose to inferred ones --------------------------------------------------------

def _paddle_like():
    """Paddle2ONNX-style: the graph computes (1, 2) but declares its output
    ``fetch_name_0`` as a scalar float32()."""
    from onnx import TensorProto as TP, helper as H, numpy_helper as nh

    w = np.random.default_rng(0).standard_normal((4, 2)).astype(np.float32)
    g = H.make_graph([H.make_node("MatMul", ["x", "w"], ["y"]),
                      H.make_node("Softmax", ["y"], ["fetch_name_0"], axis=-1)], "paddle",
                     [H.make_tensor_value_info("x", TP.FLOAT, [1, 4])],
                     [H.make_tensor_value_info("fetch_name_0", TP.FLOAT, [])], [nh.from_array(w, "w")])
    return H.make_model(g, opset_imports=[H.make_opsetid("", 13)], ir_version=8), w


def test_declared_output_shape_loses(tmp_path, capsys):
    """The JAX path, the numpy reference, Model.outputs and ``fbjax inspect``
    all give (1, 2), each warning once, naming the output; values equal
    numpy's softmax(x @ w)."""
    require("onnx")
    from rten_convert_tools import convert

    m, w = _paddle_like()
    path = tmp_path / "paddle_like.rten"
    path.write_bytes(convert(m, infer_shapes=False))
    x = np.random.default_rng(1).standard_normal((1, 4)).astype(np.float32)
    z = x.astype(np.float64) @ w
    want = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    model = fbjax.load(path)
    with pytest.warns(UserWarning, match="fetch_name_0") as rec:
        specs = model.outputs
        assert model.outputs == specs  # computed once
    assert len([r for r in rec if "fetch_name_0" in str(r.message)]) == 1
    assert specs[0].shape == (1, 2)
    np.testing.assert_allclose(np.asarray(model(x)), want, atol=1e-6)  # float32 softmax of 2 terms
    with pytest.warns(UserWarning, match="fetch_name_0"):
        ref = fbjax.reference.run(path, x)[0]
    np.testing.assert_allclose(ref, want, atol=1e-6)
    from fbjax.cli import main

    with pytest.warns(UserWarning, match="fetch_name_0"):
        assert main(["inspect", str(path)]) == 0
    assert "fetch_name_0: float32[1x2]" in capsys.readouterr().out


def test_correct_declared_shapes_do_not_warn():
    """A file whose declarations are right: Model.outputs traces silently."""
    model = fbjax.load(DATA / "hey_jarvis.tflite")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert model.outputs[0].shape == (1, 1)


# --- 5. reductions over empty sets -----------------------------------------------------------------------

def _reduce_model(op, dtype):
    from fbjax.formats.tflite_builder import TFLiteBuilder

    b = TFLiteBuilder()
    x = b.add_input((1, 1), dtype=dtype, shape_signature=(1, -1))
    ax = b.add_constant(np.array([1], np.int32))
    arg = op.startswith("ARG")
    y = b.add_tensor((1,), dtype=np.int32 if arg else dtype)
    b.add_op(op, [x, ax], [y], options=dict(output_type="INT32") if arg else dict(keep_dims=False))
    b.add_output(y)
    return b.build()


def _litert_empty(mb, dtype):
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    it = Interpreter(model_content=mb,
                     experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    it.resize_tensor_input(it.get_input_details()[0]["index"], [1, 0])
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], np.zeros((1, 0), dtype))
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"])


@pytest.mark.parametrize("op,dtype", [("REDUCE_MAX", np.float32), ("REDUCE_MIN", np.float32),
                                      ("REDUCE_MAX", np.int32), ("REDUCE_MIN", np.int32), ("SUM", np.float32),
                                      ("REDUCE_PROD", np.float32), ("REDUCE_ANY", np.bool_),
                                      ("REDUCE_ALL", np.bool_)])
def test_tflite_empty_reduction_identity(op, dtype):
    """Reducing an empty axis (a dynamic dim called at size 0): fbjax and the
    reference give LiteRT's builtin kernel's value (the kernel's initial
    value: the type's lowest/largest finite value for max/min, 0, 1, False,
    True)."""
    require("ai_edge_litert")
    mb = _reduce_model(op, dtype)
    want = _litert_empty(mb, dtype)
    x = np.zeros((1, 0), dtype)
    np.testing.assert_array_equal(np.asarray(fbjax.load(mb)(x)), want)
    np.testing.assert_array_equal(fbjax.reference.run(mb, x)[0], want)


@pytest.mark.parametrize("op", ["ARG_MAX", "ARG_MIN"])
def test_tflite_empty_arg_reduction_input_error(op):
    """LiteRT refuses ArgMax/ArgMin over an empty axis; fbjax raises
    InputError naming the op and the input shape (was a raw ValueError),
    in the JAX path and the reference."""
    require("ai_edge_litert")
    mb = _reduce_model(op, np.float32)
    with pytest.raises(RuntimeError, match="empty axis"):
        _litert_empty(mb, np.float32)
    x = np.zeros((1, 0), np.float32)
    for run in (fbjax.load(mb), lambda x: fbjax.reference.run(mb, x)):
        with pytest.raises(fbjax.InputError, match=rf"{op}.*\(1, 0\)"):
            run(x)


@pytest.mark.parametrize("op", ["ArgMax", "ReduceMax", "ReduceMin", "ReduceSum", "ReduceProd"])
def test_onnx_empty_reductions(op):
    """ONNX reductions of an empty axis follow the spec as onnxruntime runs
    it: ReduceMax -inf, ReduceMin +inf, ReduceSum 0, ReduceProd 1 (fbjax
    and the reference); ArgMax has no answer: onnxruntime fails and fbjax
    raises InputError naming the op and shape."""
    onnx = require("onnx")
    ort = require("onnxruntime")
    from onnx import TensorProto as TP, helper as H
    from rten_convert_tools import convert

    attrs = dict(axis=1, keepdims=0) if op == "ArgMax" else dict(keepdims=0)
    ins = ["x"] if op == "ArgMax" else ["x", "axes"]
    inits = [] if op == "ArgMax" else [onnx.numpy_helper.from_array(np.array([1], np.int64), "axes")]
    g = H.make_graph([H.make_node(op, ins, ["y"], **attrs)], "r",
                     [H.make_tensor_value_info("x", TP.FLOAT, [2, "n"])],
                     [H.make_tensor_value_info("y", TP.INT64 if op == "ArgMax" else TP.FLOAT, [2])], inits)
    m = H.make_model(g, opset_imports=[H.make_opsetid("", 18)], ir_version=8)
    data = convert(m)
    x = np.zeros((2, 0), np.float32)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    if op == "ArgMax":
        with pytest.raises(Exception):
            sess.run(None, {"x": x})
        for run in (fbjax.load(data), lambda x: fbjax.reference.run(data, x)):
            with pytest.raises(fbjax.InputError, match=r"ArgMax.*\(2, 0\)"):
                run(x)
        return
    want = sess.run(None, {"x": x})[0]
    np.testing.assert_array_equal(np.asarray(fbjax.load(data)(x)), want)
    np.testing.assert_array_equal(fbjax.reference.run(data, x)[0], want)


def test_streaming_example_runs(monkeypatch, capsys):
    """examples/streaming_wakeword.py runs as written (README): exit 0 means
    its lax.scan over the pure function equals the stateful calls."""
    import runpy

    ex = Path(__file__).resolve().parents[1] / "examples" / "streaming_wakeword.py"
    monkeypatch.setattr(sys, "argv", [str(ex), "--model", "hey_jarvis"])
    with pytest.raises(SystemExit) as e:
        runpy.run_path(str(ex), run_name="__main__")
    assert e.value.code == 0
    assert "lax.scan over the stream == stateful calls: True" in capsys.readouterr().out


def test_if_branch_impossible_at_input_shape():
    """silero-vad's pattern: ``If(sr == 16000)`` whose else branch only fits
    256 samples (a Reshape to (1, 2, 128)); given 512 samples, the then
    branch matches onnxruntime (sr 16000), and sr 8000 -- where onnxruntime
    fails -- gives NaN rather than a silent value; the load warns once,
    naming the If."""
    require("onnx")
    ort = require("onnxruntime")
    from onnx import TensorProto as TP, helper as H, numpy_helper as nh
    from rten_convert_tools import convert

    def branch(tag, nodes, consts):
        return H.make_graph([H.make_node("Constant", [], [k], value=nh.from_array(v)) for k, v in consts.items()]
                            + nodes, tag, [], [H.make_tensor_value_info(f"{tag}_y", TP.FLOAT, None)])

    then_b = branch("then", [H.make_node("Reshape", ["x", "t_shape"], ["t_r"]),
                             H.make_node("ReduceMean", ["t_r", "t_ax"], ["then_y"], keepdims=0)],
                    {"t_shape": np.array([1, 4, 128], np.int64), "t_ax": np.array([1], np.int64)})
    else_b = branch("else", [H.make_node("Reshape", ["x", "e_shape"], ["e_r"]),
                             H.make_node("ReduceMean", ["e_r", "e_ax"], ["else_y"], keepdims=0)],
                    {"e_shape": np.array([1, 2, 128], np.int64), "e_ax": np.array([1], np.int64)})
    g = H.make_graph([H.make_node("Equal", ["sr", "k16"], ["c"]),
                      H.make_node("If", ["c"], ["y"], then_branch=then_b, else_branch=else_b)], "vad",
                     [H.make_tensor_value_info("x", TP.FLOAT, [1, "n"]), H.make_tensor_value_info("sr", TP.INT64, [])],
                     [H.make_tensor_value_info("y", TP.FLOAT, None)], [nh.from_array(np.array(16000, np.int64), "k16")])
    m = H.make_model(g, opset_imports=[H.make_opsetid("", 18)], ir_version=8)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((1, 512)).astype(np.float32)
    model = fbjax.load(convert(m))
    with pytest.warns(UserWarning, match="If.*else_branch cannot run"):
        y16 = np.asarray(model(x, np.array(16000, np.int32)))
    np.testing.assert_allclose(y16, sess.run(None, {"x": x, "sr": np.array(16000, np.int64)})[0],
                               atol=1e-6)  # means of 4 float32 values
    assert np.isfinite(y16).all()
    with pytest.raises(Exception):
        sess.run(None, {"x": x, "sr": np.array(8000, np.int64)})
    assert np.isnan(np.asarray(model(x, np.array(8000, np.int32)))).all()


@pytest.mark.parametrize("op,keep", [("SUM", False), ("MEAN", False), ("MEAN", True)])
def test_tflite_int8_empty_mean_sum_input_error(op, keep):
    """Integer MEAN/SUM over empty axes: LiteRT's builtin kernels return
    whatever their buffers held (the values change from run to run), so
    there is no value to match; fbjax and the reference raise InputError
    naming the op and the input shape (MEAN with keep_dims was a raw
    OverflowError)."""
    from fbjax.formats.tflite_builder import TFLiteBuilder

    b = TFLiteBuilder()
    x = b.add_input((1, 1, 1, 4), dtype=np.int8, shape_signature=(1, -1, -1, 4), quant=(0.1, 3))
    ax = b.add_constant(np.array([1, 2], np.int32))
    y = b.add_tensor((1, 1, 1, 4) if keep else (1, 4), dtype=np.int8, quant=(0.05, -2))
    b.add_op(op, [x, ax], [y], options=dict(keep_dims=keep))
    b.add_output(y)
    mb = b.build()
    xx = np.zeros((1, 0, 0, 4), np.int8)
    for run in (fbjax.load(mb), lambda x: fbjax.reference.run(fbjax.load(mb), x)):
        with pytest.raises(fbjax.InputError, match=rf"{op}.*\(1, 0, 0, 4\)"):
            run(xx)
    np.testing.assert_array_equal(np.asarray(fbjax.load(mb)(np.full((1, 2, 1, 4), 7, np.int8))).shape,
                                  (1, 1, 1, 4) if keep else (1, 4))


def test_static_input_error_lists_every_node_in_a_graph():
    """Two PADs whose paddings come from a graph input, and a RESHAPE after
    one of them: the error names both PADs (each refused node, not only the
    first; the RESHAPE downstream is not blamed), at load."""
    from fbjax.formats.tflite_builder import TFLiteBuilder

    b = TFLiteBuilder()
    x = b.add_input((1, 4), name="x")
    p = b.add_input((2, 2), dtype=np.int32, name="paddings")
    y1, y2, y3 = b.add_tensor((1, 6), name="pad_a"), b.add_tensor((1, 6), name="pad_b"), b.add_tensor((6,))
    b.add_op("PAD", [x, p], [y1])
    b.add_op("PAD", [x, p], [y2])
    b.add_op("RESHAPE", [y1, b.add_constant(np.array([6], np.int32))], [y3])
    b.add_output(y3)
    b.add_output(y2)
    with pytest.raises(fbjax.UnsupportedOperatorError) as e:
        fbjax.load(b.build())
    assert e.value.ops == {"tflite:PAD": 2}
    assert str(e.value).count("must be known at load time") == 2
