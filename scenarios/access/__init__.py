"""An IT access-request desk: a team of two model agents, built on Pantheon's public API.

``scenarios/access_requests.yaml`` runs it over ``scenarios/data/access_requests.jsonl``,
generated requests with the decision the desk's written policy gives each
(``scenarios/data/make_access_requests.py``). The intake agent looks the requester up with a
Python tool (:mod:`access.directory`); the reviewer reads the resource's policy and the
requester's grants from the desk's own MCP server (:mod:`access.registry_server`, started
over stdio by :mod:`access.registry`), decides, and records the decision through it. Their
answers are the pydantic models of :mod:`access.answers`. Offline, the model is
:mod:`access.model`, a scripted one that follows the policy written in the reviewer's
instructions.
"""
