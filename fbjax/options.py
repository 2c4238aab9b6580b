"""What :func:`fbjax.load` was asked for, as one frozen value.

:class:`LoadOptions` is validated once, at construction; it is what the load
pipeline (:mod:`fbjax.loading`) reads, the key of the CPU trace cache, and
how a model is loaded again with another batch (the chunked large-batch
path), so no option is threaded by hand. Its :class:`KernelOptions` field
holds every kernel choice and threshold that changes the computed program
(no module global does), and :data:`ENV` fbjax's environment variables,
read once with one rule (:func:`env_flag`), which supply defaults.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Optional, Union

import numpy as np

from .errors import InputError
from .ir import MAX_VALUE_BYTES

__all__ = ["LoadOptions", "KernelOptions", "kernel_options", "FILE_BATCH", "QUANTIZED_MODES", "COMPUTE_DTYPES",
           "COMPOSITE_MODES", "PRECISIONS", "DEPTHWISE_STRATEGIES", "ENV", "ENV_FLAGS", "env_flag", "default_cache_dir"]

#: fbjax's on/off environment variables: ``{name: (default, what it does)}``
#: (README "Environment variables" has the same table). Each is read once,
#: at import, into :data:`ENV` by :func:`env_flag`'s one rule.
ENV_FLAGS = {
    "FBJAX_TIERED_COMPILE": (False, "default of ``fbjax.load(tiered_compile=...)``: on CPU a quickly compiled "
                                    "first tier (faster cold first call, not bit-reproducible before "
                                    "``Model.wait_optimised()``)"),
    "FBJAX_XLA_DEFAULTS": (False, "default of ``KernelOptions.xla_defaults``: leave XLA:CPU's YNNPACK fusion "
                                  "on in the Model's jit (fbjax turns it off: slower, and it miscompiles "
                                  "grouped convolutions with jaxlib 0.10.2)"),
    "FBJAX_NO_CACHE": (False, "fbjax leaves JAX's persistent compilation cache configuration alone (and keeps "
                              "no trace cache); results are the same either way"),
}


def default_cache_dir() -> str:
    """JAX's persistent compilation cache directory that fbjax uses (:mod:`fbjax.cache`):
    ``$FBJAX_CACHE_DIR``, else ``$XDG_CACHE_HOME/fbjax/jax``, else ``~/.cache/fbjax/jax``.
    fbjax's other caches (traced programs, built CPU kernels) are folders beside it."""
    env = os.environ.get("FBJAX_CACHE_DIR")
    if env:
        return os.path.expanduser(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fbjax", "jax")


_FALSE = ("", "0", "false", "no", "off")


def env_flag(name: str, default: bool = False, environ=None) -> bool:
    """The one rule fbjax reads its on/off environment variables with:
    unset -> ``default``; ``""``, ``0``, ``false``, ``no``, ``off`` (any case,
    surrounding blanks ignored) -> False; any other value -> True.
    ``environ``: default ``os.environ``."""
    v = (os.environ if environ is None else environ).get(name)
    if v is None:
        return default
    return v.strip().lower() not in _FALSE


#: :data:`ENV_FLAGS` as read at import (``{name: bool}``).
ENV = {name: env_flag(name, default) for name, (default, _) in ENV_FLAGS.items()}

def _set_flag(options, field: str, env: str) -> None:
    """Validate the on/off field ``field`` of a frozen options object: None
    becomes the environment's default (``ENV[env]``), True/False stay.

    Raises:
        InputError: anything else.
    """
    v = getattr(options, field)
    if v is None:
        v = ENV[env]
    elif not isinstance(v, (bool, np.bool_)):
        raise InputError(f"{field} must be True, False or None (the environment's default), got {v!r}")
    object.__setattr__(options, field, bool(v))


#: ``KernelOptions.precision`` values (``jax.lax.Precision`` names, lower case).
PRECISIONS = ("default", "high", "highest")
#: ``KernelOptions.depthwise_strategy`` values.
DEPTHWISE_STRATEGIES = (None, "conv", "shifted")


@dataclass(frozen=True)
class KernelOptions:
    """Every choice of fbjax's kernels and executors that changes the
    computed program, as one frozen value: part of :class:`LoadOptions`
    (``fbjax.load(..., kernel_options=KernelOptions(...))``), read by the
    lowerings as ``ctx.options["kernel_options"]`` (:func:`kernel_options`)
    and by the CPU planner and executors from the program's options, and
    hashed into every cache key with the rest of the load options. The
    defaults are what fbjax measured fastest (see each field); other values
    are for experiments, benchmarks and tests.

    Attributes:
        precision: ``"highest"`` (default), ``"high"`` or ``"default"``: the
            ``jax.lax.Precision`` of convolutions and matrix products.
            ``HIGHEST`` keeps float32 accuracy on accelerators (the default
            may use bf16/tf32 passes there); on CPU it costs nothing.
        depthwise_strategy: None (default: by backend; on CPU shifted
            multiply-adds, which XLA:CPU runs ~70x faster than a grouped
            convolution; elsewhere ``lax.conv_general_dilated`` with
            ``feature_group_count``), ``"conv"`` or ``"shifted"`` (force
            one). With jax/jaxlib 0.10.2, XLA:CPU's YNNPACK fusion
            miscompiles chains of grouped convolutions under ``jit``: one
            more reason for the shifted default on CPU.
        small_conv_taps, small_conv_max_out: on CPU, ungrouped NHWC
            convolutions with ``C_in * KH * KW <= small_conv_taps``
            multiply-adds per output and at most ``small_conv_max_out``
            output channels (3-channel 3x3 first layers of image models) run
            as a sum over kernel taps (:func:`fbjax.lower.kernels.conv`;
            measured there). ``small_conv_taps=0`` disables.
        quick_shifted_min_output: the quick tier's kernel choices
            (``tiered_compile``) compute a depthwise convolution with more
            output elements than this as shifted multiply-adds, smaller ones
            as one grouped convolution.
        shifted_max_taps: on CPU, pools of at most this many window taps
            run as max/sum over strided slices (no ``reduce_window``:
            :func:`fbjax.lower.kernels.shifted_window_reduce`).
        compact_backward: under ``jax.grad``/``jax.vjp`` the CPU shifted
            depthwise runs through a compact custom VJP
            (:mod:`fbjax.lower.depthwise_vjp`); False: JAX's own derivative
            of the unrolled sum (larger, slower to compile, but
            ``jax.linearize`` works through it).
        conv_weight_layout: the layout the prepared CPU program relays
            convolution weights to (``"HWIO"``: what XLA:CPU's convolution
            emitter reads without a copy; :mod:`fbjax.executors.planner`).
        small_activation_bytes: a model whose largest image activation set
            at batch 1 is below this many bytes (and reads no value twice)
            runs the plain jit instead of the prepared CPU program.
        tiered_min_nodes: with ``tiered_compile``, programs of fewer graph
            nodes are not tiered (they compile fast anyway; a compiled
            executable's call costs ~6 us more than the jit's dispatch).
        chunk_bytes: a CPU model loaded with a fixed ``batch_size`` runs its
            batch as calls of the largest divisor whose activations fit
            this many bytes (:mod:`fbjax.executors.chunked`, :func:`fbjax.infer`).
        chunk_threads: streams of chunks run at once after the first call
            (does not change results).
        xla_defaults: False (default): on CPU the Model's jit turns XLA's
            YNNPACK fusion off (:func:`fbjax.cache.compiler_options`); True:
            XLA's defaults. None is stored as ``FBJAX_XLA_DEFAULTS``
            (:data:`ENV`).
        native_kernels: True (default): on CPU the hybrid (dynamic-range)
            kernels' integer matrix products run in fbjax's own kernels
            (:mod:`fbjax.lower.cpu_kernels`, built on first use with the
            machine's C++ compiler; ~35x XLA's integer dot on a quantized
            LLM's decode step), where they can be built; False: XLA's
            integer dot. The same int32 sums either way.
        native_attention: True (default): on CPU, with ``native_kernels``,
            float32 attention composites (``odml.scaled_dot_product_attention``)
            run in fbjax's kernel (``cpu_attention.cc``), which reads a layer
            scan's stacked KV caches in place (XLA's attention copies them
            into another layout on every call); False: XLA's
            ``jax.nn.dot_product_attention``. float32 sums in another order
            (stated in the kernel's source): last-bit differences.
        layer_scan: True (default): a graph's repeated blocks (an LLM's
            transformer layers, found from the graph's structure by
            :mod:`fbjax.lower.layer_scan`) run as one ``lax.scan`` over
            their stacked weights, so the first call's trace and compile
            time no longer grow with the depth; False: every block unrolled.
            The same ops on the same operands either way (XLA may fuse the
            float parts differently across block boundaries: last-bit
            differences).

    Raises:
        InputError: a value of the wrong type or out of range.
    """

    precision: str = "highest"
    depthwise_strategy: Optional[str] = None
    small_conv_taps: int = 27
    small_conv_max_out: int = 16
    quick_shifted_min_output: int = 150_000
    shifted_max_taps: int = 16
    compact_backward: bool = True
    conv_weight_layout: str = "HWIO"
    small_activation_bytes: int = 64 << 10
    tiered_min_nodes: int = 32
    chunk_bytes: int = 4 << 20
    chunk_threads: int = 2
    xla_defaults: Optional[bool] = None
    native_kernels: bool = True
    layer_scan: bool = True
    native_attention: bool = True

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise InputError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.depthwise_strategy not in DEPTHWISE_STRATEGIES:
            raise InputError(f"depthwise_strategy must be one of {DEPTHWISE_STRATEGIES}, "
                             f"got {self.depthwise_strategy!r}")
        for name in ("small_conv_taps", "small_conv_max_out", "quick_shifted_min_output", "shifted_max_taps",
                     "small_activation_bytes",
                     "tiered_min_nodes", "chunk_bytes", "chunk_threads"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise InputError(f"{name} must be an int >= 0, got {v!r}")
            object.__setattr__(self, name, int(v))
        if sorted(self.conv_weight_layout) != sorted("HWIO") or len(self.conv_weight_layout) != 4:
            raise InputError(f"conv_weight_layout must be a permutation of 'HWIO', got {self.conv_weight_layout!r}")
        for name in ("compact_backward", "native_kernels", "layer_scan", "native_attention"):
            v = getattr(self, name)
            if not isinstance(v, (bool, np.bool_)):
                raise InputError(f"{name} must be True or False, got {v!r}")
            object.__setattr__(self, name, bool(v))
        _set_flag(self, "xla_defaults", "FBJAX_XLA_DEFAULTS")

    @property
    def lax_precision(self):
        """:attr:`precision` as a ``jax.lax.Precision``."""
        from jax import lax

        return getattr(lax.Precision, self.precision.upper())

    def replace(self, **changes) -> "KernelOptions":
        """A copy with ``changes`` (validated again)."""
        return dataclasses.replace(self, **changes)


_DEFAULT_KERNEL_OPTIONS: dict = {}


def kernel_options(holder=None) -> KernelOptions:
    """The :class:`KernelOptions` of ``holder``: a lowering context or a
    :class:`~fbjax.lower.build.Program` (its ``options["kernel_options"]``),
    a :class:`LoadOptions`, a :class:`KernelOptions` itself; the defaults
    for None or a holder without any (a program built without them)."""
    if isinstance(holder, KernelOptions):
        return holder
    if isinstance(holder, LoadOptions):
        return holder.kernel_options
    opts = getattr(holder, "options", None)
    ko = opts.get("kernel_options") if isinstance(opts, dict) else None
    if ko is not None:
        return ko
    if "v" not in _DEFAULT_KERNEL_OPTIONS:
        _DEFAULT_KERNEL_OPTIONS["v"] = KernelOptions()
    return _DEFAULT_KERNEL_OPTIONS["v"]

#: ``batch_size`` value meaning "the shapes stored in the file".
FILE_BATCH = "file"
#: ``quantized`` values (see :mod:`fbjax.passes.quantization`).
QUANTIZED_MODES = ("exact", "float")
#: ``compute_dtype`` values (see :func:`fbjax.load`).
COMPUTE_DTYPES = ("float32", "bfloat16", "float16")
#: ``composites`` values (see :func:`fbjax.load` and :mod:`fbjax.lower.composites`).
COMPOSITE_MODES = ("litert", "fused", "decomposed")


@dataclass(frozen=True)
class LoadOptions:
    """The options of :func:`fbjax.load` (see there for their meaning).

    Attributes:
        format: ``"tflite"``, ``"rten"``, ``"stablehlo"`` or None (detected).
        batch_size: ``"file"``, None (any batch; ``"dynamic"`` is stored as
            None) or a positive int.
        quantized: ``"exact"`` or ``"float"``.
        while_max_iterations: None or an int >= 0.
        static_bounds: ops whose output size depends on computed values
            return outputs padded to a bound plus a valid count
            (:func:`fbjax.passes.shapes.add_valid_counts`).
        compute_dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"`` (a
            numpy/JAX dtype is stored as its name).
        composites: ``"litert"``, ``"fused"`` or ``"decomposed"``: which
            ``stablehlo.composite`` ops run as fbjax's own lowering of the
            composite instead of their decomposition.
        max_value_bytes: the byte budget of one value the model computes
            (:data:`fbjax.ir.MAX_VALUE_BYTES`, 4 GiB, by default); a
            check, not a change of the computed program.
        tiered_compile: on CPU, compile a quick program for the first call
            and swap the optimised one in when a background thread has
            compiled it (:mod:`fbjax.executors.tiered`). It trades bit
            reproducibility for a faster cold first call: the quick
            program is lowered and compiled differently (``-O0`` alone
            changes float results), so calls before
            :meth:`fbjax.Model.wait_optimised` may differ from later ones
            and from another process's in the last bits (measured up to
            1.2e-4 relative on mediapipe_selfie_segmentation). Default
            False: every call runs the optimised program, the same bits
            whatever ran before and whatever the cache held. ``None`` is
            stored as the ``FBJAX_TIERED_COMPILE`` environment default
            (:data:`ENV`).
        kernel_options: the :class:`KernelOptions` (None: the defaults; a
            dict is taken as its fields).

    Raises:
        InputError: ``while_max_iterations`` is not None or an int >= 0,
            ``quantized`` is not a known mode, ``batch_size`` is not
            ``"file"``, None/``"dynamic"`` or a positive int, or
            ``compute_dtype`` is not one of :data:`COMPUTE_DTYPES`, or
            ``composites`` not one of :data:`COMPOSITE_MODES`, or
            ``max_value_bytes`` is not a positive int.
    """

    format: Optional[str] = None
    batch_size: Union[int, None, str] = FILE_BATCH
    quantized: str = "exact"
    while_max_iterations: Optional[int] = None
    static_bounds: bool = False
    compute_dtype: str = "float32"
    composites: str = "litert"
    max_value_bytes: int = MAX_VALUE_BYTES
    tiered_compile: Optional[bool] = None
    kernel_options: Optional[KernelOptions] = None

    def __post_init__(self):
        w = self.while_max_iterations
        if w is not None and (isinstance(w, bool) or not isinstance(w, (int, np.integer)) or w < 0):
            raise InputError(f"while_max_iterations must be None or an int >= 0, got {w!r}")
        b = self.batch_size
        if isinstance(b, str) and b == "dynamic":
            object.__setattr__(self, "batch_size", None)
        elif not (b is None or (isinstance(b, str) and b == FILE_BATCH)) and (
                not isinstance(b, (int, np.integer)) or b < 1):
            raise InputError(f"batch_size must be None (or 'dynamic'), a positive int or 'file', got {b!r}")
        if self.quantized not in QUANTIZED_MODES:
            raise InputError(f"quantized must be one of {QUANTIZED_MODES}, got {self.quantized!r}")
        try:
            cd = np.dtype(self.compute_dtype).name
        except TypeError:
            cd = None
        if cd not in COMPUTE_DTYPES:
            raise InputError(f"compute_dtype must be one of {list(COMPUTE_DTYPES)}, got {self.compute_dtype!r}")
        object.__setattr__(self, "compute_dtype", cd)
        if self.composites not in COMPOSITE_MODES:
            raise InputError(f"composites must be one of {list(COMPOSITE_MODES)}, got {self.composites!r}")
        m = self.max_value_bytes
        if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1:
            raise InputError(f"max_value_bytes must be a positive int, got {m!r}")
        object.__setattr__(self, "max_value_bytes", int(m))
        _set_flag(self, "tiered_compile", "FBJAX_TIERED_COMPILE")
        k = self.kernel_options
        if k is None:
            object.__setattr__(self, "kernel_options", KernelOptions())
        elif isinstance(k, dict):
            object.__setattr__(self, "kernel_options", KernelOptions(**k))
        elif not isinstance(k, KernelOptions):
            raise InputError(f"kernel_options must be a fbjax.KernelOptions, a dict of its fields or None, got {k!r}")

    @property
    def rewrites_batch(self) -> bool:
        """Whether the batch rewrite (:func:`fbjax.passes.shapes.set_batch_size`) runs."""
        return not (isinstance(self.batch_size, str) and self.batch_size == FILE_BATCH)

    def lowering(self) -> dict:
        """The lowering options (``ctx.options`` of the lowerings), the
        :class:`KernelOptions` among them."""
        return {"while_max_iterations": self.while_max_iterations,
                "compute_dtype": self.compute_dtype,  # one form everywhere: the dtype's name
                "composites": self.composites,
                "max_value_bytes": self.max_value_bytes,
                "kernel_options": self.kernel_options}

    def replace(self, **changes) -> "LoadOptions":
        """A copy with ``changes`` (validated again)."""
        return dataclasses.replace(self, **changes)

    def as_kwargs(self) -> dict:
        """The keyword arguments of :func:`fbjax.load` that give these options."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def cache_key(self) -> tuple:
        """The options as a tuple of ``repr`` strings, nested
        :class:`KernelOptions` field by field: what every cache key of a
        model's programs includes (:func:`fbjax.executors.trace_cache.trace_base`)."""
        return tuple(map(repr, dataclasses.astuple(self)))
