"""A fine-tuned realistic-size bundle, saved by fbjax, run by the LiteRT-LM runtime (issue 34 item 7).

    python benchmarks/lora_step.py BUNDLE --full --steps 2 --save TUNED.litertlm     # fbjax: tune and save
    python benchmarks/tuned_in_runtime.py BUNDLE TUNED.litertlm [--runtime-python /work/genenv-llm/bin/python]
        [--tokens 32] [--json OUT]

For the original and the tuned bundle: the runtime's greedy text of ``llm_runtime_side.TEXT_PROMPTS``
(``benchmarks/llm_runtime_side.py BUNDLE --text``, run by ``--runtime-python``: the generator environment
with ``litert-lm-api``) and fbjax's (``LlmBundle.generate``, no template, greedy, ``--tokens`` new tokens).
Reports, per prompt, whether the runtime ran the tuned file, whether its text changed with the tuning, and
how many leading pieces of fbjax's text equal the runtime's (the runtime decodes pieces, not ids: fbjax's
text is split at the runtime's piece boundaries). For int8/int4 bundles fbjax's default mode follows
LiteRT's builtin kernels and the runtime runs XNNPACK's, so their texts part after a few tokens (see the
README's real-size notes); for a float bundle they are the same text.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def runtime_texts(python: str, bundle: str, tokens: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "text.json")
        p = subprocess.run([python, os.path.join(HERE, "llm_runtime_side.py"), bundle, "--text", out,
                            "--text-tokens", str(tokens)], capture_output=True, text=True)
        if p.returncode != 0:
            return {"error": p.stderr[-2000:]}
        with open(out) as f:
            d = json.load(f)
        return d.get(os.path.basename(bundle), d)  # (the file maps each bundle's name to its record)


def agreeing_pieces(pieces: list, text: str) -> int:
    """How many of the runtime's leading ``pieces`` fbjax's ``text`` reproduces, in order."""
    k, pos = 0, 0
    for p in pieces:
        if not text.startswith(p, pos):
            break
        pos += len(p)
        k += 1
    return k


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("original")
    ap.add_argument("tuned")
    ap.add_argument("--runtime-python", default="/work/genenv-llm/bin/python")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import fbjax

    res = {"original": os.path.basename(args.original), "tuned": os.path.basename(args.tuned), "prompts": {}}
    rt = {k: runtime_texts(args.runtime_python, p, args.tokens) for k, p in (("original", args.original),
                                                                           ("tuned", args.tuned))}
    for k in rt:
        if "error" in rt[k]:
            res[f"runtime_{k}_error"] = rt[k]["error"]
    fb = {}
    for k, path in (("original", args.original), ("tuned", args.tuned)):
        b = fbjax.load(path)
        fb[k] = {p: b.generate(p, max_new_tokens=args.tokens, template=False) for p in rt["tuned"]["prompts"]} \
            if "prompts" in rt["tuned"] else {}
    for p in rt["tuned"].get("prompts", {}):
        t_pieces = rt["tuned"]["prompts"][p]["pieces"]
        o_pieces = rt["original"].get("prompts", {}).get(p, {}).get("pieces", [])
        res["prompts"][p] = {
            "runtime_tuned_text": "".join(t_pieces),
            "runtime_text_changed_by_tuning": t_pieces != o_pieces,
            "fbjax_tuned_text": fb["tuned"][p],
            "pieces": len(t_pieces),
            "fbjax_agrees_with_runtime_for_pieces": agreeing_pieces(t_pieces, fb["tuned"][p]),
            "on_the_original_bundle": agreeing_pieces(o_pieces, fb["original"][p]),
        }
    print(json.dumps(res, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
