"""The public :class:`Model`: a loaded model as a jitted, differentiable JAX function."""

from __future__ import annotations

import os
from typing import NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from .errors import InputError
from .formats import read_model
from .ir import ModelIR, Value
from .lower.build import Program, build


class TensorSpec(NamedTuple):
    """Name, shape and dtype of a model input or output.

    ``shape`` entries are ints, or ``None`` for a dimension fixed only at
    call time (``-1`` in a TFLite ``shape_signature``).
    """

    name: str
    shape: tuple
    dtype: np.dtype

    @classmethod
    def of(cls, v: Value, name: Optional[str] = None) -> "TensorSpec":
        return cls(name or v.name, tuple(v.shape) if v.shape is not None else None, np.dtype(v.dtype))

    def __repr__(self) -> str:
        dims = "?" if self.shape is None else ", ".join("?" if d is None else str(d) for d in self.shape)
        return f"TensorSpec({self.name!r}, ({dims}), {self.dtype.name})"


class SignatureSpec(NamedTuple):
    """A named entry point of the file (TFLite ``signature_defs``)."""

    key: str
    graph_index: int
    inputs: dict  # signature input name -> TensorSpec
    outputs: dict


def _needs_x64(model: ModelIR) -> bool:
    return any(
        np.dtype(v.dtype).itemsize == 8 and np.dtype(v.dtype).kind in "iuf"
        for g in model.graphs
        for v in g.values
        if v.dtype != np.object_
    )


class Model:
    """A model file loaded as a JAX function.

    Call it like a function: ``outputs = model(*inputs)``. Inputs are numpy or
    JAX arrays in :attr:`inputs` order; the result is one array for
    single-output models, else a tuple in :attr:`outputs` order. The call is
    ``jax.jit``-compiled once per distinct input shape.

    For training, use the pure function :meth:`apply` with :attr:`params`::

        loss = lambda p: jnp.mean(model.apply(p, x) ** 2)
        grads = jax.grad(loss)(model.params)

    64-bit tensors (int64 indices, ARG_MAX outputs, float64): calling the
    Model runs under a scoped ``jax.enable_x64(True)`` when the file has any,
    so they keep their width without changing the global JAX configuration.
    :meth:`apply` follows the caller's configuration (int64 becomes int32
    unless x64 is enabled there).

    Attributes:
        params: dict of the file's float weights (tensor name -> jax array).
        inputs: list of :class:`TensorSpec`.
        outputs: list of :class:`TensorSpec`.
        signatures: dict of :class:`SignatureSpec` (empty if the file has none).
        format: ``"tflite"``.
        ir: the parsed :class:`~fbjax.ir.ModelIR`.
    """

    def __init__(self, ir: ModelIR, program: Program, path: Optional[str] = None):
        self.ir = ir
        self.path = path
        self.format = ir.format
        self._program = program
        g = ir.main_graph
        self.inputs = [TensorSpec.of(v) for v in g.inputs]
        self.outputs = [TensorSpec.of(v) for v in g.outputs]
        self.signatures = {
            k: SignatureSpec(
                k,
                s.graph_index,
                {n: TensorSpec.of(v, n) for n, v in s.inputs.items()},
                {n: TensorSpec.of(v, n) for n, v in s.outputs.items()},
            )
            for k, s in ir.signatures.items()
        }
        self._x64 = _needs_x64(ir)
        with jax.enable_x64(self._x64):
            self.params = {k: jnp.asarray(v) for k, v in program.params.items()}
        self._jitted = jax.jit(self.apply)

    # -- pure function ---------------------------------------------------
    def apply(self, params: dict, *inputs):
        """Pure forward pass.

        Args:
            params: a dict with the same keys as :attr:`params` (arrays of the
                same shapes; any float dtype).
            *inputs: one array per :attr:`inputs` entry.

        Returns:
            one array, or a tuple of arrays for multi-output models.
        """
        outs = self._program.apply(params, *inputs)
        outs = tuple(jnp.asarray(o) for o in outs)
        return outs[0] if len(outs) == 1 else outs

    # -- convenience -----------------------------------------------------
    def _check_inputs(self, inputs: Sequence) -> list:
        if len(inputs) != len(self.inputs):
            raise InputError(
                f"the model takes {len(self.inputs)} input(s) {self.inputs}, got {len(inputs)}"
            )
        out = []
        for i, (x, spec) in enumerate(zip(inputs, self.inputs)):
            if not hasattr(x, "shape") or not hasattr(x, "dtype"):
                x = np.asarray(x)
            shape = tuple(x.shape)
            if spec.shape is not None:
                ok = len(shape) == len(spec.shape) and all(
                    d is None or d == s for d, s in zip(spec.shape, shape)
                )
                if not ok:
                    raise InputError(
                        f"input {i} ({spec.name!r}) has shape {shape}, expected {spec}"
                    )
            if np.dtype(x.dtype) != spec.dtype:
                if not np.can_cast(np.dtype(x.dtype), spec.dtype, "same_kind"):
                    raise InputError(
                        f"input {i} ({spec.name!r}) has dtype {np.dtype(x.dtype).name}, expected {spec}"
                    )
                x = x.astype(spec.dtype)
            out.append(x)
        return out

    def __call__(self, *inputs):
        """Run the model jitted on ``inputs`` (see class docstring).

        Raises:
            InputError: wrong number, shape or dtype of inputs.
        """
        xs = self._check_inputs(inputs)
        with jax.enable_x64(self._x64):
            return self._jitted(self.params, *xs)

    def __repr__(self) -> str:
        name = os.path.basename(self.path) if self.path else "<bytes>"
        return f"<fbjax.Model {name} ({self.format}): inputs={self.inputs} outputs={self.outputs}>"


def load(source, *, format: Optional[str] = None) -> Model:
    """Load a model file as a :class:`Model`.

    Args:
        source: path to a ``.tflite`` file, or its bytes.
        format: force the format (``"tflite"``); detected from the bytes when
            omitted.

    Returns:
        a :class:`Model`, callable and jitted.

    Raises:
        FileNotFoundError: no such file.
        ModelFormatError: the file is not a valid model.
        UnsupportedOperatorError: the model uses ops fbjax cannot lower (every
            one of them is listed).
    """
    ir = read_model(source, format)
    program = build(ir)
    path = None if isinstance(source, (bytes, bytearray, memoryview)) else os.fspath(source)
    return Model(ir, program, path)
