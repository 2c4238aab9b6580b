"""Token generation with decoder-only LLM files: :func:`generate`.

litert-torch's generative converter writes a decoder-only LLM as one
``.tflite`` with signatures ``prefill_N`` (``tokens`` int32 ``[1, N]``,
``input_pos`` int32 ``[N]``, the KV cache ``kv_cache_k_i`` / ``kv_cache_v_i``
per layer, optionally an attention ``mask``) and ``decode`` (one token; it
also returns ``logits``), each returning the updated cache under the input
names. :func:`generate` runs prefill and then ``max_new_tokens`` decode steps
in one jitted program (a ``lax.scan``), the cache threaded through as arrays
whatever its layout, for a batch of prompts at once (each row its own
positions and mask: the batch-1 signatures run under ``vmap``).

Padding: row ``b`` prefills its first ``len_b - 1`` tokens (padded to ``N``)
and decodes from its last prompt token at position ``len_b - 1``. Cache
entries that padding wrote at positions ``>= len_b - 1`` are never read:
attention at position ``p`` sees positions ``<= p`` only (the model's causal
mask, or the mask :func:`generate` passes), and decode step ``p`` rewrites
entry ``p`` before any later step reads it. So each row's tokens equal those
of the same prompt run alone.

Longer prompts: more than ``N + 1`` tokens are prefilled in chunks of ``N``
positions, the prefill signature called once per chunk with that chunk's
``input_pos`` (and mask) on the cache the chunks before it filled; where the
last chunk would run past the cache it starts ``N`` positions before the
cache's end instead, recomputing some positions from the same tokens (the
same entries again).
"""

from __future__ import annotations

from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from .errors import InputError
from .llm_contract import check_llm_contract

__all__ = ["generate", "llm_signatures"]

_CACHE_PREFIX = "kv_cache_"


def llm_signatures(model, prefill: Optional[str] = None, decode: str = "decode"):
    """The (prefill, decode) :class:`~fbjax.signature.SignatureRunner` pair of an LLM file.

    Args:
        model: a :class:`~fbjax.Model` with litert-torch's generative signatures.
        prefill: the prefill signature's key; default: the one ``prefill*``
            signature with the longest ``tokens`` input.
        decode: the decode signature's key.

    Raises:
        InputError: the model lacks such signatures, or they lack ``tokens``,
            ``input_pos``, the ``kv_cache_*`` inputs or the decode ``logits``.
        ModelFormatError: they have them but break the contract the
            generation loop relies on (:func:`fbjax.llm_contract.check_llm_contract`:
            dtypes, sizes, a KV cache input without its output, ...).
    """
    keys = list(model.signatures)
    if prefill is None:
        cands = [k for k in keys if k.startswith("prefill")]
        if not keys:
            raise InputError("generate: the model has no signatures; generation needs an LLM file from "
                             "litert-torch's generative converter (prefill_N and decode signatures taking tokens, "
                             f"input_pos and {_CACHE_PREFIX}*; `fbjax inspect MODEL` lists a file's signatures)")
        if not cands:
            raise InputError(f"generate: no signature named prefill* among {keys}; name the prefill signature "
                             "with prefill=KEY (CLI: --prefill KEY)")
        prefill = max(cands, key=lambda k: dict((s.name, s) for s in model.signature(k).inputs)["tokens"].shape[-1]
                      if "tokens" in {s.name for s in model.signature(k).inputs} else 0)
    pre, dec = model.signature(prefill), model.signature(decode)
    for r, needs in ((pre, ("tokens", "input_pos")), (dec, ("tokens", "input_pos"))):
        names = [s.name for s in r.inputs]
        lacking = [n for n in needs if n not in names]
        if lacking or not any(n.startswith(_CACHE_PREFIX) for n in names):
            raise InputError(f"generate: signature {r.key!r} has inputs {names}; an LLM signature takes "
                             f"tokens, input_pos and {_CACHE_PREFIX}* (litert-torch's generative export)")
    if "logits" not in [s.name for s in dec.outputs]:
        raise InputError(f"generate: signature {dec.key!r} has no 'logits' output ({[s.name for s in dec.outputs]})")
    check_llm_contract(model, pre, dec)  # names, shapes and dtypes the generation loop relies on
    return pre, dec


def _causal_mask(spec, pos):
    """``spec``-shaped float mask ``[1, 1, T, S]``: 0 where key position
    ``s <= pos[t]``, else the dtype's lowest value (what litert-torch's
    examples pass: ``-inf`` above the diagonal, written finite so that
    ``0 * mask`` stays 0)."""
    s = jnp.arange(spec.shape[-1])
    lowest = jnp.finfo(spec.dtype).min
    m = jnp.where(s[None, :] <= pos[:, None], 0.0, lowest).astype(spec.dtype)
    return m.reshape(spec.shape)


def _sample(logits, key, temperature: float, top_k: Optional[int]):
    if temperature == 0.0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logits = logits.astype(jnp.float32) / temperature
    if top_k is not None:
        vals, idx = jax.lax.top_k(logits, top_k)
        return idx[jax.random.categorical(key, vals)].astype(jnp.int32)
    return jax.random.categorical(key, logits).astype(jnp.int32)


def _cache_positions(dec) -> Optional[int]:
    """How many positions the decode signature's KV cache holds, from its
    ``mask`` input when it has one, else from the ``kv_cache_k_0`` /
    ``kv_cache_v_0`` shapes in litert-torch's two layouts: default K = V =
    ``[B, S, heads, dim]``; transposed K ``[B, heads, S, dim]``, V
    ``[B, heads, dim, S]``. ``None`` when neither layout fits."""
    specs = {s.name: s for s in dec.inputs}
    if "mask" in specs:
        return int(specs["mask"].shape[-1])
    k, v = specs.get(_CACHE_PREFIX + "k_0"), specs.get(_CACHE_PREFIX + "v_0")
    if k is None or v is None or len(k.shape) != 4 or len(v.shape) != 4:
        return None
    ks, vs = tuple(k.shape), tuple(v.shape)
    default = ks == vs
    transposed = ks[:2] == vs[:2] and ks[2] == vs[3] and ks[3] == vs[2]
    if default and transposed:  # dim == S or heads == dim: S is the larger axis in either layout
        return int(max(ks[1], ks[2]))
    if default:
        return int(ks[1])
    if transposed:
        return int(ks[2])
    return None


def _program(pre, dec, max_new_tokens: int, temperature: float, top_k: Optional[int], starts: tuple = (0,)):
    """The jittable ``(params, buffers, tokens [B, T], lengths [B], keys [B]) -> [B, max_new_tokens]``:
    one prefill call per entry of ``starts`` (each chunk's first position), then the decode loop
    (``buffers``: :attr:`fbjax.Model.buffers`, arguments rather than constants of the program)."""
    pre_in = {s.name: s for s in pre.inputs}
    dec_in = {s.name: s for s in dec.inputs}
    cache_names = [n for n in dec_in if n.startswith(_CACHE_PREFIX)]
    n_prefill = pre_in["tokens"].shape[-1]

    def prefill(params, buffers, tokens, kv, start):
        pos = start + jnp.arange(n_prefill, dtype=jnp.int32)
        chunk = jax.lax.dynamic_slice_in_dim(tokens, start, n_prefill)
        ins = dict(kv, tokens=chunk[None].astype(pre_in["tokens"].dtype),
                   input_pos=pos.astype(pre_in["input_pos"].dtype))
        if "mask" in pre_in:
            ins["mask"] = _causal_mask(pre_in["mask"], pos)
        out = pre.apply(params, buffers=buffers, **ins)
        return {n: out[n] for n in cache_names}

    def row(params, buffers, tokens, length, key):
        kv = {n: jnp.zeros(dec_in[n].shape, dec_in[n].dtype) for n in cache_names}
        if len(starts) == 1:
            kv = prefill(params, buffers, tokens, kv, jnp.int32(starts[0]))
        else:  # one compiled prefill body, called per chunk
            kv, _ = jax.lax.scan(lambda kv, start: (prefill(params, buffers, tokens, kv, start), None), kv,
                                 jnp.asarray(starts, jnp.int32))
        last = tokens[length - 1]

        def step(carry, k):
            tok, p, kv = carry
            ins = dict(kv, tokens=tok.reshape(dec_in["tokens"].shape).astype(dec_in["tokens"].dtype),
                       input_pos=p.reshape(dec_in["input_pos"].shape).astype(dec_in["input_pos"].dtype))
            if "mask" in dec_in:
                ins["mask"] = _causal_mask(dec_in["mask"], p.reshape(1))
            out = dec.apply(params, buffers=buffers, **ins)
            logits = out["logits"].reshape(-1, out["logits"].shape[-1])[-1]
            nxt = _sample(logits, k, temperature, top_k)
            return (nxt, p + 1, {n: out[n] for n in cache_names}), nxt

        keys = jax.random.split(key, max_new_tokens)
        _, toks = jax.lax.scan(step, (last.astype(jnp.int32), (length - 1).astype(jnp.int32), kv), keys)
        return toks

    def run(params, buffers, tokens, lengths, keys):
        return jax.vmap(row, in_axes=(None, None, 0, 0, 0))(params, buffers, tokens, lengths, keys)

    return run


def generate(model, prompt_tokens, max_new_tokens: int, *, key=None, temperature: float = 0.0,
             top_k: Optional[int] = None, prefill: Optional[str] = None, decode: str = "decode",
             params: Optional[dict] = None, pad_id: int = 0, devices: Optional[Sequence] = None) -> np.ndarray:
    """Generate tokens: prefill, then ``max_new_tokens`` decode steps, in one jitted loop.

    Args:
        model: a :class:`~fbjax.Model` of a litert-torch generative export
            (``prefill_N`` and ``decode`` signatures; KV cache in either
            layout; with or without a ``mask`` input).
        prompt_tokens: one prompt (a sequence of ints) or a batch of them
            (a list of sequences of different lengths, or an int array
            ``[B, T]`` of equal-length prompts), each of at least one token.
            Up to ``N + 1`` tokens (``N``: the prefill signature's length)
            take one prefill call; longer ones are prefilled in chunks of
            ``N`` (see the module docstring), which needs a KV cache layout
            fbjax can read the length of (litert-torch's two).
        max_new_tokens: decode steps (>= 1); prompt length + this must fit
            the KV cache.
        key: a JAX PRNG key for sampling (each row gets its own split);
            default ``jax.random.key(0)``. Ignored when greedy.
        temperature: 0 (default): greedy (argmax); > 0: sample from
            ``softmax(logits / temperature)``.
        top_k: with ``temperature > 0``, sample among the ``top_k`` largest
            logits only.
        prefill, decode: signature keys (default: the longest ``prefill*``
            and ``"decode"``).
        params: weights to use instead of ``model.params`` (e.g. fine-tuned).
        pad_id: token that pads shorter prompts (never read).
        devices: the devices the batch of prompts is split over (default:
            every local device, as :func:`fbjax.infer`): a 1-D
            ``jax.sharding.Mesh``, rows sharded with
            ``NamedSharding(mesh, P("batch"))`` (the batch padded to a
            multiple of the device count with copies of the last prompt,
            dropped from the result), weights replicated.

    Returns:
        int32 array ``[B, max_new_tokens]`` of new tokens (``[max_new_tokens]``
        for a single prompt given as a flat sequence).

    Raises:
        InputError: no LLM signatures, an empty or too long prompt, a token
            id outside the vocabulary (the decode ``logits``' last
            dimension), a bad ``temperature``/``top_k``/``max_new_tokens``.

    The program is compiled once per (batch size, ``max_new_tokens``,
    sampling settings) and kept on the model.
    """
    pre, dec = llm_signatures(model, prefill, decode)
    single = len(prompt_tokens) > 0 and np.ndim(prompt_tokens[0]) == 0
    rows = [list(np.asarray(prompt_tokens).reshape(-1))] if single else [list(np.asarray(p).reshape(-1))
                                                                         for p in prompt_tokens]
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
        raise InputError(f"generate: max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    if temperature < 0:
        raise InputError(f"generate: temperature must be >= 0, got {temperature}")
    if top_k is not None and (int(top_k) < 1 or temperature == 0):
        raise InputError("generate: top_k needs temperature > 0 and top_k >= 1")
    n = {s.name: s for s in pre.inputs}["tokens"].shape[-1]
    if not rows:
        raise InputError("generate: no prompts")
    positions = _cache_positions(dec)
    for i, r in enumerate(rows):
        if not r:
            raise InputError(f"generate: prompt {i} is empty (a prompt needs at least one token)")
        if len(r) > n + 1 and (positions is None or positions < n):
            raise InputError(f"generate: prompt {i} has {len(r)} tokens; signature {pre.key!r} takes 1 to {n + 1} "
                             "(its prefill length + the first decode step), and longer prompts are prefilled in "
                             "chunks only where fbjax can read the KV cache's length from the decode signature "
                             "(litert-torch's cache layouts)")
    vocab = {s.name: s for s in dec.outputs}["logits"].shape[-1]
    for i, r in enumerate(rows):
        bad = [int(t) for t in r if not 0 <= int(t) < vocab]
        if bad:
            raise InputError(f"generate: prompt {i} has token ids {bad[:5]} outside 0..{vocab - 1} (the decode "
                             f"signature's logits have {vocab} entries: the vocabulary)")
    if positions is not None and max(map(len, rows)) - 1 + max_new_tokens > positions:
        raise InputError(f"generate: {max(map(len, rows))} prompt tokens + {max_new_tokens} new ones exceed the "
                         f"KV cache ({positions} positions): ask for at most "
                         f"{positions - max(map(len, rows)) + 1} new tokens")
    devs = list(jax.local_devices() if devices is None else devices)
    n_rows = len(rows)
    rows = rows + [rows[-1]] * (-n_rows % len(devs))  # whole shards: padded rows are dropped below
    chunks = max(1, -(-(max(map(len, rows)) - 1) // n))  # prefill calls: the longest prompt's
    starts = tuple(c * n if c == 0 or positions is None else min(c * n, positions - n) for c in range(chunks))
    tokens = np.full((len(rows), chunks * n + 1), pad_id, np.int32)  # every chunk, then the last prompt token
    for i, r in enumerate(rows):
        tokens[i, :len(r)] = r
    lengths = np.asarray([len(r) for r in rows], np.int32)
    keys = jax.random.split(jax.random.key(0) if key is None else key, n_rows)  # each row's key: as on one device
    keys = jnp.concatenate([keys, jnp.repeat(keys[-1:], len(rows) - n_rows, axis=0)])
    if len(devs) > 1:
        mesh = Mesh(np.array(devs), ("batch",))
        rows_sharding = NamedSharding(mesh, P("batch"))
        tokens, lengths, keys = (jax.device_put(a, rows_sharding) for a in (tokens, lengths, keys))
        params = jax.device_put(model.params if params is None else params, NamedSharding(mesh, P()))
        buffers = jax.device_put(model.buffers, NamedSharding(mesh, P()))
    else:
        buffers = model.buffers
    cache = model.batch_cache.generate_programs
    ck = (pre.key, dec.key, int(max_new_tokens), float(temperature), top_k, starts)
    fn = cache.get(ck)
    if fn is None:
        fn = cache[ck] = jax.jit(_program(pre, dec, int(max_new_tokens), float(temperature), top_k, starts),
                                 compiler_options=model.compiler_options)
    with jax.enable_x64(model.x64):
        out = np.asarray(fn(model.params if params is None else params, buffers, tokens, lengths, keys))[:n_rows]
    return out[0] if single else out
