"""Fine-tuning LLM bundles from text: a next-token loss, and LoRA adapters written back into the bundle.

::

    import jax, optax, fbjax
    from fbjax import finetune

    bundle = fbjax.load("model.litertlm")
    lora = finetune.lora_init(bundle, rank=8, alpha=16, include=["*attention*", "*feed_forward*"],
                              key=jax.random.key(0))
    opt = optax.adam(1e-2)
    state = opt.init(lora)
    grad = jax.jit(jax.grad(lambda l: bundle.loss(bundle.params, ["some text"], lora=l)))
    for _ in range(100):
        updates, state = opt.update(grad(lora), state)
        lora = optax.apply_updates(lora, updates)
    bundle.save("tuned.litertlm", finetune.merge_lora(bundle, bundle.params, lora))

The loss (:func:`loss`, :meth:`fbjax.LlmBundle.loss`). Each text is tokenized
with the bundle's tokenizer, the start token prepended (and with
``add_stop=True`` the bundle's first stop sequence appended, so that the model
learns to stop after the text); the mean next-token cross-entropy is taken over
every token after the first, over all texts (token-weighted). The inputs the
model's signatures need are made here: when the prefill signature returns
``logits`` (litert-torch's gemma exports), the tokens run through it in chunks
of its length (positions ``c*n ..``, a causal mask, the KV cache the previous
chunk left, empty at first); otherwise (llama exports, whose prefill returns
only the cache) the decode signature runs over the tokens one at a time
(``lax.scan``). Texts are padded to the longest (padding positions carry no
loss and, the mask being causal, do not change the others). A text must fit
the KV cache (the prefill path: its length rounded up to whole chunks).

LoRA (:func:`lora_init`, :func:`lora_params`, :func:`merge_lora`). An adapter
on a weight ``W`` ``[O, I]`` (the layout the file stores: TFLite
FULLY_CONNECTED weights are ``[out, in]``) is ``A`` ``[r, I]`` (uniform in
``±1/sqrt(I)``) and ``B`` ``[O, r]`` (zeros), and the adapted weight is
``W + (alpha / r) * B @ A``. The adapters are a :class:`Lora` pytree (the
``alpha`` a static field), so optax trains them as they are.

* Float weights (``bundle.params``): :func:`lora_params` returns the params
  with ``W + (alpha/r) B A`` in place of ``W``, inside the traced function
  (differentiable in ``A`` and ``B``).
* Quantized weights (int8 per channel, int4 per block: litert-torch's
  ``dynamic_int8`` / ``dynamic_int4_block32``) are not params: they are
  :attr:`fbjax.Model.buffers`, integer arrays that TFLite's hybrid
  FULLY_CONNECTED kernel (``tflite.hybrid``, which quantizes each input row to
  int8 and multiplies in integers) reads as they are. There is no float weight
  for a delta to enter, so the base stays as stored (QLoRA style) and the
  adapter runs beside the kernel: the node's output becomes
  ``hybrid(x, W_q) + (alpha/r) * (x @ A.T) @ B.T`` (the side path in float32,
  on the node's float input). The integer kernel's own gradient with respect
  to ``x`` is that of a rounding (zero almost everywhere), which would stop
  every adapter below the last layer from learning; while adapters are
  active, every hybrid FULLY_CONNECTED therefore gets a straight-through
  backward, ``dx = g @ dequantize(W_q)`` (the weight dequantized with its
  scales only in the backward pass, as QLoRA does), ``db = sum(g)``. Both are
  put in by a registry view (the lowering registry is the hook, as
  :mod:`fbjax.executors.cpu_prepared` uses it) on a copy of the model's
  program for the one trace; the model's own programs are untouched. Such a
  node with a fused activation is refused (the side path would have to go
  before it).
* Saving: :func:`merge_lora` returns params for :meth:`fbjax.LlmBundle.save`:
  float weights merged in float64 and rounded to float32 once; a quantized
  weight's float merge ``dequantize(W_q) + (alpha/r) B A`` re-quantized on
  the file's grid (the file's per-channel or per-block scales and zero points
  kept; values outside a channel's range clip to it), which ``save`` writes
  as they are. :func:`requantization_error` measures what that rounding
  moved.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from typing import Mapping, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from .errors import InputError
from .generation import _CACHE_PREFIX, _causal_mask
from .lower.tflite_int.hybrid import OP_SET as _HYBRID
from .quantmath import dequantize_array, requantize_weights

__all__ = ["Lora", "loss", "text_tokens", "lora_init", "lora_params", "merge_lora", "requantization_error"]


@dataclasses.dataclass(frozen=True)
class Lora:
    """Low-rank adapters: ``adapters`` ``{weight name: (A [r, I], B [O, r])}`` and ``alpha`` (static).

    A JAX pytree (``adapters`` are its leaves, ``alpha`` part of its
    structure): ``optax`` initialises and updates it like any parameters.
    The adapted weight is ``W + (alpha / r) * B @ A``, ``r = A.shape[0]``.
    """

    adapters: dict
    alpha: float = 16.0

    def scale(self, name: str) -> float:
        """``alpha / r`` of adapter ``name``."""
        return float(self.alpha) / int(np.shape(self.adapters[name][0])[0])

    @property
    def num_parameters(self) -> int:
        """Trainable values in all adapters (``r * (I + O)`` each)."""
        return int(sum(np.size(a) + np.size(b) for a, b in self.adapters.values()))


jax.tree_util.register_dataclass(Lora, data_fields=["adapters"], meta_fields=["alpha"])


def _parts(bundle):
    """(model, runner) of an :class:`~fbjax.LlmBundle` (duck-typed: this module sits below it)."""
    model, runner = getattr(bundle, "model", None), getattr(bundle, "_runner", None)
    if model is None or runner is None:
        raise InputError(f"expected an LLM bundle (fbjax.load of a .litertlm / .task), got {type(bundle).__name__}")
    return model, runner


def text_tokens(bundle, texts: Union[str, Sequence[str]], *, add_stop: bool = False) -> list:
    """The token ids :func:`loss` trains on: per text, the start token, the
    text's tokens, and with ``add_stop`` the bundle's first stop sequence.

    Raises:
        InputError: no texts, a text that is not a string, or one with
            fewer than two ids (nothing to predict).
    """
    texts = [texts] if isinstance(texts, str) else list(texts)
    if not texts:
        raise InputError("loss: no texts")
    stop = list(bundle.stop_tokens[0]) if add_stop and bundle.stop_tokens else []
    rows = []
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise InputError(f"loss: text {i} is a {type(t).__name__}, not a string")
        row = bundle.encode(t) + stop
        if len(row) < 2:
            raise InputError(f"loss: text {i} ({t!r}) has {len(row)} token(s); a loss needs at least two")
        rows.append(row)
    return rows


def _call(sig, program, params, buffers, ins: dict) -> dict:
    """One signature on one row: inputs reshaped/cast to its specs, run on ``program``."""
    vals = [jnp.asarray(ins[s.name]).astype(s.dtype).reshape(s.shape) for s in sig.inputs]
    outs = sig.apply_tuple(params, *vals, buffers=buffers, program=program)
    return dict(zip([s.name for s in sig.outputs], outs))


def _row_logits_prefill(sig, program, params, buffers, tokens, chunks: int, n: int):
    """``[chunks * n, V]`` logits of one row through the prefill signature, chunk after chunk."""
    spec = {s.name: s for s in sig.inputs}
    kv = {k: jnp.zeros(s.shape, s.dtype) for k, s in spec.items() if k.startswith(_CACHE_PREFIX)}
    out = []
    for c in range(chunks):
        pos = c * n + jnp.arange(n, dtype=jnp.int32)
        ins = dict(kv, tokens=tokens[c * n:(c + 1) * n], input_pos=pos)
        if "mask" in spec:
            ins["mask"] = _causal_mask(spec["mask"], pos)
        o = _call(sig, program, params, buffers, ins)
        out.append(o["logits"].reshape(n, -1))
        kv = {k: o[k] for k in kv}
    return jnp.concatenate(out, axis=0)


def _row_logits_decode(sig, program, params, buffers, tokens):
    """``[L - 1, V]`` logits of one row through the decode signature, one token at a time (``lax.scan``)."""
    spec = {s.name: s for s in sig.inputs}
    kv = {k: jnp.zeros(s.shape, s.dtype) for k, s in spec.items() if k.startswith(_CACHE_PREFIX)}

    def step(kv, xs):
        tok, pos = xs
        ins = dict(kv, tokens=tok, input_pos=pos)
        if "mask" in spec:
            ins["mask"] = _causal_mask(spec["mask"], pos.reshape(1))
        o = _call(sig, program, params, buffers, ins)
        return {k: o[k] for k in kv}, o["logits"].reshape(-1)

    n = tokens.shape[0] - 1
    _, logits = jax.lax.scan(step, kv, (tokens[:n], jnp.arange(n, dtype=jnp.int32)))
    return logits


def loss(bundle, params: Mapping, texts: Union[str, Sequence[str]], *, lora: Optional[Lora] = None,
         add_stop: bool = False, buffers: Optional[Mapping] = None):
    """Mean next-token cross-entropy of ``texts`` under ``params`` (and ``lora``), a float32 scalar.

    Differentiable in ``params`` and ``lora`` and traceable (``jax.jit`` a
    function of them: the texts are tokenized while tracing). See the module
    docstring for how the texts become the signatures' inputs.

    Args:
        bundle: an :class:`~fbjax.LlmBundle`.
        params: the model's float weights (``bundle.params`` or tuned ones).
        texts: a string or a list of them.
        lora: adapters to apply (:func:`lora_init`), or None.
        add_stop: append the bundle's first stop sequence to each text.
        buffers: the integer weight buffers (default
            ``bundle.model.buffers``); pass them as arguments of your
            ``jax.jit`` for a large quantized model, so that its program
            does not embed them as constants.

    Raises:
        InputError: see :func:`text_tokens`; a text longer than the KV cache
            (the prefill path: rounded up to whole prefill chunks) -- split
            it; adapters on weights the model does not have.
    """
    model, r = _parts(bundle)
    rows = text_tokens(bundle, texts, add_stop=add_stop)
    use_prefill = "logits" in [s.name for s in r.pre.outputs]
    longest = max(len(x) for x in rows)
    width = -(-longest // r.n) * r.n if use_prefill else longest
    if width > r.capacity:
        i = max(range(len(rows)), key=lambda k: len(rows[k]))
        how = (f" (rounded up to whole prefill chunks of {r.n}: {width})" if use_prefill else "")
        raise InputError(f"loss: text {i} has {len(rows[i])} tokens{how}; the KV cache holds {r.capacity} "
                         "positions: split it into shorter texts")
    tokens = np.zeros((len(rows), width), np.int32)
    weights = np.zeros((len(rows), width - 1), np.float32)
    for i, row in enumerate(rows):
        tokens[i, :len(row)] = row
        weights[i, :len(row) - 1] = 1.0
    buffers = model.buffers if buffers is None else buffers
    with jax.enable_x64(model.x64):
        program = model.program
        if lora is not None:
            params, program = _with_lora(model, params, lora)
        if use_prefill:
            row = lambda t: _row_logits_prefill(r.pre, program, params, buffers, t, width // r.n, r.n)[:-1]  # noqa: E731
        else:
            row = lambda t: _row_logits_decode(r.dec, program, params, buffers, t)  # noqa: E731
        logits = jax.vmap(row)(jnp.asarray(tokens)).astype(jnp.float32)  # [B, L-1, V]
        target = jnp.asarray(tokens[:, 1:])
        nll = jax.nn.logsumexp(logits, axis=-1) - jnp.take_along_axis(logits, target[..., None], axis=-1)[..., 0]
        w = jnp.asarray(weights)
        return jnp.sum(nll * w) / jnp.sum(w)


# --- LoRA ---------------------------------------------------------------------------------------

def _weights(source) -> tuple:
    """(float params, integer buffers, model or None) of a bundle, a Model, or a plain params dict."""
    model = getattr(source, "model", source if hasattr(source, "program") else None)
    if model is not None:  # (the file's integer weights, by name: names and shapes are read here)
        return dict(model.params), model.program.buffers, model
    if isinstance(source, Mapping):
        return dict(source), {}, None
    raise InputError(f"lora: expected an LLM bundle, a fbjax.Model or a params dict, got {type(source).__name__}")


def _quant_of(model, name: str):
    """The QuantParams of weight buffer ``name`` (one for every Value on it)."""
    values = {id(v): v for g in model.ir.graphs for v in g.values}
    for vid, n in model.program.buffer_of.items():
        if n == name and values[vid].quant is not None:
            return values[vid].quant
    raise InputError(f"lora: weight {name!r} is an integer buffer without quantization parameters: it is "
                     "not a quantized weight (a table or an integer bias); leave it out of include=")


def _dense_hybrid(registry, op_set: str, name: str) -> bool:
    """Whether ops ``(op_set, name)`` are hybrid kernels (float input, integer weights) of a dense layer:
    their float twin declares input 1 an ``[O, I]`` weight (its ``weights`` fact, layout ``"OI"``),
    the layout the side path multiplies by."""
    if op_set != _HYBRID:
        return False
    twin = registry.get("tflite", name)
    return twin is not None and (1, "OI") in tuple(twin.weights)


def _hybrid_consumers(model, name: str) -> list:
    """The nodes reading buffer ``name``, as (node, input index)."""
    ids = {vid for vid, n in model.program.buffer_of.items() if n == name}
    return [(node, i) for g in model.ir.graphs for node in g.nodes for i, v in enumerate(node.inputs)
            if v is not None and id(v) in ids]


def lora_init(source, *, rank: int = 8, alpha: float = 16.0, include: Sequence[str] = ("*",),
              exclude: Sequence[str] = (), key=None) -> Lora:
    """Rank-``rank`` adapters on the 2-D weights whose names match ``include`` (and no ``exclude``).

    Args:
        source: an :class:`~fbjax.LlmBundle` or :class:`~fbjax.Model` (its
            float params and its quantized weight buffers are candidates), or
            a params dict.
        rank: ``r``; alpha: the adapters' scale is ``alpha / r``.
        include, exclude: :mod:`fnmatch` glob patterns over the weight
            names (``list(bundle.params)`` and ``list(bundle.model.buffers)``).
        key: a ``jax.random`` key for ``A`` (default ``key(0)``).

    Returns:
        a :class:`Lora`: per weight ``W`` ``[O, I]``, ``A`` float32 ``[r, I]``
        uniform in ``±1/sqrt(I)``, ``B`` float32 ``[O, r]`` zeros (the
        adapted model starts as the base).

    Raises:
        InputError: ``rank < 1``, an include pattern matching no 2-D weight,
            a quantized weight that some node other than a hybrid
            FULLY_CONNECTED (input 1) reads, or one without scales.
    """
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or rank < 1:
        raise InputError(f"lora_init: rank must be a positive int, got {rank!r}")
    params, buffers, model = _weights(source)
    key = jax.random.key(0) if key is None else key
    cands = {n: np.shape(v) for n, v in {**params, **buffers}.items() if len(np.shape(v)) == 2}
    chosen = []
    for pat in include:
        hit = [n for n in cands if fnmatch.fnmatchcase(n, pat)]
        if not hit:
            raise InputError(f"lora_init: include pattern {pat!r} matches no 2-D weight (of {len(cands)}; "
                             "list(bundle.params) and list(bundle.model.buffers) name them)")
        chosen += [n for n in hit if n not in chosen]
    chosen = [n for n in chosen if not any(fnmatch.fnmatchcase(n, p) for p in exclude)]
    for n in chosen:
        if n in buffers and model is not None:
            _quant_of(model, n)
            bad = [f"{node.op_set}:{node.op_name} input {i}" for node, i in _hybrid_consumers(model, n)
                   if i != 1 or not _dense_hybrid(model.program.registry, node.op_set, node.op_name)]
            if bad:
                raise InputError(f"lora_init: quantized weight {n!r} is read by {bad[0]}; LoRA on a quantized "
                                 "weight runs beside a hybrid dense layer (FULLY_CONNECTED) only: exclude it "
                                 "(exclude=[...])")
    adapters = {}
    for n, k in zip(chosen, jax.random.split(key, max(len(chosen), 1))):
        o, i = cands[n]
        bound = 1.0 / np.sqrt(max(i, 1))
        adapters[n] = (jax.random.uniform(k, (rank, i), jnp.float32, -bound, bound), jnp.zeros((o, rank), jnp.float32))
    return Lora(adapters, float(alpha))


def lora_params(params: Mapping, lora: Lora) -> dict:
    """``params`` with every float weight that has an adapter replaced by
    ``W + (alpha/r) B @ A`` (traceable, differentiable in ``lora``); adapters
    on names not in ``params`` (quantized weights) are left to :func:`loss`'s
    side path.

    Raises:
        InputError: an adapter whose shapes do not fit its weight.
    """
    out = dict(params)
    for name, (a, b) in lora.adapters.items():
        if name in out:
            w = out[name]
            if (np.shape(b)[0], np.shape(a)[1]) != tuple(np.shape(w)):
                raise InputError(f"lora: adapter {name!r} makes a {np.shape(b)[0]}x{np.shape(a)[1]} delta for a "
                                 f"weight of shape {tuple(np.shape(w))}")
            out[name] = w + (lora.scale(name) * (b @ a)).astype(jnp.asarray(w).dtype)
    return out


def _with_lora(model, params, lora: Lora):
    """(params with float adapters merged, a program copy whose registry view adds the quantized ones)."""
    unknown = [n for n in lora.adapters if n not in params and n not in model.program.buffers]
    if unknown:
        raise InputError(f"lora: adapter(s) on {unknown[:3]}, which this model does not have")
    params = lora_params(params, lora)
    side = {n: ab for n, ab in lora.adapters.items() if n not in params}
    targets = {vid: n for vid, n in model.program.buffer_of.items() if n in side}
    view = _LoraRegistry(model.program.registry, targets, side, {n: lora.scale(n) for n in side})
    # unrolled (no layer scan): the view finds each adapted weight's nodes by their Values, block by block,
    # and wraps the kernels in a custom VJP over arrays
    return params, dataclasses.replace(model.program, registry=view, scans={})


class _LoraRegistry:
    """Registry view for one trace: hybrid FULLY_CONNECTED nodes get the
    straight-through backward and, on adapted weights, the float side path
    (module docstring). ``adapters`` are the traced ``(A, B)`` of this trace."""

    def __init__(self, base, targets: dict, adapters: dict, scales: dict):
        self.base, self.targets, self.adapters, self.scales = base, targets, adapters, scales
        self._defs: dict = {}

    def get(self, op_set: str, name: str):
        od = self.base.get(op_set, name)
        if od is None or not _dense_hybrid(self.base, op_set, name):
            return od
        if name not in self._defs:
            self._defs[name] = dataclasses.replace(od, fn=self._fc(od.fn))
        return self._defs[name]

    def __getattr__(self, name):
        return getattr(self.base, name)

    def _fc(self, fn):
        def lowering(ctx, x, w, b=None, **attrs):
            act = attrs.get("fused_activation_function", "NONE")
            if act != "NONE":
                raise InputError(f"lora: {ctx.node.location}: a hybrid FULLY_CONNECTED with fused activation "
                                 f"{act}: adapters and their gradient run beside the integer kernel only "
                                 "without one")
            q = ctx.inputs[1].quant
            o, i = np.shape(w)
            x = jnp.asarray(x, jnp.float32)
            x_shape = x.shape

            def deq(w):
                wf = w.astype(jnp.float32)
                if q.block_size:
                    return wf * jnp.repeat(jnp.asarray(q.scale, jnp.float32), q.block_size, axis=-1).reshape(o, i)
                s = jnp.asarray(q.scale, jnp.float32).reshape(-1, 1) if np.size(q.scale) > 1 else jnp.float32(
                    np.asarray(q.scale).reshape(()))
                zp = np.asarray(q.zero_point).reshape(-1)
                if zp.size and np.any(zp):
                    wf = wf - jnp.asarray(zp.reshape(-1, 1) if zp.size > 1 else zp.reshape(()), jnp.float32)
                return wf * s

            @jax.custom_vjp
            def kernel(x, w, b):
                return fn(ctx, x, w, b, **attrs)

            def kernel_fwd(x, w, b):
                return kernel(x, w, b), w

            def kernel_bwd(w, g):
                g2 = g.reshape(-1, o).astype(jnp.float32)
                dx = (g2 @ deq(w)).reshape(x_shape)
                return dx, None, (None if b is None else g2.sum(0).astype(jnp.asarray(b).dtype))

            kernel.defvjp(kernel_fwd, kernel_bwd)
            y = kernel(x, w, b)
            name = self.targets.get(id(ctx.inputs[1]))
            if name is not None:
                a, bb = self.adapters[name]
                side = (x.reshape(-1, i) @ a.T) @ bb.T
                y = y + (self.scales[name] * side).reshape(y.shape).astype(y.dtype)
            return y
        return lowering


def merge_lora(source, params: Mapping, lora: Lora, *, requantize: bool = True) -> dict:
    """Params for :meth:`fbjax.LlmBundle.save` / :meth:`fbjax.Model.save` with ``lora`` merged.

    Float weights: ``W + (alpha/r) B @ A`` computed in float64, rounded to
    float32 once. Quantized weights (buffers): their float merge
    ``W' = dequantize(W_q) + (alpha/r) B @ A``, re-quantized on the file's
    grid (``requantize``): ``clip(rint(W' / scale) + zero_point)`` with the
    file's per-channel or per-block scales and zero points
    (:func:`fbjax.quantmath.requantize_weights`, the rule
    :meth:`fbjax.Model.save` applies to float values; int4 blocks clip to
    [-8, 7]), given to ``save`` as the integers it writes as they are; see
    :func:`requantization_error` for what the rounding moves.

    Args:
        requantize: False: quantized weights as their float merge ``W'``
            (numpy float32), for :func:`requantization_error`.

    Returns:
        ``dict(params)`` plus the merged weights (numpy float32; quantized
        weights integer arrays of the file's values unless ``requantize`` is False).

    Raises:
        InputError: adapters on weights ``source`` does not have, or whose
            shapes do not fit.
    """
    _, buffers, model = _weights(source)
    out = dict(params)
    for name, (a, b) in lora.adapters.items():
        a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
        delta = lora.scale(name) * (b64 @ a64)
        if name in params:
            base = np.asarray(params[name], np.float64)
        elif name in buffers and model is not None:
            base = dequantize_array(np.asarray(model.program.buffers[name]), _quant_of(model, name)).astype(np.float64)
        else:
            raise InputError(f"merge_lora: adapter on {name!r}, which this model does not have")
        if delta.shape != base.shape:
            raise InputError(f"merge_lora: adapter {name!r} makes a {delta.shape} delta for a weight of shape "
                             f"{base.shape}")
        merged = (base + delta).astype(np.float32)
        if requantize and name not in params:
            stored = np.asarray(model.program.buffers[name])
            merged = requantize_weights(merged, _quant_of(model, name), stored.dtype)
        out[name] = merged
    return out


def requantization_error(source, merged: Mapping) -> dict:
    """How far re-quantizing the float merge of each quantized weight moves it.

    Args:
        source: the bundle or Model; merged: :func:`merge_lora`'s result with ``requantize=False``.

    Returns:
        ``{name: {"max_abs": float, "max_steps": float, "max_steps_unclipped":
        float, "clipped": int, "delta_max_abs": float}}`` for each quantized
        weight in ``merged``: the largest ``|dequantize(requantize(W')) - W'|``,
        the same in units of the weight's quantization step (and over the
        values inside the integer range only: <= 0.5), the
        values outside the integer range (clipped), and the largest
        ``|W' - dequantize(W_q)|`` (the LoRA delta) for scale.
    """
    _, buffers, model = _weights(source)
    out = {}
    for name, w in merged.items():
        if name not in buffers or model is None:
            continue
        q = _quant_of(model, name)
        stored = np.asarray(model.program.buffers[name])
        w = np.asarray(w, np.float32)
        dtype = np.int8
        wq = requantize_weights(w, q, dtype)
        back = dequantize_array(wq, q)
        step = (np.repeat(np.asarray(q.scale, np.float32), q.block_size, axis=-1).reshape(w.shape)
                if q.block_size else dequantize_array(np.ones_like(stored), q) - dequantize_array(np.zeros_like(stored), q))
        lo, hi = (-8, 7) if q.block_size else (-128, 127)
        raw = np.rint(w / step)
        inside = (raw >= lo) & (raw <= hi)
        moved = np.abs(back - w) / step
        out[name] = {"max_abs": float(np.max(np.abs(back - w))),
                     "max_steps": float(np.max(moved)),
                     "max_steps_unclipped": float(np.max(moved[inside])) if inside.any() else 0.0,
                     "clipped": int(np.sum((raw < lo) | (raw > hi))),
                     "delta_max_abs": float(np.max(np.abs(w - dequantize_array(stored, q))))}
    return out
