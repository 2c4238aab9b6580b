"""Signatures as entry points: :class:`SignatureRunner` (``Model.signature(key)``).

A TFLite file's ``signature_defs`` name entry points: each binds a subgraph
and gives its inputs and outputs names (litert-torch's LLM exports have
``prefill_N`` and ``decode`` signatures over two subgraphs that share the
weights). A :class:`SignatureRunner` runs one of them like LiteRT's
``Interpreter.get_signature_runner(key)``: keyword inputs named as in the
signature, a dict of outputs keyed by the signature's output names. It
shares the model's one ``params`` pytree (a weight that several subgraphs
read through the same buffer is one entry), so a gradient through any
signature is a gradient of :attr:`fbjax.Model.params`.
"""

from __future__ import annotations

import warnings
from typing import Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np

from . import cache
from .errors import InputError, ModelFormatError
from .generation import _CACHE_PREFIX, _cache_positions


class SignatureRunner:
    """One signature of a :class:`~fbjax.Model`, callable like LiteRT's signature runner.

    ``runner(**inputs)`` (or positional inputs in :attr:`inputs` order)
    returns ``{output name: array}``; it is jitted once per input shape.
    :meth:`apply` is the pure function for ``jax.grad``/``jit``/``vmap``.

    Attributes:
        key: the signature key (e.g. ``"decode"``).
        graph_index: the subgraph it runs.
        inputs: list of :class:`~fbjax.model.TensorSpec` named by the
            signature, in the signature's order.
        outputs: list of :class:`~fbjax.model.TensorSpec`, likewise.
        model: the :class:`~fbjax.Model` it belongs to (whose ``params`` it
            reads on every call).
    """

    def __init__(self, model, key: str):
        sig = model.ir.signatures[key]
        self.model = model
        self.key = key
        self.graph_index = sig.graph_index
        graph = model.ir.graphs[sig.graph_index]
        spec = model.signatures[key]  # the Model's SignatureSpec: TensorSpecs named by the signature
        self.inputs = list(spec.inputs.values())
        self.outputs = list(spec.outputs.values())
        self._in_names = [s.name for s in self.inputs]
        self._out_names = [s.name for s in self.outputs]
        # graph input position -> signature input position
        pos = {id(v): i for i, v in enumerate(sig.inputs.values())}
        missing = [k for k, v in enumerate(graph.inputs) if id(v) not in pos]
        if missing:
            names = [graph.inputs[k].name for k in missing]
            raise InputError(f"signature {key!r} does not name graph {sig.graph_index}'s input(s) {names}; "
                             "fbjax cannot run it (LiteRT cannot either)")
        self._order = [pos[id(v)] for v in graph.inputs]
        out_ids = {id(v): k for k, v in enumerate(graph.outputs)}
        self._out_values = list(sig.outputs.values())
        self._out_pos = [out_ids.get(id(v)) for v in self._out_values]
        self._jitted = jax.jit(self._apply_buffers, compiler_options=model.compiler_options)
        self._examples = None  # the ExamplesOf view, made once

    @property
    def params(self) -> dict:
        """The model's weights (:attr:`fbjax.Model.params`, shared by every signature)."""
        return self.model.params

    @property
    def x64(self) -> bool:
        """Whether calls run under a scoped ``jax.enable_x64(True)`` (:attr:`fbjax.Model.x64`)."""
        return self.model.x64

    @property
    def path(self):
        return self.model.path

    def __repr__(self) -> str:
        return f"<fbjax.SignatureRunner {self.key!r} (graph {self.graph_index}): inputs={self.inputs} " \
               f"outputs={self.outputs}>"

    # -- arguments -----------------------------------------------------------
    def _bind(self, args: tuple, kwargs: Mapping) -> list:
        """Inputs in signature order from positional and keyword arguments.

        Raises:
            InputError: too many, missing, unknown or repeated inputs.
        """
        if len(args) > len(self.inputs):
            raise InputError(f"signature {self.key!r} takes {len(self.inputs)} input(s) "
                             f"{self._in_names}, got {len(args)} positional")
        vals = list(args) + [None] * (len(self.inputs) - len(args))
        for name, x in kwargs.items():
            if name not in self._in_names:
                raise InputError(f"signature {self.key!r} has no input {name!r}; its inputs are {self._in_names}")
            i = self._in_names.index(name)
            if i < len(args):
                raise InputError(f"signature {self.key!r}: input {name!r} given both positionally and by name")
            vals[i] = x
        missing = [n for n, x in zip(self._in_names, vals) if x is None]
        if missing:
            raise InputError(f"signature {self.key!r}: missing input(s) {missing} (it takes {self._in_names})")
        return vals

    def _check(self, vals: list, *, cast: bool) -> list:
        """Shapes (``None`` dimensions take any size) and dtypes against
        :attr:`inputs`; with ``cast``, arrays of another dtype of the same
        kind are cast (as :class:`~fbjax.Model` does)."""
        out = []
        for x, spec in zip(vals, self.inputs):
            if not hasattr(x, "shape") or not hasattr(x, "dtype"):
                x = np.asarray(x)
            shape = tuple(x.shape)
            if spec.shape is not None and (len(shape) != len(spec.shape) or any(
                    d is not None and isinstance(s, (int, np.integer)) and d != s
                    for d, s in zip(spec.shape, shape))):
                raise InputError(f"signature {self.key!r}: input {spec.name!r} has shape {shape}, expected {spec}")
            if np.dtype(x.dtype) != spec.dtype:
                if not np.can_cast(np.dtype(x.dtype), spec.dtype, "same_kind"):
                    raise InputError(f"signature {self.key!r}: input {spec.name!r} has dtype "
                                     f"{np.dtype(x.dtype).name}, expected {spec}")
                if cast:
                    x = x.astype(spec.dtype)
            out.append(x)
        return out

    # -- pure function -------------------------------------------------------
    def _apply_buffers(self, params: dict, buffers: dict, *inputs) -> tuple:
        return self.apply_tuple(params, *inputs, buffers=buffers)

    def apply_tuple(self, params: dict, *inputs, buffers: Optional[dict] = None, program=None) -> tuple:
        """:meth:`apply` with inputs positional in :attr:`inputs` order (not
        checked, not cast) and the outputs as a tuple in :attr:`outputs`
        order; what :func:`fbjax.infer` and :func:`fbjax.generate` call.
        ``buffers``: :attr:`fbjax.Model.buffers` passed as arguments of the
        caller's ``jax.jit`` (None: read as constants). ``program``: a copy
        of the model's program to trace instead (one with another registry
        view: :mod:`fbjax.finetune`'s LoRA side path); default the model's."""
        params = self._file_dtype_params(params)
        graph_inputs = [inputs[i] for i in self._order]
        program = self.model.program if program is None else program
        outs, _ = program.apply_graph(self.graph_index, params, None, *graph_inputs, buffers=buffers)
        res = []
        for v, k in zip(self._out_values, self._out_pos):
            if k is None:  # a signature output that is not a graph output (a constant, say)
                raise InputError(f"signature {self.key!r}: output {v.name!r} is not an output of graph "
                                 f"{self.graph_index}")
            res.append(jnp.asarray(outs[k]))
        return tuple(res)

    def _file_dtype_params(self, params: dict) -> dict:
        """``params`` checked against the model's (every weight, no other) and cast to the file's
        dtypes where they differ.

        Raises:
            InputError: weights missing or unknown.
        """
        self.model._check_params(params)
        want = self.model.program.params
        if any(getattr(params[k], "dtype", None) != want[k].dtype for k in want):
            params = {k: v if getattr(v, "dtype", None) == want[k].dtype else jnp.asarray(v, want[k].dtype)
                      for k, v in params.items()}
        return params

    def apply_blocks(self, params: dict, inputs: dict, *, buffers=None) -> dict:
        """:meth:`apply` for an LLM runner that keeps its KV caches stacked:
        ``inputs`` by signature name (not checked, not cast), where an input may
        be a :class:`~fbjax.lower.layer_slice.LayerSlice` (one block of a
        stacked ``[layers, ...]`` array); the outputs made from such blocks
        come back as blocks of the updated stacked array (every one of them
        refers to its newest version), the others as arrays. Inside a layer
        scan the stacked array is updated in place (no copy in or out).

        Returns:
            ``{output name: array or LayerSlice}``.
        """
        params = self._file_dtype_params(params)
        vals = [inputs[n] for n in self._in_names]
        outs, _ = self.model.program.apply_graph(self.graph_index, params, None, *[vals[i] for i in self._order],
                                                 buffers=buffers, keep_slices=True)
        return {name: outs[k] for name, k in zip(self._out_names, self._out_pos) if k is not None}

    def apply(self, params: dict, *args, buffers: Optional[dict] = None, **kwargs) -> dict:
        """Pure forward pass of the signature (for ``jax.grad``, ``jit``, ``vmap``).

        Args:
            params: a dict like :attr:`fbjax.Model.params` (every weight of
                the model, whichever signature reads it).
            *args, **kwargs: the inputs, positional in :attr:`inputs` order
                and/or by their signature names.
            buffers: :attr:`fbjax.Model.buffers` (the integer weights) as
                arguments of the caller's ``jax.jit``, so that its program
                does not hold them as constants; None: constants.

        Returns:
            ``{output name: array}`` in :attr:`outputs` order.

        Raises:
            InputError: missing, unknown or ill-shaped inputs (shape checks
                happen at trace time under transforms); ``params`` lacking
                weights or holding others.
        """
        if self.model._stateful:
            raise InputError(f"signature {self.key!r}: models with resource variables run only through "
                             "Model.apply(..., state=...) for now")
        vals = self._check(self._bind(args, kwargs), cast=True)
        outs = self.apply_tuple(params, *vals, buffers=buffers)
        return dict(zip(self._out_names, outs))

    def __call__(self, *args, **kwargs) -> dict:
        """Run the signature jitted on :attr:`params`; inside a caller's JAX
        transform, trace :meth:`apply` into it. Returns ``{output name: array}``.

        Raises:
            InputError: as :meth:`apply`.
        """
        vals = self._bind(args, kwargs)
        if any(isinstance(x, jax.core.Tracer) for x in vals):
            with jax.enable_x64(self.x64):
                return self.apply(self.model.params, *vals)
        if self.model._stateful:
            raise InputError(f"signature {self.key!r}: models with resource variables run only through "
                             "Model.apply(..., state=...) for now")
        vals = self._check(vals, cast=True)
        self._check_positions(vals)
        with jax.enable_x64(self.x64):
            outs = self._jitted(self.model.params, self.model.buffers, *vals)
        return dict(zip(self._out_names, outs))

    def _check_positions(self, vals) -> None:
        """An LLM signature's concrete ``input_pos`` must index its KV cache: LiteRT refuses positions past
        the cache, and the graph would read and write outside it (NaN logits)."""
        if "input_pos" not in self._in_names or not any(n.startswith(_CACHE_PREFIX) for n in self._in_names):
            return
        capacity = _cache_positions(self)
        if capacity is None:
            return
        pos = np.asarray(vals[self._in_names.index("input_pos")])
        if pos.size and (pos.min() < 0 or pos.max() >= capacity):
            raise InputError(f"signature {self.key!r}: input_pos runs from {pos.min()} to {pos.max()}, outside the "
                             f"KV cache's {capacity} positions (0..{capacity - 1})")

    # -- over a stack of examples (fbjax.infer) ------------------------------
    def has_fixed_shapes(self) -> bool:
        """Whether every input dimension is fixed (litert-torch's batch-1
        signatures): :func:`fbjax.infer` then runs :meth:`over_examples`."""
        return all(s.shape is not None and all(d is not None for d in s.shape) for s in self.inputs)

    def over_examples(self) -> "ExamplesOf":
        """This fixed-shape signature run on a stack of examples under
        ``jax.vmap`` (see :class:`ExamplesOf`); one object per runner.

        Raises:
            InputError: an input with an unknown dimension (a batch-polymorphic
                signature takes the batch in its own leading dimension).
        """
        if not self.has_fixed_shapes():
            raise InputError(f"signature {self.key!r} has inputs with unknown dimensions {self.inputs}: it takes "
                             "a batch in their leading dimension, not a stack of examples")
        if self._examples is None:
            self._examples = ExamplesOf(self)
        return self._examples


def _leading_one(shape) -> bool:
    """The size-1 leading dimension that a batch-1 signature has and an
    example lacks: rank 2 or more, first dimension 1 (rank-0/1 tensors such
    as litert-torch's positions, ``(16,)`` for ``prefill_16`` and ``(1,)``
    for ``decode``, are taken whole)."""
    return shape is not None and len(shape) >= 2 and shape[0] == 1


class ExamplesOf:
    """A fixed-shape (batch-1) signature applied to each of a stack of
    examples: what :func:`fbjax.infer` runs for ``model.signature(key)``
    when the signature has no unknown dimension to carry a batch
    (litert-torch's ``prefill_N``/``decode`` and vision signatures).

    An example of an input of rank 2 or more whose leading dimension is 1
    (tokens ``(1, 16)``, a KV cache ``(1, 64, 2, 32)``, an image
    ``(1, 3, 32, 32)``) is that input without the leading 1; a rank-0 or
    rank-1 input (positions ``(16,)`` or ``(1,)``) or one whose leading
    dimension is not 1 is given whole. Outputs likewise: per example, an
    output of rank 2 or more with a leading 1 comes without it.
    :meth:`apply` is ``jax.vmap`` over the examples' leading axis of the
    signature's own function with the size-1 dimensions put back, so each
    example is computed as one call of the signature computes it (the
    vmapped program may order float sums differently from a single call).

    Attributes:
        runner: the :class:`SignatureRunner`.
        inputs, outputs: ``TensorSpec``s in the signature's order, with a
            leading ``None`` (the number of examples) before each example's
            shape.
    """

    def __init__(self, runner: SignatureRunner):
        self.runner = runner
        self.key = runner.key
        self._in_lead = [_leading_one(s.shape) for s in runner.inputs]
        self._out_lead = [_leading_one(s.shape) for s in runner.outputs]
        self.inputs = [s._replace(shape=(None, *(s.shape[1:] if lead else s.shape)))
                       for s, lead in zip(runner.inputs, self._in_lead)]
        self.outputs = [s._replace(shape=None if s.shape is None else (None, *(s.shape[1:] if lead else s.shape)))
                        for s, lead in zip(runner.outputs, self._out_lead)]

    @property
    def params(self) -> dict:
        """The model's weights (:attr:`fbjax.Model.params`)."""
        return self.runner.params

    @property
    def x64(self) -> bool:
        """Whether calls run under a scoped ``jax.enable_x64(True)`` (:attr:`fbjax.Model.x64`)."""
        return self.runner.x64

    @property
    def path(self):
        return self.runner.path

    def __repr__(self) -> str:
        return f"<fbjax.signature.ExamplesOf {self.key!r}: inputs={self.inputs} outputs={self.outputs}>"

    def apply(self, params: dict, *inputs, buffers: Optional[dict] = None) -> tuple:
        """The signature on every example.

        Args:
            params: like :attr:`fbjax.Model.params`.
            buffers: like :attr:`fbjax.Model.buffers` (jit arguments), or None.
            *inputs: per signature input (its order), the examples stacked:
                shape ``(N, *example shape)`` (see the class docstring), the
                input's dtype.

        Returns:
            per signature output (its order) an array ``(N, *example
            output shape)``.
        """
        def one(*xs):
            xs = [x[None] if lead else x for x, lead in zip(xs, self._in_lead)]
            outs = self.runner.apply_tuple(params, *xs, buffers=buffers)
            return tuple(o[0] if lead else o for o, lead in zip(outs, self._out_lead))

        return jax.vmap(one)(*inputs)


def trace_signatures(model) -> dict:
    """Trace every signature of ``model`` at its input shapes without running
    it: the checks :func:`fbjax.load` makes on the main graph
    (:func:`fbjax.model._trace_at_load`: each lowering's own refusals, and
    JAX's refusal of the file's operands as a ModelFormatError naming the
    node, :func:`fbjax.lower.build.file_error`) made at load for the other
    entry points too (an LLM's ``decode`` and the subgraphs it calls), so a
    file whose signature cannot run is refused by ``load``, not at a later
    call. Abstract (``jax.eval_shape`` of the signature's jitted function:
    nothing computed, and a call at those shapes reuses the trace).

    Skipped: a file that passed these checks before under the same load
    options and fbjax code (a marker in fbjax's trace cache,
    :func:`fbjax.cache.checked_marked`; the trace takes seconds for a
    30-layer LLM), models with resource variables (signatures do not run them), a
    signature with a dynamic (``None``) input dimension, or whose runner
    cannot be made (the call says why); a signature of the main graph reuses
    the main graph's load-time trace (``model._traced_outputs``).

    Returns:
        ``{key: tuple of jax.ShapeDtypeStruct}``: each traced signature's
        outputs in its :attr:`SignatureRunner.outputs` order (also kept as
        ``model._traced_signatures``).

    Raises:
        ModelFormatError: the file contradicts an op's rules (the message
            names the signature and the node).
        InputError: the signature names an output that is not its graph's
            (as its call would), or a lowering refuses these shapes.
        UnsupportedOperatorError: what the lowerings refuse (as at the main
            graph's load-time trace).
    """
    traced = {}
    model.__dict__["_traced_signatures"] = traced
    if model._stateful or not model.ir.signatures:
        return traced
    base = model.trace_base(model.program, embeds_buffers=False) if model.trace_base is not None else None
    mark = None if base is None else cache.trace_key(base[0], base[1], (), extra="signatures traced at load")
    if mark is not None and cache.checked_marked(mark):
        return traced  # this file, these options and this code passed before: the trace (seconds at LLM size) is skipped
    main = getattr(model, "_traced_outputs", None)
    main = main if main is None or isinstance(main, (tuple, list)) else (main,)
    for key in model.ir.signatures:
        try:
            runner = model.signature(key)
        except InputError:  # a signature that does not bind its graph's inputs: its call says so
            continue
        if not runner.has_fixed_shapes():
            continue
        if runner.graph_index == model.ir.main:
            if main is not None and all(k is not None and k < len(main) for k in runner._out_pos):
                traced[key] = tuple(main[k] for k in runner._out_pos)
            continue
        specs = [jax.ShapeDtypeStruct(tuple(s.shape), s.dtype) for s in runner.inputs]
        try:
            with jax.enable_x64(model.x64), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the call itself warns about what it meets
                out = jax.eval_shape(runner._jitted, model.params, model.buffers, *specs)
        except (ModelFormatError, InputError) as e:
            raise type(e)(f"signature {key!r} (subgraph {runner.graph_index}): {e}") from e
        traced[key] = tuple(out)
    if mark is not None:
        cache.mark_checked(mark)
    return traced


__all__ = ["SignatureRunner", "ExamplesOf", "trace_signatures"]
