"""TFLite flatbuffer (schema v3, ``TFL3``) frontend: file bytes -> :class:`~fbjax.ir.ModelIR`.

Follows ``schemas/tflite.fbs`` (TensorFlow's ``lite/schema/schema.fbs``):

* operator codes: ``builtin_code`` unless it is below
  ``PLACEHOLDER_FOR_GREATER_OP_CODES`` (127) and ``deprecated_builtin_code``
  is larger (older files only set the deprecated byte);
* options of codes >= 162 in ``builtin_options_2``; custom ops carry
  ``custom_code`` and (usually flexbuffer-encoded) ``custom_options``;
* ``STABLEHLO_*`` builtins become ``("stablehlo", "stablehlo.<op>")`` nodes
  for the shared StableHLO lowering (:mod:`.tflite_stablehlo`; region bodies
  are appended subgraphs referenced by index);
* buffer 0 is the empty sentinel; files over 2 GB store buffers after the
  flatbuffer with ``offset``/``size`` (valid when > 1);
* ``shape_signature`` marks dynamic dims with -1 (``shape`` then holds 1);
* sparse constants (``sparsity``) are densified at load.

Constant data are numpy views on the memory-mapped file (zero-copy) when
alignment allows.
"""

from __future__ import annotations

import functools
import re
import struct
from typing import Any, Callable, Optional

import numpy as np

from ..errors import ModelFormatError
from ..ir import DataSource, Graph, ModelIR, Node, QuantParams, Signature, Value, fill_zero_size_constants
from . import verify as _verify
from ._mmap import open_source
from . import tflite_stablehlo as _shlo
from . import tflite_metadata as _metadata
from ._generated import tflite_generated as T

FILE_IDENTIFIER = b"TFL3"
OP_SET = "tflite"
CUSTOM_OP_SET = "tflite.custom"
PLACEHOLDER_FOR_GREATER_OP_CODES = 127


def _enum_names(cls) -> dict[int, str]:
    return {v: k for k, v in vars(cls).items() if not k.startswith("_") and isinstance(v, int)}


BUILTIN_NAMES = _enum_names(T.BuiltinOperator)
BUILTIN_CODES = {v: k for k, v in BUILTIN_NAMES.items()}
TENSOR_TYPE_NAMES = _enum_names(T.TensorType)

# TensorType name -> numpy dtype. STRING, RESOURCE and VARIANT have no numeric
# dtype; they are represented as object arrays and rejected by the lowering.
_DTYPES = {
    "FLOAT32": np.float32,
    "FLOAT16": np.float16,
    "FLOAT64": np.float64,
    "INT32": np.int32,
    "UINT8": np.uint8,
    "INT64": np.int64,
    "BOOL": np.bool_,
    "INT16": np.int16,
    "COMPLEX64": np.complex64,
    "COMPLEX128": np.complex128,
    "INT8": np.int8,
    "UINT64": np.uint64,
    "UINT32": np.uint32,
    "UINT16": np.uint16,
    "INT4": np.int8,  # stored packed two per byte; unpacked at load
    "STRING": np.object_,
    "RESOURCE": np.int32,
    "VARIANT": np.object_,
}
try:  # bfloat16 exists in newer schemas
    import ml_dtypes

    _DTYPES["BFLOAT16"] = ml_dtypes.bfloat16
except ImportError:  # pragma: no cover
    pass


def tensor_dtype(code: int) -> np.dtype:
    """numpy dtype of a ``TensorType`` enum value.

    Raises:
        ModelFormatError: the value is not a known TensorType.
    """
    name = TENSOR_TYPE_NAMES.get(code)
    if name is None or name not in _DTYPES:
        raise ModelFormatError(f"unknown TensorType value {code}")
    return np.dtype(_DTYPES[name])


def dtype_to_tensor_type(dtype) -> int:
    """Inverse of :func:`tensor_dtype` for writers (float16 -> FLOAT16, ...)."""
    dtype = np.dtype(dtype)
    for name, dt in _DTYPES.items():
        if name in ("INT4", "RESOURCE", "STRING", "VARIANT"):
            continue
        if np.dtype(dt) == dtype:
            return getattr(T.TensorType, name)
    raise ValueError(f"no TFLite TensorType for {dtype}")


#: Option fields whose values are enums, by snake_case field name as the schema
#: spells it. The reader converts them to the enum's name (lowerings read
#: "SAME", not 0); the test-model builder (:mod:`.tflite_builder`) takes names.
OPTION_ENUM_FIELDS: dict[str, Any] = {
    "padding": T.Padding,
    "fused_activation_function": T.ActivationFunctionType,
    "weights_format": T.FullyConnectedOptionsWeightsFormat,
    "mode": T.MirrorPadMode,
    "kernel_type": T.LSTMKernelType,
    "type": T.LSHProjectionType,
    "combiner": T.CombinerType,
    "algorithm": T.RngAlgorithm,
    "comparison_direction": T.StablehloComparisonDirection,
    "compare_type": T.StablehloComparisonType,
    "reduce_function": T.ReduceWindowFunction,
    "precision_config": T.StablehloPrecisionConfig,  # a vector: kept as codes by the reader
}
#: Option fields holding a ``TensorType``: a numpy dtype in the reader's attrs
#: (:func:`tensor_dtype`), a dtype or TensorType name for the builder.
OPTION_TENSOR_TYPE_FIELDS = frozenset({
    "idx_out_type", "in_data_type", "key_dtype", "out_data_type", "out_type",
    "output_type", "quantized_bias_type", "value_dtype",
})
_ENUM_CACHE: dict[Any, dict[int, str]] = {}


def snake_case(name: str) -> str:
    """The schema's field name of an object-API attribute (``fusedActivationFunction`` -> ``fused_activation_function``)."""
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


def options_to_attrs(opts: Any) -> dict:
    """Convert an object-API options table (``Conv2DOptionsT``) to attrs.

    Field names become snake_case as spelled in the schema; enum fields
    become their names; TensorType fields numpy dtypes; vectors numpy arrays.
    """
    if opts is None:
        return {}
    attrs = {}
    for k, v in vars(opts).items():
        key = snake_case(k)
        if key in OPTION_ENUM_FIELDS and isinstance(v, int):
            cls = OPTION_ENUM_FIELDS[key]
            names = _ENUM_CACHE.setdefault(cls, _enum_names(cls))
            if v not in names:
                raise ModelFormatError(f"option {key} has unknown enum value {v}")
            v = names[v]
        elif key in OPTION_TENSOR_TYPE_FIELDS and isinstance(v, int):
            v = tensor_dtype(v)
        elif isinstance(v, list):
            v = np.asarray(v)
        attrs[key] = v
    return attrs


# --- custom options -------------------------------------------------------

def _decode_flexbuffer(raw: bytes) -> dict:
    from flatbuffers import flexbuffers

    value = flexbuffers.Loads(raw)
    if isinstance(value, dict):
        return {k: (np.asarray(v) if isinstance(v, list) else v) for k, v in value.items()}
    return {"value": value}


def _decode_transpose_conv_params(raw: bytes) -> dict:
    """MediaPipe's ``Convolution2DTransposeBias`` stores a raw
    ``TfLiteTransposeConvParams`` struct: int32 padding (TfLitePadding:
    1 = SAME, 2 = VALID), int32 stride_width, int32 stride_height."""
    if len(raw) < 12:
        raise ModelFormatError(
            f"Convolution2DTransposeBias custom options are {len(raw)} bytes; expected >= 12"
        )
    padding, sw, sh = struct.unpack_from("<iii", raw, 0)
    names = {1: "SAME", 2: "VALID"}
    if padding not in names:
        raise ModelFormatError(f"Convolution2DTransposeBias: unknown padding value {padding}")
    return {"padding": names[padding], "stride_w": sw, "stride_h": sh}


#: custom_code -> decoder(raw bytes) -> attrs. Codes not listed are decoded as
#: flexbuffers when possible, else passed as ``{"custom_options": bytes}``.
CUSTOM_OPTION_DECODERS: dict[str, Callable[[bytes], dict]] = {
    "Convolution2DTransposeBias": _decode_transpose_conv_params,
}


def decode_custom_options(code: str, raw: bytes) -> dict:
    """The keyword attributes of a TFLite custom op ``code`` from its
    ``custom_options`` bytes: a decoder of :data:`CUSTOM_OPTION_DECODERS`
    where the code has one (``Convolution2DTransposeBias``'s packed struct),
    else the flexbuffer map (bounded first by
    :func:`fbjax.formats.verify.check_flexbuffer`), else
    ``{"custom_options": raw}`` for bytes that are no flexbuffer; ``{}`` when
    empty.

    Raises:
        ModelFormatError: a code-specific decoder refuses the bytes.
    """
    dec = CUSTOM_OPTION_DECODERS.get(code)
    if dec is not None:
        return dec(raw)
    if not raw:
        return {}
    try:
        # bounds the decoder's work first: a hostile flexbuffer can describe
        # vectors of billions of elements or exponentially shared sub-vectors
        _verify.check_flexbuffer(raw, f"custom options of {code}")
        return _decode_flexbuffer(raw)
    except Exception:  # not a flexbuffer: hand the raw bytes to the lowering
        return {"custom_options": bytes(raw)}


# --- sparse tensors -------------------------------------------------------

def _index_vector(union_type: int, vec: Any) -> np.ndarray:
    if vec is None or getattr(vec, "values", None) is None:
        return np.zeros(0, np.int64)
    return np.asarray(vec.values, dtype=np.int64)


def densify(values: np.ndarray, dense_shape: tuple, sparsity: Any) -> np.ndarray:
    """Expand a TFLite sparse tensor to dense.

    Follows TFLite's ``FormatConverter::SparseToDense``: ``traversal_order``
    lists the (original + block) dimensions from outermost to innermost;
    ``dim_metadata[i]`` describes dimension ``traversal_order[i]``, either
    DENSE (``dense_size``) or SPARSE_CSR (``array_segments``,
    ``array_indices``); ``block_map[j]`` is the original dimension blocked by
    block dimension ``n + j``.

    Raises:
        ModelFormatError: inconsistent metadata.
    """
    n = len(dense_shape)
    order = [int(x) for x in (sparsity.traversalOrder if sparsity.traversalOrder is not None else range(n))]
    block_map = [int(x) for x in (sparsity.blockMap if sparsity.blockMap is not None else [])]
    dims = sparsity.dimMetadata or []
    total = n + len(block_map)
    if len(order) != total or len(dims) != total or sorted(order) != list(range(total)):
        raise ModelFormatError("sparsity: traversal_order / dim_metadata do not match the tensor rank")
    if any(not 0 <= d < total for d in order) or any(not 0 <= b < n for b in block_map):
        raise ModelFormatError("sparsity: traversal_order / block_map entries out of range")
    n_dense = _verify.check_shape(dense_shape, "sparsity: dense shape", allow_unknown=False)
    cap = _verify.get_limits().max_sparse_elements
    if n_dense > cap:
        raise ModelFormatError(
            f"sparsity: densifying shape {list(dense_shape)} needs {n_dense} elements, over the limit of {cap} "
            "(fbjax.formats.verify.limits(max_sparse_elements=...) raises it)"
        )
    # Per-level expansion: `pos` is the running linear position, `coords` the
    # coordinate of each expanded dimension for every element so far.
    pos = np.zeros(1, np.int64)
    coords = np.zeros((total, 1), np.int64)
    level_size = {}
    for level, dm in enumerate(dims):
        d = order[level]
        if dm.format == T.DimensionType.DENSE:
            size = int(dm.denseSize)
            if size < 0 or pos.size * size > n_dense:
                raise ModelFormatError(
                    f"sparsity: dense_size {size} of level {level} expands past the {n_dense} elements "
                    f"of shape {list(dense_shape)}"
                )
            level_size[d] = size
            pos = (pos[:, None] * size + np.arange(size)[None, :]).reshape(-1)
            coords = np.repeat(coords, size, axis=1)
            coords[d] = np.tile(np.arange(size), coords.shape[1] // max(size, 1))
        else:
            seg = _index_vector(dm.arraySegmentsType, dm.arraySegments)
            idx = _index_vector(dm.arrayIndicesType, dm.arrayIndices)
            if pos.size and (pos.max() + 1 >= seg.size):
                raise ModelFormatError("sparsity: array_segments is too short")
            starts, ends = seg[pos], seg[pos + 1]
            counts = ends - starts
            if np.any(counts < 0) or np.any(starts < 0) or (ends.size and ends.max() > idx.size):
                raise ModelFormatError("sparsity: array_segments out of range")
            if int(counts.sum()) > n_dense:
                raise ModelFormatError(
                    f"sparsity: array_segments of level {level} address {int(counts.sum())} entries, "
                    f"more than the {n_dense} elements of shape {list(dense_shape)}"
                )
            new_pos = np.concatenate([np.arange(s, e) for s, e in zip(starts, ends)]) if pos.size else pos
            coords = np.repeat(coords, counts, axis=1)
            coords[d] = idx[new_pos]
            pos = new_pos.astype(np.int64)
    if pos.size and pos.max() >= values.size:
        raise ModelFormatError(
            f"sparsity: {values.size} stored values, metadata addresses {pos.max() + 1}"
        )
    if pos.size > n_dense:
        raise ModelFormatError(f"sparsity: metadata addresses {pos.size} values, the dense shape has {n_dense}")
    dense = np.zeros(dense_shape, values.dtype)
    full = []
    for i in range(n):
        c = coords[i]
        if i in block_map:
            bdim = n + block_map.index(i)
            if bdim not in level_size:
                raise ModelFormatError(f"sparsity: block dimension {bdim} is not stored dense")
            c = c * level_size[bdim] + coords[bdim]
        full.append(c)
    try:
        dense[tuple(full)] = values.reshape(-1)[pos]
    except IndexError as e:
        raise ModelFormatError(f"sparsity: index out of range ({e})") from None
    return dense


# --- reading --------------------------------------------------------------



def is_tflite(head: bytes) -> bool:
    """Whether the first 8 (or more) bytes of a file carry the TFLite
    flatbuffer file identifier ``TFL3`` at offset 4 (``schema.fbs``)."""
    return len(head) >= 8 and head[4:8] == FILE_IDENTIFIER


def _quant(q: Any, tensor_desc: str) -> Optional[QuantParams]:
    if q is None or q.scale is None or len(q.scale) == 0:
        return None
    scale = np.asarray(q.scale, np.float32)
    zp = np.asarray(q.zeroPoint if q.zeroPoint is not None else np.zeros_like(scale), np.int64)
    if zp.size == 0:
        zp = np.zeros(scale.shape, np.int64)
    if zp.size != scale.size:
        raise ModelFormatError(f"{tensor_desc}: {scale.size} scales but {zp.size} zero points")
    return QuantParams(scale, zp, int(q.quantizedDimension))


def _buffer_bytes(buffers, bidx: int, raw, where: str) -> Optional[np.ndarray]:
    if bidx < 0 or bidx >= len(buffers):
        raise ModelFormatError(f"{where}: buffer {bidx} out of range (the model has {len(buffers)} buffers)")
    b = buffers[bidx]
    if b is None:
        return None
    if b.offset > 1:
        # files over 2 GB: the bytes follow the flatbuffer; a view on the
        # mapped file, never copied
        end = b.offset + b.size
        if end > len(raw):
            raise ModelFormatError(
                f"{where}: buffer {bidx} spans bytes {b.offset}..{end}, past the end of the file ({len(raw)}): "
                "the file looks truncated (an interrupted download or copy?)"
            )
        return np.frombuffer(raw, np.uint8, count=b.size, offset=b.offset)
    if b.data is None or len(b.data) == 0:
        return None
    return np.asarray(b.data, np.uint8)


def _tensor_value(t, ti: int, buffers, raw, where: str, shared: Optional[dict] = None) -> Value:
    desc = f"{where}, tensor {ti}"
    dtype = tensor_dtype(t.type)
    shape = [int(d) for d in (t.shape if t.shape is not None else [])]
    _verify.check_shape(shape, desc)  # rank, negative dims, element count (Python ints: no overflow)
    if t.shapeSignature is not None and len(t.shapeSignature) == len(shape):
        shape = [None if int(s) < 0 else d for d, s in zip(shape, t.shapeSignature)]
    name = t.name.decode("utf-8", "replace") if isinstance(t.name, bytes) else (t.name or f"tensor_{ti}")
    quant = _quant(t.quantization, desc)
    if quant is not None and quant.per_channel:
        qd = quant.quantized_dimension
        if not 0 <= qd < len(shape):
            raise ModelFormatError(f"{desc}: quantized_dimension {qd} out of range for shape {shape}")
        if shape[qd] is not None and shape[qd] != quant.scale.size:
            raise ModelFormatError(
                f"{desc}: {quant.scale.size} per-channel scales, but dimension {qd} of shape {shape} "
                f"is {shape[qd]}"
            )
    v = Value(name=name, dtype=dtype, shape=tuple(shape), quant=quant,
              index=ti, is_variable=bool(t.isVariable))
    # tensors of several subgraphs on one buffer (litert-torch's prefill and decode signatures share
    # their weights): one array object, so fbjax.lower.build names them one param
    key = (int(t.buffer), t.type, tuple(d if d is not None else 1 for d in shape))
    if shared is not None and t.sparsity is None and key in shared:
        v.data = shared[key]
        v.storage_bits = 4 if TENSOR_TYPE_NAMES.get(t.type) == "INT4" else 0
        if ("source",) + key in shared:
            v.set_data_source(shared[("source",) + key])
        return v
    data = _buffer_bytes(buffers, t.buffer, raw, desc)
    if data is not None and dtype != np.object_:
        if t.sparsity is not None:
            dense_shape = tuple(d if d is not None else 1 for d in shape)
            vals = _view(data, dtype, None, desc)
            v.data = densify(vals, dense_shape, t.sparsity)
        elif TENSOR_TYPE_NAMES.get(t.type) == "INT4":
            dims = [d if d is not None else 1 for d in shape]
            v.data = _unpack_int4(data, dims, desc)
            v.storage_bits = 4
            # the file's packed bytes can give the values again: Value.release_data may drop them
            source = DataSource(functools.partial(_unpack_int4, data, dims, desc))
            v.set_data_source(source)
            if shared is not None and t.sparsity is None:
                shared[("source",) + key] = source
        else:
            v.data = _view(data, dtype, tuple(d if d is not None else 1 for d in shape), desc)
        if shared is not None and t.sparsity is None:
            shared[key] = v.data
    return v


def _blockwise_quant(tensors, values: list, where: str, shared: Optional[dict] = None) -> None:
    """TFLite ``BlockwiseQuantization`` details (int4 weights of litert-torch's
    ``dynamic_int4_block32``): the scales are another tensor of the subgraph,
    float16 ``[rows, columns / block_size]``. They become the weight's
    :class:`QuantParams` (``block_size`` > 0, 2-D ``scale``), and the scales
    tensor stops being a constant of its own (it is not a weight to train).
    The zero points are all 0 (a read-only broadcast of one 0, no memory),
    and subgraphs that share a scales buffer share one float32 array of it
    (``shared``, keyed by the scales' file buffer: an LLM's prefill and decode)."""
    from ._generated import tflite_generated as T

    for ti, t in enumerate(tensors):
        q = t.quantization
        if q is None or q.detailsType != T.QuantizationDetails.BlockwiseQuantization or q.details is None:
            continue
        d, v = q.details, values[ti]
        desc = f"{where}, tensor {ti} ({v.name!r})"
        si, bs = int(d.scales), int(d.blockSize)
        if not 0 <= si < len(values) or values[si].data is None:
            raise ModelFormatError(f"{desc}: blockwise scales tensor {si} is not a constant of the subgraph")
        if int(d.zeroPoints) >= 0:
            raise ModelFormatError(f"{desc}: blockwise quantization with zero points is not supported")
        shape = v.shape or ()
        if bs <= 0 or len(shape) != 2 or shape[1] is None or shape[1] % bs:
            raise ModelFormatError(f"{desc}: block size {bs} does not divide the columns of shape {list(shape)}")
        key = ("blockwise scales", int(tensors[si].buffer), tuple(np.shape(values[si].data)))
        scale = shared.get(key) if shared is not None else None
        if scale is None:
            scale = np.asarray(values[si].data, np.float32)
            if shared is not None:
                shared[key] = scale
        if scale.shape != (shape[0], shape[1] // bs):
            raise ModelFormatError(f"{desc}: blockwise scales of shape {list(scale.shape)}, expected "
                                   f"{[shape[0], shape[1] // bs]}")
        v.quant = QuantParams(scale, np.broadcast_to(np.int64(0), scale.shape), 0, bs)
        values[si].data = None


def _unpack_int4(data: np.ndarray, shape, desc: str) -> np.ndarray:
    n = int(np.prod(shape)) if shape else 1
    if data.size * 2 < n:
        raise ModelFormatError(f"{desc}: INT4 buffer has {data.size} bytes, shape needs {(n + 1) // 2}")
    lo = (data.astype(np.int8) << 4) >> 4
    hi = data.astype(np.int8) >> 4
    out = np.stack([lo, hi], -1).reshape(-1)[:n]
    return out.reshape(shape)


def _view(data: np.ndarray, dtype: np.dtype, shape, desc: str) -> np.ndarray:
    item = dtype.itemsize
    if data.size % item:
        raise ModelFormatError(f"{desc}: buffer of {data.size} bytes is not a multiple of {dtype.name} size")
    if shape is not None:
        need = int(np.prod(shape)) * item if len(shape) else item
        if data.size != need:
            raise ModelFormatError(
                f"{desc}: buffer holds {data.size} bytes but shape {list(shape)} of {dtype.name} needs {need}"
            )
    if data.ctypes.data % item:  # unaligned: copy once
        data = data.copy()
    arr = data.view(dtype)
    if shape is not None:
        arr = arr.reshape(shape)
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return arr


def read(source) -> ModelIR:
    """Parse a ``.tflite`` file (path or bytes) into the IR.

    Args:
        source: a path or the file's bytes.

    Returns:
        :class:`~fbjax.ir.ModelIR` with one graph per subgraph (subgraph 0 is
        the entry point) and constants as numpy views on the mapped file.

    Raises:
        ModelFormatError: the data is not a valid TFLite flatbuffer.
    """
    raw, path = open_source(source)
    label = path or "<bytes>"
    if len(raw) < 8:
        raise ModelFormatError(f"{label}: {len(raw)} bytes is too short for a TFLite flatbuffer")
    head = bytes(raw[:8])
    if head[4:8] != FILE_IDENTIFIER:
        raise ModelFormatError(
            f"{label}: not a TFLite file (bytes 4-7 are {head[4:8]!r}, expected {FILE_IDENTIFIER!r})"
        )
    with _verify.corrupt_file_errors(label, "TFLite flatbuffer"):
        # structure first: the generated bindings trust every offset and length
        _verify.verify(raw, "tflite")
        root = T.Model.GetRootAs(raw, 0)
        m = T.ModelT.InitFromObj(root)
        return _to_ir(m, raw, path)


def opcode_name(oc) -> tuple[str, str]:
    """(op_set, op_name) of an ``OperatorCodeT``."""
    code = int(oc.builtinCode)
    dep = int(oc.deprecatedBuiltinCode)
    if code < PLACEHOLDER_FOR_GREATER_OP_CODES and dep > code:
        code = dep
    name = BUILTIN_NAMES.get(code)
    if name is None:
        raise ModelFormatError(f"unknown builtin operator code {code}")
    if name == "CUSTOM":
        cc = oc.customCode
        cc = cc.decode("utf-8", "replace") if isinstance(cc, bytes) else (cc or "")
        return CUSTOM_OP_SET, cc
    return OP_SET, name


def _to_ir(m, raw, path) -> ModelIR:
    if m.subgraphs is None or len(m.subgraphs) == 0:
        raise ModelFormatError("the model has no subgraphs")
    buffers = m.buffers or []
    opcodes = []
    for ci, oc in enumerate(m.operatorCodes or []):
        try:
            opcodes.append(opcode_name(oc))
        except ModelFormatError as e:
            raise ModelFormatError(f"operator code {ci}: {e}") from None
    versions = [max(1, int(oc.version)) for oc in (m.operatorCodes or [])]
    n_sub = len(m.subgraphs)
    calls = []  # (caller, callee, location) from WHILE/IF/CALL_ONCE/STABLEHLO_* options
    graphs = []
    shared: dict = {}  # (buffer, type, shape) -> the array read from it, for every subgraph
    for si, sg in enumerate(m.subgraphs):
        where = f"subgraph {si}"
        tensors = sg.tensors or []
        values = [_tensor_value(t, ti, buffers, raw, where, shared) for ti, t in enumerate(tensors)]

        def ref(i: int, what: str):
            i = int(i)
            if i == -1:
                return None
            if not 0 <= i < len(values):
                raise ModelFormatError(
                    f"{what} refers to tensor {i}, but the subgraph has {len(values)} tensors"
                )
            return values[i]

        nodes = []
        for oi, op in enumerate(sg.operators or []):
            if not 0 <= op.opcodeIndex < len(opcodes):
                raise ModelFormatError(f"{where}, operator {oi}: opcode index {op.opcodeIndex} out of range")
            op_set, name = opcodes[op.opcodeIndex]
            loc = f"{where}, operator {oi}"
            ins = [ref(i, f"{loc} ({name}): input {k}") for k, i in enumerate(op.inputs if op.inputs is not None else [])]
            outs = [ref(i, f"{loc} ({name}): output {k}") for k, i in enumerate(op.outputs if op.outputs is not None else [])]
            regions: dict = {}
            if op_set == CUSTOM_OP_SET:
                rawopt = bytes(np.asarray(op.customOptions, np.uint8)) if op.customOptions is not None else b""
                large = int(getattr(op, "largeCustomOptionsSize", 0) or 0)
                if not rawopt and large:  # files over 2 GB keep them after the flatbuffer
                    off = int(op.largeCustomOptionsOffset)
                    _verify.check_byte_range(off, large, len(raw), f"{loc} ({name}): large custom options")
                    rawopt = bytes(raw[off:off + large])
                attrs = decode_custom_options(name, rawopt)
            else:
                try:
                    attrs = options_to_attrs(op.builtinOptions)
                    attrs.update(options_to_attrs(getattr(op, "builtinOptions2", None)))
                except ModelFormatError as e:
                    raise ModelFormatError(f"{loc} ({name}): {e}") from None
                for key, val in attrs.items():
                    if key.endswith("subgraph_index") or key == "subgraph":  # CallOptions.subgraph
                        calls.append((si, int(val), f"{loc} ({name}): {key}"))
                        regions[key] = (int(val),)
                    elif key.endswith("subgraph_indices"):
                        calls.extend((si, int(x), f"{loc} ({name}): {key}[{k}]")
                                     for k, x in enumerate(np.asarray(val).reshape(-1)))
                        regions[key] = tuple(int(x) for x in np.asarray(val).reshape(-1))
            node = Node(op_set, name, ins, outs, attrs, loc, version=versions[op.opcodeIndex], regions=regions)
            if op_set == OP_SET and _shlo.is_stablehlo(name):  # -> the shared StableHLO lowering
                node = _shlo.translate(node)
            nodes.append(node)
        g_in = [ref(i, f"{where}: input {k}") for k, i in enumerate(sg.inputs if sg.inputs is not None else [])]
        g_out = [ref(i, f"{where}: output {k}") for k, i in enumerate(sg.outputs if sg.outputs is not None else [])]
        for kind, lst in (("input", g_in), ("output", g_out)):
            if any(v is None for v in lst):
                raise ModelFormatError(f"{where}: {kind} {lst.index(None)} refers to tensor -1")
        gname = sg.name.decode("utf-8", "replace") if isinstance(sg.name, bytes) else (sg.name or f"subgraph_{si}")
        _blockwise_quant(sg.tensors or [], values, where, shared)
        graphs.append(Graph(gname, g_in, g_out, nodes, values))
        fill_zero_size_constants(graphs[-1])  # empty buffers of zero-element tensors: constants
    _verify.check_call_graph(n_sub, calls)

    sigs = {}
    for si, sd in enumerate(m.signatureDefs or []):
        key = sd.signatureKey.decode("utf-8", "replace") if isinstance(sd.signatureKey, bytes) else sd.signatureKey
        if key is None:  # (a signature is called by its key: one without cannot be)
            raise ModelFormatError(f"signature_defs[{si}] has no signature_key")
        gi = int(sd.subgraphIndex)
        if not 0 <= gi < len(graphs):
            raise ModelFormatError(f"signature {key!r}: subgraph {gi} out of range")
        g = graphs[gi]

        def tmap(tms):
            out = {}
            for tm in tms or []:
                n = tm.name.decode("utf-8", "replace") if isinstance(tm.name, bytes) else tm.name
                if n is None:
                    raise ModelFormatError(f"signature {key!r}: tensor {tm.tensorIndex} is mapped without a name")
                if not 0 <= tm.tensorIndex < len(g.values):
                    raise ModelFormatError(f"signature {key!r}: tensor {tm.tensorIndex} out of range")
                out[n] = g.values[tm.tensorIndex]
            return out

        sigs[key] = Signature(key, gi, tmap(sd.inputs), tmap(sd.outputs))
    desc = m.description.decode("utf-8", "replace") if isinstance(m.description, bytes) else (m.description or "")
    ir = ModelIR("tflite", graphs, 0, sigs, desc, path, raw, {"version": m.version})
    # TFLite metadata (TFLITE_METADATA entry and the appended associated files), None when absent
    ir.metadata["tflite_metadata"] = _metadata.read(m, raw, path or "<bytes>")
    return ir
