"""Continuous batching over an :class:`~fbjax.llm_bundle.LlmBundle`: :class:`Engine`.

The engine holds a fixed number of *slots*, one row each of a batched KV
cache (the bundle's batch-1 signatures run under ``vmap``, each row at its
own position), and one worker thread that owns every JAX call. A request
(:meth:`Engine.submit`) waits until a slot is free. A short prompt (at most
:attr:`Engine.prompt_steps` ids) then goes straight into the slot and is fed
one id per decode step, beside the other rows' decoding (its outputs count
from the step that feeds its last id); a longer one is prefilled alone
(batch 1, in chunks of the prefill signature's length, as
:meth:`LlmBundle.generate` prefills it) into a fresh cache row, which is
written into the slot's row of the batched cache, and from the next decode
step on the request decodes together with the others. The worker alternates
one prefill chunk of a newcomer with one decode step of every running slot,
so a newcomer stalls the others by at most one prefill chunk per step. A
request that finishes (stop token, stop string, ``max_new_tokens``, a full
cache) or is cancelled (a client gone) frees its slot before the next step.
The running rows are kept first in the batched cache (a request that leaves
a hole gets the last running row moved into it), and a step decodes only
the first ``b`` rows, ``b`` the smallest of :attr:`Engine.buckets` (powers
of two up to a quarter of the slots, and the slots) that holds them: a lone
request costs a batch-1 step, not a batch-``slots`` one.

A prefilled request feeds tokens as :meth:`LlmBundle.generate` does (start
token, every prompt token but the last prefilled, decoding from the last);
a short prompt's ids all go through the decode signature. Which of the two
a request takes depends only on its prompt's length, so its greedy tokens
are the same alone as beside others, and its text pieces are
:meth:`LlmBundle.stream`'s. Sampling is per row (:meth:`_Runner.decode_rows`):
requests with different temperatures share a step; a step whose running
rows are all greedy takes the argmax alone.
Sampled text is reproducible from ``seed`` within the engine, but it is not
:meth:`LlmBundle.generate`'s random stream (each row draws from its own key).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import queue
import secrets
import threading
import time
from typing import Callable, Optional, Sequence

import jax
import numpy as np

from ..errors import InputError
from ..llm_bundle import LlmBundle, Sampler

__all__ = ["Engine", "Request", "Event"]


@functools.partial(jax.jit, donate_argnums=(0,))
def _set_row(kv, row, i):
    """Row ``i`` of the batched caches ``kv`` <- the batch-1 caches ``row`` (``kv`` donated)."""
    return {n: kv[n].at[i].set(row[n][0]) for n in kv}


@functools.partial(jax.jit, donate_argnums=(0,))
def _move_row(kv, src, dst):
    """Row ``dst`` of the batched caches ``kv`` <- row ``src`` (``kv`` donated)."""
    return {n: kv[n].at[dst].set(kv[n][src]) for n in kv}


@dataclasses.dataclass
class Event:
    """What a :class:`Request` reports: ``kind`` ``"text"`` (``text``: new text), ``"done"``
    (``finish_reason``: ``"stop"`` or ``"length"``) or ``"error"`` (``text``: the message)."""

    kind: str
    text: str = ""
    finish_reason: Optional[str] = None


class Request:
    """One generation in an :class:`Engine` (made by :meth:`Engine.submit`).

    Iterating it (from any thread but the engine's) yields its text as it
    arrives and ends when it is done; :meth:`result` waits for all of it.

    Attributes:
        prompt_ids: the ids fed (start token first).
        tokens: the ids generated so far (stop token excluded).
        text: the text so far (a matched stop string and what follows cut off).
        finish_reason: ``None`` while running, then ``"stop"`` (stop token or
            stop string) or ``"length"`` (``max_new_tokens`` or a full KV cache).
    """

    def __init__(self, prompt_ids: list, max_new_tokens: int, temperature: float, top_k: int, top_p: float,
                 seed: int, stop: Sequence[str], sink: Optional[Callable[[Event], None]]):
        self.prompt_ids = list(prompt_ids)
        self.max_new_tokens = max_new_tokens
        self.temperature, self.top_k, self.top_p, self.seed = temperature, top_k, top_p, seed
        self.stop = [s for s in stop if s]
        self.tokens: list = []
        self.text = ""
        self.finish_reason: Optional[str] = None
        self.error: Optional[str] = None
        self._sent = 0  # characters of text already reported
        self._queue: "queue.Queue[Event]" = queue.Queue()
        self._sink = sink or self._queue.put
        self._cancelled = threading.Event()
        self._done = threading.Event()

    @property
    def greedy(self) -> bool:
        """Whether this request takes the argmax at every step."""
        return self.top_k <= 1 or self.temperature <= 0

    def cancel(self) -> None:
        """Stop generating (a client gone): the engine frees the slot before its next step."""
        self._cancelled.set()

    @property
    def done(self) -> bool:
        """Whether the request has finished (or failed, or was cancelled and dropped)."""
        return self._done.is_set()

    def __iter__(self):
        while True:
            ev = self._queue.get()
            if ev.kind == "text":
                yield ev.text
            elif ev.kind == "error":
                raise InputError(ev.text)
            else:
                return

    def result(self, timeout: Optional[float] = None) -> str:
        """The whole text (waits until the request is done).

        Raises:
            InputError: the engine failed on this request.
            TimeoutError: not done after ``timeout`` seconds.
        """
        if not self._done.wait(timeout):
            raise TimeoutError(f"the request is not done after {timeout} s")
        if self.error is not None:
            raise InputError(self.error)
        return self.text

    # the engine's side

    def _emit_text(self, final: bool) -> None:
        end = len(self.text)
        if not final and self.stop:  # hold back a tail that may begin a stop string
            hold = max((k for s in self.stop for k in range(1, len(s)) if self.text.endswith(s[:k])), default=0)
            end -= hold
        if end > self._sent:
            self._send(Event("text", self.text[self._sent:end]))
            self._sent = end

    def _finish(self, reason: str) -> None:
        self.finish_reason = reason
        self._emit_text(final=True)
        self._done.set()
        self._send(Event("done", finish_reason=reason))

    def _fail(self, message: str) -> None:
        self.error = message
        self._done.set()
        self._send(Event("error", message))

    def _send(self, ev: Event) -> None:
        try:
            self._sink(ev)
        except Exception:  # noqa: BLE001 - the listener is gone (a closed event loop): stop generating
            self._cancelled.set()


class _Slot:
    """A request's decoding state in one row of the batched cache."""

    def __init__(self, req: Request, hist: list, token: int, pending: Sequence[int] = ()):
        self.req, self.hist, self.token = req, hist, token  # ids in the cache; the id fed next
        #: prompt ids still to feed after ``token`` (a prompt fed through the decode steps): the steps'
        #: outputs for this row are not tokens of the reply until it is empty
        self.pending = collections.deque(pending)


class Engine:
    """Continuous batching for one bundle (see the module docstring).

    Args:
        bundle: the :class:`~fbjax.llm_bundle.LlmBundle`.
        slots: requests decoded together (rows of the batched KV cache).
        params: weights to use instead of the bundle's (fine-tuned).
        prompt_steps: prompts of at most this many ids (start token
            included) are fed one id per decode step, in the request's own
            row beside the others' decoding, instead of being prefilled
            (default: a quarter of the prefill signature's length; 0: every
            prompt is prefilled). A short prompt padded to the prefill
            signature's length costs a whole prefill call (SmolLM2-135M int8:
            128 positions, 0.14-0.25 s) where its few decode steps cost
            little more than the others' steps cost anyway. Which path a
            request takes depends on its prompt's length only, so its greedy
            text is the same alone as in a crowd (the decode steps compute the
            same layers as the prefill signature, in another order of sums).

    The worker thread starts with the engine and compiles the prefill,
    decode and row-insert programs before it takes requests (:meth:`start`
    returns when they are ready); :meth:`close` stops it.
    """

    def __init__(self, bundle: LlmBundle, slots: int = 8, params=None, prompt_steps: Optional[int] = None):
        if slots < 1:
            raise InputError(f"slots must be >= 1, got {slots}")
        self.bundle = bundle
        self.slots = int(slots)
        self.params = bundle.model.params if params is None else params
        self._r = bundle._runner
        if prompt_steps is not None and prompt_steps < 0:
            raise InputError(f"prompt_steps must be >= 0, got {prompt_steps}")
        #: prompts of at most this many ids are fed through the decode steps (see the class docstring)
        self.prompt_steps = self._r.n // 4 if prompt_steps is None else int(prompt_steps)
        mx = bundle.max_num_tokens
        #: positions a request may use (prompt and new tokens), as LlmBundle.generate stops
        self.limit = self._r.capacity if mx <= 0 else min(self._r.capacity, mx)
        self._inbox: "queue.Queue[Request]" = queue.Queue()
        self._waiting: collections.deque = collections.deque()
        self._rows: list = [None] * self.slots  # _Slot or None; the running ones first
        #: batch sizes a decode step runs at: powers of two up to a quarter of the slots, and all the slots.
        #: A step of the first b rows copies their caches out of the batched ones and back (the caches are
        #: stacked per layer: [slots, layers, ...]); from half the slots on, that copy cost more than
        #: computing every row (SmolLM2-135M int8, 8 slots: 4 rows 37 ms a step, all 8 rows 22 ms, 2 rows
        #: 16 ms, 1 row 12.5 ms; the free rows compute into their own unused rows)
        self.buckets = sorted({2 ** i for i in range(self.slots.bit_length()) if 2 ** i <= self.slots // 4}
                              | {self.slots})
        self._prefill = None  # [request, batch-1 caches, ids to prefill, next chunk, chunks]
        self._closed = threading.Event()
        self._ready = threading.Event()
        self._startup_error: Optional[BaseException] = None
        self._lock = threading.Lock()
        self.steps = 0  #: decode steps run
        #: counters: decode steps, tokens they produced, seconds in them; prefill chunks and their seconds
        #: and prompt ids fed through decode steps
        self.stats = {"steps": 0, "tokens": 0, "decode_s": 0.0, "prefill_chunks": 0, "prefill_s": 0.0,
                      "prompt_steps": 0}
        self._thread = threading.Thread(target=self._loop, name="fbjax-engine", daemon=True)

    # --- the caller's side ---------------------------------------------------

    def start(self) -> "Engine":
        """Start the worker and wait until its programs are compiled; returns ``self``."""
        if not self._thread.is_alive() and not self._ready.is_set():
            self._thread.start()
        self._ready.wait()
        if self._startup_error is not None:
            raise self._startup_error
        return self

    def close(self) -> None:
        """Stop the worker; requests not done fail with a message saying the engine stopped."""
        self._closed.set()
        self._inbox.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def __enter__(self) -> "Engine":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def room(self, n_prompt: int) -> int:
        """How many new tokens fit after a prompt of ``n_prompt`` ids (0: the prompt does not fit)."""
        if n_prompt > self.limit or n_prompt < 1:
            return 0
        return max(1, self.limit - n_prompt)

    @property
    def slots_in_use(self) -> int:
        """Slots held by requests (decoding, or being prefilled)."""
        with self._lock:
            return sum(s is not None for s in self._rows) + (self._prefill is not None)

    @property
    def waiting(self) -> int:
        """Requests submitted but not yet in a slot."""
        return self._inbox.qsize() + len(self._waiting)

    def default_sampler(self, temperature=None, top_k=None, top_p=None, seed=None) -> Sampler:
        """The sampler a request gets: what it gives, else the bundle's. A request that sets
        ``temperature`` (> 0) or ``top_p`` but not ``top_k`` samples from the whole vocabulary
        (OpenAI's API has no ``top_k``); no ``seed``: a random one."""
        if top_k is None and ((temperature is not None and temperature > 0) or top_p is not None):
            top_k = self.bundle.vocab_size
        s = self.bundle.sampler.replace(temperature=temperature, top_k=top_k, top_p=top_p)
        return dataclasses.replace(s, seed=int(seed) if seed is not None else secrets.randbits(31))

    def submit(self, prompt_ids: Sequence[int], *, max_new_tokens: Optional[int] = None, temperature=None,
               top_k=None, top_p=None, seed=None, stop: Sequence[str] = (),
               sink: Optional[Callable[[Event], None]] = None) -> Request:
        """Queue a generation from ``prompt_ids`` (start token included: :meth:`LlmBundle.prompt_tokens`).

        Args:
            max_new_tokens: at most this many new tokens (default: until a stop
                token or the KV cache is full).
            temperature, top_k, top_p, seed: see :meth:`default_sampler`.
            stop: strings that end the text (cut off before the first match).
            sink: called on the engine's thread with each :class:`Event` (must
                not block); default: the request's own queue (iterate it).

        Raises:
            InputError: an empty prompt, one longer than the KV cache,
                ``max_new_tokens`` < 1 or past the cache, bad sampler settings,
                or the engine is closed.
        """
        if self._closed.is_set():
            raise InputError("the engine is closed")
        ids = [int(i) for i in prompt_ids]
        if not ids:
            raise InputError("the prompt is empty after templating and tokenizing: give some text")
        if len(ids) > self.limit:
            raise InputError(f"the prompt is {len(ids)} tokens; the KV cache holds {self.limit} positions: "
                             "shorten the prompt")
        room = self.room(len(ids))
        if max_new_tokens is not None and not 1 <= max_new_tokens <= room:
            raise InputError(f"max_tokens {max_new_tokens}: must be between 1 and {room} (the prompt takes "
                             f"{len(ids)} of the KV cache's {self.limit} positions): lower it or shorten the prompt")
        s = self.default_sampler(temperature, top_k, top_p, seed)
        req = Request(ids, room if max_new_tokens is None else int(max_new_tokens), s.temperature, s.top_k,
                      s.top_p, s.seed, list(stop), sink)
        self._inbox.put(req)
        return req

    # --- the worker ------------------------------------------------------------

    def _loop(self) -> None:
        try:
            self._warm_up()
        except BaseException as e:  # noqa: BLE001 - reported to start()'s caller
            self._startup_error = e
            self._ready.set()
            return
        self._ready.set()
        while not self._closed.is_set():
            self._take_new(block=not self._busy())
            if self._closed.is_set():
                break
            self._drop_cancelled()
            try:
                self._prefill_step()
                self._decode_step()
            except Exception as e:  # noqa: BLE001 - fail the requests in flight, keep serving
                self._fail_all(f"generation failed: {type(e).__name__}: {e}")
        self._fail_all("the engine stopped", waiting=True)

    def _busy(self) -> bool:
        return self._prefill is not None or any(self._rows) or (bool(self._waiting) and None in self._rows)

    def _free(self, i: int) -> None:
        """Free row ``i``: the last running row moves into it (the running rows stay first)."""
        last = max(j for j, s in enumerate(self._rows) if s is not None)
        if last != i:
            self._kv = _move_row(self._kv, np.int32(last), np.int32(i))
            self._keys[i] = self._keys[last]
        with self._lock:
            self._rows[i], self._rows[last] = self._rows[last], None

    def _take_new(self, block: bool) -> None:
        try:
            req = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
            while True:
                if req is not None:
                    self._waiting.append(req)
                req = self._inbox.get_nowait()
        except queue.Empty:
            pass

    def _drop_cancelled(self) -> None:
        for req in [r for r in self._waiting if r._cancelled.is_set()]:
            self._waiting.remove(req)
            req._finish("stop")
        for i in reversed(range(self.slots)):
            s = self._rows[i]
            if s is not None and s.req._cancelled.is_set():
                self._free(i)
                s.req._finish("stop")
        with self._lock:
            if self._prefill is not None and self._prefill[0]._cancelled.is_set():
                self._prefill[0]._finish("stop")
                self._prefill = None

    def _fail_all(self, message: str, waiting: bool = False) -> None:
        with self._lock:
            reqs = [s.req for s in self._rows if s is not None] + ([self._prefill[0]] if self._prefill else [])
            self._rows = [None] * self.slots
            self._prefill = None
            self._kv = self._r.zeros(self.slots)
        if waiting:
            reqs += list(self._waiting)
            self._waiting.clear()
            self._take_new(block=False)
            reqs += list(self._waiting)
        for r in reqs:
            r._fail(message)

    def _warm_up(self) -> None:
        """Compile the programs a request needs: batch-1 prefill, row insert and move, the argmax decode
        step at each batch size of :attr:`buckets` (the sampling steps compile at their first use)."""
        r = self._r
        self._kv = r.zeros(self.slots)
        self._keys = np.zeros((self.slots,) + jax.random.key_data(jax.random.key(0)).shape, np.uint32)
        row = r.prefill(self.params, r.zeros(1), np.zeros((1, r.n), np.int32), np.zeros((1,), np.int32))
        self._kv = _set_row(self._kv, row, np.int32(0))
        self._kv = _move_row(self._kv, np.int32(0), np.int32(0))
        for b in self.buckets:
            nxt, _, self._kv = r.decode_rows(self.params, self._kv, np.zeros(b, np.int32), np.zeros(b, np.int32))
        np.asarray(nxt)

    def _prefill_step(self) -> None:
        """Start a newcomer's prefill if a slot is free, else run one chunk of the one under way;
        a prefill that is complete goes into its slot."""
        r = self._r
        if self._prefill is None:
            while self._waiting and None in self._rows and len(self._waiting[0].prompt_ids) <= self.prompt_steps:
                req = self._waiting.popleft()  # a short prompt: fed through the decode steps from position 0
                slot = self._rows.index(None)
                self._keys[slot] = np.asarray(jax.random.key_data(jax.random.key(req.seed)))
                with self._lock:
                    self._rows[slot] = _Slot(req, [], req.prompt_ids[0], req.prompt_ids[1:])
            if not self._waiting or None not in self._rows:
                return
            req = self._waiting.popleft()
            with self._lock:
                feed = req.prompt_ids[:-1]
                self._prefill = [req, r.zeros(1), feed, 0, -(-len(feed) // r.n)]
        req, kv1, feed, c, chunks = self._prefill
        if c < chunks:  # one chunk, placed as ChatSession._prefill places a fresh row's chunks
            p0 = min(c * r.n, r.capacity - r.n)
            toks = np.zeros((1, r.n), np.int32)
            seg = feed[p0:p0 + r.n]
            toks[0, :len(seg)] = seg
            t0 = time.perf_counter()
            self._prefill[1] = kv1 = r.prefill(self.params, kv1, toks, np.asarray([p0], np.int32))
            jax.block_until_ready(kv1)
            self.stats["prefill_s"] += time.perf_counter() - t0
            self.stats["prefill_chunks"] += 1
            self._prefill[3] = c = c + 1
        if c >= chunks:
            slot = self._rows.index(None)  # the first free row: right after the running ones
            self._kv = _set_row(self._kv, kv1, np.int32(slot))
            self._keys[slot] = np.asarray(jax.random.key_data(jax.random.key(req.seed)))
            with self._lock:
                self._rows[slot] = _Slot(req, list(feed), req.prompt_ids[-1])
                self._prefill = None

    def _decode_step(self) -> None:
        """One decode step of every running slot; reports each request's new text, frees finished slots."""
        r = self._r
        live = [(i, s) for i, s in enumerate(self._rows) if s is not None]
        if not live:
            return
        b = next(x for x in self.buckets if x >= len(live))  # rows b.. are free: not computed
        tok = np.zeros(b, np.int32)  # free rows below b feed token 0 at position 0 into their own (unused) row
        pos = np.zeros(b, np.int32)
        temp = np.zeros(b, np.float32)
        top_k = np.ones(b, np.int32)
        top_p = np.ones(b, np.float32)
        for i, s in live:
            tok[i], pos[i] = s.token, len(s.hist)
            temp[i], top_k[i], top_p[i] = s.req.temperature, s.req.top_k, s.req.top_p
        t0 = time.perf_counter()
        if all(s.req.greedy for _, s in live):
            nxt, _, self._kv = r.decode_rows(self.params, self._kv, tok, pos)
        else:
            nxt, keys, self._kv = r.decode_rows(self.params, self._kv, tok, pos,
                                                (self._keys[:b], temp, top_k, top_p))
            self._keys[:b] = np.asarray(keys)
        nxt = np.asarray(nxt)
        self.steps += 1
        self.stats["steps"] += 1
        self.stats["decode_s"] += time.perf_counter() - t0
        stops = self.bundle.stop_tokens
        tk = self.bundle.tokenizer
        for i, s in reversed(live):  # from the last row: a freed row takes the last running one
            req = s.req
            s.hist.append(s.token)
            if s.pending:  # a prompt id went into the cache: the next one is fed, the output is not a token
                s.token = s.pending.popleft()
                self.stats["prompt_steps"] += 1
                continue
            self.stats["tokens"] += 1
            t = int(nxt[i])
            s.token = t
            req.tokens.append(t)
            hit = next((st for st in stops if req.tokens[-len(st):] == st), None)
            reason = None
            if hit is not None:
                del req.tokens[-len(hit):]
                reason = "stop"
            else:
                window = req.tokens[-8:]  # the text this token adds, as LlmBundle.stream has it
                piece = tk.decode(window)[len(tk.decode(window[:-1])):] if len(window) > 1 else tk.decode([t])
                req.text += piece
                cut = min((k for k in (req.text.find(x) for x in req.stop) if k >= 0), default=-1)
                if cut >= 0:
                    req.text = req.text[:cut]
                    reason = "stop"
                elif len(req.tokens) >= req.max_new_tokens or len(s.hist) + 1 >= self.limit:
                    reason = "length"
            if reason is None:
                req._emit_text(final=False)
            else:
                self._free(i)
                req._finish(reason)
