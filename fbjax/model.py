"""The public :class:`Model`: a loaded model as a jitted, differentiable JAX function."""

from __future__ import annotations

import operator
import os
import warnings
from typing import Mapping, NamedTuple, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from .errors import FbjaxError, InputError, ModelFormatError
from .formats import write_model
from .formats._writing import write_file
from .formats.llm_container import bundle_kind
from .formats.vision_task import VisionTaskBundle, is_vision_task
from .ir import MAX_VALUE_BYTES, ModelIR, Value
from .llm_bundle import LlmBundle, open_bundle
from . import cache
from .cache import compiler_options
from .lower import state as _st
from .lower.build import LOWERING_ERRORS, Program
from .lower.registry import LOWERINGS
from . import executors
from . import loading
from .options import FILE_BATCH as _FILE
from .options import KernelOptions, kernel_options
from .options import LoadOptions
from .passes.shapes import bind_inputs
from .signature import SignatureRunner, trace_signatures


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
        if self.shape is not None and len(self.shape) == 1:
            dims += ","  # a 1-tuple, as Python writes it
        return f"TensorSpec({self.name!r}, ({dims}), {self.dtype.name})"


class SignatureSpec(NamedTuple):
    """A named entry point of the file (TFLite ``signature_defs``)."""

    key: str
    graph_index: int
    inputs: dict  # signature input name -> TensorSpec
    outputs: dict


def _needs_x64(model: ModelIR) -> bool:
    """True when the model has 64-bit tensors or a pass asked for 64-bit
    arithmetic (``model.metadata["needs_x64"]``, e.g. int16 kernels)."""
    wide = {np.dtype(t) for t in (np.int64, np.uint64, np.float64, np.complex128)}
    return bool(model.metadata.get("needs_x64")) or any(
        np.dtype(v.dtype) in wide
        for g in model.graphs
        for v in g.values
        if v.dtype != np.object_
    )



#: inputs of this type mean ``model(x)`` runs inside the caller's JAX transform
_TRACER = jax.core.Tracer

#: file extensions :meth:`Model.save` knows, -> format (a model of another format refuses them)
_SAVE_EXT = {".tflite": "tflite", ".rten": "rten", ".flatbuf": "stablehlo", ".onnx": "onnx", ".pb": "TensorFlow",
             ".mlir": "MLIR text", ".npz": "numpy", ".npy": "numpy", ".h5": "Keras", ".keras": "Keras",
             ".pt": "PyTorch", ".pth": "PyTorch", ".safetensors": "safetensors"}
#: the file-name extensions Model.save accepts per format (no extension is accepted too)
_FORMAT_EXTS = {"tflite": (".tflite",), "rten": (".rten",), "stablehlo": (".flatbuf",), "gpu_cl": (".bin",)}

#: (layout the model takes, layout the array is in, the axes of np.transpose from the one to the other)
_LAYOUT_SWAPS = (("NHWC", "NCHW", (0, 2, 3, 1)), ("NCHW", "NHWC", (0, 3, 1, 2)))


def _shape_hint(want: tuple, got: tuple) -> str:
    """What to do about an input of shape ``got`` for a spec of shape
    ``want``, where something helps: an image in the other layout (NCHW for
    an NHWC model, or the reverse: the transpose to apply), else
    :func:`_batch_hint`."""
    if len(want) == len(got) == 4 and all(isinstance(g, (int, np.integer)) for g in got):
        for model_layout, array_layout, axes in _LAYOUT_SWAPS:
            if all(d is None or d == got[a] for d, a in zip(want, axes)) and tuple(got) != tuple(want):
                return (f" (an {array_layout} array? this model takes {model_layout}, {tuple(want)}: "
                        f"pass np.transpose(x, {axes}))")
    return _batch_hint(want, got)


def _batch_hint(want: tuple, got: tuple) -> str:
    """The ``batch_size=None`` hint for a shape mismatch, only where it helps:
    the file has a fixed batch of 1 (what :func:`fbjax.load`'s batch
    rewrite needs) and only the leading dimension differs; or the input
    lacks the leading batch dimension of 1."""
    if (len(want) == len(got) + 1 and want and want[0] == 1
            and all(d is None or d == g for d, g in zip(want[1:], got))):
        return " (the batch dimension is missing: pass x[None], or np.expand_dims(x, 0))"
    if len(got) != len(want) or not want or want[0] != 1 or got[0] == 1:
        return ""
    if any(d is not None and isinstance(g, (int, np.integer)) and d != g for d, g in zip(want[1:], got[1:])):
        return ""
    return " (load the model with fbjax.load(path, batch_size=None) for other batch sizes)"

class BatchCache:
    """What :func:`fbjax.infer` and :func:`fbjax.generate` keep on a
    :class:`Model` between calls (:attr:`Model.batch_cache`), so repeated calls on a model neither load,
    measure nor compile again. Nothing in it changes a result: each entry is
    derived from the model and its options alone, or (the stream choosers)
    decides only how many identical steps run at once.

    Attributes:
        example_bytes: the largest activation set of one example in bytes
            (``None`` until first needed; ``fbjax.batch_inference.stepping.example_bytes``).
        batch_polymorphic: the model loaded again with ``batch_size=None``
            (its other load options kept), or the :class:`InputError` that
            refused it; ``None`` until first needed.
        stream_choosers: ``{streams: StreamChooser}`` timing one stream of
            steps against several at once (``fbjax.batch_inference.stepping``).
        compiled_steps: ``(program, examples per call)`` already run (compiled) on one CPU device;
            the program ``"own"`` (the model's own calls) or ``"per example"``.
        per_example_program: the jitted ``jax.vmap`` of the batch-1 program over a stack of
            examples, for a batch-1 model whose graph cannot take another batch
            (``fbjax.batch_inference.stepping.per_example_call``); ``None`` until first needed.
        mesh_programs: ``{(entry point, device ids): jitted apply}`` for steps over a device mesh
            (the model's own, and those of its signatures).
        generate_programs: the jitted prefill + decode programs of
            :func:`fbjax.generate` on this model, keyed by its signatures,
            ``max_new_tokens``, sampling options and prompt starts.
    """

    def __init__(self):
        self.example_bytes: Optional[int] = None
        self.batch_polymorphic = None
        self.stream_choosers: dict = {}
        self.compiled_steps: set = set()
        self.per_example_program = None
        self.mesh_programs: dict = {}
        self.generate_programs: dict = {}


class Model:
    """A model file loaded as a JAX function.

    Call it like a function: ``outputs = model(*inputs)``. Inputs are numpy or
    JAX arrays in :attr:`inputs` order (or by name: ``model(input_1=x)``);
    the result is one array for
    single-output models, else a tuple in :attr:`outputs` order. The call is
    ``jax.jit``-compiled once per distinct input shape. Inputs of other
    dtypes are cast to the :attr:`inputs`' dtypes where numpy's
    ``same_kind`` rule allows it (else :class:`InputError`); arrays that have
    them already are checked when their shape is first seen, not on every
    call.

    For training, use the pure function :meth:`apply` with :attr:`params`::

        loss = lambda p: jnp.mean(model.apply(p, x) ** 2)
        grads = jax.grad(loss)(model.params)

    :func:`fbjax.trainable` picks the weights to train by name, and
    :meth:`save` writes the file back with new weights.

    64-bit tensors (int64 indices, ARG_MAX outputs, float64): calling the
    Model runs under a scoped ``jax.enable_x64(True)`` when the file has any,
    so they keep their width without changing the global JAX configuration.
    :meth:`apply` follows the caller's configuration (int64 becomes int32
    unless x64 is enabled there).

    Attributes:
        params: dict of the file's float weights (tensor name -> jax array;
            float16 weights are widened to float32 master weights).
        buffers: dict of the file's large integer constants (a quantized
            model's int8/int4 weights, int32 biases, tables; tensor name ->
            jax array, int4 held two per byte): not trainable, on the device
            once; signatures, :func:`fbjax.generate` and LLM bundles pass
            them to their compiled programs as arguments.
        inputs: list of :class:`TensorSpec`.
        outputs: list of :class:`TensorSpec`.
        signatures: dict of :class:`SignatureSpec` (empty if the file has none).
        input_quantization, output_quantization: per input / output, the
            file's :class:`~fbjax.ir.QuantParams` of a quantized tensor, else
            ``None``: ``scale`` a float32 array and ``zero_point`` an int64
            array, of shape ``(1,)`` per tensor or ``(channels,)`` along
            ``quantized_dimension`` (``float(q.scale[0])``,
            ``int(q.zero_point[0])`` for a per-tensor input); also for
            ``quantized="float"`` models, whose inputs and outputs are
            float32 real values ``(q - zero_point) * scale`` instead of the
            file's integers.
        format: ``"tflite"``, ``"rten"``, ``"stablehlo"`` or ``"gpu_cl"``.
        ir: the parsed :class:`~fbjax.ir.ModelIR`.
        metadata: the file's TFLite metadata
            (:class:`~fbjax.formats.tflite_metadata.TFLiteMetadata`: name,
            version, author, license, per-input normalization and value
            ranges, image color space, per-output names, labels per locale,
            bounding-box semantics), or ``None`` when the file has none (and
            for other formats).
        batch_cache: the :class:`BatchCache` :func:`fbjax.infer` keeps
            between calls on this model (reloads, timings, compiled programs;
            never a result).
    """

    def __init__(self, ir: ModelIR, program: Program, path: Optional[str] = None, *,
                 trace_base=None, chunks=None, load_kwargs: Optional[dict] = None, tiered: bool = False):
        self.ir = ir
        self.path = path
        self.format = ir.format
        self.metadata = ir.metadata.get("tflite_metadata")
        #: the lowered :class:`~fbjax.lower.build.Program` (``program.params``: the file's weights as numpy)
        self.program = program
        #: the fbjax.load keyword arguments that made this model (to load it again with another batch)
        self._load_kwargs = dict(load_kwargs or {})
        self.batch_cache = BatchCache()
        #: the dtype float ops compute in (``fbjax.load(..., compute_dtype=...)``)
        self.compute_dtype = "float32" if getattr(program, "compute_dtype", None) is None else program.compute_dtype.name
        g = ir.main_graph
        self.inputs = [TensorSpec.of(v) for v in g.inputs]
        self._declared_outputs = [TensorSpec.of(v) for v in g.outputs]
        self._outputs = None  # inferred on first use (see the outputs property)
        self.input_quantization = [_file_quant(v) for v in g.inputs]
        self.output_quantization = [_file_quant(v) for v in g.outputs]
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
            self.params = {k: jax.device_put(v) for k, v in program.params.items()}  # no per-shape compiles (jnp.asarray: ~1 s)
        #: the weight buffers (quantized integer weights, int4 packed; :attr:`Program.buffers`): on the device
        #: once, passed as arguments to the programs of every signature and batch (see :meth:`apply`)
        self.buffers = program.device_buffers()
        # Resource variables (VAR_HANDLE ...) -> explicit state, see
        # fbjax.lower.state; None for models without variables.
        self._stateful = _st.has_state(ir)  # TFLite variables/random ops, ONNX random ops
        with jax.enable_x64(self._x64):
            self.state = _st.initial_state(program, self.params) if self._stateful else None
        # Per-call overhead of __call__: see _apply_leaves and __call__.
        self._param_names = tuple(self.params)
        self._param_shapes = {k: tuple(np.shape(v)) for k, v in program.params.items()}  # for _check_params
        #: (shape, dtype) per input of the calls check_inputs passed unchanged (bounded)
        self._accepted: dict = {}
        self._warned_int: set = set()  # inputs already warned about integer data for a float input
        #: how calls run, chosen once here (:func:`fbjax.executors.select`): its ``name`` says which
        #: ``f(program, embeds_buffers=True) -> (digest, load options) or None``: the key of this model's programs
        #: in fbjax's trace cache (:func:`fbjax.executors.trace_base`), also for the programs LLM bundles build
        #: on its signatures (which take the buffers as arguments: ``embeds_buffers=False``)
        self.trace_base = trace_base
        #: the XLA options of fbjax's own jits of this model (:func:`fbjax.cache.compiler_options`: on CPU,
        #: XLA's YNNPACK fusion off unless ``KernelOptions.xla_defaults``): the executor's, the signatures',
        #: :func:`fbjax.generate`'s and LLM bundles' programs
        self.compiler_options = compiler_options(program.backend, kernel_options(program).xla_defaults)
        self._select_executor = lambda: executors.select(
            program, self.apply, self._apply_leaves, stateful=self._stateful,
            compiler_options=self.compiler_options,
            trace_base=trace_base,
            chunks=None if chunks is None else (lambda: chunks(self)), tiered=tiered)
        self.executor = self._select_executor()
        self._unchecked = self.executor.unchecked  # __call__ may try executor.jitted_leaves before any check

    def _release_load_trace(self) -> None:
        """Drop the main graph's load-time trace (:func:`_trace_at_load`) with the executor that keeps it
        (a fresh one of the same kind takes its place, and a later call traces again). For an LLM
        bundle, whose runner calls the signatures with the weights as arguments: the executor's trace
        holds the file's integer weights as constants (SmolLM2-135M int4: a 98 MB stack of the unpacked
        int4 weights) for a call that generation never makes."""
        self.executor = self._select_executor()
        self._unchecked = self.executor.unchecked

    @property
    def x64(self) -> bool:
        """True when calling the model runs under a scoped
        ``jax.enable_x64(True)``: the file has 64-bit tensors (int64, float64)
        or integer kernels that need 64-bit arithmetic (see the class
        docstring). :meth:`apply` follows the caller's configuration."""
        return self._x64

    @property
    def load_kwargs(self) -> dict:
        """The keyword arguments of :func:`fbjax.load` that made this model
        (a copy; e.g. to load the file again with another ``batch_size``)."""
        return dict(self._load_kwargs)

    @property
    def checks_inputs(self) -> bool:
        """How :meth:`__call__` treats inputs. False (the fast path of the
        plain ``jit`` executor): arrays of the :attr:`inputs`' shapes and
        dtypes go straight to the jitted program, whose dispatch compares
        them with its traces. True: each call goes through
        :meth:`check_inputs` first (signatures that passed unchanged before
        are remembered and skip it); it becomes True for good once a call
        needed converting (another dtype, nested lists, a weakly typed
        array), and is True from the start for the other executors."""
        return not self._unchecked

    def skip_quick_tier(self) -> None:
        """Make the first call compile the fully optimised program directly.

        Only for a model loaded with ``tiered_compile=True``: on CPU a model
        of 32 nodes or more then compiles in tiers (see
        :meth:`wait_optimised`): a quick program for the first call, the
        optimised one in the background. For a batch job that runs the model
        many times at once, the quick tier's compile and its slower calls
        only add to the total: call this before the first call
        (:func:`fbjax.infer` does). Nothing happens once the model was
        called, on GPU/TPU, or without ``tiered_compile``.
        """
        skip = getattr(self.executor, "skip_quick_tier", None)
        if skip is not None:
            skip()

    def wait_optimised(self, timeout: Optional[float] = None) -> None:
        """Block until calls run the fully optimised program.

        Only for a model loaded with ``tiered_compile=True`` (CPU, 32 nodes
        or more; :mod:`fbjax.executors.tiered`): its first call compiles and runs
        a quickly compiled program (several times slower per call, and not
        bit-identical to the optimised one), and a background thread
        compiles the optimised one, which later calls run from the moment
        it is ready (in a later process, at once from the persistent
        cache). Call this after the first call before timing calls or
        starting a long batch job (:func:`fbjax.infer` does). It returns at
        once when no tiered compile is under way: before the first call, on
        GPU/TPU, without ``tiered_compile`` (the default), or when the
        optimised program is already running.

        Args:
            timeout: the most seconds to wait (``None``: until it is ready).
        """
        wait = getattr(self.executor, "wait_optimised", None)
        if wait is not None:
            wait(timeout)

    @property
    def outputs(self) -> list:
        """The outputs' :class:`TensorSpec`, in output order.

        Shapes fbjax infers win over shapes the file merely declares: when
        every input shape is static, they are the shapes :func:`load`'s
        abstract trace of the model computed (nothing runs)
        (files are written with placeholder shapes, e.g. PaddlePaddle's
        scalar ``float32()`` outputs of a graph that computes ``(1, 2)``),
        with a ``UserWarning`` naming each output whose declared shape was
        wrong. Dynamic inputs: the declared shapes.
        """
        if self._outputs is None:
            self._outputs = _inferred_outputs(self)
        return self._outputs

    @outputs.setter
    def outputs(self, specs) -> None:
        self._outputs = list(specs)

    # -- pure function ---------------------------------------------------
    def _by_name(self, inputs: tuple, named: dict) -> tuple:
        """``inputs`` (the first ones, in :attr:`inputs` order) completed by
        ``named`` (``{input name: array}``) into one tuple in input order;
        InputError for an unknown name, an input given twice or one missing."""
        names = [s.name for s in self.inputs]
        unknown = [k for k in named if k not in names]
        if unknown:
            raise InputError(f"no input named {', '.join(map(repr, unknown))}; the model's inputs are {names}")
        twice = [k for k in named if names.index(k) < len(inputs)]
        if twice:
            raise InputError(f"input {', '.join(map(repr, twice))} given both by position and by name")
        missing = [k for k in names[len(inputs):] if k not in named]
        if missing:
            raise InputError(f"missing input {', '.join(map(repr, missing))} (the model's inputs are {names})")
        return tuple(inputs) + tuple(named[k] for k in names[len(inputs):])

    def apply(self, params: dict, *inputs, state: Optional[dict] = None, buffers: Optional[dict] = None,
              **named):
        """Pure forward pass.

        Args:
            params: a dict with the same keys as :attr:`params` (arrays of the
                same shapes; any float dtype: others than :attr:`params`'
                are cast to it, float32, before use).
            *inputs: one array per :attr:`inputs` entry, in order; or
                ``**named``: by input name, for those not given by position
                (an input called ``state``, ``buffers`` or ``params`` must be
                positional).
            buffers: :attr:`buffers` (or arrays of the same shapes and
                dtypes) to pass the integer weights as arguments of a
                ``jax.jit`` of this function (``jax.jit(lambda p, b, x:
                model.apply(p, x, buffers=b))``): its compiled program then
                does not hold them as constants. None (default): they are
                constants of the traced program.

        Returns:
            one array, or a tuple of arrays for multi-output models; for
            models with resource variables, ``(outputs, new_state)``, where
            ``state`` (default :attr:`state`) is the ``{name: array}`` dict of
            variable values before the call.

        Raises:
            InputError: wrong number of inputs, a shape that does not match
                :attr:`inputs` (checked at trace time under ``jit``/``grad``),
                or ``params`` missing some of the model's weights, holding
                keys that are not weights of the model, or a weight of
                another shape or a non-float dtype.
        """
        if named:
            inputs = self._by_name(inputs, named)
        self._check_apply_shapes(inputs)
        self._check_params(params)
        want = self.program.params
        if any(getattr(params[k], "dtype", None) != want[k].dtype for k in want):
            # other float dtypes (bfloat16 / float16 training copies): computed in the file's float32 master
            # dtype, as the lowerings mix params with float32 activations (gradients flow back through the cast)
            params = {k: v if getattr(v, "dtype", None) == want[k].dtype else jnp.asarray(v, want[k].dtype)
                      for k, v in params.items()}
        if self._stateful:  # models with resource variables: (outputs, new_state)
            outs, new_state = self.program.apply(params, self.state if state is None else state, *inputs,
                                                 buffers=buffers)
            outs = tuple(jnp.asarray(o) for o in outs)
            return (outs[0] if len(outs) == 1 else outs), new_state
        outs, _ = self.program.apply(params, None, *inputs, buffers=buffers)
        outs = tuple(jnp.asarray(o) for o in outs)
        return outs[0] if len(outs) == 1 else outs

    def signature(self, key: str):
        """The entry point named ``key`` in the file's signatures, as a
        callable bound to its subgraph (like LiteRT's
        ``Interpreter.get_signature_runner(key)``).

        ``model.signature("decode")(tokens=t, input_pos=p, ...)`` returns
        ``{output name: array}``; ``.apply(params, **inputs)`` is the pure
        function over this model's one :attr:`params` dict (for
        ``jax.grad``); ``.inputs`` / ``.outputs`` are its specs. See
        :class:`fbjax.signature.SignatureRunner`.

        Raises:
            InputError: no signature ``key`` (the message lists the keys).
        """
        runners = self.__dict__.setdefault("_signature_runners", {})
        if key not in runners:
            if key not in self.ir.signatures:
                raise InputError(f"the model has no signature {key!r}; its signatures are {list(self.ir.signatures)}"
                                 if self.ir.signatures else f"the model has no signature {key!r}: its file "
                                 "defines no signatures (run the model itself, without a signature key)")
            runners[key] = SignatureRunner(self, key)
        return runners[key]

    # -- convenience -----------------------------------------------------
    def _check_params(self, params) -> None:
        """``params`` for :meth:`apply`: every weight of the model, nothing
        else, each of its weight's shape and a float dtype (also under
        ``jit``/``grad``: tracer shapes and dtypes are static).

        Raises:
            InputError: naming the missing, unknown or mismatched keys.
        """
        want = self._param_shapes
        if not isinstance(params, Mapping):
            raise InputError(f"params must be a dict like model.params ({len(want)} weights keyed by tensor name), "
                             f"got {type(params).__name__}")
        if len(params) == len(want) and all(  # the common case, checked without building lists
                k in params and tuple(getattr(params[k], "shape", ())) == s for k, s in want.items()) and all(
                jnp.issubdtype(getattr(v, "dtype", np.float32), jnp.floating) for v in params.values()):
            return
        missing = [k for k in want if k not in params]
        if missing:
            unknown = [k for k in params if k not in want]
            extra = f"; it has {len(unknown)} key(s) that are not weights, e.g. {unknown[:3]} (a typo?)" \
                if unknown else ""
            raise InputError(f"params lacks {len(missing)} of the model's {len(want)} weights "
                             f"(e.g. {missing[:3]}){extra}; pass a dict with every key of model.params (merge a "
                             "trained subset back: {**model.params, **trained})")
        unknown = [k for k in params if k not in want]
        if unknown:
            raise InputError(f"params has {len(unknown)} key(s) that are not weights of this model "
                             f"(e.g. {unknown[:3]}); the keys are model.params' tensor names")
        for k, s in want.items():
            v = params[k]
            shape = tuple(np.shape(v)) if not hasattr(v, "shape") else tuple(v.shape)
            if shape != s:
                raise InputError(f"params[{k!r}] has shape {shape}, expected {s} (the shape of model.params[{k!r}])")
            dt = v.dtype if hasattr(v, "dtype") else np.asarray(v).dtype
            if not jnp.issubdtype(dt, jnp.floating):
                raise InputError(f"params[{k!r}] has dtype {np.dtype(dt).name}; weights are float arrays (any float dtype, "
                                 f"e.g. {np.dtype(self.program.params[k].dtype).name} as in model.params)")

    def _check_apply_shapes(self, inputs: Sequence) -> None:
        """Input count and shapes for :meth:`apply` (also under ``jit``/``grad``:
        tracer shapes are static). A batch-1 graph fed a batch of 2 would
        otherwise fold the batch into another axis without an error."""
        if len(inputs) != len(self.inputs):
            raise InputError(f"the model takes {len(self.inputs)} input(s) {self.inputs}, got {len(inputs)}")
        for i, (x, spec) in enumerate(zip(inputs, self.inputs)):
            shape = getattr(x, "shape", None)
            if shape is None or spec.shape is None:
                continue
            if len(shape) != len(spec.shape) or any(  # symbolic dims (jax.export shape polymorphism) pass
                    d is not None and isinstance(s, (int, np.integer)) and d != s for d, s in zip(spec.shape, shape)):
                raise InputError(f"input {i} ({spec.name!r}) has shape {tuple(shape)}, expected {spec}"
                                 + _shape_hint(spec.shape, shape))

    def _apply_leaves(self, leaves: tuple, *inputs):
        """:meth:`apply` with the params as a tuple in ``_param_names`` order
        (the jit dispatch flattens a tuple faster than a dict, whose keys it
        sorts on every call), for inputs :meth:`check_inputs` would pass
        unchanged.

        Raises:
            _Unchecked: (at trace time) the inputs are not arrays of the
                :attr:`inputs`' shapes and dtypes (strongly typed), so
                :meth:`__call__` must check or convert them first.
        """
        if len(inputs) != len(self.inputs) or not all(map(_exact, inputs, self.inputs)):
            raise _Unchecked()
        return self.apply(dict(zip(self._param_names, leaves)), *inputs)

    #: most input signatures :meth:`check_inputs` remembers as passing unchanged
    _MAX_ACCEPTED = 64

    def _check_inputs(self, inputs: Sequence) -> Sequence:
        return self.check_inputs(inputs)  # through the public name (it may be wrapped on the instance)

    def check_inputs(self, inputs: Sequence) -> Sequence:
        """``inputs`` (a sequence in :attr:`inputs` order: numpy or JAX arrays,
        or nested lists) checked against :attr:`inputs` and cast to their
        dtypes (numpy's ``same_kind`` rule only); returns ``inputs`` itself
        when nothing needed converting, else a new list. Inputs that pass
        unchanged have their ``(shape, dtype)`` signature remembered:
        :meth:`__call__` skips this for them.

        Raises:
            InputError: a wrong count, shape or dtype, strings, or integers
                outside the range of an integer input.
        """
        if len(inputs) != len(self.inputs):
            raise InputError(
                f"the model takes {len(self.inputs)} input(s) {self.inputs}, got {len(inputs)}"
            )
        out = []
        for i, (x, spec) in enumerate(zip(inputs, self.inputs)):
            if not hasattr(x, "shape") or not hasattr(x, "dtype"):
                if isinstance(x, (str, bytes, os.PathLike)):
                    raise InputError(
                        f"input {i} ({spec.name!r}) is a {type(x).__name__} ({str(x)[:60]!r}), not an array: "
                        f"the model takes {spec}; read the file into a numpy array first (np.load for .npy; "
                        "an image library for images)")
                x = np.asarray(x)
            if np.dtype(x.dtype).kind in "USO":
                raise InputError(f"input {i} ({spec.name!r}) has dtype {np.dtype(x.dtype)} (strings or objects), "
                                 f"expected {spec}")
            shape = tuple(x.shape)
            if spec.shape is not None:
                ok = len(shape) == len(spec.shape) and all(
                    d is None or d == s for d, s in zip(spec.shape, shape)
                )
                if not ok:
                    raise InputError(
                        f"input {i} ({spec.name!r}) has shape {shape}, expected {spec}" + _shape_hint(spec.shape, shape)
                    )
            if np.dtype(x.dtype) != spec.dtype:
                if not np.can_cast(np.dtype(x.dtype), spec.dtype, "same_kind"):
                    raise InputError(
                        f"input {i} ({spec.name!r}) has dtype {np.dtype(x.dtype).name}, expected {spec}"
                        + self._quant_hint(i)
                    )
                if spec.dtype.kind in "iu" and np.dtype(x.dtype).kind in "iu" and x.size \
                        and not np.can_cast(np.dtype(x.dtype), spec.dtype, "safe"):
                    info = np.iinfo(spec.dtype)
                    lo, hi = int(np.min(x)), int(np.max(x))
                    if lo < info.min or hi > info.max:  # a cast would wrap around
                        raise InputError(
                            f"input {i} ({spec.name!r}) has {np.dtype(x.dtype).name} values in [{lo}, {hi}], "
                            f"outside the {spec.dtype.name} range [{info.min}, {info.max}] the model takes"
                            + self._quant_hint(i)
                        )
                warned = self.__dict__.setdefault("_warned_int", set())
                if spec.dtype.kind == "f" and np.dtype(x.dtype).kind in "iub" and i not in warned:
                    warned.add(i)  # once per input and model
                    warnings.warn(
                        f"input {i} ({spec.name!r}) is {spec.dtype.name} but got {np.dtype(x.dtype).name} data: "
                        f"it is cast as is (0..255 stays 0..255). If the model expects another range (images: "
                        f"often [0, 1] or [-1, 1]), scale it first, e.g. x.astype(np.float32) / 255",
                        stacklevel=3)
                x = x.astype(spec.dtype)
            out.append(x)
        if all(map(operator.is_, out, inputs)):  # the outcome depends on the shapes and dtypes only
            try:
                sig = tuple([(x.shape, x.dtype) for x in inputs])
                if len(self._accepted) >= self._MAX_ACCEPTED:
                    self._accepted.clear()
                self._accepted[sig] = True
            except TypeError:  # an unhashable shape or dtype
                pass
            return inputs
        return out

    def _quant_hint(self, i: int) -> str:
        """What to do with a real-valued or out-of-range input ``i`` of a
        quantized input (an error message tail; empty otherwise)."""
        q = self.input_quantization[i] if i < len(self.input_quantization) else None
        if q is None or self.inputs[i].dtype.kind not in "iu":
            return ""
        s = float(np.asarray(q.scale).reshape(-1)[0])
        z = int(np.asarray(q.zero_point).reshape(-1)[0]) if np.asarray(q.zero_point).size else 0
        return (f"; it is quantized (scale {s:.6g}, zero point {z}): pass clip(round(x / scale) + zero_point) "
                f"as {self.inputs[i].dtype.name}, or load the model with quantized=\"float\" to pass real "
                "values")

    def __call__(self, *inputs, **named):
        """Run the model jitted on ``inputs`` (see class docstring), given in
        :attr:`inputs` order, or by name (``model(input_1=x)``; positional
        ones first, then names for the rest). Inside a JAX transform of the
        caller's (``jax.jit``, ``jax.grad``, ``vmap``, ``lax.map``) it traces
        :meth:`apply` on :attr:`params` into the caller's program.

        Raises:
            InputError: wrong number, shape or dtype of inputs, a name that is
                not an input or an input given twice; :attr:`params` missing
                weights of the model or holding other keys.
        """
        if named:
            inputs = self._by_name(inputs, named)
        params = self.params
        if type(params) is not dict or len(params) != len(self._param_shapes):
            self._check_params(params)  # InputError: keys missing or not weights of the model (a typo)
        for x in inputs:  # (a loop, not any(...): ~0.1 us instead of ~0.5 us on a ~20 us call)
            if isinstance(x, _TRACER):
                return self._traced_call(params, inputs)
        ex = self.executor
        if self._unchecked:
            # Fast path (the Jit executor; tiny models: a few us of a ~20 us call): no check in
            # Python, the jit dispatch compares the inputs' shapes and dtypes with those of the
            # traces it keeps, and a new trace checks them (_apply_leaves); inputs it rejects go
            # through check_inputs below, and so do all later calls when they passed it.
            try:
                leaves = ex.leaves(params)
            except (KeyError, TypeError, IndexError):  # a name missing, or not a mapping: as before
                leaves = None
            if leaves is not None:
                try:
                    if bool(_X64.value) == self._x64:  # no config context: ~4 us less per call
                        return ex.jitted_leaves(leaves, *inputs)
                    with jax.enable_x64(self._x64):
                        return ex.jitted_leaves(leaves, *inputs)
                except (_Unchecked, TypeError):  # TypeError: not JAX types (strings, ...)
                    pass
                self.check_inputs(inputs)  # InputError for bad inputs
                self._unchecked = False  # inputs that need converting: check every call from now on
        try:  # a signature checked before: no checks
            ok = tuple([(x.shape, x.dtype) for x in inputs]) in self._accepted
        except (AttributeError, TypeError):  # not arrays, or an unhashable shape
            ok = False
        xs = inputs if ok else self.check_inputs(inputs)
        if ex.stateful:  # keep the variables between calls, as LiteRT does
            with jax.enable_x64(self._x64):
                out, self.state = ex(self.params, self.state, *xs)
            return out
        if _x64_enabled() == self._x64:
            return ex(params, *xs)
        with jax.enable_x64(self._x64):
            return ex(params, *xs)

    def _traced_call(self, params, inputs):
        """``model(x)`` inside the caller's ``jax.jit``/``grad``/``vmap``/``lax.map``:
        the pure :meth:`apply` on :attr:`params`, traced into the caller's
        program (a jit of its own with fbjax's compile options cannot nest,
        and the prepared CPU program's relaid weights must not hold tracers)."""
        if self._stateful:
            raise InputError("this model keeps variables between calls (Model.state); inside jax transforms "
                             "call model.apply(params, *inputs, state=state), which returns (outputs, new_state)")
        xs = self.check_inputs(inputs)
        with jax.enable_x64(self._x64):
            return self.apply(params, *xs)

    # -- write-back --------------------------------------------------------
    def save(self, path=None, params: Optional[Mapping] = None, *, requantize: str = "file") -> bytes:
        """Write the model in its original format with new weights.

        Everything but the updated constants is kept as the file had it
        (operators, options, names, signatures, metadata). The writer for
        the format comes from :data:`fbjax.formats.WRITERS`. Float weights are cast to the
        dtype the file stores (float16 weights are rounded to float16).
        Quantized integer weights given as float (dequantized) values are
        re-quantized with the file's scales and zero points
        (``requantize="file"``; the rounding of ``quantized="float"`` mode,
        :func:`fbjax.quantmath.requantize_weights`, so LiteRT runs the
        saved file as float mode ran those weights), or with recomputed symmetric per-channel
        scales (``requantize="per_channel"``, which also re-quantizes the
        int32 biases that depend on them); see
        :mod:`fbjax.formats.tflite_writer`. A model loaded with
        ``batch_size`` is saved with the file's own (batch-1) shapes.

        Args:
            path: file to write (replaced atomically); ``None`` only returns
                the bytes.
            params: tensor name -> new value; default :attr:`params`. May
                hold a subset of the names (e.g. the ``trainable`` part of
                :func:`fbjax.trainable`): the others keep the file's values.
                A quantized tensor's name may be given with float values.
            requantize: ``"file"`` or ``"per_channel"``.

        Returns:
            the new file's bytes.

        Raises:
            InputError: an unknown name, a wrong shape, NaN or infinite
                values, a value the tensor's type cannot hold (float values
                for a quantized tensor are rounded and clipped to its integer
                range, as ``quantized="float"`` mode's forward pass clips
                them), a missing output folder, a file name whose extension
                is another format's (``.tflite``/``.rten``); or no writer
                for the format yet.
        """
        if path is not None:
            ext = os.path.splitext(os.fspath(path))[1].lower()
            allowed = _FORMAT_EXTS.get(self.format)
            if ext and ((allowed is not None and ext not in allowed)
                        or _SAVE_EXT.get(ext, self.format) != self.format):
                kind = f" ({_SAVE_EXT[ext]})" if ext in _SAVE_EXT else ""
                want = " or ".join(allowed) if allowed else f"a {self.format} extension"
                raise InputError(f"save: {os.fspath(path)!r}: the extension {ext}{kind} is not this model's "
                                 f"format; Model.save writes {self.format} and does not convert: use a file name "
                                 f"ending in {want}")
        params = self.params if params is None else params
        values = {id(v): v for g in self.ir.graphs for v in g.values}
        by_name, shared = {}, {}  # param name -> a Value; -> every Value (one buffer read by several subgraphs)
        for vid, name in self.program.param_of.items():
            by_name[name] = values[vid]
            shared.setdefault(name, []).append(values[vid])
        quantized, alias = _quantized_constants(self.ir)
        updates = {}
        for name, x in params.items():
            v = by_name.get(name)
            if v is None:
                if name not in quantized and name in alias:
                    raise InputError(f"save: params key {name!r} names a quantized weight that several subgraphs "
                                     f"read from one buffer; it is one weight, named {alias[name]!r} (its first "
                                     "subgraph's name): save it under that name")
                groups = quantized.get(name, {})
                if len(groups) != 1:
                    why = "names several quantized tensors" if groups else "is not a weight of this model"
                    raise InputError(f"save: params key {name!r} {why}")
                (vs,) = groups.values()
                v = vs[0]
                shared.setdefault(name, vs)  # every subgraph's tensor on the buffer: written once
            x = np.asarray(x)
            if x.dtype.kind not in "fiub" and jnp.issubdtype(x.dtype, jnp.floating):
                x = x.astype(np.float32)  # bfloat16/float8 (ml_dtypes): exact in float32, then cast to the file's dtype
            if x.dtype == v.data.dtype and x.shape == v.data.shape and np.array_equal(x, v.data):
                continue  # unchanged: keep the file's bytes
            if x.dtype.kind == "f" and not np.all(np.isfinite(x)):
                raise InputError(f"save: params key {name!r} holds {int(np.sum(~np.isfinite(x)))} NaN or "
                                 "infinite value(s); the file would carry them (check the training step)")
            for u in shared.get(name, [v]):
                updates[u] = x
        data = write_model(self.ir, updates, requantize=requantize, registry=LOWERINGS)
        if path is not None:
            write_file(path, data)
        return data

    def __repr__(self) -> str:
        name = os.path.basename(self.path) if self.path else "<bytes>"
        return f"<fbjax.Model {name} ({self.format}): inputs={self.inputs} outputs={self.outputs}>"


def _quantized_constants(ir: ModelIR) -> tuple:
    """The integer quantized constants :meth:`Model.save` takes by name.

    A buffer that several subgraphs read (litert-torch's prefill and decode
    share their int8 weights, each subgraph with its own tensor names) is
    one weight with one name, its first subgraph's, as
    :func:`fbjax.lower.build.unique_param_names` names float params.

    Returns:
        ``(quantized, alias)``: name -> {data_key: [the Values on that data,
        every subgraph]} (more than one entry: the name is ambiguous), and
        another subgraph's name of a shared weight -> its one name.
    """
    quantized: dict = {}
    alias: dict = {}
    first: dict = {}  # Value.data_key -> the weight's name
    for g in ir.graphs:
        for v in g.values:
            if v.is_constant and v.quant is not None and np.dtype(v.dtype).kind in "iu":
                name = first.setdefault(v.data_key, v.name)
                if name != v.name:
                    alias.setdefault(v.name, name)
                quantized.setdefault(name, {}).setdefault(v.data_key, []).append(v)
    return quantized, alias


def _file_quant(v: Value):
    """``v``'s QuantParams when it is a quantized 8/16-bit tensor, else None."""
    from .passes.quantization import is_quantized

    return v.quant if is_quantized(v) else None


class _Unchecked(Exception):
    """Raised while tracing :meth:`Model._apply_leaves` for inputs that need
    :meth:`Model.check_inputs` (caught by :meth:`Model.__call__`)."""


def _exact(x, spec: TensorSpec) -> bool:
    """``x`` (a tracer) has ``spec``'s dtype, is not weakly typed (a Python
    scalar) and has its shape (any size on ``None`` dimensions)."""
    shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
    if shape is None or dtype is None or dtype != spec.dtype or getattr(getattr(x, "aval", None), "weak_type", True):
        return False
    return spec.shape is None or (len(shape) == len(spec.shape)
                                  and all(d is None or d == s for d, s in zip(spec.shape, shape)))


_X64 = jax.enable_x64  # a config State: .value reads it in ~40 ns (jax.config.jax_enable_x64: ~130 ns)


def _x64_enabled() -> bool:
    return bool(_X64.value)


def _abstract_apply(model: "Model"):
    """``model.apply`` as one function object per model, so that JAX's trace
    cache (keyed on the function) serves its repeated abstract traces."""
    fn = model.__dict__.get("_abstract_fn")
    if fn is None:
        fn = model.__dict__["_abstract_fn"] = lambda p, *xs: model.apply(p, *xs)
    return fn


def _trace_at_load(model: "Model") -> None:
    """Trace ``model``'s first call at its input shapes without running it,
    so that every lowering's own checks (``ctx.error``: an op, attribute or
    dtype fbjax cannot lower, a file that contradicts itself) raise in
    :func:`load`, not at the first call. The trace is the executor's
    (``executor.trace``): the first call with arrays of those shapes and
    dtypes reuses it (JAX keeps traces per function and argument types), so
    load plus first call costs what the first call alone did. The computed
    output shapes are kept for :attr:`Model.outputs`. Skipped when an input
    dimension is dynamic (``None``: nothing to trace until a call gives the
    size; those checks fire at the first call).

    Raises:
        what the lowerings raise (UnsupportedOperatorError,
        ModelFormatError, InputError).
    """
    if any(s.shape is None or None in s.shape for s in model.inputs):
        return
    specs = [jax.ShapeDtypeStruct(s.shape, s.dtype) for s in model.inputs]
    ex = model.executor
    with jax.enable_x64(model._x64), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the call itself warns about what it meets
        try:
            if not hasattr(ex, "trace"):  # chunked: the trace Model.outputs made (its chunk model traces at its load)
                out = jax.eval_shape(_abstract_apply(model), model.params, *specs)
            elif ex.stateful:
                out = ex.trace(model.params, model.state, *specs)
            else:
                out = ex.trace(model.params, *specs)
        except LOWERING_ERRORS as e:
            where = getattr(e, "fbjax_node", None)
            if where is None or isinstance(e, FbjaxError):
                raise
            # jax.lax refused an op's operands while the file's own dtypes and shapes were fed in
            raise ModelFormatError(
                f"{where} cannot be lowered: {e} The file contradicts the op's rules; if its own runtime "
                "runs it, this is an fbjax bug: please report it with the file.") from e
    model._traced_outputs = out[0] if model._stateful else out


def _inferred_outputs(model: "Model") -> list:
    """``model``'s output specs with the shapes tracing computes at its
    static input shapes (see :attr:`Model.outputs`; the load-time trace's,
    :func:`_trace_at_load`); the declared specs when an input is dynamic or
    tracing fails (the call reports why)."""
    declared = model._declared_outputs
    if any(s.shape is None or None in s.shape for s in model.inputs):
        return list(declared)
    res = getattr(model, "_traced_outputs", None)
    if res is None:
        structs = [jax.ShapeDtypeStruct(s.shape, s.dtype) for s in model.inputs]
        try:
            with jax.enable_x64(model._x64), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the call itself warns about what it meets
                res = jax.eval_shape(_abstract_apply(model), model.params, *structs)
        except Exception:  # noqa: BLE001 - best effort: calling the model reports what is wrong
            return list(declared)
        if model._stateful:
            res = res[0]
    res = res if isinstance(res, (tuple, list)) else (res,)
    out = []
    for spec, r in zip(declared, res):
        shape = tuple(int(d) for d in r.shape)
        if spec.shape is not None and (len(spec.shape) != len(shape)
                                       or any(d is not None and d != e for d, e in zip(spec.shape, shape))):
            warnings.warn(f"output {spec.name!r}: the file declares shape {spec.shape}, but the model computes "
                          f"{shape}; fbjax uses the computed shape", stacklevel=3)
        out.append(TensorSpec(spec.name, shape, spec.dtype))
    return out


def _open_container(source, load_kwargs: dict):
    """What :func:`load` returns for a file holding several models, or None for
    a model file (the one dispatch of containers): an LLM bundle (LiteRT-LM
    ``.litertlm``, or a ``.task`` holding ``TF_LITE_PREFILL_DECODE``) as an
    :class:`~fbjax.llm_bundle.LlmBundle`, its model loaded with
    ``load_kwargs``, with its tokenizer; a MediaPipe Tasks vision bundle
    (``.task``, a zip of ``.tflite`` members) as a
    :class:`~fbjax.formats.vision_task.VisionTaskBundle`, whose members load with
    ``load_kwargs``."""
    if bundle_kind(source):
        return open_bundle(source, load, **load_kwargs)
    if is_vision_task(source):
        return VisionTaskBundle(source, loader=lambda data: load(data, **load_kwargs))
    return None


def load(source, *, format: Optional[str] = None, batch_size: Union[int, None, str] = _FILE,
         quantized: str = "exact", while_max_iterations: Optional[int] = None,
         constant_inputs: Optional[Mapping] = None, static_bounds: bool = False,
         compute_dtype: str = "float32", composites: str = "litert",
         max_value_bytes: int = MAX_VALUE_BYTES, tiered_compile: Optional[bool] = None,
         kernel_options: Optional[KernelOptions] = None) -> Union[Model, VisionTaskBundle, LlmBundle]:
    """Load a model file as a :class:`Model`.

    Args:
        source: path to a model file (``.tflite``, ``.rten``,
            ``stablehlo.flatbuf`` or a TFLite GPU delegate ``.bin``; a
            leading ``~`` is the home directory), or its bytes.
        format: force the format (``"tflite"``, ``"rten"``, ``"stablehlo"`` or
            ``"gpu_cl"``); detected from the bytes when omitted.
        batch_size: ``"file"`` (default): the shapes stored in the file.
            ``None``: make a model stored with batch 1 batch-polymorphic (the
            inputs' leading dimension becomes ``None`` and ``jit`` retraces
            per batch size); an int: fix the batch to that size. The graph is
            rewritten by :func:`fbjax.passes.shapes.set_batch_size`, which raises
            :class:`InputError` saying why when the batch-1 shapes cannot be
            proven to be the batch. ``"dynamic"`` is the same as ``None``
            (the spelling of ``fbjax export --batch-size``).
        quantized: for quantized TFLite models: ``"exact"`` (default) runs
            TFLite's integer kernels bit for bit; ``"float"`` dequantizes
            weights to float params (activations: float32 real values) for
            quantization-aware fine-tuning: the forward pass is the integer
            model's (weights re-quantized with the file's scales), the
            gradient the float ops' with straight-through roundings
            (approximate; see :mod:`fbjax.passes.quantization`).
        while_max_iterations: ``None`` (default): TFLite WHILE loops lower to
            ``lax.while_loop``, which JAX differentiates in forward mode only.
            An int N: they lower to a ``lax.scan`` of N steps that applies the
            body while the condition holds, so ``jax.grad`` (reverse mode)
            works. N must be >= the largest trip count of every WHILE in the
            model: results equal the ``while_loop``'s when it is; when a loop
            still wants to run after N steps, its float outputs are set to NaN
            (integer and bool outputs keep their values after N steps), so a
            too-small N shows as NaN rather than a silently wrong result.
            Cost: N body evaluations per loop, whatever the real trip count.
        constant_inputs: ``{input name: array}``: bind these graph inputs
            to the given values at load time (:func:`fbjax.passes.shapes.bind_inputs`);
            they leave :attr:`Model.inputs`. For inputs whose *values* fix
            shapes (a Reduce's ``axes``, a Reshape's shape, TopK's ``k``,
            NonZero's input) given as graph inputs, which a jitted call
            cannot take. Arrays cast to the input's dtype (``same_kind``).
        static_bounds: ``False`` (default): an op whose output size depends
            on values computed by the graph (ONNX ``NonMaxSuppression``,
            ``NonZero``, ``TopK``'s ``k``, ``Loop`` scan outputs; TFLite
            ``WHERE``, ``UNIQUE``) is refused (at load or at
            the first call). ``True``: such ops return
            their output padded to a bound known at load time (rows or
            columns filled with -1) and the model gets one extra int32
            scalar output per op, named ``"<output name>:valid_count"``,
            the number of valid leading entries; the model stays jittable
            and vmappable. Bounds: ``NonMaxSuppression``
            ``[batches * classes * min(max_output_boxes_per_class, boxes), 3]``
            (valid rows first, in ONNX's order), ``NonZero``
            ``[rank, input size]``; ``TopK`` with a ``k`` not stored in the
            file: the axis' size (values 0, indices -1 past ``k``); ``Loop``
            with scan outputs and a
            condition computed from data: scan outputs padded with zeros to
            the (load-time) trip count, the count being the iterations run;
            TFLite ``WHERE`` on a computed condition: ``[condition size,
            rank]`` int64 coordinates (-1 rows past the count); TFLite
            ``UNIQUE`` on a computed input: values ``[input size]`` in order
            of first appearance (zeros past the count), ``idx`` unchanged,
            the count named after the values output.
            (TFLite ``NON_MAX_SUPPRESSION_V4/V5``
            always return outputs padded to their ``max_output_size`` and a
            count, as LiteRT does.)
        compute_dtype: ``"float32"`` (default), ``"bfloat16"`` or
            ``"float16"``: the dtype float activations and weights compute
            in (accelerators run these at 2-16x float32's rate).
            Convolutions and matrix products accumulate in float32
            (``preferred_element_type``); reductions, softmax and
            normalisations (ops registered ``full_precision``) compute in
            float32; outputs come back in the file's dtypes; :attr:`Model.params`
            stay float32 master weights (cast on use, so gradients reach
            them in float32). Integer (quantized) kernels are unchanged.
            Expect relative errors of about 1e-2 (bfloat16) / 1e-3
            (float16) on the shared MediaPipe models
            (``tests/test_compute_dtype.py``).
        composites: how ``stablehlo.composite`` ops (TFLite
            ``STABLEHLO_COMPOSITE``; litert-torch writes attention and
            normalisations as ``odml.*`` composites) run: ``"litert"``
            (default) as LiteRT's default CPU path runs them: its XNNPACK
            delegate runs ``odml.scaled_dot_product_attention`` as one
            attention kernel, so fbjax lowers it to
            ``jax.nn.dot_product_attention``, and every other composite runs
            its decomposition (as LiteRT's builtin kernel does);
            ``"fused"``: every composite fbjax has a lowering for
            (:mod:`fbjax.lower.composites`: attention, RMS norm, group and
            layer norm) runs as that lowering; ``"decomposed"``: every
            composite runs the decomposition graph written in the file, op
            by op (what LiteRT's builtin kernels without a delegate do).
            The decomposition and the composite's meaning can differ: a
            litert-torch export whose attention heads share one KV head has
            a decomposition off by about 3 from PyTorch, while the
            composite matches it (``tests/test_tflite_composites.py``).
        max_value_bytes: the largest value, in bytes, the model may compute
            (one op's output, a constant computed at load, a range or fill
            whose size the file's values decide); default 4 GiB
            (:data:`fbjax.ir.MAX_VALUE_BYTES`). Checked on shapes alone, at
            load, before anything is computed: a damaged file asking for
            terabytes gets a ModelFormatError naming the node and the bytes,
            not an out-of-memory error or an abort. Raise it for a real model
            that needs more.
        tiered_compile: ``None`` (default): the ``FBJAX_TIERED_COMPILE``
            environment variable (off when unset). ``False``: every call
            runs the one optimised program, so one input gives the same
            bits on every call and in every process whatever the caches
            hold (the first call compiles it: about 1-3 s cold for the
            shared MediaPipe models on 2 cores, 0.3-0.6 s warm).
            ``True`` (CPU, models of 32 nodes or more): the first call
            compiles and runs a quick program (plain kernel choices, XLA
            at ``-O0``; typically 2-3x faster to compile, 5-20x slower per
            call) and a background thread swaps the optimised program in
            (:meth:`Model.wait_optimised`). The two programs' float results
            differ in the last bits (up to ~1e-4 relative measured), so
            which one a call ran depends on timing: not reproducible.
        kernel_options: a :class:`~fbjax.options.KernelOptions` (None: its
            defaults): the kernel choices, thresholds, precision and chunk
            sizes that change the computed program (for experiments and
            benchmarks; the defaults are the measured fastest).

    Returns:
        a :class:`Model`, callable and jitted. For an LLM bundle (a
        LiteRT-LM ``.litertlm`` or a MediaPipe LLM ``.task``, recognised by
        its bytes) an :class:`fbjax.llm_bundle.LlmBundle` wrapping the
        bundle's model (loaded with these options) and its tokenizer. For a
        MediaPipe Tasks vision bundle (``.task``: a zip of ``.tflite``
        models) a :class:`~fbjax.formats.vision_task.VisionTaskBundle`:
        ``bundle.names`` lists its members, ``bundle[name]`` loads one as a
        Model (with these options), ``bundle.save(path, {name: model})``
        writes it back.

    Raises:
        FileNotFoundError: no such file.
        ModelFormatError: the file is not a valid model, or contradicts
            itself (e.g. a WHILE/REDUCE region subgraph whose arity does not
            match its operator: :func:`fbjax.passes.reading.check_regions`), or changed
            size while it was read.
        UnsupportedOperatorError: the model uses ops fbjax cannot lower, or
            ops whose registered kernel check finds no kernel for their
            dtypes (int16 SQUARED_DIFFERENCE); every one is listed.
        ModelFormatError, UnsupportedOperatorError, InputError: what a
            lowering refuses (``ctx.error``: attributes or shapes that
            contradict the op, a case fbjax does not implement), found by
            an abstract trace of the model's first call at its input shapes
            (:func:`_trace_at_load`; nothing runs, and the first call reuses
            the trace), and of every signature of the file at its own input
            shapes (:func:`fbjax.signature.trace_signatures`: an LLM's
            ``decode``). Skipped for inputs with a dynamic (``None``)
            dimension: those errors then come from the first call, a
            ModelFormatError naming the node where ``jax.lax`` refuses the
            file's own operands (:func:`fbjax.lower.build.file_error`).
        InputError: ``while_max_iterations`` is not None or an int >= 0;
            ``batch_size`` is not ``"file"``, None/``"dynamic"`` or a
            positive int, or the model cannot take another batch (the
            message names the operator); ``quantized`` is not ``"exact"`` or
            ``"float"``; a ``constant_inputs`` name that is not an input (the
            message lists the inputs), or an array of another shape or dtype;
            ``compute_dtype`` is not one of the three names; ``composites``
            is not ``"litert"``, ``"fused"`` or ``"decomposed"``;
            ``max_value_bytes`` is not a positive int; ``tiered_compile``
            is not True, False or None; a ``kernel_options`` field out of
            range.
    """
    cache.enable()  # JAX's persistent compilation cache (fbjax/cache.py)
    options = LoadOptions(format=format, batch_size=batch_size, quantized=quantized,
                          while_max_iterations=while_max_iterations, static_bounds=static_bounds,
                          compute_dtype=compute_dtype, composites=composites, max_value_bytes=max_value_bytes,
                          tiered_compile=tiered_compile, kernel_options=kernel_options)
    if isinstance(source, (str, os.PathLike)):
        source = os.path.expanduser(source)  # "~/models/x.tflite", as a shell would expand it
    if format is None:
        container = _open_container(source, dict(batch_size=batch_size, quantized=quantized,
                                                 while_max_iterations=while_max_iterations,
                                                 constant_inputs=constant_inputs, static_bounds=static_bounds,
                                                 compute_dtype=compute_dtype, composites=composites,
                                                 max_value_bytes=max_value_bytes, tiered_compile=tiered_compile,
                                                 kernel_options=kernel_options))
        if container is not None:
            return container
    ir = loading.read(source, options.format)  # completed: region arities, open dtypes
    if constant_inputs:
        bind_inputs(ir, constant_inputs)
    g = ir.main_graph
    file_quant = ([_file_quant(v) for v in g.inputs], [_file_quant(v) for v in g.outputs])
    loading.rewrite(ir, options)
    program = loading.lower(ir, options, x64=_needs_x64(ir))
    path = None if isinstance(source, (bytes, bytearray, memoryview)) else os.fspath(source)
    # what loading this file again with another batch needs (fbjax.infer, the chunks below)
    load_kwargs = dict(options.as_kwargs(), constant_inputs=constant_inputs)

    def chunks(model):  # CPU: a large fixed batch runs in cache-sized chunks (fbjax.executors.chunked)
        return executors.select_chunks(model.program, model.inputs, model.outputs,
                                 lambda k: load(source, **dict(load_kwargs, batch_size=k)), options.batch_size)

    fixed_batch = options.rewrites_batch and options.batch_size is not None
    model = Model(ir, program, path, chunks=chunks if fixed_batch else None, load_kwargs=load_kwargs,
                  trace_base=lambda prog, **kw: executors.trace_base(prog, source, options, constant_inputs, **kw),
                  tiered=options.tiered_compile)
    model.input_quantization, model.output_quantization = file_quant
    _trace_at_load(model)  # every lowering error raised here, not at the first call (which reuses the trace)
    trace_signatures(model)  # and those of every other signature (an LLM's decode)
    return model
