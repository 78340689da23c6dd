"""Helpers for testing code that talks to a model: a real local OpenAI-compatible server."""

from pantheon.testing._model_server import ModelServer, ReceivedRequest, Reply, classify_reply

__all__ = ["ModelServer", "ReceivedRequest", "Reply", "classify_reply"]
