"""Fixtures of the pantheon tests: a session recorded against a model server."""

from model_session import model_scenario, model_session  # noqa: F401 - shared fixtures
from node_session import node_sessions  # noqa: F401 - shared fixture
