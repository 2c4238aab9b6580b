"""Model.save: write a .tflite back with new weights, everything else unchanged.

Oracle: LiteRT running the saved file, compared with fbjax's forward pass on
the new params (``model.apply(new_params, x)``, params rounded to the file's
storage dtype where it is float16). Tolerance for float models:
``max|fbjax - LiteRT| <= 1e-4 * max(1, max|LiteRT|)`` (the issue's bound):
the two differ only by float32 summation order over a few hundred products
per output on these models (~1e-6 relative), while a weight written to the
wrong buffer, in the wrong layout or with the wrong dtype changes outputs by
O(1). Quantized write-back is checked exactly against the documented
formula ``q = clip(round_half_away(x / scale) + zero_point)``.
"""

from __future__ import annotations

import numpy as np
import pytest

import fbjax
from fbjax.errors import InputError
from fbjax.formats.tflite import read
from fbjax.formats.tflite_builder import TFLiteBuilder

from conftest import TFLITE_MODELS, assert_close, litert_run, require

RTOL = 1e-4
F32 = np.float32


def _float_model(rng) -> bytes:
    """CONV_2D (bias) -> RELU6 -> RESHAPE -> FULLY_CONNECTED (bias), float32."""
    b = TFLiteBuilder()
    x = b.add_input((1, 6, 6, 3), name="x")
    w = b.add_tensor(data=rng.standard_normal((4, 3, 3, 3)).astype(F32), name="conv/w")
    bias = b.add_tensor(data=rng.standard_normal(4).astype(F32), name="conv/b")
    y = b.add_tensor((1, 3, 3, 4), name="conv")
    b.add_op("CONV_2D", [x, w, bias], [y], options=dict(padding="SAME", stride_h=2, stride_w=2,
                                                       fused_activation_function="RELU6"))
    shape = b.add_tensor(data=np.asarray([1, 36], np.int32), name="shape")
    r = b.add_tensor((1, 36), name="flat")
    b.add_op("RESHAPE", [y, shape], [r])
    fw = b.add_tensor(data=rng.standard_normal((5, 36)).astype(F32), name="fc/w")
    fb = b.add_tensor(data=rng.standard_normal(5).astype(F32), name="fc/b")
    out = b.add_tensor((1, 5), name="out")
    b.add_op("FULLY_CONNECTED", [r, fw, fb], [out], options=dict(fused_activation_function="NONE"))
    b.add_output(out)
    b.add_signature("serving_default", {"x": x}, {"out": out})
    return b.build()


def _perturbed(params, rng, scale=0.1):
    return {k: (np.asarray(v, F32) + scale * rng.standard_normal(np.shape(v))).astype(np.asarray(v).dtype)
            for k, v in params.items()}


def test_save_float_model_runs_in_litert(tmp_path):
    rng = np.random.default_rng(0)
    model = fbjax.load(_float_model(rng))
    new = _perturbed(model.params, rng)
    path = tmp_path / "tuned.tflite"
    data = model.save(path, new)
    assert path.read_bytes() == data
    x = rng.standard_normal((1, 6, 6, 3)).astype(F32)
    ours = np.asarray(model.apply(new, x))
    assert_close(litert_run(path, [x])[0], ours, RTOL, "LiteRT(saved) vs fbjax(new params)")
    # and the original file's outputs really changed (the test can fail)
    assert np.max(np.abs(litert_run(_float_model(np.random.default_rng(0)), [x])[0] - ours)) > 1e-2
    # reading back gives exactly the new weights
    again = fbjax.load(path)
    for k, v in new.items():
        np.testing.assert_array_equal(np.asarray(again.params[k]), v, err_msg=k)


def test_save_keeps_everything_else():
    """Operators, options, names, shapes, signatures, integer constants: unchanged."""
    rng = np.random.default_rng(1)
    src = _float_model(rng)
    model = fbjax.load(src)
    new = _perturbed(model.params, rng)
    a, b = read(src), read(model.save(None, new))
    ga, gb = a.main_graph, b.main_graph
    assert [n.key for n in ga.nodes] == [n.key for n in gb.nodes]
    for na, nb in zip(ga.nodes, gb.nodes):
        assert na.attrs.keys() == nb.attrs.keys()
        for k in na.attrs:
            np.testing.assert_array_equal(np.asarray(na.attrs[k]), np.asarray(nb.attrs[k]), err_msg=k)
    assert [(v.name, v.shape, v.dtype) for v in ga.values] == [(v.name, v.shape, v.dtype) for v in gb.values]
    np.testing.assert_array_equal(ga.values[4].data, gb.values[4].data)  # the int32 RESHAPE shape
    assert list(b.signatures) == ["serving_default"]
    assert b.description == a.description
    # a subset of params: the others keep the file's values
    part = {"fc/b": new["fc/b"]}
    c = fbjax.load(model.save(None, part))
    np.testing.assert_array_equal(np.asarray(c.params["fc/b"]), new["fc/b"])
    np.testing.assert_array_equal(np.asarray(c.params["conv/w"]), np.asarray(model.params["conv/w"]))
    # unchanged params: every buffer byte-identical
    assert read(model.save(None)).main_graph.values[1].data.tobytes() == ga.values[1].data.tobytes()


def test_save_rejects_unknown_names_and_shapes():
    model = fbjax.load(_float_model(np.random.default_rng(2)))
    with pytest.raises(InputError, match="not a weight"):
        model.save(None, {"nope": np.zeros(3, F32)})
    with pytest.raises(InputError, match="shape"):
        model.save(None, {"fc/b": np.zeros(4, F32)})
    with pytest.raises(InputError, match="requantize"):
        model.save(None, requantize="bogus")


def test_save_float16_weights_are_cast_to_the_file_dtype():
    """float16 weights behind DEQUANTIZE (as MediaPipe ships them)."""
    rng = np.random.default_rng(3)
    b = TFLiteBuilder()
    x = b.add_input((1, 5, 5, 2), name="x")
    w16 = b.add_tensor(data=rng.standard_normal((3, 3, 3, 2)).astype(np.float16), name="w16")
    b16 = b.add_tensor(data=rng.standard_normal(3).astype(np.float16), name="b16")
    w = b.add_tensor((3, 3, 3, 2), name="w")
    bb = b.add_tensor((3,), name="b")
    y = b.add_tensor((1, 5, 5, 3), name="y")
    b.add_op("DEQUANTIZE", [w16], [w])
    b.add_op("DEQUANTIZE", [b16], [bb])
    b.add_op("CONV_2D", [x, w, bb], [y], options=dict(padding="SAME", stride_h=1, stride_w=1))
    b.add_output(y)
    model = fbjax.load(b.build())
    trained, frozen = fbjax.trainable(model.params, dtype=np.float32)
    trained = {k: v + 0.01 * rng.standard_normal(v.shape).astype(F32) for k, v in trained.items()}
    data = model.save(None, trained)
    saved = read(data).main_graph
    assert saved.values[1].dtype == np.float16
    rounded = {k: v.astype(np.float16) for k, v in trained.items()}
    np.testing.assert_array_equal(saved.values[1].data, rounded["w16"])
    xin = rng.standard_normal((1, 5, 5, 2)).astype(F32)
    assert_close(litert_run(data, [xin])[0], np.asarray(model.apply(rounded, xin)), RTOL,
                 "LiteRT(saved fp16) vs fbjax(rounded params)")


def _quantized_fc_model(w_q, scale, zp, dim=0) -> bytes:
    """int8 weights -> DEQUANTIZE -> FULLY_CONNECTED (float activations)."""
    b = TFLiteBuilder()
    x = b.add_input((2, w_q.shape[1]), name="x")
    wq = b.add_tensor(data=w_q, name="wq", quant=dict(scale=scale, zero_point=zp, quantized_dimension=dim))
    w = b.add_tensor(w_q.shape, name="w")
    y = b.add_tensor((2, w_q.shape[0]), name="y")
    b.add_op("DEQUANTIZE", [wq], [w])
    b.add_op("FULLY_CONNECTED", [x, w, -1], [y], options=dict(fused_activation_function="NONE"))
    b.add_output(y)
    return b.build()


def _round_half_away(x):
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def test_save_requantizes_with_the_file_scales():
    rng = np.random.default_rng(4)
    scale = np.asarray([0.02, 0.05, 0.01], F32)
    zp = np.zeros(3, np.int64)
    w_q = rng.integers(-100, 100, (3, 4)).astype(np.int8)
    model = fbjax.load(_quantized_fc_model(w_q, scale, zp))
    new_float = rng.standard_normal((3, 4)).astype(F32) * 1.5  # some values clip at +-127 * scale
    data = model.save(None, {"wq": new_float})
    v = read(data).main_graph.values[1]
    expected = np.clip(_round_half_away(new_float.astype(np.float64) / scale[:, None].astype(np.float64)),
                       -128, 127).astype(np.int8)
    np.testing.assert_array_equal(v.data, expected)
    np.testing.assert_array_equal(v.quant.scale, scale)  # the file's scales are kept
    xin = rng.standard_normal((2, 4)).astype(F32)
    assert_close(litert_run(data, [xin])[0], np.asarray(fbjax.load(data)(xin)), RTOL,
                 "LiteRT vs fbjax on the re-quantized file")


def test_save_requantize_per_channel_recomputes_scales():
    rng = np.random.default_rng(5)
    w_q = rng.integers(-100, 100, (3, 4)).astype(np.int8)
    model = fbjax.load(_quantized_fc_model(w_q, np.asarray([0.02, 0.05, 0.01], F32), np.zeros(3, np.int64)))
    new_float = rng.standard_normal((3, 4)).astype(F32) * 3
    data = model.save(None, {"wq": new_float}, requantize="per_channel")
    v = read(data).main_graph.values[1]
    want_scale = (np.abs(new_float).max(axis=1) / 127).astype(F32)
    np.testing.assert_allclose(v.quant.scale, want_scale, rtol=1e-7)
    deq = v.data.astype(np.float64) * v.quant.scale[:, None]
    # round-to-nearest: every weight within half a step of its new value, nothing clipped
    assert np.all(np.abs(deq - new_float) <= 0.5 * v.quant.scale[:, None] + 1e-7)


def test_save_per_channel_requantizes_dependent_int32_bias():
    """Full-integer CONV_2D: new weight scales change the bias scale s_in * s_w."""
    rng = np.random.default_rng(6)
    b = TFLiteBuilder()
    x = b.add_input((1, 4, 4, 2), np.int8, name="x", quant=dict(scale=0.05, zero_point=-3))
    w_scale = np.asarray([0.01, 0.02], F32)
    w = b.add_tensor(data=rng.integers(-127, 127, (2, 1, 1, 2)).astype(np.int8), name="w",
                     quant=dict(scale=w_scale, zero_point=[0, 0], quantized_dimension=0))
    bias_f = np.asarray([0.3, -0.2])
    bias_q = _round_half_away(bias_f / (0.05 * w_scale)).astype(np.int32)
    bias = b.add_tensor(data=bias_q, name="bias", quant=dict(scale=0.05 * w_scale, zero_point=[0, 0]))
    y = b.add_tensor((1, 4, 4, 2), np.int8, name="y", quant=dict(scale=0.1, zero_point=2))
    b.add_op("CONV_2D", [x, w, bias], [y], options=dict(padding="VALID", stride_h=1, stride_w=1))
    b.add_output(y)
    src = b.build()
    ir = read(src)
    values = {v.name: v for v in ir.main_graph.values}
    from fbjax.formats.tflite_writer import write
    from fbjax.lower import LOWERINGS

    new_w = rng.standard_normal((2, 1, 1, 2)) * 0.5
    out = read(write(ir, {values["w"]: new_w}, requantize="per_channel", registry=LOWERINGS)).main_graph
    ov = {v.name: v for v in out.values}
    new_ws = (np.abs(new_w).reshape(2, -1).max(axis=1) / 127).astype(F32)
    np.testing.assert_allclose(ov["w"].quant.scale, new_ws, rtol=1e-7)
    np.testing.assert_allclose(ov["bias"].quant.scale, (np.float32(0.05) * new_ws).astype(F32), rtol=1e-6)
    got_bias = ov["bias"].data.astype(np.float64) * ov["bias"].quant.scale
    np.testing.assert_allclose(got_bias, bias_q * (0.05 * w_scale), atol=float(ov["bias"].quant.scale.max()))


@pytest.mark.skipif(not (TFLITE_MODELS / "mediapipe_face_detection_full_range_sparse.tflite").is_file(),
                    reason="needs ../shared/models/tflite/mediapipe_face_detection_full_range_sparse.tflite")
def test_save_sparse_weights_keep_their_structure():
    path = TFLITE_MODELS / "mediapipe_face_detection_full_range_sparse.tflite"
    model = fbjax.load(path)
    from fbjax.formats._generated import tflite_generated as T

    m = T.ModelT.InitFromObj(T.Model.GetRootAs(path.read_bytes(), 0))
    sparse = [t.name.decode() if isinstance(t.name, bytes) else t.name
              for t in m.subgraphs[0].tensors if t.sparsity is not None]
    assert sparse, "the model has no sparse tensors any more"
    name = next(n for n in sparse if n in model.params)
    w = np.asarray(model.params[name])
    from fbjax.formats.tflite import tensor_dtype

    stored = tensor_dtype(next(t.type for t in m.subgraphs[0].tensors if t.sparsity is not None
                               and (t.name.decode() if isinstance(t.name, bytes) else t.name) == name))
    # scaling keeps the zeros: writable, and LiteRT agrees with fbjax on the
    # new values as the file stores them (float16 here: rounded)
    new = {name: (w * np.asarray(1.25, w.dtype)).astype(stored).astype(w.dtype)}
    data = model.save(None, new)
    np.testing.assert_array_equal(np.asarray(fbjax.load(data).params[name]), new[name])
    x = np.random.default_rng(7).random((1, 192, 192, 3), dtype=F32)
    import jax

    outs = jax.jit(model.apply)({**model.params, **new}, x)
    for k, (lit, ours) in enumerate(zip(litert_run(data, [x]), outs)):
        assert_close(lit, np.asarray(ours), RTOL, f"sparse model output {k}")
    # filling a pruned zero cannot be stored in the sparse structure
    filled = w.copy()
    filled[w == 0] = 1
    with pytest.raises(InputError, match="sparse"):
        model.save(None, {name: filled})


@pytest.mark.skipif(not (TFLITE_MODELS / "tflm_sine_float.tflite").is_file(),
                    reason="needs ../shared/models/tflite/tflm_sine_float.tflite")
def test_save_real_model_litert(tmp_path):
    model = fbjax.load(TFLITE_MODELS / "tflm_sine_float.tflite")
    rng = np.random.default_rng(8)
    new = _perturbed(model.params, rng, 0.05)
    path = tmp_path / "sine.tflite"
    model.save(path, new)
    x = np.linspace(0, 6, 50, dtype=F32)[:, None]
    assert_close(litert_run(path, [x])[0], np.asarray(model.apply(new, x)), RTOL, "sine model")


def _int8_fc_model(rng) -> bytes:
    """Full-integer FULLY_CONNECTED: int8 input/weights/output, int32 bias."""
    b = TFLiteBuilder()
    x = b.add_input((2, 4), np.int8, name="x", quant=dict(scale=0.05, zero_point=1))
    w_scale = np.asarray([0.01, 0.02, 0.015], F32)
    w = b.add_tensor(data=rng.integers(-127, 127, (3, 4)).astype(np.int8), name="w",
                     quant=dict(scale=w_scale, zero_point=[0, 0, 0], quantized_dimension=0))
    bias = b.add_tensor(data=rng.integers(-50, 50, 3).astype(np.int32), name="bias",
                        quant=dict(scale=0.05 * w_scale, zero_point=[0, 0, 0]))
    y = b.add_tensor((2, 3), np.int8, name="y", quant=dict(scale=0.08, zero_point=-2))
    b.add_op("FULLY_CONNECTED", [x, w, bias], [y], options=dict(fused_activation_function="NONE"))
    b.add_output(y)
    return b.build()


def test_save_quantized_float_params_requantize_into_the_int8_file():
    """load(quantized="float") makes int8 weights float params; save writes
    them back as int8 with the file's scales (the file keeps its types)."""
    rng = np.random.default_rng(11)
    src = _int8_fc_model(rng)
    model = fbjax.load(src, quantized="float")
    assert "w" in model.params and np.asarray(model.params["w"]).dtype == np.float32
    new_w = np.asarray(model.params["w"]) + 0.05 * rng.standard_normal((3, 4)).astype(F32)
    data = model.save(None, {"w": new_w})
    saved = {v.name: v for v in read(data).main_graph.values}
    orig = {v.name: v for v in read(src).main_graph.values}
    assert saved["w"].dtype == np.int8 and saved["x"].dtype == np.int8
    np.testing.assert_array_equal(saved["w"].quant.scale, orig["w"].quant.scale)
    want = np.clip(_round_half_away(new_w.astype(np.float64) / orig["w"].quant.scale[:, None].astype(np.float64)),
                   -128, 127).astype(np.int8)
    np.testing.assert_array_equal(saved["w"].data, want)
    np.testing.assert_array_equal(saved["bias"].data, orig["bias"].data)  # untouched
    xq = rng.integers(-100, 100, (2, 4)).astype(np.int8)
    assert litert_run(data, [xq])[0].dtype == np.int8  # LiteRT runs the re-written file


# --- buffers after the flatbuffer (Buffer.offset/size: files over 2 GB, litert-torch's LLM files) -----------

def _large_layout_file() -> bytes:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent / "fuzz"))
    import fuzz_corpus

    return fuzz_corpus.tflite_large_layout(np.linspace(-1, 1, 64, dtype=np.float32))


def _litert_builtin(data: bytes, x: np.ndarray) -> np.ndarray:
    litert = require("ai_edge_litert.interpreter")
    interp = litert.Interpreter(model_content=data,
                                experimental_op_resolver_type=litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    return interp.get_tensor(interp.get_output_details()[0]["index"])


@pytest.mark.parametrize("repack", [False, True])
def test_save_buffer_after_the_flatbuffer(tmp_path, repack):
    """A hand-built ``y = x + w`` whose ``w`` follows the flatbuffer (offset/size). Same size: the new
    bytes replace the old ones where the file keeps them, nothing else changes. ``repack``: the
    writer's other path (taken when scales change or a shared buffer splits) packs the flatbuffer again
    and appends the bytes, 16-byte aligned, still by offset."""
    from fbjax.formats import tflite_writer as W
    from fbjax.formats._generated import tflite_generated as T

    raw = _large_layout_file()
    src = tmp_path / "large_layout.tflite"
    src.write_bytes(raw)
    model = fbjax.load(src)
    (name,) = model.params
    assert model.save(None, model.params) == raw
    new = np.asarray(model.params[name]) * np.float32(-3) + np.float32(0.25)
    if repack:
        w = W._Writer(model.ir, "file")
        w.apply({v: new for v in model.ir.graphs[0].values if v.name == name})
        w.restructured = True
        out = w.pack()
    else:
        out = model.save(None, {name: new})
    m = T.Model.GetRootAs(out, 0)
    b = m.Buffers(1)
    off, size = b.Offset(), b.Size()
    assert off > 1 and size == new.nbytes and b.DataLength() == 0  # still after the flatbuffer, by offset
    assert np.frombuffer(out, np.float32, count=64, offset=off).tolist() == new.tolist()
    old_off = T.Model.GetRootAs(raw, 0).Buffers(1).Offset()
    if repack:
        assert off % 16 == 0 and len(out) == off + size
    else:  # byte for byte the file, but for the weight's bytes
        assert len(out) == len(raw) and off == old_off
        assert out[:off] == raw[:off] and out[off + size:] == raw[off + size:]
    again = fbjax.load(out)
    np.testing.assert_array_equal(np.asarray(again.params[name]), new)
    x = np.linspace(2, -2, 64, dtype=np.float32)
    # one float32 addition each: the exact sum rounded once, so within one ulp of numpy's
    eps = float(np.finfo(np.float32).eps)
    np.testing.assert_allclose(np.asarray(again(x)), x + new, rtol=eps, atol=0)
    np.testing.assert_allclose(_litert_builtin(out, x), x + new, rtol=eps, atol=0)
