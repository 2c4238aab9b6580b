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

from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from .errors import InputError


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
        self._jitted = jax.jit(self.apply_tuple)

    @property
    def params(self) -> dict:
        """The model's weights (:attr:`fbjax.Model.params`, shared by every signature)."""
        return self.model.params

    @property
    def _x64(self) -> bool:
        return self.model._x64

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
    def apply_tuple(self, params: dict, *inputs) -> tuple:
        """:meth:`apply` with inputs positional in :attr:`inputs` order (not
        checked, not cast) and the outputs as a tuple in :attr:`outputs`
        order; what :func:`fbjax.infer` and :func:`fbjax.generate` call."""
        self.model._check_params(params)
        want = self.model.program.params
        if any(getattr(params[k], "dtype", None) != want[k].dtype for k in want):
            params = {k: v if getattr(v, "dtype", None) == want[k].dtype else jnp.asarray(v, want[k].dtype)
                      for k, v in params.items()}
        graph_inputs = [inputs[i] for i in self._order]
        program = self.model.program
        outs, _ = program.apply_graph(self.graph_index, params, None, *graph_inputs)
        res = []
        for v, k in zip(self._out_values, self._out_pos):
            if k is None:  # a signature output that is not a graph output (a constant, say)
                raise InputError(f"signature {self.key!r}: output {v.name!r} is not an output of graph "
                                 f"{self.graph_index}")
            res.append(jnp.asarray(outs[k]))
        return tuple(res)

    def apply(self, params: dict, *args, **kwargs) -> dict:
        """Pure forward pass of the signature (for ``jax.grad``, ``jit``, ``vmap``).

        Args:
            params: a dict like :attr:`fbjax.Model.params` (every weight of
                the model, whichever signature reads it).
            *args, **kwargs: the inputs, positional in :attr:`inputs` order
                and/or by their signature names.

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
        outs = self.apply_tuple(params, *vals)
        return dict(zip(self._out_names, outs))

    def __call__(self, *args, **kwargs) -> dict:
        """Run the signature jitted on :attr:`params`; inside a caller's JAX
        transform, trace :meth:`apply` into it. Returns ``{output name: array}``.

        Raises:
            InputError: as :meth:`apply`.
        """
        vals = self._bind(args, kwargs)
        if any(isinstance(x, jax.core.Tracer) for x in vals):
            with jax.enable_x64(self._x64):
                return self.apply(self.model.params, *vals)
        if self.model._stateful:
            raise InputError(f"signature {self.key!r}: models with resource variables run only through "
                             "Model.apply(..., state=...) for now")
        vals = self._check(vals, cast=True)
        with jax.enable_x64(self._x64):
            outs = self._jitted(self.model.params, *vals)
        return dict(zip(self._out_names, outs))


__all__ = ["SignatureRunner"]
