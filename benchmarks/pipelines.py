"""Data pipelines on one machine: Apache Beam (DirectRunner) and Ray Data against
``fbjax.infer``, side by side in one process.

    python benchmarks/pipelines.py [--examples 256] [--rounds 3] [--step-size 8] [--json out.json]

The same ``--examples`` images (float32 ``(256, 256, 3)`` uniform in [0, 1],
one ``.npy`` file each in a temporary directory) go through fbjax's bundled
model (``fbjax.data.DEFAULT_MODEL``, MediaPipe selfie segmentation) three ways,
every job reading the files inside its timing:

* ``infer``: ``fbjax.infer(model, directory, step_size=S)``;
* ``beam``: ``Create(paths) | Map(np.load) | RunInference(FbjaxModelHandler(model,
  step_size=S))`` on the DirectRunner (in-process, one worker; the handler's
  default batches of S..4S), each result written to an ``.npy`` file (how
  results leave a pipeline here);
* ``ray``: ``from_items(paths) | map_batches(np.load)`` then the
  ``examples/ray_data.py`` recipe's ``FbjaxPredictor`` on one actor (the local
  cluster, ``ray.init(num_cpus=2)``, keeps the other CPU for reading), batches
  of 4S rows, results pulled back to the driver.

Per job: load the model (compiled programs come from JAX's persistent cache
after the first round), read, run and collect; Ray's and Beam's start-up of
their workers is part of each job (a pipeline's fixed cost), the Ray cluster's
own start is not. Each round runs the three once, in an order that rotates;
``rate`` is examples/s of the best (minimum-time) round, ``paired`` the median
over rounds of the job's rate / infer's rate within the round (back to back,
so the same load from other processes: the fairer figure on a shared
machine). ``load`` is the 1-minute load average (``os.getloadavg``) at each
round's start. Every job's results are checked bit-equal to an untimed warm-up
``infer``'s (same step size: same programs), run first to fill JAX's
persistent compilation cache.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))


def _beam_job(paths, model_path: str, step: int, out_dir: str) -> None:
    import apache_beam as beam
    from apache_beam.ml.inference.base import KeyedModelHandler, RunInference
    from apache_beam.options.pipeline_options import PipelineOptions

    from fbjax.beam import FbjaxModelHandler

    def save(kv):  # results leave the pipeline through a file per example (its functions are pickled)
        np.save(os.path.join(out_dir, f"{kv[0]}.npy"), kv[1].inference)

    with beam.Pipeline(runner="DirectRunner", options=PipelineOptions([])) as p:
        (p | beam.Create(list(enumerate(paths))) | beam.Map(lambda kv: (kv[0], np.load(kv[1])))
         | RunInference(KeyedModelHandler(FbjaxModelHandler(model_path, step_size=step))) | beam.Map(save))


def _load_files(batch: dict) -> dict:
    return {"id": batch["id"], "image": np.stack([np.load(p) for p in batch["path"]])}


def _ray_job(paths, model_path: str, step: int):
    import ray

    from ray_data import FbjaxPredictor

    ds = ray.data.from_items([{"id": i, "path": p} for i, p in enumerate(paths)], override_num_blocks=8)
    ds = ds.map_batches(_load_files, batch_format="numpy")
    ds = ds.map_batches(FbjaxPredictor, fn_constructor_kwargs={"model_path": model_path, "step_size": step,
                                                               "input_columns": ["image"]},
                        batch_size=4 * step, batch_format="numpy", compute=ray.data.ActorPoolStrategy(size=1))
    ids, ys = [], []
    for b in ds.iter_batches(batch_format="numpy", batch_size=None):
        ids.append(b["id"])
        ys.append(b["activation_10"])
    ids = np.concatenate(ids)
    return np.concatenate(ys)[np.argsort(ids, kind="stable")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=256, help="number of example images (default 256)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the three jobs (default 3)")
    ap.add_argument("--step-size", type=int, default=8, help="fbjax.infer's step_size in every job (default 8)")
    ap.add_argument("--json", default=None, help="write the results to this JSON file")
    args = ap.parse_args(argv)

    import jax
    import ray
    import ray.cloudpickle

    import fbjax
    import ray_data

    model_path = fbjax.data.DEFAULT_MODEL
    step = args.step_size
    ray.cloudpickle.register_pickle_by_value(ray_data)  # the actors cannot import examples/ as a module
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    times: dict = {"infer": [], "beam": [], "ray": []}
    loads = []
    ref = None
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "examples")
        os.mkdir(src)
        rng = np.random.default_rng(0)
        paths = []
        for i in range(args.examples):
            paths.append(os.path.join(src, f"{i:06d}.npy"))
            np.save(paths[-1], rng.random((256, 256, 3), dtype=np.float32))
        names = ["infer", "beam", "ray"]
        # warm-up, untimed: compiles the step program into JAX's persistent cache, which the
        # Beam and Ray workers' models then load from
        ref = fbjax.infer(model_path, src, step_size=step, progress=False)
        for r in range(args.rounds):
            loads.append(round(os.getloadavg()[0], 1))
            order = names[r % 3:] + names[:r % 3]
            for name in order:
                t = time.perf_counter()
                if name == "infer":
                    ys = fbjax.infer(fbjax.load(model_path, batch_size=None), src, step_size=step, progress=False)
                elif name == "beam":
                    out = os.path.join(d, f"beam{r}")
                    os.mkdir(out)
                    _beam_job(paths, model_path, step, out)
                    dt = time.perf_counter() - t
                    ys = np.stack([np.load(os.path.join(out, f"{i}.npy")) for i in range(len(paths))])
                else:
                    ys = _ray_job(paths, model_path, step)
                if name != "beam":
                    dt = time.perf_counter() - t
                times[name].append(dt)
                if not np.array_equal(ys, ref):
                    raise SystemExit(f"{name} (round {r}): results differ from fbjax.infer's "
                                     f"(max |diff| {np.abs(ys - ref).max()})")
                print(f"round {r} {name}: {dt:.2f} s ({args.examples / dt:.1f} examples/s), load {loads[-1]}",
                      flush=True)
    ray.shutdown()

    n = args.examples
    rows = []
    for name in names:
        paired = [times["infer"][r] / times[name][r] for r in range(args.rounds)]
        rows.append({"job": name, "rate": round(n / min(times[name]), 1),
                     "paired": round(statistics.median(paired), 3),
                     "seconds": [round(t, 2) for t in times[name]]})
    import apache_beam

    env = {"jax": jax.__version__, "apache_beam": apache_beam.__version__, "ray": ray.__version__,
           "cpus": os.cpu_count(), "load per round": loads}
    print(f"\n{n} examples, step_size {step}, {args.rounds} rounds; load (1 min) per round {loads}")
    print("| job | examples/s (best round) | paired ratio to infer (median) | seconds per round |")
    print("|---|---|---|---|")
    for row in rows:
        print(f"| {row['job']} | {row['rate']} | {row['paired']:.2f} | {row['seconds']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": "python benchmarks/pipelines.py " + " ".join(argv or sys.argv[1:]),
                       "examples": n, "step_size": step, "rounds": args.rounds, "rows": rows, "env": env}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
