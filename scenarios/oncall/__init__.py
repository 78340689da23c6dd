"""An on-call alert triage team: Pantheon's roles in a second domain, on its public API.

``scenarios/oncall.yaml`` runs it over ``scenarios/data/oncall_alerts.jsonl``, two days of
generated production alerts with their ground truth (:mod:`oncall.alerts`). The team's own
agents are in :mod:`oncall.agents`, its runbook and Guardian policy in :mod:`oncall.policy`,
the Actor's tools in :mod:`oncall.tools`, and the estate they look after (services, hosts,
dependencies, change calendar) in :mod:`oncall.estate`.
"""
