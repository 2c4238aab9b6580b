"""Flax NNX interop: an imported model as an ``nnx.Module``.

::

    from flax import nnx
    import fbjax, fbjax.flax, optax

    net = fbjax.flax.to_nnx(fbjax.load("model.tflite", batch_size=None), include="*head*")
    opt = nnx.Optimizer(net, optax.adam(1e-3), wrt=nnx.Param)
    grads = nnx.grad(lambda m: loss(m(x), y))(net)     # grads of the nnx.Param weights only
    opt.update(net, grads)
    net.save("tuned.tflite")                          # back to the file's format

The trainable weights are ``nnx.Param`` s, the others :class:`Frozen`
variables (``nnx.Variable`` s that ``nnx.Optimizer(..., wrt=nnx.Param)`` and
``nnx.grad`` leave alone), both in ``module.weights``, an ``nnx.Dict`` keyed
by tensor name. ``nnx.state(module)`` / ``nnx.update`` and Flax checkpointing
(orbax) see them as any other module's state. Flax is an optional
dependency (``pip install 'fbjax[examples]'`` or ``pip install flax``).
"""

from __future__ import annotations

try:
    from flax import nnx
except ImportError as e:  # pragma: no cover - exercised only without flax
    raise ImportError("fbjax.flax needs Flax: pip install flax (or pip install 'fbjax[examples]')") from e

from .train import trainable

__all__ = ["to_nnx", "FbjaxModule", "Frozen"]


class Frozen(nnx.Variable):
    """A model weight that is not trained (not an ``nnx.Param``)."""


class FbjaxModule(nnx.Module):
    """An :class:`fbjax.Model` as an NNX module.

    Attributes:
        weights: ``nnx.Dict`` tensor name -> ``nnx.Param`` (trainable) or
            :class:`Frozen`.
        model: the wrapped :class:`fbjax.Model` (static).
    """

    def __init__(self, model, *, include=None, exclude=None, dtype=None):
        # nnx.static marks a non-array attribute explicitly (Flax >= 0.12)
        self.model = nnx.static(model) if hasattr(nnx, "static") else model
        train, frozen = trainable(model.params, include=include, exclude=exclude, dtype=dtype)
        weights = {k: nnx.Param(v) for k, v in train.items()}
        weights.update({k: Frozen(v) for k, v in frozen.items()})
        self.weights = nnx.Dict(weights) if hasattr(nnx, "Dict") else weights

    def params_dict(self) -> dict:
        """The current weights as a plain ``{name: array}`` for ``model.apply``."""
        return {k: v[...] for k, v in self.weights.items()}

    def __call__(self, *inputs):
        """``model.apply(current weights, *inputs)``: one array or a tuple."""
        return self.model.apply(self.params_dict(), *inputs)

    def save(self, path=None, *, requantize: str = "file") -> bytes:
        """Write the model file with the module's current weights (:meth:`fbjax.Model.save`)."""
        return self.model.save(path, self.params_dict(), requantize=requantize)


def to_nnx(model, *, include=None, exclude=None, dtype=None) -> FbjaxModule:
    """Wrap ``model`` (an :class:`fbjax.Model`) as an NNX module.

    Args:
        model: a loaded model.
        include, exclude: name patterns choosing the ``nnx.Param`` weights,
            as in :func:`fbjax.trainable` (default: every weight).
        dtype: cast the trainable weights (e.g. ``jnp.float32`` for float16
            files).

    Returns:
        a :class:`FbjaxModule`.
    """
    return FbjaxModule(model, include=include, exclude=exclude, dtype=dtype)
