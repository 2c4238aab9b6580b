"""The ``fbjax`` command line: inspect and run model files.

    fbjax inspect MODEL
    fbjax run [MODEL] [--input NAME=FILE.npy ...] [--output OUT.npz]
    fbjax infer MODEL --input-dir DIR --step-size N --out FILE.npz
    fbjax generate MODEL --prompt-tokens 1,2,3 --max-new-tokens 32
    fbjax generate BUNDLE --prompt "..."     (a .litertlm or LLM .task: text in, text out)
    fbjax chat BUNDLE
    fbjax export MODEL --to stablehlo|mlir OUT
    fbjax bench MODEL... [--runs N] [--batch N] [--json OUT]
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
import warnings
from collections import Counter
from typing import Optional, Sequence

import numpy as np

from .cli_llm import (add_chat_parser, add_sampler_options, add_serve_parser, generate_bundle, inspect_bundle,
                      is_bundle, not_a_bundle)
from .formats._text import format_bytes
from .options import KernelOptions


def _spec_str(name: str, shape, dtype, quant=None) -> str:
    dims = "?" if shape is None else "x".join("?" if d is None else str(d) for d in shape)
    out = f"{name}: {np.dtype(dtype).name}[{dims}]"
    if quant is not None and np.asarray(quant.scale).size:
        s = np.asarray(quant.scale).reshape(-1)
        z = np.asarray(quant.zero_point).reshape(-1)
        if s.size == 1:
            out += f"  (scale {float(s[0]):.6g}, zero point {int(z[0]) if z.size else 0})"
        else:
            out += f"  ({s.size} per-channel scales along axis {quant.quantized_dimension})"
    return out


def _load_for_inspect(path, shown=frozenset(), **options):
    """``(model, None)``, or ``(None, why)`` when ``fbjax.load(path, **options)``
    refuses the file: load reads it, checks what can be known without running
    (kernel dtypes, region arities, static inputs) and traces the model
    abstractly at its input shapes, so every lowering's own check has run
    (:func:`fbjax.model.load`). Warnings whose text is in ``shown`` (the
    reader's, printed when inspect read the file) are not printed again."""
    from .errors import FbjaxError
    from .model import load

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            out = load(path, **options), None
        except FbjaxError as e:
            out = None, f"{type(e).__name__}: {e}"
    _show_new(seen, shown)
    return out


def _show_new(seen, shown) -> set:
    """Print the recorded warnings ``seen`` whose text is not in ``shown``, each once; the texts printed."""
    printed = set(shown)
    for w in seen:
        if str(w.message) not in printed:
            printed.add(str(w.message))
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    return printed


def _metadata_json(path) -> int:
    """``fbjax inspect MODEL --metadata-json``: the TFLite metadata table as JSON (``null`` when absent)."""
    import json

    from .formats import read_model
    from .formats.vision_task import VisionTaskBundle, is_vision_task

    def one(md):
        return None if md is None else md.as_dict()

    if is_vision_task(path):
        b = VisionTaskBundle(path)
        doc = {n: one(b.metadata(n)) for n in b.names if n.lower().endswith(".tflite")}
    else:
        ir = read_model(path)
        doc = one(ir.metadata.get("tflite_metadata"))
    print(json.dumps(doc, indent=2))
    return 0


def cmd_inspect(args) -> int:
    """``fbjax inspect MODEL``: format, inputs/outputs, op histogram, params, unsupported ops."""
    from .errors import FbjaxError
    from . import loading
    from .lower import LOWERINGS
    from .lower.build import is_param

    if args.model is None:
        from .data import DEFAULT_MODEL

        args.model = DEFAULT_MODEL
        print("no model given: inspecting the bundled default model")
    if is_bundle(args.model):  # an LLM bundle (.litertlm, LLM .task): sections, tokenizer, templates
        return inspect_bundle(args.model)
    from .formats.vision_task import VisionTaskBundle, is_vision_task

    if getattr(args, "metadata_json", False):
        return _metadata_json(args.model)
    if is_vision_task(args.model):  # a MediaPipe Tasks vision bundle: its members and their metadata
        try:
            bundle = VisionTaskBundle(args.model)
        except FbjaxError as e:
            print(f"fbjax cannot read this bundle: {type(e).__name__}: {e}")
            return 1
        print(f"model:    {args.model}")
        print("\n".join(bundle.summary()))
        print(f"load a member in Python: fbjax.load({str(args.model)!r})[{bundle.names[0]!r}]")
        return 0
    try:
        with warnings.catch_warnings(record=True) as seen:  # printed once, not again when load reads the file
            warnings.simplefilter("always")
            ir = loading.read(args.model, args.format)
        shown = _show_new(seen, ())
    except FbjaxError as e:  # a file that contradicts itself: nothing below can be shown
        print(f"model:    {args.model}")
        print(f"fbjax cannot run this model: {type(e).__name__}: {e}")
        return 1
    if ir.format == "gpu_cl" and getattr(args, "code", None) is not None:
        from .formats.gpu_cl import find_node

        try:
            print(find_node(ir, args.code).code)
        except KeyError as e:
            print(f"error: {e.args[0]}", file=sys.stderr)
            return 2
        return 0
    if getattr(args, "code", None) is not None:
        print(f"fbjax inspect: --code reads TFLite GPU delegate .bin files; {args.model} is {ir.format}",
              file=sys.stderr)
        return 2
    g = ir.main_graph
    print(f"model:    {args.model}")
    print(f"format:   {ir.format}" + (f"  ({ir.description})" if ir.description else ""))
    print(f"graphs:   {len(ir.graphs)}")
    bound = _constant_inputs(args)
    print("inputs:")
    for v in g.inputs:
        print("  " + _spec_str(v.name, v.shape, v.dtype, v.quant)
              + ("  (bound at load: --constant-input)" if v.name in bound else ""))
    model, problem = _load_for_inspect(args.model, shown, format=args.format, constant_inputs=bound,
                                       static_bounds=args.static_bounds)
    print("outputs:")  # the shapes fbjax.load infers win over the file's declared ones
    shapes = [s.shape for s in model.outputs] if model is not None else [v.shape for v in g.outputs]
    for v, shape in zip(g.outputs, shapes):
        print("  " + _spec_str(v.name, shape, v.dtype, v.quant))
    for spec in (model.outputs[len(g.outputs):] if model is not None else []):  # --static-bounds' counts
        print("  " + _spec_str(spec.name, spec.shape, spec.dtype))
    if ir.signatures:  # every entry point (`fbjax run MODEL --signature KEY` runs one)
        print(f"signatures ({len(ir.signatures)}):")
        for key, sig in ir.signatures.items():
            print(f"  {key}  (graph {sig.graph_index})")
            for kind, vals in (("in ", sig.inputs), ("out", sig.outputs)):
                for name, v in vals.items():
                    print(f"    {kind} " + _spec_str(name, v.shape, v.dtype, v.quant))
    if ir.metadata.get("tflite_metadata") is not None:  # TFLite metadata: normalization, labels... (Model.metadata)
        print("\n".join(ir.metadata["tflite_metadata"].summary()))
    if ir.format == "gpu_cl":
        from .formats.gpu_cl import describe

        print(describe(ir))
    hist = Counter(n.key for n in ir.iter_nodes())
    seen = set()
    n_params = n_bytes = 0
    for gr in ir.graphs:
        for v in gr.values:
            if id(v) in seen or not is_param(v):
                continue
            seen.add(id(v))
            n_params += int(v.data.size)
            n_bytes += int(v.data.nbytes)
    print(f"params:   {n_params:,} values, {format_bytes(n_bytes)}")
    q_vals = q_bytes = 0
    for gr in ir.graphs:
        for v in gr.values:
            if id(v) in seen or v.data is None or v.quant is None or np.asarray(v.quant.scale).size == 0 \
                    or np.dtype(v.dtype).kind not in "iu":
                continue
            seen.add(id(v))
            q_vals += int(np.asarray(v.data).size)
            q_bytes += int(np.asarray(v.data).nbytes)
    if q_vals:
        print(f"quantized weights: {q_vals:,} values, {format_bytes(q_bytes)} (integer constants in the default "
              "quantized=\"exact\" mode; fbjax.load(path, quantized=\"float\") makes them float params)")
    print(f"operators ({sum(hist.values())}):")
    # quantized models: support is decided after fbjax.load's default
    # quantized="exact" rewrite (integer kernels live in op set tflite.int)
    from .options import LoadOptions
    from .loading import rewrite
    from .passes.quantization import has_quantized_tensors

    if has_quantized_tensors(ir):  # (everything above has been read from the file's IR)
        rewrite(ir, LoadOptions())  # load's pipeline with load's defaults
    missing = {(n.op_set, n.op_name) for n in ir.iter_nodes() if LOWERINGS.get(n.op_set, n.op_name) is None}
    unsupported = []
    for (s, n), c in sorted(hist.items(), key=lambda kv: (-kv[1], kv[0])):
        gone = sorted(f"{a}:{b}" for a, b in missing if b == n)
        ok = not gone
        unsupported.extend(k for k in gone if k not in unsupported)
        label = n if s in ("tflite",) else f"{s}:{n}"
        print(f"  {c:5d}  {label}" + ("" if ok else "   <- unsupported"))
    if unsupported:
        print(f"unsupported: {', '.join(unsupported)}")
        print("fbjax cannot run this model yet; see `fbjax.supported_ops()` or register a custom op.")
        return 0
    if problem:
        print(f"fbjax cannot run this model: {problem}")
        return 1
    flags = "".join(f" --constant-input {shlex.quote(p)}" for p in getattr(args, "constant_input", None) or [])
    flags += " --static-bounds" if args.static_bounds else ""
    print(f"unsupported: none (fbjax can run this model: `fbjax run {shlex.quote(str(args.model))}{flags}`)")
    return 0


def _constant_inputs(args) -> dict:
    """``--constant-input NAME=FILE.npy`` (repeatable) as ``{name: array}`` for
    ``fbjax.load(constant_inputs=...)``."""
    out = {}
    for p in getattr(args, "constant_input", None) or []:
        name, sep, path = p.partition("=")
        if not sep or not name or not path:
            raise SystemExit(f"fbjax {args.command}: --constant-input {p!r}: expected NAME=FILE.npy")
        if not os.path.isfile(path):
            raise SystemExit(f"fbjax {args.command}: --constant-input {p}: no such file {path}")
        out[name] = np.load(path)
    return out


def _add_format(parser) -> None:
    """The one ``--format`` option (``fbjax.load``'s ``format``)."""
    from .formats import READERS

    parser.add_argument("--format", choices=sorted(READERS), default=None,
                        help="read the file as this format instead of detecting it from its bytes (a damaged "
                        "file then says why that format's reader refuses it)")


def _add_constant_input(parser) -> None:
    parser.add_argument("--constant-input", action="append", metavar="NAME=FILE.npy",
                        help="bind the graph input NAME to the array in FILE.npy at load time (repeatable; "
                        "for inputs whose values fix shapes, e.g. a Reduce's axes: fbjax.load(constant_inputs=))")
    parser.add_argument("--static-bounds", action="store_true",
                        help="ops whose output size depends on computed values (ONNX NonMaxSuppression, NonZero, "
                        "TopK's k, Loop scan outputs; TFLite WHERE, UNIQUE) return outputs padded to a load-time bound plus a "
                        "'<name>:valid_count' output (fbjax.load(static_bounds=True))")


#: random integer inputs that are not quantized values are drawn in [0, this): in range as token ids,
#: positions and gather indices of most models (an int32 drawn in [-128, 127] gave a decode step NaN logits)
_RANDOM_INDEX_BOUND = 8


def _parse_inputs(pairs: Sequence[str], model) -> tuple[list, list]:
    """``fbjax run``'s inputs in model order (from ``--input`` files, else seeded
    random), and the names of those filled with random integers."""
    random_ints = []
    given = {}
    for p in pairs or []:
        if "=" in p:
            name, path = p.split("=", 1)
        else:
            name, path = None, p
        if os.path.isdir(path):
            raise SystemExit(f"fbjax run: --input {p}: {path} is a directory; `fbjax run` takes one array per "
                             "input (for a directory of samples: fbjax infer MODEL --input-dir DIR --out FILE.npz)")
        loaded = np.load(path)
        if isinstance(loaded, np.lib.npyio.NpzFile):  # an .npz: its arrays by input name
            with loaded:
                if name is not None:
                    raise SystemExit(f"fbjax run: --input {p}: give an .npz without NAME= (its arrays are "
                                     "named by input), or NAME=FILE.npy")
                given.update({k: loaded[k] for k in loaded.files})
            continue
        given[name] = loaded
    names = [s.name for s in model.inputs]
    unknown = [str(k) for k in given if k is not None and k not in names]
    if unknown:  # before printing any input line
        raise SystemExit(f"fbjax run: no model input named {', '.join(unknown)}; inputs are: {', '.join(names)}")
    if None in given and len(names) != 1:
        raise SystemExit(f"fbjax run: --input without NAME= is for one-input models; this one has {len(names)}: "
                         f"give --input NAME=FILE.npy with NAME among {', '.join(names)}")
    rng = np.random.default_rng(0)
    quant = list(getattr(model, "input_quantization", None) or [None] * len(model.inputs))
    xs = []
    n_random = 0
    for i, spec in enumerate(model.inputs):
        x = given.pop(spec.name, None)
        if x is None and None in given and len(model.inputs) == 1:
            x = given.pop(None)
        if x is None:
            shape = tuple(1 if d is None else d for d in spec.shape)
            if np.issubdtype(spec.dtype, np.floating):
                x = rng.random(shape, dtype=np.float32).astype(spec.dtype)
            elif spec.dtype == np.bool_:
                x = rng.random(shape) < 0.5
            elif quant[i] is not None:  # quantized real values: any code of the type (8 bits at most)
                info = np.iinfo(spec.dtype)
                x = rng.integers(max(info.min, -128), min(info.max, 127), shape, endpoint=True).astype(spec.dtype)
            else:  # plain integers are mostly indices (token ids, positions, gather indices): small, >= 0
                x = rng.integers(0, _RANDOM_INDEX_BOUND, shape).astype(spec.dtype)
            src = ("random [0, 1)" if np.issubdtype(spec.dtype, np.floating)
                   else "random codes" if quant[i] is not None else f"random integers in [0, {_RANDOM_INDEX_BOUND})")
            n_random += 1
            if not np.issubdtype(spec.dtype, np.floating) and spec.dtype != np.bool_:
                random_ints.append(spec.name)
        else:
            src = "file"
        print(f"input  {_spec_str(spec.name, x.shape, x.dtype)}  ({src})")
        xs.append(x)
    if given:
        names = ", ".join(str(k) for k in given)
        raise SystemExit(
            f"fbjax run: no model input named {names}; inputs are: {', '.join(s.name for s in model.inputs)}"
        )
    if n_random:
        print("(random inputs show that the model runs and how fast, not what it computes: "
              "give real ones with --input NAME=FILE.npy)")
    return xs, random_ints


def cmd_run(args) -> int:
    """``fbjax run [MODEL]``: run on given or seeded random inputs; prints outputs and timings."""
    import jax

    from . import load
    from .data import DEFAULT_MODEL

    path = args.model or DEFAULT_MODEL
    out_path = None
    if args.output:
        # np.savez adds .npz to a name without it: report (and check) the file actually written
        out_path = args.output if args.output.endswith(".npz") else args.output + ".npz"
        folder = os.path.dirname(os.path.abspath(out_path))
        if not os.path.isdir(folder):
            raise SystemExit(f"fbjax run: output folder {folder} does not exist (create it first)")
    if args.model is None:
        print(f"no model given: running the bundled default {os.path.basename(path)} (see fbjax/data/NOTICE)")
    t0 = time.perf_counter()
    model = load(path, format=args.format, quantized=args.quantized, constant_inputs=_constant_inputs(args),
                 static_bounds=args.static_bounds)
    model = _bundle_member(model, args, path)
    t_load = time.perf_counter() - t0
    if getattr(args, "signature", None) is not None:  # one entry point: its named inputs and outputs
        from .errors import InputError

        try:
            runner = model.signature(args.signature)
        except InputError as e:
            raise SystemExit(f"fbjax run: {_no_signature(e, model, args.signature)}") from None
        model = _SignatureAsModel(runner)
    elif len(model.ir.signatures) > 1:  # several entry points: say which one runs
        sigs = model.ir.signatures
        first = [k for k, sig in sigs.items() if sig.graph_index == 0]
        print(f"(the file has {len(sigs)} signatures: {', '.join(sigs)}; this runs its first subgraph"
              + (f", signature {first[0]}'s" if first else "") + ": --signature KEY runs another)")
    figure, random_ints, image = None, [], None
    if getattr(args, "overlay", None) and not getattr(args, "image", None):
        raise SystemExit("fbjax run: --overlay draws on the picture given with --image PHOTO")
    if getattr(args, "image", None):  # a photo, preprocessed as the metadata says (fbjax.vision)
        xs, image = _image_inputs(args, model)
    elif args.model is None and not args.input:  # the bundled model's job on an input that means something
        from .data import synthetic_person

        img, figure = synthetic_person(model.inputs[0].shape[1])
        xs = [img[None]]
        print(f"input  {_spec_str(model.inputs[0].name, xs[0].shape, xs[0].dtype)}  (a drawn person on a plain "
              "backdrop, RGB in [0, 1]: fbjax.data.synthetic_person())")
    else:
        xs, random_ints = _parse_inputs(args.input, model)
    t1 = time.perf_counter()
    outs = model(*xs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    jax.block_until_ready(outs)
    t_first = time.perf_counter() - t1
    times = []
    if args.repeat and hasattr(model, "wait_optimised"):
        model.wait_optimised()  # steady state: the optimised program, not the quick first tier (tiered.py)
    for _ in range(args.repeat):
        t = time.perf_counter()
        jax.block_until_ready(model(*xs))
        times.append(time.perf_counter() - t)
    outs_np = [np.asarray(o) for o in outs]
    for spec, o in zip(model.outputs, outs_np):
        line = "output " + _spec_str(spec.name, o.shape, o.dtype)
        if o.size and o.dtype != np.object_:
            of = o.astype(np.float64)
            line += f"  min {of.min():.6g}  max {of.max():.6g}  mean {of.mean():.6g}"
        print(line)
    nan_outputs = [s.name for s, o in zip(model.outputs, outs_np)
                   if o.size and np.issubdtype(o.dtype, np.inexact) and np.isnan(o).any()]
    if nan_outputs and random_ints:  # e.g. an LLM's decode signature on random token ids and positions
        print(f"(NaN in {', '.join(nan_outputs)}: the random integer inputs ({', '.join(random_ints)}) may be "
              "out of range where the model uses them as indices (token ids, positions, gather indices): "
              "give real ones with --input NAME=FILE.npy)")
    if figure is not None:
        mask = outs_np[0][0, ..., 0] > 0.5
        iou = (mask & figure).sum() / max((mask | figure).sum(), 1)
        print(f"the output is the probability that each pixel shows a person: > 0.5 on {mask.mean():.1%} of "
              f"the image; intersection over union with the drawn figure (which covers {figure.mean():.1%}): {iou:.3f}")
    if image is not None:
        _image_outputs(args, model, image, outs_np)
    print(f"backend: {jax.default_backend()}  devices: {len(jax.devices())}")
    print(f"load: {t_load * 1e3:.1f} ms   first result (compile + run; load traced it): {t_first * 1e3:.1f} ms"
          if getattr(model, "_traced_outputs", None) is not None else
          f"load: {t_load * 1e3:.1f} ms   first result (trace + compile + run): {t_first * 1e3:.1f} ms")
    if times:
        print(
            f"steady-state latency over {len(times)} run{'s' if len(times) > 1 else ''}: "
            f"median {np.median(times) * 1e3:.3f} ms, min {np.min(times) * 1e3:.3f} ms"
        )
    if args.output:
        names = [s.name for s in model.outputs]
        keys = [n if n and names.count(n) == 1 else f"output_{i}" for i, n in enumerate(names)]
        np.savez(out_path, **dict(zip(keys, outs_np)))
        print(f"wrote {out_path} ({', '.join(keys)})")
    return 0


def _bundle_member(model, args, path):
    """``fbjax run BUNDLE.task --member NAME``: the member to run (a MediaPipe Tasks vision bundle
    loads as a VisionTaskBundle); a model file is returned as it is."""
    from .formats.vision_task import VisionTaskBundle

    member = getattr(args, "member", None)
    if not isinstance(model, VisionTaskBundle):
        if member:
            raise SystemExit(f"fbjax run: --member picks a model from a .task bundle; {path} is a single model")
        return model
    if not member:
        raise SystemExit(f"fbjax run: {path} is a MediaPipe Tasks bundle of {len(model.names)} models "
                         f"({', '.join(model.names)}): pick one with --member NAME")
    for part in member.split("/"):  # nested bundles: --member hand_landmarker.task/hand_detector.tflite
        if not isinstance(model, VisionTaskBundle) or part not in model:
            have = ", ".join(model.names) if isinstance(model, VisionTaskBundle) else "(not a bundle)"
            raise SystemExit(f"fbjax run: no member {member!r} in {path}; members: {have}")
        model = model[part]
    if isinstance(model, VisionTaskBundle):
        raise SystemExit(f"fbjax run: {member} is itself a bundle ({', '.join(model.names)}): "
                         f"--member {member}/NAME")
    print(f"member {member} of {path}")
    return model


def _image_inputs(args, model) -> tuple:
    """``fbjax run --image``: the model's input from a photo (:func:`fbjax.vision.preprocess`)."""
    from .errors import InputError
    from .vision import load_image, preprocess

    if args.input:
        raise SystemExit("fbjax run: give the input either as --image PHOTO or as --input arrays, not both")
    if len(model.inputs) != 1:
        raise SystemExit(f"fbjax run: --image feeds a one-input model; this one has {len(model.inputs)} inputs "
                         f"({', '.join(s.name for s in model.inputs)}): use --input NAME=FILE.npy")
    try:
        image = load_image(args.image)
        x, how = preprocess(model, image, mean=args.mean, std=args.std)
    except FileNotFoundError:
        raise SystemExit(f"fbjax run: --image {args.image}: no such file") from None
    except InputError as e:
        raise SystemExit(f"fbjax run: {e}") from None
    print(f"input  {_spec_str(model.inputs[0].name, x.shape, x.dtype)}  ({args.image}, {image.size[0]}x{image.size[1]}: "
          f"{how})")
    return [x], image


def _image_outputs(args, model, image, outs) -> None:
    """``fbjax run --image``: what the outputs mean (top-k labels, boxes, mask, landmarks) and the overlay."""
    from .vision import draw_overlay, interpret

    res = interpret(model, [o[:1] for o in outs], top_k=args.top_k, threshold=args.threshold, locale=args.locale)
    for line in res.lines:
        print(line)
    if args.overlay:
        draw_overlay(image, res, args.overlay)
        what = [w for w, have in (("mask", res.mask is not None), (f"{len(res.boxes)} box(es)", res.boxes),
                                  (f"{len(res.keypoints)} keypoints", res.keypoints),
                                  (f"{len(res.landmarks)} landmarks", res.landmarks),
                                  (f"the top {len(res.classes)} label(s)", res.classes)) if have]
        if res.found is False:
            nothing = (f"nothing drawn: no {res.layout.subject} found ({res.layout.subject} presence "
                       f"{res.presence:.4f}, not above {args.threshold:g}); the photo as it was. Give the model "
                       f"a crop around one {res.layout.subject}")
        else:
            nothing = "nothing recognised to draw: the photo as it was"
        print(f"wrote {args.overlay} ({', '.join(what) or nothing})")
    elif res.kind in ("classifier", "detector", "segmenter", "landmarks") and res.found is not False:
        print(f"(--overlay OUT.png draws the {res.kind} output on the photo)")


def _floats(value: str) -> list:
    try:
        return [float(v) for v in value.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or comma-separated numbers, got {value!r}") from None


def cmd_convert(args) -> int:
    """``fbjax convert MODEL.onnx [OUT.rten]``: ONNX's defaults stated, then rten-convert (:mod:`fbjax.convert`)."""
    from .convert import ConversionFailed, convert, summarize_log

    try:
        report = convert(args.model, args.out, allow_changed_meaning=args.allow_changed_meaning,
                         rten_convert_args=("--v1",) if args.v1 else ())
    except ConversionFailed as e:
        if args.verbose:  # rten-convert's own output, then the summary (main prints the error)
            print(e.log, file=sys.stderr)
        else:
            print("(fbjax convert --verbose prints rten-convert's full output)", file=sys.stderr)
        raise
    for line in report.stated:
        print(f"stated ONNX default: {line}")
    for line in report.left:
        print(f"fbjax convert: warning: meaning changed (--allow-changed-meaning): {line}", file=sys.stderr)
    if report.log and args.verbose:
        print(report.log, file=sys.stderr)
    elif report.log:
        said = summarize_log(report.log)
        print(f"rten-convert said ({len(said)} message(s); --verbose prints its full output):", file=sys.stderr)
        for line in said:
            print(f"  {line}", file=sys.stderr)
    what = f"{len(report.stated)} ONNX default(s) stated" if report.stated else "no ONNX default needed stating"
    print(f"wrote {report.out} ({what}); next: fbjax run {shlex.quote(report.out)}")
    return 0


def _no_signature(error, model, key: str) -> str:
    """``--signature KEY`` naming no signature of ``model``: what to do instead."""
    if model.ir.signatures:
        return f"{error} (`fbjax inspect MODEL` lists them with their inputs)"
    return f"--signature {key}: the file defines no signatures; leave out --signature to run the model"


class _SignatureAsModel:
    """A signature runner seen as ``fbjax run`` sees a model: ``inputs``,
    ``outputs`` and a call returning a tuple in output order."""

    def __init__(self, runner):
        self.runner, self.inputs, self.outputs = runner, runner.inputs, runner.outputs

    def __call__(self, *xs):
        return tuple(self.runner(*xs).values())


def cmd_infer(args) -> int:
    """``fbjax infer MODEL --input-dir DIR --out FILE``: :func:`fbjax.infer` over every device."""
    import jax

    from . import infer, load
    from .batch_inference import FILE_NAMES_KEY, check_out_path, effective_step_size, example_files

    # what can be checked without the model first (infer checks again, cheaply)
    check_out_path(args.out)
    n = len(example_files(args.inputs))
    from .errors import InputError

    if args.signature is None:
        # loaded the default way (the file's shapes), as fbjax.infer takes it: on one CPU device a
        # batch-1 model whose example fills the cache runs as its own calls; infer loads it again
        # batch-polymorphic only where that runs faster or where it must (several devices, an
        # accelerator), and runs a graph the batch rewrite refuses (a ViT's MEAN over the batch)
        # as its batch-1 program vmapped over the examples
        model = load(args.model, format=args.format, quantized=args.quantized,
                     constant_inputs=_constant_inputs(args), static_bounds=args.static_bounds)
    else:  # one entry point, at the file's shapes (a batch-1 signature runs vmapped over the examples)
        loaded = load(args.model, format=args.format, quantized=args.quantized,
                      constant_inputs=_constant_inputs(args), static_bounds=args.static_bounds)
        try:
            model = loaded.signature(args.signature)
        except InputError as e:
            raise SystemExit(f"fbjax infer: {_no_signature(e, loaded, args.signature)}") from None
        if model.has_fixed_shapes():
            model = model.over_examples()
    n_dev = jax.local_device_count()  # infer's default mesh: every device; this process's share of the batch
    eff = effective_step_size(args.step_size, n_dev)
    if args.step_size is None:
        how = "default: 8 per device"
    elif eff != args.step_size:
        how = f"{args.step_size} rounded up to a multiple of {n_dev} devices; {eff // n_dev} per device"
    else:
        how = f"{eff // n_dev} per device"
    print(f"model {os.path.basename(args.model)}: per example "
          + ", ".join(_spec_str(s.name, s.shape[1:], s.dtype) for s in model.inputs)
          + " (the model's inputs without the batch dimension)")
    print(f"{n} examples in {args.inputs}; {len(jax.devices())} device(s) ({jax.default_backend()}); "
          f"step size {eff} examples ({how})")
    t0 = time.perf_counter()
    try:
        out = infer(model, args.inputs, step_size=args.step_size, out=args.out, progress=not args.no_progress)
    except InputError as e:
        if args.signature is not None or not str(e).startswith("batch_size:"):
            raise
        # the batch-polymorphic rewrite refused where infer needs it: say why and what else works
        raise SystemExit(f"fbjax infer: {_infer_needs(args.model, e)}") from None
    dt = time.perf_counter() - t0
    order = f"sorted file-name order, names in {FILE_NAMES_KEY!r}" if out.endswith(".npz") else "sorted file-name order"
    print(f"wrote {out}: {n} examples ({order}) in {dt:.2f} s ({n / dt:.1f} examples/s, including compilation)")
    return 0


def _infer_needs(path: str, error) -> str:
    """Why ``fbjax infer`` cannot batch the model at ``path`` (the batch-1
    rewrite of ``fbjax.load(path, batch_size=None)`` raised ``error``), and
    what to do instead."""
    from .formats import read_model

    msg = (f"it batches the examples itself: a model whose inputs lead with a batch of 1 runs as its own "
           f"calls on one CPU device, anything else needs the model batch-polymorphic "
           f"(fbjax.load(path, batch_size=None)), which this model refuses: {error}")
    sigs = read_model(path).signatures
    if sigs:
        return msg + (f". The file has signatures ({', '.join(sigs)}): --signature KEY runs one over the examples "
                      "(vmapped when its inputs have a leading 1)")
    return msg + ". `fbjax run MODEL --input NAME=FILE.npy` runs it on one batch as stored"


def _int_at_least(lowest: int, what: str):
    """argparse ``type=`` for ints >= ``lowest`` (``what`` names them in the error)."""
    def parse(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            n = None
        if n is None or n < lowest:
            raise argparse.ArgumentTypeError(f"expected {what}, got {value!r}")
        return n
    return parse


_positive_int = _int_at_least(1, "a positive int")
_nonnegative_int = _int_at_least(0, "an int >= 0")


def _parse_batch(value: str):
    if value in ("dynamic", "none", "None"):
        return None
    if value == "file":
        return "file"
    try:
        n = int(value)
    except ValueError:
        n = None
    if n is None or n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, 'dynamic' or 'file', got {value!r}")
    return n


def cmd_export(args) -> int:
    """``fbjax export MODEL --to stablehlo|mlir OUT``: see :func:`fbjax.export.export_model`."""
    from . import load
    from .export import export_model

    folder = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(folder):
        raise SystemExit(f"fbjax export: output folder {folder} does not exist (create it first)")
    # an artifact runs where fbjax is not: no fbjax custom calls (the native CPU integer kernels) in it
    model = load(args.model, format=args.format, batch_size=args.batch_size, quantized=args.quantized,
                 constant_inputs=_constant_inputs(args), static_bounds=args.static_bounds,
                 kernel_options=KernelOptions(native_kernels=False))
    if args.signature is not None:  # one entry point: apply(params, *its inputs) -> {output name: array}
        from .errors import InputError

        try:
            model = model.signature(args.signature)
        except InputError as e:
            raise SystemExit(f"fbjax export: {_no_signature(e, model, args.signature)}") from None
    elif len(model.ir.signatures) > 1:  # say which entry point is written
        print(f"(the file has {len(model.ir.signatures)} signatures: {', '.join(model.ir.signatures)}; this exports "
              "its first subgraph: --signature KEY exports another)")
    exported, data = export_model(model, args.to, batch_size=args.batch_size)
    mode = "w" if isinstance(data, str) else "wb"
    with open(args.out, mode) as f:
        f.write(data)
    params_path = None
    if args.to == "stablehlo":
        params_path = os.path.splitext(args.out)[0] + ".params.npz"
        np.savez(params_path, **{k: np.asarray(v) for k, v in model.params.items()})
    names = ", ".join(s.name for s in model.inputs)
    print(f"wrote {args.out} ({args.to}, {len(data):,} {'chars' if mode == 'w' else 'bytes'}): "
          f"call(params, {names}) -> {len(model.outputs)} output(s)")
    if params_path:
        print(f"wrote {params_path} (the params argument, keyed by tensor name)")
        print(f"run it without fbjax: import jax, numpy as np; f = jax.export.deserialize(open({args.out!r}, "
              f"'rb').read()); outputs = f.call(dict(np.load({params_path!r})), {names})  (differentiable: "
              "jax.grad works through f.call)")
    else:
        print("StableHLO as MLIR text, to read or to feed MLIR tools (e.g. stablehlo-translate); "
              "`--to stablehlo` writes the runnable jax.export artifact")
    return 0


def _add_quantized(parser, extra: str = "") -> None:
    """The one ``--quantized`` option (``fbjax.load``'s ``quantized``)."""
    from .options import QUANTIZED_MODES

    parser.add_argument("--quantized", choices=list(QUANTIZED_MODES), default="exact",
                        help="quantized TFLite models: 'exact' (default; integer in/out, LiteRT's kernels bit for "
                        "bit) or 'float' (float32 real values in/out, weights as float params)" + extra)


def _token_list(value: str) -> list:
    """argparse ``type=`` for ``1,2,3`` (a prompt's token ids)."""
    try:
        toks = [int(t) for t in value.replace(" ", "").split(",") if t]
    except ValueError:
        toks = []
    if not toks:
        raise argparse.ArgumentTypeError(f"expected comma-separated token ids like 1,2,3, got {value!r}")
    return toks


def cmd_generate(args) -> int:
    """``fbjax generate MODEL --prompt-tokens 1,2,3``: :func:`fbjax.generate` (prefill + decode, jitted)."""
    import jax

    from . import load
    from .errors import InputError
    from .generation import generate

    if is_bundle(args.model):
        return generate_bundle(args)
    if args.prompt and not args.prompt_tokens:  # text for a file that is no bundle: what it is, what it takes
        raise SystemExit(f"fbjax generate: {not_a_bundle('generate', args.model)}")
    if not args.prompt_tokens:
        raise SystemExit("fbjax generate: a .tflite takes token ids: --prompt-tokens 1,2,3 (--prompt TEXT needs a "
                         ".litertlm or LLM .task bundle, which holds a tokenizer)")
    args.temperature = 0.0 if args.temperature is None else args.temperature
    args.seed = 0 if args.seed is None else args.seed
    args.max_new_tokens = 32 if args.max_new_tokens is None else args.max_new_tokens
    if args.top_k is not None and args.temperature <= 0:  # (checked before loading; fbjax.generate checks too)
        raise SystemExit("fbjax generate: --top-k K samples among the K best tokens, so it needs --temperature > 0 "
                         "(e.g. --temperature 0.8); without --temperature decoding is greedy")
    model = load(args.model, quantized=args.quantized)
    prompts = args.prompt_tokens
    key = jax.random.key(args.seed)
    kw = dict(temperature=args.temperature, top_k=args.top_k, key=key, prefill=args.prefill)
    try:
        t0 = time.perf_counter()
        toks = generate(model, prompts, args.max_new_tokens, **kw)
        t_first = time.perf_counter() - t0
        t1 = time.perf_counter()
        generate(model, prompts, args.max_new_tokens, **kw)
        dt = time.perf_counter() - t1
    except InputError as e:
        msg = str(e)
        raise SystemExit(f"fbjax generate: {msg.removeprefix('generate: ')}") from None
    for p, row in zip(prompts, toks):
        print(f"prompt {','.join(map(str, p))} -> {','.join(map(str, row.tolist()))}")
    n = len(prompts) * args.max_new_tokens
    print(f"first call (trace + compile + run): {t_first:.2f} s; second call: {dt * 1e3:.1f} ms for {n} new "
          f"tokens ({n / dt:.1f} tokens/s, prefill included) on {jax.default_backend()}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``fbjax`` command-line parser (subcommands inspect, run, infer, export, bench)."""
    p = argparse.ArgumentParser(
        prog="fbjax",
        description="Run flatbuffer ML models (.tflite, .rten, stablehlo.flatbuf, TFLite GPU delegate .bin) as "
        "jitted JAX functions.",
        epilog="Examples:\n  fbjax run                      # bundled selfie-segmentation model\n"
        "  fbjax inspect model.tflite\n  fbjax run model.tflite --input input_1=x.npy --output out.npz\n"
        "  fbjax infer model.tflite --input-dir samples/ --out preds.npz\n"
        "  fbjax generate llm.tflite --prompt-tokens 1,2,3   # litert-torch prefill/decode signatures\n"
        "  fbjax export model.tflite --to stablehlo model.jax\n"
        "  fbjax serve model.litertlm --port 8000          # OpenAI-compatible HTTP server for an LLM bundle\n"
        "  fbjax run model.tflite --image photo.jpg --overlay out.png   # labels, boxes, masks from TFLite metadata\n"
        "  fbjax convert model.onnx model.rten   # ONNX -> .rten (rten-convert, ONNX defaults stated)\n"
        "`fbjax COMMAND --help` describes each command's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from . import __version__

    p.add_argument("--version", action="version", version=f"fbjax {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    pi = sub.add_parser("inspect", help="show format, inputs/outputs, op histogram, params, unsupported ops")
    pi.add_argument("model", nargs="?", help="path to a model file (.tflite, .rten, stablehlo.flatbuf or a TFLite "
                    "GPU delegate .bin); omitted: the bundled default model")
    pi.add_argument("--code", metavar="NODE", help="GPU delegate .bin: print node NODE's OpenCL source "
                    "(its position, or its name as inspect lists it, e.g. 'convolution_2d 12 -> relu 13' "
                    "or 'convolution_2d 12')")
    _add_format(pi)
    _add_constant_input(pi)  # inspect judges "can run" as fbjax.load(path, constant_inputs=, static_bounds=) does
    pi.add_argument("--metadata-json", action="store_true",
                    help="print only the file's TFLite metadata as JSON (flatc's form, as TFLite Support's "
                         "MetadataDisplayer prints it; a .task bundle: one entry per member)")
    pi.set_defaults(func=cmd_inspect)
    pr = sub.add_parser(
        "run",
        help="run a model on given or random inputs and print outputs and timings",
        description="Run a model jitted. Inputs not given are seeded random arrays of the right "
        "shape and dtype (floats in [0, 1); quantized inputs: any 8-bit code; other integers, mostly indices: [0, 8)). Prints output summaries, time to first "
        "result and "
        "steady-state latency.",
    )
    pr.add_argument("model", nargs="?", help="model file; omitted: the bundled default model")
    pr.add_argument("--input", "-i", dest="input", action="append", metavar="NAME=FILE.npy",
                    help="one model input from a .npy file, with the model's full shape (batch included; "
                    "repeatable; NAME may be omitted for one-input models), or an .npz holding inputs by name")
    pr.add_argument("--inputs", dest="input", action="append", help=argparse.SUPPRESS)  # old spelling of --input
    pr.add_argument("--output", "-o", metavar="OUT.npz",
                    help="save the outputs to an .npz file (.npz is appended to a name without it)")
    pr.add_argument("--repeat", type=_nonnegative_int, default=20, metavar="N",
                    help="timed runs after the first (default 20; 0 to skip)")
    pr.add_argument("--signature", "-s", metavar="KEY", default=None,
                    help="run this signature (entry point) of the file instead of its first subgraph; "
                         "`fbjax inspect MODEL` lists the keys and their input names")
    pr.add_argument("--member", metavar="NAME", default=None,
                    help="for a MediaPipe Tasks .task bundle: the member model to run (`fbjax inspect BUNDLE.task` "
                         "lists them; NAME/INNER for a nested bundle)")
    img = pr.add_argument_group("images (TFLite vision models; needs Pillow: pip install 'fbjax[image]')")
    img.add_argument("--image", metavar="PHOTO", default=None,
                     help="run on this picture (JPEG, PNG...): resized to the input and normalized as the file's "
                          "TFLite metadata says; classifiers print their top labels, detectors their boxes")
    img.add_argument("--overlay", metavar="OUT.png", default=None,
                     help="with --image: write the picture with the boxes, keypoints, landmarks or mask drawn on it")
    img.add_argument("--mean", type=_floats, default=None, metavar="M[,M,M]",
                     help="normalization mean on 0..255 pixels (x - mean) / std, one value or one per channel; "
                          "overrides the metadata (needed for float models without metadata)")
    img.add_argument("--std", type=_floats, default=None, metavar="S[,S,S]", help="normalization std (see --mean)")
    img.add_argument("--top-k", type=_positive_int, default=5, metavar="K", help="labels printed per classifier (5)")
    img.add_argument("--threshold", type=float, default=0.5, metavar="T", help="minimum detection score (0.5)")
    img.add_argument("--locale", default=None, metavar="LANG",
                     help="label language when the metadata has several (e.g. fr; default: the first)")
    _add_quantized(pr)
    _add_format(pr)
    _add_constant_input(pr)
    pr.set_defaults(func=cmd_run)
    pc = sub.add_parser(
        "convert",
        help="convert an ONNX model to .rten (ONNX's defaults stated, then rten-convert)",
        description="Convert an ONNX model to .rten with rten-convert 0.22 (pip install 'fbjax[onnx]'). "
        "rten-convert writes a Softmax/LogSoftmax that leaves out `axis` with axis 0, which is not ONNX's default "
        "(-1 from opset 13, 1 before); this states ONNX's default in a copy of the model first and says so, and "
        "refuses to write a file whose meaning would still differ from the ONNX model's.")
    pc.add_argument("model", help="the .onnx model")
    pc.add_argument("out", nargs="?", default=None, help="the .rten to write (default: MODEL with .rten)")
    pc.add_argument("--allow-changed-meaning", action="store_true",
                    help="write the file even where an ONNX default cannot be stated (it then computes something "
                         "else there; each such node is named)")
    pc.add_argument("--v1", action="store_true", help="write the older .rten v1 layout (files under 2 GB)")
    pc.add_argument("--verbose", "-v", action="store_true",
                    help="print rten-convert's own output in full (default: one line per distinct message)")
    pc.set_defaults(func=cmd_convert)

    pg = sub.add_parser(
        "generate",
        help="generate text with an LLM bundle (.litertlm, LLM .task), or tokens with a prefill/decode .tflite",
        description="A bundle (.litertlm or MediaPipe LLM .task): --prompt TEXT is templated, tokenized and the "
        "generated text streamed, with the bundle's start/stop tokens and sampler (as the LiteRT-LM runtime). "
        "A .tflite (litert-torch prefill/decode signatures): prefill the prompt(s), then decode --max-new-tokens "
        "tokens in one jitted loop (fbjax.generate), greedy by default; prints the new token ids (ids in, ids out).",
    )
    pg.add_argument("model", help="a .litertlm or LLM .task bundle, or a .tflite with prefill_N and decode "
                    "signatures (e.g. from litert-torch)")
    pg.add_argument("--prompt", action="append", metavar="TEXT", help="bundles: a prompt; repeat for several")
    pg.add_argument("--no-template", action="store_true", help="bundles: feed the prompt without the bundle's "
                    "prompt template (LiteRT-LM's --no-template)")
    pg.add_argument("--verbose", "-v", action="store_true", help="bundles: print where the time goes to stderr "
                    "(start-up and imports, load, first token with compilation, generation)")
    pg.add_argument("--prompt-tokens", "-p", dest="prompt_tokens", type=_token_list, action="append",
                    metavar="1,2,3", help=".tflite: a prompt's token ids; repeat for a batch of prompts")
    pg.add_argument("--max-new-tokens", "-n", type=_positive_int, default=None, metavar="N",
                    help="decode steps (.tflite: 32; bundles: until a stop token or the KV cache is full)")
    add_sampler_options(pg)
    pg.add_argument("--prefill", default=None, metavar="KEY", help="prefill signature (default: the longest)")
    _add_quantized(pg)
    pg.set_defaults(func=cmd_generate)
    add_chat_parser(sub, _add_quantized)
    add_serve_parser(sub, _add_quantized)
    pf = sub.add_parser(
        "infer",
        help="batch inference over every device on a directory of .npy/.npz samples",
        description="Run every sample in DIR (one .npy per sample of a single-input model, or one .npz "
        "per sample holding one array per input; each file is ONE example WITHOUT the batch dimension, "
        "e.g. (256, 256, 3) for a model input of (1, 256, 256, 3)) through the model, data-parallel over all devices "
        "(fbjax.infer), streaming the results to an .npy/.npz file. Results are in sorted file-name order "
        "(row i of each output is the i-th file of DIR sorted by name); an .npz output also holds those "
        "file names as the string array '__files__' (never an output's key).",
    )
    pf.add_argument("model", help="model file stored with batch 1 (loaded the default way; on one CPU device it runs "
                    "as its own batch-1 calls, else, or where that is faster, loaded again batch-polymorphic)")
    pf.add_argument("--input-dir", "--inputs", dest="inputs", required=True, metavar="DIR",
                    help="directory of per-example .npy/.npz files, each without the batch dimension "
                    "(--inputs: the old spelling)")
    pf.add_argument("--step-size", "--batch-size", dest="step_size", type=_positive_int, default=None, metavar="N",
                    help="examples per step, fbjax.infer's step_size (default 8 per device; rounded up to a multiple "
                    "of the device count); --batch-size is the older spelling")
    pf.add_argument("--out", required=True, metavar="FILE",
                    help="output .npz (keys: output names, plus '__files__') or .npy (one-output models); "
                    "its folder must exist")
    pf.add_argument("--no-progress", action="store_true", help="no progress bar")
    pf.add_argument("--signature", "-s", metavar="KEY", default=None,
                    help="run this signature (entry point) of the file; .npz samples keyed by its input names. "
                    "A batch-1 signature (litert-torch) runs vmapped: each sample is an input without its "
                    "leading 1 (rank-0/1 inputs such as positions whole)")
    _add_quantized(pf)
    _add_format(pf)
    _add_constant_input(pf)
    pf.set_defaults(func=cmd_infer)
    pe = sub.add_parser(
        "export",
        help="write a jax.export artifact (StableHLO, differentiable) or the StableHLO text",
        description="--to stablehlo: a serialized jax.export artifact of apply(params, *inputs) "
        "including its VJP (stays differentiable after jax.export.deserialize), plus the weights next to it (OUT with its extension replaced by .params.npz); "
        "--to mlir: the StableHLO module as MLIR text.",
    )
    pe.add_argument("model", help="model file")
    pe.add_argument("--to", required=True, choices=["stablehlo", "mlir"],
                    help="'stablehlo': a serialized jax.export artifact (binary; jax.export.deserialize, "
                    "differentiable) plus OUT's .params.npz; 'mlir': the same program as StableHLO MLIR text. "
                    "Neither is the stablehlo.flatbuf file format fbjax reads (that one is written by "
                    "fbjax.export.to_stablehlo_flatbuffer)")
    pe.add_argument("out", help="output file")
    pe.add_argument("--batch-size", type=_parse_batch, default="file", metavar="N|dynamic|file",
                    help="batch of the exported function: the file's (default), an int, or 'dynamic' (symbolic)")
    pe.add_argument("--signature", "-s", metavar="KEY", default=None,
                    help="export this signature (fbjax inspect lists them): call(params, *its inputs in the "
                    "signature's order) -> {output name: array}; default: the first subgraph")
    _add_quantized(pe, " (exact: the integer weights are constants in the artifact, the .params.npz is empty)")
    _add_format(pe)
    _add_constant_input(pe)
    pe.set_defaults(func=cmd_export)
    from .bench import add_arguments as _bench_args, run_cli as _bench_run  # `fbjax bench` (fbjax/bench.py)

    pb = sub.add_parser(
        "bench", help="benchmark against LiteRT / onnxruntime: latency, throughput, first call, RSS",
        description="fbjax vs LiteRT (.tflite) or onnxruntime (light:NAME, .rten from the onnx wheel's light "
        "models), interleaved in one process: batch-1 latency, batch-N throughput, first call cold and warm, "
        "peak RSS. Needs ai-edge-litert / onnxruntime (pip install '.[test]').")
    _bench_args(pb)
    pb.set_defaults(func=_bench_run)
    p.subcommand_parsers = dict(sub.choices)  # for main's errors with the subcommand's usage
    return p


def _warn_line(command: str, message) -> str:
    """A warning as the CLI prints it, ``fbjax COMMAND: warning: ...``
    (``warnings.formatwarning`` while a command runs; stdout is flushed first
    so that the warning follows what was printed before it)."""
    sys.stdout.flush()
    return f"fbjax {command}: warning: {message}\n"


#: optional top-level packages -> the fbjax extra that installs them (pyproject.toml)
_EXTRAS = {"sentencepiece": "llm", "tokenizers": "llm", "jinja2": "llm", "PIL": "image", "onnx": "onnx",
           "rten_convert": "onnx", "apache_beam": "beam", "starlette": "serve", "uvicorn": "serve"}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``fbjax`` entry point: fbjax's own errors print one line and return 1."""
    from .errors import FbjaxError

    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # reported with the subcommand's usage line, not the top-level one
        sub = parser.subcommand_parsers.get(getattr(args, "command", None) or "", parser)
        sub.error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    if args.command in ("run", "infer", "export") and is_bundle(getattr(args, "model", None)):
        print(f"fbjax {args.command}: {args.model} is an LLM bundle (text in, text out): use `fbjax generate "
              f"{args.model} --prompt TEXT`, `fbjax chat` or `fbjax inspect`; in Python, fbjax.load(...).model is "
              "its prefill/decode model", file=sys.stderr)
        return 1
    try:
        formatwarning = warnings.formatwarning  # one line each, not Python's "file:line: UserWarning" + source
        warnings.formatwarning = lambda message, *_a, **_k: _warn_line(args.command, message)
        try:
            rc = args.func(args)
        finally:
            warnings.formatwarning = formatwarning
        sys.stdout.flush()  # here, so that a closed pipe is the BrokenPipeError below, not one at exit
        return rc
    except FbjaxError as e:
        print(f"fbjax {args.command}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except FileNotFoundError as e:
        print(f"fbjax {args.command}: " + (f"{e.filename}: no such file" if e.filename else str(e)), file=sys.stderr)
        return 1
    except ImportError as e:  # an optional package missing (fbjax's extras): one line naming the extra
        name = (e.name or "").split(".")[0]
        if "pip install" in str(e):  # fbjax's own hint (the tokenizer's, Pillow's...)
            print(f"fbjax {args.command}: {e}", file=sys.stderr)
        elif name in _EXTRAS:
            print(f"fbjax {args.command}: this needs the {name!r} package, which is not installed: "
                  f"pip install 'fbjax[{_EXTRAS[name]}]'", file=sys.stderr)
        else:
            raise
        return 1
    except BrokenPipeError:  # `fbjax inspect M --code N | head`: the reader left; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (the exit's flush would raise again)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
