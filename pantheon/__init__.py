"""Pantheon: teams of agents over an event bus, every run recorded as a session you can watch,
diff and replay exactly.

The user API, for running a team from Python rather than from ``pantheon run``::

    import pantheon

    scenario = pantheon.load_scenario("scenarios/support_email.yaml")
    summary = await pantheon.run(scenario)            # recorded in .pantheon/sessions.db
    report = await pantheon.replay(summary.session_id)
    assert report.matched

Every error Pantheon raises on purpose derives from :class:`PantheonError` (the tree is drawn
in :mod:`pantheon._errors`). Depends on ``agents`` and ``bus``, never on ``dashboard``.
"""

from pantheon._api import Session, replay, run
from pantheon._errors import PantheonError
from pantheon.runner import AgentSetupError, ClusterError, RunSummary
from pantheon.scenario import Problem, Scenario, ScenarioError, load_scenario, parse_scenario

__all__ = [
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
]
