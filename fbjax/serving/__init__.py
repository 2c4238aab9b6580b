"""Serving LLM bundles: continuous batching (:mod:`fbjax.serving.engine`) behind an OpenAI-compatible
HTTP server (:mod:`fbjax.serving.server`, ``fbjax serve BUNDLE``; needs ``pip install 'fbjax[serve]'``)."""

from .engine import Engine, Event, Request

__all__ = ["Engine", "Event", "Request"]
