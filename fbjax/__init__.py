"""fbjax: flatbuffer ML models (``.tflite``, ``.rten``, ``stablehlo.flatbuf`` and
TFLite GPU delegate ``.bin`` files) as jitted, differentiable JAX functions.

Quick use::

    import fbjax
    model = fbjax.load("model.tflite")
    y = model(x)                       # jitted
    g = jax.grad(lambda p: model.apply(p, x).sum())(model.params)

Layout: ``fbjax/formats`` parses files into the IR (``fbjax/ir.py``);
``fbjax/lower`` lowers IR ops to ``jax.lax`` (one registry keyed by
(op set, op name)); ``fbjax/reference`` is the independent numpy oracle.
"""

import warnings

from .errors import FbjaxError, InputError, ModelFormatError, UnsupportedOperatorError
from .model import Model, SignatureSpec, TensorSpec, load
from .options import KernelOptions  # fbjax.load(..., kernel_options=KernelOptions(...))
from .train import trainable
from .batch_inference import infer  # the module: fbjax.batch_inference (sources, sinks, stepping)
from .generation import generate  # the module: fbjax.generation
from .llm_bundle import LlmBundle  # what fbjax.load returns for a .litertlm / LLM .task bundle
from .lower.stablehlo.custom import register_custom_call
from .custom import register_custom_op
from .formats.vision_task import VisionTaskBundle  # what fbjax.load returns for a MediaPipe Tasks vision .task
from . import data  # fbjax.data.DEFAULT_MODEL: the bundled model (README snippets, `fbjax run`)

__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "TaskBundle":  # issue 36: vision and LLM .task bundles named apart
        warnings.warn("fbjax.TaskBundle is deprecated: use fbjax.VisionTaskBundle (a MediaPipe Tasks vision .task; "
                      "an LLM .task loads as fbjax.LlmBundle)", DeprecationWarning, stacklevel=2)
        return VisionTaskBundle
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def supported_ops(op_set: str | None = None) -> dict[str, list[str]]:
    """Names of the ops fbjax can lower, grouped by op set.

    Args:
        op_set: restrict to one op set: ``"tflite"`` (float builtins),
            ``"tflite.int"`` (the bit-exact quantized kernels),
            ``"tflite.hybrid"``, ``"tflite.custom"`` (MediaPipe and
            registered custom ops), ``"onnx"`` (``.rten``), ``"stablehlo"``,
            ``"stablehlo.custom_call"`` (custom-call targets with a handler),
            ``"gpu_cl"`` (TFLite GPU delegate ``.bin``, the format of that
            name; ``"gpu"`` before, a name JAX gives its GPU backend: still
            accepted, with a ``DeprecationWarning``), ``"fbjax"`` (fbjax's own
            helper ops).

    Returns:
        ``{op_set: sorted list of op names}``, generated from the registry.

    Raises:
        ValueError: ``op_set`` is not one of the registry's op sets.

    Warns:
        DeprecationWarning: ``op_set`` is ``"gpu"`` (read as ``"gpu_cl"``).
    """
    from .lower import LOWERINGS

    if op_set == "gpu":  # issue 36: one meaning per name (the JAX backend keeps "gpu")
        warnings.warn('supported_ops("gpu") is deprecated: the TFLite GPU delegate op set is "gpu_cl"',
                      DeprecationWarning, stacklevel=2)
        op_set = "gpu_cl"

    if op_set is not None and op_set not in LOWERINGS.ops():
        raise ValueError(f"unknown op set {op_set!r}; the op sets are {sorted(LOWERINGS.ops())}")
    return LOWERINGS.ops(op_set)


__all__ = [
    "load", "Model", "TensorSpec", "SignatureSpec", "supported_ops",
    "FbjaxError", "ModelFormatError", "UnsupportedOperatorError", "InputError",
    "register_custom_call", "trainable", "infer", "generate",
    "register_custom_op", "VisionTaskBundle", "LlmBundle", "KernelOptions",
]
