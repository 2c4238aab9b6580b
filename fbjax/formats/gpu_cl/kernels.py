"""The op table: one :class:`Kernel` entry per GPU operation type the reader turns into IR nodes.

Op types exist only in node names (``"convolution_2d 12 linked : relu 13"``);
each names an op of op set ``"gpu_cl"`` (:mod:`fbjax.lower.gpu`, numpy twin
:mod:`fbjax.reference.gpu`). An entry says how many tensors the op reads
(as the kernel's own op and as a linked, fused element-wise op), which weight
objects it owns, and how its attributes and constant inputs are read from the
node's arguments, objects and code (TF 2.5 ``gpu/common/tasks/*``).

Adding a kernel is adding an entry here, its lowering (``fbjax/lower/gpu/ops.py``,
with its facts at the registration), its numpy twin (``fbjax/reference/gpu/ops.py``)
and a generated case in ``tests/test_parity_gpu.py``, which fails until all
four exist.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Optional

from ...errors import ModelFormatError, UnsupportedOperatorError
from ...ir import Value
from .nodes import GpuNode
from .weights import slices

OP_SET = "gpu_cl"


def unsupported(where: str, op: str, variant: str) -> UnsupportedOperatorError:
    """A kernel variant fbjax does not read (its weights' layout, a constant operand): the op type and node named."""
    return UnsupportedOperatorError({(OP_SET, f"{op} ({variant})"): 1}, detail=f"{where}: {op} with {variant}.")


@dataclass
class KernelCall:
    """What a :class:`Kernel` reader sees of one op of a node.

    Attributes:
        node: the stored node.
        op: the op type; ``link`` its position in the node's name (0: the kernel's own op, N: linked op N).
        ins: the runtime tensors the op reads (``[B, H, W, C]`` values; for a linked op the running value first).
        out: the op's output value (its shape is the file's).
        where: the node, for messages.
        const: ``const(object name, layout, TFLite shape, param name, **layout args) -> Value``: a weight decoded
            from one of the node's objects (:func:`fbjax.formats.gpu_cl.weights.weight_index`).
    """

    node: GpuNode
    op: str
    link: int
    ins: list
    out: Value
    where: str
    const: Callable

    @property
    def suffix(self) -> str:
        """How the node names this op's arguments and objects: ``""``, or ``"_link<N>"`` for linked op N."""
        return f"_link{self.link}" if self.link else ""

    @property
    def param_prefix(self) -> str:
        """``"<op type> <graph id>"``: the op's params are named ``"<prefix>/<weight>"``."""
        op, gid = self.node.ops[self.link]
        return f"{op} {gid}"


def _no_attrs(k: KernelCall) -> tuple[dict, list]:
    return {}, []


@dataclass(frozen=True)
class Kernel:
    """One GPU operation type (a node-name op type) and how the reader reads it.

    Attributes:
        op: the op type as node names spell it, which is also its op name in op set ``"gpu_cl"``.
        read: ``read(KernelCall) -> (attrs, constant inputs)``: the op's attributes (keyword arguments of its
            lowering) and the weights it reads after its tensors; raises ``ModelFormatError`` for a node that
            contradicts itself and :func:`unsupported` for a variant fbjax does not decode.
        inputs: ``(min, max)`` tensors the op reads as a kernel's own op (``max`` None: any number).
        few_inputs: when set, a node with fewer tensors than ``inputs`` asks for is this unsupported variant
            (``"a constant operand"``) rather than a damaged file.
        objects: the weight objects the kernel's own op owns; any other object of the node that no linked op
            owns is a variant fbjax does not read.
        linkable: the op may be fused after another kernel (``" linked : <op> <id>"``, element-wise ops).
        link_inputs: ``(min, max)`` tensors read when linked, the running value included (2: the node's
            arguments name a second tensor for it, ``second_tensor_link<N>_*``).
        link_objects: objects a linked op owns, named ``<name>_link<N>``.
    """

    op: str
    read: Callable = _no_attrs
    inputs: tuple = (1, 1)
    few_inputs: str = ""
    objects: frozenset = field(default_factory=frozenset)
    linkable: bool = False
    link_inputs: tuple = (1, 1)
    link_objects: frozenset = field(default_factory=frozenset)


# --- readers --------------------------------------------------------------------------------

def _window(ints: dict) -> dict:
    """``kernel`` / ``strides`` / ``dilations`` ``(y, x)`` and ``padding`` before ``(y, x)`` (the kernel's
    ``padding_*`` arguments are minus the padding)."""
    return {"kernel": (ints.get("kernel_size_y", 1), ints.get("kernel_size_x", 1)),
            "strides": (ints.get("stride_y", 1), ints.get("stride_x", 1)),
            "dilations": (ints.get("dilation_y", 1), ints.get("dilation_x", 1)),
            "padding": (-ints.get("padding_y", 0), -ints.get("padding_x", 0))}


def _code_group(code: str) -> int:
    """Output slices per weight group of a general convolution kernel (its accumulators ``r_..._s<k>``)."""
    ks = [int(k) for k in re.findall(r"\br_w\d+_h\d+_s(\d+)\b", code)]
    return max(ks) + 1 if ks else 1


def _linear(k: KernelCall, obj: str, pname: str, shape: Optional[tuple] = None) -> Value:
    """A per-channel weight (bias, PReLU slope): one float4 per channel slice."""
    c = k.out.shape[3]
    return k.const(obj, "linear", shape or (c,), pname)


def _convolution_2d(k: KernelCall) -> tuple[dict, list]:
    """``ConvPowerVR`` / ``ConvBuffer1x1`` (weights in one buffer, OHWI groups of output slices, I4O4 or O4I4
    as the code's ``dot(`` tells), ``ConverterToConvWeights`` (a runtime filter passed through) and the
    convolution reading that runtime filter as its second tensor."""
    ints, objs, code = k.node.ints, k.node.objects, k.node.code
    c_out, c_in = k.out.shape[3], k.ins[0].shape[3]
    if "weights" not in objs and len(k.ins) == 1 and "biases" not in objs:
        # ConverterToConvWeights: reorders a runtime OHWI filter (as a B=O, H, W, C=I tensor) into the
        # convolution weight layout; in the IR its output is that filter, OHWI
        k.out.shape = k.ins[0].shape
        return {"variant": "converter"}, []
    if "weights" not in objs:  # weights from the second input (a converter's output), OHWI
        if len(k.ins) != 2 or "biases" not in objs:
            raise ModelFormatError(f"{k.where}: a convolution with neither weights nor a runtime filter input")
        attrs = _window(ints)
        attrs["kernel"] = tuple(k.ins[1].shape[1:3])
        attrs["variant"] = "runtime_weights"
        return attrs, [_linear(k, "biases", "bias")]
    if len(k.ins) != 1:
        raise ModelFormatError(f"{k.where}: a convolution with weights objects reads {len(k.ins)} tensors, not 1")
    attrs = _window(ints)
    kh, kw = attrs["kernel"]
    obj = objs["weights"]
    if obj.kind != "buffer":
        raise unsupported(k.where, "convolution_2d", f"weights in {obj.kind} objects")
    group = _code_group(code)
    layout = "conv_o4i4" if re.search(r"\bdot\(", code) else "conv_i4o4"
    need = -(-slices(c_out) // group) * group * kh * kw * slices(c_in) * 16
    if obj.flat.size != need:
        raise ModelFormatError(f"{k.where}: weights hold {obj.flat.size} values; a {kh}x{kw} convolution "
                               f"{c_in}->{c_out} channels in groups of {group} output slices needs {need} "
                               "(Winograd or another layout fbjax does not decode)")
    w = k.const("weights", layout, (c_out, kh, kw, c_in), "weights", group=group)
    attrs["variant"] = "general" if "kernel_size_x" in ints else "1x1"
    return attrs, [w, _linear(k, "biases", "bias")]


def _depthwise_convolution(k: KernelCall) -> tuple[dict, list]:
    """``DepthwiseConv`` (weights per channel slice, y, x; biases linear) or ``DepthwiseConv3x3`` (no biases
    object: stride 1, padding 1, per slice 9 float4 weights then a float4 of biases)."""
    c_out, c_in = k.out.shape[3], k.ins[0].shape[3]
    if c_out != c_in:
        raise unsupported(k.where, "depthwise_convolution", "channel multiplier != 1")
    if "biases" in k.node.objects:
        attrs = _window(k.node.ints)
        kh, kw = attrs["kernel"]
        attrs["variant"] = "general"
        return attrs, [k.const("weights", "dw", (1, kh, kw, c_out), "weights"), _linear(k, "biases", "bias")]
    attrs = {"kernel": (3, 3), "strides": (1, 1), "dilations": (1, 1), "padding": (1, 1), "variant": "3x3"}
    return attrs, [k.const("weights", "dw3x3", (1, 3, 3, c_out), "weights"),
                   k.const("weights", "dw3x3_bias", (c_out,), "bias")]


def _fully_connected(k: KernelCall) -> tuple[dict, list]:
    """``FullyConnected``: ``[O, I]`` weights in 4x4 blocks, linear biases; the input is ``[B, 1, 1, I]``."""
    if tuple(k.ins[0].shape[1:3]) != (1, 1) or tuple(k.out.shape[1:3]) != (1, 1):
        raise ModelFormatError(f"{k.where}: a fully connected kernel reads and writes [B, 1, 1, C] tensors, not "
                               f"{list(k.ins[0].shape)} -> {list(k.out.shape)}")
    w = k.const("weights", "fc", (k.out.shape[3], k.ins[0].shape[3]), "weights")
    return {}, [w, _linear(k, "biases", "bias")]


def _convolution_transposed(k: KernelCall) -> tuple[dict, list]:
    """``ConvolutionTransposedThin`` with one output channel: kernel size from the code's accumulator
    ``float r[KH][KW]``, stride from ``X *= S``; weights per input slice, y, x, then a float4 of biases."""
    code = k.node.code
    m = re.search(r"float r\[(\d+)\]\[(\d+)\];", code)
    sx = re.search(r"X \*= (\d+);", code)
    c_out, c_in = k.out.shape[3], k.ins[0].shape[3]
    if not m or not sx or c_out != 1 or "weights" not in k.node.objects:
        raise unsupported(k.where, "convolution_transposed", "a kernel other than ConvolutionTransposedThin "
                          "with one output channel")
    kh, kw, s_ = int(m.group(1)), int(m.group(2)), int(sx.group(1))
    w = k.const("weights", "transposed_thin", (c_out, kh, kw, c_in), "weights")
    bias = k.const("weights", "transposed_thin_bias", (c_out,), "bias", taps=kh * kw * slices(c_in))
    return {"kernel": (kh, kw), "strides": (s_, s_), "variant": "thin"}, [w, bias]


def _pooling_2d(k: KernelCall) -> tuple[dict, list]:
    """``Pooling``: window arguments; max when the code takes ``max(``, else average."""
    attrs = _window(k.node.ints)
    attrs["kind"] = "max" if re.search(r"\bmax\(", k.node.code) else "average"
    return attrs, []


def _prelu(k: KernelCall) -> tuple[dict, list]:
    """``PReLU``: slopes ``alpha`` (``alpha_link<N>`` when linked), one float4 per channel slice, as ``[1, 1, C]``.
    The kernel's other forms (TF ``tasks/prelu.cc``) are refused: slopes per pixel (an HWC alpha tensor:
    more than one float4 per slice) and a ``clip`` argument (``clamp(x, 0, clip)`` for the positive part)."""
    c = k.ins[0].shape[3]
    obj = k.node.objects.get(f"alpha{k.suffix}")
    if obj is not None and obj.flat.size > slices(c) * 4:
        raise unsupported(k.where, "prelu", "slopes per pixel")
    if k.node.floats.get(f"clip{k.suffix}", 0):
        raise unsupported(k.where, "prelu", "a clip")
    return {}, [k.const(f"alpha{k.suffix}", "linear", (1, 1, c), f"{k.param_prefix}/alpha")]


def _relu(k: KernelCall) -> tuple[dict, list]:
    """``ReLU``: float arguments ``clip`` and ``alpha`` (``clip_link<N>``... when linked), 0 when absent."""
    f = k.node.floats
    return {"clip": float(f.get(f"clip{k.suffix}", 0.0)), "alpha": float(f.get(f"alpha{k.suffix}", 0.0))}, []


def _resize(k: KernelCall) -> tuple[dict, list]:
    """``Resize``, bilinear (the code interpolates: ``mix(``, ``st.x``), half-pixel centres when it adds 0.5;
    ``scale`` the file's ``scale_factor_y`` / ``scale_factor_x``. Nearest-neighbour sampling (the kernel's
    ``ReadNearest``, with align-corners rounding) has no real file to check its code against: refused."""
    code, f = k.node.code, k.node.floats
    if "bilinear" not in code and "mix(" not in code and "st.x" not in code:
        raise unsupported(k.where, "resize", "nearest-neighbour sampling")
    return {"method": "bilinear", "half_pixel": "+ 0.5f" in code or "0.5f)" in code,
            "scale": (f.get("scale_factor_y", 1.0), f.get("scale_factor_x", 1.0))}, []


def _mean(k: KernelCall) -> tuple[dict, list]:
    """``Mean`` over height and width (``[B, H, W, C] -> [B, 1, 1, C]``); a mean over other axes is refused."""
    if tuple(k.out.shape[1:3]) != (1, 1) or k.out.shape[3] != k.ins[0].shape[3]:
        raise unsupported(k.where, "mean", f"a mean over other axes ({list(k.ins[0].shape)} -> {list(k.out.shape)})")
    return {}, []


def _pad(k: KernelCall) -> tuple[dict, list]:
    """``Padding`` with zeros: ``prepended_y`` / ``_x`` / ``_z`` (channels) before; the output shape gives the
    rest. Reflect padding (the code's ``reflect_coord``) and batch padding (``prepended_w``) are refused."""
    ints = k.node.ints
    if "reflect_coord" in k.node.code:
        raise unsupported(k.where, "pad", "reflect padding")
    if ints.get("prepended_w", 0) or k.ins[0].shape[0] != k.out.shape[0]:
        raise unsupported(k.where, "pad", "batch padding")
    return {"prepended": (ints.get("prepended_y", 0), ints.get("prepended_x", 0), ints.get("prepended_z", 0))}, []


def _slice(k: KernelCall) -> tuple[dict, list]:
    """``StridedSlice`` (TF ``tasks/strided_slice.cc``): source index ``offset + position * stride`` per axis
    (strides may be negative). When the channel stride is 1 and the start a multiple of 4 the kernel reads
    whole slices and ``offset_z`` counts slices (its code has no per-channel read); ``offsets`` is in channels.
    A slice of the batch (``offset_b`` / ``stride_b``) is refused."""
    ints, code = k.node.ints, k.node.code
    if ints.get("offset_b", 0) != 0 or ints.get("stride_b", 1) != 1 or k.ins[0].shape[0] != k.out.shape[0]:
        raise unsupported(k.where, "slice", "a slice of the batch")
    per_channel = "ReadPerChannel" in code or re.search(r"\bs_ch\b", code) is not None
    oz = ints.get("offset_z", 0) * (1 if per_channel else 4)
    return {"offsets": (ints.get("offset_y", 0), ints.get("offset_x", 0), oz),
            "strides": (ints.get("stride_y", 1), ints.get("stride_x", 1), ints.get("stride_z", 1))}, []


def _second_tensor(k: KernelCall) -> tuple[dict, list]:
    """Two-input element-wise kernels (TF 2.5 ``tasks/elementwise.cc`` ``CreateElementwiseTwoInput``, and
    ``add`` also ``tasks/add.cc``): ``in_out_value = in_out_value <op> second_val``, the running value first.
    The second operand is a runtime tensor, the node's tensor after the running value's, which the arguments
    name ``second_tensor`` (``second_tensor_link<N>`` when linked): as a tensor reference, or as a tensor
    object holding no data (both describe a tensor the graph computes). A ``second_tensor`` object holding
    data is a constant operand (``CreateElementwise`` with a linear or HWC constant), which fbjax does not
    decode."""
    obj = k.node.objects.get(f"second_tensor{k.suffix}")
    if obj is not None and obj.flat.size:
        raise unsupported(k.where, k.op, "a constant operand" + (", linked" if k.link else ""))
    return {}, []


#: two-input element-wise ops: the kernel's own op reads 2 tensors (add and mul: 2 or more, as before), a linked
#: one the running value and one more; the ``second_tensor`` object (a runtime tensor's descriptor) is theirs
_BINARY = dict(read=_second_tensor, inputs=(2, 2), few_inputs="a constant operand", linkable=True,
               link_inputs=(2, 2), objects=frozenset({"second_tensor"}), link_objects=frozenset({"second_tensor"}))

#: op type -> its entry; the op names of op set "gpu_cl"
KERNELS: dict[str, Kernel] = {k.op: k for k in (
    Kernel("convolution_2d", _convolution_2d, inputs=(1, 2), objects=frozenset({"weights", "biases"})),
    Kernel("depthwise_convolution", _depthwise_convolution, objects=frozenset({"weights", "biases"})),
    Kernel("fully_connected", _fully_connected, objects=frozenset({"weights", "biases"})),
    Kernel("convolution_transposed", _convolution_transposed, objects=frozenset({"weights"})),
    Kernel("pooling_2d", _pooling_2d),
    Kernel("add", **{**_BINARY, "inputs": (2, None)}),
    Kernel("mul", **{**_BINARY, "inputs": (2, None)}),
    Kernel("subtract", **_BINARY),
    Kernel("div", **_BINARY),
    Kernel("maximum", **_BINARY),
    Kernel("minimum", **_BINARY),
    Kernel("prelu", _prelu, objects=frozenset({"alpha"}), link_objects=frozenset({"alpha"}), linkable=True),
    Kernel("relu", _relu, linkable=True),
    Kernel("sigmoid", linkable=True),
    Kernel("hard_swish", linkable=True),
    Kernel("concat", inputs=(2, None)),
    Kernel("reshape"),
    Kernel("mean", _mean),
    Kernel("pad", _pad),
    Kernel("slice", _slice),
    Kernel("resize", _resize),
)}
