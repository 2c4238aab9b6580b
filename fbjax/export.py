"""Exporters: JAX functions -> flatbuffer model files.

:func:`to_stablehlo_flatbuffer` writes a JAX function, from the StableHLO
module JAX lowers it to, in the prototype ``stablehlo.flatbuf`` format
(``schemas/stablehlo.fbs``) that :func:`fbjax.load` reads back::

    data = fbjax.export.to_stablehlo_flatbuffer(fn, x, w)
    model = fbjax.load(data)           # model(x, w) == fn(x, w)

The MLIR-to-flatbuffer writer itself is
:mod:`fbjax.formats.stablehlo_mlir` (beside the reader; its public names
are re-exported here): only the format's 25 operators can be written, and a
module with any other op or type raises :class:`ExportError` listing every
offending op.

:func:`jax_export` is ``jax.export`` of a loaded model's
``apply(params, *inputs)`` at the file's batch, a fixed batch, or a symbolic
batch ``b``; an operator whose lowering cannot follow a symbolic batch
raises :class:`DynamicBatchError` naming the node (instead of jax's
``InconclusiveDimensionOperation`` traceback)::

    model = fbjax.load("model.tflite", batch_size=None)
    exported = fbjax.export.jax_export(model, batch_size=None)
    y = exported.call(model.params, x)          # any batch
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from .errors import FbjaxError, InputError
from .lower import cpu_kernels
from .formats.stablehlo_mlir import (  # noqa: F401 (the writer's public names, re-exported here)
    ExportError, StablehloFlatbufferWriter, dense_to_numpy, element_dtype, module_to_stablehlo_flatbuffer,
    tensor_shape)

__all__ = ["ExportError", "DynamicBatchError", "jax_export", "dynamic_batch_errors", "to_stablehlo_flatbuffer",
           "module_to_stablehlo_flatbuffer", "StablehloFlatbufferWriter"]


class DynamicBatchError(FbjaxError, NotImplementedError):
    """An operator's lowering cannot follow a symbolic batch dimension
    (``jax.export`` shape polymorphism): it needs the batch as a number.

    Attributes:
        location: the node's place in the file (``"subgraph 0, operator 3"``),
            or None when the failing lowering could not be identified.
        op_name: the operator (``"Shape"``), or None.
    """

    def __init__(self, location: Optional[str], op_name: Optional[str], detail: str):
        self.location, self.op_name = location, op_name
        where = f"{location} ({op_name})" if location else "the model"
        super().__init__(
            f"{where} cannot be exported with a dynamic batch: {detail}. "
            "Export with a fixed batch size instead (--batch-size N, or batch_size=N)."
        )


def _failing_node(exc: BaseException):
    """(location, op_name) of the innermost lowering on ``exc``'s traceback:
    the deepest frame holding a lowering context ``ctx``, or (None, None)."""
    from .ir import OpContext

    found = (None, None)
    seen = set()
    e = exc
    while e is not None and id(e) not in seen:  # the filtered traceback, then jax's unfiltered one
        seen.add(id(e))
        tb = e.__traceback__
        while tb is not None:
            ctx = tb.tb_frame.f_locals.get("ctx")
            if isinstance(ctx, OpContext) and getattr(ctx, "node", None) is not None:
                found = (ctx.node.location, ctx.node.op_name)
            tb = tb.tb_next
        if found[0] is not None:
            return found
        e = e.__cause__ or e.__context__
    return found


def _poly_error_types() -> tuple:
    import jax

    t = getattr(jax.errors, "InconclusiveDimensionOperation", None)
    if t is None:  # older jax
        from jax._src.export.shape_poly import InconclusiveDimensionOperation as t  # noqa: N813
    return (t,)


class dynamic_batch_errors:  # noqa: N801 - used as a context manager, like contextlib's
    """Context manager turning shape-polymorphism failures raised while a
    model is traced with a symbolic batch into :class:`DynamicBatchError`.

    jax's ``InconclusiveDimensionOperation`` (a symbolic dim used where a
    number is needed: ``int(d)``, ``d > 1``, ``np.zeros(shape)``) is always
    translated. Other non-fbjax exceptions raised inside a lowering are
    translated too when ``symbolic`` is true: the model traced at concrete
    batches when it was loaded, so a failure only under the symbolic batch
    is one. fbjax's own errors pass unchanged (they already name the node).
    """

    def __init__(self, symbolic: bool = True):
        self.symbolic = symbolic

    def __enter__(self):
        return self

    def __exit__(self, typ, exc, tb):
        if exc is None or isinstance(exc, FbjaxError):
            return False
        poly = isinstance(exc, _poly_error_types())
        if not poly and not (self.symbolic and isinstance(exc, Exception)):
            return False
        location, op_name = _failing_node(exc)
        if not poly and location is None:
            return False  # not from a lowering: not ours to explain
        first = str(exc).strip().splitlines()[0].rstrip(".") if str(exc).strip() else ""
        raise DynamicBatchError(location, op_name, f"{type(exc).__name__}: {first}") from exc


def jax_export(model, *, batch_size="file"):
    """``jax.export.export`` of ``model.apply(params, *inputs)``.

    Args:
        model: a :class:`fbjax.Model` (for ``batch_size=None`` load it with
            ``fbjax.load(path, batch_size=None)``), or one of its signatures
            (``model.signature(key)``, a
            :class:`~fbjax.signature.SignatureRunner`: the artifact then
            takes that signature's inputs in its order and returns
            ``{output name: array}``; ``fbjax export --signature``).
        batch_size: how a leading input dim the model leaves unknown
            (``fbjax.load(..., batch_size=None)``) is exported: None, the
            symbolic batch ``b`` (one artifact for every batch size); an int;
            ``"file"`` (default): 1. Other unknown dims are 1.

    Returns:
        ``jax.export.Exported``; ``exported.call(params, *inputs)``.

    Raises:
        DynamicBatchError: with ``batch_size=None``, an operator's lowering
            cannot follow a symbolic batch; the message names the node.
        InputError: ``batch_size`` is None or another int than the batch of
            a model whose inputs all have a fixed batch (load it with
            ``batch_size=None`` first); the model's program calls fbjax's
            native CPU kernels (:mod:`fbjax.lower.cpu_kernels`, quantized
            matrix products and float32 attention on CPU), which an artifact cannot carry (load it
            with ``kernel_options=KernelOptions(native_kernels=False)``).
    """
    import jax
    from jax import export as jexport

    if batch_size != "file" and model.inputs and not any(s.shape and s.shape[0] is None for s in model.inputs):
        fixed = {s.shape[0] for s in model.inputs if s.shape}
        if batch_size is None or fixed != {int(batch_size)}:
            raise InputError(f"jax_export(batch_size={batch_size!r}): the model's inputs have the fixed batch "
                             f"{sorted(fixed)}; load it with fbjax.load(path, batch_size=None) to export "
                             "another or a dynamic batch")
    b = jexport.symbolic_shape("b")[0] if batch_size is None else None
    params = {k: jax.ShapeDtypeStruct(np.shape(v), v.dtype) for k, v in model.params.items()}
    lead = b if b is not None else (int(batch_size) if isinstance(batch_size, (int, np.integer)) else 1)
    ins = [jax.ShapeDtypeStruct(tuple(d if d is not None else (lead if i == 0 else 1) for i, d in enumerate(s.shape)),
                                s.dtype) for s in model.inputs]
    symbolic = b is not None and any(s.shape and s.shape[0] is None for s in model.inputs)
    with dynamic_batch_errors(symbolic=symbolic), jax.enable_x64(getattr(model, "_x64", False)):
        try:
            return jexport.export(jax.jit(model.apply))(params, *ins)
        except ValueError as e:
            if "custom call" not in str(e) or not any(t in str(e) for t in cpu_kernels.TARGETS):
                raise
            raise InputError("jax_export: this model's quantized matrix products or attention run in fbjax's "
                             "native CPU kernels, custom calls that an exported artifact cannot carry; load it with "
                             "fbjax.load(path, kernel_options=fbjax.KernelOptions(native_kernels=False)) "
                             "to export it (`fbjax export` does)") from None


def export_model(model, to: str, *, batch_size="file"):
    """``jax.export`` of ``model.apply(params, *inputs)`` (what ``fbjax export`` writes).

    Returns ``(exported, serialized bytes or MLIR text)``. ``to`` is
    ``"stablehlo"`` (the serialized artifact, with its VJP, so
    ``jax.export.deserialize(data).call`` stays differentiable) or ``"mlir"``
    (the StableHLO text). With ``batch_size=None`` the leading input
    dimension is the symbolic ``b`` (:func:`fbjax.export.jax_export`; an
    operator that cannot follow it raises ``DynamicBatchError`` naming it).
    """
    exported = jax_export(model, batch_size=batch_size)
    if to == "mlir":
        return exported, exported.mlir_module()
    return exported, bytes(exported.serialize(vjp_order=1))


def to_stablehlo_flatbuffer(fn, *example_args) -> bytes:
    """Write JAX function ``fn`` in the prototype ``stablehlo.flatbuf`` format.

    ``fn`` is lowered with ``jax.jit(fn, keep_unused=True).lower(*example_args)``
    (unused arguments stay model inputs); its
    StableHLO module's ``main`` function is written op by op. The result
    loads with :func:`fbjax.load` and computes ``fn(*example_args)``'s
    function of the flattened array arguments (pytrees are flattened in JAX's
    order; outputs likewise).

    Raises:
        ExportError: the lowered module uses ops the format cannot express
            (e.g. ``stablehlo.transpose``, ``stablehlo.compare``) or types it
            lacks (bool, bf16, complex); every one is named.
    """
    import jax

    lowered = jax.jit(fn, keep_unused=True).lower(*example_args)
    return module_to_stablehlo_flatbuffer(lowered.compiler_ir("stablehlo"), "main")
