"""Re-running recorded sessions: one engine, one policy per mode.

:func:`rerun` re-publishes a session's recorded inputs through a team on a fresh bus and
asks a :class:`Policy`, for every effect call, to serve the recorded answer, run it live or
call it a divergence. The modes are policies over that one loop:

* :class:`ExactReplay`: the same team must take the same path (:func:`replay_session`,
  ``pantheon replay``);
* :class:`WhatIf`: a changed team, served where a call is the recorded one
  (``pantheon replay --with``, :mod:`pantheon._whatif`);
* :class:`Resume`: a dead run's recording served, then on live (``pantheon resume``).
"""

from pantheon.rerun._engine import (
    DEFAULT_REPLAY_TIMEOUT,
    Rerun,
    RerunEffects,
    Setup,
    credit_inputs,
    incomplete_reason,
    rerun,
)
from pantheon.rerun._exact import ReplayReport, nondeterminism_hint, replay_session
from pantheon.rerun._policies import EffectCall, ExactReplay, Policy, Resume, Verdict, WhatIf

__all__ = [
    "DEFAULT_REPLAY_TIMEOUT",
    "EffectCall",
    "ExactReplay",
    "Policy",
    "ReplayReport",
    "Rerun",
    "RerunEffects",
    "Resume",
    "Setup",
    "Verdict",
    "WhatIf",
    "credit_inputs",
    "incomplete_reason",
    "nondeterminism_hint",
    "replay_session",
    "rerun",
]
