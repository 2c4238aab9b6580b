"""The LLM-bundle parts of the ``fbjax`` command line (``.litertlm``, MediaPipe LLM ``.task``).

    fbjax inspect BUNDLE
    fbjax generate BUNDLE --prompt "..." [--no-template] [--temperature T --top-k K --top-p P --seed S]
    fbjax chat BUNDLE
"""

from __future__ import annotations

import sys
import time

from .formats.llm_bundle import bundle_kind

__all__ = ["is_bundle", "inspect_bundle", "generate_bundle", "cmd_chat", "add_chat_parser"]


def is_bundle(path) -> bool:
    """Whether ``path`` is a ``.litertlm`` or LLM ``.task`` bundle (from its bytes)."""
    try:
        return path is not None and bundle_kind(path) is not None
    except OSError:
        return False


def _token_text(bundle, ids) -> str:
    return ", ".join(f"{i} {bundle.tokenizer.piece(i)!r}" for i in ids)


def inspect_bundle(path) -> int:
    """Print a bundle's sections, model type, tokenizer, tokens, templates, sampler and signatures."""
    from . import load

    b = load(path)
    f = b.file
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
    b = load(args.model, quantized=args.quantized)
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
    return 0


def cmd_chat(args) -> int:
    """``fbjax chat BUNDLE``: an interactive chat through the bundle's chat template, keeping the KV cache."""
    from . import load
    from .errors import InputError

    b = load(args.model, quantized=args.quantized)
    chat = b.chat(**_sampler_kw(args))
    print(f"chatting with {args.model} ({b.capacity}-position KV cache); an empty line or Ctrl-D ends, "
          "/reset starts over")
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
            print(f"\n(fbjax chat: {e}; /reset starts a new conversation)")
            continue
        print()


def add_chat_parser(sub, add_quantized) -> None:
    """Register ``fbjax chat``."""
    pc = sub.add_parser("chat", help="interactive chat with an LLM bundle (.litertlm or LLM .task)",
                        description="Talk to a bundle's model through its chat template; the KV cache persists "
                        "between turns. An empty line or Ctrl-D ends; /reset starts a new conversation.")
    pc.add_argument("model", help="a .litertlm or MediaPipe LLM .task bundle")
    add_sampler_options(pc)
    pc.add_argument("--max-new-tokens", "-n", type=int, default=None, metavar="N",
                    help="at most N new tokens per reply (default: until a stop token or the KV cache is full)")
    add_quantized(pc)
    pc.set_defaults(func=cmd_chat)


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
