"""The op registry used by both the JAX lowering and the numpy reference.

Each side keeps its own :class:`Registry` instance (``fbjax.lower.LOWERINGS``
and ``fbjax.reference.REFERENCE``), filled by explicit imports of its family
modules, so the two never import each other. Keys are ``(op_set, op_name)``
with the op name spelled exactly as its spec spells it.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Iterable, Mapping, Optional


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
        check: ``check(node) -> reason or None``, run at load on every node
            of this op: a reason (a string) when no kernel exists for what
            the node's input/output specs and attributes ask for (an int16
            variant LiteRT lacks...), so that load lists the node as
            unsupported instead of the first call failing (see
            :func:`kernel_gaps`). Also used for ops that dispatch on an
            attribute (``stablehlo.custom_call`` on its target).

        The fields below are what the load-time passes and the CPU inference
        planner need to know about an op, declared at its registration
        instead of in op tables of their own:

        batch: how the op treats a leading batch dimension that its inputs
            carry (:func:`fbjax.passes.shapes.set_batch_size`): ``None`` (it keeps
            dimension 0 as dimension 0 of its outputs, checked on their
            shapes), or ``rule(node, carrying, batch)``, which raises
            :class:`~fbjax.errors.InputError` when the op moves or mixes the
            batch and may rewrite the node's shape constants (written
            beside the op, with the helpers of :mod:`fbjax.op_rules`). ``carrying`` is the set of
            ``id(Value)`` that carry the batch; ``batch`` the target size
            (``None``: any).
        foldable: whether a node whose inputs are all load-time constants
            may be computed once ahead of the calls (False for random draws,
            state, control flow and sequences).
        weights: ``((input position, file layout), ...)``: the inputs that
            are weights, in the file's layout (``"OHWI"``, ``"OIHW"``,
            ``"OI"``...), for the inference planner's relayout and the
            constant operands it computes ahead.
        reads_input_twice: the lowering reads input 0 twice in a way that
            must see one value (softmax's ``x - max(x)``); the inference
            planner materialises that input once.
        regions: ``{attribute: Region}``: the graphs the op runs
            (:attr:`fbjax.ir.Node.regions`) and what each takes and returns
            (:class:`fbjax.op_rules.Region`), checked at load by
            :func:`fbjax.passes.reading.check_regions`; a region marked
            ``scalar`` (reduction bodies, sort comparators) never sees a
            batch dimension (:func:`fbjax.passes.shapes.set_batch_size`).
        out_dtype: ``fn(node, k, graphs) -> dtype or None``: the dtype of
            output ``k`` when the file leaves it open (RTen values that shape
            inference did not type), filled at load by
            :func:`fbjax.passes.reading.fill_dtypes`; ops without it (or
            returning None) take their first typed input's dtype.
        shape_only: the op reads only its inputs' shapes, never their values
            (TFLite SHAPE, ONNX Shape): a value computed from a graph input
            through it is still known at load
            (:func:`fbjax.lower.build.static_input_suspects`).
        stateful: the op reads or writes run state (resource variables, the
            PRNG key; :mod:`fbjax.lower.state`): a bool, or ``fn(node) ->
            bool`` when only some configurations do.
        init_state: ``(order, fn(program, params, state))``: how a stateful
            op's initial state is made (run once per model, in ``order``).
        full_precision: under a reduced ``compute_dtype`` (``fbjax.load(...,
            compute_dtype="bfloat16")``), the op still computes in float32
            (reductions, softmax, normalisations): its float inputs are
            widened to float32 before the call.
        bounded_inputs: static input positions that static-bound mode
            (``fbjax.load(..., static_bounds=True)``, a node given a
            valid-count output by :func:`fbjax.passes.shapes.add_valid_counts`)
            lets the graph compute: the op then pads its output to a bound
            (TFLite WHERE's condition, UNIQUE's input).
        static_bound: for ops whose output size depends on values: the
            rule (beside the op; :mod:`fbjax.op_rules`) by which static-bound mode
            (:func:`fbjax.passes.shapes.add_valid_counts`) pads the node's outputs
            and names its valid count; None: the op's sizes are static.
        squashing: the op maps its float input into a bounded range
            (logistic, softmax): precision comparisons
            (:mod:`fbjax.precision`) read its input, the logits, instead.
        set_facts: the facts that only some op sets have (TFLite's
            ``int_passthrough``, ``fq_rounding``, ``hybrid_eligible``,
            ``bias_scale``, a composite's ``xnnpack_kernel``...), declared
            with their meaning and default in the op set's fact table
            (:meth:`Registry.declare_facts`, beside the op set's
            registrations) and read with :meth:`fact`.
    """

    op_set: str
    name: str
    fn: Callable
    static_inputs: tuple = ()
    differentiable: bool = True
    attr_names: frozenset = field(default_factory=frozenset)
    accepts_any_attr: bool = False
    check: Optional[Callable] = None
    batch: Optional[Callable] = None
    foldable: bool = True
    weights: tuple = ()
    reads_input_twice: bool = False
    regions: dict = field(default_factory=dict, hash=False)
    out_dtype: Optional[Callable] = None
    shape_only: bool = False
    stateful: object = False
    init_state: Optional[tuple] = None
    full_precision: bool = False
    bounded_inputs: tuple = ()
    static_bound: Optional[Callable] = None
    squashing: bool = False
    set_facts: Mapping = field(default_factory=dict, hash=False, compare=False)

    @property
    def key(self) -> tuple[str, str]:
        return (self.op_set, self.name)

    def fact(self, name: str):
        """The fact ``name`` of this op: an :class:`OpDef` field (the facts
        every op set shares), or a fact of the op sets' fact tables
        (:meth:`Registry.declare_facts`): its declared value, else its
        default (also for an op set that does not declare it).

        Raises:
            TypeError: ``name`` is no fact (of any op set).
        """
        if name in _SHARED_FACTS:
            return getattr(self, name)
        if name in self.set_facts:
            return self.set_facts[name]
        if name in _SET_FACT_DEFAULTS:
            return _SET_FACT_DEFAULTS[name]
        raise TypeError(f"{name!r} is no op fact (shared: {sorted(_SHARED_FACTS)}; "
                        f"declared by op sets: {sorted(_SET_FACT_DEFAULTS)})")

    @property
    def scalar_regions(self) -> tuple:
        """The region attributes whose bodies are scalar computations
        (:attr:`regions` marked ``scalar``): they never see a batch dimension."""
        return tuple(a for a, r in self.regions.items() if getattr(r, "scalar", False))


#: the facts every op set may declare: :class:`OpDef` fields
_SHARED_FACTS = frozenset({"batch", "foldable", "weights", "reads_input_twice", "regions", "out_dtype", "shape_only",
                           "check", "stateful", "init_state", "full_precision", "bounded_inputs", "static_bound",
                           "squashing"})
#: ``fact -> default`` of every fact some op set declared (:meth:`Registry.declare_facts`)
_SET_FACT_DEFAULTS: dict = {}


class Registry:
    """A table of op implementations keyed by ``(op_set, op_name)``."""

    def __init__(self, kind: str):
        self.kind = kind
        self._ops: dict[tuple[str, str], OpDef] = {}
        self._set_facts: dict[str, dict] = {}

    def declare_facts(self, op_sets: str | Iterable[str], **defaults) -> None:
        """Declare facts that only the ops of ``op_sets`` have, with their
        defaults (the op set's fact table, written beside its registrations,
        where each fact's meaning is documented). :meth:`register` accepts
        them for these op sets only; :meth:`OpDef.fact` reads them.

        Raises:
            TypeError: a name that is a shared fact (an :class:`OpDef`
                field), or a fact declared before with another default.
        """
        for name, default in defaults.items():
            if name in _SHARED_FACTS or name in {f for f in OpDef.__dataclass_fields__}:
                raise TypeError(f"{self.kind}: {name!r} is an OpDef field, not an op-set fact")
            if name in _SET_FACT_DEFAULTS and _SET_FACT_DEFAULTS[name] != default:
                raise TypeError(f"{self.kind}: fact {name!r} declared with default {default!r}, "
                                f"elsewhere {_SET_FACT_DEFAULTS[name]!r}")
            _SET_FACT_DEFAULTS[name] = default
        for op_set in [op_sets] if isinstance(op_sets, str) else op_sets:
            self._set_facts.setdefault(op_set, {}).update(defaults)

    def known_facts(self, op_set: str) -> frozenset:
        """The facts a registration of ``op_set`` may declare: the shared ones
        and those of the op set's fact table."""
        return _SHARED_FACTS | frozenset(self._set_facts.get(op_set, {}))

    def register(
        self,
        op_set: str,
        name: str | Iterable[str],
        *,
        static_inputs: Iterable[int] = (),
        differentiable: bool = True,
        replace: bool = False,
        **facts,
    ):
        """Decorator registering ``fn`` for one op name (or several names).

        ``facts``: what the passes read about the op, declared with it: the
        :class:`OpDef` fields every op set shares (``batch``, ``foldable``,
        ``weights``, ``reads_input_twice``, ``regions``, ``check``,
        ``stateful``, ``init_state``...) and the facts of ``op_set``'s fact
        table (:meth:`declare_facts`: TFLite's ``int_passthrough``,
        ``fq_rounding``...), kept in :attr:`OpDef.set_facts`.

        Raises:
            ValueError: if the key is already registered and ``replace`` is
                False.
            TypeError: an unknown fact (one neither shared nor in
                ``op_set``'s fact table).
        """
        known = self.known_facts(op_set)
        unknown = set(facts) - known
        if unknown:
            raise TypeError(f"{self.kind}: unknown op facts {sorted(unknown)} for op set {op_set!r} "
                            f"(known: {sorted(known)})")
        shared = {k: v for k, v in facts.items() if k in _SHARED_FACTS}
        own = MappingProxyType({k: v for k, v in facts.items() if k not in _SHARED_FACTS})
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
                    op_set, n, fn, tuple(static_inputs), differentiable, kw, any_kw, **shared, set_facts=own
                )
            return fn

        return deco

    def get(self, op_set: str, name: str) -> Optional[OpDef]:
        return self._ops.get((op_set, name))

    def names_with(self, op_set: str, fact: str) -> frozenset:
        """Names of the ops of ``op_set`` whose ``fact`` is set (truthy)."""
        return frozenset(n for (s, n), od in self._ops.items() if s == op_set and od.fact(fact))

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


def kernel_gaps(nodes: Iterable, registry: "Registry") -> list:
    """``[(node, reason)]`` for the nodes whose registered :attr:`OpDef.check`
    finds no kernel for their specs (nodes without a registration are not
    listed: that is the caller's missing-op check)."""
    out = []
    for node in nodes:
        opdef = registry.get(node.op_set, node.op_name)
        if opdef is not None and opdef.check is not None:
            reason = opdef.check(node)
            if reason:
                out.append((node, reason))
    return out


def gap_detail(gaps: list, limit: int = 10) -> str:
    """The message part listing :func:`kernel_gaps` (location and reason)."""
    if not gaps:
        return ""
    lines = [f"{n.location} ({n.op_name}): {r}" for n, r in gaps[:limit]]
    more = f"; and {len(gaps) - limit} more" if len(gaps) > limit else ""
    return "No kernel for: " + "; ".join(lines) + more + "."


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
