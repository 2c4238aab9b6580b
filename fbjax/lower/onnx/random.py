"""ONNX random ops with an explicit JAX PRNG key.

The key is ``jax.random.key(seed)`` from the op's ``seed`` attribute (0 when
absent), folded with the node's position so two unseeded ops differ. The
same model and seed give the same numbers on every call (ONNX leaves
unseeded draws unspecified); the numbers are JAX's, not onnxruntime's.
"""

from __future__ import annotations

import zlib

import jax
import jax.numpy as jnp

from ..registry import register
from ._util import OP_SET


def node_key(ctx, seed):
    """The explicit PRNG key of this node (from ``seed`` and the node's location)."""
    k = jax.random.key(int(seed) if seed is not None else 0)
    return jax.random.fold_in(k, zlib.crc32(ctx.node.location.encode()) & 0x7FFFFFFF)


@register(OP_SET, "RandomUniform", differentiable=False)
def RandomUniform(ctx, *, shape=(), high=0.0, low=0.0, seed=None):
    """ONNX ``RandomUniform`` in ``[low, high)``, float32, of the attribute ``shape``."""
    return jax.random.uniform(node_key(ctx, seed), tuple(shape), jnp.float32, low, high)


@register(OP_SET, "RandomUniformLike", differentiable=False)
def RandomUniformLike(ctx, input, *, high=0.0, low=0.0, seed=None):
    """ONNX ``RandomUniformLike``: like RandomUniform with ``input``'s shape."""
    return jax.random.uniform(node_key(ctx, seed), jnp.shape(input), jnp.float32, low, high)


@register(OP_SET, "RandomNormal", differentiable=False)
def RandomNormal(ctx, *, mean=0.0, scale=0.0, seed=None, shape=()):
    """ONNX ``RandomNormal``: ``mean + scale * N(0, 1)``, float32."""
    return mean + scale * jax.random.normal(node_key(ctx, seed), tuple(shape), jnp.float32)


@register(OP_SET, "RandomNormalLike", differentiable=False)
def RandomNormalLike(ctx, input, *, mean=0.0, scale=0.0, seed=None):
    """ONNX ``RandomNormalLike``: like RandomNormal with ``input``'s shape."""
    return mean + scale * jax.random.normal(node_key(ctx, seed), jnp.shape(input), jnp.float32)
