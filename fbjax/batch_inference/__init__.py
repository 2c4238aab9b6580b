"""Batch inference over every device: :func:`infer`.

::

    model = fbjax.load("model.tflite")                      # the file's shapes (batch 1)
    probs = fbjax.infer(model, images, step_size=64)        # all local devices
    fbjax.infer(model, "samples/", step_size=64, out="preds.npz")    # streamed

:func:`infer` composes three parts:

* :mod:`~fbjax.batch_inference.sources`: examples (arrays, dicts of arrays,
  iterables, directories of ``.npy``/``.npz`` files) cut into steps, each
  checked against the model's inputs; an array's steps are views of it, a
  directory's ``.npy`` files are read straight into the step's buffer;
* :mod:`~fbjax.batch_inference.stepping`: how steps run -- on one CPU device
  as the model's own compiled calls on cache-sized chunks, dispatched
  asynchronously (one stream, or several at once when timing says so);
  elsewhere over a 1-D device mesh (``jax.sharding``), the last step padded
  to the full step (one shape, no recompilation); reading in a background
  thread ahead of the device;
* :mod:`~fbjax.batch_inference.sinks`: results in memory, or streamed step
  by step to an ``.npy``/``.npz`` file, so the dataset never has to fit in
  memory.

What :func:`infer` keeps between calls (the batch-polymorphic reload, the
stream choosers, compiled mesh programs) lives in the model's
:attr:`fbjax.Model.batch_cache`.

Multi-host: under ``jax.distributed.initialize()`` the mesh spans the
devices of all processes. Each process passes *its own share* of the
examples and gets (or writes) the results of its share; a process that runs
out of examples early keeps feeding padding until every process is done (one
small all-gather per step decides when to stop).
"""

from __future__ import annotations

import os
import warnings
from typing import Iterable, Optional, Sequence, Union

import jax

from ..errors import InputError
from ..model import Model, load
from ..signature import ExamplesOf, SignatureRunner
from . import sinks, sources, stepping
from .sinks import FILE_NAMES_KEY, check_out_path
from .sources import example_files, iter_examples
from .stepping import effective_batch_size, effective_step_size

__all__ = ["infer", "load_for_infer", "iter_examples", "example_files", "effective_step_size", "effective_batch_size", "check_out_path",
           "FILE_NAMES_KEY"]


def infer(
    model,
    examples: Union[Iterable, str, os.PathLike],
    step_size: Optional[int] = None,
    devices: Optional[Sequence] = None,
    out: Union[None, str, os.PathLike] = None,
    *,
    params=None,
    progress: bool = True,
    batch_size: Optional[int] = None,
):
    """Run ``examples`` through ``model``, data-parallel over devices.

    Args:
        model: a :class:`fbjax.Model` whose inputs have an unknown leading
            (batch) dimension (``fbjax.load(path, batch_size=None)``), or a
            path, loaded that way. A model loaded with a fixed batch ``B``
            (the file's shapes, the default of :func:`fbjax.load`; or
            ``batch_size=B``) runs on one CPU device as its own calls of
            ``B`` examples, the last padded: the program and results of a
            loop of ``model(x)``; except a batch-1 model whose several
            examples' activations fit in cache (a small model: batch-1 calls
            cost mostly host work). That one, and any fixed-batch model on
            several devices or an accelerator, is loaded again
            batch-polymorphic from its path, once per model (kept on it for
            later calls); a batch-1 model whose graph cannot take another
            batch (litert-torch's ViT: a ``MEAN`` over the batch) or that was
            loaded from bytes runs instead its batch-1 program on each
            example under ``jax.vmap``
            (:func:`fbjax.batch_inference.stepping.per_example_apply`). Or a
            signature, ``model.signature(key)``: one whose inputs have an
            unknown leading dimension takes the batch there; one with fixed
            shapes (litert-torch's batch-1 ``prefill_N``/``decode`` and
            vision signatures) runs under ``jax.vmap`` over the examples,
            each example an input without its leading 1 (rank 2 or more;
            rank-0/1 inputs such as positions whole), outputs likewise
            (:class:`fbjax.signature.ExamplesOf`).
        examples: samples shaped like the model's inputs without the batch
            dimension: an iterable of arrays (tuples of arrays in input order,
            or dicts keyed by input name, for multi-input models), an array
            of shape ``(N, ...)``, a dict of such arrays keyed by input
            name, or a directory of ``.npy``/``.npz`` files read in sorted
            file-name order (see :func:`iter_examples`).
        step_size: examples per step for this process, split over its
            devices; rounded up to a multiple of the number of this process's
            devices in the mesh. Default: 8 per device. (Not the model's
            ``batch_size`` of :func:`fbjax.load`: the model is loaded with
            any batch, and each step runs ``step_size`` examples.)
        devices: the devices to use (default: ``jax.devices()``, every device
            of every process).
        out: ``None`` to return the results; a ``.npy`` (one output) or
            ``.npz`` path to stream them to (keys: output names, or
            ``output_<k>``; when ``examples`` is a directory, the ``.npz``
            also holds the example file names, in result order, under
            :data:`FILE_NAMES_KEY` ``"__files__"``). The path is checked
            (suffix, existing folder) before anything is loaded or compiled.
            Multi-process runs write one file per process: a
            ``{process}`` in the path is replaced by ``jax.process_index()``.
        params: weights to use instead of ``model.params``.
        progress: show a tqdm progress bar.
        batch_size: deprecated spelling of ``step_size`` (a
            ``DeprecationWarning``).

    Returns:
        per model output an array whose leading dimension is this process's
        number of examples (a list when the model has several outputs; with
        no examples, arrays of shape ``(0, *per-sample shape)``), or the path
        written when ``out`` is given.

    Raises:
        InputError: examples that do not match the model's inputs (naming the
            file when they come from a directory), a model that cannot be
            made batch-polymorphic where one is needed (several devices or an
            accelerator and a fixed batch other than 1 that the graph cannot
            drop, or was loaded from bytes), a
            non-positive ``step_size``, both
            ``step_size`` and ``batch_size`` given, a bad
            ``out`` path (wrong suffix, missing folder).
    """
    spelled = "step_size"
    if batch_size is not None:
        spelled = "batch_size"
        if step_size is not None:
            raise InputError("infer: give step_size only (batch_size is its deprecated spelling)")
        warnings.warn("fbjax.infer(batch_size=...) is deprecated: the examples per step are step_size=... "
                      "(batch_size is the model's leading dimension in fbjax.load)", DeprecationWarning,
                      stacklevel=2)
        step_size = batch_size
    # everything that can be checked without the model, before loading or compiling it
    stepping.check_step_size(step_size, spelled)
    if out is not None:
        out = os.fspath(out)
        if "{process" in out:
            out = out.format(process=jax.process_index())
        check_out_path(out)
    files = example_files(examples) if isinstance(examples, (str, os.PathLike)) else None

    devs = sorted(devices if devices is not None else jax.devices(), key=lambda d: (d.process_index, d.id))
    n_local = sum(d.process_index == jax.process_index() for d in devs)
    if n_local == 0:
        raise InputError(f"process {jax.process_index()} has no device in the mesh")
    n_proc = len({d.process_index for d in devs})
    one_cpu = n_proc == 1 and n_local == 1 and devs[0].platform == "cpu"
    step = effective_step_size(step_size, n_local)

    model, fixed, per_example = _runnable(model, one_cpu, step)
    specs = model.inputs
    for s in specs:
        if any(d is None for d in s.shape[1:]):
            raise InputError(f"input {s.name!r} has unknown non-batch dimensions {s}; infer needs them fixed")
    examples = sources.stacked_by_name(examples, [s.name for s in specs])

    if one_cpu and isinstance(model, Model) and model.state is None:
        k, streams = stepping.plan(model, step)
        k = fixed or k  # a fixed-batch model: its own calls of B examples, whatever the step size
        steps = stepping.CpuSteps(model, params, k, streams, per_example=per_example)
    else:
        k = step
        owner, key = _cache_owner(model, per_example)
        if per_example:
            apply = stepping.per_example_apply(model)
        elif isinstance(model, SignatureRunner):
            apply = model.apply_tuple
        else:
            apply = model.apply
        steps = stepping.MeshSteps(model, apply, params, devs, n_proc, owner.batch_cache, key)
    sink = sinks.make_sink(out, [s.name for s in model.outputs], files)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=sources.count(examples, files), unit="ex", desc="fbjax.infer", disable=None)
    try:
        with jax.enable_x64(model.x64):
            rd = stepping.reader(sources.step_source(examples, specs, k, files), k)
            stepping.run_steps(rd, steps, sink, bar, k, n_proc)
            return sink.finish(lambda: _empty_metas(model, params, fixed))
    finally:
        sink.close()
        if bar is not None:
            bar.close()


def load_for_infer(source, **load_options) -> Model:
    """A model loaded the way a batch job (a Beam worker, a Ray actor) hands
    it to :func:`infer`: batch-polymorphic (``fbjax.load(source,
    batch_size=None, **load_options)``), or, where the batch rewrite refuses
    the graph (litert-torch's ViT: a ``MEAN`` over the batch), at the file's
    batch of 1, which :func:`infer` runs as its batch-1 program vmapped over
    each step's examples (or as its own calls where one example fills the
    cache). Either way each example's result depends on the model, the
    options and ``step_size`` only, not on how the job cut the data.

    Args:
        source: a path or the file's bytes, as :func:`fbjax.load` takes.
        **load_options: other keyword arguments of :func:`fbjax.load` (not
            ``batch_size``).

    Raises:
        InputError: ``batch_size`` among the options; the batch rewrite's
            refusal where the file's own leading dimension is not a batch of 1.
        FileNotFoundError, ModelFormatError, UnsupportedOperatorError: as
            :func:`fbjax.load`.
    """
    if "batch_size" in load_options:
        raise InputError("load_for_infer loads the model with any batch: leave batch_size out")
    try:
        return load(source, batch_size=None, **load_options)
    except InputError as refused:
        model = load(source, **load_options)  # the file's shapes (another error of the options is raised here)
        if stepping.fixed_batch(model) != 1:
            raise refused
        return model


def _runnable(model, one_cpu: bool, step: int) -> tuple:
    """``(model to run, fixed batch or None, per example)``: a path loaded
    batch-polymorphic; a batch-1 signature over the examples
    (:class:`~fbjax.signature.ExamplesOf`); a fixed-batch model on one CPU
    device as its own calls (:func:`~fbjax.batch_inference.stepping.fixed_batch`),
    or loaded again batch-polymorphic once where its own calls are not what
    runs; a batch-1 model whose graph cannot take another batch (or that
    has no path to load again), where its own calls are not what runs, as
    its batch-1 program on each example under ``jax.vmap``
    (``per example``: :func:`~fbjax.batch_inference.stepping.per_example_apply`)."""
    if not isinstance(model, (Model, SignatureRunner, ExamplesOf)):
        model = load(model, batch_size=None)
    if isinstance(model, SignatureRunner) and model.has_fixed_shapes():
        model = model.over_examples()  # a batch-1 signature: jax.vmap over the examples (fbjax.signature)
    fixed = stepping.fixed_batch(model) if isinstance(model, Model) else None
    if fixed == 1 and (not one_cpu or stepping.plan(model, step)[0] > 1):
        # several examples' activations fit in cache (small models): one call of k examples
        # beats k batch-1 calls, whose per-call host work dominates; or several devices or an
        # accelerator, which take steps split along a batch. The batch-polymorphic model runs,
        # loaded once, when the graph allows it; else the batch-1 program on each example, vmapped
        poly = stepping.batch_polymorphic(model, load, quiet=True)
        if poly is None:
            return model, None, True
        model, fixed = poly, None
    if not one_cpu:
        fixed = None  # a fixed batch B > 1 runs as steps split over the mesh: loaded batch-polymorphic
    if fixed is None and any(s.shape is None or not s.shape or s.shape[0] is not None for s in model.inputs):
        if isinstance(model, SignatureRunner):
            raise InputError(f"infer needs a batch-polymorphic signature; {model.key!r} has inputs {model.inputs}")
        model = stepping.batch_polymorphic(model, load)
    return model, fixed, False


def _cache_owner(model, per_example: bool = False) -> tuple:
    """``(the Model whose batch_cache keeps what infer compiles for model, key)``."""
    if isinstance(model, ExamplesOf):
        return model.runner.model, ("examples", model.key)
    if isinstance(model, SignatureRunner):
        return model.model, ("signature", model.key)
    return model, ("model per example",) if per_example else ("model",)


def _empty_metas(model, params, fixed) -> list:
    """No examples: per output ``(dtype, per-example shape)``, traced (not run) at batch 1."""
    import numpy as np

    apply = model.apply_tuple if isinstance(model, SignatureRunner) else model.apply
    ins = [jax.ShapeDtypeStruct((fixed or 1, *s.shape[1:]), s.dtype) for s in model.inputs]
    try:
        res = jax.eval_shape(apply, model.params if params is None else params, *ins)
        res = res if isinstance(res, (tuple, list)) else (res,)
        return [(np.dtype(r.dtype), tuple(r.shape[1:])) for r in res]
    except Exception:  # noqa: BLE001 - fall back to the declared output specs
        return [(np.dtype(o.dtype), tuple(1 if d is None else d for d in (o.shape or ())[1:]))
                for o in model.outputs]
