"""Helpers shared by the ONNX (RTen) lowerings: axes, static values, dtypes."""

from __future__ import annotations

from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

OP_SET = "onnx"


def axis(a: int, rank: int, ctx=None) -> int:
    """Normalise a possibly negative axis; error naming the node if out of range."""
    a = int(a)
    if not -rank <= a < max(rank, 1):
        if ctx is not None:
            raise ctx.error(f"axis {a} is out of range for rank {rank}")
        raise ValueError(f"axis {a} is out of range for rank {rank}")
    return a % max(rank, 1)


def axes(a: Optional[Sequence[int]], rank: int, ctx=None) -> tuple[int, ...]:
    return tuple(sorted(axis(x, rank, ctx) for x in a)) if a is not None else tuple(range(rank))


def ints(x) -> list[int]:
    """A static (numpy) input or attribute as a list of Python ints."""
    if x is None:
        return []
    return [int(v) for v in np.asarray(x).reshape(-1)]


def concrete(x) -> Optional[np.ndarray]:
    """numpy value of ``x`` when known at trace time, else None."""
    if x is None or isinstance(x, (np.ndarray, np.generic)):
        return None if x is None else np.asarray(x)
    try:
        return np.asarray(x)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError, TypeError):
        return None


from ...ir import VALID_COUNT_SUFFIX  # noqa: E402 (the static-bound count output's name suffix)


def has_valid_count(ctx) -> bool:
    """The node was given a trailing valid-count output (static-bound mode)."""
    o = ctx.outputs[-1] if ctx.outputs else None
    return o is not None and o.name.endswith(VALID_COUNT_SUFFIX) and o.shape == ()


def require_concrete(ctx, x, what: str) -> np.ndarray:
    """numpy value of ``x``, or an error explaining the output shape would depend on it."""
    c = concrete(x)
    if c is None:
        raise ctx.error(
            f"{what} must be known at load time (the output shape depends on its values), "
            "but it is computed from the model's inputs: bind such graph inputs with "
            "fbjax.load(path, constant_inputs={name: array}), or, for NonMaxSuppression, NonZero, TopK and Loop, "
            "load with static_bounds=True (outputs padded to a bound, plus a valid count); "
            "CLI: --constant-input NAME=FILE.npy, --static-bounds"
        )
    return c


def out_dtype(ctx, i: int = 0) -> np.dtype:
    o = ctx.outputs[i] if i < len(ctx.outputs) else None
    return np.dtype(o.dtype) if o is not None and o.dtype is not None else np.dtype(np.float32)


def as_bool(x):
    """int32 0/1 (RTen's bool) or bool -> bool."""
    return x if jnp.asarray(x).dtype == jnp.bool_ else (jnp.asarray(x) != 0)


def from_bool(x):
    """bool -> int32 0/1 (RTen has no bool at runtime)."""
    return jnp.asarray(x).astype(jnp.int32)


def is_float(x) -> bool:
    return jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating)


def spatial_letters(n: int) -> str:
    if n > 3:
        raise ValueError(f"{n} spatial dimensions (fbjax supports 1-3)")
    return "DHW"[3 - n:]
