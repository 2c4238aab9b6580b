"""Quantize float models from ``shared/models/tflite`` with ai-edge-quantizer,
for tests/test_tflite_quant.py (``test_aeq_*``).

Run with the fixture-generation environment (TensorFlow is not needed by the
tests; ai-edge-quantizer 0.10.0 and ai-edge-litert 2.3.0 are)::

    /work/venv-tf/bin/python tests/data/quant_aeq/generate.py [--only NAME...] [--extra]

Output: ``<model>_<recipe>.tflite`` next to this script (the committed, small
ones) or in ``extra/`` (``--extra``: larger models, not committed; the tests
run them, marked slow, when the directory exists).

Recipes (ai_edge_quantizer.recipe): ``a8w8`` = ``static_wi8_ai8`` (int8
activations, per-channel symmetric int8 weights, int32 biases), ``a16w8`` =
``static_wi8_ai16`` (int16 activations), ``dyn`` = ``dynamic_wi8_afp32``
(hybrid kernels), ``wo`` = ``weight_only_wi8_afp32`` (int8 weights
DEQUANTIZEd at run time). Calibration: 8 seeded uniform samples in the
model's input range.

Before quantizing, each source model is normalized (same computation, what
ai-edge-quantizer 0.10.0 needs to handle these files correctly):

* ``builtin_code = max(builtin_code, deprecated_builtin_code)`` for every
  operator code. The MediaPipe files are schema version 3 and store the op
  only in ``deprecated_builtin_code``; ai-edge-quantizer reads
  ``builtin_code`` alone (0 = ADD), so it quantized every CONV_2D as an ADD
  (per-tensor *asymmetric* int8 weights, int8 biases) and LiteRT rejected the
  result in Prepare (``conv.cc:390 zero_point != 0``). That was the cause of
  the earlier "LiteRT refuses every ai-edge-quantizer model" finding;
* ``DEQUANTIZE`` of float16 constants is folded into float32 constants
  (ai-edge-quantizer's static recipes fail on them: ``'NoneType' object has
  no attribute 'ndim'``);
* a ``serving_default`` signature is added when the file has none (the
  calibrator drives the model through a signature runner).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.path.normpath(os.path.join(HERE, "..", "..", "..", "..", "shared", "models", "tflite"))
EXTRA = os.path.join(HERE, "extra")

#: model -> (input range for calibration, recipes, committed?)
MODELS = {
    "tflm_sine_float": ((0.0, 2 * np.pi), ("a8w8", "a16w8", "dyn", "wo"), True),
    "mediapipe_hand_recrop": ((-1.0, 1.0), ("a8w8", "a16w8", "dyn", "wo"), True),
    "mediapipe_face_detection_short_range": ((-1.0, 1.0), ("a8w8", "a16w8"), True),
    "mediapipe_iris_landmark": ((-1.0, 1.0), ("a8w8", "a16w8", "dyn"), False),
}
RECIPES = {"a8w8": "static_wi8_ai8", "a16w8": "static_wi8_ai16", "dyn": "dynamic_wi8_afp32",
           "wo": "weight_only_wi8_afp32"}


def normalize(src: str, dst: str) -> str:
    """Write ``src`` normalized as described in the module doc to ``dst``."""
    from ai_edge_litert import schema_py_generated as fb
    from ai_edge_litert.tools import flatbuffer_utils as fu

    model = fu.read_model(src)
    for c in model.operatorCodes:
        c.builtinCode = max(c.builtinCode, c.deprecatedBuiltinCode)
    deq = fb.BuiltinOperator.DEQUANTIZE
    for g in model.subgraphs:
        keep = []
        for op in g.operators:
            code = model.operatorCodes[op.opcodeIndex].builtinCode
            t = g.tensors[op.inputs[0]]
            buf = model.buffers[t.buffer]
            if code == deq and t.type == fb.TensorType.FLOAT16 and buf.data is not None and len(buf.data):
                data = np.frombuffer(np.asarray(buf.data, np.uint8).tobytes(), np.float16).astype(np.float32)
                nb = fb.BufferT()
                nb.data = np.frombuffer(data.tobytes(), np.uint8)
                model.buffers.append(nb)
                g.tensors[op.outputs[0]].buffer = len(model.buffers) - 1
                continue
            keep.append(op)
        g.operators = keep
        live = {i for op in g.operators for i in list(op.inputs) + list(op.outputs)} | set(g.inputs) | set(g.outputs)
        for i, t in enumerate(g.tensors):
            if i not in live:  # a folded float16 source: shrink it to one element
                nb = fb.BufferT()
                nb.data = np.zeros(2, np.uint8)
                model.buffers.append(nb)
                t.buffer, t.shape, t.shapeSignature = len(model.buffers) - 1, [1], None
    if not model.signatureDefs:
        g = model.subgraphs[0]

        def tmap(i):
            m = fb.TensorMapT()
            m.name, m.tensorIndex = g.tensors[i].name, i
            return m

        sd = fb.SignatureDefT()
        sd.signatureKey, sd.subgraphIndex = "serving_default", 0
        sd.inputs = [tmap(i) for i in g.inputs]
        sd.outputs = [tmap(i) for i in g.outputs]
        model.signatureDefs = [sd]
    fu.write_model(model, dst)
    return dst


def calibration_data(path: str, lo: float, hi: float, n: int = 8) -> dict:
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_path=path).get_signature_runner("serving_default")
    rng = np.random.default_rng(0)
    return {"serving_default": [
        {k: rng.uniform(lo, hi, d["shape"]).astype(np.float32) for k, d in runner.get_input_details().items()}
        for _ in range(n)]}


def quantize(name: str, recipe_short: str, out_dir: str, tmp_dir: str) -> str:
    from ai_edge_quantizer import quantizer, recipe

    (lo, hi), _, _ = MODELS[name]
    src = normalize(os.path.join(SHARED, f"{name}.tflite"), os.path.join(tmp_dir, f"{name}.tflite"))
    q = quantizer.Quantizer(src)
    q.load_quantization_recipe(getattr(recipe, RECIPES[recipe_short])())
    calib = q.calibrate(calibration_data(src, lo, hi)) if q.need_calibration else None
    res = q.quantize(calib)
    out = os.path.join(out_dir, f"{name}_{recipe_short}.tflite")
    with open(out, "wb") as f:
        f.write(res.quantized_model)
    return drop_unused_buffers(out)


def drop_unused_buffers(path: str) -> str:
    """Empty the buffers no tensor refers to (ai-edge-quantizer leaves the
    float data of the weights it quantized in the file)."""
    from ai_edge_litert.tools import flatbuffer_utils as fu

    model = fu.read_model(path)
    used = {t.buffer for g in model.subgraphs for t in g.tensors}
    used |= {m.buffer for m in (model.metadata or [])}
    for i, b in enumerate(model.buffers):
        if i not in used:
            b.data = None
    fu.write_model(model, path)
    return path


def main(argv=None) -> int:
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=None, help="model names to (re)generate")
    ap.add_argument("--extra", action="store_true", help="also the large, uncommitted models (extra/)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        for name, (_, recipes, committed) in MODELS.items():
            if args.only and name not in args.only:
                continue
            if not committed and not args.extra:
                continue
            out_dir = HERE if committed else EXTRA
            os.makedirs(out_dir, exist_ok=True)
            for r in recipes:
                out = quantize(name, r, out_dir, tmp)
                print(f"{out}: {os.path.getsize(out)} bytes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
