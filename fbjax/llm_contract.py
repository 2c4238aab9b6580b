"""The contract between an LLM file's signatures and the loop that drives them: :func:`check_llm_contract`.

LiteRT-LM (and :mod:`fbjax.generation`, :class:`fbjax.llm_bundle.LlmBundle`)
run a litert-torch generative export through two signatures, ``prefill_N``
and ``decode``, and thread the KV cache from one call to the next by name.
That loop needs, of the signatures the file declares and of what tracing
them computes (:func:`fbjax.signature.trace_signatures`):

* ``tokens`` and ``input_pos`` inputs of an integer dtype and fixed shape:
  ``N`` elements each in prefill (``tokens``' last dimension), one in decode;
* an optional ``mask`` input of a float dtype holding ``T x S`` elements
  (``T``: the signature's token count, ``S``: its last dimension);
* the KV cache as ``kv_cache_k_X`` / ``kv_cache_v_X`` inputs in pairs, the
  same names, shapes and dtypes in both signatures, each returned as an
  output of the same name, shape and dtype (what the next call is fed);
* a float ``logits`` output of decode whose last dimension (the vocabulary)
  is at least 1.

A file that breaks it would fail inside the loop (a missing name, a reshape
that does not fit, a cache that changes shape between calls); checking it at
load names what is wrong instead.
"""

from __future__ import annotations

import re

import numpy as np

from .errors import ModelFormatError

__all__ = ["check_llm_contract"]

#: the KV cache's input/output names (litert-torch's generative export; :mod:`fbjax.generation` reads the prefix)
_CACHE = re.compile(r"kv_cache_([kv])_(.+)\Z")
_CACHE_PREFIX = "kv_cache_"


def _shape(spec) -> str:
    return "unknown" if spec.shape is None else "[" + ", ".join("?" if d is None else str(d) for d in spec.shape) + "]"


def _desc(spec) -> str:
    return f"{np.dtype(spec.dtype).name}{_shape(spec)}"


def _fixed(spec) -> bool:
    return spec.shape is not None and all(d is not None for d in spec.shape)


def _size(spec) -> int:
    return int(np.prod(spec.shape, dtype=np.int64))


def check_llm_contract(model, pre, dec) -> None:
    """Check that signatures ``pre`` (prefill) and ``dec`` (decode) of ``model`` keep the contract above.

    Args:
        model: the :class:`~fbjax.Model` (its ``_traced_signatures``, from
            :func:`fbjax.signature.trace_signatures`, give the outputs'
            computed shapes; the declared ones where a signature was not
            traced).
        pre, dec: :class:`~fbjax.signature.SignatureRunner` of the prefill
            and decode signatures.

    Raises:
        ModelFormatError: the first violation, naming the signature, the
            input or output, and what the loop needs.
    """
    traced = model.__dict__.get("_traced_signatures") or {}

    def fail(r, what):
        raise ModelFormatError(f"signature {r.key!r}: {what} (an LLM's prefill/decode contract: see "
                               "fbjax.llm_contract)")

    def outputs(r) -> dict:
        declared = {s.name: s for s in r.outputs}
        got = traced.get(r.key)
        if got is None:
            return declared
        out = {}
        for s, t in zip(r.outputs, got):
            shape = tuple(int(d) for d in t.shape)
            if _fixed(s) and tuple(s.shape) != shape:
                fail(r, f"output {s.name!r} is declared {_desc(s)} but computes {np.dtype(t.dtype).name}"
                        f"{list(shape)}")
            out[s.name] = s._replace(shape=shape, dtype=np.dtype(t.dtype))
        return out

    caches = {}
    for r, count in ((pre, None), (dec, 1)):
        ins = {s.name: s for s in r.inputs}
        outs = outputs(r)
        for name in ("tokens", "input_pos"):
            s = ins.get(name)
            if s is None:
                fail(r, f"no {name!r} input (its inputs: {list(ins)})")
            if not np.issubdtype(np.dtype(s.dtype), np.integer):
                fail(r, f"input {name!r} is {_desc(s)}; it takes integer token ids / positions")
            if not _fixed(s) or not s.shape or _size(s) < 1:
                fail(r, f"input {name!r} is {_desc(s)}; it needs a fixed shape with at least one element")
        n = ins["tokens"].shape[-1]
        want = n if count is None else count
        for name in ("tokens", "input_pos"):
            if _size(ins[name]) != want:
                fail(r, f"input {name!r} is {_desc(ins[name])}: {_size(ins[name])} elements, but the signature "
                        f"feeds {want} token(s) per call" + (f" (tokens' last dimension {n})" if count is None else ""))
        m = ins.get("mask")
        if m is not None:
            if not np.issubdtype(np.dtype(m.dtype), np.floating):
                fail(r, f"input 'mask' is {_desc(m)}; an attention mask is float")
            if not _fixed(m) or not m.shape or m.shape[-1] < 1 or _size(m) != want * m.shape[-1]:
                fail(r, f"input 'mask' is {_desc(m)}; it needs {want} row(s) of key positions ({want} x its last "
                        "dimension elements)")
        names = [k for k in ins if k.startswith(_CACHE_PREFIX)]
        if not names:
            fail(r, f"no {_CACHE_PREFIX}* inputs (its inputs: {list(ins)})")
        for k in names:
            mt = _CACHE.match(k)
            if mt is None:
                fail(r, f"KV cache input {k!r} is not named kv_cache_k_X or kv_cache_v_X")
            other = f"{_CACHE_PREFIX}{'v' if mt.group(1) == 'k' else 'k'}_{mt.group(2)}"
            if other not in ins:
                fail(r, f"KV cache input {k!r} has no {other!r} beside it (K and V come in pairs)")
            s = ins[k]
            if not _fixed(s):
                fail(r, f"KV cache input {k!r} is {_desc(s)}; it needs a fixed shape")
            o = outs.get(k)
            if o is None:
                fail(r, f"KV cache input {k!r} has no output of that name (its outputs: {list(outs)}); the next "
                        "call is fed the cache this one returns")
            if o.shape is None or tuple(o.shape) != tuple(s.shape) or np.dtype(o.dtype) != np.dtype(s.dtype):
                fail(r, f"KV cache output {k!r} is {_desc(o)}, its input {_desc(s)}; the next call is fed it")
        caches[r.key] = {k: ins[k] for k in names}
    a, b = caches[pre.key], caches[dec.key]
    if set(a) != set(b):
        fail(dec, f"its KV cache {sorted(b)} is not prefill signature {pre.key!r}'s {sorted(a)}")
    for k in a:
        if tuple(a[k].shape) != tuple(b[k].shape) or np.dtype(a[k].dtype) != np.dtype(b[k].dtype):
            fail(dec, f"KV cache input {k!r} is {_desc(b[k])}, in prefill signature {pre.key!r} {_desc(a[k])}; "
                      "one cache goes through both")
    lg = outputs(dec).get("logits")
    if lg is None:
        fail(dec, f"no 'logits' output (its outputs: {list(outputs(dec))})")
    if not np.issubdtype(np.dtype(lg.dtype), np.floating) or lg.shape is None or not lg.shape or lg.shape[-1] < 1:
        fail(dec, f"output 'logits' is {_desc(lg)}; it needs float scores over the vocabulary in its last dimension")
