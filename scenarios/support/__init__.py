"""The support desk: Pantheon's reference team, its email-specific parts kept here.

``scenarios/support_email.yaml`` (and the other support scenarios beside it) run the
built-in roles over ``scenarios/data/support_emails.jsonl`` and give them what is particular
to a support inbox, by import path, the way ``scenarios/oncall/`` supplies the on-call team:
the inbox's checks and the Sensor's features in :mod:`support.emails`, the
personal-data rules the Guardian applies in :mod:`support.pii`, the intents, their actions
and the classification question the Reasoner asks in :mod:`support.intents`.
"""

from support.emails import email_problem, extract_features
from support.intents import ACTION_FOR_INTENT, INTENTS, classify
from support.pii import find_pii, redact, scrub

__all__ = [
    "ACTION_FOR_INTENT",
    "INTENTS",
    "classify",
    "email_problem",
    "extract_features",
    "find_pii",
    "redact",
    "scrub",
]
