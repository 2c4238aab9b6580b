"""Generate the small transformer-encoder fixtures of tests/test_tflite_encoder_quant.py.

Run in a separate generator environment (the tests need neither torch nor
litert-torch nor ai-edge-quantizer; they run LiteRT live)::

    python3 -m venv /work/genenv-qllm
    /work/genenv-qllm/bin/pip install torch==2.14.1 torchvision==0.29.1
    /work/genenv-qllm/bin/pip install litert-torch ai-edge-quantizer ai-edge-litert
    /work/genenv-qllm/bin/python tests/data/quant_encoder/generate.py [NAME ...]

(litert-torch 0.10.0, ai-edge-quantizer 0.10.0, ai-edge-litert 2.3.0.)

The models (``MODELS``): seeded ``torch.nn.TransformerEncoderLayer`` stacks,
batch first: ``encoder`` (one layer, width 32, 2 heads, feed-forward 64,
exact GELU, post-norm, input ``[1, 8, 32]``) and ``encoder2`` (two layers,
width 64, 4 heads, feed-forward 128, tanh GELU, pre-norm, input
``[1, 16, 64]``), each converted by ``litert_torch.convert`` to
``<name>_f32.tflite``
(FULLY_CONNECTED, BATCH_MATMUL, SOFTMAX, MEAN/SQUARED_DIFFERENCE/RSQRT/MUL/
ADD/SUB layer norms, GELU), then quantized with ai-edge-quantizer's
``static_wi8_ai16`` (``<name>_a16w8.tflite``: int16 activations, per-channel
int8 weights) and ``static_wi8_ai8`` (``<name>_a8w8.tflite``) recipes,
calibrated on 8 seeded normal samples.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch
import torch._dynamo  # noqa: F401

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/data
import litert_schema_shim  # noqa: E402

litert_schema_shim.install()

import litert_torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
#: name -> (input shape, TransformerEncoder layers, width, heads, feed-forward, norm_first, GELU approximation)
MODELS = {
    "encoder": ((1, 8, 32), 1, 32, 2, 64, False, "none"),
    "encoder2": ((1, 16, 64), 2, 64, 4, 128, True, "tanh"),
}
RECIPES = {"a16w8": "static_wi8_ai16", "a8w8": "static_wi8_ai8"}


def build(layers, width, heads, ff, norm_first, approximate) -> torch.nn.Module:
    torch.manual_seed(0)

    def gelu(x):
        return torch.nn.functional.gelu(x, approximate=approximate)

    mods = [torch.nn.TransformerEncoderLayer(d_model=width, nhead=heads, dim_feedforward=ff, dropout=0.0,
                                             activation=gelu, batch_first=True, norm_first=norm_first)
            for _ in range(layers)]
    return torch.nn.Sequential(*mods).eval()


def calibration(path: str, n: int = 8) -> dict:
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_path=path).get_signature_runner("serving_default")
    rng = np.random.default_rng(0)
    return {"serving_default": [
        {k: rng.standard_normal(d["shape"]).astype(np.float32) for k, d in runner.get_input_details().items()}
        for _ in range(n)]}


def main() -> int:
    from ai_edge_quantizer import quantizer, recipe

    only = set(sys.argv[1:])
    for stem, (shape, *cfg) in MODELS.items():
        if only and stem not in only:
            continue
        src = os.path.join(HERE, f"{stem}_f32.tflite")
        litert_torch.convert(build(*cfg), (torch.zeros(shape),)).export(src)
        print(f"{src}: {os.path.getsize(src)} bytes", file=sys.stderr)
        calib_data = calibration(src)
        for short, name in RECIPES.items():
            q = quantizer.Quantizer(src)
            q.load_quantization_recipe(getattr(recipe, name)())
            res = q.quantize(q.calibrate(calib_data))
            out = os.path.join(HERE, f"{stem}_{short}.tflite")
            with open(out, "wb") as f:
                f.write(res.quantized_model)
            print(f"{out}: {os.path.getsize(out)} bytes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
