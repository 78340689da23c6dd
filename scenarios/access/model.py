"""The desk's scripted model: a deterministic function of the conversation that plays the
model for both agents, so the team runs offline (``provider.stand_in:
"access.model:reply"`` in the scenario; ``python -m pantheon.testing --reply
access.model:reply --path scenarios`` serves it on its own).

It works as a model would: it calls the tools it is offered turn by turn, reads what they
answer, and decides by the policy **written in the reviewer's instructions** (the system
message), never by a policy of its own. Each line of the instructions that starts with
``- Deny``, ``- Escalate`` or ``- Grant`` is a rule; the first rule whose condition holds
decides, and a line it does not understand is ignored. So editing the instructions (a
what-if) changes its decisions, and only there.

It reads the conditions the way a hurried model would, which is where it is wrong:

* a change ticket is cited only when written the way the instructions show it
  (``CHG-1234``): ``chg1234`` or ``change 1234`` are not seen;
* a justification "with fewer than N words" is judged by counting words, so a long one with
  no purpose in it passes, and a short one with a purpose ("on-call") does not.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pantheon.testing import Reply

__all__ = ["Facts", "Rule", "decide", "policy", "reply"]

RANK = {"read": 0, "write": 1, "admin": 2}


@dataclass(frozen=True, slots=True)
class Facts:
    """What the reviewer knows of one request once its tools have answered."""

    request: Mapping[str, Any]
    #: The resource's policy, None when the registry has none.
    policy: Mapping[str, Any] | None
    #: Resource -> the highest level the requester holds on it.
    held: Mapping[str, str]

    @property
    def level(self) -> str:
        return str(self.request["level"])


Condition = Callable[[Facts, re.Match[str]], bool]


def _held(f: Facts) -> bool:
    have = f.held.get(str(f.request["resource"]))
    return have is not None and RANK[have] >= RANK[f.level]


def _contractor(f: Facts) -> bool:
    return bool(f.request.get("contractor")) and f.level != "read"


def _conflict(f: Facts) -> bool:
    conflicts = (f.policy or {}).get("conflicts", [])
    return f.level != "read" and any(RANK.get(f.held.get(c, ""), -1) >= 1 for c in conflicts)


def _outside(f: Facts) -> bool:
    return f.policy is not None and f.request.get("department") not in f.policy["owners"]


def _no_ticket(f: Facts) -> bool:
    restricted = f.policy is not None and f.policy["restricted"]
    cited = re.search(r"\bCHG-\d{4}\b", str(f.request["justification"])) is not None
    return restricted and f.level == "write" and not cited


#: The conditions it understands, by a phrase of the rule's text.
CONDITIONS: tuple[tuple[str, Condition], ...] = (
    (r"directory does not know", lambda f, m: not f.request.get("found")),
    (r"has left", lambda f, m: f.request.get("status") == "terminated"),
    (r"on leave", lambda f, m: f.request.get("status") == "on_leave"),
    (r"has no policy", lambda f, m: f.policy is None),
    (r"already holds", lambda f, m: _held(f)),
    (r"conflicts with", lambda f, m: _conflict(f)),
    (r"contractor.*more than read", lambda f, m: _contractor(f)),
    (r"admin access", lambda f, m: f.level == "admin"),
    (r"outside the resource's owning departments", lambda f, m: _outside(f)),
    (r"restricted resource unless .*change ticket", lambda f, m: _no_ticket(f)),
    (
        r"fewer than (\d+) words",
        lambda f, m: len(str(f.request["justification"]).split()) < int(m.group(1)),
    ),
    (r"anything else|every other request", lambda f, m: True),
)

_RULE = re.compile(r"^\s*[-*]\s*(Deny|Escalate|Grant)\b\s*(.*?)\s*$", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Rule:
    """One policy line: the decision, its text, and the condition it was read as."""

    decision: str
    text: str
    condition: Condition
    match: re.Match[str]

    def applies(self, facts: Facts) -> bool:
        return self.condition(facts, self.match)


def policy(instructions: str) -> list[Rule]:
    """The rules the instructions write, in their order; lines it cannot read are left out."""
    rules = []
    for line in instructions.splitlines():
        found = _RULE.match(line)
        if found is None:
            continue
        verb, text = found.groups()
        for phrase, condition in CONDITIONS:
            m = re.search(phrase, text, re.IGNORECASE)
            if m is not None:
                rules.append(Rule(verb.lower(), line.strip(" -*"), condition, m))
                break
    return rules


def decide(rules: list[Rule], facts: Facts) -> tuple[str, str]:
    """The first rule that applies: its decision and its text. None applies: escalate."""
    for rule in rules:
        if rule.applies(facts):
            return rule.decision, rule.text
    return "escalate", "no rule of the policy applies: a person decides"


# -- the conversation ---------------------------------------------------------------------------


def _tool_results(messages: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Each tool called so far, by name: its result (decoded JSON) or its error text. A
    tool message answers a call of the assistant message before it (call ids are only
    unique within one answer: a server may number each answer's calls from 0 again)."""
    names: dict[str, str] = {}
    out: dict[str, Any] = {}
    for m in messages:
        if m.get("role") == "assistant":
            names = {c["id"]: c["function"]["name"] for c in m.get("tool_calls") or ()}
        elif m.get("role") == "tool":
            content = str(m.get("content") or "")
            try:
                out[names[m["tool_call_id"]]] = json.loads(content)
            except ValueError:
                out[names[m["tool_call_id"]]] = content
    return out


def _text(messages: list[Mapping[str, Any]], role: str) -> str:
    return next((str(m["content"]) for m in messages if m.get("role") == role), "")


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def _intake(messages: list[Mapping[str, Any]]) -> Reply:
    """Look the requester up, then report what the directory said."""
    found = _tool_results(messages).get("lookup_employee")
    if found is None:
        asked = re.search(r"employee (\S+) asks", _text(messages, "user"))
        employee = asked.group(1) if asked else ""
        return Reply(tool_calls=[_call("lookup_employee", employee_id=employee)])
    if not isinstance(found, Mapping):  # the tool's error: the directory does not know them
        return Reply(json.dumps({"found": False}))
    keys = ("name", "status", "department", "contractor", "manager")
    return Reply(json.dumps({"found": True, **{k: found.get(k) for k in keys}}))


def _reviewer(messages: list[Mapping[str, Any]]) -> Reply:
    """Read the policy and the grants, decide, record the decision, then answer."""
    request = json.loads(_text(messages, "user"))
    results = _tool_results(messages)
    if "resource_policy" not in results:
        return Reply(
            tool_calls=[
                _call("resource_policy", resource=request["resource"]),
                _call("current_grants", employee=request["employee"]),
            ]
        )
    found = results["resource_policy"]
    grants = results.get("current_grants")
    held: dict[str, str] = {}
    for g in grants.get("grants", []) if isinstance(grants, Mapping) else ():
        if RANK[g["level"]] >= RANK.get(held.get(g["resource"], ""), -1):
            held[g["resource"]] = g["level"]
    facts = Facts(request, found if isinstance(found, Mapping) else None, held)
    decision, reason = decide(policy(_text(messages, "system")), facts)
    if "record_decision" not in results:
        return Reply(
            tool_calls=[
                _call(
                    "record_decision",
                    request_id=request["request_id"],
                    employee=request["employee"],
                    resource=request["resource"],
                    level=request["level"],
                    decision=decision,
                    reason=reason,
                )
            ]
        )
    return Reply(json.dumps({"decision": decision, "reason": reason}))


def reply(request: dict[str, Any]) -> Reply:
    """The model's next turn in the conversation ``request`` carries (a chat-completions
    body), for whichever agent asks: told apart by the tools it offers."""
    tools = {t["function"]["name"] for t in request.get("tools") or ()}
    messages = request["messages"]
    if "lookup_employee" in tools:
        return _intake(messages)
    if "resource_policy" in tools:
        return _reviewer(messages)
    return Reply("I have no tools for this conversation.")
