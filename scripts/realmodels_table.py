"""Issue 20's per-model table: real models from PyPI packages vs their oracles.

For each model: format, max error against the oracle, how many frames/calls
were compared, and whether ``fbjax inspect``'s operator histogram equals the
loaded model's nodes (and reports nothing unsupported).

* microWakeWord (the four int8 ``.tflite`` files committed in
  ``tests/data/realmodels``, from pymicro-wakeword 2.5.0): default
  ``quantized="exact"`` vs LiteRT's builtin kernels
  (``BUILTIN_WITHOUT_DEFAULT_DELEGATES``) over a 100-frame stream, state
  carried by both; error = max |output code difference|, and whether every
  carried int8 state variable matched after every frame.
* silero-vad 6.2.3 (``pip install --no-deps silero-vad==6.2.3``; skipped if
  absent): ``rten-convert`` + fbjax vs onnxruntime, 3 calls of 512 samples at
  16 kHz, the state fed back; error = max |difference| over outputs and
  state.

Run: ``python scripts/realmodels_table.py`` (needs ``'.[test]'``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import sys
import tempfile
import warnings
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import fbjax  # noqa: E402
from fbjax.cli import main as cli_main  # noqa: E402


def inspect_agrees(path) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cli_main(["inspect", str(path)])
        loaded = Counter(n.op_name for n in fbjax.load(path).ir.iter_nodes())
    text = out.getvalue()
    block, rest = text.split("operators (", 1)[1].split("unsupported:", 1)
    hist = Counter({m.group(2).split(":")[-1]: int(m.group(1))
                    for m in re.finditer(r"^\s+(\d+)\s+(\S+)\s*$", block, re.M)})
    ok = hist == loaded and rest.strip().startswith("none")
    return f"yes ({sum(hist.values())} ops)" if ok else f"NO: inspect {dict(hist)} vs load {dict(loaded)}"


def wakeword_rows() -> list:
    from ai_edge_litert.interpreter import Interpreter, OpResolverType
    from test_realmodels import DATA, WAKEWORD, _stream

    rows = []
    for name in WAKEWORD:
        path = DATA / f"{name}.tflite"
        it = Interpreter(model_path=str(path), experimental_preserve_all_tensors=True,
                         experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
        it.allocate_tensors()
        din, dout = it.get_input_details()[0], it.get_output_details()[0]
        model = fbjax.load(path)
        names = {id(n.outputs[0]): n.attrs["shared_name"].decode() for n in model.ir.main_graph.nodes
                 if n.op_name == "VAR_HANDLE"}
        reads = {n.outputs[0].name: names[id(n.inputs[0])] for n in model.ir.main_graph.nodes
                 if n.op_name == "READ_VARIABLE"}
        idx = {d["name"]: d["index"] for d in it.get_tensor_details()}
        err, state_ok, prev, outs = 0, True, {k: np.asarray(v) for k, v in model.state.items()}, []
        frames = _stream(100, tuple(din["shape"]), seed=len(name))
        for x in frames:
            it.set_tensor(din["index"], x)
            it.invoke()
            state_ok &= all(np.array_equal(prev[v], it.get_tensor(idx[t])) for t, v in reads.items())
            y = np.asarray(model(x))
            outs.append(int(y.ravel()[0]))
            err = max(err, int(np.max(np.abs(y.astype(int) - it.get_tensor(dout["index"]).astype(int)))))
            prev = {k: np.asarray(v) for k, v in model.state.items()}
        rows.append((f"microWakeWord {name}", "tflite int8 (exact)",
                     f"{err} codes; state {'bit-exact' if state_ok else 'DIFFERS'} ({len(reads)} vars)",
                     f"{len(frames)} frames (outputs {min(outs)}..{max(outs)})", inspect_agrees(path)))
    return rows


def silero_rows() -> list:
    spec = importlib.util.find_spec("silero_vad")
    if spec is None:
        return [("silero-vad", "-", "skipped: pip install --no-deps silero-vad==6.2.3", "-", "-")]
    import onnx
    import onnxruntime as ort
    from rten_convert_tools import convert

    d = Path(list(spec.submodule_search_locations)[0]) / "data"
    rows = []
    t = np.arange(512) / 16000.0
    for variant in ["silero_vad", "silero_vad_16k_op15", "silero_vad_half", "silero_vad_op18_ifless"]:
        m = onnx.load(str(d / f"{variant}.onnx"))
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"{variant}.rten"
            path.write_bytes(convert(m))
            sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = fbjax.load(path)
                names = {i.name for i in m.graph.input}
                rng = np.random.default_rng(0)
                s_o = s_f = np.zeros((2, 1, 128), np.float32)
                err = 0.0
                for k in range(3):
                    x = (0.3 * np.sin(2 * np.pi * 220 * (t + k * 512 / 16000))
                         + 0.05 * rng.standard_normal(512)).astype(np.float32)[None]
                    feeds = {"input": x, "state": s_o}
                    if "sr" in names:
                        feeds["sr"] = np.array(16000, np.int64)
                    o, s_o = sess.run(None, feeds)
                    args = {"input": x, "state": s_f, "sr": np.array(16000, np.int32)}
                    fo = dict(zip([s.name for s in model.outputs], model(*[args[s.name] for s in model.inputs])))
                    s_f = np.asarray(fo["stateN"])
                    err = max(err, float(np.max(np.abs(np.asarray(fo["output"]) - o))),
                              float(np.max(np.abs(s_f - s_o))))
            rows.append((f"silero-vad {variant}", "onnx -> rten (rten-convert 0.22)", f"{err:.2g}", "3 calls",
                         inspect_agrees(path)))
    return rows


def main() -> None:
    rows = wakeword_rows() + silero_rows()
    print("| model | format | max error vs oracle | compared | inspect agrees with load |")
    print("|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
