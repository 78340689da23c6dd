"""``import pantheon`` is the user API: exactly these names, one exception root beneath them."""

from __future__ import annotations

import pantheon
from pantheon.live import LiveError
from pantheon.sessions import SessionError
from pantheon.telemetry import TelemetryConfigError


def test_public_names_are_exactly_the_user_api() -> None:
    public = {n for n in dir(pantheon) if not n.startswith("_")}
    # Subpackages and modules show up once imported; they are not part of the face.
    modules = {n for n in public if type(getattr(pantheon, n)).__name__ == "module"}
    assert public - modules == set(pantheon.__all__)
    assert set(pantheon.__all__) == {
        "AgentSetupError",
        "ClusterError",
        "PantheonError",
        "Problem",
        "RunSummary",
        "Scenario",
        "ScenarioError",
        "Session",
        "load_scenario",
        "parse_scenario",
        "replay",
        "run",
    }


def test_every_pantheon_error_has_one_root() -> None:
    from pantheon.runner._multiprocess import ClusterError

    for cls in (
        pantheon.ScenarioError,
        pantheon.AgentSetupError,
        SessionError,
        LiveError,
        ClusterError,
        TelemetryConfigError,
    ):
        assert issubclass(cls, pantheon.PantheonError), cls
    # The builtin bases callers caught before stay.
    assert issubclass(pantheon.ScenarioError, ValueError)
    assert issubclass(ClusterError, RuntimeError)
    assert issubclass(pantheon.AgentSetupError, RuntimeError)
