"""Exceptions raised by fbjax.

Every refusal fbjax makes is one of these, so callers can catch a single
family of errors instead of whatever a parser happened to trip over.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable


class FbjaxError(Exception):
    """Base class of every error fbjax raises on purpose."""


class ModelFormatError(FbjaxError, ValueError):
    """The file is not a valid model of the format it claims to be.

    The message names the part of the file that is wrong (a subgraph, an
    operator, a tensor, a buffer) so the user can tell a truncated download
    from an unsupported schema version.
    """


class UnsupportedOperatorError(FbjaxError, NotImplementedError):
    """The model uses operators fbjax cannot lower.

    Raised once per model at load time, listing every unsupported operator
    with how often it occurs, so a user sees the whole gap at once.

    Attributes:
        ops: mapping of ``"op_set:op_name"`` to its number of occurrences.
        detail: what the message adds after the listing (where, and why).
    """

    #: the message's closing advice when the operators have no lowering
    MISSING_HINT = (" See fbjax.supported_ops() for what is supported; custom ops can be added"
                    " with fbjax.register_custom_op(name).")

    def __init__(self, ops: Iterable[tuple[str, str]] | Counter, *, detail: str = "",
                 hint: str | None = None):
        """``hint`` replaces the closing advice (:attr:`MISSING_HINT`), for
        operators that do lower but not as the model is loaded (an operand
        that must be known at load time: the detail says what to bind)."""
        counts = Counter(ops) if not isinstance(ops, Counter) else ops
        self.detail = detail
        self.ops = {f"{s}:{n}": c for (s, n), c in sorted(counts.items())}
        listing = ", ".join(f"{k} (x{c})" for k, c in self.ops.items())
        msg = f"fbjax cannot lower {len(self.ops)} operator type(s): {listing}."
        if detail:
            msg += " " + detail
        msg += self.MISSING_HINT if hint is None else hint
        super().__init__(msg)


class InputError(FbjaxError, ValueError):
    """A model was called with inputs that do not match its input specs."""
