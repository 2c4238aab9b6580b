"""The numpy reference registry: ``(op_set, op_name) -> numpy function``.

Mirrors :mod:`fbjax.lower.registry` name for name, but is filled by the
modules under :mod:`fbjax.reference` only. Reference functions take
``(ctx, *inputs, **attrs)`` like lowerings, with numpy arrays in and out.
"""

from .._registry import Registry

REFERENCE = Registry("reference")
register = REFERENCE.register
