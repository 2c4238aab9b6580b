"""Quantization-aware fine-tuning of a full-integer int8 TFLite model, checked bit for bit in LiteRT.

The model is the small SSD-style detection head committed as a test fixture
(``tests/data/quant/models/ssd_head_int8.tflite``: int8 weights and
activations, int8 input 1x32x32x3, two int8 outputs of 704 anchors x 4:
sigmoid class scores and box offsets; random weights, made by
``tests/data/quant/generate.py`` with the TFLite converter). The example
teaches it a task on data it makes itself: find a coloured square on a noisy
background and say its colour (red, green, blue or white: the 4 classes)
at the anchors whose cell centre lies in the square.

``fbjax.load(path, quantized="float")`` turns the int8 weights into float32
``params`` and the int8 graph input/outputs into float32 real values. Its
forward pass still runs TFLite's integer kernels bit for bit (the float
weights re-quantized with the file's scales on every call); its gradient is
that of the float ops with straight-through roundings. Only the two 3x3
class-score convolutions (int8 kernels and int32 biases) are trained, chosen with
``fbjax.trainable``; the backbone stays frozen.

Steps: load -> loss before (held-out set) -> ``--steps`` Adam steps on fresh
batches -> loss after -> ``model.save(...)`` (weights re-quantized with the
file's scales) -> run the saved file in LiteRT on the quantized held-out
inputs and compare, element by element, with fbjax's float-mode forward of
the trained params. Quantization-aware training promises that they are
*equal*: the example exits with status 1 if any output element differs.

    python examples/qat_finetune.py              # ~10 s on 2 CPU cores
    python examples/qat_finetune.py --steps 3    # smoke test

Needs ``optax`` (``pip install '.[examples]'``) and, for the check,
``ai-edge-litert`` (without it the check is skipped with a message).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

try:  # a fresh clone without `pip install .`: use the repository's fbjax
    import fbjax  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODEL = os.path.join(ROOT, "tests", "data", "quant", "models", "ssd_head_int8.tflite")

#: The two class-score convolutions (3x3, at 16x16 and 8x8; conv2d_5_1 and
#: conv2d_7_1 are the box convolutions, which this task leaves alone). Their
#: int32 biases have converter-made names (``arith.constant5``), so they are
#: found through the graph (:func:`with_biases`).
HEAD = ["*/conv2d_4_1/*", "*/conv2d_6_1/*"]

#: Square colours (RGB in [-1, 1]); the class index is the colour's index.
COLOURS = np.array([[1.0, -0.6, -0.6], [-0.6, 1.0, -0.6], [-0.6, -0.6, 1.0], [1.0, 1.0, 1.0]], np.float32)
#: Anchor grids of the two outputs, in output order: (cells per side, anchors per cell).
GRIDS = ((16, 2), (8, 3))


def make_batch(rng: np.random.Generator, n: int, scale: float, zero_point: int, size: int = 32):
    """``n`` quantized images (int8, NHWC) and their targets.

    Each image is a dim noisy background with one square (side 6-12 px) of
    one of the :data:`COLOURS`. The target is a (704, 4) array: 1 at
    (anchor, colour) for anchors whose cell centre lies in the square, else
    0 -- the anchor order of the model's output (16x16 cells x 2 anchors,
    then 8x8 cells x 3).
    """
    images = np.empty((n, size, size, 3), np.float32)
    targets = np.zeros((n, sum(g * g * a for g, a in GRIDS), 4), np.float32)
    for i in range(n):
        img = rng.uniform(-1.0, -0.3, 3).astype(np.float32) + rng.normal(0, 0.15, (size, size, 3))
        side = int(rng.integers(6, 13))
        y0, x0 = rng.integers(0, size - side + 1, 2)
        c = int(rng.integers(len(COLOURS)))
        img[y0:y0 + side, x0:x0 + side] = COLOURS[c] + rng.normal(0, 0.1, (side, side, 3))
        images[i] = img
        k = 0
        for cells, anchors in GRIDS:
            centre = (np.arange(cells) + 0.5) * (size / cells)
            inside_y = (centre >= y0) & (centre < y0 + side)
            inside_x = (centre >= x0) & (centre < x0 + side)
            cell = np.repeat((inside_y[:, None] & inside_x[None, :]).reshape(-1), anchors)
            targets[i, k:k + cell.size, c] = cell
            k += cell.size
    q = np.clip(np.round(images / scale) + zero_point, -128, 127).astype(np.int8)
    return q, targets


def with_biases(model, patterns) -> list:
    """The param names of the operators whose weights match ``patterns``:
    the weights and every other float param they read (biases)."""
    import fnmatch

    params = set(model.params)
    chosen = set()
    for node in model.ir.main_graph.nodes:
        names = [v.name for v in node.inputs if v is not None]
        if any(fnmatch.fnmatchcase(n, p) for n in names for p in patterns):
            chosen.update(n for n in names if n in params)
    return sorted(chosen)


def score_range(path) -> tuple:
    """The range of the class scores the file can produce: the sigmoid of
    the quantization range of the LOGISTIC's int8 input, rounded to the
    output's steps (read from the file's int8 graph, "exact" mode)."""
    import fbjax

    for node in fbjax.load(path).ir.main_graph.nodes:
        if node.op_name == "LOGISTIC":
            qi, qo = node.inputs[0].quant, node.outputs[0].quant
            ends = (np.array([-128, 127]) - int(qi.zero_point[0])) * float(qi.scale[0])
            p = 1.0 / (1.0 + np.exp(-ends))
            steps = np.round(p / float(qo.scale[0])) + int(qo.zero_point[0])
            lo, hi = (steps - int(qo.zero_point[0])) * float(qo.scale[0])
            return float(lo), float(hi)
    raise ValueError(f"{path}: no LOGISTIC operator")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL, help="ssd_head_int8.tflite (default: the test fixture)")
    ap.add_argument("--steps", type=int, default=300, help="Adam steps (default 300; e.g. 3 for a quick check)")
    ap.add_argument("--batch", type=int, default=16, help="examples per step (default 16)")
    ap.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate (default 3e-3)")
    ap.add_argument("--eval", type=int, default=32, help="held-out examples for the before/after loss")
    ap.add_argument("--out-dir", default="qat_out", help="where qat_finetuned.tflite goes (default qat_out)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the synthetic data (default 0)")
    args = ap.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import optax

    import fbjax

    if not os.path.isfile(args.model):
        print(f"model file not found: {args.model} (pass --model)", file=sys.stderr)
        return 2
    os.makedirs(args.out_dir, exist_ok=True)
    t_start = time.perf_counter()

    # Float mode: int8 weights -> float32 params, int8 input/outputs -> float32
    # real values. The input's scale and zero point (to make int8 images and
    # to dequantize them) are read from the file's own int8 input, which the
    # default "exact" mode keeps.
    model = fbjax.load(args.model, quantized="float", batch_size=None)
    qin = fbjax.load(args.model).ir.main_graph.inputs[0].quant
    s_in, z_in = float(qin.scale[0]), int(qin.zero_point[0])
    train, frozen = fbjax.trainable(model.params, include=with_biases(model, HEAD))
    n_train = sum(int(np.size(v)) for v in train.values())
    n_all = sum(int(np.size(v)) for v in model.params.values())
    print(f"model: {os.path.basename(args.model)}  inputs {model.inputs}  (int8 in the file: scale {s_in:.6g}, "
          f"zero point {z_in})")
    print(f"training {len(train)} tensors ({n_train:,} of {n_all:,} weights): {', '.join(train)}")

    def real(q):  # int8 images -> the real values float mode takes: (q - zero_point) * scale
        return (q.astype(np.float32) - np.float32(z_in)) * np.float32(s_in)

    # The activations keep the file's scales: the head can move its outputs
    # only within the ranges the converter calibrated (this fixture's logits:
    # about [-0.09, 0.14], so scores in [0.477, 0.535]). The targets are the
    # two ends of that range: high = "this colour here", low = "not here".
    lo, hi = score_range(args.model)
    print(f"class scores can range over [{lo:.4f}, {hi:.4f}] (the file's logit quantization range)")

    def loss_of(scores, y):
        """Mean squared distance to the target ends of the score range, in
        units of the range, positives and negatives weighted equally (the
        square covers a few % of the anchors): 0.25 at the midpoint, 0 when
        perfect."""
        e = ((scores - (lo + (hi - lo) * y)) / (hi - lo)) ** 2
        pos = jnp.sum(y * e) / jnp.maximum(jnp.sum(y), 1.0)
        neg = jnp.sum((1 - y) * e) / jnp.maximum(jnp.sum(1 - y), 1.0)
        return 0.5 * (pos + neg)

    def loss_fn(t, x, y):
        scores, _boxes = model.apply({**frozen, **t}, x)
        return loss_of(scores, y)

    def hit_rate(scores, y):
        """How often the highest (anchor, class) score is a positive -- the
        right colour at an anchor inside the square -- averaged over images
        (the scores have few levels: tied top entries count fractionally)."""
        s, y = np.asarray(scores).reshape(len(y), -1), y.reshape(len(y), -1)
        top = s == s.max(axis=1, keepdims=True)
        return float(np.mean(np.sum(top * y, axis=1) / np.sum(top, axis=1)))

    opt = optax.adam(args.lr)

    @jax.jit
    def step(t, state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(t, x, y)
        updates, state = opt.update(grads, state, t)
        return optax.apply_updates(t, updates), state, loss

    forward = jax.jit(lambda t, x: model.apply({**frozen, **t}, x))
    rng = np.random.default_rng(args.seed)
    q_eval, y_eval = make_batch(np.random.default_rng(args.seed + 1000), args.eval, s_in, z_in)
    x_eval = real(q_eval)
    scores0, _ = forward(train, x_eval)
    before, hits0 = float(loss_of(scores0, y_eval)), hit_rate(scores0, y_eval)
    print(f"held-out loss before: {before:.4f}  (top score on the right colour in the square: {hits0:.0%})")

    state = opt.init(train)
    t0 = time.perf_counter()
    for i in range(args.steps):
        q, y = make_batch(rng, args.batch, s_in, z_in)
        train, state, loss = step(train, state, real(q), y)
        if i % max(1, args.steps // 10) == 0 or i == args.steps - 1:
            print(f"step {i:4d}  loss {float(loss):.4f}  ({time.perf_counter() - t0:.1f} s)")
    ours = [np.asarray(o) for o in forward(train, x_eval)]  # float-mode forward, trained params
    after, hits1 = float(loss_of(ours[0], y_eval)), hit_rate(ours[0], y_eval)
    print(f"held-out loss after:  {after:.4f}  (top score on the right colour in the square: {hits1:.0%}; "
          f"{args.steps} steps, {time.perf_counter() - t0:.1f} s)")

    # Save: the float weights are re-quantized with the file's scales and
    # zero points (requantize="file"); everything else is the file's.
    saved = os.path.join(args.out_dir, "qat_finetuned.tflite")
    model.save(saved, train)
    print(f"wrote {saved}")

    report = {"loss_before": before, "loss_after": after, "hits_before": hits0, "hits_after": hits1,
              "steps": args.steps}
    status = 0
    try:
        from ai_edge_litert.interpreter import Interpreter, OpResolverType
    except ImportError:
        print("ai-edge-litert is not installed: LiteRT check skipped")
    else:
        # LiteRT's builtin kernels without XNNPACK: the kernels float mode reproduces.
        interp = Interpreter(model_path=saved, num_threads=1,
                             experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
        interp.allocate_tensors()
        i_in = interp.get_input_details()[0]["index"]
        outs = interp.get_output_details()
        lit = [[] for _ in outs]
        for i in range(len(q_eval)):
            interp.set_tensor(i_in, q_eval[i:i + 1])
            interp.invoke()
            for k, d in enumerate(outs):
                s, z = d["quantization"]
                q_out = interp.get_tensor(d["index"]).astype(np.float32)
                lit[k].append((q_out - np.float32(z)) * np.float32(s))  # dequantized: (q - zero_point) * scale
        lit = [np.concatenate(v) for v in lit]
        equal = sum(int(np.sum(a == b)) for a, b in zip(ours, lit))
        total = sum(a.size for a in ours)
        lit_loss = float(loss_of(lit[0], y_eval))
        print(f"LiteRT on {saved}: {equal}/{total} output elements equal to fbjax's float-mode forward "
              f"({100.0 * equal / total:.4f}% equal); held-out loss in LiteRT {lit_loss:.4f} (fbjax {after:.4f})")
        report.update(litert_equal=equal, litert_total=total, litert_equal_fraction=equal / total,
                      litert_loss=lit_loss)
        if equal != total:
            diff = [np.flatnonzero(a != b)[:5].tolist() for a, b in zip(ours, lit)]
            print(f"MISMATCH: first differing flat indices per output: {diff}", file=sys.stderr)
            status = 1
    report["seconds"] = time.perf_counter() - t_start
    with open(os.path.join(args.out_dir, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    return status


if __name__ == "__main__":
    sys.exit(main())
