"""Write small TFLite models without TensorFlow, for tests and examples.

:class:`TFLiteBuilder` assembles a ``.tflite`` flatbuffer (schema v3, file
identifier ``TFL3``) through the flatc-generated object API
(:mod:`fbjax.formats._generated.tflite_generated`)::

    from fbjax.formats.tflite_builder import TFLiteBuilder

    b = TFLiteBuilder()
    x = b.add_input((1, 8, 8, 3))
    w = b.add_tensor(data=np.ones((4, 3, 3, 3), np.float32))     # [O, H, W, I]
    y = b.add_tensor((1, 4, 4, 4))
    b.add_op("CONV_2D", [x, w, -1], [y],
             options=dict(padding="SAME", stride_w=2, stride_h=2,
                          fused_activation_function="RELU6"))
    b.add_output(y)
    model_bytes = b.build()

For a model made of one operator, :func:`single_op_model` does the same in
one call.

What is written follows TensorFlow's converter: buffer 0 is the empty
sentinel, each constant has its own buffer (16-byte aligned), operator codes
carry both ``builtin_code`` and ``deprecated_builtin_code = min(code, 127)``,
ops with an options table always get one (schema defaults for fields not
given), and options of codes >= 162 go to ``builtin_options_2``.

The writer does no shape inference: the shapes given for intermediate and
output tensors are written as they are (LiteRT recomputes them; fbjax reads
them), so tests should check them against LiteRT.
"""

from __future__ import annotations

import re
import struct
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

import flatbuffers
import numpy as np

from ._generated import tflite_generated as T

__all__ = [
    "TFLiteBuilder",
    "single_op_model",
    "options_table_name",
    "transpose_conv_bias_options",
]

FILE_IDENTIFIER = b"TFL3"
SCHEMA_VERSION = 3
PLACEHOLDER_FOR_GREATER_OP_CODES = 127
_BUFFER_ALIGNMENT = 16


def _enum(cls) -> dict[str, int]:
    return {k: v for k, v in vars(cls).items() if not k.startswith("_") and isinstance(v, int)}


BUILTIN_CODES: dict[str, int] = _enum(T.BuiltinOperator)
_OPTIONS_1: dict[str, int] = {k: v for k, v in _enum(T.BuiltinOptions).items() if k != "NONE"}
_OPTIONS_2: dict[str, int] = {k: v for k, v in _enum(T.BuiltinOptions2).items() if k != "NONE"}

# Builtin ops whose options table is not named after the op. Every other op
# uses the table whose name, without "Options", equals the op name without
# underscores (case-insensitive): CONV_2D -> Conv2DOptions, TOPK_V2 ->
# TopKV2Options, STABLEHLO_PAD -> StablehloPadOptions.
_OPTIONS_OVERRIDES: dict[str, str] = {
    "AVERAGE_POOL_2D": "Pool2DOptions",
    "MAX_POOL_2D": "Pool2DOptions",
    "L2_POOL_2D": "Pool2DOptions",
    "L2_NORMALIZATION": "L2NormOptions",
    "UNIDIRECTIONAL_SEQUENCE_RNN": "SequenceRNNOptions",
    "MAXIMUM": "MaximumMinimumOptions",
    "MINIMUM": "MaximumMinimumOptions",
    "MEAN": "ReducerOptions",
    "SUM": "ReducerOptions",
    "REDUCE_PROD": "ReducerOptions",
    "REDUCE_MAX": "ReducerOptions",
    "REDUCE_MIN": "ReducerOptions",
    "REDUCE_ANY": "ReducerOptions",
    "REDUCE_ALL": "ReducerOptions",
    "CONV_3D_TRANSPOSE": "Conv3DOptions",
    "RANDOM_STANDARD_NORMAL": "RandomOptions",
    "RANDOM_UNIFORM": "RandomOptions",
    "MULTINOMIAL": "RandomOptions",
}


def _norm(name: str) -> str:
    return name.replace("_", "").lower()


_TABLE_BY_NORM = {_norm(k[: -len("Options")]): k for k in list(_OPTIONS_1) + list(_OPTIONS_2)}


def options_table_name(op_name: str) -> Optional[str]:
    """Name of the options table of a builtin op (``"CONV_2D"`` -> ``"Conv2DOptions"``).

    Returns:
        the table name (a member of the ``BuiltinOptions`` or
        ``BuiltinOptions2`` union), or ``None`` for ops without options
        (``RELU``, ``LOGISTIC``, ...).

    Raises:
        ValueError: ``op_name`` is not a builtin operator of the schema.
    """
    if op_name not in BUILTIN_CODES:
        raise ValueError(_unknown_op_message(op_name))
    if op_name in _OPTIONS_OVERRIDES:
        return _OPTIONS_OVERRIDES[op_name]
    return _TABLE_BY_NORM.get(_norm(op_name))


def _unknown_op_message(op_name: str) -> str:
    import difflib

    close = difflib.get_close_matches(op_name.upper(), BUILTIN_CODES, n=3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    return (
        f"{op_name!r} is not a TFLite builtin operator{hint}; "
        "pass custom=True for a custom op"
    )


# --- options ----------------------------------------------------------------

# Option fields holding enums, by snake_case field name (as in the schema).
_ENUM_FIELDS: dict[str, Any] = {
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
    "precision_config": T.StablehloPrecisionConfig,
}
_TENSOR_TYPE_FIELDS = {
    "idx_out_type", "in_data_type", "key_dtype", "out_data_type", "out_type",
    "output_type", "quantized_bias_type", "value_dtype",
}

_DTYPE_TO_TENSOR_TYPE: dict[np.dtype, int] = {
    np.dtype(np.float32): T.TensorType.FLOAT32,
    np.dtype(np.float16): T.TensorType.FLOAT16,
    np.dtype(np.float64): T.TensorType.FLOAT64,
    np.dtype(np.int32): T.TensorType.INT32,
    np.dtype(np.uint8): T.TensorType.UINT8,
    np.dtype(np.int64): T.TensorType.INT64,
    np.dtype(np.bool_): T.TensorType.BOOL,
    np.dtype(np.int16): T.TensorType.INT16,
    np.dtype(np.complex64): T.TensorType.COMPLEX64,
    np.dtype(np.complex128): T.TensorType.COMPLEX128,
    np.dtype(np.int8): T.TensorType.INT8,
    np.dtype(np.uint64): T.TensorType.UINT64,
    np.dtype(np.uint32): T.TensorType.UINT32,
    np.dtype(np.uint16): T.TensorType.UINT16,
}
_TENSOR_TYPES = _enum(T.TensorType)


def tensor_type(dtype) -> int:
    """``TensorType`` code of a numpy dtype, or of a TensorType name (``"INT8"``).

    Raises:
        ValueError: no TFLite tensor type for it.
    """
    if isinstance(dtype, str) and dtype.upper() in _TENSOR_TYPES:
        return _TENSOR_TYPES[dtype.upper()]
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise ValueError(f"no TFLite TensorType for {dtype!r}") from None
    if dt.name == "bfloat16" and "BFLOAT16" in _TENSOR_TYPES:
        return _TENSOR_TYPES["BFLOAT16"]
    if dt not in _DTYPE_TO_TENSOR_TYPE:
        raise ValueError(f"no TFLite TensorType for {dt}")
    return _DTYPE_TO_TENSOR_TYPE[dt]


def _camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def _snake(camel: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", camel).lower()


def _enum_value(field: str, value, cls) -> int:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    names = _enum(cls)
    if isinstance(value, str) and value.upper() in names:
        return names[value.upper()]
    raise ValueError(f"option {field}={value!r}: expected one of {sorted(names)}")


def _field_value(field: str, value):
    if field in _TENSOR_TYPE_FIELDS:
        return tensor_type(value) if not isinstance(value, (int, np.integer)) else int(value)
    if field in _ENUM_FIELDS:
        cls = _ENUM_FIELDS[field]
        if isinstance(value, (list, tuple, np.ndarray)):
            return [_enum_value(field, v, cls) for v in value]
        return _enum_value(field, value, cls)
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, np.generic):
        value = value.item()
    return value


def make_options(op_name: str, options: Union[None, Mapping[str, Any], Any]):
    """Build the options table object of a builtin op.

    Args:
        op_name: builtin op name (``"CONV_2D"``).
        options: ``None`` (schema defaults), a dict of snake_case schema field
            names (enum fields by name: ``padding="SAME"``,
            ``fused_activation_function="RELU6"``; TensorType fields by
            numpy dtype or name), or a ready ``XxxOptionsT`` object.

    Returns:
        ``(union, type_code, table)``: ``union`` is ``1`` for
        ``builtin_options`` or ``2`` for ``builtin_options_2``; ``table`` is
        ``None`` (and ``type_code`` 0) for ops without options.

    Raises:
        ValueError: unknown op, options given to an op without options, an
            unknown field name, or an unknown enum name.
    """
    table = options_table_name(op_name)
    if options is not None and not isinstance(options, Mapping):
        cls_name = type(options).__name__
        if not cls_name.endswith("OptionsT"):
            raise ValueError(f"{op_name}: options must be a dict or an XxxOptionsT object, got {cls_name}")
        table = cls_name[:-1]
        if table not in _OPTIONS_1 and table not in _OPTIONS_2:
            raise ValueError(f"{op_name}: {cls_name} is not a builtin options table")
        obj = options
    else:
        if table is None:
            if options:
                raise ValueError(f"{op_name} has no options table, but options {dict(options)} were given")
            return 1, 0, None
        obj = getattr(T, table + "T")()
        fields = {_snake(k): k for k in vars(obj)}
        for key, value in (options or {}).items():
            if key not in fields:
                raise ValueError(
                    f"{op_name}: {table} has no field {key!r}; its fields are {sorted(fields)}"
                )
            setattr(obj, fields[key], _field_value(key, value))
    if table in _OPTIONS_1:
        return 1, _OPTIONS_1[table], obj
    return 2, _OPTIONS_2[table], obj


def transpose_conv_bias_options(padding: str = "SAME", stride_w: int = 1, stride_h: int = 1) -> bytes:
    """Custom options of MediaPipe's ``Convolution2DTransposeBias``.

    A raw little-endian ``TfLiteTransposeConvParams`` struct (not a
    flexbuffer): int32 padding (1 = SAME, 2 = VALID), int32 stride_width,
    int32 stride_height.

    Raises:
        ValueError: padding is not ``"SAME"`` or ``"VALID"``.
    """
    codes = {"SAME": 1, "VALID": 2}
    if padding not in codes:
        raise ValueError(f"padding must be 'SAME' or 'VALID', got {padding!r}")
    return struct.pack("<iii", codes[padding], int(stride_w), int(stride_h))


# --- quantization -------------------------------------------------------------

def _quant_params(quant) -> Optional[Any]:
    if quant is None:
        return None
    if isinstance(quant, T.QuantizationParametersT):
        return quant
    if isinstance(quant, Mapping):
        scale = quant.get("scale")
        zp = quant.get("zero_point", 0)
        dim = int(quant.get("quantized_dimension", 0))
        qmin, qmax = quant.get("min"), quant.get("max")
    elif isinstance(quant, (tuple, list)) and len(quant) in (2, 3):
        scale, zp = quant[0], quant[1]
        dim = int(quant[2]) if len(quant) == 3 else 0
        qmin = qmax = None
    elif hasattr(quant, "scale") and hasattr(quant, "zero_point"):  # fbjax.ir.QuantParams
        scale, zp, dim = quant.scale, quant.zero_point, int(getattr(quant, "quantized_dimension", 0))
        qmin = qmax = None
    else:
        raise ValueError(
            "quant must be a dict(scale=, zero_point=, quantized_dimension=), "
            f"a (scale, zero_point[, dim]) tuple or QuantizationParametersT, got {quant!r}"
        )
    q = T.QuantizationParametersT()
    if scale is not None:
        s = np.atleast_1d(np.asarray(scale, np.float32))
        z = np.atleast_1d(np.asarray(zp, np.int64))
        if z.size == 1 and s.size > 1:
            z = np.full(s.shape, z[0], np.int64)
        if z.size != s.size:
            raise ValueError(f"quant: {s.size} scales but {z.size} zero points")
        q.scale = [float(v) for v in s]
        q.zeroPoint = [int(v) for v in z]
    if qmin is not None:
        q.min = [float(v) for v in np.atleast_1d(qmin)]
    if qmax is not None:
        q.max = [float(v) for v in np.atleast_1d(qmax)]
    q.quantizedDimension = dim
    return q


# Buffers are written 16-byte aligned, as the TF converter writes them, so
# kernels may use constants in place (shared with Model.save's writer).
from .tflite_writer import _AlignedBufferT  # noqa: E402


# --- builder --------------------------------------------------------------------

class _Subgraph:
    def __init__(self, name: str):
        self.name = name
        self.tensors: list = []
        self.inputs: list[int] = []
        self.outputs: list[int] = []
        self.operators: list = []


class TFLiteBuilder:
    """Incrementally build a TFLite model and serialize it with :meth:`build`.

    Tensors and ops are added to the current subgraph (subgraph 0, the entry
    point, unless :meth:`add_subgraph` switched to another). Tensor indices
    returned by :meth:`add_tensor` are per subgraph.

    Args:
        description: the model's ``description`` string.
    """

    def __init__(self, description: str = "written by fbjax.testing"):
        self.description = description
        self._subgraphs = [_Subgraph("main")]
        self._current = 0
        self._payloads: list[bytes] = [b""]  # buffer 0: the empty sentinel
        self._opcodes: dict[tuple, int] = {}
        self._opcode_list: list = []
        self._signatures: list = []

    # -- subgraphs ------------------------------------------------------------
    @property
    def subgraph(self) -> int:
        """Index of the subgraph that ``add_*`` calls write to."""
        return self._current

    def add_subgraph(self, name: Optional[str] = None) -> int:
        """Start a new subgraph (a control-flow body) and make it current.

        Returns:
            its index.
        """
        self._subgraphs.append(_Subgraph(name or f"subgraph_{len(self._subgraphs)}"))
        self._current = len(self._subgraphs) - 1
        return self._current

    def set_subgraph(self, index: int) -> None:
        """Make subgraph ``index`` current.

        Raises:
            IndexError: no such subgraph.
        """
        if not 0 <= index < len(self._subgraphs):
            raise IndexError(f"subgraph {index} does not exist ({len(self._subgraphs)} so far)")
        self._current = index

    @property
    def _sg(self) -> _Subgraph:
        return self._subgraphs[self._current]

    # -- tensors ----------------------------------------------------------------
    def add_tensor(
        self,
        shape: Optional[Sequence[int]] = None,
        dtype=np.float32,
        data: Optional[np.ndarray] = None,
        name: Optional[str] = None,
        quant=None,
        shape_signature: Optional[Sequence[int]] = None,
        is_variable: bool = False,
    ) -> int:
        """Add a tensor to the current subgraph.

        Args:
            shape: static shape (ints >= 0). Defaults to ``data.shape`` for
                constants; required otherwise.
            dtype: numpy dtype (``np.float32``, ``np.int8``, ``np.float16``,
                ``np.bool_``...) or a TensorType name. When ``data`` is given
                and ``dtype`` is left at float32, ``data.dtype`` is used.
            data: constant contents; written little-endian into a buffer of
                its own. ``data`` is cast to ``dtype`` and must have
                ``prod(shape)`` elements.
            name: tensor name (default ``"t<index>"``).
            quant: quantization: ``dict(scale=, zero_point=,
                quantized_dimension=)``, a ``(scale, zero_point[, dim])``
                tuple, or a ``QuantizationParametersT``.
            shape_signature: the shape with ``-1`` for dimensions known only at
                run time (``shape`` then holds 1 there, as converters write).
            is_variable: mark as a variable (state) tensor.

        Returns:
            the tensor's index in the current subgraph.

        Raises:
            ValueError: missing shape, data that does not fit the shape, an
                unknown dtype, or malformed quant.
        """
        sg = self._sg
        index = len(sg.tensors)
        if data is not None:
            data = np.asarray(data)
            if dtype is np.float32 and data.dtype != np.float32:
                dtype = data.dtype
            if shape is None:
                shape = data.shape
        if shape is None:
            raise ValueError("add_tensor: shape is required for a tensor without data")
        shape = [int(d) for d in shape]
        if any(d < 0 for d in shape):
            raise ValueError(f"add_tensor: negative dimension in {shape}; use shape_signature for dynamic dims")
        t = T.TensorT()
        t.shape = shape
        t.type = tensor_type(dtype)
        t.name = name if name is not None else f"t{index}"
        t.quantization = _quant_params(quant)
        t.isVariable = bool(is_variable)
        if shape_signature is not None:
            sig = [int(d) for d in shape_signature]
            if len(sig) != len(shape):
                raise ValueError(f"add_tensor: shape_signature {sig} and shape {shape} differ in rank")
            t.shapeSignature = sig
        t.buffer = 0
        if data is not None:
            np_dtype = np.dtype(dtype) if not isinstance(dtype, str) else None
            if np_dtype is None:
                raise ValueError("add_tensor: give a numpy dtype (not a name) for constant data")
            arr = np.asarray(data).astype(np_dtype, copy=False)
            need = int(np.prod(shape)) if shape else 1
            if arr.size != need:
                raise ValueError(
                    f"add_tensor: data has {arr.size} elements, shape {shape} needs {need}"
                )
            payload = np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
            t.buffer = len(self._payloads)
            self._payloads.append(payload)
        sg.tensors.append(t)
        return index

    def add_constant(self, data, dtype=None, name: Optional[str] = None, quant=None) -> int:
        """Add a constant tensor holding ``data`` (shape and dtype from it
        unless ``dtype`` is given). Returns its index."""
        arr = np.asarray(data) if dtype is None else np.asarray(data, dtype)
        return self.add_tensor(arr.shape, arr.dtype, data=arr, name=name, quant=quant)

    def add_shared_constant(self, subgraph: int, tensor: int, name: Optional[str] = None) -> int:
        """Add to the current subgraph a constant on the same buffer as
        constant ``tensor`` of ``subgraph`` (as converters write weights that
        several signatures' subgraphs share). Returns its index.

        Raises:
            IndexError: no such subgraph or tensor.
            ValueError: that tensor is not a constant.
        """
        src = self._subgraphs[subgraph].tensors[tensor]
        if not src.buffer:
            raise ValueError(f"tensor {tensor} of subgraph {subgraph} has no buffer (not a constant)")
        t = T.TensorT()
        t.shape, t.type, t.buffer = list(src.shape), src.type, src.buffer
        t.name = name if name is not None else src.name
        t.quantization = src.quantization
        self._sg.tensors.append(t)
        return len(self._sg.tensors) - 1

    def add_input(
        self,
        shape: Sequence[int],
        dtype=np.float32,
        name: Optional[str] = None,
        quant=None,
        shape_signature: Optional[Sequence[int]] = None,
    ) -> int:
        """Add a tensor and append it to the current subgraph's inputs.

        Arguments as in :meth:`add_tensor`. Returns its index.
        """
        idx = self.add_tensor(shape, dtype, name=name, quant=quant, shape_signature=shape_signature)
        self._sg.inputs.append(idx)
        return idx

    def add_output(self, index: int) -> int:
        """Append tensor ``index`` to the current subgraph's outputs.

        Raises:
            IndexError: no such tensor.
        """
        self._check_tensor(index)
        self._sg.outputs.append(int(index))
        return int(index)

    def _check_tensor(self, index: int) -> None:
        if not 0 <= int(index) < len(self._sg.tensors):
            raise IndexError(f"tensor {index} does not exist in subgraph {self._current}")

    # -- operators ------------------------------------------------------------------
    def _opcode(self, op_name: str, custom: bool, version: int) -> int:
        if custom:
            key = ("CUSTOM", op_name, version)
        else:
            if op_name not in BUILTIN_CODES:
                raise ValueError(_unknown_op_message(op_name))
            key = (op_name, None, version)
        if key not in self._opcodes:
            oc = T.OperatorCodeT()
            code = BUILTIN_CODES["CUSTOM"] if custom else BUILTIN_CODES[op_name]
            oc.builtinCode = code
            oc.deprecatedBuiltinCode = min(code, PLACEHOLDER_FOR_GREATER_OP_CODES)
            oc.version = int(version)
            if custom:
                oc.customCode = op_name
            self._opcodes[key] = len(self._opcode_list)
            self._opcode_list.append(oc)
        return self._opcodes[key]

    def add_op(
        self,
        op_name: str,
        inputs: Iterable[Optional[int]],
        outputs: Iterable[int],
        options=None,
        custom_options: Union[None, bytes, Mapping[str, Any]] = None,
        custom: bool = False,
        version: int = 1,
    ) -> int:
        """Append an operator to the current subgraph.

        Args:
            op_name: builtin op name (``"CONV_2D"``), or the custom code when
                ``custom=True`` (``"Convolution2DTransposeBias"``).
            inputs: tensor indices; ``-1`` or ``None`` for an omitted optional
                input (e.g. CONV_2D's bias).
            outputs: tensor indices.
            options: builtin options (see :func:`make_options`): a dict of
                snake_case schema field names, enums by name. Ops that have an
                options table always get one (schema defaults when ``None``;
                note e.g. ``stride_w`` defaults to 0 in the schema).
            custom_options: custom ops only: raw bytes, or a dict that is
                flexbuffer-encoded.
            custom: ``op_name`` is a custom code.
            version: the operator code's version.

        Returns:
            the operator's position in the subgraph.

        Raises:
            ValueError: unknown builtin name, bad options, options on a custom
                op or custom_options on a builtin.
            IndexError: a tensor index does not exist.
        """
        ins = [-1 if i is None else int(i) for i in inputs]
        outs = [int(i) for i in outputs]
        for i in ins:
            if i != -1:
                self._check_tensor(i)
        for i in outs:
            self._check_tensor(i)
        op = T.OperatorT()
        op.opcodeIndex = self._opcode(op_name, custom, version)
        op.inputs = ins
        op.outputs = outs
        if custom:
            if options is not None:
                raise ValueError(f"custom op {op_name!r}: use custom_options, not options")
            if custom_options is not None:
                if isinstance(custom_options, Mapping):
                    from flatbuffers import flexbuffers

                    custom_options = flexbuffers.Dumps(dict(custom_options))
                op.customOptions = list(bytes(custom_options))
                op.customOptionsFormat = T.CustomOptionsFormat.FLEXBUFFERS
        else:
            if custom_options is not None:
                raise ValueError(f"builtin op {op_name}: custom_options are for custom ops")
            union, code, table = make_options(op_name, options)
            if union == 1:
                op.builtinOptionsType, op.builtinOptions = code, table
            else:
                op.builtinOptions2Type, op.builtinOptions2 = code, table
        self._sg.operators.append(op)
        return len(self._sg.operators) - 1

    # -- signatures -------------------------------------------------------------------
    def add_signature(self, key: str, inputs: Mapping[str, int], outputs: Mapping[str, int],
                      subgraph: int = 0) -> None:
        """Add a ``SignatureDef``: names for tensors of ``subgraph``."""
        sd = T.SignatureDefT()
        sd.signatureKey = key
        sd.subgraphIndex = int(subgraph)

        def maps(d):
            out = []
            for n, i in d.items():
                tm = T.TensorMapT()
                tm.name, tm.tensorIndex = n, int(i)
                out.append(tm)
            return out

        sd.inputs, sd.outputs = maps(inputs), maps(outputs)
        self._signatures.append(sd)

    # -- serialization ---------------------------------------------------------------------
    def to_object(self) -> Any:
        """The model as a ``ModelT`` (object API), before packing."""
        m = T.ModelT()
        m.version = SCHEMA_VERSION
        m.description = self.description
        m.operatorCodes = list(self._opcode_list)
        m.buffers = [_AlignedBufferT(p) for p in self._payloads]
        subgraphs = []
        for s in self._subgraphs:
            sg = T.SubGraphT()
            sg.name = s.name
            sg.tensors = list(s.tensors)
            sg.inputs = list(s.inputs)
            sg.outputs = list(s.outputs)
            sg.operators = list(s.operators)
            subgraphs.append(sg)
        m.subgraphs = subgraphs
        if self._signatures:
            m.signatureDefs = list(self._signatures)
        return m

    def build(self) -> bytes:
        """Serialize to ``.tflite`` bytes (identifier ``TFL3``, version 3).

        Raises:
            ValueError: the main subgraph has no outputs.
        """
        if not self._subgraphs[0].outputs:
            raise ValueError("the main subgraph has no outputs; call add_output")
        size = sum(len(p) + _BUFFER_ALIGNMENT for p in self._payloads) + 4096
        builder = flatbuffers.Builder(size)
        root = self.to_object().Pack(builder)
        builder.Finish(root, file_identifier=FILE_IDENTIFIER)
        return bytes(builder.Output())


# --- one-op models ------------------------------------------------------------------------

def single_op_model(
    op_name: str,
    inputs: Sequence[Union[None, Sequence[int], np.ndarray]],
    options=None,
    output_shapes: Optional[Sequence[Sequence[int]]] = None,
    output_dtypes: Optional[Sequence] = None,
    input_dtypes: Optional[Sequence] = None,
    custom: bool = False,
    custom_options: Union[None, bytes, Mapping[str, Any]] = None,
) -> bytes:
    """A model made of one operator.

    Args:
        op_name: builtin op name, or custom code with ``custom=True``.
        inputs: one entry per op input, in the op's input order: a shape
            (tuple/list of ints) makes a model input; a numpy array makes a
            constant (its dtype is kept: use ``np.int32`` for shape-like
            inputs); ``None`` omits an optional input.
        options: builtin options dict (see :meth:`TFLiteBuilder.add_op`).
        output_shapes: shapes of the op's outputs; default: one output with
            the shape of the first model input (or first constant).
        output_dtypes: dtypes of the outputs (default float32 each).
        input_dtypes: dtypes of the model inputs, in order (default float32).
        custom: ``op_name`` is a custom code.
        custom_options: raw bytes or a dict (flexbuffer) for custom ops.

    Returns:
        the ``.tflite`` bytes. Model inputs are the shape entries of
        ``inputs`` in order; model outputs are the op's outputs in order.

    Raises:
        ValueError: as :meth:`TFLiteBuilder.add_op`, or mismatched lengths of
            ``output_dtypes``/``input_dtypes``.
    """
    b = TFLiteBuilder(description=f"fbjax.testing.single_op_model({op_name})")
    n_model_inputs = sum(1 for x in inputs if x is not None and not isinstance(x, np.ndarray))
    if input_dtypes is None:
        input_dtypes = [np.float32] * n_model_inputs
    if len(input_dtypes) != n_model_inputs:
        raise ValueError(f"{len(input_dtypes)} input_dtypes for {n_model_inputs} model inputs")
    ins: list[int] = []
    first_shape = None
    k = 0
    for j, x in enumerate(inputs):
        if x is None:
            ins.append(-1)
        elif isinstance(x, np.ndarray):
            ins.append(b.add_tensor(x.shape, x.dtype, data=x, name=f"const{j}"))
            if first_shape is None:
                first_shape = x.shape
        else:
            ins.append(b.add_input(tuple(x), input_dtypes[k], name=f"input{k}"))
            if first_shape is None or k == 0:
                first_shape = tuple(x)
            k += 1
    if output_shapes is None:
        if first_shape is None:
            raise ValueError("output_shapes is required for an op without inputs")
        output_shapes = [first_shape]
    if output_dtypes is None:
        output_dtypes = [np.float32] * len(output_shapes)
    if len(output_dtypes) != len(output_shapes):
        raise ValueError(f"{len(output_dtypes)} output_dtypes for {len(output_shapes)} output shapes")
    outs = [b.add_tensor(s, d, name=f"output{i}") for i, (s, d) in enumerate(zip(output_shapes, output_dtypes))]
    b.add_op(op_name, ins, outs, options=options, custom_options=custom_options, custom=custom)
    for o in outs:
        b.add_output(o)
    return b.build()


# --- STABLEHLO_* one-op models ------------------------------------------------------------

def stablehlo_op_model(
    op_name: str,
    inputs: Sequence[Union[tuple, np.ndarray]],
    outputs: Sequence[tuple],
    options: Optional[Mapping[str, Any]] = None,
    bodies: Optional[Mapping[str, Any]] = None,
) -> bytes:
    """A model made of one ``STABLEHLO_*`` builtin (codes 162 onwards), with
    its region bodies as appended subgraphs, as TensorFlow's converter writes
    them with ``OpsSet.EXPERIMENTAL_STABLEHLO_OPS``.

    Args:
        op_name: ``"STABLEHLO_SCATTER"``...
        inputs: per op input, a ``(shape, dtype)`` pair (a model input) or a
            numpy array (a constant).
        outputs: per op output, a ``(shape, dtype)`` pair; they are the model
            outputs.
        options: the ``builtin_options_2`` fields (snake_case; enums by name,
            ``comparison_direction="STABLEHLO_COMPARISON_DIRECTION_LT"``),
            without the subgraph-index fields that ``bodies`` sets.
        bodies: option field -> body. A body is a builtin name
            (``"STABLEHLO_ADD"``: a subgraph ``(lhs, rhs) -> op(lhs, rhs)``
            on scalars of the first input's dtype), the string ``"RETURN_RHS"``
            (``(lhs, rhs) -> rhs``, a scatter body that replaces), or a
            callable ``fn(builder)`` that fills the current (new) subgraph:
            its inputs, ops and outputs. A list of bodies (``CASE``'s
            ``branch_subgraph_indices``) gives one subgraph each.

    Returns:
        the ``.tflite`` bytes.

    Raises:
        ValueError: as :meth:`TFLiteBuilder.add_op`.
    """
    b = TFLiteBuilder(description=f"fbjax.testing.stablehlo_op_model({op_name})")
    ins = []
    first_dtype = None
    for j, x in enumerate(inputs):
        if isinstance(x, np.ndarray):
            ins.append(b.add_tensor(x.shape, x.dtype, data=x, name=f"const{j}"))
            first_dtype = first_dtype or x.dtype
        else:
            shape, dt = x
            ins.append(b.add_input(tuple(shape), dt, name=f"input{j}"))
            first_dtype = first_dtype or np.dtype(dt)
    outs = [b.add_tensor(tuple(s), d, name=f"output{i}") for i, (s, d) in enumerate(outputs)]
    opts = dict(options or {})

    def body(spec) -> int:
        idx = b.add_subgraph()
        if callable(spec):
            spec(b)
        else:
            lhs = b.add_input((), first_dtype, name="lhs")
            rhs = b.add_input((), first_dtype, name="rhs")
            if spec == "RETURN_RHS":
                b.add_output(rhs)
            else:
                r = b.add_tensor((), first_dtype, name="result")
                b.add_op(spec, [lhs, rhs], [r])
                b.add_output(r)
        b.set_subgraph(0)
        return idx

    for field, spec in (bodies or {}).items():
        opts[field] = [body(s) for s in spec] if isinstance(spec, (list, tuple)) else body(spec)
    b.add_op(op_name, ins, outs, options=opts or None)
    for o in outs:
        b.add_output(o)
    return b.build()
