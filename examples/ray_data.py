"""Batch inference with Ray Data: one fbjax model per actor (and per device).

``Dataset.map_batches`` with a callable class: Ray starts a pool of actors,
each builds :class:`FbjaxPredictor` once (loading and compiling the model),
then calls it on batches of rows (``dict`` of numpy columns). Each call runs
the batch through ``fbjax.infer``, so results equal ``fbjax.infer`` on the
whole dataset at the same ``step_size``.

    python examples/ray_data.py                     # local Ray, MediaPipe selfie segmentation, 64 images
    python examples/ray_data.py --examples 256 --check          # compare with fbjax.infer
    python examples/ray_data.py --address auto --num-gpus 1 --actors 4 --step-size 64   # a GPU cluster

On a cluster: ``--address auto`` joins the running Ray cluster; ``--num-gpus
1`` gives each actor one GPU (Ray sets ``CUDA_VISIBLE_DEVICES`` per actor, so
JAX in the actor sees that GPU alone: one model per device); on TPU VMs give
each actor a host's chips instead (``resources={"TPU": 4}`` in
``map_batches``) and ``fbjax.infer`` shards each batch over them. The model
file must be readable at the same path on every node (a shared file system,
or copy it with the job's ``runtime_env``).
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


class FbjaxPredictor:
    """A Ray Data ``map_batches`` callable class: one fbjax model per actor.

    Args:
        model_path: the model file, readable on every node.
        step_size: examples per compiled call (``fbjax.infer``'s).
        input_columns: the batch columns holding the model's inputs, in
            :attr:`fbjax.Model.inputs` order (default: the input names);
            each column an array ``(rows, *input shape without batch)``.
        load_options: other keyword arguments of ``fbjax.load`` (not
            ``batch_size``: the model is loaded batch-polymorphic, or at the
            file's batch of 1 where its graph cannot take another batch:
            ``fbjax.batch_inference.load_for_infer``).

    Calling it on a batch (``dict`` of numpy columns) returns the batch
    without its input columns, plus one column per model output named as
    :attr:`fbjax.Model.outputs` (arrays ``(rows, *output shape without
    batch)``).
    """

    def __init__(self, model_path: str, step_size: int = 8, input_columns: Optional[Sequence[str]] = None,
                 load_options: Optional[Mapping] = None):
        import fbjax

        # batch-polymorphic, or at the file's batch of 1 where the graph cannot take another batch
        self.model = fbjax.batch_inference.load_for_infer(model_path, **dict(load_options or {}))
        self.step_size = step_size
        names = [s.name for s in self.model.inputs]
        self.input_columns = list(input_columns) if input_columns is not None else names
        if len(self.input_columns) != len(names):
            raise ValueError(f"input_columns {self.input_columns}: the model has {len(names)} inputs {names}")

    def __call__(self, batch: dict) -> dict:
        import fbjax

        examples = {s.name: batch[c] for s, c in zip(self.model.inputs, self.input_columns)}
        outs = fbjax.infer(self.model, examples, step_size=self.step_size, progress=False)
        outs = outs if isinstance(outs, list) else [outs]
        rest = {k: v for k, v in batch.items() if k not in self.input_columns}
        return {**rest, **{o.name: y for o, y in zip(self.model.outputs, outs)}}


def example_images(ids: np.ndarray) -> np.ndarray:
    """The example dataset: for each id, ``fbjax.data.synthetic_person()``
    (float32 ``(256, 256, 3)`` RGB in [0, 1]) shifted ``id % 32`` pixels
    right, plus uniform noise of amplitude 0.05 seeded by the id."""
    import fbjax

    person, _ = fbjax.data.synthetic_person()
    out = np.empty((len(ids), *person.shape), np.float32)
    for j, i in enumerate(ids):
        noise = np.random.default_rng(int(i)).random(person.shape, dtype=np.float32)
        out[j] = np.clip(np.roll(person, int(i) % 32, axis=1) + 0.05 * noise, 0.0, 1.0)
    return out


def _add_images(batch: dict) -> dict:
    return {"id": batch["id"], "image": example_images(batch["id"])}


def build(n: int, model_path: str, *, step_size: int = 8, batch_size: int = 32, actors: int = 1,
          num_gpus: float = 0, blocks: Optional[int] = None, max_restarts: int = 0):
    """The Ray Data job (lazy): ``n`` example images (made in Ray tasks from
    ids, as a real job would read files), run by a pool of ``actors``
    :class:`FbjaxPredictor` actors with ``num_gpus`` GPUs each, batches of
    ``batch_size`` rows. Returns the ``ray.data.Dataset`` (columns ``id``
    and the model's output names).

    ``max_restarts``: restarts of a crashed actor (Ray's ``max_restarts``).
    Ray Data's own default (-1, for ever) makes Ray 2.60 log an error-level
    "has constructor arguments in the object store and max_restarts > 0"
    line for every actor pool, however small its arguments (a Ray bug:
    ray-project/ray#57733); 0 keeps the log clean, -1 gives Ray's fault
    tolerance back."""
    import ray

    ds = ray.data.range(n, override_num_blocks=blocks or max(1, -(-n // batch_size)))
    ds = ds.map_batches(_add_images, batch_format="numpy")
    with warnings.catch_warnings():  # Ray 2.60 takes max_restarts only among the **ray_remote_args it deprecates
        warnings.filterwarnings("ignore", message="`ray_remote_args` is deprecated")  # (no named parameter yet)
        return ds.map_batches(FbjaxPredictor, fn_constructor_kwargs={"model_path": model_path, "step_size": step_size,
                                                                     "input_columns": ["image"]},
                              batch_size=batch_size, batch_format="numpy",
                              compute=ray.data.ActorPoolStrategy(size=actors), num_gpus=num_gpus,
                              max_restarts=max_restarts)


def collect(ds, output: str) -> tuple:
    """``(ids, outputs)`` of a finished job, sorted by id (Ray Data does not
    keep row order across actors)."""
    ids, ys = [], []
    for b in ds.iter_batches(batch_format="numpy", batch_size=None):
        ids.append(b["id"])
        ys.append(b[output])
    ids = np.concatenate(ids)
    order = np.argsort(ids, kind="stable")
    return ids[order], np.concatenate(ys)[order]


def main(argv=None) -> int:
    import fbjax

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=fbjax.data.DEFAULT_MODEL,
                    help="model file, readable on every node (default: fbjax's bundled MediaPipe selfie segmentation)")
    ap.add_argument("--examples", type=int, default=64, help="number of synthetic example images (default 64)")
    ap.add_argument("--step-size", type=int, default=8, help="examples per compiled call, fbjax.infer's step_size")
    ap.add_argument("--batch-size", type=int, default=32, help="rows per map_batches call (default 32)")
    ap.add_argument("--actors", type=int, default=1, help="actors in the pool, one model each (default 1); each holds a CPU, so leave "
                         "one free for the read tasks (2 actors on a 2-CPU machine wait forever)")
    ap.add_argument("--num-gpus", type=float, default=0,
                    help="GPUs per actor: 1 for one model per GPU (default 0: CPU)")
    ap.add_argument("--address", default=None,
                    help="Ray cluster to join ('auto': the running cluster); default: start a local one")
    ap.add_argument("--check", action="store_true",
                    help="also run fbjax.infer on the same images in this process and compare (bit equality)")
    args = ap.parse_args(argv)

    import ray

    if args.address:
        ray.init(address=args.address)
    else:
        ray.init(include_dashboard=False)
    model = fbjax.batch_inference.load_for_infer(args.model)
    out_name = model.outputs[0].name
    t = time.perf_counter()
    ids, ys = collect(build(args.examples, args.model, step_size=args.step_size, batch_size=args.batch_size,
                            actors=args.actors, num_gpus=args.num_gpus), out_name)
    dt = time.perf_counter() - t
    print(f"Ray Data: {len(ids)} examples, output {out_name!r} {ys.shape[1:]} {ys.dtype}, {dt:.1f} s "
          f"({len(ids) / dt:.1f} examples/s, actor start-up and compilation included)")
    if args.check:
        ref = fbjax.infer(model, example_images(ids), step_size=args.step_size, progress=False)
        same = bool(np.array_equal(ys, ref))
        print(f"equal to fbjax.infer: {same}")
        if not same:
            return 1
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
