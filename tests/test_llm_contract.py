"""Hostile LLM bundles that read cleanly (issue 35, "a hostile bundle that loads"): every signature is traced at
load (fbjax.signature.trace_signatures), the bundle's contract with its model is checked at load
(fbjax.llm_contract), and a lowering's error met at call time is fbjax's own (fbjax.lower.build.file_error).

The bundles are the committed fixtures with their model section edited through the TFLite object API
(``tflite_generated.ModelT``) and packed back with ``fbjax.formats.llm_container.write_bundle``; before these
checks, each loaded and then failed inside ``generate`` with ``KeyError``, ``InputError`` or a raw ``TypeError``.
"""

from __future__ import annotations

from pathlib import Path

import flatbuffers
import numpy as np
import pytest

import fbjax
from fbjax.errors import ModelFormatError
from fbjax.formats import llm_container as fmt
from fbjax.formats._generated import tflite_generated as T
from fbjax.formats.tflite_builder import TFLiteBuilder

DATA = Path(__file__).resolve().parent / "data" / "llm_bundles"
F32, I32 = np.float32, np.int32


def _edited(name: str, edit) -> bytes:
    """Bundle ``name`` with ``edit(ModelT)`` applied to its model section."""
    b = fmt.read_bundle(DATA / name)
    m = T.ModelT.InitFromObj(T.Model.GetRootAs(b.model.data, 0))
    edit(m)
    fb = flatbuffers.Builder(len(b.model.data) + 4096)
    fb.Finish(m.Pack(fb), file_identifier=b"TFL3")
    return fmt.write_bundle(b, bytes(fb.Output()))


def _sig(m, key: str):
    return next(s for s in m.signatureDefs if s.signatureKey.decode() == key)


def _entry(maps, name: str):
    return next(t for t in maps if t.name.decode() == name)


def _refused(data: bytes, match: str) -> str:
    with pytest.raises(ModelFormatError, match=match) as info:
        fbjax.load(data)
    return str(info.value)


def test_fixture_edit_round_trips():
    """The object-API repack alone changes nothing that matters: the bundle loads and generates."""
    b = fbjax.load(_edited("gemma_hf.litertlm", lambda m: None))
    assert len(b.generate("hi", max_new_tokens=2, return_tokens=True).tokens) == 2


def test_kv_cache_output_name_corrupted():
    """decode's output ``kv_cache_k_0`` renamed (one byte): the decode loop looked it up by name (KeyError)."""
    def edit(m):
        _entry(_sig(m, "decode").outputs, "kv_cache_k_0").name = b"kv_cache_k_O"
    msg = _refused(_edited("llama_sp.litertlm", edit),
                   r"section 0 \(TFLiteModel\): signature 'decode': KV cache input 'kv_cache_k_0' has no output of "
                   r"that name")
    assert "kv_cache_k_O" in msg  # the outputs it has are listed


def test_kv_cache_input_without_its_pair():
    """A cache renamed in both the input and the output list of prefill: K without its V."""
    def edit(m):
        s = _sig(m, "prefill_16")
        for maps in (s.inputs, s.outputs):
            _entry(maps, "kv_cache_v_1").name = b"kv_cache_v_7"
    _refused(_edited("llama_sp.litertlm", edit),
             r"signature 'prefill_16': KV cache input 'kv_cache_k_1' has no 'kv_cache_v_1' beside it")


def test_kv_cache_output_of_another_shape():
    """decode returns V where K goes (gemma's transposed cache: K [1, 1, 64, 32], V [1, 1, 32, 64]): the next
    call would be fed a cache of another shape (an InputError at the second decode step)."""
    def edit(m):
        outs = _sig(m, "decode").outputs
        k, v = _entry(outs, "kv_cache_k_0"), _entry(outs, "kv_cache_v_0")
        k.tensorIndex, v.tensorIndex = v.tensorIndex, k.tensorIndex
    _refused(_edited("gemma_hf.litertlm", edit),
             r"signature 'decode': KV cache output 'kv_cache_k_0' is float32\[1, 1, 32, 64\], its input "
             r"float32\[1, 1, 64, 32\]")


def test_token_input_of_a_float_dtype():
    """decode's ``tokens`` input re-typed float32 (the EMBEDDING_LOOKUP / GATHER reading it casts nothing): a token
    id is an integer; refused at load, whichever check sees it first, never at generate."""
    def edit(m):
        s = _sig(m, "decode")
        t = _entry(s.inputs, "tokens").tensorIndex
        m.subgraphs[s.subgraphIndex].tensors[t].type = T.TensorType.FLOAT32
    msg = _refused(_edited("llama_sp.litertlm", edit), r"signature 'decode'")
    assert "tokens" in msg or "cannot be lowered" in msg, msg


def test_decode_mask_of_an_int_dtype():
    """decode's attention ``mask`` re-typed int32 (the lowering adds it to the scores all the same): the loop
    builds the mask from the dtype's lowest float, which an int dtype has not."""
    def edit(m):
        s = _sig(m, "decode")
        t = _entry(s.inputs, "mask").tensorIndex
        m.subgraphs[s.subgraphIndex].tensors[t].type = T.TensorType.INT32
    _refused(_edited("gemma_hf.litertlm", edit),
             r"signature 'decode': input 'mask' is int32\[1, 1, 1, 64\]; an attention mask is float")


def test_decode_operator_without_its_operand_refused_by_the_load_time_trace():
    """A MUL of the decode subgraph left with one operand: load traced the main graph (prefill) only, so this
    was a raw ``TypeError`` (``MUL() missing 1 required positional argument: 'b'``) at the first
    ``generate``; now load's trace of decode names the signature and the node."""
    def edit(m):
        op = m.subgraphs[1].operators[5]
        assert len(op.inputs) == 2
        op.inputs = list(op.inputs[:1])
    _refused(_edited("gemma_hf.litertlm", edit),
             r"section 0 \(TFLiteModel\): signature 'decode' \(subgraph 1\): subgraph 1, operator 5: MUL \(operands "
             r"float32\[1, 1, 1\]\) cannot be lowered: MUL\(\) missing 1 required positional argument: 'b'")


# --- any multi-signature file, and calls ----------------------------------------------------------------

def _mul_of_float_and_int(b: TFLiteBuilder, shape_signature=None):
    """STABLEHLO_MULTIPLY of a float32 input by an int32 constant (StableHLO forbids mixed dtypes:
    ``jax.lax.mul`` raises TypeError) in the builder's current subgraph; returns (input, output)."""
    x = b.add_input((2, 4), F32, name="x", shape_signature=shape_signature)
    c = b.add_constant(np.arange(4, dtype=I32).reshape(1, 4), name="c")
    o = b.add_tensor((2, 4), F32, name="y", shape_signature=shape_signature)
    b.add_op("STABLEHLO_MULTIPLY", [x, c], [o])
    b.add_output(o)
    return x, o


def test_second_signature_traced_at_load():
    """A file whose second signature (its own subgraph) multiplies float32 by int32: load refuses it naming
    the signature and the node (before: it loaded, and calling the signature raised JAX's TypeError)."""
    b = TFLiteBuilder()
    x = b.add_input((2, 4), F32, name="x")
    o = b.add_tensor((2, 4), F32, name="y")
    b.add_op("ABS", [x], [o])
    b.add_output(o)
    b.add_signature("ok", {"x": x}, {"y": o})
    b.add_subgraph("bad")
    x1, o1 = _mul_of_float_and_int(b)
    b.add_signature("bad", {"x": x1}, {"y": o1}, subgraph=1)
    with pytest.raises(ModelFormatError, match=r"signature 'bad' \(subgraph 1\): subgraph 1, operator 0 "
                                               r"\(STABLEHLO_MULTIPLY\): stablehlo.multiply \(operands "
                                               r"float32\[2, 4\], int32\[1, 4\]\) cannot be lowered"):
        fbjax.load(b.build())


def test_lowering_error_met_at_call_time_is_a_format_error():
    """A dynamic input dimension: nothing to trace at load, so the mixed-dtype multiply is met at the first
    call; with the file's own dtypes that is a ModelFormatError naming the node (was JAX's raw TypeError). A
    caller tracing ``apply`` with float64 operands of its own still gets JAX's TypeError (test_load_checks)."""
    b = TFLiteBuilder()
    _mul_of_float_and_int(b, shape_signature=(-1, 4))
    m = fbjax.load(b.build())
    assert m.inputs[0].shape == (None, 4)
    with pytest.raises(ModelFormatError, match=r"subgraph 0, operator 0 \(STABLEHLO_MULTIPLY\): stablehlo.multiply "
                                               r"\(operands float32\[3, 4\], int32\[1, 4\]\) cannot be lowered: "
                                               r"lax.mul requires arguments to have the same dtypes, got float32, "
                                               r"int32. .*The file contradicts the op's rules") as info:
        m(np.ones((3, 4), F32))
    assert "----" not in str(info.value)  # JAX's note on its filtered traceback frames is left out


def test_signature_without_a_key():
    """A SignatureDef whose signature_key is missing (a fuzz find: the LLM loop then died on ``None.startswith``)
    is refused by the reader."""
    b = TFLiteBuilder()
    x = b.add_input((2, 4), F32, name="x")
    o = b.add_tensor((2, 4), F32, name="y")
    b.add_op("ABS", [x], [o])
    b.add_output(o)
    b.add_signature(None, {"x": x}, {"y": o})
    with pytest.raises(ModelFormatError, match=r"signature_defs\[0\] has no signature_key"):
        fbjax.load(b.build())
