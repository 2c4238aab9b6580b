"""Generation over datasets (issue 37 item 7): Apache Beam's RunInference with
:class:`fbjax.beam.FbjaxLlmHandler` (DirectRunner) and the Ray Data recipe ``examples/ray_data_llm.py``
(a local Ray with one CPU) give each prompt the greedy text ``bundle.generate`` gives it alone.

Text equality is the check: each Beam or Ray batch runs ``LlmBundle.generate`` on its prompts as one
batch (rows vmapped), whose greedy tokens equal a lone prompt's when no logit lead is within the float
rounding a batch shape can change -- tests/test_llm_bundles.py's batch test shows it for these fixtures
(their top-1 lead stays far above that rounding, tests/test_llm.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import fbjax
from fbjax.errors import InputError

from helpers import ray_with_example

ROOT = Path(__file__).resolve().parents[1]
BUNDLE = str(ROOT / "tests" / "data" / "llm_bundles" / "gemma_sp.task")
PROMPTS = json.loads((ROOT / "tests" / "data" / "llm_bundles" / "runtime_text.json").read_text())["prompts"] + [
    "the model", "people tune them", "who are you"]
NEW = 8  # max_new_tokens: short completions keep the tests fast


@pytest.fixture(scope="module")
def solo():
    """Each prompt's text from bundle.generate alone (greedy: the bundle's sampler has top_k=1)."""
    b = fbjax.load(BUNDLE)
    assert b.sampler.greedy
    out = {p: b.generate(p, max_new_tokens=NEW) for p in PROMPTS}
    assert all(out.values()) and len(set(out.values())) == len(PROMPTS)  # texts that tell the prompts apart
    return out


def test_beam_keyed_generation_equals_generate(tmp_path, solo):
    """KeyedModelHandler(FbjaxLlmHandler): (key, prompt) in, (key, PredictionResult) out, batches of at
    most 3 prompts; every completion equals bundle.generate's for that prompt alone."""
    import apache_beam as beam
    from apache_beam.ml.inference.base import KeyedModelHandler, RunInference
    from apache_beam.options.pipeline_options import PipelineOptions

    from fbjax.beam import FbjaxLlmHandler

    handler = KeyedModelHandler(FbjaxLlmHandler(BUNDLE, max_new_tokens=NEW, max_batch_size=3))
    out = tmp_path

    def save(kv):
        key, result = kv
        (out / f"{key}.json").write_text(json.dumps({"prompt": result.example, "text": result.inference,
                                                     "model_id": result.model_id}))

    with beam.Pipeline(runner="DirectRunner", options=PipelineOptions([])) as p:
        p | beam.Create(list(enumerate(PROMPTS))) | RunInference(handler) | beam.Map(save)
    got = {int(f.stem): json.loads(f.read_text()) for f in out.glob("*.json")}
    assert sorted(got) == list(range(len(PROMPTS)))
    for i, p in enumerate(PROMPTS):
        assert got[i]["prompt"] == p and got[i]["model_id"] == BUNDLE
        assert got[i]["text"] == solo[p], (p, got[i]["text"], solo[p])


def test_beam_llm_handler_direct_calls(solo):
    from fbjax.beam import FbjaxLlmHandler

    h = FbjaxLlmHandler(BUNDLE, max_new_tokens=NEW, return_tokens=True)
    bundle = h.load_model()
    res = h.run_inference(PROMPTS[:2], bundle)
    assert [r.inference.text for r in res] == [solo[p] for p in PROMPTS[:2]]
    assert all(r.inference.stopped in ("stop_token", "max_new_tokens") for r in res)
    assert h.get_num_bytes(["ab", "é"]) == 4
    with pytest.raises(InputError, match="not a prompt string"):
        h.run_inference([("k", "v")], bundle)
    with pytest.raises(InputError, match="min_batch_size 4 > max_batch_size 2"):
        FbjaxLlmHandler(BUNDLE, min_batch_size=4, max_batch_size=2)
    with pytest.raises(InputError, match="not an LLM bundle"):
        FbjaxLlmHandler(str(ROOT / "tests" / "data" / "llm" / "gemma_f32.tflite")).load_model()


@pytest.fixture(scope="module")
def ray_llm():
    """examples/ray_data_llm.py imported, on a local Ray cluster of one CPU, shut down after."""
    with ray_with_example("ray_data_llm.py", num_cpus=1) as mod:
        yield mod


@pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.data.context")
def test_ray_data_generation_equals_generate(ray_llm, solo):
    """The recipe's job (one actor, batches of 3 prompts) returns every prompt's row with bundle.generate's
    greedy text for it alone."""
    ds = ray_llm.build(PROMPTS, BUNDLE, batch_size=3, actors=1, num_cpus=1,
                       generate_options={"max_new_tokens": NEW})
    ids, outs = ray_llm.collect(ds)
    assert ids == list(range(len(PROMPTS)))
    assert outs == [solo[p] for p in PROMPTS]
