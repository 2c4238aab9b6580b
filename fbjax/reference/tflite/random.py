"""Random ops (numpy reference): draws from ``numpy.random.default_rng``
seeded with the op's ``seed``/``seed2``; the distributions, shapes and
dtypes match TFLite's, the bit streams do not (tests compare statistics)."""

from __future__ import annotations

import numpy as np

from ..registry import register


def _rng(seed, seed2):
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, int(seed2) & 0xFFFFFFFF])


@register("tflite", "RANDOM_STANDARD_NORMAL", static_inputs=(0,))
def RANDOM_STANDARD_NORMAL(ctx, shape, *, seed=0, seed2=0):
    """N(0, 1)."""
    return _rng(seed, seed2).standard_normal(tuple(np.asarray(shape).reshape(-1))).astype(ctx.out_dtype(0))


@register("tflite", "RANDOM_UNIFORM", static_inputs=(0,))
def RANDOM_UNIFORM(ctx, shape, *, seed=0, seed2=0):
    """U[0, 1)."""
    return _rng(seed, seed2).uniform(size=tuple(np.asarray(shape).reshape(-1))).astype(ctx.out_dtype(0))


@register("tflite", "MULTINOMIAL", static_inputs=(1,))
def MULTINOMIAL(ctx, logits, num_samples, *, seed=0, seed2=0):
    """Categorical draws per row from softmax(logits)."""
    lg = np.asarray(logits, np.float64)
    p = np.exp(lg - lg.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    g = _rng(seed, seed2)
    n = int(np.asarray(num_samples).reshape(()))
    return np.stack([g.choice(p.shape[1], size=n, p=row) for row in p]).astype(ctx.out_dtype(0))
