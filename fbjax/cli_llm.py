"""The LLM-bundle parts of the ``fbjax`` command line (``.litertlm``, MediaPipe LLM ``.task``).

    fbjax inspect BUNDLE
    fbjax generate BUNDLE --prompt "..." [--no-template] [--temperature T --top-k K --top-p P --seed S]
    fbjax chat BUNDLE
    fbjax serve BUNDLE [--host 127.0.0.1] [--port 8000] [--slots 8]
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time

from .formats.llm_container import bundle_kind

__all__ = ["is_bundle", "not_a_bundle", "inspect_bundle", "generate_bundle", "cmd_chat", "add_chat_parser",
           "cmd_serve", "add_serve_parser"]


def is_bundle(path) -> bool:
    """Whether ``path`` is a ``.litertlm`` or LLM ``.task`` bundle (from its bytes)."""
    try:
        return path is not None and bundle_kind(path) is not None
    except OSError:
        return False


def not_a_bundle(command: str, path) -> str:
    """Why ``fbjax COMMAND PATH`` (``generate --prompt`` or ``chat``: text in,
    text out) cannot take ``path``, a file that is not an LLM bundle, and what
    to run instead: a prefill/decode ``.tflite`` takes token ids, any other
    model ``fbjax run``.

    Raises:
        FileNotFoundError: no such file.
        ModelFormatError: not a file fbjax reads (a cut-off ``.task`` is named
            as such: :func:`fbjax.formats.detect_format`).
    """
    from .formats import detect_format, read_model

    if not os.path.exists(path):
        raise FileNotFoundError(2, "no such file", os.fspath(path))
    fmt = detect_format(path)
    sigs = list(read_model(path, fmt).signatures) if fmt == "tflite" else []
    what = "text in, text out" if command == "generate" else "a conversation"
    need = (f"`fbjax {command}` with text ({what}) needs a .litertlm or MediaPipe LLM .task bundle, which holds the "
            "tokenizer" + (" and chat template" if command == "chat" else ""))
    q = shlex.quote(os.fspath(path))
    if any(k.startswith("prefill") for k in sigs) and "decode" in sigs:
        return (f"{path} is a .tflite LLM (prefill/decode signatures, no tokenizer): token ids in, ids out. {need}; "
                f"this file runs as `fbjax generate {q} --prompt-tokens 1,2,3`")
    return (f"{path} is a {fmt} model, not an LLM bundle. {need}; this file runs as `fbjax run {q}` "
            f"(`fbjax inspect {q}` shows its inputs and outputs)")


def _token_text(bundle, ids) -> str:
    return ", ".join(f"{i} {bundle.tokenizer.piece(i)!r}" for i in ids)


def inspect_bundle(path) -> int:
    """Print a bundle's sections, model type, tokenizer, tokens, templates, sampler and signatures."""
    from . import load
    from .formats import read_model
    from .formats.llm_container import read_bundle

    f = read_bundle(path)  # the container needs no tokenizer package: its sections print without one
    print(f"bundle:    {path}")
    print(f"container: {f.container}" + (f" {'.'.join(map(str, f.version))}" if f.version else " (zip)"))
    for k, v in f.system_metadata.items():
        print(f"  system   {k}: {v}")
    print("sections:")
    for s in f.sections:
        items = "".join(f" {k}={v}" for k, v in s.items.items())
        print(f"  [{s.index}] {s.kind:<24} bytes {s.begin}..{s.end} ({s.end - s.begin} B){items}")
    meta = f.llm_metadata
    mt = meta.llm_model_type.WhichOneof("model_type") if meta.HasField("llm_model_type") else None
    print(f"model type: {mt or '(not set)'}")
    try:
        b = load(path)
    except ImportError as e:  # the tokenizer's package is missing (fbjax[llm]): what the file says without it
        if "pip install" not in str(e):
            raise
        print(f"tokenizer:  {f.tokenizer_kind} (not read: {e})")
        print("signatures:")
        for key, sig in read_model(f.model.data).signatures.items():
            print(f"  {key}: ({', '.join(sig.inputs)}) -> ({', '.join(sig.outputs)})")
        print(f"start/stop tokens, templates and the sampler need the tokenizer: pip install 'fbjax[llm]', then "
              f"`fbjax inspect {shlex.quote(os.fspath(path))}` again")
        return 0
    print(f"tokenizer:  {b.tokenizer.kind}, vocabulary {b.tokenizer.vocab_size} (model logits {b.vocab_size})")
    print(f"start token: {_token_text(b, [b.start_token]) if b.start_token is not None else '(none)'}")
    print(f"stop tokens: {'; '.join(_token_text(b, s) for s in b.stop_tokens) or '(none)'}")
    print(f"KV cache:   {b.capacity} positions" + (" (ExecutorMetadata sequence_axis)" if f.executor_metadata
                                                    is not None else "") +
          (f"; max_num_tokens {b.max_num_tokens}" if b.max_num_tokens else ""))
    s = b.sampler
    print(f"sampler:    temperature {s.temperature}, top_k {s.top_k}, top_p {s.top_p}, seed {s.seed}"
          + (" (greedy)" if s.greedy else ""))
    for role, (pre, suf) in b.prompt_templates.items():
        print(f"template {role}: prefix {pre!r} suffix {suf!r}")
    if b.chat_template is not None:
        print(f"chat template (Jinja, {len(b.chat_template)} chars): {b.chat_template[:200]!r}"
              + ("..." if len(b.chat_template) > 200 else ""))
    print("signatures:")
    for key, sig in b.model.signatures.items():
        ins = ", ".join(f"{n} {list(t.shape)} {t.dtype}" for n, t in sig.inputs.items())
        outs = ", ".join(f"{n} {list(t.shape)} {t.dtype}" for n, t in sig.outputs.items())
        print(f"  {key}: ({ins}) -> ({outs})")
    return 0


def _sampler_kw(args) -> dict:
    return dict(temperature=args.temperature, top_k=args.top_k, top_p=getattr(args, "top_p", None), seed=args.seed)


def generate_bundle(args) -> int:
    """``fbjax generate BUNDLE --prompt TEXT``: stream the generated text to stdout."""
    from . import load

    if not args.prompt:
        raise SystemExit("fbjax generate: a bundle takes text: --prompt \"...\" (repeatable); --prompt-tokens is "
                         "for bare .tflite files")
    started = _process_age()  # the Python start and `import jax, fbjax` so far
    t_load = time.perf_counter()
    b = load(args.model, quantized=args.quantized)
    t_load = time.perf_counter() - t_load
    if args.verbose:
        print((f"[start-up (Python, import jax and fbjax): {started:.2f} s; " if started is not None else "[")
              + f"load (read the bundle, its tokenizer, trace the model): {t_load:.2f} s]", file=sys.stderr)
    kw = _sampler_kw(args)
    for i, p in enumerate(args.prompt):
        if len(args.prompt) > 1:
            print(f"--- prompt {i}: {p!r}")
        t0 = time.perf_counter()
        n, first = 0, None
        for piece in b.stream(p, template=not args.no_template, max_new_tokens=args.max_new_tokens, **kw):
            if first is None:
                first = time.perf_counter() - t0
            n += 1
            sys.stdout.write(piece)
            sys.stdout.flush()
        dt = time.perf_counter() - t0
        print()
        if args.verbose:
            print(f"[{n} pieces in {dt:.2f} s; first after {first or 0:.2f} s (compile included)]", file=sys.stderr)
    if args.verbose and started is not None:
        print(f"[total since the process started: {_process_age():.2f} s]", file=sys.stderr)
    return 0


def _process_age():
    """Seconds since this process started (Linux ``/proc``; ``None`` elsewhere): what ``--verbose`` reports
    as start-up, Python's own start and the imports before ``fbjax generate`` runs."""
    try:
        with open("/proc/self/stat") as f:
            start = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime, in clock ticks after boot
        with open("/proc/uptime") as f:
            up = float(f.read().split()[0])
        return max(0.0, up - start / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def cmd_chat(args) -> int:
    """``fbjax chat BUNDLE``: an interactive chat through the bundle's chat template, keeping the KV cache."""
    from . import load
    from .errors import InputError

    if not is_bundle(args.model):
        raise SystemExit(f"fbjax chat: {not_a_bundle('chat', args.model)}")
    b = load(args.model, quantized=args.quantized)
    chat = b.chat(**_sampler_kw(args))
    print(f"chatting with {args.model} ({b.capacity}-position KV cache); an empty line or Ctrl-D ends, "
          "/reset starts over")
    advised = False  # the advice on a full cache is given once; later refusals are one short line
    while True:
        try:
            line = input("> ")
        except EOFError:
            print()
            return 0
        if not line.strip():
            return 0
        if line.strip() == "/reset":
            chat = b.chat(**_sampler_kw(args))
            print("(new conversation)")
            continue
        try:
            for piece in chat.send(line, stream=True, max_new_tokens=args.max_new_tokens):
                sys.stdout.write(piece)
                sys.stdout.flush()
        except InputError as e:
            if "KV cache" not in str(e):
                print(f"\n(fbjax chat: {e}; /reset starts a new conversation)")
            elif advised:
                print(f"(does not fit either: {_positions_left(b, chat)} positions left; /reset starts over)")
            else:
                left = _positions_left(b, chat)
                print(f"(fbjax chat: {str(e).removesuffix(': start a new chat')}; {left} of its positions are "
                      f"left. {_room(args.model, left)})")
                advised = True
            continue
        print()
        if _positions_left(b, chat) <= 0 and not advised:  # the reply filled the cache: no later turn fits
            print(f"(the KV cache is full: this conversation holds all {b.capacity} positions. "
                  f"{_room(args.model, 0)})")
            advised = True


def _room(path, left: int) -> str:
    """What to do when a chat's turns no longer fit its KV cache (``left`` positions unused)."""
    return ("/reset starts a new conversation with an empty cache" + ("; a shorter message may still fit" if left > 0
                                                                      else "")
            + f"; `fbjax chat {shlex.quote(os.fspath(path))} -n N` caps each reply at N tokens, leaving room for "
            "more turns")


def _positions_left(bundle, chat) -> int:
    """KV cache positions a chat has not used: the ids in the cache, plus the
    reply's last token, which the next turn feeds first."""
    return bundle.capacity - len(chat.tokens) - (1 if chat.tokens else 0)


def add_chat_parser(sub, add_quantized) -> None:
    """Register ``fbjax chat``."""
    pc = sub.add_parser("chat", help="interactive chat with an LLM bundle (.litertlm or LLM .task)",
                        description="Talk to a bundle's model through its chat template; the KV cache persists "
                        "between turns. An empty line or Ctrl-D ends; /reset starts a new conversation.")
    pc.add_argument("model", help="a .litertlm or MediaPipe LLM .task bundle")
    add_sampler_options(pc)
    pc.add_argument("--max-new-tokens", "-n", type=int, default=None, metavar="N",
                    help="at most N new tokens per reply (default: until a stop token or the KV cache is full; "
                    "a small N leaves room in the cache for later turns)")
    add_quantized(pc)
    pc.set_defaults(func=cmd_chat)


def cmd_serve(args) -> int:
    """``fbjax serve BUNDLE``: an OpenAI-compatible HTTP server (:mod:`fbjax.serving.server`) until Ctrl-C."""
    if not is_bundle(args.model):
        raise SystemExit(f"fbjax serve: {not_a_bundle('serve', args.model)}")
    if args.slots < 1:
        raise SystemExit(f"fbjax serve: --slots must be at least 1, got {args.slots}")
    if args.prompt_steps is not None and args.prompt_steps < 0:
        raise SystemExit(f"fbjax serve: --prompt-steps must be at least 0, got {args.prompt_steps}")
    from .serving.server import serve  # starlette and uvicorn: pip install 'fbjax[serve]'

    print(f"fbjax serve: loading {args.model} and compiling for {args.slots} slots...", file=sys.stderr, flush=True)
    serve(args.model, host=args.host, port=args.port, slots=args.slots, model_id=args.model_id,
          prompt_steps=args.prompt_steps, quantized=args.quantized)
    return 0


def add_serve_parser(sub, add_quantized) -> None:
    """Register ``fbjax serve``."""
    ps = sub.add_parser(
        "serve", help="an OpenAI-compatible HTTP server for an LLM bundle (continuous batching)",
        description="Serve a .litertlm or MediaPipe LLM .task bundle over HTTP with OpenAI's API: GET /v1/models, "
        "POST /v1/chat/completions (messages through the bundle's chat template), POST /v1/completions (the prompt "
        "as given), streamed as server-sent events with \"stream\": true. Concurrent requests share decode steps "
        "(continuous batching over --slots rows of the KV cache). The model id is the bundle's file name without "
        "its extension. Needs pip install 'fbjax[serve]' (Starlette and uvicorn). Ctrl-C stops it.",
        epilog="Example:\n  fbjax serve tests/data/llm_bundles/llama_hf_chat.litertlm --port 8000\n"
        "  curl http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \\\n"
        "       -d '{\"model\": \"llama_hf_chat\", \"prompt\": \"Hello there\", \"max_tokens\": 8}'",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ps.add_argument("model", help="a .litertlm or MediaPipe LLM .task bundle")
    ps.add_argument("--host", default="127.0.0.1",
                    help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0: every interface)")
    ps.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    ps.add_argument("--slots", type=int, default=8, metavar="N",
                    help="requests decoded together, one KV-cache row each (default 8); more wait for a free slot")
    ps.add_argument("--prompt-steps", type=int, default=None, metavar="N",
                    help="prompts of at most N tokens are fed through the decode steps beside the other requests "
                    "instead of a prefill call padded to the prefill signature's length (default: a quarter of "
                    "that length; 0: prefill every prompt)")
    ps.add_argument("--model-id", default=None, metavar="ID",
                    help="the model id clients send (default: the bundle's file name without its extension)")
    add_quantized(ps)
    ps.set_defaults(func=cmd_serve)


def add_sampler_options(parser, bundle_only: bool = False) -> None:
    """--temperature/--top-k/--top-p/--seed, default: the bundle's sampler."""
    parser.add_argument("--temperature", type=float, default=None,
                        help="sampling temperature (default: the bundle's; a .tflite: 0, greedy)")
    parser.add_argument("--top-k", type=int, default=None, metavar="K",
                        help="sample among the K best tokens (1: greedy; default: the bundle's)")
    parser.add_argument("--top-p", type=float, default=None, metavar="P",
                        help="bundles: sample from the smallest set of tokens whose probability reaches P")
    parser.add_argument("--seed", type=int, default=None, help="PRNG seed for sampling (default: the bundle's, a "
                        ".tflite: 0)")
