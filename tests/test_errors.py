"""fbjax refuses bad files, unsupported ops and wrong inputs with its own errors.

Corrupt files must raise :class:`fbjax.ModelFormatError` (not the IndexError,
struct.error or numpy ValueError a flatbuffer parser trips over);
unsupported ops :class:`fbjax.UnsupportedOperatorError` naming every one;
calls with wrong inputs :class:`fbjax.InputError`.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import fbjax
from fbjax.formats.tflite_builder import TFLiteBuilder, single_op_model

from conftest import TFLITE_MODELS, abs_magnitude, assert_within, gamma, require


def _small_model() -> bytes:
    rng = np.random.default_rng(0)
    return single_op_model(
        "CONV_2D",
        [(1, 5, 5, 3), rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
         rng.standard_normal(4).astype(np.float32)],
        options=dict(padding="SAME", stride_w=1, stride_h=1),
        output_shapes=[(1, 5, 5, 4)],
    )


def _real_model_bytes() -> bytes:
    path = TFLITE_MODELS / "mediapipe_iris_landmark.tflite"
    if not path.is_file():
        pytest.skip(f"{path} is absent (../shared next to the repository)")
    return path.read_bytes()


# --- corrupt files -------------------------------------------------------------

def test_small_model_is_valid():
    """The model the truncation tests cut up loads and runs (so the errors below
    come from the damage, not from the model)."""
    m = fbjax.load(_small_model())
    y = np.asarray(m(np.ones((1, 5, 5, 3), np.float32)))
    assert y.shape == (1, 5, 5, 4) and np.all(np.isfinite(y))


@pytest.mark.parametrize("fraction", [0.02, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99])
def test_truncated_small_model_bytes(fraction):
    data = _small_model()
    cut = data[: max(8, int(len(data) * fraction))]
    with pytest.raises(fbjax.ModelFormatError):
        fbjax.load(cut)


@pytest.mark.parametrize("fraction", [0.001, 0.5, 0.999])
def test_truncated_real_model_file(tmp_path, fraction):
    data = _real_model_bytes()
    path = tmp_path / "truncated.tflite"
    path.write_bytes(data[: int(len(data) * fraction)])
    with pytest.raises(fbjax.ModelFormatError):
        fbjax.load(path)


@pytest.mark.parametrize("n", [0, 3, 7])
def test_too_short(n):
    with pytest.raises(fbjax.ModelFormatError):
        fbjax.load(b"\x00" * n)


def test_empty_file(tmp_path):
    path = tmp_path / "empty.tflite"
    path.write_bytes(b"")
    with pytest.raises(fbjax.ModelFormatError):
        fbjax.load(path)


@pytest.mark.parametrize("seed", range(6))
def test_random_bytes(seed):
    data = np.random.default_rng(seed).integers(0, 256, 2000, dtype=np.uint8).tobytes()
    with pytest.raises(fbjax.ModelFormatError):
        fbjax.load(data)


@pytest.mark.parametrize("seed", range(12))
def test_random_bytes_with_tflite_identifier(seed):
    """Random bytes that pass the ``TFL3`` identifier check reach the parser."""
    rng = np.random.default_rng(100 + seed)
    data = bytearray(rng.integers(0, 256, 4000, dtype=np.uint8).tobytes())
    # a root offset inside the data, so the parser follows random offsets
    data[0:4] = int(rng.integers(8, 3000)).to_bytes(4, "little")
    data[4:8] = b"TFL3"
    with pytest.raises(fbjax.ModelFormatError):
        fbjax.load(bytes(data))


def _buffer_ranges(data: bytes) -> dict:
    """``{buffer index: (start, end)}``: the byte ranges of the model's constant
    data, read with the generated flatbuffer bindings (not fbjax's reader)."""
    from fbjax.formats._generated import tflite_generated as T

    m = T.Model.GetRootAs(data, 0)
    out = {}
    for i in range(m.BuffersLength()):
        b = m.Buffers(i)
        if b.DataLength():
            start = b._tab.Vector(b._tab.Offset(4))
            out[i] = (start, start + b.DataLength())
    return out


@pytest.mark.parametrize("seed", range(8))
def test_corrupted_bytes_in_valid_model(seed):
    """16 random bytes written over a valid model. Where they land only in a
    constant's data (located with the generated bindings), the file is still
    valid: it loads, and the weights it runs are the overwritten bytes. Where
    they hit the flatbuffer's tables, offsets or lengths (seeds 0, 4, 5, 6
    here), load raises ModelFormatError naming the offset in the file -- never
    a raw parser exception, never a silent load."""
    clean = _small_model()
    data = bytearray(clean)
    rng = np.random.default_rng(200 + seed)
    start = int(rng.integers(8, len(data) - 16))
    data[start:start + 16] = rng.integers(0, 256, 16, dtype=np.uint8).tobytes()
    ranges = _buffer_ranges(clean)
    inside = [i for i, (a, b) in ranges.items() if a <= start and start + 16 <= b]
    if inside:
        m = fbjax.load(bytes(data))
        a, b = ranges[inside[0]]
        want = np.frombuffer(bytes(data[a:b]), np.float32)
        got = [np.asarray(p).ravel() for p in m.params.values() if np.asarray(p).size == want.size]
        assert len(got) == 1, f"expected one param of {want.size} elements, got {[np.shape(p) for p in m.params.values()]}"
        np.testing.assert_array_equal(got[0].view(np.uint32), want.view(np.uint32))  # bit for bit, NaNs too
        assert not np.array_equal(want.view(np.uint32), np.frombuffer(clean[a:b], np.uint32)), "nothing was changed"
    else:
        with pytest.raises(fbjax.ModelFormatError, match=r"offset") as info:
            fbjax.load(bytes(data))
        assert "file" in str(info.value)


def test_home_directory_path(tmp_path, monkeypatch):
    """fbjax.load("~/...") reads from the home directory, as a shell path would."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "m.tflite").write_bytes(single_op_model("ADD", [(2, 3), (2, 3)]))
    m = fbjax.load("~/m.tflite")
    x = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(np.asarray(m(x, x)), 2 * x)  # 1 + 1, exact


def test_not_a_model_file(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes(b"these are not the bytes you are looking for\n" * 10)
    with pytest.raises(fbjax.ModelFormatError):
        fbjax.load(path)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        fbjax.load(tmp_path / "does-not-exist.tflite")


# --- unsupported operators ---------------------------------------------------------

def _model_with_ops(ops: list[tuple[str, bool]]) -> bytes:
    """A chain of ops (name, is_custom) on a (2, 3) float tensor."""
    b = TFLiteBuilder()
    t = b.add_input((2, 3))
    for name, custom in ops:
        y = b.add_tensor((2, 3))
        b.add_op(name, [t], [y], custom=custom)
        t = y
    b.add_output(t)
    return b.build()


def test_unsupported_custom_op_is_named():
    with pytest.raises(fbjax.UnsupportedOperatorError) as info:
        fbjax.load(_model_with_ops([("MyOp", True)]))
    assert "MyOp" in str(info.value)
    assert info.value.ops == {"tflite.custom:MyOp": 1}


def test_unsupported_builtin_op_is_named():
    """A builtin fbjax has no lowering for (SKIP_GRAM: a schema builtin that
    LiteRT deprecated) is refused at load, named with its count."""
    assert "SKIP_GRAM" not in fbjax.supported_ops().get("tflite", []), (
        "SKIP_GRAM is supported now: pick another builtin of the schema that fbjax does not lower")
    b = TFLiteBuilder()
    x = b.add_input((2, 4))
    y = b.add_tensor((2, 3))
    b.add_op("SKIP_GRAM", [x], [y])
    b.add_output(y)
    with pytest.raises(fbjax.UnsupportedOperatorError) as info:
        fbjax.load(b.build())
    assert "SKIP_GRAM" in str(info.value)
    assert info.value.ops == {"tflite:SKIP_GRAM": 1}


def test_every_unsupported_op_is_named_with_counts():
    model = _model_with_ops([("MyOp", True), ("RELU", False), ("MyOtherOp", True), ("MyOp", True)])
    with pytest.raises(fbjax.UnsupportedOperatorError) as info:
        fbjax.load(model)
    msg = str(info.value)
    assert "MyOp" in msg and "MyOtherOp" in msg
    assert "RELU" not in msg.replace("MyOtherOp", "")
    assert info.value.ops == {"tflite.custom:MyOp": 2, "tflite.custom:MyOtherOp": 1}


def test_unsupported_op_error_is_raised_at_load():
    """The error comes from fbjax.load, before any input is seen."""
    with pytest.raises(fbjax.UnsupportedOperatorError):
        fbjax.load(_model_with_ops([("MyOp", True)]))


# --- wrong inputs -------------------------------------------------------------------

@pytest.fixture(scope="module")
def two_input_model():
    return fbjax.load(single_op_model("ADD", [(2, 3), (2, 3)], options=dict(fused_activation_function="NONE")))


def test_correct_inputs_work(two_input_model):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(np.asarray(two_input_model(a, 2 * a)), 3 * a)


@pytest.mark.parametrize("shape", [(3, 2), (2, 3, 1), (6,), (1, 2, 3)], ids=str)
def test_wrong_input_shape(two_input_model, shape):
    a = np.zeros((2, 3), np.float32)
    with pytest.raises(fbjax.InputError) as info:
        two_input_model(a, np.zeros(shape, np.float32))
    assert "shape" in str(info.value)


@pytest.mark.parametrize("count", [0, 1, 3])
def test_wrong_input_count(two_input_model, count):
    xs = [np.zeros((2, 3), np.float32)] * count
    with pytest.raises(fbjax.InputError):
        two_input_model(*xs)


def test_inputs_by_name():
    """model(name=x) and model.apply(params, name=x) put named inputs in
    input order (SUB: the order shows in the result, exact in float32 for
    these small integers); unknown, doubled and missing names are InputErrors."""
    m = fbjax.load(single_op_model("SUB", [(2, 3), (2, 3)], options=dict(fused_activation_function="NONE")))
    first, second = (s.name for s in m.inputs)
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.full((2, 3), 10, np.float32)
    want = a - b
    np.testing.assert_array_equal(np.asarray(m(**{second: b, first: a})), want)
    np.testing.assert_array_equal(np.asarray(m(a, **{second: b})), want)
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda p: m.apply(p, **{second: b, first: a}))(m.params)), want)
    with pytest.raises(fbjax.InputError, match="no input named 'nope'"):
        m(a, nope=b)
    with pytest.raises(fbjax.InputError, match="given both by position and by name"):
        m(a, b, **{first: a})
    with pytest.raises(fbjax.InputError, match=f"missing input '{second}'"):
        m(**{first: a})


def test_wrong_input_dtype(two_input_model):
    a = np.zeros((2, 3), np.float32)
    with pytest.raises(fbjax.InputError):
        two_input_model(a, np.array([["a", "b", "c"], ["d", "e", "f"]]))


def test_apply_checks_input_shapes(shared_models_dir):
    """Model.apply refuses shapes the graph was not built for (a batch of 2
    through a batch-1 graph would otherwise be folded into another axis),
    eagerly and under jit."""
    import jax

    import fbjax
    from fbjax import InputError

    m = fbjax.load(shared_models_dir / "mediapipe_face_detection_short_range.tflite")
    good = np.zeros((1, 128, 128, 3), np.float32)
    m.apply(m.params, good)
    for bad in (np.zeros((2, 128, 128, 3), np.float32), np.zeros((1, 64, 64, 3), np.float32),
                np.zeros((128, 128, 3), np.float32)):
        with pytest.raises(InputError, match="expected"):
            m.apply(m.params, bad)
        with pytest.raises(InputError, match="expected"):
            jax.jit(m.apply)(m.params, bad)
    with pytest.raises(InputError, match="batch_size=None"):
        m.apply(m.params, np.zeros((2, 128, 128, 3), np.float32))
    with pytest.raises(InputError, match="input"):
        m.apply(m.params, good, good)


# --- quantized inputs, directories, save -----------------------------------------

_QUANT = __import__("pathlib").Path(__file__).parent / "data" / "quant" / "models" / "ssd_head_int8.tflite"


def test_quantized_inputs_range_checked_with_a_hint():
    """Integer inputs that would wrap around in the cast to int8 are refused
    (a uint8 image of 200s is not silently -56); the message gives the
    input's scale and zero point (as LiteRT reports them) and the float-mode
    alternative. In-range integers of another type are cast, with the same
    result as int8."""
    litert = require("ai_edge_litert.interpreter", reason="ai-edge-litert (the oracle) is absent")
    m = fbjax.load(_QUANT)
    s, z = litert.Interpreter(model_path=str(_QUANT)).get_input_details()[0]["quantization"]
    q = m.input_quantization[0]
    assert np.isclose(float(q.scale[0]), s) and int(q.zero_point[0]) == z
    for bad in (np.full((1, 32, 32, 3), 200, np.uint8), np.full((1, 32, 32, 3), -1000, np.int32),
                np.zeros((1, 32, 32, 3), np.float32)):
        with pytest.raises(fbjax.InputError) as e:
            m(bad)
        assert f"zero point {z}" in str(e.value) and 'quantized="float"' in str(e.value)
    x8 = np.random.default_rng(0).integers(-128, 128, (1, 32, 32, 3)).astype(np.int8)
    for a, b in zip(m(x8.astype(np.int32)), m(x8)):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    f = fbjax.load(_QUANT, quantized="float")  # float mode keeps the file's quantization on record
    assert f.inputs[0].dtype == np.float32 and np.array_equal(f.input_quantization[0].scale, q.scale)
    assert [o is None for o in f.output_quantization] == [o is None for o in m.output_quantization]


def test_directory_is_a_model_format_error(tmp_path):
    with pytest.raises(fbjax.ModelFormatError, match="is a directory"):
        fbjax.load(tmp_path)


def test_save_refuses_nan_and_missing_folder(tmp_path):
    m = fbjax.load(_small_model())
    name = next(iter(m.params))
    bad = np.array(m.params[name])
    bad.flat[0] = np.nan
    with pytest.raises(fbjax.InputError, match="NaN"):
        m.save(None, params={name: bad})
    with pytest.raises(fbjax.InputError, match="does not exist"):
        m.save(tmp_path / "nope" / "m.tflite")
    m.save(tmp_path / "m.tflite")
    assert fbjax.load(tmp_path / "m.tflite").inputs == m.inputs


def test_cli_run_takes_an_npz_of_named_inputs(tmp_path, capsys):
    from fbjax.cli import main

    m = fbjax.load(_small_model())
    x = np.random.default_rng(1).random((1, 5, 5, 3), dtype=np.float32)
    np.savez(tmp_path / "x.npz", **{m.inputs[0].name: x})
    (tmp_path / "m.tflite").write_bytes(_small_model())
    assert main(["run", str(tmp_path / "m.tflite"), "-i", str(tmp_path / "x.npz"), "--repeat", "0",
                 "-o", str(tmp_path / "o.npz")]) == 0
    assert "(file)" in capsys.readouterr().out
    with np.load(tmp_path / "o.npz") as o:
        np.testing.assert_array_equal(o[o.files[0]], np.asarray(m(x)))


# --- params given to Model.apply, save file names ----------------------------------

def test_apply_checks_params_keys_shapes_and_dtypes():
    """Wrong params are the caller's mistake (InputError naming the key), not a
    broken file: a weight of another shape, an integer weight, a key that is
    not a weight of the model (a typo would otherwise be ignored while the
    file's value runs); eagerly and under jit/grad."""
    import jax
    import jax.numpy as jnp

    m = fbjax.load(_small_model())
    x = np.zeros((1, 5, 5, 3), np.float32)
    w = next(k for k, v in m.params.items() if v.ndim == 4)
    cases = [
        ({**m.params, w: jnp.zeros((1, 3, 3, 3))}, rf"params\['{w}'\] has shape \(1, 3, 3, 3\), expected \(4, 3, 3, 3\)"),
        ({**m.params, w: jnp.zeros((4, 3, 3, 3), jnp.int32)}, rf"params\['{w}'\] has dtype int32"),
        ({**m.params, w + "_typo": m.params[w]}, "not weights of this model"),
        ([m.params[k] for k in m.params], "must be a dict"),
    ]
    for params, msg in cases:
        with pytest.raises(fbjax.InputError, match=msg):
            m.apply(params, x)
        with pytest.raises(fbjax.InputError, match=msg):
            jax.jit(m.apply)(params, x)
    with pytest.raises(fbjax.InputError, match="not weights"):
        jax.grad(lambda p: jnp.sum(m.apply(p, x)))({**m.params, "extra": jnp.ones(3)})
    # any float dtype is accepted (mixed precision): same result up to bfloat16 rounding of the weights
    y = np.asarray(m.apply({k: v.astype(jnp.bfloat16) for k, v in m.params.items()}, x + 1), np.float32)
    ref = np.asarray(m.apply(m.params, x + 1))
    # bfloat16 rounds each weight by at most 2**-9 relative (8 mantissa bits), moving the 3*3*3-product
    # sum plus bias by at most 2**-9 * (|x| * |w| + |b|); plus both programs' float32 summation error
    mag = abs_magnitude(m, x + 1)
    assert_within(y, ref, (2.0 ** -9 + 2 * gamma(28)) * mag, "bfloat16 weights vs float32")


def test_batch_size_hint_only_where_it_helps():
    """The ``batch_size=None`` hint appears for a batch-1 file fed another
    batch, not for a mismatch in another dimension or a file whose batch is
    not 1 (which the rewrite cannot change)."""
    from fbjax.model import _batch_hint

    assert "batch_size=None" in _batch_hint((1, 5, 5, 3), (2, 5, 5, 3))
    assert _batch_hint((1, 5, 5, 3), (2, 3, 5, 5)) == ""     # NCHW into NHWC: not a batch problem
    assert _batch_hint((1, 5, 5, 3), (1, 4, 4, 3)) == ""
    assert _batch_hint((None, 5, 5, 3), (2, 3, 5, 5)) == ""  # already batch-polymorphic
    assert _batch_hint((5, 4), (2, 4)) == ""                 # a file with batch 5
    m = fbjax.load(_small_model())
    with pytest.raises(fbjax.InputError) as e:
        m(np.zeros((1, 3, 5, 5), np.float32))
    assert "batch_size" not in str(e.value)


def test_save_refuses_another_formats_extension_and_takes_bfloat16(tmp_path):
    import jax.numpy as jnp

    m = fbjax.load(_small_model())
    with pytest.raises(fbjax.InputError, match=r"extension .rten \(rten\) is not this model's format"):
        m.save(tmp_path / "tuned.rten")
    assert not (tmp_path / "tuned.rten").exists()
    for ext in (".onnx", ".bin", ".npz"):  # issue 15: save("x.onnx") wrote TFLite bytes
        with pytest.raises(fbjax.InputError, match=r"ending in \.tflite"):
            m.save(tmp_path / f"tuned{ext}")
        assert not (tmp_path / f"tuned{ext}").exists()
    w = next(k for k, v in m.params.items() if v.ndim == 4)
    new = (m.params[w] * 2).astype(jnp.bfloat16)
    m2 = fbjax.load(m.save(tmp_path / "tuned.tflite", {w: new}))
    np.testing.assert_array_equal(np.asarray(m2.params[w]), np.asarray(new.astype(jnp.float32)))


def test_model_call_inside_jax_transforms():
    """``model(x)`` inside the caller's jit / grad / lax.map traces the pure
    apply (fbjax's own jit carries compile options, which JAX refuses on a
    nested jit), equals the plain call, and leaves the model usable."""
    import jax
    import jax.numpy as jnp

    m = fbjax.load(_small_model())
    x = np.random.default_rng(3).random((1, 5, 5, 3), dtype=np.float32)
    ref = np.asarray(m(x))
    # the caller's jit traces Model.apply into another program (XLA's defaults, not fbjax's compile
    # options): each sums the 3*3*3 products and the bias within gamma_28 * (|x| * |w| + |b|) of exact
    # (v * 2.0 and x / 2.0 are exact)
    bound = 2 * gamma(28) * abs_magnitude(m, x)
    assert_within(jax.jit(lambda v: m(v * 2.0))(x / 2.0), ref, bound, "model(x) in the caller's jit")
    g = jax.grad(lambda v: jnp.sum(m(v)))(x)
    g_ref = jax.grad(lambda v: jnp.sum(m.apply(m.params, v)))(x)
    # d sum(y) / dx sums at most 3*3 taps * 4 output channels of w: gamma_36 * (that sum of |w|)
    abs_p = {k: jnp.abs(v) for k, v in m.params.items()}
    g_mag = np.asarray(jax.grad(lambda v: jnp.sum(m.apply(abs_p, v)))(x), np.float64)
    assert_within(g, g_ref, 2 * gamma(36) * g_mag, "grad of model(x) vs grad of apply")
    assert_within(np.asarray(jax.lax.map(m, x[None]))[0], ref, bound, "model under lax.map")
    np.testing.assert_array_equal(np.asarray(m(x)), ref)  # the same call again (same program): no tracer kept


def test_apply_casts_other_float_dtypes_and_grads_flow():
    """bfloat16 training copies of some weights (``trainable(dtype=...)``)
    run against float32 activations (cast to the params' float32): the
    result is the float32 model's up to bfloat16 rounding of those weights,
    and the gradient comes back in bfloat16."""
    import jax
    import jax.numpy as jnp

    m = fbjax.load(_small_model())
    x = np.random.default_rng(4).random((1, 5, 5, 3), dtype=np.float32)
    train, frozen = fbjax.trainable(m.params, include="*", dtype=jnp.bfloat16)
    y = np.asarray(m.apply({**frozen, **train}, x))
    rounded = {k: v.astype(jnp.bfloat16).astype(jnp.float32) for k, v in m.params.items()}
    # the same weight values (cast inside the program vs before it): two programs, each within the
    # float32 bound of the 3*3*3-product-plus-bias sums
    assert_within(y, np.asarray(m.apply(rounded, x)), 2 * gamma(28) * abs_magnitude(m, x, params=rounded),
                  "bfloat16 params vs their float32 values")
    g = jax.grad(lambda t: jnp.sum(m.apply({**frozen, **t}, x)))(train)
    assert all(v.dtype == jnp.bfloat16 for v in g.values())


def test_missing_key_error_names_the_likely_typo():
    m = fbjax.load(_small_model())
    k = next(iter(m.params))
    bad = {(k + "x" if n == k else n): v for n, v in m.params.items()}
    with pytest.raises(fbjax.InputError, match=rf"lacks 1 .*\['{k}x'\] \(a typo\?\)"):
        m.apply(bad, np.zeros((1, 5, 5, 3), np.float32))


def test_save_refuses_float16_overflow(tmp_path):
    """A float16-stored weight beyond 65504 would be written as inf (the
    saved model then outputs NaN): InputError instead, nothing written."""
    rng = np.random.default_rng(0)
    b = TFLiteBuilder()
    x = b.add_input((1, 3), name="x")
    w16 = b.add_tensor(data=rng.standard_normal((4, 3)).astype(np.float16), name="w16")
    w = b.add_tensor((4, 3), name="w")
    y = b.add_tensor((1, 4), name="y")
    b.add_op("DEQUANTIZE", [w16], [w])
    b.add_op("FULLY_CONNECTED", [x, w, -1], [y], options=dict(fused_activation_function="NONE"))
    b.add_output(y)
    m = fbjax.load(b.build())
    (name,) = m.params
    with pytest.raises(fbjax.InputError, match="overflow the file's float16"):
        m.save(tmp_path / "big.tflite", {name: np.asarray(m.params[name]) * 1e6})
    assert not (tmp_path / "big.tflite").exists()


def test_str_input_is_an_input_error_that_says_so():
    """Issue 15: a path passed instead of an array reported 'has shape ()'."""
    m = fbjax.load(_small_model())
    with pytest.raises(fbjax.InputError, match=r"input 0 \('[^']+'\) is a str \('photo.png'\), not an array"):
        m("photo.png")
    with pytest.raises(fbjax.InputError, match=r"has dtype <U1 \(strings or objects\)"):
        m(np.full(m.inputs[0].shape, "a"))


def test_integer_data_for_a_float_input_warns_once():
    """Issue 15: a uint8 0..255 image fed to a float input was cast silently."""
    import warnings

    m = fbjax.load(_small_model())
    spec = m.inputs[0]
    x8 = np.full(spec.shape, 200, np.uint8)
    with pytest.warns(UserWarning, match=r"is float32 but got uint8 data: it is cast as is"):
        y8 = np.asarray(m(x8))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per input and model
        m(x8)
        yf = np.asarray(m(np.full(spec.shape, 200.0, np.float32)))  # float data: no warning
    np.testing.assert_array_equal(y8, yf)  # cast as is: 200 stays 200
