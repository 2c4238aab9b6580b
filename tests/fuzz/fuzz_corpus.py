"""Seed models for the robustness fuzzer: real files plus small synthetic ones.

Every seed is ``(name, format, bytes)``. The synthetic models exercise parts
of the file formats the small real models do not: TFLite control flow
(WHILE/IF subgraph references), signature defs, per-channel quantization,
sparse constants, flexbuffer custom options and the >2 GB layout (buffers
stored after the flatbuffer via ``offset``/``size``); RTen v1 and v2 files
written by rten-convert, and the ``onnx`` wheel's light models converted by
it (whole networks whose weights are constant subgraphs --
``ConstantOfShape``, ``Expand``, ``Tile`` -- computed at load: a flipped bit
there asks for terabytes); StableHLO flatbuffers (a REDUCE body, a
convolution, and programs written by ``fbjax.export.to_stablehlo_flatbuffer``);
TFLite GPU delegate ``.bin`` files (the seed, TF 2.5 and TF 2.7 generations);
bundles (``.litertlm``, LLM and vision ``.task``), and the model sections of
LLM bundles (format ``bundle_model``: the mutated model is packed back into
its bundle, :func:`repack`, so the container stays valid and the model is
what the mutations hit).
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

import flatbuffers
import numpy as np

from fbjax.formats._generated import gpu_cl_tf25_generated as G25
from fbjax.formats._generated import gpu_cl_tf27_generated as G27
from fbjax.formats._generated import stablehlo_generated as S
from fbjax.formats._generated import tflite_generated as T

SHARED_TFLITE = Path(__file__).resolve().parents[3] / "shared" / "models" / "tflite"
#: small real models (fast enough to mutate thousands of times)
REAL_TFLITE = ("tflm_sine_float.tflite", "mediapipe_hand_recrop.tflite")
SHARED_GPU_CL = SHARED_TFLITE.parent / "tflite-gpu-cl"
#: TFLite GPU delegate .bin files: TF 2.5 generation (BUFFER and IMAGE_BUFFER storage) and a seed-generation copy
REAL_GPU_CL = ("tflm_sine_float.F32.BUFFER.bin", "mediapipe_hand_recrop.F32.API.bin",
               "seedgen/tflm_sine_float.F32.BUFFER.seed.bin")


# --- TFLite -----------------------------------------------------------------

def _tensor(name, shape, ttype=T.TensorType.FLOAT32, buffer=0, quant=None, sparsity=None, signature=None):
    t = T.TensorT()
    t.name = name
    t.shape = list(shape)
    t.type = ttype
    t.buffer = buffer
    t.quantization = quant
    t.sparsity = sparsity
    if signature is not None:
        t.shapeSignature = list(signature)
    return t


def _op(opcode, inputs, outputs, opt_type=0, opts=None, custom=None):
    o = T.OperatorT()
    o.opcodeIndex = opcode
    o.inputs = list(inputs)
    o.outputs = list(outputs)
    o.builtinOptionsType = opt_type
    o.builtinOptions = opts
    if custom is not None:
        o.customOptions = np.frombuffer(custom, np.uint8)
    return o


def _subgraph(name, tensors, inputs, outputs, ops):
    sg = T.SubGraphT()
    sg.name = name
    sg.tensors = tensors
    sg.inputs = list(inputs)
    sg.outputs = list(outputs)
    sg.operators = ops
    return sg


def _opcode(code, custom=None):
    oc = T.OperatorCodeT()
    oc.builtinCode = code
    oc.deprecatedBuiltinCode = min(code, T.BuiltinOperator.PLACEHOLDER_FOR_GREATER_OP_CODES)
    oc.version = 1
    if custom is not None:
        oc.customCode = custom
    return oc


def _buffer(data=None, offset=0, size=0):
    b = T.BufferT()
    if data is not None:
        b.data = np.frombuffer(np.ascontiguousarray(data).tobytes(), np.uint8)
    b.offset = offset
    b.size = size
    return b


def _pack_tflite(m: "T.ModelT") -> bytes:
    b = flatbuffers.Builder(1024)
    b.Finish(m.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def tflite_control_flow() -> bytes:
    """WHILE (cond 1, body 2) + IF (then 3, else 3) + CUSTOM op + sparse and
    per-channel quantized constants + a signature def."""
    from flatbuffers import flexbuffers

    BO = T.BuiltinOperator
    opcodes = [_opcode(BO.ADD), _opcode(BO.LESS), _opcode(BO.WHILE), _opcode(BO.IF),
               _opcode(BO.CUSTOM, "FbjaxFuzzOp"), _opcode(BO.DEQUANTIZE)]
    buffers = [_buffer(), _buffer(np.int32(1)), _buffer(np.int32(3)),
               _buffer(np.arange(4, dtype=np.float32)),
               _buffer(np.array([1, 2, 3, 4], np.int8)),
               _buffer(np.array([1.0, 2.0], np.float32))]
    q = T.QuantizationParametersT()
    q.scale = [0.5, 0.25]
    q.zeroPoint = [0, 0]
    q.quantizedDimension = 0
    sp = T.SparsityParametersT()
    sp.traversalOrder = [0, 1]
    d0 = T.DimensionMetadataT()
    d0.format = T.DimensionType.DENSE
    d0.denseSize = 2
    d1 = T.DimensionMetadataT()
    d1.format = T.DimensionType.SPARSE_CSR
    seg = T.Int32VectorT()
    seg.values = [0, 1, 2]
    idx = T.Int32VectorT()
    idx.values = [0, 1]
    d1.arraySegmentsType = T.SparseIndexVector.Int32Vector
    d1.arraySegments = seg
    d1.arrayIndicesType = T.SparseIndexVector.Int32Vector
    d1.arrayIndices = idx
    sp.dimMetadata = [d0, d1]

    wopt = T.WhileOptionsT()
    wopt.condSubgraphIndex, wopt.bodySubgraphIndex = 1, 2
    iopt = T.IfOptionsT()
    iopt.thenSubgraphIndex, iopt.elseSubgraphIndex = 3, 3
    custom = flexbuffers.Dumps({"alpha": 0.5, "axes": [1, 2], "name": "x", "nested": {"k": [1.5, 2.5]}})
    main = _subgraph("main", [
        _tensor("i", [], T.TensorType.INT32),  # 0
        _tensor("x", [1, 4], signature=[-1, 4]),  # 1
        _tensor("i_out", [], T.TensorType.INT32),  # 2
        _tensor("x_out", [1, 4]),  # 3
        _tensor("bias", [4], buffer=3),  # 4
        _tensor("y", [1, 4]),  # 5
        _tensor("qw", [2, 2], T.TensorType.INT8, buffer=4, quant=q),  # 6
        _tensor("w", [2, 2], T.TensorType.FLOAT32),  # 7
        _tensor("sparse", [2, 2], buffer=5, sparsity=sp),  # 8
        _tensor("cond", [], T.TensorType.BOOL),  # 9
        _tensor("z", [1, 4]),  # 10
        _tensor("c", [1, 4]),  # 11
    ], [0, 1, 9], [5, 7, 10, 11], [
        _op(2, [0, 1], [2, 3], T.BuiltinOptions.WhileOptions, wopt),
        _op(0, [3, 4], [5]),
        _op(5, [6], [7]),
        _op(3, [9, 5], [10], T.BuiltinOptions.IfOptions, iopt),
        _op(4, [10, 8], [11], custom=custom),
    ])
    cond = _subgraph("cond", [_tensor("i", [], T.TensorType.INT32), _tensor("x", [1, 4]),
                              _tensor("three", [], T.TensorType.INT32, buffer=2),
                              _tensor("lt", [], T.TensorType.BOOL)],
                     [0, 1], [3], [_op(1, [0, 2], [3])])
    body = _subgraph("body", [_tensor("i", [], T.TensorType.INT32), _tensor("x", [1, 4]),
                              _tensor("one", [], T.TensorType.INT32, buffer=1),
                              _tensor("i1", [], T.TensorType.INT32), _tensor("x2", [1, 4])],
                     [0, 1], [3, 4], [_op(0, [0, 2], [3]), _op(0, [1, 1], [4])])
    branch = _subgraph("branch", [_tensor("x", [1, 4]), _tensor("x2", [1, 4])],
                       [0], [1], [_op(0, [0, 0], [1])])
    sig = T.SignatureDefT()
    sig.signatureKey = "serving_default"
    sig.subgraphIndex = 0
    tm = T.TensorMapT()
    tm.name, tm.tensorIndex = "x", 1
    out = T.TensorMapT()
    out.name, out.tensorIndex = "y", 5
    sig.inputs, sig.outputs = [tm], [out]
    m = T.ModelT()
    m.version = 3
    m.description = "fbjax fuzz seed: control flow"
    m.operatorCodes = opcodes
    m.subgraphs = [main, cond, body, branch]
    m.buffers = buffers
    m.signatureDefs = [sig]
    return _pack_tflite(m)


def tflite_large_layout(weights: np.ndarray | None = None, *, data_at: int | None = None) -> bytes:
    """The bytes of :func:`tflite_large_layout_parts` joined (zeros in between)."""
    fb, at, tail = tflite_large_layout_parts(weights, data_at=data_at)
    return fb + b"\0" * (at - len(fb)) + tail


def tflite_large_layout_parts(weights: np.ndarray | None = None, *, data_at: int | None = None):
    """A model laid out like a >2 GB file: its constant's bytes follow the
    flatbuffer, referenced by ``Buffer.offset``/``size`` (small here).

    ``y = x + w`` with ``w`` float32 ``[4]`` (or ``weights``). ``data_at``
    forces where the data starts (default: 64-aligned after the flatbuffer).

    Returns:
        ``(flatbuffer bytes, data offset, data bytes)``.
    """
    w = np.arange(4, dtype=np.float32) if weights is None else np.ascontiguousarray(weights, np.float32)

    def build(offset: int) -> bytes:
        m = T.ModelT()
        m.version = 3
        m.operatorCodes = [_opcode(T.BuiltinOperator.ADD)]
        m.buffers = [_buffer(), _buffer(offset=offset, size=w.nbytes)]
        m.subgraphs = [_subgraph("main", [_tensor("x", list(w.shape)), _tensor("w", list(w.shape), buffer=1),
                                          _tensor("y", list(w.shape))], [0], [2], [_op(0, [0, 1], [2])])]
        return _pack_tflite(m)

    probe = build(1 << 40)  # same field layout as the final one
    at = data_at if data_at is not None else (len(probe) + 63) // 64 * 64
    fb = build(at)
    assert len(fb) == len(probe)
    return fb, at, w.tobytes()


# --- RTen ---------------------------------------------------------------------

def rten_models() -> list[tuple[str, bytes]]:
    """A small conv net converted by rten-convert, as v2 and v1 files, and a
    model with an ``If`` (nested then/else graphs)."""
    try:
        import sys

        from onnx import TensorProto, helper, numpy_helper

        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from rten_convert_tools import convert
    except Exception:  # rten-convert / onnx not installed
        return []
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    g = numpy_helper.from_array(rng.standard_normal((4 * 6 * 6, 5)).astype(np.float32), "g")
    shape = numpy_helper.from_array(np.array([1, -1], np.int64), "shape")
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Reshape", ["p", "shape"], ["f"]),
        helper.make_node("MatMul", ["f", "g"], ["m"]),
        helper.make_node("Softmax", ["m"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes, "fuzz", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])], [w, b, g, shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, 4])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", TensorProto.FLOAT, [1, 4])])
    zero = numpy_helper.from_array(np.array(0, np.float32), "zero")
    cond = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0), helper.make_node("Greater", ["s", "zero"], ["c"]),
         helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)],
        "if", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [zero])
    if_model = helper.make_model(cond, opset_imports=[helper.make_opsetid("", 13)])
    out = []
    for name, m, v1 in (("rten_convnet_v2", model, False), ("rten_convnet_v1", model, True),
                        ("rten_if_v2", if_model, False)):
        try:
            out.append((name, convert(m, v1=v1)))
        except Exception:
            pass
    return out


#: the onnx wheel's light models that rten-convert 0.22 converts (alexnet, inception_v1 and
#: zfnet512 use LRN, which it lacks)
LIGHT_MODELS = ("squeezenet", "inception_v2", "densenet121", "resnet50", "shufflenet", "vgg19")


def rten_light_models() -> list[tuple[str, bytes]]:
    """:data:`LIGHT_MODELS` converted as ``rten-convert model.onnx`` does
    (kept in a temporary folder keyed by the ONNX file's digest: every
    worker process reads the corpus); empty without onnx/rten-convert."""
    try:
        import sys
        import tempfile

        import onnx

        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from rten_convert_tools import convert
    except Exception:  # rten-convert / onnx not installed
        return []
    light = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
    cache = Path(tempfile.gettempdir()) / "fbjax-fuzz-light"
    out = []
    for name in LIGHT_MODELS:
        src = light / f"light_{name}.onnx"
        if not src.is_file():
            continue
        digest = hashlib.sha256(src.read_bytes()).hexdigest()[:16]
        dst = cache / f"{name}-{digest}.rten"
        if not dst.is_file():
            try:
                data = convert(onnx.load(str(src)))
            except Exception:
                continue
            cache.mkdir(exist_ok=True)
            tmp = dst.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, dst)
        out.append((f"light_{name}", dst.read_bytes()))
    return out


# --- StableHLO ----------------------------------------------------------------


def stablehlo_exported() -> list[tuple[str, bytes]]:
    """Small programs written by :func:`fbjax.export.to_stablehlo_flatbuffer`
    (the format's writer as a user meets it): a dense layer with a
    reduction, a strided convolution with a window reduction."""
    import jax.numpy as jnp
    from jax import lax

    from fbjax.export import to_stablehlo_flatbuffer

    def dense(x, w, b):
        y = jnp.maximum(x @ w + b, 0.0)
        return jnp.sum(y, axis=1), jnp.max(y)

    def conv_pool(x, k):
        y = lax.conv_general_dilated(x, k, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return lax.reduce_window(y, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")

    f32 = np.float32
    out = []
    for name, fn, args in (
            ("exported_dense", dense, (np.ones((2, 8), f32), np.ones((8, 4), f32), np.zeros(4, f32))),
            ("exported_conv_pool", conv_pool, (np.ones((1, 8, 8, 3), f32), np.ones((3, 3, 3, 4), f32)))):
        try:
            out.append((name, to_stablehlo_flatbuffer(fn, *args)))
        except Exception:  # an op the format cannot express in this JAX version: not a seed
            pass
    return out


def stablehlo_reduce() -> bytes:
    """``y = reduce_sum(x * c + x, dim 1)``: MULTIPLY, ADD, REDUCE with a body subgraph."""
    OC = S.OperatorCode

    def t(shape, buffer=0, name=""):
        x = S.TensorT()
        x.shape, x.type, x.buffer, x.name = list(shape), S.DataType.FLOAT32, buffer, name
        return x

    def op(code_idx, ins, outs, otype=0, opts=None):
        o = S.OperatorT()
        o.opcodeIndex, o.inputs, o.outputs = code_idx, list(ins), list(outs)
        o.operatorOptionsType, o.operatorOptions = otype, opts
        return o

    def sg(name, tensors, ins, outs, ops):
        s = S.SubGraphT()
        s.name, s.tensors, s.inputs, s.outputs, s.operators = name, tensors, list(ins), list(outs), ops
        return s

    def buf(data=None):
        b = S.BufferT()
        if data is not None:
            b.data = np.frombuffer(np.asarray(data).tobytes(), np.uint8)
        return b

    red = S.ReduceOptionsT()
    red.dimensions, red.computation = [1], 1
    main = sg("main", [t([2, 3], name="x"), t([2, 3], 1, "c"), t([2, 3]), t([2, 3]), t([], 2, "zero"),
                       t([2], name="y")],
              [0], [5], [op(0, [0, 1], [2], S.OperatorOptions.MultiplyOptions, S.MultiplyOptionsT()),
                         op(1, [2, 0], [3], S.OperatorOptions.AddOptions, S.AddOptionsT()),
                         op(2, [3, 4], [5], S.OperatorOptions.ReduceOptions, red)])
    body = sg("body", [t([]), t([]), t([])], [0, 1], [2],
              [op(1, [0, 1], [2], S.OperatorOptions.AddOptions, S.AddOptionsT())])
    m = S.ModelT()
    m.version = 0
    m.operatorCodes = [OC.MULTIPLY, OC.ADD, OC.REDUCE]
    m.subgraphs = [main, body]
    m.buffers = [buf(), buf(np.arange(6, dtype=np.float32) / 7), buf(np.float32(0))]
    b = flatbuffers.Builder(512)
    b.Finish(m.Pack(b))
    return bytes(b.Output())


def stablehlo_conv() -> bytes:
    """A NHWC convolution with every ConvolutionOptions vector set, then CONVERT."""
    def t(shape, buffer=0, dtype=S.DataType.FLOAT32):
        x = S.TensorT()
        x.shape, x.type, x.buffer = list(shape), dtype, buffer
        return x

    c = S.ConvolutionOptionsT()
    c.windowStrides, c.padding, c.lhsDilation, c.rhsDilation = [1, 1], [1, 1, 1, 1], [1, 1], [1, 1]
    c.windowReversal = [False, False]
    c.inputBatchDimension, c.inputFeatureDimention, c.inputSpatialDimensions = 0, 3, [1, 2]
    c.kernelInputFeatureDimension, c.kernelOutputFeatureDimension, c.kernelSpatialDimensions = 2, 3, [0, 1]
    c.outputBatchDimension, c.outputFeatureDimension, c.outputSpatialDimensions = 0, 3, [1, 2]
    c.featureGroupCount = c.batchGroupCount = 1
    conv = S.OperatorT()
    conv.opcodeIndex, conv.inputs, conv.outputs = 0, [0, 1], [2]
    conv.operatorOptionsType, conv.operatorOptions = S.OperatorOptions.ConvolutionOptions, c
    cvt = S.OperatorT()
    cvt.opcodeIndex, cvt.inputs, cvt.outputs = 1, [2], [3]
    g = S.SubGraphT()
    g.tensors = [t([1, 5, 5, 2]), t([3, 3, 2, 4], 1), t([1, 5, 5, 4]), t([1, 5, 5, 4], 0, S.DataType.FLOAT16)]
    g.inputs, g.outputs, g.operators, g.name = [0], [3], [conv, cvt], "main"
    w = S.BufferT()
    w.data = np.frombuffer(np.linspace(-1, 1, 72, dtype=np.float32).tobytes(), np.uint8)
    m = S.ModelT()
    m.operatorCodes = [S.OperatorCode.CONVOLUTION, S.OperatorCode.CONVERT]
    m.subgraphs, m.buffers = [g], [S.BufferT(), w]
    b = flatbuffers.Builder(1024)
    b.Finish(m.Pack(b))
    return bytes(b.Output())

# --- TFLite GPU delegate: the TF 2.7 layout ---------------------------------------

def _copy_to(mod, obj):
    """A flatc object-API tree rebuilt with ``mod``'s classes (same table and field names)."""
    if isinstance(obj, list):
        return [_copy_to(mod, x) for x in obj]
    if obj is None or isinstance(obj, (bool, int, float, str, bytes, np.ndarray)):
        return obj
    new = getattr(mod, type(obj).__name__)()
    for k, v in vars(obj).items():
        assert hasattr(new, k), (type(obj).__name__, k)
        setattr(new, k, _copy_to(mod, v))
    return new


#: what the TF 2.7 copies carry besides the 2.5 file's fields
TF27_DRIVER = "OpenCL 3.0 PoCL 3.1+debian Linux, RELOC, LLVM 15.0.6, SLEEF, DISTRO"


def gpu_cl_as_tf27(buf: bytes) -> tuple[bytes, list]:
    """A TF 2.5 file re-encoded in the TF 2.7 layout, field by field, plus the fields 2.7 adds: a driver
    version, each node's program fingerprint (8 bytes of the SHA-256 of its code, standing in for the
    delegate's hash of code and compiler options) and one ``BinaryProgram`` per distinct fingerprint
    (64 stand-in bytes: a real one is the driver's compiled kernel). No device-written TF 2.7 file is public.
    Returns the bytes and the programs ``[(fingerprint, size)]`` written."""
    ic = G25.InferenceContextT.InitFromBuf(buf, G25.InferenceContext.GetRootAs(buf, 0)._tab.Pos)
    new = _copy_to(G27, ic)
    progs = {}
    for n in new.nodes:
        n.fingerprint = int.from_bytes(hashlib.sha256(n.gpuOp.code or b"").digest()[:8], "little")
        if n.fingerprint not in progs:
            bp = G27.BinaryProgramT()
            bp.fingerprint = n.fingerprint
            bp.binary = list(hashlib.sha256(n.fingerprint.to_bytes(8, "little")).digest() * 2)
            progs[n.fingerprint] = bp
    new.binaryPrograms = list(progs.values())
    new.driverVersion = TF27_DRIVER
    b = flatbuffers.Builder(len(buf) + 1024)
    b.Finish(new.Pack(b))
    return bytes(b.Output()), [(fp, 64) for fp in progs]


# --- the corpus ---------------------------------------------------------------

#: container files (tests/data): the smaller LLM bundles (a q8 .litertlm with a SentencePiece tokenizer,
#: an LLM .task) and MediaPipe's vision .task bundles (one nested)
BUNDLES = ("llm_bundles/llama_q8_sp.litertlm", "llm_bundles/gemma_sp.task", "tasks/tiny_vision.task",
           "tasks/nested.task")

#: LLM bundles whose model section the ``bundle_model`` cases mutate (the container re-packed around it)
LLM_BUNDLES = ("llm_bundles/llama_q8_sp.litertlm", "llm_bundles/gemma_sp.task")


@functools.lru_cache(maxsize=None)
def llm_containers() -> dict:
    """``{name: LlmBundleFile}`` of :data:`LLM_BUNDLES` (the files present)."""
    from fbjax.formats import llm_container

    data_dir = Path(__file__).resolve().parents[1] / "data"
    return {Path(f).name: llm_container.read_bundle((data_dir / f).read_bytes())
            for f in LLM_BUNDLES if (data_dir / f).is_file()}


def repack(name: str, model: bytes) -> bytes:
    """The bundle ``name`` (:data:`LLM_BUNDLES`) with its model section's bytes replaced by ``model``
    (``fbjax.formats.llm_container.write_bundle``: a valid container whatever the model bytes are)."""
    from fbjax.formats import llm_container

    return llm_container.write_bundle(llm_containers()[name], model)


@functools.lru_cache(maxsize=None)
def seeds() -> tuple[tuple[str, str, bytes], ...]:
    """All seeds as ``(name, format, bytes)``; real TFLite files where present."""
    out = []
    for f in REAL_TFLITE:
        p = SHARED_TFLITE / f
        if p.is_file():
            out.append((p.stem, "tflite", p.read_bytes()))
    out.append(("synthetic_control_flow", "tflite", tflite_control_flow()))
    out.append(("synthetic_large_layout", "tflite", tflite_large_layout()))
    for name, data in rten_models() + rten_light_models():
        out.append((name, "rten", data))
    for name, data in stablehlo_exported():
        out.append((name, "stablehlo", data))
    out.append(("synthetic_reduce", "stablehlo", stablehlo_reduce()))
    for f in REAL_GPU_CL:
        p = SHARED_GPU_CL / f
        if p.is_file():
            out.append((p.name, "gpu_cl", p.read_bytes()))
    p = SHARED_GPU_CL / REAL_GPU_CL[0]
    if p.is_file():
        out.append(("tflm_sine_float.F32.BUFFER.tf27.bin", "gpu_cl", gpu_cl_as_tf27(p.read_bytes())[0]))
    out.append(("synthetic_conv", "stablehlo", stablehlo_conv()))
    data_dir = Path(__file__).resolve().parents[1] / "data"
    for f in BUNDLES:
        p = data_dir / f
        if p.is_file():
            out.append((p.name, "bundle", p.read_bytes()))
    for name, b in llm_containers().items():  # the model section alone: repack() puts it back in its bundle
        out.append((name, "bundle_model", b.model.data))
    extra = os.environ.get("FBJAX_FUZZ_SEEDS")  # more files: path[:format],...
    for item in filter(None, (extra or "").split(",")):
        path, _, fmt = item.partition(":")
        data = Path(path).read_bytes()
        if not fmt:
            from fbjax.formats import detect_format

            fmt = detect_format(data)
        out.append((Path(path).stem, fmt, data))
    return tuple(out)
