"""Choosing which weights to train.

:attr:`fbjax.Model.params` holds every float weight of the file keyed by
tensor name. :func:`trainable` splits it in two by name, so that
``jax.grad`` and an optax optimizer see only the part being trained::

    train, frozen = fbjax.trainable(model.params, include="*conv2d_4*", dtype=jnp.float32)
    loss = lambda t: jnp.mean((model.apply(fbjax.train.merge(t, frozen), x) - y) ** 2)
    grads = jax.grad(loss)(train)            # keys of `train` only
    model.save("tuned.tflite", train)        # the other weights keep the file's values
"""

from __future__ import annotations

import fnmatch
import re
from typing import Callable, Iterable, Mapping, Optional, Union

__all__ = ["trainable", "merge"]

Pattern = Union[str, "re.Pattern", Callable[[str], bool]]


def _matcher(patterns) -> Optional[Callable[[str], bool]]:
    if patterns is None:
        return None
    if isinstance(patterns, (str, re.Pattern)) or callable(patterns):
        patterns = [patterns]
    tests = []
    for p in patterns:
        if isinstance(p, re.Pattern):
            tests.append(lambda name, p=p: p.search(name) is not None)
        elif isinstance(p, str):
            tests.append(lambda name, p=p: fnmatch.fnmatchcase(name, p))
        elif callable(p):
            tests.append(p)
        else:
            raise TypeError(f"a name pattern must be a glob string, a compiled regex or a callable, got {p!r}")
    return lambda name: any(t(name) for t in tests)


def trainable(
    params: Mapping,
    include: Union[None, Pattern, Iterable[Pattern]] = None,
    exclude: Union[None, Pattern, Iterable[Pattern]] = None,
    *,
    dtype=None,
) -> tuple[dict, dict]:
    """Split ``params`` into ``(trainable, frozen)`` by tensor name.

    A name is trainable when it matches one of ``include`` (all names when
    ``include`` is None) and none of ``exclude``. Patterns are shell globs
    matched against the whole name (``"*conv2d_4*"``, ``"*/BiasAdd*"``),
    compiled regular expressions (``re.compile("dense")``, searched), or
    predicates ``name -> bool``. Matching is case-sensitive.

    Args:
        params: ``model.params`` (or any dict of arrays).
        include: pattern(s) selecting the trainable names.
        exclude: pattern(s) removed from the selection.
        dtype: cast the trainable arrays to this dtype (e.g. ``jnp.float32``
            to train float16 weights in float32; :meth:`fbjax.Model.save`
            casts back to the file's dtype). The frozen arrays are returned
            as they are.

    Returns:
        two dicts partitioning ``params``'s keys;
        ``fbjax.train.merge(trainable, frozen)`` (or ``{**frozen,
        **trainable}``) is a full params dict for :meth:`fbjax.Model.apply`.

    Raises:
        ValueError: an ``include`` pattern matches none of the names (a
            typo would otherwise train nothing, silently); the message lists
            a few names to pick patterns from.
    """
    if include is not None:
        pats = [include] if isinstance(include, (str, re.Pattern)) or callable(include) else list(include)
        for p in pats:
            test = _matcher(p)
            if not any(test(name) for name in params):
                names = list(params)
                raise ValueError(f"include pattern {getattr(p, 'pattern', p)!r} matches none of the {len(names)} "
                                 f"param names (case-sensitive; e.g. {names[:4]}); list(model.params) has them all")
    inc = _matcher(include)
    exc = _matcher(exclude)
    train, frozen = {}, {}
    for name, value in params.items():
        chosen = (inc is None or inc(name)) and not (exc is not None and exc(name))
        if chosen:
            train[name] = value if dtype is None else value.astype(dtype)
        else:
            frozen[name] = value
    return train, frozen


def merge(*parts: Mapping) -> dict:
    """One params dict from several (later ones win on repeated names)."""
    out: dict = {}
    for p in parts:
        out.update(p)
    return out
