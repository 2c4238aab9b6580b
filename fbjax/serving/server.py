"""An OpenAI-compatible HTTP server for an LLM bundle (``fbjax serve BUNDLE``).

Built on Starlette (the ASGI app: :func:`create_app`) and uvicorn (the HTTP
server: :func:`serve`, :class:`ServerThread`); ``pip install 'fbjax[serve]'``.
Requests run on one :class:`~fbjax.serving.engine.Engine` (continuous
batching: concurrent requests share decode steps).

Endpoints:

* ``GET /v1/models``: the one model, its id the bundle's file name without
  its extension (``--model-id`` sets another);
* ``POST /v1/chat/completions``: ``messages`` rendered with the bundle's Jinja
  chat template (or its prompt templates) as :meth:`LlmBundle.chat` renders a
  first turn, the start token prepended as an id;
* ``POST /v1/completions``: ``prompt`` as given (no template: LiteRT-LM's
  ``--no-template``), the start token prepended;
* ``GET /health``: slots, slots in use, requests waiting, the engine's counters (:attr:`Engine.stats`).

Fields: ``max_tokens`` (chat: also ``max_completion_tokens``; default: until a
stop token or the KV cache is full), ``temperature``, ``top_p``, ``top_k`` (an
extension; absent while ``temperature``/``top_p`` are given: the whole
vocabulary), ``seed``, ``stop`` (a string or up to 4), ``stream`` (server-sent
events in OpenAI's chunk format, ending ``data: [DONE]``; ``stream_options:
{"include_usage": true}`` adds a usage chunk), ``n`` (1 only), ``user``
(ignored). Omitted sampling fields: the bundle's sampler. Responses carry
``usage`` (prompt tokens with the start token; completion tokens without the
stop token) and ``finish_reason`` ``stop`` (stop token or string) or
``length`` (``max_tokens`` or a full KV cache).

Bad requests are answered ``{"error": {"message", "type", "param", "code"}}``:
400 for malformed JSON, a wrong type or value, a prompt longer than the KV
cache or ``max_tokens`` past it; 404 for an unknown model or path; 422 for a
field this server does not support (the message names what to change).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Optional

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from .. import load
from ..errors import InputError
from .engine import Engine

__all__ = ["create_app", "serve", "ServerThread", "model_id_of"]

#: fields every endpoint takes
_COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream", "stream_options", "n",
           "user"}
#: fields OpenAI defines that this server takes only at their no-op value: {field: allowed values}
_NEUTRAL = {"n": (1,), "presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0), "logprobs": (False,),
            "echo": (False,), "best_of": (1,), "suffix": ("",), "parallel_tool_calls": (False,)}
_CHAT = _COMMON | {"messages", "max_completion_tokens"}
_COMPLETION = _COMMON | {"prompt"}


class ApiError(Exception):
    """An OpenAI-shaped error response: HTTP ``status``, ``{"error": {message, type, param, code}}``."""

    def __init__(self, status: int, message: str, param: Optional[str] = None, code: Optional[str] = None,
                 type: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type

    def response(self) -> JSONResponse:
        """The JSON response."""
        return JSONResponse({"error": {"message": self.message, "type": self.type, "param": self.param,
                                       "code": self.code}}, status_code=self.status)


def model_id_of(bundle) -> str:
    """A bundle's model id: its file name without the extension (``smollm2-135m_int8``)."""
    label = getattr(bundle.file, "label", None) or "model"
    return Path(str(label)).stem or "model"


def _number(body: dict, name: str, kind, lo=None, hi=None, lo_open=False):
    v = body.get(name)
    if v is None:
        return None
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) if kind is float else \
        isinstance(v, int) and not isinstance(v, bool)
    if not ok:
        raise ApiError(400, f"'{name}' must be {'a number' if kind is float else 'an integer'}, got {v!r}", name,
                       "invalid_type")
    if (lo is not None and (v <= lo if lo_open else v < lo)) or (hi is not None and v > hi):
        rng = f"{'>' if lo_open else '>='} {lo}" + (f" and <= {hi}" if hi is not None else "")
        raise ApiError(400, f"'{name}' must be {rng}, got {v!r}", name, "invalid_value")
    return kind(v)


class _Api:
    """The endpoints over one engine."""

    def __init__(self, engine: Engine, model_id: str):
        self.engine, self.model_id = engine, model_id
        self.bundle = engine.bundle
        self.created = int(time.time())

    # --- request parsing ----------------------------------------------------------

    async def _body(self, request: HttpRequest, allowed: set) -> dict:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ApiError(400, f"the request body is not valid JSON ({e}): send a JSON object such as "
                           f'{{"model": "{self.model_id}", ...}} with Content-Type: application/json',
                           None, "invalid_json") from None
        if not isinstance(body, dict):
            raise ApiError(400, f"the request body must be a JSON object, got {type(body).__name__}", None,
                           "invalid_json")
        for k, v in body.items():
            if k in _NEUTRAL and v is not None and v not in _NEUTRAL[k]:
                raise ApiError(422, f"'{k}' = {v!r} is not supported by this server (only {_NEUTRAL[k][0]!r}): "
                               f"leave it out", k, "unsupported_parameter")
            if k not in allowed and k not in _NEUTRAL:
                raise ApiError(422, f"'{k}' is not supported by this server: leave it out (supported: "
                               f"{', '.join(sorted(allowed))})", k, "unsupported_parameter")
        model = body.get("model")
        if model is None:
            raise ApiError(400, f"'model' is required: this server serves {self.model_id!r}", "model",
                           "missing_required_parameter")
        if model != self.model_id:
            raise ApiError(404, f"the model {model!r} does not exist here: this server serves {self.model_id!r} "
                           "(GET /v1/models)", "model", "model_not_found")
        return body

    def _settings(self, body: dict, ids: list, prompt_param: str, max_names=("max_tokens",)) -> dict:
        temperature = _number(body, "temperature", float, 0, 2)
        top_p = _number(body, "top_p", float, 0, 1, lo_open=True)
        top_k = _number(body, "top_k", int, 1)
        seed = _number(body, "seed", int)
        stop = body.get("stop")
        if isinstance(stop, str):
            stop = [stop]
        if stop is None:
            stop = []
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop) or len(stop) > 4:
            raise ApiError(400, f"'stop' must be a string or a list of at most 4 strings, got {stop!r}", "stop",
                           "invalid_type")
        so = body.get("stream_options")
        if so is not None and (not isinstance(so, dict) or set(so) - {"include_usage"}):
            raise ApiError(422, f"'stream_options' takes only include_usage, got {so!r}", "stream_options",
                           "unsupported_parameter")
        if not isinstance(body.get("stream", False), bool):
            raise ApiError(400, f"'stream' must be true or false, got {body['stream']!r}", "stream", "invalid_type")
        e = self.engine
        if len(ids) > e.limit:
            raise ApiError(400, f"the prompt is {len(ids)} tokens (start token and template included); this model's "
                           f"KV cache holds {e.limit} positions: shorten the {prompt_param}", prompt_param,
                           "context_length_exceeded")
        room = e.room(len(ids))
        max_tokens, name = None, max_names[0]
        for n in max_names:
            if body.get(n) is not None:
                max_tokens, name = _number(body, n, int, 1), n
        if max_tokens is not None and max_tokens > room:
            raise ApiError(400, f"'{name}' is {max_tokens}, but the prompt takes {len(ids)} of the KV cache's "
                           f"{e.limit} positions, leaving room for {room} new tokens: set {name} <= {room} or "
                           f"shorten the {prompt_param}", name, "context_length_exceeded")
        return dict(max_new_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
                    stop=stop)

    def _chat_ids(self, body: dict) -> list:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise ApiError(400, "'messages' must be a non-empty list of {\"role\", \"content\"} objects", "messages",
                           "invalid_type" if msgs is not None else "missing_required_parameter")
        out = []
        for i, m in enumerate(msgs):
            p = f"messages[{i}]"
            if not isinstance(m, dict) or "role" not in m:
                raise ApiError(400, f"{p} must be an object with 'role' and 'content'", p, "invalid_type")
            extra = set(m) - {"role", "content", "name"}
            if extra:
                raise ApiError(422, f"{p}: {', '.join(sorted(extra))} not supported (text messages only): leave "
                               "it out", p, "unsupported_parameter")
            if m["role"] not in ("system", "user", "assistant", "developer"):
                raise ApiError(422, f"{p}: role {m['role']!r} is not supported: use system, user or assistant", p,
                               "unsupported_parameter")
            c = m.get("content")
            if isinstance(c, list):  # content parts: text only
                if not all(isinstance(x, dict) and x.get("type") == "text" and isinstance(x.get("text"), str)
                           for x in c):
                    raise ApiError(422, f"{p}: only text content parts are supported ({{\"type\": \"text\", "
                                   "\"text\": ...}})", p, "unsupported_parameter")
                c = "".join(x["text"] for x in c)
            if not isinstance(c, str):
                raise ApiError(400, f"{p}.content must be a string or a list of text parts", p, "invalid_type")
            out.append({"role": "system" if m["role"] == "developer" else m["role"], "content": c})
        try:
            text = self.bundle.apply_chat_template(out, add_generation_prompt=True)
        except InputError as e:
            raise ApiError(400, f"the bundle's chat template refuses these messages: {e}", "messages",
                           "invalid_messages") from None
        return self.bundle.encode(text, add_start=True)

    def _completion_ids(self, body: dict) -> list:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, list):
            raise ApiError(422, "'prompt' as a list (several prompts or token ids) is not supported: send one "
                           "string per request", "prompt", "unsupported_parameter")
        if not isinstance(prompt, str):
            raise ApiError(400, "'prompt' must be a string", "prompt",
                           "invalid_type" if prompt is not None else "missing_required_parameter")
        return self.bundle.prompt_tokens(prompt, template=False)

    # --- endpoints ------------------------------------------------------------------

    async def models(self, request: HttpRequest) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [self._model_card()]})

    async def model(self, request: HttpRequest) -> JSONResponse:
        mid = request.path_params["model"]
        if mid != self.model_id:
            raise ApiError(404, f"the model {mid!r} does not exist here: this server serves {self.model_id!r}",
                           "model", "model_not_found")
        return JSONResponse(self._model_card())

    def _model_card(self) -> dict:
        return {"id": self.model_id, "object": "model", "created": self.created, "owned_by": "fbjax"}

    async def health(self, request: HttpRequest) -> JSONResponse:
        e = self.engine
        return JSONResponse({"status": "ok", "model": self.model_id, "slots": e.slots,
                             "slots_in_use": e.slots_in_use, "waiting": e.waiting, "kv_cache": e.limit,
                             "stats": dict(e.stats)})

    async def chat(self, request: HttpRequest):
        body = await self._body(request, _CHAT)
        ids = self._chat_ids(body)
        return await self._generate(body, ids, self._settings(body, ids, "messages",
                                                              ("max_tokens", "max_completion_tokens")), chat=True)

    async def completions(self, request: HttpRequest):
        body = await self._body(request, _COMPLETION)
        ids = self._completion_ids(body)
        return await self._generate(body, ids, self._settings(body, ids, "prompt"), chat=False)

    async def _generate(self, body: dict, ids: list, settings: dict, chat: bool):
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        streaming = bool(body.get("stream"))

        def sink(ev):  # a whole response waits for the end only: no wake-up of the event loop per token
            if streaming or ev.kind != "text":
                loop.call_soon_threadsafe(events.put_nowait, ev)
        try:
            req = self.engine.submit(ids, sink=sink, **settings)
        except InputError as e:
            raise ApiError(400, str(e)) from None
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        head = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
                "model": self.model_id}

        def usage():
            return {"prompt_tokens": len(ids), "completion_tokens": len(req.tokens),
                    "total_tokens": len(ids) + len(req.tokens)}

        if not streaming:
            try:
                while True:
                    ev = await events.get()
                    if ev.kind == "error":
                        raise ApiError(500, ev.text, None, "generation_failed", "server_error")
                    if ev.kind == "done":
                        break
            finally:
                req.cancel()  # a no-op when done; frees the slot when the handler was cancelled
            choice = {"index": 0, "finish_reason": req.finish_reason, "logprobs": None}
            if chat:
                choice["message"] = {"role": "assistant", "content": req.text}
            else:
                choice["text"] = req.text
            return JSONResponse(dict(head, object="chat.completion" if chat else "text_completion",
                                     choices=[choice], usage=usage()))

        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        def chunk(text=None, finish=None, role=False):
            if chat:
                delta = ({"role": "assistant", "content": ""} if role else {}) | \
                    ({"content": text} if text is not None else {})
                c = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
            else:
                c = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
            d = dict(head, choices=[c])
            if include_usage:
                d["usage"] = None
            return f"data: {json.dumps(d)}\n\n"

        async def stream():
            if chat:
                yield chunk(role=True)
            while True:
                ev = await events.get()
                if ev.kind == "text":
                    yield chunk(ev.text)
                elif ev.kind == "error":
                    err = {"error": {"message": ev.text, "type": "server_error", "param": None,
                                     "code": "generation_failed"}}
                    yield f"data: {json.dumps(err)}\n\n"
                    break
                else:
                    yield chunk(finish=ev.finish_reason)
                    if include_usage:
                        yield f"data: {json.dumps(dict(head, choices=[], usage=usage()))}\n\n"
                    break
            yield "data: [DONE]\n\n"

        return _EventStream(req, stream(), media_type="text/event-stream",
                            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


class _EventStream(StreamingResponse):
    """A streamed response that cancels its request however the response ends (a client gone
    included), so that the request's slot is freed."""

    def __init__(self, req, *a, **kw):
        super().__init__(*a, **kw)
        self._req = req

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._req.cancel()


def create_app(engine: Engine, model_id: Optional[str] = None) -> Starlette:
    """The ASGI app serving ``engine`` (started by the caller; :meth:`Engine.start`).

    Args:
        engine: the :class:`~fbjax.serving.engine.Engine` requests run on.
        model_id: the id clients name (default: :func:`model_id_of` the bundle).

    Returns:
        a Starlette app; ``app.state.engine`` and ``app.state.model_id`` hold
        what it serves.
    """
    api = _Api(engine, model_id or model_id_of(engine.bundle))

    async def api_error(request, exc: ApiError):
        return exc.response()

    async def http_error(request, exc: HTTPException):
        if exc.status_code == 404:
            return ApiError(404, f"no such endpoint: {request.method} {request.url.path} (this server has GET "
                            "/v1/models, POST /v1/chat/completions, POST /v1/completions, GET /health)", None,
                            "not_found").response()
        return ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", None,
                        None).response()

    async def server_error(request, exc: Exception):
        return ApiError(500, f"internal error: {type(exc).__name__}: {exc}", None, None, "server_error").response()

    app = Starlette(routes=[
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/v1/models/{model:path}", api.model, methods=["GET"]),
        Route("/v1/chat/completions", api.chat, methods=["POST"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/health", api.health, methods=["GET"]),
    ], exception_handlers={ApiError: api_error, HTTPException: http_error, Exception: server_error})
    app.state.engine = engine
    app.state.model_id = api.model_id
    return app


def _engine(bundle, slots: int, prompt_steps: Optional[int] = None, **load_kwargs) -> Engine:
    if isinstance(bundle, (str, os.PathLike)):
        bundle = load(bundle, **load_kwargs)
    return Engine(bundle, slots=slots, prompt_steps=prompt_steps).start()


def serve(bundle, host: str = "127.0.0.1", port: int = 8000, slots: int = 8, model_id: Optional[str] = None,
          log_level: str = "info", prompt_steps: Optional[int] = None, **load_kwargs) -> None:
    """Serve ``bundle`` (an :class:`LlmBundle` or a path) until interrupted (``fbjax serve``).

    Args:
        bundle: the bundle, or a ``.litertlm`` / LLM ``.task`` path
            (``load_kwargs`` go to :func:`fbjax.load`).
        host, port: where to listen.
        slots: requests decoded together (:class:`~fbjax.serving.engine.Engine`).
        model_id: the id clients name (default: the file name without its extension).
        prompt_steps: prompts of at most this many ids go through the decode
            steps instead of a prefill call (:class:`~fbjax.serving.engine.Engine`;
            default a quarter of the prefill length).
    """
    import uvicorn

    engine = _engine(bundle, slots, prompt_steps, **load_kwargs)
    app = create_app(engine, model_id)
    print(f"fbjax serve: model id {app.state.model_id!r}, {slots} slots, KV cache {engine.limit} positions; "
          f"OpenAI base URL http://{host}:{port}/v1", file=sys.stderr, flush=True)
    try:
        uvicorn.run(app, host=host, port=port, log_level=log_level)
    finally:
        engine.close()


class ServerThread:
    """The server on a background thread (tests, notebooks, the README's example).

    ``ServerThread(bundle_or_path, port=0)`` loads the bundle (a path), starts
    the engine and uvicorn on ``host:port`` (0: a free port) and returns when
    it accepts connections; :attr:`url` is its ``http://host:port/v1`` base
    URL. Use it as a context manager or call :meth:`close`.

    Attributes:
        engine: the :class:`~fbjax.serving.engine.Engine`.
        port: the port it listens on.
        url: ``http://HOST:PORT/v1``.

    Raises:
        RuntimeError: uvicorn did not start within ``timeout`` seconds.
    """

    def __init__(self, bundle, host: str = "127.0.0.1", port: int = 0, slots: int = 8,
                 model_id: Optional[str] = None, timeout: float = 120.0, prompt_steps: Optional[int] = None,
                 **load_kwargs):
        import uvicorn

        self.engine = _engine(bundle, slots, prompt_steps, **load_kwargs)
        self.app = create_app(self.engine, model_id)
        self.model_id = self.app.state.model_id
        self._server = uvicorn.Server(uvicorn.Config(self.app, host=host, port=port, log_level="warning",
                                                     lifespan="off"))
        self._thread = threading.Thread(target=self._server.run, name="fbjax-serve", daemon=True)
        self._thread.start()
        t0 = time.monotonic()
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() - t0 > timeout:
                self.engine.close()
                raise RuntimeError(f"the server did not start on {host}:{port} (is the port taken?)")
            time.sleep(0.02)
        self.host = host
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://{host}:{self.port}/v1"

    def close(self) -> None:
        """Stop uvicorn and the engine."""
        self._server.should_exit = True
        self._thread.join(timeout=30)
        self.engine.close()

    def __enter__(self) -> "ServerThread":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
