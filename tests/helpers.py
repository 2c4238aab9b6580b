"""Helpers several test modules share (test modules never import each other):
small models, the LLM and ViT fixtures' float32 bounds, and the custom ops tested
without LiteRT."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import warnings
from pathlib import Path

import numpy as np

from fbjax.formats.tflite_builder import TFLiteBuilder


# The deepest chain of float32 sums of litert-torch's ViT fixture
# (tests/data/litert_torch/torch_reference.py), in terms: 8x8 patches of 3 channels (192), 2
# blocks of width 64 (layer norm: mean and variance, 2 x 64; QKV 64; scores 32; softmax and
# weighted sum over 17 tokens; output projection 64; layer norm 128; MLP 64 and 128), final layer
# norm (128) and head (64). Two programs that order these sums differently (a vmapped batch
# against batch-1 calls) agree within 2 gamma_K max(1, |out|): activations are layer-normalised
# before every sum, so the terms' magnitudes stay of order max(1, |out|).
K_VIT = 192 + 2 * (128 + 64 + 32 + 17 + 17 + 64 + 128 + 64 + 128) + 128 + 64


def relu_model(tmp_path) -> Path:
    """x[1,4] -> RELU -> out[1,4], written to tmp_path/relu.tflite."""
    b = TFLiteBuilder()
    x = b.add_input((1, 4), name="x")
    y = b.add_tensor((1, 4), name="out")
    b.add_op("RELU", [x], [y])
    b.add_output(y)
    path = tmp_path / "relu.tflite"
    path.write_bytes(b.build())
    return path


def where_model() -> bytes:
    """``GREATER(x[3,4], 0.5) -> WHERE -> coords [n, 2]`` (int64, dynamic rows)."""
    b = TFLiteBuilder()
    x = b.add_input((3, 4), np.float32, name="x")
    t = b.add_constant(np.array(0.5, np.float32), name="t")
    m = b.add_tensor((3, 4), np.bool_, name="m")
    out = b.add_tensor((1, 2), np.int64, name="coords", shape_signature=(-1, 2))
    b.add_op("GREATER", [x, t], [m])
    b.add_op("WHERE", [m], [out])
    b.add_output(out)
    return b.build()


def rel_err(got, want) -> float:
    """``max |got - want| / max(1, |want|)`` elementwise (float64)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape
    return float(np.max(np.abs(got - want) / np.maximum(1.0, np.abs(want))))


#: float32 through 2 blocks of width 128 (sums of 128-256 products of order-1 values, softmax over
#: up to 64 keys, RMS norms), computed in a different order than LiteRT's kernels: the issue's bound,
#: about 100x the errors seen (2e-6 to 7e-6)
TOL = 1e-4


#: Custom codes tests/test_tflite_mediapipe_ops.py tests against the numpy reference and the
#: published formulas, LiteRT having no kernel for them (read by scripts/coverage_table.py).
COVERED_CUSTOM_OPS = ("Landmarks2TransformMatrix", "TransformLandmarks", "TransformTensorBilinear",
                      "TransformTensor")


def custom_op_model(code: str, version: int, in_shapes, out_shape, options, description: str = "fbjax tests") -> bytes:
    """A TFLite model of one custom op ``code`` (``version``): float32 model
    inputs of ``in_shapes``, one float32 output of ``out_shape``, the
    flexbuffer ``options`` (MediaPipe's geometry ops...)."""
    b = TFLiteBuilder(description=description)
    ins = [b.add_input(s) for s in in_shapes]
    out = b.add_tensor(out_shape)
    b.add_op(code, ins, [out], custom=True, custom_options=options, version=version)
    b.add_output(out)
    return b.build()


@contextlib.contextmanager
def ray_with_example(example: str, num_cpus: int):
    """``examples/<example>`` imported as a module, on a local Ray instance of ``num_cpus`` CPUs,
    shut down (and the module forgotten) after. The module is not importable on Ray's workers, so its
    classes and functions travel by value (``ray.cloudpickle.register_pickle_by_value``)."""
    import ray
    import ray.cloudpickle

    root = Path(__file__).resolve().parents[1]
    name = "fbjax_example_" + Path(example).stem
    spec = importlib.util.spec_from_file_location(name, root / "examples" / example)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    ray.cloudpickle.register_pickle_by_value(mod)
    with warnings.catch_warnings():
        # ray.init starts its processes with subprocess (fork, then exec at once), which JAX's warning
        # about os.fork in a multithreaded process does not tell apart
        warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    try:
        yield mod
    finally:
        ray.shutdown()
        sys.modules.pop(name, None)
