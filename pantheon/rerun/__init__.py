"""Re-running recorded sessions, and reading what they decided.

:func:`rerun` re-publishes a session's recorded inputs through a team on a fresh bus and
asks a :class:`Policy`, for every effect call, to serve the recorded answer, run it live or
call it a divergence. The modes are policies over that one loop:

* :class:`ExactReplay`: the same team must take the same path (:func:`replay_session`,
  ``pantheon replay``);
* :class:`WhatIf`: a changed team, served where a call is the recorded one
  (``pantheon replay --with``, :mod:`pantheon.rerun._whatif`);
* :class:`Resume`: a dead run's recording served, then on live (``pantheon resume``,
  :mod:`pantheon.rerun.resume`, the room's second face, which the package does not import:
  it runs the live feed, and the live feed reads sessions' outcomes from here).

A what-if's changed team is the recorded scenario with an overlay applied
(:func:`apply_overlay`); :func:`whatif_replay` runs it and judges it as a run.

What a session decided per item, in the team's own terms, and how two sessions' decisions
differ (``pantheon diff``, what-if, both dashboards): :func:`session_outcomes`,
:func:`diff_outcomes`.
"""

from pantheon.rerun._engine import (
    DEFAULT_REPLAY_TIMEOUT,
    Rerun,
    RerunEffects,
    Setup,
    by_name,
    counts_line,
    credit_inputs,
    incomplete_reason,
    node_cuts,
    rerun,
    unrecorded_nodes,
)
from pantheon.rerun._exact import ReplayReport, nondeterminism_hint, replay_session
from pantheon.rerun._outcomes import (
    OutcomeChange,
    OutcomeDiff,
    SessionOutcomes,
    changed_agents,
    diff_outcomes,
    left_out_both,
    left_out_inputs,
    outcome_spec,
    session_outcomes,
)
from pantheon.rerun._overlay import apply_overlay, read_overlay
from pantheon.rerun._policies import EffectCall, ExactReplay, Policy, Resume, Verdict, WhatIf
from pantheon.rerun._whatif import WhatIfReport, whatif_replay

__all__ = [
    "DEFAULT_REPLAY_TIMEOUT",
    "EffectCall",
    "ExactReplay",
    "OutcomeChange",
    "OutcomeDiff",
    "Policy",
    "ReplayReport",
    "Rerun",
    "RerunEffects",
    "Resume",
    "SessionOutcomes",
    "Setup",
    "Verdict",
    "WhatIf",
    "WhatIfReport",
    "apply_overlay",
    "by_name",
    "changed_agents",
    "counts_line",
    "credit_inputs",
    "diff_outcomes",
    "incomplete_reason",
    "left_out_both",
    "left_out_inputs",
    "node_cuts",
    "nondeterminism_hint",
    "outcome_spec",
    "read_overlay",
    "replay_session",
    "rerun",
    "session_outcomes",
    "unrecorded_nodes",
    "whatif_replay",
]
