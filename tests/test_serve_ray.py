"""The Ray Serve recipe ``examples/ray_serve.py`` (issue 37 item 4): a local Ray instance (1 CPU), one replica
of fbjax's OpenAI-compatible app behind Ray's HTTP proxy, one request through it with the official ``openai``
client: the text equals the LiteRT-LM runtime's recorded reply (tests/data/llm_bundles/runtime_text.json).

Marked slow (``nox -s slow``, ``pytest -m slow``): starting Ray and Serve's controller, proxy and replica takes
longer than the ~30 s a default-run test may (measured: see the test's docstring)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import openai
import pytest

from helpers import ray_with_example

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "llm_bundles"
REC = json.loads((DATA / "runtime_text.json").read_text())["bundles"]["llama_hf_chat.litertlm"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_serve_example():
    """examples/ray_serve.py imported, on a local Ray cluster of one CPU; Serve and Ray shut down after."""
    from ray import serve

    with ray_with_example("ray_serve.py", num_cpus=1) as mod:
        try:
            yield mod
        finally:
            serve.shutdown()


@pytest.mark.slow
def test_ray_serve_replica_answers_as_the_runtime(ray_serve_example):
    """One replica (the whole 1-CPU instance), a chat request and a streamed completion through Ray's router:
    the texts equal the runtime's recorded chat reply and session text."""
    url = ray_serve_example.run(ray_serve_example.build(str(DATA / "llama_hf_chat.litertlm"), replicas=1, slots=4,
                                                        num_cpus=1), port=_free_port())
    c = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)
    assert [m.id for m in c.models.list().data] == ["llama_hf_chat"]
    turn = REC["chat"][0]
    r = c.chat.completions.create(model="llama_hf_chat", messages=[{"role": "user", "content": turn["user"]}])
    assert r.choices[0].message.content == turn["reply"]["content"][0]["text"]
    p = "Hello there"
    text = "".join(ch.choices[0].text for ch in c.completions.create(model="llama_hf_chat", prompt=p, stream=True))
    assert text == "".join(REC["session_no_template"][p])
    with pytest.raises(openai.NotFoundError, match="serves 'llama_hf_chat'"):
        c.completions.create(model="other", prompt="a")
