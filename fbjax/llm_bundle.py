"""Text in, text out: LLM bundles (``.litertlm``, MediaPipe LLM ``.task``) as :class:`LlmBundle`.

``fbjax.load("model.litertlm")`` returns an :class:`LlmBundle`: the bundle's
TFLite prefill/decode model as a :class:`~fbjax.Model` (its signatures
driven as :mod:`fbjax.generation` drives them), its tokenizer
(``sentencepiece`` or HuggingFace ``tokenizers``), start and stop tokens,
prompt templates, Jinja chat template and sampler defaults.

Generation follows the LiteRT-LM runtime (0.18.1), so that greedy text equals
the runtime's:

* the prompt (with the bundle's prompt template: user prefix + prompt + user
  suffix + model prefix, unless ``template=False``) is tokenized and the start
  token prepended;
* every prompt token but the last is prefilled, in chunks of the prefill
  signature's length; decoding starts from the last prompt token (in a chat,
  the last token generated is fed at the next turn's prefill);
* generation stops at a stop token (not part of the text), or when the KV
  cache is full (``capacity - tokens so far`` new tokens at most; capacity:
  ExecutorMetadata's ``sequence_axis`` of the K cache where present, else the
  mask's or the cache's sequence axis as :mod:`fbjax.generation` reads it), or
  after ``max_new_tokens``;
* text streams one piece per token (special tokens included, as the
  tokenizer decodes them), the first piece without its leading space.

Chat (:meth:`LlmBundle.chat`): each turn renders the conversation with the
bundle's Jinja chat template (``bos_token`` empty: the start token goes in as
an id) and feeds only the text new since the previous render (the new user
turn and the generation prompt; the last reply's closing text is not fed),
after the previous turn's last token; checked over three turns against the
runtime's Conversation.

Fine-tuning: :meth:`LlmBundle.loss` is the next-token loss on text
(:mod:`fbjax.finetune`, which also has LoRA adapters, on quantized weights
too); train :attr:`LlmBundle.params` (or adapters, merged with
:func:`fbjax.finetune.merge_lora`) and write them back with
:meth:`LlmBundle.save`.

Sampling: greedy when ``top_k == 1`` or ``temperature == 0`` (the runtime's
CPU sampler is top-p after top-k, and ``k=1`` is greedy); otherwise
``softmax(logits / temperature)`` restricted to the ``top_k`` largest and then
to the smallest set whose probability reaches ``top_p``, drawn with
``jax.random`` from ``seed`` (fbjax's own random stream: not the runtime's).
"""

from __future__ import annotations

import dataclasses
from typing import Iterator, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from . import cache, finetune
from .errors import InputError, ModelFormatError
from .formats import llm_container as _fmt
from .formats._writing import write_file
from .generation import _cache_positions, _causal_mask, _CACHE_PREFIX, llm_signatures
from .lower.build import updated_in_place
from .lower.layer_slice import LayerSlice, materialize

__all__ = ["LlmBundle", "Tokenizer", "Sampler", "ChatSession", "open_bundle"]


class Tokenizer:
    """A bundle's tokenizer: SentencePiece (``sentencepiece``) or HuggingFace (``tokenizers``).

    Attributes:
        kind: ``"sentencepiece"`` or ``"hf"``.
        vocab_size: number of token ids.
    """

    def __init__(self, kind: str, data: bytes, label: str = "tokenizer"):
        self.kind = kind
        try:
            if kind == "sentencepiece":
                import sentencepiece

                self._sp = sentencepiece.SentencePieceProcessor()
                self._sp.LoadFromSerializedProto(data)
                self.vocab_size = int(self._sp.GetPieceSize())
            else:
                import tokenizers

                self._hf = tokenizers.Tokenizer.from_str(data.decode("utf-8"))
                self.vocab_size = int(self._hf.get_vocab_size(with_added_tokens=True))
        except ImportError as e:
            raise ImportError(f"reading a {kind} tokenizer needs the {e.name!r} package: pip install "
                              "'fbjax[llm]'") from None
        except Exception as e:  # the libraries raise RuntimeError/OSError/Exception subclasses of their own
            raise ModelFormatError(f"{label}: the {kind} tokenizer does not load ({type(e).__name__}: {e})") from None

    def encode(self, text: str) -> list:
        """Token ids of ``text`` (no start token added; special-token text such as ``<start_of_turn>``
        becomes its id where the tokenizer defines it)."""
        if self.kind == "sentencepiece":
            return list(self._sp.EncodeAsIds(text))
        return list(self._hf.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` (special tokens kept as the tokenizer spells them)."""
        ids = [int(i) for i in ids]
        if self.kind == "sentencepiece":
            return self._sp.DecodeIds(ids)
        return self._hf.decode(ids, skip_special_tokens=False)

    def piece(self, token: int) -> str:
        """How the vocabulary spells ``token`` (control tokens included, unlike :meth:`decode`)."""
        if self.kind == "sentencepiece":
            return self._sp.IdToPiece(int(token))
        return self._hf.id_to_token(int(token)) or ""

    def token_id(self, text: str) -> Optional[int]:
        """The id of a token spelled ``text``, or ``None``."""
        if self.kind == "sentencepiece":
            i = self._sp.PieceToId(text)
            return None if i == self._sp.unk_id() and text != self._sp.IdToPiece(i) else int(i)
        i = self._hf.token_to_id(text)
        return None if i is None else int(i)


@dataclasses.dataclass
class Sampler:
    """Sampler settings (the bundle's ``sampler_params``, overridable per call).

    ``top_k == 1`` or ``temperature == 0`` is greedy; ``top_p`` in (0, 1];
    ``seed`` starts the ``jax.random`` stream.
    """

    temperature: float = 1.0
    top_k: int = 1
    top_p: float = 1.0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.top_k == 1 or self.temperature == 0

    def replace(self, **kw) -> "Sampler":
        s = dataclasses.replace(self, **{k: v for k, v in kw.items() if v is not None})
        if s.temperature < 0 or s.top_k < 1 or not 0 < s.top_p <= 1:
            raise InputError(f"sampler: temperature must be >= 0, top_k >= 1 and 0 < top_p <= 1; got {s}")
        return s


def _sample(logits, key, temperature: float, top_k: int, top_p: float):
    """One token id per row of ``logits`` ``[B, V]`` (see :class:`Sampler`)."""
    if top_k == 1 or temperature == 0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logits = logits.astype(jnp.float32) / temperature
    k = min(top_k, logits.shape[-1])
    vals, idx = jax.lax.top_k(logits, k)  # sorted, largest first
    probs = jax.nn.softmax(vals, axis=-1)
    keep = jnp.cumsum(probs, axis=-1) - probs < top_p  # the smallest prefix reaching top_p
    vals = jnp.where(keep, vals, -jnp.inf)
    choice = jax.random.categorical(key, vals, axis=-1)
    return jnp.take_along_axis(idx, choice[:, None], axis=-1)[:, 0].astype(jnp.int32)


class _Runner:
    """Jitted prefill-chunk and decode-step programs over a batch of KV caches (rows under ``vmap``)."""

    def __init__(self, model, capacity: int, prefill: Optional[str] = None):
        self.model = model
        self.pre, self.dec = llm_signatures(model, prefill)
        self.pre_in = {s.name: s for s in self.pre.inputs}
        self.dec_in = {s.name: s for s in self.dec.inputs}
        self.cache_names = [n for n in self.dec_in if n.startswith(_CACHE_PREFIX)]
        #: caches kept as one stacked ``[layers, ...]`` array each (the decode graph's layer scan updates them in
        #: place: :func:`kv_stacks`), under the key ``"stack:" + first name``; the others by name
        self.stacks = {"stack:" + g[0]: g for g in kv_stacks(model, self.dec)
                       if all(n in self.pre_in and self.pre_in[n].shape == self.dec_in[n].shape for n in g)}
        stacked = {n for g in self.stacks.values() for n in g}
        self.singles = [n for n in self.cache_names if n not in stacked]
        self.n = int(self.pre_in["tokens"].shape[-1])
        self.vocab = int({s.name: s for s in self.dec.outputs}["logits"].shape[-1])
        self.capacity = capacity
        self._jit = {}
        self._base = False  # the trace-cache key base, computed on first use (None: no trace cache)

    def _program(self, key: tuple, fn, args: tuple, donate: tuple):
        """``fn`` jitted for ``args``' shapes (``key`` names it among this
        runner's programs), with ``donate`` (argument positions) donated. Its
        traced program is kept in fbjax's trace cache (a ``jax.export``
        artifact keyed by the model file's bytes, the load options, ``key``
        and the arguments' shapes: :func:`fbjax.cache.trace_key`), so a later
        process skips tracing the whole graph (most of a warm first call;
        the compiled code comes from the persistent compilation cache). The
        weights are arguments, not constants, so the artifact is small.
        Where the cache is off or export fails, a plain ``jax.jit``."""
        opts = self.model.compiler_options
        fn_jit = jax.jit(fn, donate_argnums=donate, compiler_options=opts)
        if self._base is False:
            tb = getattr(self.model, "trace_base", None)
            self._base = tb(self.model.program, embeds_buffers=False) if tb is not None else None
        if self._base is None:
            return fn_jit
        digest, options = self._base
        backend = self.model.program.backend
        ck = cache.trace_key(digest, options, args,
                             extra=f"{backend} {sorted((opts or {}).items())} llm_bundle {key!r} {self.n} {self.capacity}")
        try:
            ex = cache.load_exported(ck)
            if ex is None:
                ex = cache.export_program(fn_jit, backend)(*args)
                cache.save_exported(ck, ex)
        except Exception:  # noqa: BLE001 - anything export cannot take: the plain jit
            return fn_jit
        return jax.jit(ex.call, donate_argnums=donate, compiler_options=opts)

    def zeros(self, batch: int) -> dict:
        """Empty caches for ``batch`` rows: ``{key: array [batch, ...]}`` (stacked caches ``[batch, layers, ...]``)."""
        kv = {n: jnp.zeros((batch,) + tuple(self.dec_in[n].shape), self.dec_in[n].dtype) for n in self.singles}
        for key, names in self.stacks.items():
            spec = self.dec_in[names[0]]
            kv[key] = jnp.zeros((batch, len(names)) + tuple(spec.shape), spec.dtype)
        return kv

    def _cache_inputs(self, kv: dict) -> dict:
        """One row's caches by signature input name (a stacked cache as its blocks)."""
        ins = {n: kv[n] for n in self.singles}
        for key, names in self.stacks.items():
            ins.update({n: LayerSlice(kv[key], j) for j, n in enumerate(names)})
        return ins

    def _cache_outputs(self, out: dict) -> dict:
        """The updated caches from a signature's outputs (:meth:`_cache_inputs`' keys)."""
        kv = {n: materialize(out[n]) for n in self.singles}
        for key, names in self.stacks.items():
            first = out[names[0]]
            kv[key] = (first.stacked if isinstance(first, LayerSlice)
                       else jnp.stack([jnp.asarray(materialize(out[n])) for n in names]))
        return kv

    def _prefill_row(self, params, buffers, kv, tokens, start):
        pos = start + jnp.arange(self.n, dtype=jnp.int32)
        ins = dict(self._cache_inputs(kv),
                   tokens=tokens.reshape(self.pre_in["tokens"].shape).astype(self.pre_in["tokens"].dtype),
                   input_pos=pos.reshape(self.pre_in["input_pos"].shape).astype(self.pre_in["input_pos"].dtype))
        if "mask" in self.pre_in:
            ins["mask"] = _causal_mask(self.pre_in["mask"], pos)
        return self._cache_outputs(self.pre.apply_blocks(params, ins, buffers=buffers))

    def _decode_row(self, params, buffers, kv, token, pos):
        ins = dict(self._cache_inputs(kv),
                   tokens=token.reshape(self.dec_in["tokens"].shape).astype(self.dec_in["tokens"].dtype),
                   input_pos=pos.reshape(self.dec_in["input_pos"].shape).astype(self.dec_in["input_pos"].dtype))
        if "mask" in self.dec_in:
            ins["mask"] = _causal_mask(self.dec_in["mask"], pos.reshape(1))
        out = self.dec.apply_blocks(params, ins, buffers=buffers)
        logits = jnp.asarray(out["logits"])
        logits = logits.reshape(-1, logits.shape[-1])[-1]
        return logits, self._cache_outputs(out)

    def prefill(self, params, kv, tokens, start):
        """``tokens`` int32 ``[B, n]`` at positions ``start[b] ..`` -> the new caches.

        ``kv`` is donated: its buffers are updated in place where the
        backend can (the caller keeps only the returned caches)."""
        args = (params, self.model.buffers, kv, np.asarray(tokens, np.int32), np.asarray(start, np.int32))
        with jax.enable_x64(self.model.x64):
            ck = ("prefill", len(args[3]))
            fn = self._jit.get(ck)
            if fn is None:
                fn = self._jit[ck] = self._program(
                    ck, jax.vmap(self._prefill_row, in_axes=(None, None, 0, 0, 0)), args, (2,))
            return fn(*args)

    def decode(self, params, kv, token, pos, key, sampler: Sampler):
        """Feed ``token`` ``[B]`` at ``pos`` ``[B]``; returns (next token ``[B]``, caches).

        ``kv`` is donated (updated in place where the backend can)."""
        token = np.asarray(token, np.int32)  # numpy: no extra dispatch
        args = (params, self.model.buffers, kv, token, np.asarray(pos, np.int32), jax.random.key_data(key))
        ck = ("decode", len(token), sampler.temperature, sampler.top_k, sampler.top_p)
        with jax.enable_x64(self.model.x64):
            fn = self._jit.get(ck)
            if fn is None:
                impl = jax.random.key_impl(key)

                def step(params, buffers, kv, token, pos, key_data):
                    logits, kv = jax.vmap(self._decode_row, in_axes=(None, None, 0, 0, 0))(
                        params, buffers, kv, token, pos)
                    key = jax.random.wrap_key_data(key_data, impl=impl)
                    return _sample(logits, key, sampler.temperature, sampler.top_k, sampler.top_p), kv
                fn = self._jit[ck] = self._program(ck, step, args, (2,))
            return fn(*args)

    def decode_rows(self, params, kv, token, pos, sampling=None):
        """A decode step of the first ``b = len(token)`` rows of the batched
        caches ``kv`` (its other rows kept as they are), each row at its own
        position: so fewer running rows than ``kv`` holds cost a batch-``b`` step.

        Args:
            token, pos: int32 ``[b]``: the token each row feeds and its position.
            sampling: ``None``: argmax; else ``(key_data, temperature, top_k,
                top_p)``, one per row (uint32 ``[b, ...]`` ``jax.random`` key
                data, float32, int32, float32 ``[b]``): each row samples as
                :func:`_sample` with its own settings and key (``top_k == 1`` or
                ``temperature == 0``: the argmax).

        Returns:
            (next token int32 ``[b]``, each row's next key data or ``None``,
            caches); ``kv`` is donated (updated in place where the backend can).
        """
        b = len(token)
        args = (params, self.model.buffers, kv, np.asarray(token, np.int32), np.asarray(pos, np.int32))
        if sampling is not None:
            kd, t, k, p = sampling
            args += (kd, np.asarray(t, np.float32), np.asarray(k, np.int32), np.asarray(p, np.float32))
        rows = next(iter(kv.values())).shape[0]
        ck = ("decode_rows", b, rows, sampling is not None)
        with jax.enable_x64(self.model.x64):
            fn = self._jit.get(ck)
            if fn is None:
                def step(params, buffers, kv, token, pos, *samp):
                    sub = kv if b == rows else {n: v[:b] for n, v in kv.items()}
                    logits, sub = jax.vmap(self._decode_row, in_axes=(None, None, 0, 0, 0))(
                        params, buffers, sub, token, pos)
                    kv = sub if b == rows else {n: kv[n].at[:b].set(sub[n]) for n in kv}
                    if not samp:
                        return jnp.argmax(logits, axis=-1).astype(jnp.int32), None, kv
                    nxt, keys = jax.vmap(_sample_row)(logits, *samp)
                    return nxt, keys, kv
                fn = self._jit[ck] = jax.jit(step, donate_argnums=(2,), compiler_options=self.model.compiler_options)
            return fn(*args)


def kv_stacks(model, dec) -> list:
    """The KV-cache inputs of signature runner ``dec`` that its graph's layer scan
    updates in place, as tuples of signature input names in block order (one per
    cache kind: K, V); empty when the graph has no layer scan
    (:mod:`fbjax.lower.layer_scan`)."""
    plan = model.program.scans.get(dec.graph_index)
    if plan is None:
        return []
    name_of = {id(v): n for n, v in model.ir.signatures[dec.key].inputs.items()}
    out = []
    for gi in sorted(updated_in_place(plan, model.program.registry)):
        names = tuple(name_of.get(id(v)) for v in plan.per_layer[gi])
        if all(n is not None and n.startswith(_CACHE_PREFIX) for n in names):
            out.append(names)
    return out


def _sample_row(logits, key_data, temperature, top_k, top_p):
    """One row of :meth:`_Runner.decode_rows`: ``logits`` ``[V]``, traced settings; returns
    (token id, the key's successor)."""
    key, sub = jax.random.split(jax.random.wrap_key_data(key_data))
    greedy = (top_k <= 1) | (temperature <= 0)
    vals, idx = jax.lax.top_k(logits.astype(jnp.float32) / jnp.where(greedy, 1.0, temperature), logits.shape[-1])
    kept = jnp.arange(vals.shape[-1]) < top_k
    probs = jax.nn.softmax(jnp.where(kept, vals, -jnp.inf))
    kept &= jnp.cumsum(probs) - probs < top_p  # the smallest prefix of the top k reaching top_p
    drawn = idx[jax.random.categorical(sub, jnp.where(kept, vals, -jnp.inf))]
    tok = jnp.where(greedy, jnp.argmax(logits), drawn).astype(jnp.int32)
    return tok, jax.random.key_data(key)


@dataclasses.dataclass
class Generation:
    """What :meth:`LlmBundle.generate` returns with ``return_tokens=True``.

    Attributes:
        text: the generated text.
        tokens: the generated token ids (stop token excluded).
        prompt_tokens: the ids fed before generating (start token included).
        stopped: ``"stop_token"``, ``"max_new_tokens"`` or ``"kv_cache_full"``.
    """

    text: str
    tokens: list
    prompt_tokens: list
    stopped: str


class LlmBundle:
    """An LLM bundle ready to turn text into text (see the module docstring).

    Attributes:
        file: the parsed :class:`fbjax.formats.llm_container.LlmBundleFile` (sections, metadata protos).
        model: the prefill/decode :class:`~fbjax.Model`.
        tokenizer: the :class:`Tokenizer`.
        start_token: the id prepended to every prompt, or ``None``.
        stop_tokens: token id sequences that end generation (usually single ids).
        sampler: the default :class:`Sampler` (from the bundle's ``sampler_params``).
        capacity: positions the KV cache holds.
        max_num_tokens: the bundle's ``max_num_tokens`` (0: unset).
        prompt_templates: ``{"user"|"model"|"system": (prefix, suffix)}``.
        chat_template: the Jinja chat template (``None`` if the bundle has none).
    """

    def __init__(self, file, model, tokenizer: Tokenizer):
        self.file, self.model, self.tokenizer = file, model, tokenizer
        meta = file.llm_metadata
        label = file.label
        try:
            runner_pre, runner_dec = llm_signatures(model)  # and their contract (fbjax.llm_contract)
        except (InputError, ModelFormatError) as e:
            raise ModelFormatError(f"{label}: section {file.model.index} ({file.model.kind}): {e}") from None
        vocab = int({s.name: s for s in runner_dec.outputs}["logits"].shape[-1])
        tw = f"{label}: section {file.tokenizer.index} ({file.tokenizer.kind})"
        if tokenizer.vocab_size > vocab:
            raise ModelFormatError(f"{tw}: the tokenizer has {tokenizer.vocab_size} tokens, the model's logits "
                                   f"{vocab}: they do not belong together")
        if tokenizer.vocab_size < vocab // 2:
            raise ModelFormatError(f"{tw}: the tokenizer has {tokenizer.vocab_size} tokens, fewer than half the "
                                   f"model's {vocab} logits: they do not belong together")
        self.vocab_size = vocab
        self.start_token = self._token_ids(meta.start_token, "start_token")
        self.start_token = self.start_token[0] if self.start_token else None
        self.stop_tokens = [t for t in (self._token_ids(u, "stop_tokens") for u in meta.stop_tokens) if t]
        sp = meta.sampler_params if meta.HasField("sampler_params") else None
        self.sampler = Sampler() if sp is None else Sampler(
            temperature=float(sp.temperature) if sp.temperature > 0 else 1.0,
            top_k=int(sp.k) if sp.k > 0 else (1 if sp.type == sp.GREEDY else vocab),
            top_p=float(sp.p) if 0 < sp.p <= 1 else 1.0, seed=int(sp.seed) if sp.HasField("seed") else 0)
        if sp is not None and sp.type == sp.GREEDY:
            self.sampler.top_k = 1
        self.max_num_tokens = int(meta.max_num_tokens)
        pt = meta.prompt_templates if meta.HasField("prompt_templates") else None
        self.prompt_templates = {} if pt is None else {
            r: (getattr(pt, r).prefix, getattr(pt, r).suffix) for r in ("user", "model", "system") if pt.HasField(r)}
        self.chat_template = meta.jinja_prompt_template if meta.HasField("jinja_prompt_template") else None
        self.capacity = self._capacity(runner_dec)
        self._runner = _Runner(model, self.capacity)

    # --- metadata ------------------------------------------------------------

    def _token_ids(self, union, field: str) -> list:
        where = f"{self.file.label}: LlmMetadata.{field}"
        which = union.WhichOneof("token_union")
        if which is None:
            return []
        if which == "token_ids":
            ids = [int(i) for i in union.token_ids.ids]
        else:
            ids = self.tokenizer.encode(union.token_str)
            t = self.tokenizer.token_id(union.token_str)
            ids = [t] if t is not None else ids
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ModelFormatError(f"{where}: token ids {bad} are outside the model's vocabulary 0..{self.vocab_size - 1}")
        return ids

    def _capacity(self, dec) -> int:
        specs = {s.name: s for s in dec.inputs}
        em = self.file.executor_metadata
        if em is not None:
            for b in em.llm_executor_metadata.state_buffers:
                s = specs.get(b.decode_input_name)
                if s is not None and b.HasField("sequence_axis"):
                    ax = int(b.sequence_axis)
                    if not 0 <= ax < len(s.shape):
                        raise ModelFormatError(f"{self.file.label}: ExecutorMetadata: sequence_axis {ax} of "
                                               f"{b.decode_input_name} is outside its shape {tuple(s.shape)}")
                    return int(s.shape[ax])
        n = _cache_positions(dec)
        if n is None:
            raise ModelFormatError(f"{self.file.label}: cannot tell the KV cache's length (no ExecutorMetadata "
                                   "sequence_axis, no mask input, and a cache layout fbjax does not know)")
        return int(n)

    @property
    def params(self) -> dict:
        """The model's weights (``{tensor name: array}``)."""
        return self.model.params

    def __repr__(self) -> str:
        return (f"LlmBundle({self.file.label!r}, {self.file.container}, tokenizer={self.tokenizer.kind} "
                f"{self.tokenizer.vocab_size}, capacity={self.capacity})")

    # --- text ------------------------------------------------------------------

    def format_prompt(self, prompt: str, template: bool = True) -> str:
        """``prompt`` wrapped in the bundle's prompt template (user prefix + prompt + user suffix + model
        prefix), or as is."""
        return "".join(self._prompt_parts(prompt, template))

    def _prompt_parts(self, prompt: str, template: bool) -> list:
        if not template or not self.prompt_templates:
            return [prompt]
        up, us = self.prompt_templates.get("user", ("", ""))
        mp, _ = self.prompt_templates.get("model", ("", ""))
        return [up + prompt] + ([us + mp] if us + mp else [])

    def prompt_tokens(self, prompt: str, template: bool = True) -> list:
        """The ids LiteRT-LM feeds for ``prompt``: the start token, then the tokens of user prefix + prompt,
        then (with the template) those of user suffix + model prefix, tokenized apart (the runtime adds
        the suffix at the switch to decoding)."""
        ids = [self.start_token] if self.start_token is not None else []
        for part in self._prompt_parts(prompt, template):
            ids += self.tokenizer.encode(part)
        return ids

    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
        """Render ``messages`` (``[{"role": "user"|"assistant"|"system", "content": str}, ...]``) with the
        bundle's Jinja chat template (``jinja2``), or its prompt templates when it has none."""
        if self.chat_template is None:
            text = ""
            for m in messages:
                role = {"assistant": "model"}.get(m["role"], m["role"])
                pre, suf = self.prompt_templates.get(role, ("", ""))
                text += pre + m["content"] + suf
            if add_generation_prompt:
                text += self.prompt_templates.get("model", ("", ""))[0]
            return text
        import jinja2
        import jinja2.sandbox

        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        eos = self.tokenizer.decode(self.stop_tokens[0]) if self.stop_tokens else ""
        try:  # bos_token "": the start token is prepended as an id (as LiteRT-LM does), not as text
            return env.from_string(self.chat_template).render(
                messages=list(messages), add_generation_prompt=add_generation_prompt, bos_token="", eos_token=eos)
        except jinja2.TemplateError as e:
            raise InputError(f"chat template: {type(e).__name__}: {e}") from None

    def encode(self, text: str, *, add_start: bool = True) -> list:
        """Token ids of ``text``, the start token first (``add_start``)."""
        ids = self.tokenizer.encode(text)
        return ([self.start_token] if add_start and self.start_token is not None else []) + ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``."""
        return self.tokenizer.decode(ids)

    # --- generation -------------------------------------------------------------

    def session(self, *, params=None, **sampler) -> "ChatSession":
        """A :class:`ChatSession` whose KV cache persists across turns."""
        return ChatSession(self, params=params, sampler=self.sampler.replace(**sampler))

    def stream(self, prompt: str, *, template: bool = True, max_new_tokens: Optional[int] = None, params=None,
               temperature=None, top_k=None, top_p=None, seed=None) -> Iterator[str]:
        """Generate from one prompt, yielding one text piece per token as it is produced."""
        s = self.session(params=params, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
        yield from s._turn_stream([self.prompt_tokens(prompt, template)], max_new_tokens)

    def generate(self, prompt: Union[str, Sequence[str]], *, template: bool = True,
                 max_new_tokens: Optional[int] = None, params=None, temperature=None, top_k=None, top_p=None,
                 seed=None, return_tokens: bool = False):
        """Generate text for one prompt or a batch of prompts.

        Args:
            prompt: a string, or a list of strings (one batch: every row
                prefilled and decoded together, each stopping on its own).
            template: wrap each prompt in the bundle's prompt template
                (LiteRT-LM's ``--no-template`` is ``template=False``).
            max_new_tokens: at most this many new tokens (default: until a
                stop token or the KV cache is full).
            params: weights to use instead of :attr:`params` (fine-tuned).
            temperature, top_k, top_p, seed: override the bundle's sampler.
            return_tokens: return :class:`Generation` objects (text, ids,
                why it stopped) instead of strings.

        Returns:
            a string (a list of them for a list of prompts), or
            :class:`Generation` objects with ``return_tokens``.

        Raises:
            InputError: a prompt too long for the KV cache, bad sampler settings.
        """
        single = isinstance(prompt, str)
        prompts = [prompt] if single else list(prompt)
        if not prompts:
            raise InputError("generate: no prompts")
        s = self.session(params=params, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
        rows = [self.prompt_tokens(p, template) for p in prompts]
        out = s._turn(rows, max_new_tokens)
        res = [Generation(self.decode(t), t, r, why) for (t, why), r in zip(out, rows)]
        res = res if return_tokens else [g.text for g in res]
        return res[0] if single else res

    def chat(self, *, params=None, **sampler) -> "ChatSession":
        """A multi-turn chat (:class:`ChatSession`) through the chat template, keeping its KV cache."""
        return self.session(params=params, **sampler)

    # --- fine-tuning -----------------------------------------------------------

    def loss(self, params, texts: Union[str, Sequence[str]], *, lora=None, add_stop: bool = False, buffers=None):
        """Mean next-token cross-entropy of ``texts`` (float32 scalar), differentiable in ``params``
        (and ``lora``) and traceable: :func:`fbjax.finetune.loss` (tokenization, start token, padding,
        positions, causal mask and empty KV cache made here; LoRA adapters, quantized weights included).

        Raises:
            InputError: no texts, a text too short or longer than the KV cache.
        """
        return finetune.loss(self, params, texts, lora=lora, add_stop=add_stop, buffers=buffers)

    # --- saving ----------------------------------------------------------------

    def save(self, path=None, params=None) -> bytes:
        """Write the bundle with the model's weights replaced by ``params`` (default :attr:`params`).

        The model section is re-written by :meth:`fbjax.Model.save` (every
        weight in ``params``: full fine-tuning; LoRA adapters merged first by
        :func:`fbjax.finetune.merge_lora`, quantized weights re-quantized on
        the file's grid); every other section keeps
        its bytes, ``.litertlm`` offsets stay 16 KiB aligned (later sections
        move by whole blocks if the model's padded size changes), and a
        ``.task`` keeps its members' names, order and compression.

        Returns:
            the new file's bytes (also written to ``path`` when given).
        """
        model_bytes = self.model.save(None, params)
        data = _fmt.write_bundle(self.file, model_bytes)
        if path is not None:
            write_file(path, data)
        return data


class ChatSession:
    """A conversation with an :class:`LlmBundle` whose KV cache persists between turns.

    ``send(text)`` renders the new user turn with the bundle's chat template
    (the text of the conversation so far rendered again, the new part
    tokenized), prefills it after the tokens already in the cache and
    returns the reply; ``send(text, stream=True)`` yields its pieces.
    :attr:`messages` holds the conversation, :attr:`tokens` every id fed.
    """

    def __init__(self, bundle: LlmBundle, *, params=None, sampler: Optional[Sampler] = None):
        self.bundle = bundle
        self.params = bundle.model.params if params is None else params
        self.sampler = sampler or bundle.sampler
        self.messages: list = []
        self.tokens: list = []  # ids whose KV entries are in the cache, in position order
        self._pending: Optional[list] = None  # per row: the last token, fed at the next prefill
        self._kv = None
        self._rendered = ""
        self._key = jax.random.key(self.sampler.seed)

    def send(self, text: str, *, stream: bool = False, max_new_tokens: Optional[int] = None):
        """One user turn; returns the reply text (an iterator of pieces with ``stream=True``)."""
        messages = self.messages + [{"role": "user", "content": text}]
        rendered = self.bundle.apply_chat_template(messages, add_generation_prompt=True)
        new = rendered[len(self._rendered):] if rendered.startswith(self._rendered) else rendered
        ids = self.bundle.encode(new, add_start=not self.tokens)
        pending = 1 if self._pending and self._pending[0] is not None else 0
        if len(self.tokens) + pending + len(ids) > self.bundle.capacity:
            raise InputError(f"this turn needs {len(self.tokens) + pending + len(ids)} positions with the "
                             f"conversation so far; the KV cache holds {self.bundle.capacity}: start a new chat")
        self.messages, self._rendered = messages, rendered
        pieces = self._turn_stream([ids], max_new_tokens)
        if stream:
            def gen():
                acc = []
                for p in pieces:
                    acc.append(p)
                    yield p
                self._close_turn("".join(acc))
            return gen()
        reply = "".join(pieces)
        self._close_turn(reply)
        return reply

    def _close_turn(self, reply: str) -> None:
        self.messages.append({"role": "assistant", "content": reply})
        self._rendered = self.bundle.apply_chat_template(self.messages, add_generation_prompt=False)

    # the token machinery, shared with LlmBundle.generate / stream

    def _prefill(self, rows: list) -> list:
        """Feed each row's pending token and new ids but the last into the cache; returns the last ids."""
        r = self.bundle._runner
        b = len(rows)
        if self._kv is None:
            self._kv = r.zeros(b)
            self._hist = [[] for _ in range(b)]
            self._pending = [None] * b
        feed = [([p] if p is not None else []) + row[:-1] for p, row in zip(self._pending, rows)]
        for i, (f, row) in enumerate(zip(feed, rows)):
            if not row:
                raise InputError(f"prompt {i} is empty after templating and tokenizing")
            need = len(self._hist[i]) + len(f) + 1
            if need > r.capacity:
                raise InputError(f"prompt {i}: {need} tokens (with the conversation so far) do not fit the KV "
                                 f"cache of {r.capacity} positions")
        starts = [len(h) for h in self._hist]
        for h, f in zip(self._hist, feed):
            h.extend(f)
        longest = max(len(f) for f in feed)
        for c in range(-(-longest // r.n)):
            toks = np.zeros((b, r.n), np.int32)
            pos = np.zeros((b,), np.int32)
            for i, h in enumerate(self._hist):
                p0 = min(starts[i] + c * r.n, r.capacity - r.n)  # a chunk past the cache's end moves back
                if starts[i] + c * r.n >= len(h):  # this row is done: rewrite its last chunk (same entries)
                    p0 = max(0, min(len(h) - r.n, r.capacity - r.n)) if len(h) else 0
                seg = h[p0:p0 + r.n]
                toks[i, :len(seg)] = seg
                pos[i] = p0
            self._kv = r.prefill(self.params, self._kv, toks, pos)
        return [row[-1] for row in rows]

    def _decode_rows(self, rows: list, max_new_tokens: Optional[int]):
        """Generator over decode steps: yields the ``[B]`` new ids; stops rows on stop tokens / capacity."""
        r = self.bundle._runner
        tok = np.asarray(self._prefill(rows), np.int32)
        while True:
            pos = np.asarray([len(h) for h in self._hist], np.int32)
            if self.sampler.greedy:  # no key to draw: one dispatch per step
                sub = self._key
            else:
                self._key, sub = jax.random.split(self._key)
            nxt, self._kv = r.decode(self.params, self._kv, tok, pos, sub, self.sampler)
            for h, t in zip(self._hist, tok):
                h.append(int(t))
            nxt = np.asarray(nxt)
            self.tokens = self._hist[0]
            yield nxt
            tok = nxt

    def _run(self, rows: list, max_new_tokens: Optional[int]):
        """A generator of ``(row, id)`` events as ids arrive (``id`` None: the row hit a stop token);
        returns (StopIteration value) each row's ``(ids, why stopped)``."""
        r = self.bundle._runner
        stops = self.bundle.stop_tokens
        limit = r.capacity if self.bundle.max_num_tokens <= 0 else min(r.capacity, self.bundle.max_num_tokens)
        outs = [[] for _ in rows]
        why = [None] * len(rows)
        steps = self._decode_rows(rows, max_new_tokens)
        while not all(why):
            nxt = next(steps)
            for i, t in enumerate(nxt):
                if why[i]:
                    continue
                t = int(t)
                outs[i].append(t)
                hit = next((s for s in stops if outs[i][-len(s):] == s), None)
                if hit is not None:
                    del outs[i][-len(hit):]
                    why[i] = "stop_token"
                    yield i, None
                    continue
                yield i, t
                if max_new_tokens is not None and len(outs[i]) >= max_new_tokens:
                    why[i] = "max_new_tokens"
                elif len(self._hist[i]) + 1 >= limit:
                    why[i] = "kv_cache_full"
        # the last sampled token of each row is pending: fed at the next turn's prefill
        self._pending = [None if w == "stop_token" else (o[-1] if o else None) for o, w in zip(outs, why)]
        for i, w in enumerate(why):
            if w == "stop_token":  # the stop token itself enters the cache with the next turn
                self._pending[i] = int(stops[0][-1]) if stops else None
        return list(zip(outs, why))

    def _turn(self, rows: list, max_new_tokens: Optional[int]) -> list:
        gen = self._run(rows, max_new_tokens)
        while True:
            try:
                next(gen)
            except StopIteration as stop:
                return stop.value

    def _turn_stream(self, rows: list, max_new_tokens: Optional[int]) -> Iterator[str]:
        ids = []
        tok = self.bundle.tokenizer
        for _, t in self._run(rows, max_new_tokens):
            if t is None:
                continue
            ids.append(t)
            window = ids[-8:]
            # the text this token adds (a lone first token: the tokenizer's own decoding, leading meta-space dropped)
            piece = tok.decode(window)[len(tok.decode(window[:-1])):] if len(window) > 1 else tok.decode([t])
            if piece:  # tokens without text (a control token) yield nothing, as LiteRT-LM's stream
                yield piece


def open_bundle(source, loader, **load_kwargs) -> LlmBundle:
    """Read a bundle (path or bytes) and load its model with ``loader`` (:func:`fbjax.load`'s model path).

    Raises:
        ModelFormatError: see :func:`fbjax.formats.llm_container.read_bundle`, plus a tokenizer whose
            vocabulary does not fit the model's logits, start/stop tokens outside the vocabulary, a
            signature that does not trace (:func:`fbjax.signature.trace_signatures`) or prefill/decode
            signatures that break the generation loop's contract (:mod:`fbjax.llm_contract`).
    """
    f = _fmt.read_bundle(source)
    try:
        model = loader(f.model.view, **load_kwargs)  # (a view on the file's bytes: the weights held once)
        model._release_load_trace()  # generation runs the signatures with the weights as arguments
        model.program.release_file_constants()  # int4 weights: model.buffers holds them packed on the device
    except ModelFormatError as e:
        raise ModelFormatError(f"{f.label}: section {f.model.index} ({f.model.kind}): {e}") from None
    tok = Tokenizer(f.tokenizer_kind, f.tokenizer_data, f"{f.label}: section {f.tokenizer.index} ({f.tokenizer.kind})")
    return LlmBundle(f, model, tok)
