"""Fixtures of the live feed tests: a scenario whose team calls a model server."""

from model_session import model_scenario, model_session  # noqa: F401 - shared fixtures
from node_session import node_sessions  # noqa: F401 - shared fixture
