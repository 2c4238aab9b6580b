"""``fbjax serve``: the OpenAI-compatible server and its continuous batching (issue 37 items 1-3).

The server runs on a free localhost port in a background thread (:class:`fbjax.serving.server.ServerThread`,
uvicorn) and the official ``openai`` client talks to it. The oracle is the LiteRT-LM runtime's recorded text
(``tests/data/llm_bundles/runtime_text.json``: litert-lm 0.18.1, greedy); where no recording matches the
request (a capped ``max_tokens``), ``bundle.generate`` alone, which tests/test_llm_bundles.py ties to the runtime.
The 8-client throughput is measured by ``benchmarks/serve_throughput.py``, not here.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

import fbjax
from fbjax.cli import build_parser
from fbjax.serving import Engine
from fbjax.serving.server import ServerThread

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "llm_bundles"
RECORD = json.loads((DATA / "runtime_text.json").read_text())
NAME = "llama_hf_chat.litertlm"  # a Jinja chat template, a recorded chat turn, a prompt ending on a stop token
REC = RECORD["bundles"][NAME]
PROMPTS = RECORD["prompts"]


def runtime_text(p: str) -> str:
    return "".join(REC["session_no_template"][p])


@pytest.fixture(scope="module")
def bundle():
    return fbjax.load(DATA / NAME)


@pytest.fixture(scope="module")
def server(bundle):
    with ServerThread(bundle, port=0, slots=8) as s:
        yield s


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)


@pytest.fixture
def slow_steps(server, monkeypatch):
    """Each decode step takes at least ``delay`` seconds longer (so that clients overlap, and a client can leave
    mid-stream); records the most slots in use at any step."""
    eng = server.engine
    seen = {"peak": 0}
    step = eng._decode_step

    def slow(delay):
        def patched():
            seen["peak"] = max(seen["peak"], sum(s is not None for s in eng._rows))
            time.sleep(delay)
            step()
        monkeypatch.setattr(eng, "_decode_step", patched)
        return seen
    return slow


def test_models(server, client):
    assert [m.id for m in client.models.list().data] == ["llama_hf_chat"]
    assert server.model_id == "llama_hf_chat"


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_completions_equal_runtime(client, bundle, stream):
    """Every recorded prompt (no template: /v1/completions takes the prompt as given): the text equals the
    runtime's; streamed, each chunk is one of the runtime's pieces; usage counts the ids fed and generated;
    prompt 1 ends on the stop token (finish_reason stop), the others fill the 64-position cache (length)."""
    for p in PROMPTS:
        g = bundle.generate(p, template=False, return_tokens=True)
        if not stream:
            r = client.completions.create(model="llama_hf_chat", prompt=p)
            text, finish, usage = r.choices[0].text, r.choices[0].finish_reason, r.usage
        else:
            pieces, finish, usage = [], None, None
            for ch in client.completions.create(model="llama_hf_chat", prompt=p, stream=True,
                                                stream_options={"include_usage": True}):
                if ch.choices:
                    pieces.append(ch.choices[0].text)
                    finish = ch.choices[0].finish_reason or finish
                if ch.usage:
                    usage = ch.usage
            assert [x for x in pieces if x] == REC["session_no_template"][p], p
            text = "".join(pieces)
        assert text == runtime_text(p), p
        assert finish == ("stop" if g.stopped == "stop_token" else "length"), p
        assert (usage.prompt_tokens, usage.completion_tokens) == (len(g.prompt_tokens), len(g.tokens)), p
        assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert "stop" in {("stop" if bundle.generate(p, template=False, return_tokens=True).stopped == "stop_token"
                       else "length") for p in PROMPTS}  # the stop-token case is among them


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_chat_equals_runtime(client, stream):
    """A chat turn through the bundle's Jinja template equals the runtime's Conversation reply (the whole reply,
    and one cut at 6 tokens, the runtime's max_output_tokens in chat_short)."""
    for turn, cap in ((REC["chat"][0], None), (REC["chat_short"][0], 6)):
        msgs = [{"role": "user", "content": turn["user"]}]
        want = turn["reply"]["content"][0]["text"]
        if not stream:
            r = client.chat.completions.create(model="llama_hf_chat", messages=msgs, max_tokens=cap)
            assert r.choices[0].message.role == "assistant"
            text = r.choices[0].message.content
        else:
            text = "".join(ch.choices[0].delta.content or "" for ch in client.chat.completions.create(
                model="llama_hf_chat", messages=msgs, max_tokens=cap, stream=True))
        assert text == want


def test_chat_through_prompt_templates(bundle):
    """A bundle without a Jinja chat template (gemma_sp.task: prompt templates only): a chat completion equals
    the bundle's own chat turn (which renders the same messages with the prompt templates)."""
    b = fbjax.load(DATA / "gemma_sp.task")
    assert b.chat_template is None and b.prompt_templates
    with ServerThread(b, port=0, slots=2) as s:
        c = openai.OpenAI(base_url=s.url, api_key="unused", max_retries=0, timeout=60)
        r = c.chat.completions.create(model="gemma_sp", max_tokens=10,
                                      messages=[{"role": "user", "content": PROMPTS[0]}])
        assert r.choices[0].message.content == b.chat().send(PROMPTS[0], max_new_tokens=10)
        assert r.usage.completion_tokens == 10 and r.choices[0].finish_reason == "length"


def test_eight_concurrent_streams_get_their_solo_text(server, bundle, slow_steps):
    """8 clients stream at once (threads), with different prompts and lengths, so they join and leave the
    running batch at different steps: each gets the text it gets alone, and the steps were shared."""
    seen = slow_steps(0.01)
    jobs = [(p, None) for p in PROMPTS] + [(p, k) for p, k in zip(PROMPTS[:3], (3, 11, 20))] + [("chat", None)]
    want = [runtime_text(p) if k is None else bundle.generate(p, template=False, max_new_tokens=k)
            for p, k in jobs[:-1]] + [REC["chat"][0]["reply"]["content"][0]["text"]]
    got = [None] * len(jobs)
    barrier = threading.Barrier(len(jobs))

    def run(i, p, k):
        c = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
        barrier.wait()
        if p == "chat":
            s = c.chat.completions.create(model="llama_hf_chat", stream=True,
                                          messages=[{"role": "user", "content": REC["chat"][0]["user"]}])
            got[i] = "".join(ch.choices[0].delta.content or "" for ch in s)
        else:
            s = c.completions.create(model="llama_hf_chat", prompt=p, max_tokens=k, stream=True)
            got[i] = "".join(ch.choices[0].text for ch in s)

    steps0 = server.engine.steps
    threads = [threading.Thread(target=run, args=(i, p, k)) for i, (p, k) in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert got == want
    # the completions' new tokens alone (the chat adds more): one at a time would take at least that many steps
    tokens = sum(k or len(bundle.generate(p, template=False, return_tokens=True).tokens) for p, k in jobs[:-1])
    assert seen["peak"] >= 4, seen  # requests really ran side by side
    assert server.engine.steps - steps0 < tokens / 2, (server.engine.steps - steps0, tokens)
    assert server.engine.slots_in_use == 0


def test_client_leaving_mid_stream_frees_its_slot(server, slow_steps):
    """A streaming client that closes its connection after two chunks: its request is cancelled, the slot
    freed (slots in use back to 0, through GET /health too) long before the 62 tokens it asked for."""
    slow_steps(0.05)  # 62 tokens would take >= 3 s
    made = []
    submit = server.engine.submit

    def spy(*a, **kw):
        made.append(submit(*a, **kw))
        return made[-1]
    server.engine.submit = spy
    try:
        body = {"model": "llama_hf_chat", "prompt": "a", "stream": True}
        with httpx.stream("POST", server.url + "/completions", json=body, timeout=30) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            chunks = [next(x for x in lines if x.startswith("data:")) for _ in range(2)]
        assert all(json.loads(c[5:])["choices"][0]["text"] is not None for c in chunks)
        t0 = time.monotonic()
        while server.engine.slots_in_use and time.monotonic() - t0 < 2:
            time.sleep(0.02)
        assert server.engine.slots_in_use == 0
        assert made[0].done and len(made[0].tokens) < 30, len(made[0].tokens)
        health = httpx.get(server.url.removesuffix("/v1") + "/health").json()
        assert health["slots_in_use"] == 0 and health["slots"] == 8
    finally:
        del server.engine.submit


BAD = [  # (what, body (a str: sent as is), status, param, code, words the message holds)
    ("malformed JSON", '{"model": "llama_hf_chat", "prompt": "a"', 400, None, "invalid_json", "not valid JSON"),
    ("not an object", "[1, 2]", 400, None, "invalid_json", "JSON object"),
    ("unknown model", {"model": "gpt-9", "prompt": "a"}, 404, "model", "model_not_found", "serves 'llama_hf_chat'"),
    ("no model", {"prompt": "a"}, 400, "model", "missing_required_parameter", "required"),
    ("prompt past the KV cache", {"model": "llama_hf_chat", "prompt": "a " * 100}, 400, "prompt",
     "context_length_exceeded", "holds 64 positions: shorten the prompt"),
    ("max_tokens past the KV cache", {"model": "llama_hf_chat", "prompt": "a", "max_tokens": 63}, 400, "max_tokens",
     "context_length_exceeded", "set max_tokens <= 62"),
    ("max_tokens 0", {"model": "llama_hf_chat", "prompt": "a", "max_tokens": 0}, 400, "max_tokens", "invalid_value",
     ">= 1"),
    ("unsupported field", {"model": "llama_hf_chat", "prompt": "a", "logit_bias": {"5": 1}}, 422, "logit_bias",
     "unsupported_parameter", "leave it out"),
    ("n > 1", {"model": "llama_hf_chat", "prompt": "a", "n": 2}, 422, "n", "unsupported_parameter", "only 1"),
    ("several prompts", {"model": "llama_hf_chat", "prompt": ["a", "b"]}, 422, "prompt", "unsupported_parameter",
     "one string per request"),
    ("wrong type", {"model": "llama_hf_chat", "prompt": "a", "temperature": "hot"}, 400, "temperature",
     "invalid_type", "must be a number"),
    ("top_p out of range", {"model": "llama_hf_chat", "prompt": "a", "top_p": 0}, 400, "top_p", "invalid_value",
     "> 0"),
    ("stop not strings", {"model": "llama_hf_chat", "prompt": "a", "stop": [1]}, 400, "stop", "invalid_type",
     "list of at most 4 strings"),
]
BAD_CHAT = [
    ("no messages", {"model": "llama_hf_chat", "messages": []}, 400, "messages", "invalid_type", "non-empty list"),
    ("tool role", {"model": "llama_hf_chat", "messages": [{"role": "tool", "content": "x"}]}, 422, "messages[0]",
     "unsupported_parameter", "use system, user or assistant"),
    ("image part", {"model": "llama_hf_chat", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]}, 422, "messages[0]", "unsupported_parameter",
     "only text content parts"),
    ("tools", {"model": "llama_hf_chat", "messages": [{"role": "user", "content": "x"}], "tools": []}, 422, "tools",
     "unsupported_parameter", "leave it out"),
    ("conversation past the KV cache", {"model": "llama_hf_chat", "messages": [{"role": "user", "content": "a " * 60}]},
     400, "messages", "context_length_exceeded", "shorten the messages"),
    ("max_completion_tokens past it", {"model": "llama_hf_chat", "messages": [{"role": "user", "content": "Hi"}],
                                       "max_completion_tokens": 60}, 400, "max_completion_tokens",
     "context_length_exceeded", "set max_completion_tokens <="),
]


@pytest.mark.parametrize("path,case", [("/completions", c) for c in BAD] + [("/chat/completions", c) for c in BAD_CHAT],
                         ids=[c[0] for c in BAD] + [c[0] for c in BAD_CHAT])
def test_bad_request_answered_and_server_still_serves(server, client, path, case):
    """Each bad request gets an OpenAI-shaped error (status, param, code, a message saying what to change);
    a good request right after still gets the runtime's text, and no slot is left held."""
    _, body, status, param, code, words = case
    content = body if isinstance(body, str) else json.dumps(body)
    r = httpx.post(server.url + path, content=content, headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert (err["param"], err["code"], err["type"]) == (param, code, "invalid_request_error")
    assert words in err["message"], err["message"]
    assert server.engine.slots_in_use == 0 and server.engine.waiting == 0
    p = PROMPTS[0]
    assert client.completions.create(model="llama_hf_chat", prompt=p).choices[0].text == runtime_text(p)


def test_openai_client_raises_on_errors(client):
    """The openai client maps the bodies to its exceptions (404 NotFoundError, 422 UnprocessableEntityError)
    with the server's message."""
    with pytest.raises(openai.NotFoundError, match="serves 'llama_hf_chat'"):
        client.completions.create(model="other", prompt="a")
    with pytest.raises(openai.UnprocessableEntityError, match="logprobs"):
        client.completions.create(model="llama_hf_chat", prompt="a", logprobs=2)
    with pytest.raises(openai.BadRequestError, match="KV cache"):
        client.chat.completions.create(model="llama_hf_chat", messages=[{"role": "user", "content": "a " * 60}])


def test_unknown_paths_are_openai_errors(server):
    r = httpx.get(server.url + "/embeddings")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = httpx.get(server.url + "/models/other")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = httpx.get(server.url + "/completions")
    assert r.status_code == 405 and "error" in r.json()


def test_sampling_settings(client, bundle, server):
    """seed makes sampled text reproducible (and another seed changes it over 30 tokens of a random-weight
    model); temperature 0 and top_k 1 are greedy; a sampled and a greedy request in one batch: the greedy
    one still gets its solo text; stop strings cut the text before the first match (finish_reason stop)."""
    p = PROMPTS[3]
    kw = dict(model="llama_hf_chat", prompt=p, max_tokens=30, temperature=1.0)
    a = client.completions.create(seed=7, **kw).choices[0].text
    assert client.completions.create(seed=7, **kw).choices[0].text == a
    assert client.completions.create(seed=8, **kw).choices[0].text != a
    greedy = runtime_text(p)
    assert greedy.startswith(client.completions.create(model="llama_hf_chat", prompt=p, max_tokens=30,
                                                       temperature=0).choices[0].text)
    assert client.completions.create(model="llama_hf_chat", prompt=p, temperature=1.5,
                                     extra_body={"top_k": 1}).choices[0].text == greedy
    # mixed batch (engine level: two requests submitted together)
    eng = server.engine
    ids = bundle.prompt_tokens(p, template=False)
    rs = [eng.submit(ids, temperature=1.0, top_p=0.9, seed=1), eng.submit(ids), eng.submit(ids, temperature=0.7)]
    assert rs[1].result(60) == greedy and all(r.result(60) for r in rs)
    # stop strings: the greedy text cut before the first occurrence of its 10th..13th characters
    stop = greedy[10:13]
    for stream in (False, True):
        if stream:
            chunks = list(client.completions.create(model="llama_hf_chat", prompt=p, stop=[stop, "zzzz"],
                                                    stream=True))
            text = "".join(c.choices[0].text for c in chunks)
            finish = chunks[-1].choices[0].finish_reason
        else:
            r = client.completions.create(model="llama_hf_chat", prompt=p, stop=stop)
            text, finish = r.choices[0].text, r.choices[0].finish_reason
        assert text == greedy[:greedy.index(stop)] and finish == "stop"


def test_engine_refuses_and_caps(bundle):
    """The engine's own checks (fbjax.InputError with what to change), and max_new_tokens / a full cache."""
    e = Engine(bundle, slots=2).start()
    try:
        with pytest.raises(fbjax.InputError, match="shorten the prompt"):
            e.submit([1] * 65)
        with pytest.raises(fbjax.InputError, match="between 1 and 62"):
            e.submit([1, 5], max_new_tokens=63)
        with pytest.raises(fbjax.InputError, match="empty"):
            e.submit([])
        p = PROMPTS[0]
        g = bundle.generate(p, template=False, return_tokens=True)
        r = e.submit(bundle.prompt_tokens(p, template=False), max_new_tokens=5)
        assert r.result(60) == bundle.generate(p, template=False, max_new_tokens=5) and r.finish_reason == "length"
        assert r.tokens == g.tokens[:5]
        r = e.submit(bundle.prompt_tokens(p, template=False))
        assert "".join(r) == runtime_text(p) and r.tokens == g.tokens and r.finish_reason == "length"
        assert len(r.prompt_ids) + len(r.tokens) == 64  # the cache is full
    finally:
        e.close()
    with pytest.raises(fbjax.InputError, match="closed"):
        e.submit([1, 2])


def test_long_prompt_prefilled_in_chunks_while_others_decode(bundle):
    """A prompt longer than the prefill length (16) is prefilled chunk by chunk between decode steps of a
    running request; both texts equal their solo texts."""
    e = Engine(bundle, slots=2).start()
    try:
        long_p = PROMPTS[3]  # 26 ids: two prefill chunks
        assert len(bundle.prompt_tokens(long_p, template=False)) > bundle._runner.n + 1
        a = e.submit(bundle.prompt_tokens(PROMPTS[2], template=False))
        while not a.tokens:
            time.sleep(0.001)
        b = e.submit(bundle.prompt_tokens(long_p, template=False))
        assert a.result(60) == runtime_text(PROMPTS[2]) and b.result(60) == runtime_text(long_p)
    finally:
        e.close()


@pytest.mark.parametrize("name", sorted(RECORD["bundles"]))
def test_short_prompts_fed_through_decode_steps(name):
    """prompt_steps: prompts fed one id per decode step, in their own rows, while other rows decode (3 slots, 4
    requests at once: one waits for a slot), give the text of the prefill path (LlmBundle.generate, which the
    tests of test_llm_bundle tie to the LiteRT-LM runtime; for this module's bundle, the runtime's recorded
    text itself), with no prefill call; prompt_steps=0 prefills every prompt."""
    b = fbjax.load(DATA / name)
    ids = {p: b.prompt_tokens(p, template=False) for p in PROMPTS}
    with Engine(b, slots=3, prompt_steps=64) as e:
        reqs = {p: e.submit(ids[p]) for p in PROMPTS}
        got = {p: r.result(120) for p, r in reqs.items()}
        assert e.stats["prefill_chunks"] == 0
        assert e.stats["prompt_steps"] == sum(len(i) - 1 for i in ids.values())
    for p in PROMPTS:
        assert got[p] == b.generate(p, template=False), p
        if name == NAME:
            assert got[p] == runtime_text(p), p
    with Engine(b, slots=1, prompt_steps=0) as e:
        assert e.submit(ids[PROMPTS[2]]).result(60) == got[PROMPTS[2]]
        assert e.stats["prompt_steps"] == 0 and e.stats["prefill_chunks"] == 1  # the start token, prefilled
    with pytest.raises(fbjax.InputError, match="prompt_steps"):
        Engine(b, prompt_steps=-1)


def test_cli_serve_arguments():
    args = build_parser().parse_args(["serve", str(DATA / NAME), "--port", "9000", "--slots", "4",
                                      "--host", "0.0.0.0"])
    assert (args.command, args.port, args.slots, args.host, args.model_id) == ("serve", 9000, 4, "0.0.0.0", None)
    args = build_parser().parse_args(["serve", str(DATA / NAME)])
    assert (args.host, args.port, args.slots, args.prompt_steps) == ("127.0.0.1", 8000, 8, None)
    assert build_parser().parse_args(["serve", str(DATA / NAME), "--prompt-steps", "0"]).prompt_steps == 0


def test_cli_serve_refuses_a_non_bundle(capsys):
    with pytest.raises(SystemExit, match="needs a .litertlm or MediaPipe LLM .task bundle"):
        fbjax.cli.main(["serve", str(ROOT / "tests" / "data" / "llm" / "llama_f32.tflite")])
    with pytest.raises(SystemExit, match="--prompt-steps must be at least 0, got -1"):
        fbjax.cli.main(["serve", str(DATA / NAME), "--prompt-steps", "-1"])


def test_readme_curl_runs_as_written(server):
    """The README's curl commands, against this test's server (its port for the README's 8000): each answers
    200 with the JSON or event stream the README describes."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Serving"):]
    cmds = [c for c in re.findall(r"^(curl .*?)(?<!\\)$", section.replace("\\\n", " "), re.M)]
    assert len(cmds) >= 2, cmds
    for c in cmds:
        argv = shlex.split(c.replace("127.0.0.1:8000", f"127.0.0.1:{server.port}"))
        out = subprocess.run(argv + ["-sS", "--fail-with-body"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, (c, out.stdout, out.stderr)
        if '"stream": true' in c:
            assert out.stdout.rstrip().endswith("data: [DONE]")
        else:
            assert json.loads(out.stdout)["object"] in ("list", "text_completion", "chat.completion")
