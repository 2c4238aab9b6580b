"""Streaming wake-word detection with a stateful int8 model: feed feature frames, keep state, detect.

The model is one of the four microWakeWord detectors of pymicro-wakeword 2.5.0
(Apache-2.0), committed in ``tests/data/realmodels/``: an int8 streaming
network that takes 3 feature frames (30 ms of audio as 40 log-mel features
per 10 ms frame, int8 codes) per call and keeps what it has seen in six int8
resource variables (VAR_HANDLE / READ_VARIABLE / ASSIGN_VARIABLE, initialised
by a CALL_ONCE subgraph). ``fbjax.load`` runs it with TFLite's integer
kernels bit for bit (the default ``quantized="exact"``) and keeps the
variables in ``model.state`` between calls, as LiteRT's interpreter does.

Two ways to run the stream:

1. ``model(chunk)`` per chunk: stateful, like an interpreter;
2. ``jax.lax.scan`` over the whole stream with the pure
   ``model.apply(params, chunk, state=state) -> (output, new_state)``: one
   compiled program for the whole stream (or vmap it over many streams).

The script checks that both give the same probabilities (exits 1 otherwise)
and prints the detections: the mean probability over the last
``--window`` chunks above ``--cutoff`` (the values pymicro-wakeword ships
for okay_nabu: 5 and 0.85).

Features: ``--features F.npy`` takes a float array ``(frames, 40)`` of
microfrontend features (e.g. from ``pymicro_features.MicroFrontend``);
without it, the script makes a synthetic stream (a steady spectrum with
bursts), on which the detector stays low -- it shows the mechanics, not a
detection.

Run: ``python examples/streaming_wakeword.py [--model okay_nabu] [--features F.npy]``
(a few seconds on CPU).
"""

from __future__ import annotations

import argparse
import sys
from collections import deque
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import fbjax

MODELS = Path(__file__).resolve().parents[1] / "tests" / "data" / "realmodels"


def synthetic_features(n_frames: int, seed: int = 0) -> np.ndarray:
    """``(n_frames, 40)`` float features in the microfrontend's range (0..26)."""
    rng = np.random.default_rng(seed)
    base = rng.uniform(2, 9, size=40)
    t = np.arange(n_frames)[:, None]
    return np.clip(base + 8 * np.sin(np.pi * t / 60) ** 2 * rng.random(40) + rng.normal(0, 1, (n_frames, 40)),
                   0, 26).astype(np.float32)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="okay_nabu", help="alexa, hey_jarvis, hey_mycroft, okay_nabu, or a path")
    ap.add_argument("--features", help="a .npy of float features, shape (frames, 40)")
    ap.add_argument("--cutoff", type=float, default=0.85, help="detection threshold on the mean probability (default 0.85)")
    ap.add_argument("--window", type=int, default=5, help="chunks averaged for a detection (default 5)")
    args = ap.parse_args()

    path = Path(args.model) if args.model.endswith(".tflite") else MODELS / f"{args.model}.tflite"
    model = fbjax.load(path)  # quantized="exact": int8 in, uint8 out, integer kernels
    (spec,) = model.inputs  # TensorSpec(..., (1, 3, 40), int8)
    qin, qout = model.input_quantization[0], model.output_quantization[0]
    stride = spec.shape[1]
    print(f"{path.name}: input {spec.shape} {spec.dtype.name} (scale {float(qin.scale[0]):.4f}, zero point "
          f"{int(qin.zero_point[0])}), state: {len(model.state)} int8 variables "
          f"{sorted(tuple(np.shape(v)) for v in model.state.values())}")

    feats = np.load(args.features).astype(np.float32) if args.features else synthetic_features(600)
    codes = np.clip(np.rint(feats / float(qin.scale[0])) + int(qin.zero_point[0]), -128, 127).astype(np.int8)
    n = len(codes) // stride
    chunks = codes[: n * stride].reshape(n, 1, stride, codes.shape[1])
    initial = dict(model.state)

    # 1. stateful calls: model.state carries the streaming buffers between calls
    window: deque = deque(maxlen=args.window)
    probs, detections = [], []
    for i, chunk in enumerate(chunks):
        p = (float(np.asarray(model(chunk)).ravel()[0]) - int(qout.zero_point[0])) * float(qout.scale[0])
        probs.append(p)
        window.append(p)
        if len(window) == args.window and np.mean(window) > args.cutoff:
            detections.append(i * stride * 10)  # ms (10 ms per feature frame)
            window.clear()

    # 2. the same stream as one jitted lax.scan over the pure function
    def step(state, chunk):
        y, state = model.apply(model.params, chunk, state=state)
        return state, y

    _, ys = jax.jit(lambda st, xs: jax.lax.scan(step, st, xs))(initial, jnp.asarray(chunks))
    scanned = (np.asarray(ys).reshape(-1).astype(np.float64) - int(qout.zero_point[0])) * float(qout.scale[0])
    same = np.array_equal(scanned, np.asarray(probs))

    print(f"{n} chunks ({n * stride * 10 / 1000:.1f} s of audio): max probability {max(probs):.3f}; "
          + (f"detections at {', '.join(map(str, detections))} ms" if detections
             else f"no detection (no {args.window}-chunk window averaged above {args.cutoff})"))
    if not args.features:
        print("(a synthetic stream, on which the detector stays low: it shows the mechanics, not a detection; "
              "give real microfrontend features with --features F.npy)")
    print(f"lax.scan over the stream == stateful calls: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
