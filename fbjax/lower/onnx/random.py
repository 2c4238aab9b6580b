"""ONNX random ops driven by an explicit JAX PRNG key: RandomNormal,
RandomUniform, RandomNormalLike, RandomUniformLike (and training-mode
``Dropout`` in :mod:`.elementwise`, which draws its mask the same way).

The key is the one TFLite's random ops use (:data:`fbjax.lower.state.KEY`):
a model with random ops is stateful, and ``Model.state["prng_key"]`` holds a
raw ``jax.random`` key (``uint32[2]``). Its initial value is
``jax.random.PRNGKey(seed)`` of the first drawing node's ``seed`` attribute
(0 when absent), so a given model file starts from the same numbers on every
load. Each drawing node splits the key, draws with one half and stores the
other: calling the Model twice gives new draws, while ``Model.apply(params,
*inputs, state={"prng_key": key})`` is a pure function of ``key`` returning
``(outputs, new_state)``. The numbers follow the ops' distributions but are
JAX's (threefry), not onnxruntime's or RTen's streams. Attribute defaults are
the RTen schema's (``high`` and ``scale`` 0); rten-convert writes ONNX's
``high=1`` / ``scale=1`` defaults explicitly.

The RTen schema has no Bernoulli, Multinomial or Hardmax operator: rten-convert
0.22 refuses them (``test_bernoulli*`` node cases), so they have no lowering;
the expanded Bernoulli (RandomUniformLike, Less, Cast) converts and runs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ... import op_rules
from ..registry import register
from ..state import KEY, running
from ._util import OP_SET

#: Ops that always draw.
RANDOM_OPS = ("RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike")


def draws(node) -> bool:
    """True when ``node`` draws random numbers when run: the Random* ops, and a
    ``Dropout`` whose ``training_mode`` is a constant true and ``ratio`` not 0."""
    if node.op_set != OP_SET:
        return False
    if node.op_name in RANDOM_OPS:
        return True
    if node.op_name != "Dropout":
        return False
    t = node.inputs[2] if len(node.inputs) > 2 else None
    r = node.inputs[1] if len(node.inputs) > 1 else None
    if t is None or t.data is None or not bool(np.asarray(t.data).reshape(-1)[:1].any()):
        return False
    return r is None or r.data is None or float(np.asarray(r.data).reshape(-1)[0]) != 0.0


def uses_prng_key(model) -> bool:
    """True when a node of ``model`` (any graph) draws (see :func:`draws`)."""
    return any(draws(n) for n in model.iter_nodes())


def seed_int(seed) -> int:
    """ONNX's float ``seed`` as a 32-bit key seed: the integer when integral,
    else the float32 bit pattern (so 1.5 and 1.0 differ)."""
    if seed is None:
        return 0
    s = float(seed)
    return (int(s) if s.is_integer() else int(np.float32(s).view(np.uint32))) & 0xFFFFFFFF


def first_seed(model) -> int:
    """``seed`` of the first drawing node, for the initial key (0 when unseeded)."""
    for n in model.iter_nodes():
        if draws(n):
            return seed_int(n.attrs.get("seed"))
    return 0


def initial_key(model):
    """The initial ``Model.state["prng_key"]``: ``PRNGKey(first_seed(model))``."""
    return jax.random.PRNGKey(first_seed(model))


def _seed_state(program, params, state) -> None:
    """Initial state: ``PRNGKey(first_seed)``, unless a TFLite seeding ran first."""
    if KEY not in state:
        state[KEY] = initial_key(program.model)


#: the registration facts of every drawing op
DRAWS = dict(foldable=False, stateful=draws, init_state=(2, _seed_state))


def next_key(ctx):
    """A fresh key for this node from ``ctx.run.state["prng_key"]``, which
    is advanced. Inside a subgraph (If/Loop body, traced by lax.cond or
    lax.while_loop) the state cannot be written from the inner trace: the
    node's key is the current key folded with the node's position, not
    advanced (each loop iteration then draws the same numbers).

    Raises:
        ModelFormatError: the program runs without state (not through
            :class:`fbjax.Model` or ``apply_with_state``).
    """
    st = running(ctx, "random ops need a PRNG key")
    if KEY not in st:
        st[KEY] = initial_key(ctx.model)
    key = jnp.asarray(st[KEY], jnp.uint32)
    main = ctx.model.graphs[ctx.model.main]
    if not any(n is ctx.node for n in main.nodes):
        return jax.random.fold_in(key, sum(map(ord, ctx.node.location)) & 0x7FFFFFFF)
    k, sub = jax.random.split(key)
    st[KEY] = k
    return sub


@register(OP_SET, "RandomUniform", out_dtype=op_rules.float32_out, differentiable=False, **DRAWS)
def RandomUniform(ctx, *, shape=(), high=0.0, low=0.0, seed=None):
    """ONNX ``RandomUniform``: float32 samples of ``U[low, high)`` of the
    attribute ``shape`` (RTen keeps float32 only), from :func:`next_key`."""
    return jax.random.uniform(next_key(ctx), tuple(int(d) for d in shape), jnp.float32, low, high)


@register(OP_SET, "RandomUniformLike", out_dtype=op_rules.float32_out, differentiable=False, **DRAWS)
def RandomUniformLike(ctx, input, *, high=0.0, low=0.0, seed=None):
    """ONNX ``RandomUniformLike``: like RandomUniform with ``input``'s shape."""
    return jax.random.uniform(next_key(ctx), jnp.shape(input), jnp.float32, low, high)


@register(OP_SET, "RandomNormal", out_dtype=op_rules.float32_out, differentiable=False, **DRAWS)
def RandomNormal(ctx, *, mean=0.0, scale=0.0, seed=None, shape=()):
    """ONNX ``RandomNormal``: float32 ``mean + scale * N(0, 1)`` of the attribute
    ``shape``, from :func:`next_key`."""
    z = jax.random.normal(next_key(ctx), tuple(int(d) for d in shape), jnp.float32)
    return jnp.float32(mean) + jnp.float32(scale) * z


@register(OP_SET, "RandomNormalLike", out_dtype=op_rules.float32_out, differentiable=False, **DRAWS)
def RandomNormalLike(ctx, input, *, mean=0.0, scale=0.0, seed=None):
    """ONNX ``RandomNormalLike``: like RandomNormal with ``input``'s shape."""
    z = jax.random.normal(next_key(ctx), jnp.shape(input), jnp.float32)
    return jnp.float32(mean) + jnp.float32(scale) * z
