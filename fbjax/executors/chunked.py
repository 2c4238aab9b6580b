"""The chunked executor: a large batch on CPU as calls of cache-sized chunks."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from .planner import image_activation_bytes
from ..options import kernel_options

__all__ = ["ChunkedCall", "select_chunks", "chunk_size"]


def chunk_size(program, batch: int, budget: Optional[int] = None) -> int:
    """Images per call when running a batch of ``batch`` on CPU: the largest
    divisor of ``batch`` whose activations fit ``budget`` bytes (default the
    program's ``KernelOptions.chunk_bytes``, 4 MiB: the largest per-node
    input + output set of one image times the chunk's images, about what
    stays in a CPU's L2/L3 cache between one layer and the next), at least
    1; ``batch`` itself when they all fit."""
    if budget is None:
        budget = kernel_options(program).chunk_bytes
    per = max(image_activation_bytes(program, batch), 1)
    best = 1
    for k in range(1, batch + 1):
        if batch % k == 0 and k * per <= budget:
            best = k
    return best


class ChunkedCall:
    """``fn(params, *inputs)`` for a model loaded with ``batch_size=N``:
    ``N / k`` calls of the same model built for batch ``k``, outputs
    concatenated along the batch.

    XLA:CPU runs a batch layer by layer: at batch 32 each activation is
    32 images (tens of MB for the MediaPipe detectors), so every layer
    streams it from memory, and per image the batch-32 executable is slower
    than 32 batch-1 calls (which LiteRT's figure is made of too). Chunks of
    :func:`chunk_size` images keep each layer's working set in cache; after
    the first call, ``threads`` streams of chunks run at once (Python
    threads; the executions run in XLA without the GIL; the program's
    ``KernelOptions.chunk_threads``, 2: measured 1.2x the images/s of one
    stream on 2 cores, mediapipe_face_detection_short_range, _face_landmark).
    ``params`` are the batch-N model's (same names and shapes: weights do not
    depend on the batch).

    Attributes:
        name: ``"chunked"``.
        batch, k: the model's batch and the chunk's.
    """

    name = "chunked"
    stateful = False
    unchecked = False

    def __init__(self, make_chunk_model, batch: int, k: int, params_spec: dict, threads: int = 2):
        self._make = make_chunk_model
        self.threads = int(threads)
        self.batch, self.k = batch, k
        self._spec = params_spec
        self._chunk = None
        self._warm = False
        self._pool = None

    def _model(self):
        if self._chunk is None:
            m = self._make(self.k)
            spec = {n: tuple(np.shape(v)) for n, v in m.params.items()}
            if spec != self._spec:
                raise ValueError("the batch-k model's params differ from the batch-N model's")
            m.params = {}  # every call passes the batch-N model's params: keep one copy of the weights
            self._chunk = m
        return self._chunk

    def _run(self, fn, params, inputs, starts):
        k = self.k
        return jax.block_until_ready([fn(params, *[x[i:i + k] for x in inputs]) for i in starts])

    def __call__(self, params: dict, *inputs):
        m = self._model()
        fn = m.executor
        starts = list(range(0, self.batch, self.k))
        if not self._warm or self.threads < 2 or len(starts) < 2:
            outs = self._run(fn, params, inputs, starts)  # the first call compiles, in this thread
            self._warm = True
        else:
            # two streams of chunks at once: XLA:CPU runs independent executions concurrently,
            # which fills the gaps between the small per-layer kernels of one stream
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="fbjax-chunks")
            parts = [starts[j::self.threads] for j in range(self.threads)]
            futs = [self._pool.submit(self._run, fn, params, inputs, part) for part in parts if part]
            done = {}
            for part, f in zip([p for p in parts if p], futs):
                done.update(zip(part, f.result()))
            outs = [done[i] for i in starts]
        if isinstance(outs[0], tuple):
            return tuple(jnp.concatenate([o[j] for o in outs]) for j in range(len(outs[0])))
        return jnp.concatenate(outs)


def select_chunks(program, inputs, outputs, make_chunk_model, batch, *,
            budget: Optional[int] = None) -> Optional[ChunkedCall]:
    """The chunked executor of a model loaded with ``batch_size=batch``
    (``inputs`` / ``outputs``: its :class:`~fbjax.model.TensorSpec` lists)
    when on CPU the batch's activations exceed ``budget`` (default the
    program's ``KernelOptions.chunk_bytes``); ``make_chunk_model(k)`` loads the same file with
    ``batch_size=k``. None for other backends, models whose inputs or
    outputs do not lead with the batch, or a batch that fits."""
    if (program.backend != "cpu" or isinstance(batch, bool)
            or not isinstance(batch, (int, np.integer)) or batch < 2):
        return None
    if any(s.shape is None or not s.shape or s.shape[0] != batch for s in list(inputs) + list(outputs)):
        return None
    k = chunk_size(program, int(batch), budget)
    if k >= batch:
        return None
    spec = {n: tuple(np.shape(v)) for n, v in program.params.items()}
    return ChunkedCall(make_chunk_model, int(batch), k, spec, threads=kernel_options(program).chunk_threads)
