"""Re-reading a recorded session: what its team decided per item, in the team's own terms,
and how two sessions' decisions differ (``pantheon diff``, what-if, both dashboards)."""

from pantheon.rerun._outcomes import (
    OutcomeChange,
    OutcomeDiff,
    SessionOutcomes,
    diff_outcomes,
    outcome_spec,
    session_outcomes,
)

__all__ = [
    "OutcomeChange",
    "OutcomeDiff",
    "SessionOutcomes",
    "diff_outcomes",
    "outcome_spec",
    "session_outcomes",
]
