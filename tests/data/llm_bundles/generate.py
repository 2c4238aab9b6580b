"""Pack the LLM bundle fixtures of tests/test_llm_bundles.py and record the LiteRT-LM runtime's text.

Run in a separate generator environment (the tests need none of these packages)::

    python3 -m venv /work/genenv-llm
    /work/genenv-llm/bin/pip install litert-lm-api litert-lm-builder litert-lm sentencepiece tokenizers
    # litert-lm-api / litert-lm-builder / litert-lm 0.18.1, sentencepiece 0.2.3, tokenizers 0.23.3
    /work/genenv-llm/bin/python tests/data/llm_bundles/generate.py [BUNDLE ...]   # default: every bundle

Models: the float litert-torch exports of tests/data/llm (``llama_f32.tflite``:
default KV layout ``[1, 64, 2, 32]`` and no mask input, so the runtime needs
ExecutorMetadata's ``sequence_axis: 1`` to see its 64-entry cache;
``gemma_f32.tflite``: mask input, transposed KV layout), vocabulary 256.

Tokenizers, both trained here on :data:`CORPUS` (a fixed text) with exactly
256 entries, so they fit the models' logits:

* ``sp.model``: a SentencePiece BPE model (``sentencepiece`` trainer;
  ``<unk>`` 0, ``<s>`` 1, ``</s>`` 2, user-defined ``<start_of_turn>`` 3 and
  ``<end_of_turn>`` 4; identity normalisation, which keeps the model small);
* ``tokenizer.json``: a HuggingFace BPE tokenizer (``tokenizers``; Metaspace
  pre-tokenizer and decoder, the same special tokens at 0-4).

Bundles (``litert_lm_builder.LitertLmFileBuilder``; the ``.task`` a stored,
uncompressed zip written with :mod:`zipfile`):

* ``llama_sp.litertlm``: llama + SentencePiece + LlmMetadata (start ``<s>``,
  stops ``</s>`` and :data:`LLAMA_STOP`, no templates) + ExecutorMetadata
  (every KV cache buffer ``sequence_axis: 1``);
* ``llama_hf_chat.litertlm``: llama + HF tokenizer + LlmMetadata with prompt
  templates and a Jinja chat template + ExecutorMetadata;
* ``gemma_hf.litertlm``: gemma + HF tokenizer + LlmMetadata with prompt
  templates (no ExecutorMetadata: the mask gives the capacity);
* ``gemma_sp.task``: gemma + SentencePiece + LlmMetadata with prompt
  templates, as MediaPipe's LLM ``.task`` (``TF_LITE_PREFILL_DECODE``,
  ``TOKENIZER_MODEL``, ``METADATA``).
* ``llama_q8_sp.litertlm``: ``llama_q8.tflite`` (litert-torch
  ``dynamic_int8``: int8 weights, hybrid FULLY_CONNECTED) packed like
  ``llama_sp``. The runtime runs it with XNNPACK's int8 kernels, not TFLite's
  builtin hybrid kernels that fbjax's exact mode reproduces: its text is
  recorded for the comparison tests/test_llm_bundles.py states.

``runtime_text.json`` holds, per bundle, what ``litert_lm`` 0.18.1 (CPU
backend, XNNPACK, greedy: the top-p sampler with ``top_k=1``) answers:
``engine.tokenize`` of each prompt (``tokens``), the streamed text of a
session with and without the prompt template (``session`` /
``session_no_template``: ``run_prefill([prompt])`` then
``run_decode_async()``, the chunks kept as a list), and for chat bundles a
two-turn ``Conversation`` (``send_message``; the second turn no longer fits the cache) and a
three-turn one with ``max_output_tokens=6`` (``chat_short``). ``tuned`` records the runtime
loading a bundle written back by fbjax (``python generate.py --tuned
PATH``).
"""

from __future__ import annotations

import io
import json
import os
import sys
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
LLM = os.path.join(os.path.dirname(HERE), "llm")

PROMPTS = ["Hello there", "The quick brown fox jumps over the lazy dog", "a",
           "Models run on phones and in the cloud, and people tune them for their own tasks every day."]
CHAT = ["Hi! Who are you?", "Tell me more."]
#: a three-turn conversation whose replies are cut at CHAT_SHORT_TOKENS tokens, so that every turn fits the cache
CHAT_SHORT, CHAT_SHORT_TOKENS = ["Hi!", "Who?", "Ok."], 6
SPECIALS = ["<unk>", "<s>", "</s>", "<start_of_turn>", "<end_of_turn>"]
LLAMA_STOP = 7  # a second stop token id (ids: the tokenizers' 8th entry)

_WORDS = ("the a model runs on phones and in cloud people tune them for their own tasks every day quick brown "
          "fox jumps over lazy dog hello there who are you tell me more about this small network that reads "
          "text writes answers learns from data with weights stored in files bundles hold tokenizers metadata "
          "templates chat user assistant turn start end of token prompt sample greedy temperature").split()
# (the runtime's Conversation hands the template each message's content as a list of {"type", "text"} parts)
PROMPT_TEMPLATES = 'user { prefix: "<start_of_turn>user\\n" suffix: "<end_of_turn>\\n" } ' \
                   'model { prefix: "<start_of_turn>model\\n" suffix: "<end_of_turn>\\n" }'
JINJA = ("{{ bos_token }}{% for message in messages %}<start_of_turn>{{ 'model' if message['role'] == 'assistant' "
         "else message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}{% else %}"
         "{% for part in message['content'] %}{{ part['text'] }}{% endfor %}{% endif %}<end_of_turn>\n{% endfor %}"
         "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


def corpus() -> str:
    """A fixed text of 4000 pseudo-random sentences over :data:`_WORDS` (a linear congruential generator)."""
    state, lines = 12345, []
    for _ in range(4000):
        words = []
        for _ in range(4 + state % 9):
            state = (state * 1103515245 + 12345) % 2**31
            words.append(_WORDS[state % len(_WORDS)])
        lines.append(" ".join(words).capitalize() + ".")
    return "\n".join(lines + PROMPTS + CHAT) + "\n"


def train_sentencepiece(out: str) -> None:
    import sentencepiece as spm

    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(corpus())
    spm.SentencePieceTrainer.train(input=f.name, model_prefix=out, vocab_size=256, model_type="bpe",
                                   character_coverage=1.0, normalization_rule_name="identity", unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
                                   user_defined_symbols=SPECIALS[3:], hard_vocab_limit=True, minloglevel=2)
    os.unlink(f.name)


def train_hf(out: str) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=256, special_tokens=SPECIALS, show_progress=False)
    tok.train_from_iterator(corpus().splitlines(), trainer)
    assert tok.get_vocab_size() == 256, tok.get_vocab_size()
    tok.save(out)


def llm_metadata(path: str, *, templates: bool, stops=(2,)) -> None:
    from litert_lm_builder.runtime.proto import llm_metadata_pb2
    from google.protobuf import text_format

    msg = llm_metadata_pb2.LlmMetadata()
    msg.start_token.token_ids.ids.append(1)
    for s in stops:
        msg.stop_tokens.add().token_ids.ids.append(s)
    msg.max_num_tokens = 64
    msg.sampler_params.type = msg.sampler_params.TOP_P
    msg.sampler_params.k = 1
    msg.sampler_params.p = 0.95
    msg.sampler_params.temperature = 1.0
    msg.sampler_params.seed = 0
    if templates:
        text_format.Parse(PROMPT_TEMPLATES, msg.prompt_templates)
    msg.llm_model_type.generic_model.SetInParent()
    open(path, "wb").write(msg.SerializeToString())


def executor_metadata(path: str, tflite: str) -> None:
    from litert_lm_builder.runtime.proto import executor_metadata_pb2

    msg = executor_metadata_pb2.ExecutorMetadata()
    for i in range(2):  # both models have 2 layers
        for kv, t in (("k", 1), ("v", 2)):  # TYPE_GLOBAL_KEY_CACHE, TYPE_GLOBAL_VALUE_CACHE
            b = msg.llm_executor_metadata.state_buffers.add()
            name = f"kv_cache_{kv}_{i}"
            b.prefill_input_name = b.prefill_output_name = b.decode_input_name = b.decode_output_name = name
            b.type = t
            b.sequence_axis = 1
    open(path, "wb").write(msg.SerializeToString())


def build_litertlm(out: str, tflite: str, tokenizer: tuple, meta: str, exec_meta=None, jinja=None) -> None:
    import litert_lm_builder as lb

    b = lb.LitertLmFileBuilder()
    b.add_system_metadata(lb.Metadata(key="Authors", value="fbjax tests", dtype=lb.DType.STRING))
    b.add_tflite_model(tflite, lb.TfLiteModelType.PREFILL_DECODE)
    kind, path = tokenizer
    (b.add_sentencepiece_tokenizer if kind == "sp" else b.add_hf_tokenizer)(path)
    b.add_llm_metadata(meta, jinja_prompt_template_path=jinja, supports_thinking=False,
                       supports_function_calling=False)
    if exec_meta:
        b.add_executor_metadata(exec_meta)
    with open(out, "wb") as f:
        b.build(f, validate_metadata=True)


def build_task(out: str, tflite: str, sp_model: str, meta: str) -> None:
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as z:
        z.write(tflite, "TF_LITE_PREFILL_DECODE")
        z.write(sp_model, "TOKENIZER_MODEL")
        z.write(meta, "METADATA")


def run_runtime(bundle: str, chat: bool) -> dict:
    import litert_lm

    greedy = litert_lm.SamplerConfig(top_k=1, top_p=1.0, temperature=1.0, seed=0)
    rec = {"tokens": {}, "session": {}, "session_no_template": {}}
    with litert_lm.Engine(bundle, cache_dir=":nocache") as eng:
        for p in PROMPTS:
            rec["tokens"][p] = eng.tokenize(p)
            for key, tmpl in (("session", True), ("session_no_template", False)):
                with eng.create_session(apply_prompt_template=tmpl, sampler_config=greedy) as s:
                    s.run_prefill([p])
                    rec[key][p] = [r.texts[0] for r in s.run_decode_async()]
        if chat:
            with eng.create_conversation(sampler_config=greedy) as conv:
                rec["chat"] = []
                for m in CHAT:
                    reply = conv.send_message(m)
                    rec["chat"].append({"user": m, "reply": reply})
            with eng.create_conversation(sampler_config=greedy, max_output_tokens=CHAT_SHORT_TOKENS) as conv:
                rec["chat_short"] = []
                for m in CHAT_SHORT:
                    rec["chat_short"].append({"user": m, "reply": conv.send_message(m)})
    return rec


def main(only=()) -> None:
    work = tempfile.mkdtemp()
    sp, hf = os.path.join(work, "sp"), os.path.join(work, "tokenizer.json")
    train_sentencepiece(sp)
    train_hf(hf)
    llm_metadata(os.path.join(work, "plain.pb"), templates=False, stops=(2, LLAMA_STOP))
    llm_metadata(os.path.join(work, "tmpl.pb"), templates=True, stops=(2, 4))
    jinja = os.path.join(work, "chat.jinja")
    open(jinja, "w").write(JINJA)
    llama, gemma = os.path.join(LLM, "llama_f32.tflite"), os.path.join(LLM, "gemma_f32.tflite")
    executor_metadata(os.path.join(work, "exec.pb"), llama)
    bundles = {
        "llama_sp.litertlm": lambda o: build_litertlm(o, llama, ("sp", sp + ".model"), os.path.join(work, "plain.pb"),
                                                      os.path.join(work, "exec.pb")),
        "llama_hf_chat.litertlm": lambda o: build_litertlm(o, llama, ("hf", hf), os.path.join(work, "tmpl.pb"),
                                                           os.path.join(work, "exec.pb"), jinja),
        "gemma_hf.litertlm": lambda o: build_litertlm(o, gemma, ("hf", hf), os.path.join(work, "tmpl.pb")),
        "gemma_sp.task": lambda o: build_task(o, gemma, sp + ".model", os.path.join(work, "tmpl.pb")),
        "llama_q8_sp.litertlm": lambda o: build_litertlm(o, os.path.join(LLM, "llama_q8.tflite"), ("sp", sp + ".model"),
                                                         os.path.join(work, "plain.pb"), os.path.join(work, "exec.pb")),
    }
    old = os.path.join(HERE, "runtime_text.json")
    prev = json.load(open(old)) if os.path.exists(old) else {}
    record = {"litert_lm": _version("litert-lm-api"), "prompts": PROMPTS, "chat": CHAT,
              "bundles": dict(prev.get("bundles", {})) if only else {}}
    for name, make in bundles.items():
        if only and name not in only:
            continue
        out = os.path.join(HERE, name)
        make(out)
        record["bundles"][name] = run_runtime(out, chat=name == "llama_hf_chat.litertlm")
        print(name, os.path.getsize(out), json.dumps(record["bundles"][name]["session_no_template"])[:300], flush=True)
    for key in ("tuned", "tuned_task"):  # records of fbjax-written bundles (tuned() below) stay
        if key in prev:
            record[key] = prev[key]
    json.dump(record, open(old, "w"), indent=1, ensure_ascii=False)


def tuned(path: str) -> None:
    """Record the runtime's greedy text from a bundle fbjax wrote back: tests/test_llm_bundles.py's tuned
    gemma_hf.litertlm or gemma_sp.task (token embedding x 1.5; by PATH's extension), saved with
    ``python tests/test_llm_bundles.py --save-tuned PATH`` (fbjax's environment)."""
    import hashlib

    rec = json.load(open(os.path.join(HERE, "runtime_text.json")))
    out = run_runtime(path, chat=False)
    data = open(path, "rb").read()
    task = path.endswith(".task")
    rec["tuned_task" if task else "tuned"] = {
                    "bundle": os.path.basename(path), "source": "gemma_sp.task" if task else "gemma_hf.litertlm",
                    "size": len(data),
                    "sha256": hashlib.sha256(data).hexdigest(),
                    "session_no_template": out["session_no_template"], "tokens": out["tokens"]}
    json.dump(rec, open(os.path.join(HERE, "runtime_text.json"), "w"), indent=1, ensure_ascii=False)
    print(json.dumps(rec["tuned_task" if task else "tuned"])[:1000])


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--tuned"]:
        tuned(sys.argv[2])
    else:
        main(tuple(sys.argv[1:]))
