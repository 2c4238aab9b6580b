"""Batch generation with Ray Data: one LLM bundle per actor, prompts in, completions out.

``Dataset.map_batches`` with a callable class: Ray starts a pool of actors,
each builds :class:`LlmGenerator` once (loading the ``.litertlm`` / LLM
``.task`` bundle and compiling its prefill and decode programs), then calls
it on batches of rows (``dict`` of numpy columns). Each call generates the
batch's prompts as one batch with ``LlmBundle.generate`` (rows prefilled and
decoded together, each stopping on its own), so greedy completions equal
``bundle.generate(prompt)`` on each prompt.

    python examples/ray_data_llm.py                           # local Ray, the gemma fixture bundle, 16 prompts
    python examples/ray_data_llm.py --bundle model.litertlm --prompts prompts.txt --check   # one prompt a line
    python examples/ray_data_llm.py --address auto --actors 4 --num-gpus 1 --bundle /shared/model.litertlm

The bundle must be readable at the same path on every node. An actor holds
one CPU (``--num-cpus``): on a 2-CPU machine leave one for Ray's own tasks.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from typing import Mapping, Optional, Sequence

import numpy as np

try:  # a fresh clone without `pip install .`: use the repository's fbjax
    import fbjax  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: the default bundle: a fixture of the repository (random weights: its text is gibberish)
DEFAULT_BUNDLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              "tests", "data", "llm_bundles", "gemma_sp.task")


class LlmGenerator:
    """A Ray Data ``map_batches`` callable class: one LLM bundle per actor.

    Args:
        bundle_path: the bundle (``.litertlm`` / LLM ``.task``), readable on every node.
        prompt_column, output_column: the batch column of prompts (strings)
            and the one the completions go to.
        generate_options: keyword arguments of ``LlmBundle.generate``
            (``max_new_tokens``, ``template``, ``temperature``, ``top_k``,
            ``top_p``, ``seed``).
        load_options: keyword arguments of ``fbjax.load``.

    Calling it on a batch (``dict`` of numpy columns) returns the batch with
    ``output_column`` added (an object array of strings, one per row).
    """

    def __init__(self, bundle_path: str, prompt_column: str = "prompt", output_column: str = "completion",
                 generate_options: Optional[Mapping] = None, load_options: Optional[Mapping] = None):
        import fbjax

        self.bundle = fbjax.load(bundle_path, **dict(load_options or {}))
        if not isinstance(self.bundle, fbjax.LlmBundle):
            raise ValueError(f"{bundle_path} is not an LLM bundle (.litertlm / LLM .task)")
        self.prompt_column, self.output_column = prompt_column, output_column
        self.options = dict(generate_options or {})

    def __call__(self, batch: dict) -> dict:
        prompts = [str(p) for p in batch[self.prompt_column]]
        out = self.bundle.generate(prompts, **self.options) if prompts else []
        return {**batch, self.output_column: np.asarray(out, dtype=object)}


def build(prompts: Sequence[str], bundle_path: str, *, batch_size: int = 8, actors: int = 1, num_cpus: float = 1,
          num_gpus: float = 0, generate_options: Optional[Mapping] = None, max_restarts: int = 0):
    """The Ray Data job (lazy): rows ``{"id", "prompt"}`` run by a pool of
    ``actors`` :class:`LlmGenerator` actors (``num_cpus`` / ``num_gpus``
    each), batches of ``batch_size`` prompts. Returns the
    ``ray.data.Dataset`` (columns ``id``, ``prompt``, ``completion``).
    ``max_restarts``: as ``examples/ray_data.py`` says (0 keeps Ray 2.60's
    log clean, -1 restarts crashed actors for ever)."""
    import ray

    ds = ray.data.from_items([{"id": i, "prompt": p} for i, p in enumerate(prompts)])
    with warnings.catch_warnings():  # Ray 2.60 takes max_restarts only among the **ray_remote_args it deprecates
        warnings.filterwarnings("ignore", message="`ray_remote_args` is deprecated")
        return ds.map_batches(LlmGenerator, fn_constructor_kwargs={"bundle_path": bundle_path,
                                                                   "generate_options": dict(generate_options or {})},
                              batch_size=batch_size, batch_format="numpy",
                              compute=ray.data.ActorPoolStrategy(size=actors), num_cpus=num_cpus,
                              num_gpus=num_gpus, max_restarts=max_restarts)


def collect(ds) -> tuple:
    """``(ids, completions)`` of a finished job, sorted by id (Ray Data does not keep row order across actors)."""
    rows = sorted(ds.take_all(), key=lambda r: int(r["id"]))
    return [int(r["id"]) for r in rows], [str(r["completion"]) for r in rows]


def example_prompts(n: int) -> list:
    """``n`` short prompts over the fixtures' vocabulary."""
    words = "the model runs on phones and in the cloud people tune them for their own tasks every day".split()
    return [" ".join(words[i % len(words):i % len(words) + 1 + i % 4]) for i in range(n)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", default=DEFAULT_BUNDLE, help="LLM bundle, readable on every node "
                    "(default: the repository's gemma_sp.task fixture)")
    ap.add_argument("--prompts", default=None, help="a text file with one prompt a line (default: 16 made-up prompts)")
    ap.add_argument("--max-new-tokens", type=int, default=16, help="at most this many new tokens per prompt (default 16)")
    ap.add_argument("--batch-size", type=int, default=8, help="prompts per map_batches call, generated together (default 8)")
    ap.add_argument("--actors", type=int, default=1, help="actors in the pool, one bundle each (default 1)")
    ap.add_argument("--num-cpus", type=float, default=1, help="CPUs per actor (default 1)")
    ap.add_argument("--num-gpus", type=float, default=0, help="GPUs per actor: 1 for one bundle per GPU (default 0)")
    ap.add_argument("--address", default=None,
                    help="Ray cluster to join ('auto': the running cluster); default: start a local one")
    ap.add_argument("--check", action="store_true",
                    help="also run bundle.generate on each prompt in this process and compare (greedy text)")
    args = ap.parse_args(argv)

    import ray

    import fbjax

    prompts = (open(args.prompts).read().splitlines() if args.prompts else example_prompts(16))
    ray.init(address=args.address) if args.address else ray.init(include_dashboard=False)
    opts = {"max_new_tokens": args.max_new_tokens}
    t = time.perf_counter()
    ids, outs = collect(build(prompts, args.bundle, batch_size=args.batch_size, actors=args.actors,
                              num_cpus=args.num_cpus, num_gpus=args.num_gpus, generate_options=opts))
    dt = time.perf_counter() - t
    for i, o in zip(ids[:4], outs[:4]):
        print(f"{prompts[i]!r} -> {o!r}")
    print(f"Ray Data: {len(ids)} prompts, {dt:.1f} s (actor start-up and compilation included)")
    status = 0
    if args.check:
        bundle = fbjax.load(args.bundle)
        same = all(bundle.generate(prompts[i], **opts) == o for i, o in zip(ids, outs))
        print(f"equal to bundle.generate: {same}")
        status = 0 if same else 1
    ray.shutdown()
    return status


if __name__ == "__main__":
    sys.exit(main())
