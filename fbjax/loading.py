"""The load pipeline: read and complete the IR -> rewrite passes -> lowered program.

One sequence used by :func:`fbjax.load`, ``fbjax inspect`` (which reports
support after the same rewrites a load does), :mod:`fbjax.precision` and
the chunked large-batch path (which loads the model again through
:func:`fbjax.load` with another :class:`~fbjax.options.LoadOptions`). The
passes (:mod:`fbjax.passes`, below the lowering) learn what they need about
each op from the lowering registry handed to them here; this module sits
above the lowering (it hands them :data:`fbjax.lower.LOWERINGS`).
"""

from __future__ import annotations

import warnings

import jax

from typing import Optional

from .ir import ModelIR
from .lower import composites
from .lower.build import Program, build
from .lower.registry import LOWERINGS
from .options import LoadOptions
from .passes import reading
from .passes.shapes import add_valid_counts, check_batch_size, set_batch_size
from .passes.quantization import rewrite_quantized

__all__ = ["read", "rewrite", "lower"]


def read(source, format: Optional[str] = None, registry=LOWERINGS) -> ModelIR:  # noqa: A002 - load's name
    """The IR of ``source`` (a path or bytes, in ``format``; None: detected;
    or a :class:`~fbjax.ir.ModelIR` a reader returned or a caller built),
    completed with what each op's registration declares
    (:func:`fbjax.passes.reading.read`: region arities checked, open
    output dtypes filled): what every later pass and the lowering
    (:func:`lower`, :func:`fbjax.lower.build.build`) take.

    Raises:
        ModelFormatError: the file is not a valid model of its format, or a
            node contradicts its op's declared regions.
    """
    return reading.read(source, registry, format)


def rewrite(ir: ModelIR, options: LoadOptions, registry=LOWERINGS) -> ModelIR:
    """Rewrite ``ir`` in place as ``options`` ask: the quantized mode
    (:func:`fbjax.passes.quantization.rewrite_quantized`), the static-bound outputs
    (:func:`fbjax.passes.shapes.add_valid_counts`, ``static_bounds``), then the batch
    (:func:`fbjax.passes.shapes.set_batch_size`) unless it is the file's.

    Raises:
        InputError: the model cannot take the batch (the message names the
            operator).
    """
    rewrite_quantized(ir, options.quantized, registry=registry)
    if options.static_bounds:
        add_valid_counts(ir, registry=registry)
    if options.rewrites_batch:
        set_batch_size(ir, options.batch_size, registry=registry)
    return ir


def lower(ir: ModelIR, options: LoadOptions, *, x64: bool = False) -> Program:
    """The lowered program of a rewritten ``ir``; with a rewritten batch, its
    outputs are checked to follow the batch (:func:`fbjax.passes.shapes.check_batch_size`,
    traced under ``jax.enable_x64(x64)`` as the model will run).

    Raises:
        UnsupportedOperatorError: ops without a lowering (every one listed).
        InputError: an output does not follow the batch.
        ModelFormatError: a composite's attributes are not a FlexBuffer map.

    Warns:
        UserWarning: per composite that ``options.composites`` would fuse
            but whose lowering refuses it (it runs its decomposition).
    """
    for node, reason in composites.refused(ir, options.composites):
        warnings.warn(f"{node.location}: composite {node.attrs.get('name')!r} runs its decomposition: {reason}",
                      stacklevel=3)
    # no separate static-input trace: load's trace of the first call (fbjax.model._trace_at_load) raises it
    program = build(ir, options=options.lowering(), check_static=False)
    if options.rewrites_batch:
        with jax.enable_x64(x64):  # int16x8 kernels trace only with x64, as Model runs them
            check_batch_size(ir, program, options.batch_size)
    return program
