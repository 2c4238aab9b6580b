"""The op registry used by both the JAX lowering and the numpy reference.

Each side keeps its own :class:`Registry` instance (``fbjax.lower.LOWERINGS``
and ``fbjax.reference.REFERENCE``), filled by explicit imports of its family
modules, so the two never import each other. Keys are ``(op_set, op_name)``
with the op name spelled exactly as its spec spells it.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional


@dataclass(frozen=True)
class OpDef:
    """One registered op implementation.

    Attributes:
        op_set: ``"tflite"``, ``"tflite.custom"``, ``"onnx"``, ``"stablehlo"``.
        name: op name as the spec spells it (``CONV_2D``, ``Conv``).
        fn: ``fn(ctx, *inputs, **attrs)`` returning one array or a sequence.
        static_inputs: input positions that must be known at load time
            (shapes, axes, paddings); they arrive as numpy arrays.
        differentiable: False for ops whose outputs have no useful gradient
            (integer results, argmax, random draws).
        attr_names: keyword attributes the function accepts.
        full_precision: under a reduced ``compute_dtype`` (``fbjax.load(...,
            compute_dtype="bfloat16")``), the op still computes in float32
            (reductions, softmax, normalisations): its float inputs are
            widened to float32 before the call.
    """

    op_set: str
    name: str
    fn: Callable
    static_inputs: tuple = ()
    differentiable: bool = True
    attr_names: frozenset = field(default_factory=frozenset)
    accepts_any_attr: bool = False
    full_precision: bool = False

    @property
    def key(self) -> tuple[str, str]:
        return (self.op_set, self.name)


class Registry:
    """A table of op implementations keyed by ``(op_set, op_name)``."""

    def __init__(self, kind: str):
        self.kind = kind
        self._ops: dict[tuple[str, str], OpDef] = {}

    def register(
        self,
        op_set: str,
        name: str | Iterable[str],
        *,
        static_inputs: Iterable[int] = (),
        differentiable: bool = True,
        replace: bool = False,
        full_precision: bool = False,
    ):
        """Decorator registering ``fn`` for one op name (or several names).

        Raises:
            ValueError: if the key is already registered and ``replace`` is
                False.
        """
        names = [name] if isinstance(name, str) else list(name)

        def deco(fn: Callable) -> Callable:
            sig = inspect.signature(fn)
            kw = frozenset(
                p.name for p in sig.parameters.values() if p.kind == inspect.Parameter.KEYWORD_ONLY
            )
            any_kw = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())
            for n in names:
                key = (op_set, n)
                if key in self._ops and not replace:
                    raise ValueError(f"{self.kind}: {op_set}:{n} is already registered")
                self._ops[key] = OpDef(
                    op_set, n, fn, tuple(static_inputs), differentiable, kw, any_kw, full_precision
                )
            return fn

        return deco

    def get(self, op_set: str, name: str) -> Optional[OpDef]:
        return self._ops.get((op_set, name))

    def __contains__(self, key) -> bool:
        return tuple(key) in self._ops

    def __iter__(self):
        return iter(self._ops.values())

    def ops(self, op_set: Optional[str] = None) -> dict[str, list[str]]:
        """Registered op names grouped by op set (sorted)."""
        out: dict[str, list[str]] = {}
        for s, n in self._ops:
            if op_set is None or s == op_set:
                out.setdefault(s, []).append(n)
        return {s: sorted(v) for s, v in sorted(out.items())}


def call_op(opdef: OpDef, ctx, args, attrs: dict):
    """Call ``opdef.fn`` with the attributes it declares.

    Attributes the function does not declare are dropped: schema fields added
    after an op was written (and left at their defaults by writers) must not
    break loading.
    """
    if opdef.accepts_any_attr:
        kw = attrs
    else:
        kw = {k: v for k, v in attrs.items() if k in opdef.attr_names}
    return opdef.fn(ctx, *args, **kw)
