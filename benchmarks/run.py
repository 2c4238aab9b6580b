"""Benchmark every shared model: fbjax vs LiteRT / onnxruntime (``nox -s bench``).

    python benchmarks/run.py [--runs 20] [--batch 32] [--only NAME ...] [--out benchmarks/results]

Models: every ``.tflite`` in ``../shared/models/tflite`` (vs LiteRT, 2
threads, XNNPACK) and the onnx wheel's light models that rten-convert
converts (``.rten``, vs onnxruntime on the ``.onnx``, batch-1 latency only:
their batch-32 runs would take minutes each on two cores). Writes
``OUT.md`` (the table) and ``OUT.json`` (records, geometric means,
environment, the command line). See ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from fbjax import bench  # noqa: E402

SHARED = os.path.join(ROOT, "..", "shared", "models", "tflite")
#: light_<name>.onnx models rten-convert 0.22 converts (the others use LRN).
LIGHT = ["squeezenet", "shufflenet", "resnet50", "inception_v2", "densenet121", "vgg19"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=bench.DEFAULT_RUNS)
    p.add_argument("--batch", type=int, default=bench.DEFAULT_BATCH)
    p.add_argument("--threads", type=int, default=bench.DEFAULT_THREADS)
    p.add_argument("--only", nargs="*", help="substrings of model names to keep")
    p.add_argument("--no-light", action="store_true", help="skip the .rten light models")
    p.add_argument("--no-first-call", action="store_true")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"),
                   help="output prefix (writes PREFIX.md and PREFIX.json)")
    args = p.parse_args(argv)
    tfl = sorted(glob.glob(os.path.join(SHARED, "*.tflite")))
    light = [] if args.no_light else [bench.LIGHT_PREFIX + n for n in LIGHT]
    if args.only:
        keep = lambda m: any(s in m for s in args.only)  # noqa: E731
        tfl, light = [m for m in tfl if keep(m)], [m for m in light if keep(m)]
    if not tfl and not light:
        print(f"no models (looked in {SHARED})", file=sys.stderr)
        return 1
    kw = dict(runs=args.runs, threads=args.threads, first=not args.no_first_call)
    done = []

    def partial(rec):  # keep what is measured if the run is cut short
        done.append(rec)
        with open(args.out + ".partial.json", "w") as f:
            json.dump(done, f, indent=1, default=float)

    recs = (bench.bench_models(tfl, batch=args.batch, on_record=partial, **kw)
            + bench.bench_models(light, batch=0, on_record=partial, **kw))
    summ = bench.summary(recs)
    table = bench.markdown_table(recs, summ)
    cmd = "python " + " ".join([os.path.relpath(__file__, ROOT)] + list(argv if argv is not None else sys.argv[1:]))
    print(table)
    with open(args.out + ".md", "w") as f:
        f.write(f"Command: `{cmd}`\n\n{table}")
    with open(args.out + ".json", "w") as f:
        json.dump({"command": cmd, "environment": bench.environment(), "records": recs, "summary": summ},
                  f, indent=1, default=float)
    if os.path.exists(args.out + ".partial.json"):
        os.remove(args.out + ".partial.json")
    print(f"wrote {args.out}.md and {args.out}.json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
