"""Robustness: malformed, hostile and oversized model files.

* the flatbuffer verifier (fbjax/formats/verify.py) and its generated schema
  descriptions;
* semantic checks with messages that name the place in the file;
* the >2 GB layout (buffers after the flatbuffer) loading without a second
  copy of the constants, on a small synthetic file (and a sparse >2 GB one
  where the filesystem supports sparse files, ``-m slow``);
* a model file rewritten or truncated in place under a loaded model
  (nothing fbjax returns keeps a mapping of the file: no SIGBUS);
* no code from model files is executed;
* a bounded mutation-fuzzing run over every format (``FBJAX_FUZZ_CASES``
  cases each, default 40; the long run is ``nox -s fuzz``).
"""

from __future__ import annotations

import json
import mmap
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fbjax
from fbjax import InputError, ModelFormatError, UnsupportedOperatorError
from fbjax.formats import read_model, verify as V
from fbjax.formats.tflite_builder import single_op_model
from fbjax.formats._generated import tflite_generated as T

from conftest import require

ROOT = Path(__file__).resolve().parents[1]
FUZZ = ROOT / "tests" / "fuzz"
sys.path.insert(0, str(FUZZ))

import fuzz_corpus as C  # noqa: E402
import schema_desc  # noqa: E402 (tools/schema_desc.py: the .fbs parser; pytest's pythonpath has tools/)

SINE = C.SHARED_TFLITE / "tflm_sine_float.tflite"
needs_sine = pytest.mark.skipif(not SINE.is_file(), reason=f"needs {SINE}")


# --- helpers ------------------------------------------------------------------

def u32(b, pos):
    return struct.unpack_from("<I", b, pos)[0]


def field_pos(b, table: int, slot: int) -> int:
    """Absolute position of field ``slot`` of the table at ``table`` (0 if absent)."""
    vt = table - struct.unpack_from("<i", b, table)[0]
    vsize = struct.unpack_from("<H", b, vt)[0]
    vo = 4 + 2 * slot
    rel = struct.unpack_from("<H", b, vt + vo)[0] if vo < vsize else 0
    return table + rel if rel else 0


def deref(b, pos):
    return pos + u32(b, pos)


def small_model() -> "T.ModelT":
    """``y = x + w`` (ADD) as an object-API model to corrupt field by field."""
    m = T.ModelT()
    m.version = 3
    m.operatorCodes = [C._opcode(T.BuiltinOperator.ADD)]
    m.buffers = [C._buffer(), C._buffer(np.arange(4, dtype=np.float32))]
    m.subgraphs = [C._subgraph("main", [C._tensor("x", [4]), C._tensor("w", [4], buffer=1), C._tensor("y", [4])],
                               [0], [2], [C._op(0, [0, 1], [2])])]
    return m


def pack(m) -> bytes:
    return C._pack_tflite(m)


def refuse(data, *fragments, fmt=None):
    """Assert loading ``data`` raises ModelFormatError mentioning every fragment."""
    with pytest.raises(ModelFormatError) as e:
        read_model(data, fmt)
    msg = str(e.value)
    for f in fragments:
        assert f in msg, f"{f!r} not in {msg!r}"
    assert "corrupt or truncated" not in msg, msg  # the verifier, not the last-resort handler
    return msg


# --- schema descriptions --------------------------------------------------------

@pytest.mark.parametrize("name", ["tflite", "rten", "stablehlo", "gpu_cl_seed", "gpu_cl_tf25", "gpu_cl_tf27", "gpu_cl_litert", "tflite_metadata"])
def test_schema_description_is_current(name):
    """The committed description equals a fresh parse of schemas/<name>.fbs
    (regenerate with `nox -s schemas`)."""
    import importlib

    desc = schema_desc.parse_fbs((ROOT / "schemas" / f"{name}.fbs").read_text())
    mod = importlib.import_module(f"fbjax.formats._generated.{V.SCHEMAS[name]}")
    for key in ("ROOT", "FILE_IDENTIFIER", "ENUMS", "UNIONS", "STRUCTS", "TABLES"):
        assert getattr(mod, key) == desc[key], key


@pytest.mark.parametrize("name", ["tflite", "rten", "stablehlo", "gpu_cl_seed", "gpu_cl_tf25", "gpu_cl_tf27", "gpu_cl_litert", "tflite_metadata"])
def test_schema_slots_match_flatc_bindings(name):
    """Every field's vtable slot agrees with the accessor flatc generated."""
    src = (ROOT / "fbjax" / "formats" / "_generated" / f"{name}_generated.py").read_text()
    offs = {}
    for m in re.finditer(r"^class (\w+)\(object\):(.*?)(?=^class |\Z)", src, re.S | re.M):
        for mm in re.finditer(r"def (\w+)\(self[^)]*\):\s*\n\s*o = flatbuffers\.number_types\.UOffsetTFlags"
                              r"\.py_type\(self\._tab\.Offset\((\d+)\)\)", m.group(2)):
            offs.setdefault(m.group(1), {})[mm.group(1)] = int(mm.group(2))
    sch = V.schema(name)
    n = 0
    for table, plan in sch.tables.items():
        for f in plan:
            camel = "".join(p[:1].upper() + p[1:] for p in f.name.split("_"))
            assert offs[table][camel] == f.voffset, (table, f.name)
            n += 1
    assert n > 50


def test_parse_fbs_features():
    desc = schema_desc.parse_fbs("""
        namespace a.b; attribute "priority";
        enum E : short { A = -1, B, C = 10 }
        enum F : ubyte (bit_flags) { X, Y }
        union U { T1, Alias: T2 }
        struct S { x: int; y: byte; z: [short:3]; }
        table T1 { a: int (id: 1); b: [S] (id: 0); }
        table T2 { u: U; s: S; old: int (deprecated); r: string (required); e: [E]; f: F = X; }
        root_type T2;
        file_identifier "ABCD";
    """)
    assert desc["ENUMS"]["E"] == ("h", (-1, 0, 10), False)
    assert desc["ENUMS"]["F"] == ("B", (1, 2), True)
    assert desc["UNIONS"]["U"] == {1: "T1", 2: "T2"}
    assert desc["STRUCTS"]["S"][:2] == (12, 4)
    assert desc["TABLES"]["T1"] == (("a", 1, "int", ()), ("b", 0, "[S]", ()))
    assert [(f, s) for f, s, _, _ in desc["TABLES"]["T2"]] == [("u", 1), ("s", 2), ("old", 3), ("r", 4),
                                                              ("e", 5), ("f", 6)]
    assert desc["ROOT"] == "T2" and desc["FILE_IDENTIFIER"] == "ABCD"


# --- the verifier on good files -------------------------------------------------

def test_verifier_accepts_every_seed():
    for name, fmt, data in C.seeds():
        if fmt == "bundle":  # containers (a header flatbuffer plus sections, or a zip): not one flatbuffer
            continue
        if fmt == "bundle_model":  # an LLM bundle's model section: a .tflite
            fmt = "tflite"
        if fmt == "gpu_cl":  # one schema per generation: detect_generation verifies against each
            from fbjax.formats.gpu_cl import detect_generation

            assert detect_generation(data).name in ("seed", "tf2.5", "tf2.7"), name
            continue
        start, size = 0, None
        if fmt == "rten" and data[:4] == b"RTEN":
            _, start, size, _ = V.read_rten_header(data)
        assert V.verify(data, fmt, start=start, size=size) > 0, name


@pytest.mark.parametrize("path", sorted(C.SHARED_TFLITE.glob("*.tflite")) if C.SHARED_TFLITE.is_dir() else [],
                         ids=lambda p: p.stem)
def test_verifier_accepts_real_models(path):
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        assert V.verify(mm, "tflite") > 10
    finally:
        mm.close()


# --- structural refusals ---------------------------------------------------------

@needs_sine
def test_huge_vector_length_is_refused_with_location():
    b = bytearray(SINE.read_bytes())
    root = u32(b, 0)
    vec = deref(b, field_pos(b, root, 4))  # Model.buffers
    b[vec:vec + 4] = struct.pack("<I", 0xFFFFFFFF)
    msg = refuse(bytes(b), f"vector at offset {vec:#x} (Model.buffers) has length 4294967295",
                 "past the end of the 3164-byte file")
    assert msg.startswith("<bytes>: flatbuffer:")


@needs_sine
@pytest.mark.parametrize("cut", [4, 8, 100, 1000, 3000, 3163])
def test_truncated_files_are_refused(cut):
    with pytest.raises(ModelFormatError):
        read_model(SINE.read_bytes()[:cut], "tflite")


@needs_sine
def test_garbage_offsets_are_refused():
    data = SINE.read_bytes()
    root = u32(data, 0)
    sub = field_pos(data, root, 2)  # Model.subgraphs
    b = bytearray(data)
    b[sub:sub + 4] = struct.pack("<I", 0x7FFFFFF0)
    refuse(bytes(b), "(Model.subgraphs) points to", "past the end")
    b = bytearray(data)
    b[sub:sub + 4] = struct.pack("<I", 0)
    refuse(bytes(b), "(Model.subgraphs) is zero")
    b = bytearray(data)  # root table's vtable far outside the file
    b[root:root + 4] = struct.pack("<i", -0x100000)
    refuse(bytes(b), "table Model", "vtable", "outside the 3164-byte file")


def test_vtable_and_field_bounds():
    data = pack(small_model())
    root = u32(data, 0)
    vt = root - struct.unpack_from("<i", data, root)[0]
    b = bytearray(data)
    b[vt:vt + 2] = struct.pack("<H", 3)  # odd vtable size
    refuse(bytes(b), "vtable of Model", "invalid size 3")
    b = bytearray(data)
    b[vt + 2:vt + 4] = struct.pack("<H", 4)  # inline size too small for the fields
    refuse(bytes(b), "lies outside the table's 4-byte inline part")
    b = bytearray(data)
    b[root:root + 4] = struct.pack("<i", struct.unpack_from("<i", data, root)[0] + 1)  # misaligned vtable
    refuse(bytes(b), "misaligned")


def test_unterminated_string_and_required_field():
    m = small_model()
    m.description = "abc"
    data = bytearray(pack(m))
    i = data.index(b"abc\0")
    data[i + 3] = ord("!")
    refuse(bytes(data), "Model.description", "not zero-terminated")
    # rten: Model.graph is (required)
    import flatbuffers
    from fbjax.formats._generated import rten_generated as R

    rm = R.ModelT()
    rm.schemaVersion = 1
    bld = flatbuffers.Builder(64)
    bld.Finish(rm.Pack(bld))
    with pytest.raises(ModelFormatError, match=r"required field Model\.graph is missing"):
        V.verify(bytes(bld.Output()), "rten")


def test_unknown_enum_and_union_values_are_refused():
    m = small_model()
    m.subgraphs[0].tensors[0].type = 100
    refuse(pack(m), "Model.subgraphs[0].tensors[0].type", "unknown TensorType value 100")
    m = small_model()
    m.operatorCodes[0].builtinCode = 4000
    refuse(pack(m), "Model.operator_codes[0].builtin_code", "unknown BuiltinOperator value 4000")
    m = small_model()
    op = m.subgraphs[0].operators[0]
    op.builtinOptionsType, op.builtinOptions = T.BuiltinOptions.AddOptions, T.AddOptionsT()
    data = bytearray(pack(m))
    sg = deref(data, deref(data, field_pos(data, u32(data, 0), 2)) + 4)  # Model.subgraphs[0]
    op0 = deref(data, deref(data, field_pos(data, sg, 3)) + 4)  # .operators[0]
    tpos = field_pos(data, op0, 3)  # .builtin_options_type
    assert data[tpos] == T.BuiltinOptions.AddOptions
    data[tpos] = 250
    refuse(bytes(data), "builtin_options_type", "unknown BuiltinOptions value 250")
    m = small_model()
    m.subgraphs[0].operators[0].builtinOptionsType = T.BuiltinOptions.AddOptions  # and no value
    refuse(pack(m), "union Model.subgraphs[0].operators[0].builtin_options has type AddOptions but no value")


def test_shared_subtables_cannot_blow_up_unpacking():
    """Offsets may point many fields at one table; each visit counts, so a
    file that would unpack exponentially is refused up front."""
    m = small_model()
    m.subgraphs = m.subgraphs * 50  # 50 separate copies
    data = pack(m)
    with V.limits(max_tables=200):
        with pytest.raises(ModelFormatError, match="more than 200 tables and strings"):
            V.verify(data, "tflite")
    assert V.verify(data, "tflite") > 200
    with V.limits(max_depth=1):  # Model > SubGraph > Tensor is depth 2
        with pytest.raises(ModelFormatError, match="nest deeper than 1"):
            V.verify(data, "tflite")


# --- semantic refusals -----------------------------------------------------------

def test_operator_tensor_index_out_of_range():
    m = small_model()
    m.subgraphs[0].operators[0].inputs = [0, 912]
    refuse(pack(m), "subgraph 0, operator 0 (ADD): input 1 refers to tensor 912, but the subgraph has 3 tensors")
    m = small_model()
    m.subgraphs[0].operators[0].outputs = [-5]
    refuse(pack(m), "subgraph 0, operator 0 (ADD): output 0 refers to tensor -5")
    m = small_model()
    m.subgraphs[0].inputs = [-1]
    refuse(pack(m), "subgraph 0: input 0 refers to tensor -1")


def test_opcode_and_buffer_indices():
    m = small_model()
    m.subgraphs[0].operators[0].opcodeIndex = 7
    refuse(pack(m), "subgraph 0, operator 0: opcode index 7 out of range")
    m = small_model()
    m.subgraphs[0].tensors[1].buffer = 9
    refuse(pack(m), "subgraph 0, tensor 1: buffer 9 out of range (the model has 2 buffers)")


def test_tensor_sizes_shapes_and_limits():
    m = small_model()
    m.buffers[1] = C._buffer(np.arange(3, dtype=np.float32))
    refuse(pack(m), "subgraph 0, tensor 1", "holds 12 bytes but shape [4] of float32 needs 16")
    m = small_model()
    m.subgraphs[0].tensors[0].shape = [4, -2]
    refuse(pack(m), "subgraph 0, tensor 0: negative dimension in shape [4, -2]")
    m = small_model()
    m.subgraphs[0].tensors[0].shape = [1 << 20, 1 << 20, 1 << 20]
    refuse(pack(m), "subgraph 0, tensor 0", "1152921504606846976 elements, over the limit")
    m = small_model()
    m.subgraphs[0].tensors[0].shape = [1] * 40
    refuse(pack(m), "rank 40 exceeds the limit of 32")
    # product overflowing int64 must not wrap around to match a small buffer
    m = small_model()
    m.subgraphs[0].tensors[1].shape = [0x7FFFFFFF, 0x7FFFFFFF, 0x7FFFFFFF, 4]
    refuse(pack(m), "subgraph 0, tensor 1", "over the limit")
    with V.limits(max_elements=3):
        refuse(pack(small_model()), "shape [4] has 4 elements, over the limit of 3")


def test_per_channel_quantization_must_match_shape():
    m = small_model()
    q = T.QuantizationParametersT()
    q.scale, q.zeroPoint, q.quantizedDimension = [1.0, 2.0], [0, 0], 3
    m.subgraphs[0].tensors[0].quantization = q
    refuse(pack(m), "subgraph 0, tensor 0: quantized_dimension 3 out of range")


def _while_model(cond: int, body: int, n_extra: int = 2):
    m = small_model()
    wopt = T.WhileOptionsT()
    wopt.condSubgraphIndex, wopt.bodySubgraphIndex = cond, body
    m.operatorCodes.append(C._opcode(T.BuiltinOperator.WHILE))
    sg = m.subgraphs[0]
    sg.operators.append(C._op(1, [2], [2], T.BuiltinOptions.WhileOptions, wopt))
    for k in range(n_extra):
        sub = C._subgraph(f"g{k + 1}", [C._tensor("a", [4]), C._tensor("b", [4])], [0], [1],
                          [C._op(1, [0], [1], T.BuiltinOptions.WhileOptions, wopt)] if k == 1 else
                          [C._op(0, [0, 0], [1])])
        m.subgraphs.append(sub)
    return pack(m)


def test_subgraph_references_in_range_and_acyclic():
    refuse(_while_model(1, 7), "subgraph 0, operator 1 (WHILE): body_subgraph_index refers to subgraph 7, "
                               "but the model has 3 subgraphs")
    # subgraph 2 runs a WHILE whose body is subgraph 2 itself
    refuse(_while_model(1, 2), "subgraph 2, operator 0 (WHILE): body_subgraph_index calls subgraph 2",
           "cycle 2 -> 2")
    # the real control-flow seed (WHILE 1/2, IF 3/3) passes
    ir = read_model(C.tflite_control_flow())
    assert len(ir.graphs) == 4


def test_check_call_graph_unit():
    V.check_call_graph(3, [(0, 1, "a"), (1, 2, "b"), (0, 2, "c")])
    with pytest.raises(ModelFormatError, match=r"cycle 0 -> 1 -> 0"):
        V.check_call_graph(2, [(0, 1, "x"), (1, 0, "y")])
    with pytest.raises(ModelFormatError, match="refers to subgraph -1"):
        V.check_call_graph(2, [(0, -1, "x")])


def test_sparse_metadata_cannot_allocate_unbounded():
    m = T.ModelT.InitFromObj(T.Model.GetRootAs(C.tflite_control_flow(), 0))
    t = m.subgraphs[0].tensors[8]
    t.sparsity.dimMetadata[0].denseSize = 1 << 30
    refuse(pack(m), "sparsity: dense_size 1073741824 of level 0 expands past the 4 elements")
    m = T.ModelT.InitFromObj(T.Model.GetRootAs(C.tflite_control_flow(), 0))
    m.subgraphs[0].tensors[8].shape = [40000, 40000]  # claims 6 GB of float32 from a few bytes
    refuse(pack(m), "sparsity: densifying shape [40000, 40000] needs 1600000000 elements, over the limit")


def test_rten_header_checks():
    assert V.read_rten_header(b"\0" * 64) == (1, 0, 64, 0)
    hdr = struct.pack("<4sIQQQ", b"RTEN", 2, 32, 1 << 40, 0)
    with pytest.raises(ModelFormatError, match=r"model at bytes 32\.\.1099511627808 lies outside the 64-byte file"):
        V.read_rten_header(hdr + b"\0" * 32)
    v2 = [d for n, f, d in C.seeds() if f == "rten" and d[:4] == b"RTEN"]
    if v2:
        b = bytearray(v2[0])
        b[16:24] = struct.pack("<Q", len(b))  # model length past the end
        with pytest.raises(ModelFormatError):
            read_model(bytes(b), "rten")


def test_flexbuffer_custom_options_are_bounded():
    from flatbuffers import flexbuffers

    good = flexbuffers.Dumps({"a": [1, 2, 3], "s": "x", "m": {"f": [1.5, 2.5]}, "v": ["k", 1, [2]], "b": b"xy"})
    V.check_flexbuffer(good)
    # a typed vector whose size prefix claims more elements than there are bytes
    bad = bytearray(flexbuffers.Dumps([1, 2, 3]))
    assert bad[0] == 3
    bad[0] = 200
    with pytest.raises(ModelFormatError, match="200 elements, past the end"):
        V.check_flexbuffer(bytes(bad))
    wide = bytearray(flexbuffers.Dumps([1 << 40, 2, 3]))  # 8-byte size prefix
    wide[0:8] = (1 << 62).to_bytes(8, "little")
    with pytest.raises(ModelFormatError):
        V.check_flexbuffer(bytes(wide))
    with V.limits(max_flex_elements=2):
        with pytest.raises(ModelFormatError, match="more than 2 values"):
            V.check_flexbuffer(good)
    # the decoder only runs on options that pass; undecodable ones stay raw bytes
    from fbjax.formats.tflite import decode_custom_options

    assert decode_custom_options("X", b"\x01\x02\x03\x04\xff\x7f\x2a\x02") == {
        "custom_options": b"\x01\x02\x03\x04\xff\x7f\x2a\x02"}
    assert decode_custom_options("X", flexbuffers.Dumps({"s": "x", "a": [1, 2]}))["s"] == "x"


# --- large-model layout -----------------------------------------------------------

def _is_view_on(arr: np.ndarray, raw) -> bool:
    return np.shares_memory(arr, np.frombuffer(raw, np.uint8))


def test_offset_size_buffers_load_zero_copy(tmp_path):
    w = np.linspace(-1, 1, 64, dtype=np.float32)
    p = tmp_path / "large_layout.tflite"
    p.write_bytes(C.tflite_large_layout(w))
    ir = read_model(p)
    wv = ir.graphs[0].values[1]
    np.testing.assert_array_equal(wv.data, w)
    assert isinstance(ir.buffer, bytes), "a path is read into a private copy, never mapped (issue 15 item 5)"
    assert _is_view_on(wv.data, ir.buffer), "weights were copied a second time instead of viewed on the file's bytes"
    model = fbjax.load(p)
    np.testing.assert_allclose(np.asarray(model(np.ones(64, np.float32))), w + 1)


def test_offset_size_buffer_past_the_end(tmp_path):
    data = C.tflite_large_layout()
    refuse(data[:-8], "subgraph 0, tensor 1: buffer 1 spans bytes", "past the end of the file")


@pytest.mark.slow  # reads 2 GB into memory (the file is no longer mapped: see test_file_rewritten_in_place)
def test_sparse_file_over_2gb(tmp_path):
    """A real >2 GB file, written sparse: only a few KB hit the disk."""
    at = (1 << 31) + 4096
    fb, at, tail = C.tflite_large_layout_parts(data_at=at)
    p = tmp_path / "over_2gb.tflite"
    with open(p, "wb") as f:
        f.write(fb)
        f.seek(at)
        f.write(tail)
    st = os.stat(p)
    if st.st_blocks * 512 > 64 << 20:
        pytest.skip("filesystem does not keep sparse files sparse")
    ir = read_model(p)
    w = ir.graphs[0].values[1].data
    np.testing.assert_array_equal(w, np.arange(4, dtype=np.float32))
    assert len(ir.buffer) > 1 << 31 and _is_view_on(w, ir.buffer)


def test_rten_v2_constants_are_views(tmp_path):
    require("rten_convert", "writes the v2 .rten seeds")
    v2 = [d for n, f, d in C.seeds() if f == "rten" and d[:4] == b"RTEN"]
    assert v2, "the fuzz corpus has no v2 .rten seed (rten-convert writes them)"
    p = tmp_path / "m.rten"
    p.write_bytes(v2[0])
    ir = read_model(p)
    big = [v for g in ir.graphs for v in g.values if v.data is not None and v.data.size > 16]
    assert big and all(_is_view_on(v.data, ir.buffer) for v in big if v.data.ctypes.data % v.data.itemsize == 0)


_REWRITE = r"""
import os, sys, numpy as np, fbjax, fbjax.reference
from fbjax.formats.tflite_builder import single_op_model
path = sys.argv[1]
w = np.linspace(-1, 1, 4096, dtype=np.float32)
def write(k):
    with open(path, "wb") as f:   # in place: truncates, then writes, the same inode
        f.write(single_op_model("ADD", [(4096,), w * k]))
write(1)
model = fbjax.load(path)
for cut in ("truncate", "empty", "zeros"):
    with open(path, "r+b") as f:
        size = os.fstat(f.fileno()).st_size
        if cut == "zeros":
            f.write(bytes(size))
        else:
            f.truncate(size // 3 if cut == "truncate" else 0)
    x = np.ones(4096, np.float32)
    np.testing.assert_array_equal(np.asarray(model(x)), x + w)
    np.testing.assert_array_equal(fbjax.reference.run(model, x)[0], x + w)
    again = fbjax.load(model.save())   # Model.save rewrites the bytes it read, not the changed file
    np.testing.assert_array_equal(np.asarray(again(x)), x + w)
models = []
for k in range(1, 6):   # a series of versions written to the same path, all kept alive
    write(k)
    models.append(fbjax.load(path))
    np.testing.assert_array_equal(fbjax.reference.run(models[0], x)[0], x + w)
for k, m in enumerate(models, 1):
    np.testing.assert_array_equal(np.asarray(m(x)), x + k * w)
print("ok")
"""


def test_file_rewritten_in_place_under_a_loaded_model(tmp_path):
    """Issue 15 item 5: a file truncated, emptied or overwritten in place
    after loading (hot reload, a tool writing the next version to the same
    path) killed the process with SIGBUS on the next call, reference run or
    save, because constants were views on a mapping of the file. Run in a
    subprocess so that a SIGBUS fails this test instead of killing pytest."""
    proc = subprocess.run([sys.executable, "-c", _REWRITE, str(tmp_path / "m.tflite")],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), (
        f"exit {proc.returncode} (-7 is SIGBUS)\n{proc.stderr[-3000:]}")


def test_file_changing_size_while_read(tmp_path, monkeypatch):
    """A file that another process is still writing: ModelFormatError that
    says so, not a parse of half a file."""
    from fbjax.formats import _mmap

    p = tmp_path / "m.tflite"
    p.write_bytes(single_op_model("ADD", [(4,), np.ones(4, np.float32)]))
    real_fstat = os.fstat
    monkeypatch.setattr(_mmap.os, "fstat", lambda fd: os.stat_result((0,) * 6 + (real_fstat(fd).st_size + 100,) + (0,) * 3))
    with pytest.raises(ModelFormatError, match="changed size while it was read"):
        read_model(p)


# --- nothing from the file is executed --------------------------------------------

def test_no_pickle_or_eval_in_readers():
    pat = re.compile(r"\b(pickle|marshal|shelve|dill)\b|(?<![\w.])(eval|exec)\(|allow_pickle\s*=\s*True|__import__\(")
    hits = []
    for path in (ROOT / "fbjax").rglob("*.py"):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if pat.search(code):
                hits.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not hits, "\n".join(hits)


def test_custom_op_names_only_dispatch_to_registered_handlers():
    m = small_model()
    m.operatorCodes.append(C._opcode(T.BuiltinOperator.CUSTOM, "__import__('os').system('false')"))
    m.subgraphs[0].operators.append(C._op(1, [2], [2]))
    ir = read_model(pack(m))
    assert ir.graphs[0].nodes[1].op_name == "__import__('os').system('false')"
    with pytest.raises(UnsupportedOperatorError, match="tflite.custom:__import__"):
        fbjax.load(pack(m))


@needs_sine
def test_input_errors_name_the_input_and_spec():
    model = fbjax.load(SINE)
    with pytest.raises(InputError, match=r"input 0 \('[^']+'\) has shape \(3, 3\), expected TensorSpec"):
        model(np.zeros((3, 3), np.float32))
    with pytest.raises(InputError, match=r"takes 1 input"):
        model()


# --- bounded fuzzing ------------------------------------------------------------------

def test_fuzz_watchdogs_report_hangs_and_crashes(tmp_path):
    """A case stuck in Python (alarm), one stuck where signals cannot reach
    (the parent kills the worker) and one that aborts the process are all
    reported with their case numbers; the run goes on after each. Bounded by
    work (8 cases), not time: worker start-ups on a loaded machine take
    seconds each, and a 10 s budget ended before case 6 there."""
    out = tmp_path / "fuzz.json"
    env = dict(os.environ, FBJAX_FUZZ_INJECT="hang:2,abort:4,block:6")
    cmd = [sys.executable, str(FUZZ / "fuzz_harness.py"), "--seconds", "100", "--max-cases", "8", "--formats", "stablehlo",
           "--case-timeout", "2", "--json", str(out), "--crash-dir", str(tmp_path / "crashes")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert proc.returncode == 1, proc.stderr[-2000:]
    rep = json.loads(out.read_text())["formats"]["stablehlo"]
    found = {c["case"]: c["detail"] for c in rep["crashes"]}
    assert found[2].startswith("interrupted after 2.0 s")
    assert found[4].startswith("worker exited -6")
    assert found[6].startswith("worker timed out")
    assert rep["counts"]["hang"] == 2 and rep["counts"]["crash"] == 1
    assert rep["cases"] == 8
    assert sorted(p.name for p in (tmp_path / "crashes").iterdir()) == ["stablehlo-0-4.bin", "stablehlo-0-6.bin"]


def test_fuzz_every_format(tmp_path):
    """Mutated files of every format, bundles included, loaded with
    ``fbjax.load`` (an LLM bundle that loads then generates 2 tokens; the
    ``bundle_model`` cases mutate only a bundle's model section): each
    outcome is a load, ModelFormatError, UnsupportedOperatorError or
    InputError within the format's case timeout (10 s; bundles 60 s: they
    compile and run prefill and decode) -- hangs are caught by watchdogs. A
    fixed number of cases per format (``FBJAX_FUZZ_CASES``, default 40;
    ``bundle_model``: ``FBJAX_FUZZ_MODEL_CASES``, default 12, as most of its
    cases compile), not a time share: on a loaded machine a worker's
    start-up (JAX, the corpus) took most of a 12 s share and left too few
    cases, so the count measured the machine. ``FBJAX_FUZZ_SECONDS``
    (default 600) only caps the run; each format must reach its count
    within its share."""
    cases = int(os.environ.get("FBJAX_FUZZ_CASES", "40"))
    model_cases = int(os.environ.get("FBJAX_FUZZ_MODEL_CASES", "12"))
    seconds = float(os.environ.get("FBJAX_FUZZ_SECONDS", "600"))
    out = tmp_path / "fuzz.json"
    cmd = [sys.executable, str(FUZZ / "fuzz_harness.py"), "--seconds", str(seconds), "--max-cases", str(cases),
           "--format-cases", f"bundle_model={model_cases}",
           "--json", str(out), "--crash-dir", str(tmp_path / "crashes")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120, cwd=ROOT)
    assert out.exists(), proc.stderr[-3000:]
    rep = json.loads(out.read_text())
    formats = {f for _, f, _ in C.seeds()}
    assert set(rep["formats"]) == formats
    problems = [(f, c) for f, r in rep["formats"].items() for c in r["crashes"]]
    assert rep["crashes_and_hangs"] == 0 and not problems, json.dumps(problems, indent=1)[:4000]
    for f, r in rep["formats"].items():
        assert r["cases"] == (model_cases if f == "bundle_model" else cases), (f, r)
        assert r["case_timeout"] == (60 if f.startswith("bundle") else 10), (f, r["case_timeout"])
        assert r["max_case_s"] < r["case_timeout"], (f, r["max_case_s"])


def test_dag_sharing_is_refused_before_unpacking():
    """Every Model.subgraphs entry aimed at one subgraph: a tiny file that
    would unpack into more tables than it has offsets for."""
    m = small_model()
    m.subgraphs[0].tensors = [C._tensor(f"t{i}", [4]) for i in range(200)]
    m.subgraphs[0].operators = []
    m.subgraphs += [C._subgraph("", [], [], [], []) for _ in range(59)]
    data = bytearray(pack(m))
    root = u32(data, 0)
    vec = deref(data, field_pos(data, root, 2))
    first = vec + 4 + u32(data, vec + 4)
    for i in range(1, 60):  # aim every element at subgraph 0
        slot = vec + 4 + 4 * i
        data[slot:slot + 4] = struct.pack("<I", first - slot)
    refuse(bytes(data), "tables and strings to unpack", "sub-tables are shared")


def test_call_op_subgraph_reference_checked():
    m = small_model()
    copt = T.CallOptionsT()
    copt.subgraph = 0  # main calls itself
    m.operatorCodes.append(C._opcode(T.BuiltinOperator.CALL))
    m.subgraphs[0].operators.append(C._op(1, [2], [2], T.BuiltinOptions.CallOptions, copt))
    refuse(pack(m), "subgraph 0, operator 1 (CALL): subgraph calls subgraph 0", "cycle 0 -> 0")


def test_rten_and_stablehlo_readers_verify_first():
    """The same structural check guards the RTen and StableHLO readers."""
    v2 = [d for n, f, d in C.seeds() if n == "rten_convnet_v2"]
    if v2:
        b = bytearray(v2[0])
        _, moff, _, _ = V.read_rten_header(b)
        root = moff + u32(b, moff)
        graph = deref(b, field_pos(b, root, 1))  # Model.graph
        nodes = deref(b, field_pos(b, graph, 0))  # Graph.nodes
        b[nodes:nodes + 4] = struct.pack("<I", 0x40000000)
        refuse(bytes(b), f"vector at offset {nodes - moff:#x} (Model.graph.nodes) has length 1073741824",
               fmt="rten")
    b = bytearray(C.stablehlo_reduce())
    root = u32(b, 0)
    codes = deref(b, field_pos(b, root, 1))  # Model.operator_codes
    b[codes:codes + 4] = struct.pack("<I", 0xFFFFFFFF)
    refuse(bytes(b), "(Model.operator_codes) has length 4294967295", fmt="stablehlo")
    b = bytearray(C.stablehlo_reduce())
    i = b.index(struct.pack("<iii", 7, 1, 8))  # operator_codes: MULTIPLY, ADD, REDUCE
    b[i + 4:i + 8] = struct.pack("<i", 99)
    refuse(bytes(b), "Model.operator_codes", "unknown OperatorCode value 99", fmt="stablehlo")
