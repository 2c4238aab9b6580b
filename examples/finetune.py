"""Fine-tune a real TFLite model with optax, save it with Model.save, check it in LiteRT.

The model is MediaPipe's selfie segmentation (bundled with fbjax; any copy of
``mediapipe_selfie_segmentation.tflite`` works with ``--model``): 256x256 RGB
in, a per-pixel foreground probability out. The example teaches it a new
task on data it makes itself: segment a random coloured ellipse on a
textured background. Only the last layers (the decoder head: the final 1x1
convolutions, the last depthwise convolution and the transposed-convolution
``segment`` layer) are trained, chosen by name with ``fbjax.trainable``; the
rest stays frozen, so each step back-propagates through the head only.

Steps: load batch-polymorphic -> loss before -> ``--steps`` Adam steps on
fresh batches -> loss after (on a fixed held-out set) -> loss-curve PNG ->
``model.save(...)`` -> run the saved file in LiteRT and compare with fbjax.

    python examples/finetune.py                 # 30-40 s on 2 CPU cores (held-out loss 0.84 -> 0.17)
    python examples/finetune.py --steps 5       # smoke test

Needs ``optax`` and ``matplotlib`` (``pip install '.[examples]'``); the
LiteRT check needs ``ai-edge-litert`` (skipped with a message without it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

import numpy as np

try:  # a fresh clone without `pip install .`: use the repository's fbjax
    import fbjax  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def make_batch(rng: np.random.Generator, n: int, size: int = 256):
    """``n`` images (float32 in [0, 1], NHWC) and their ellipse masks."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    images = np.empty((n, size, size, 3), np.float32)
    masks = np.empty((n, size, size, 1), np.float32)
    for i in range(n):
        # background: smooth random colour gradient plus noise
        c0, c1 = rng.random(3), rng.random(3)
        t = (xx * rng.uniform(-1, 1) + yy * rng.uniform(-1, 1)) % 1.0
        bg = c0 * (1 - t[..., None]) + c1 * t[..., None]
        bg += rng.normal(0, 0.08, bg.shape)
        # foreground: a rotated ellipse of another colour
        cx, cy = rng.uniform(0.3, 0.7, 2)
        ax, ay = rng.uniform(0.12, 0.3, 2)
        th = rng.uniform(0, np.pi)
        u = (xx - cx) * np.cos(th) + (yy - cy) * np.sin(th)
        v = -(xx - cx) * np.sin(th) + (yy - cy) * np.cos(th)
        m = ((u / ax) ** 2 + (v / ay) ** 2 <= 1.0).astype(np.float32)
        fg = rng.random(3) * 0.8 + 0.1
        img = bg * (1 - m[..., None]) + fg * m[..., None]
        images[i] = np.clip(img, 0, 1)
        masks[i, ..., 0] = m
    return images, masks


HEAD = ["segment/*", "conv2d_41/*", "conv2d_42/*", "depthwise_conv2d_10/*"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="path to mediapipe_selfie_segmentation.tflite (default: the bundled copy)")
    ap.add_argument("--steps", type=int, default=300, help="Adam steps (default 300; e.g. 3 for a quick check)")
    ap.add_argument("--batch", type=int, default=2, help="examples per step (default 2)")
    ap.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate (default 3e-3)")
    ap.add_argument("--eval", type=int, default=8, help="held-out examples for the before/after loss")
    ap.add_argument("--train", action="append", metavar="GLOB",
                    help=f"tensor-name glob of the weights to train (repeatable; default {HEAD})")
    ap.add_argument("--out-dir", default="finetune_out", help="where loss.png and finetuned.tflite go (default finetune_out)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the synthetic data (default 0)")
    args = ap.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import optax

    import fbjax
    from fbjax.data import DEFAULT_MODEL

    path = args.model or DEFAULT_MODEL
    os.makedirs(args.out_dir, exist_ok=True)
    model = fbjax.load(path, batch_size=None)
    train, frozen = fbjax.trainable(model.params, include=args.train or HEAD, dtype=jnp.float32)
    n_train = sum(int(np.size(v)) for v in train.values())
    n_all = sum(int(np.size(v)) for v in model.params.values())
    print(f"model: {os.path.basename(path)}  inputs {model.inputs}")
    print(f"training {len(train)} tensors ({n_train:,} of {n_all:,} weights): {', '.join(train)}")

    def loss_fn(t, x, y):
        p = model.apply({**frozen, **t}, x)
        p = jnp.clip(p, 1e-6, 1 - 1e-6)
        return -jnp.mean(y * jnp.log(p) + (1 - y) * jnp.log1p(-p))  # binary cross-entropy

    opt = optax.adam(args.lr)

    @jax.jit
    def step(t, state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(t, x, y)
        updates, state = opt.update(grads, state, t)
        return optax.apply_updates(t, updates), state, loss

    eval_loss = jax.jit(loss_fn)
    rng = np.random.default_rng(args.seed)
    x_eval, y_eval = make_batch(np.random.default_rng(args.seed + 1000), args.eval)
    before = float(eval_loss(train, x_eval, y_eval))
    print(f"held-out loss before: {before:.4f}")

    state = opt.init(train)
    losses = []
    t0 = time.perf_counter()
    for i in range(args.steps):
        x, y = make_batch(rng, args.batch)
        train, state, loss = step(train, state, x, y)
        losses.append(float(loss))
        if i % max(1, args.steps // 10) == 0 or i == args.steps - 1:
            print(f"step {i:4d}  loss {losses[-1]:.4f}  ({time.perf_counter() - t0:.1f} s)")
    after = float(eval_loss(train, x_eval, y_eval))
    print(f"held-out loss after:  {after:.4f}  ({args.steps} steps, {time.perf_counter() - t0:.1f} s)")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(losses, lw=0.8, alpha=0.4, label="training batch")
    w = min(20, len(losses))
    if w > 1:
        smooth = np.convolve(losses, np.ones(w) / w, mode="valid")
        ax.plot(np.arange(w - 1, len(losses)), smooth, lw=1.5, label=f"moving average ({w} steps)")
    ax.axhline(before, color="gray", ls="--", lw=1, label=f"held-out before ({before:.3f})")
    ax.axhline(after, color="green", ls="--", lw=1, label=f"held-out after ({after:.3f})")
    ax.set_xlabel("step")
    ax.set_ylabel("binary cross-entropy")
    ax.set_title("fine-tuning selfie segmentation on ellipses (fbjax + optax)")
    ax.legend()
    fig.tight_layout()
    png = os.path.join(args.out_dir, "loss.png")
    fig.savefig(png, dpi=100)
    print(f"wrote {png}")

    # Save: the trained weights (float32 here) are cast to the file's float16.
    saved = os.path.join(args.out_dir, "finetuned.tflite")
    model.save(saved, train)
    print(f"wrote {saved}")

    # Check: the saved file in LiteRT against fbjax on the same weights (the
    # saved model loaded back; its params are the float16-rounded ones).
    report = {"loss_before": before, "loss_after": after, "steps": args.steps}
    tuned = fbjax.load(saved)
    ours = np.concatenate([np.asarray(tuned(x_eval[i:i + 1])) for i in range(len(x_eval))])
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        print("ai-edge-litert is not installed: LiteRT check skipped")
    else:
        # The output is sigmoid(z) of the "segment" logits z. fbjax and LiteRT
        # both compute z in float32, summing in different orders through ~100
        # layers: like the shared-model tests (tests/test_tflite_models.py) they
        # agree to 1e-4 * max|z|. Through the sigmoid, whose slope is p (1 - p),
        # that allows |dp| <= p (1 - p) * 1e-4 * max(1, max|z|) per element,
        # plus the sigmoid's own float32 rounding (an ULP of p).
        logits_name = _logits_name(saved)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # preserve_all_tensors "is for debugging": we read one logit tensor
            interp = Interpreter(model_path=saved, num_threads=2, experimental_preserve_all_tensors=True)
        interp.allocate_tensors()
        i_in, i_out = interp.get_input_details()[0]["index"], interp.get_output_details()[0]["index"]
        i_logits = {d["name"]: d["index"] for d in interp.get_tensor_details()}[logits_name]
        lit, logits = [], []
        for i in range(len(x_eval)):
            interp.set_tensor(i_in, x_eval[i:i + 1])
            interp.invoke()
            lit.append(np.array(interp.get_tensor(i_out)))
            logits.append(np.array(interp.get_tensor(i_logits)))
        lit, logits = np.concatenate(lit), np.concatenate(logits)
        err = float(np.max(np.abs(ours - lit)) / max(1.0, float(np.max(np.abs(lit)))))
        p = lit.astype(np.float64)
        bound = p * (1 - p) * 1e-4 * max(1.0, float(np.max(np.abs(logits)))) + np.spacing(np.float32(1))
        ratio = float(np.max(np.abs(ours.astype(np.float64) - p) / bound))
        lit_loss = float(-np.mean(y_eval * np.log(np.clip(lit, 1e-6, 1)) + (1 - y_eval) * np.log(np.clip(1 - lit, 1e-6, 1))))
        print(f"LiteRT on {saved}: max |fbjax - LiteRT| / max(1, max|LiteRT|) = {err:.2e}; that is "
              f"{ratio:.2f}x the float32 bound through the sigmoid (logits up to {np.max(np.abs(logits)):.0f}); "
              f"held-out loss in LiteRT {lit_loss:.4f}")
        report.update(litert_max_rel_err=err, litert_error_over_bound=ratio, litert_loss=lit_loss)
    with open(os.path.join(args.out_dir, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    return 0


def _logits_name(path: str) -> str:
    """Name of the tensor the model's final LOGISTIC reads (its logits)."""
    from fbjax.formats import read_model

    graph = read_model(path).main_graph
    out = graph.outputs[0]
    node = next(n for n in graph.nodes if any(o is out for o in n.outputs))
    if node.op_name != "LOGISTIC":
        raise SystemExit(f"expected the model to end in LOGISTIC, found {node.op_name}")
    return node.inputs[0].name


if __name__ == "__main__":
    sys.exit(main())
