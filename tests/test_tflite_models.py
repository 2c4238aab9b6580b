"""Every real model in ``../shared/models/tflite``: fbjax vs LiteRT, the numpy
reference vs LiteRT, and finite, non-zero gradients.

Inputs are seeded uniform [0, 1) arrays of the shapes and dtypes LiteRT
reports for the model (so the inputs do not depend on fbjax).

Tolerance: ``max|got - LiteRT| <= 1e-4 * max(1, max|LiteRT|)`` per output.
These models chain ~50-100 convolutions of up to a few thousand products
each; float32 results differ with the summation order (XNNPACK's tiled
kernels vs XLA's vs the reference's float64 accumulation), each layer adds a
few ulps of relative error and the errors compound through the depth of the
network, to ~1e-5 relative at the outputs. 1e-4 leaves margin for that while
any real semantic error (a padding off by one, a wrong activation, swapped
dimensions) moves outputs by far more.
"""

from __future__ import annotations

import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fbjax

from conftest import assert_close, litert_run, model_io_indices, tflite_model_params

RTOL = 1e-4
MODELS = tflite_model_params()

# Differentiating a whole model compiles its backward pass: 30-100 s per
# MediaPipe model on 2 CPU cores, too slow for every model in the default
# suite. It differentiates these three: FULLY_CONNECTED (sine); float16
# weights through DEQUANTIZE, CONV_2D, DEPTHWISE_CONV_2D, HARD_SWISH,
# AVERAGE_POOL_2D, LOGISTIC, MUL, ADD, RESIZE_BILINEAR and the custom
# Convolution2DTransposeBias (selfie); PRELU, PAD, MAX_POOL_2D, RESHAPE
# (iris). The other models run with ``-m slow`` (``nox -s slow``).
GRAD_DEFAULT = {"tflm_sine_float", "mediapipe_selfie_segmentation", "mediapipe_iris_landmark"}
GRAD_MODELS = [
    p if p.values[0] is None or p.values[0].stem in GRAD_DEFAULT
    else pytest.param(*p.values, id=p.id, marks=[*p.marks, pytest.mark.slow])
    for p in MODELS
]


@functools.lru_cache(maxsize=None)
def _inputs(path: Path) -> tuple:
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_path=str(path), num_threads=2)
    in_idx, _ = model_io_indices(path)
    details = {d["index"]: d for d in interp.get_input_details()}
    rng = np.random.default_rng(20240601)
    xs = []
    for t in in_idx:
        d = details[t]
        xs.append(rng.random(tuple(d["shape"])).astype(d["dtype"]))
    return tuple(xs)


@functools.lru_cache(maxsize=None)
def _litert(path: Path) -> tuple:
    return tuple(litert_run(path, list(_inputs(path))))


@functools.lru_cache(maxsize=None)
def _load(path: Path) -> fbjax.Model:
    return fbjax.load(path)


def _as_list(out) -> list:
    return [np.asarray(o) for o in (out if isinstance(out, (tuple, list)) else [out])]


@pytest.mark.parametrize("path", MODELS)
def test_model_fbjax_matches_litert(path):
    model = _load(path)
    expected = _litert(path)
    got = _as_list(model(*_inputs(path)))
    assert len(got) == len(expected), f"{len(got)} outputs, LiteRT gives {len(expected)}"
    for k, (spec, e) in enumerate(zip(model.outputs, expected)):  # None: dynamic dim
        assert len(spec.shape) == e.ndim and all(d is None or d == n for d, n in zip(spec.shape, e.shape)), \
            f"output {k}: spec {spec} does not fit LiteRT's shape {e.shape}"
    for k, (g, e) in enumerate(zip(got, expected)):
        assert g.dtype == e.dtype, f"output {k}: dtype {g.dtype}, LiteRT {e.dtype}"
        assert_close(g, e, RTOL, f"{path.name}: fbjax vs LiteRT, output {k}")


@pytest.mark.parametrize("path", MODELS)
def test_model_reference_matches_litert(path):
    from fbjax import reference

    expected = _litert(path)
    got = _as_list(reference.run(path, *_inputs(path)))
    assert len(got) == len(expected), f"{len(got)} outputs, LiteRT gives {len(expected)}"
    for k, (g, e) in enumerate(zip(got, expected)):
        assert_close(g, e, RTOL, f"{path.name}: fbjax.reference vs LiteRT, output {k}")


@pytest.mark.parametrize("path", GRAD_MODELS)
def test_model_gradients_finite_and_nonzero(path):
    """jax.grad of a scalar loss w.r.t. ``params`` (as fbjax exposes them) is
    finite everywhere and not identically zero."""
    model = _load(path)
    xs = _inputs(path)
    assert model.params, "the model exposes no trainable params"

    def loss(params):  # mean squared output: the scale of a typical training loss
        outs = model.apply(params, *xs)
        outs = outs if isinstance(outs, tuple) else (outs,)
        return sum(jnp.mean(jnp.square(o.astype(jnp.float32))) for o in outs)

    grads = jax.jit(jax.grad(loss))(model.params)
    assert set(grads) == set(model.params)
    nonzero = 0
    for name, g in grads.items():
        g = np.asarray(g)
        assert g.shape == tuple(model.params[name].shape), name
        assert np.all(np.isfinite(g)), f"gradient of {name!r} is not finite"
        nonzero += int(np.any(g != 0))
    assert nonzero > 0, "every gradient is zero"
