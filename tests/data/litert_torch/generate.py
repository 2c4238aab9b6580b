"""Generate the litert-torch vision fixtures of tests/test_litert_torch_vision.py.

Run in a separate generator environment (the tests need neither torch nor
litert-torch)::

    python3 -m venv /work/genenv-llm
    /work/genenv-llm/bin/pip install torch==2.14.1 torchvision==0.29.1
    /work/genenv-llm/bin/pip install litert-torch ai-edge-litert ai-edge-quantizer
    /work/genenv-llm/bin/python tests/data/litert_torch/generate.py

For every architecture of ``torch_reference.NAMES`` (tiny torchvision
models with seeded random weights, ``torch_reference.module(0, name)``):

* ``<name>_f32.tflite``: ``litert_torch.convert(module, inputs(1, name))``,
  float32, batch 1, NCHW input as in PyTorch;
* ``<name>_q8.tflite`` (for the names in ``Q8``): the float file through
  ai-edge-quantizer's ``dynamic_wi8_afp32`` recipe (int8 per-channel
  weights, float activations quantized on the fly by LiteRT's hybrid
  kernels);
* ``<name>_<f32|q8>.npz``: ``x`` (``inputs(1, name)[0]`` as numpy), ``litert``
  (LiteRT's output on ``x``: builtin kernels, no XNNPACK delegate) and, for
  the float file, ``torch`` (the PyTorch module's own output on ``x``).

litert-torch imports ``tensorflow.lite.python.schema_py_generated`` without
depending on TensorFlow; ai-edge-litert ships the same generated bindings,
registered under that name below.
"""

from __future__ import annotations

import os
import sys
import tempfile

import numpy as np
import torch
import torch._dynamo  # noqa: F401  (before the stand-in below: dynamo probes which packages exist)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/data
import litert_schema_shim  # noqa: E402

litert_schema_shim.install()

import litert_torch  # noqa: E402
from ai_edge_litert import interpreter as litert  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch_reference  # noqa: E402

#: architectures that also get an int8 dynamic-range variant
Q8 = ("mobilenet_v3_small",)


def run_litert(path: str, x: np.ndarray) -> np.ndarray:
    """LiteRT's builtin kernels (no XNNPACK) on ``x``; the model's one output."""
    it = litert.Interpreter(model_path=path, experimental_op_resolver_type=litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    it.allocate_tensors()
    (inp,), (out,) = it.get_input_details(), it.get_output_details()
    it.set_tensor(inp["index"], x)
    it.invoke()
    return it.get_tensor(out["index"]).copy()


def quantize_q8(src: str, dst: str) -> None:
    from ai_edge_quantizer import quantizer, recipe

    q = quantizer.Quantizer(src)
    q.load_quantization_recipe(recipe.dynamic_wi8_afp32())
    with open(dst, "wb") as f:
        f.write(q.quantize().quantized_model)


def main(names) -> None:
    for name in names:
        net = torch_reference.module(0, name)
        (xt,) = torch_reference.inputs(1, name)
        with torch.no_grad():
            want = net(xt).numpy()
        f32 = os.path.join(HERE, f"{name}_f32.tflite")
        litert_torch.convert(net, (xt,)).export(f32)
        x = xt.numpy()
        got = run_litert(f32, x)
        np.savez(os.path.join(HERE, f"{name}_f32.npz"), x=x, litert=got, torch=want)
        err = float(np.max(np.abs(got - want) / np.maximum(1.0, np.abs(want))))
        print(f"{name}_f32: {os.path.getsize(f32)} bytes, LiteRT vs torch rel err {err:.2e}")
        if name in Q8:
            q8 = os.path.join(HERE, f"{name}_q8.tflite")
            quantize_q8(f32, q8)
            got8 = run_litert(q8, x)
            np.savez(os.path.join(HERE, f"{name}_q8.npz"), x=x, litert=got8)
            err8 = float(np.max(np.abs(got8 - want) / np.maximum(1.0, np.abs(want))))
            print(f"{name}_q8: {os.path.getsize(q8)} bytes, LiteRT vs torch float rel err {err8:.2e}")


if __name__ == "__main__":
    main(sys.argv[1:] or torch_reference.NAMES)
