"""Apache Beam RunInference with fbjax models: :class:`FbjaxModelHandler`.

::

    import apache_beam as beam
    from apache_beam.ml.inference.base import RunInference
    from fbjax.beam import FbjaxModelHandler

    handler = FbjaxModelHandler("model.tflite", step_size=8)
    with beam.Pipeline() as p:                          # DirectRunner; Dataflow/Flink/Spark by options
        (p | beam.Create(images)                        # one example per element, no batch axis
           | RunInference(handler)                      # PredictionResult(example, inference, model_id)
           | beam.Map(print))

Beam's ``RunInference`` (``apache_beam.ml.inference.base``, Beam's "About
Beam ML" guide) batches the elements of a bundle with ``BatchElements``,
loads the model once per worker process (``shared.Shared``) and calls
:meth:`FbjaxModelHandler.run_inference` per batch, which runs the batch
through :func:`fbjax.infer` -- the same steps, padding and programs as
``fbjax.infer(model, examples, step_size=step_size)`` on the whole dataset,
so each example's result has the same bits (on one CPU device every step
runs as calls of the same ``k`` examples, ``k`` fixed by ``step_size`` and
the model alone; see :mod:`fbjax.batch_inference`).

Batch size. The model is loaded batch-polymorphic
(``fbjax.load(path, batch_size=None)``; a graph that cannot take another
batch at the file's batch of 1, which :func:`fbjax.infer` runs vmapped over
each step's examples: :func:`fbjax.batch_inference.load_for_infer`), never
with a fixed batch B > 1: Beam's batches vary in size (the end of a bundle,
a streaming timeout), and a fixed-batch model would have to pad every short
batch to its size anyway. What is fixed is ``step_size``, the examples per
compiled call: every Beam batch, whatever its size, runs as steps of
``step_size`` examples (the last one padded with zeros and trimmed), so
there is one compiled program per worker and a result never depends on how
Beam cut the data into batches. The batching hints
(:meth:`FbjaxModelHandler.batch_elements_kwargs`) ask Beam for batches of
``step_size`` to ``4 * step_size`` examples (a batch of several steps keeps
:func:`fbjax.infer`'s reading, dispatch and copy-back overlapped).

LLM bundles: :class:`FbjaxLlmHandler` takes prompts (strings) and returns
completions, each Beam batch generated as one batch by
:meth:`fbjax.LlmBundle.generate` (rows prefilled and decoded together, each
stopping on its own); wrap it in ``KeyedModelHandler`` for ``(key, prompt)``
elements.

Importing :mod:`fbjax` does not import Apache Beam; this module does
(install it with ``pip install 'fbjax[beam]'``).
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

import numpy as np

try:
    from apache_beam.ml.inference import base as _beam
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("fbjax.beam needs Apache Beam: pip install 'fbjax[beam]'") from e

from .errors import InputError
from .batch_inference import infer, load_for_infer
from .llm_bundle import LlmBundle
from .model import Model, load

__all__ = ["FbjaxModelHandler", "FbjaxLlmHandler", "DEFAULT_STEP_SIZE"]

#: Examples per compiled call when ``step_size`` is not given: the default of
#: :func:`fbjax.infer` on one device (8 per device).
DEFAULT_STEP_SIZE = 8

#: Default ratio of Beam's largest batch to ``step_size``.
_MAX_STEPS_PER_BATCH = 4

#: Example type: one example without its batch axis: an array (one-input
#: model), a tuple of arrays in input order, or a dict keyed by input name.
Example = Union[np.ndarray, Sequence[np.ndarray], Mapping[str, np.ndarray]]


class FbjaxModelHandler(_beam.ModelHandler[Example, _beam.PredictionResult, Model]):
    """A Beam ``ModelHandler`` that runs a flatbuffer model with :func:`fbjax.infer`.

    Elements are single examples without the batch axis, as
    :func:`fbjax.infer` takes them: a numpy array shaped like the model's
    input without its leading dimension (e.g. ``(256, 256, 3)`` float32 for
    a ``(?, 256, 256, 3)`` input), a tuple of such arrays in
    :attr:`fbjax.Model.inputs` order, or a dict keyed by input name;
    dtypes are cast to the inputs' where numpy's ``same_kind`` rule allows.
    Each output element is ``PredictionResult(example, inference,
    model_id)`` with ``inference`` the example's output (an array without
    the batch axis; a tuple in :attr:`fbjax.Model.outputs` order for a
    multi-output model) and ``model_id`` the model path. Wrap it in
    ``apache_beam.ml.inference.base.KeyedModelHandler`` for ``(key,
    example)`` elements (``(key, PredictionResult)`` out).

    Args:
        model_path: the model file (``.tflite``, ``.rten``,
            ``stablehlo.flatbuf``, TFLite GPU-delegate ``.bin``): a local
            path, or any path Beam's ``FileSystems`` reads (``gs://``,
            ``s3://``, ``hdfs://`` with the matching Beam extra), read as
            bytes on each worker.
        step_size: examples per compiled call (``fbjax.infer``'s
            ``step_size``; rounded up to a multiple of the worker's device
            count). Default :data:`DEFAULT_STEP_SIZE`. Larger steps suit
            accelerators (e.g. 64 per GPU).
        min_batch_size, max_batch_size: bounds of Beam's batches (default
            ``step_size`` and ``4 * step_size``); a batch's size does not
            change its results.
        max_batch_duration_secs: streaming pipelines: the longest a batch
            waits to fill (Beam's ``BatchElements`` option).
        load_options: other keyword arguments of :func:`fbjax.load`
            (``quantized``, ``compute_dtype``, ``constant_inputs``,
            ``static_bounds``, ...); not ``batch_size``.
        env_vars: environment variables set before the model loads
            (Beam's ``ModelHandler`` option), e.g.
            ``{"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}`` when several
            worker processes share a GPU. (Beam's ``large_model`` /
            ``model_copies``, one model served to several processes through
            a proxy, are not offered: :func:`fbjax.infer` needs the
            :class:`~fbjax.Model` itself in the calling process.)

    Raises:
        InputError: ``step_size`` or a batch bound that is not a positive
            int, ``min_batch_size > max_batch_size``, or ``batch_size`` in
            ``load_options``.
    """

    def __init__(self, model_path: Union[str, os.PathLike], *, step_size: Optional[int] = None,
                 min_batch_size: Optional[int] = None, max_batch_size: Optional[int] = None,
                 max_batch_duration_secs: Optional[int] = None, load_options: Optional[Mapping[str, Any]] = None,
                 env_vars: Optional[Mapping[str, str]] = None):
        step = DEFAULT_STEP_SIZE if step_size is None else step_size
        _check_positive(step, "step_size")
        lo = step if min_batch_size is None else min_batch_size
        hi = max(lo, _MAX_STEPS_PER_BATCH * step) if max_batch_size is None else max_batch_size
        _check_positive(lo, "min_batch_size")
        _check_positive(hi, "max_batch_size")
        if lo > hi:
            raise InputError(f"min_batch_size {lo} > max_batch_size {hi}")
        load_options = dict(load_options or {})
        if "batch_size" in load_options:
            raise InputError("FbjaxModelHandler loads the model with batch_size=None (any batch); give the "
                             "examples per call as step_size=... instead of load_options['batch_size']")
        super().__init__(min_batch_size=lo, max_batch_size=hi, max_batch_duration_secs=max_batch_duration_secs,
                         env_vars=dict(env_vars or {}))
        self._model_path = os.fspath(model_path)
        self._step_size = int(step)
        self._load_options = load_options

    @property
    def step_size(self) -> int:
        """Examples per compiled call (before rounding to the device count)."""
        return self._step_size

    def load_model(self) -> Model:
        """Load the model batch-polymorphic (``fbjax.load(path,
        batch_size=None, **load_options)``), or at the file's batch of 1
        where its graph cannot take another batch (run vmapped over each
        step's examples: :func:`fbjax.batch_inference.load_for_infer`); Beam
        calls this once per worker process and shares it between the
        process's threads.

        Raises:
            FileNotFoundError, ModelFormatError, UnsupportedOperatorError:
                as :func:`fbjax.load`.
            InputError: the model cannot take another batch and its file's
                leading dimension is not a batch of 1.
        """
        source: Union[str, bytes] = os.path.expanduser(self._model_path)
        if "://" in source and not os.path.exists(source):
            from apache_beam.io.filesystems import FileSystems

            with FileSystems.open(source) as f:  # gs://, s3://, hdfs://... as bytes
                source = f.read()
        return load_for_infer(source, **self._load_options)

    def run_inference(self, batch: Sequence[Example], model: Model,
                      inference_args: Optional[dict] = None) -> Iterable[_beam.PredictionResult]:
        """Run one Beam batch: ``fbjax.infer(model, batch, step_size)``.

        Args:
            batch: examples (see the class docstring); also an array of
                shape ``(N, ...)`` (N examples), as
                ``handler.with_no_batching()`` passes pre-batched elements.
            model: the model :meth:`load_model` returned.
            inference_args: must be empty (fbjax models take no extra
                call arguments).

        Returns:
            one ``PredictionResult(example, inference, model_id)`` per
            example, in batch order.

        Raises:
            InputError: an example whose shape, dtype or number of arrays
                does not match the model's inputs (as :func:`fbjax.infer`).
        """
        self.validate_inference_args(inference_args)
        outs = infer(model, batch, step_size=self._step_size, progress=False)
        if isinstance(outs, list):  # several outputs: one tuple per example
            per_example: Iterable = zip(*outs)
        else:
            per_example = outs
        return [_beam.PredictionResult(x, y, self._model_path) for x, y in zip(batch, per_example)]

    def validate_inference_args(self, inference_args: Optional[dict]) -> None:
        """Refuse inference arguments (``RunInference(..., inference_args=)``).

        Raises:
            ValueError: ``inference_args`` is not empty (Beam's convention
                for handlers that take none).
        """
        if inference_args:
            raise ValueError(f"FbjaxModelHandler takes no inference_args (got {sorted(inference_args)}); "
                             "pass load options to the handler instead")

    def get_num_bytes(self, batch: Sequence[Example]) -> int:
        """Bytes of the arrays in ``batch`` (Beam's byte counter), without
        pickling them as the default does."""
        total = 0
        for ex in batch:
            arrays = ex.values() if isinstance(ex, Mapping) else ex if isinstance(ex, (tuple, list)) else (ex,)
            total += sum(np.asarray(a).nbytes for a in arrays)
        return total

    def get_metrics_namespace(self) -> str:
        """Beam metrics namespace: ``"BeamML_Fbjax"``."""
        return "BeamML_Fbjax"

    def update_model_path(self, model_path: Optional[str] = None) -> None:
        """Beam's automatic model refresh: the next :meth:`load_model` reads
        ``model_path``."""
        if model_path:
            self._model_path = os.fspath(model_path)


def _read_source(path: str) -> Union[str, bytes]:
    """A local path as it is; another path Beam's ``FileSystems`` reads (``gs://``...) as bytes."""
    source = os.path.expanduser(path)
    if "://" in source and not os.path.exists(source):
        from apache_beam.io.filesystems import FileSystems

        with FileSystems.open(source) as f:
            return f.read()
    return source


class FbjaxLlmHandler(_beam.ModelHandler[str, _beam.PredictionResult, LlmBundle]):
    """A Beam ``ModelHandler`` that generates text with an LLM bundle (``.litertlm``, LLM ``.task``).

    Elements are prompts (``str``); each output element is
    ``PredictionResult(prompt, completion, model_id)`` with ``completion``
    the generated text (a :class:`fbjax.llm_bundle.Generation` with
    ``return_tokens=True``) and ``model_id`` the bundle path. Each Beam
    batch (``min_batch_size`` to ``max_batch_size`` prompts) runs as one call
    of :meth:`fbjax.LlmBundle.generate`: its rows are prefilled and decoded
    together, each stopping at its stop token, ``max_new_tokens`` or a full
    KV cache. Greedy decoding (the bundle's default when its sampler is
    greedy, or ``top_k=1``) gives each prompt the text ``bundle.generate``
    gives it alone; a sampled completion depends on the batch it was drawn
    in (one random stream per batch, from ``seed``). Wrap it in
    ``apache_beam.ml.inference.base.KeyedModelHandler`` for ``(key,
    prompt)`` elements.

    Args:
        bundle_path: the bundle: a local path or any path Beam's
            ``FileSystems`` reads (read as bytes on each worker).
        template: wrap prompts in the bundle's prompt template.
        max_new_tokens: at most this many new tokens per prompt.
        temperature, top_k, top_p, seed: override the bundle's sampler.
        return_tokens: ``inference`` is a :class:`~fbjax.llm_bundle.Generation`
            (text, ids, why it stopped) instead of the text.
        min_batch_size, max_batch_size: bounds of Beam's batches (default 1
            and 8): prompts generated together (memory: one KV cache each).
        max_batch_duration_secs: streaming pipelines: the longest a batch
            waits to fill.
        load_options: other keyword arguments of :func:`fbjax.load`.
        env_vars: environment variables set before the bundle loads.

    Raises:
        InputError: a batch bound that is not a positive int, or
            ``min_batch_size > max_batch_size``.
    """

    def __init__(self, bundle_path: Union[str, os.PathLike], *, template: bool = True,
                 max_new_tokens: Optional[int] = None, temperature: Optional[float] = None,
                 top_k: Optional[int] = None, top_p: Optional[float] = None, seed: Optional[int] = None,
                 return_tokens: bool = False, min_batch_size: int = 1, max_batch_size: int = 8,
                 max_batch_duration_secs: Optional[int] = None, load_options: Optional[Mapping[str, Any]] = None,
                 env_vars: Optional[Mapping[str, str]] = None):
        _check_positive(min_batch_size, "min_batch_size")
        _check_positive(max_batch_size, "max_batch_size")
        if min_batch_size > max_batch_size:
            raise InputError(f"min_batch_size {min_batch_size} > max_batch_size {max_batch_size}")
        if max_new_tokens is not None:
            _check_positive(max_new_tokens, "max_new_tokens")
        super().__init__(min_batch_size=min_batch_size, max_batch_size=max_batch_size,
                         max_batch_duration_secs=max_batch_duration_secs, env_vars=dict(env_vars or {}))
        self._path = os.fspath(bundle_path)
        self._gen = dict(template=template, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                         top_p=top_p, seed=seed, return_tokens=return_tokens)
        self._load_options = dict(load_options or {})

    def load_model(self) -> LlmBundle:
        """Load the bundle (once per worker process, shared by its threads).

        Raises:
            FileNotFoundError, ModelFormatError: as :func:`fbjax.load`.
            InputError: the file is not an LLM bundle.
        """
        bundle = load(_read_source(self._path), **self._load_options)
        if not isinstance(bundle, LlmBundle):
            raise InputError(f"FbjaxLlmHandler: {self._path} is not an LLM bundle (.litertlm / LLM .task) but a "
                             f"{type(bundle).__name__}; use FbjaxModelHandler for tensor models")
        return bundle

    def run_inference(self, batch: Sequence[str], model: LlmBundle,
                      inference_args: Optional[dict] = None) -> Iterable[_beam.PredictionResult]:
        """Generate one Beam batch of prompts: ``model.generate(list(batch), ...)``.

        Returns:
            one ``PredictionResult(prompt, completion, model_id)`` per prompt, in batch order.

        Raises:
            InputError: a prompt that is not a string, or too long for the KV cache.
            ValueError: ``inference_args`` given.
        """
        if inference_args:
            raise ValueError(f"FbjaxLlmHandler takes no inference_args (got {sorted(inference_args)}); give "
                             "generation options to the handler")
        prompts = list(batch)
        bad = [i for i, p in enumerate(prompts) if not isinstance(p, str)]
        if bad:
            raise InputError(f"FbjaxLlmHandler: element {bad[0]} is a {type(prompts[bad[0]]).__name__}, not a "
                             "prompt string (use KeyedModelHandler for (key, prompt) pairs)")
        if not prompts:
            return []
        outs = model.generate(prompts, **self._gen)
        return [_beam.PredictionResult(p, y, self._path) for p, y in zip(prompts, outs)]

    def get_num_bytes(self, batch: Sequence[str]) -> int:
        """UTF-8 bytes of the prompts (Beam's byte counter)."""
        return sum(len(p.encode("utf-8")) for p in batch if isinstance(p, str))

    def get_metrics_namespace(self) -> str:
        """Beam metrics namespace: ``"BeamML_FbjaxLlm"``."""
        return "BeamML_FbjaxLlm"

    def update_model_path(self, model_path: Optional[str] = None) -> None:
        """Beam's automatic model refresh: the next :meth:`load_model` reads ``model_path``."""
        if model_path:
            self._path = os.fspath(model_path)


def _check_positive(v, name: str) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise InputError(f"{name} must be a positive int, got {v!r}")
