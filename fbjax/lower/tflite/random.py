"""TFLite random ops driven by an explicit JAX PRNG key:
RANDOM_STANDARD_NORMAL, RANDOM_UNIFORM, MULTINOMIAL.

LiteRT keeps a Philox generator per op, seeded from ``seed``/``seed2``, so
successive invocations draw new numbers. fbjax makes the generator explicit
state: models with random ops are stateful (see :mod:`.state`), and
``Model.state["prng_key"]`` holds a raw ``jax.random`` key (``uint32[2]``,
initially ``PRNGKey(seed)`` of the first random op, or 0). Each random op
splits it, draws with one half and stores the other, so calling the Model
twice gives new draws, while ``Model.apply(params, *inputs,
state={"prng_key": key})`` is a pure function of ``key``. The draws follow
the ops' distributions but are not LiteRT's Philox bit streams.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..registry import register
from ..state import KEY, running


def _next_key(ctx):
    st = running(ctx, "random ops need a PRNG key")
    if KEY not in st:
        st[KEY] = jax.random.PRNGKey(0)
    k, sub = jax.random.split(jnp.asarray(st[KEY], jnp.uint32))
    st[KEY] = k
    return sub


def _shape(shape):
    return tuple(int(v) for v in np.asarray(shape).reshape(-1))


def first_seed(model) -> int:
    """``seed`` of the first random op (for the initial key)."""
    for n in model.iter_nodes():
        if n.op_name in ("RANDOM_STANDARD_NORMAL", "RANDOM_UNIFORM", "MULTINOMIAL"):
            return int(n.attrs.get("seed", 0)) ^ (int(n.attrs.get("seed2", 0)) << 1)
    return 0


def _seed_state(program, params, state) -> None:
    """Initial state: the key ``PRNGKey(first_seed)`` (after any CALL_ONCE)."""
    state[KEY] = jax.random.PRNGKey(first_seed(program.model))


_RANDOM = dict(differentiable=False, foldable=False, stateful=True, init_state=(1, _seed_state))


@register("tflite", "RANDOM_STANDARD_NORMAL", static_inputs=(0,), **_RANDOM)
def RANDOM_STANDARD_NORMAL(ctx, shape, *, seed=0, seed2=0):
    """TFLite RANDOM_STANDARD_NORMAL: N(0, 1) samples of the static ``shape``."""
    return jax.random.normal(_next_key(ctx), _shape(shape), ctx.out_dtype(0))


@register("tflite", "RANDOM_UNIFORM", static_inputs=(0,), **_RANDOM)
def RANDOM_UNIFORM(ctx, shape, *, seed=0, seed2=0):
    """TFLite RANDOM_UNIFORM: U[0, 1) samples of the static ``shape``."""
    return jax.random.uniform(_next_key(ctx), _shape(shape), ctx.out_dtype(0))


@register("tflite", "MULTINOMIAL", static_inputs=(1,), **_RANDOM)
def MULTINOMIAL(ctx, logits, num_samples, *, seed=0, seed2=0):
    """TFLite MULTINOMIAL: ``num_samples`` class indices per row of
    ``logits [B, C]`` (unnormalised log-probabilities); ``[B, num_samples]``."""
    n = int(np.asarray(num_samples).reshape(()))
    logits = jnp.asarray(logits)
    out = jax.random.categorical(_next_key(ctx), logits[:, None, :], axis=-1, shape=(logits.shape[0], n))
    return out.astype(ctx.out_dtype(0))
