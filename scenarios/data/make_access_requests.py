"""Generate what ``scenarios/access_requests.yaml`` feeds the IT access desk, with its labels.

    python scenarios/data/make_access_requests.py --seed 5 --count 200 -o scenarios/data

writes three files into the folder: ``access_directory.json`` (the people the intake agent's
directory tool knows), ``access_registry.json`` (the resources' policies and the grants
people hold today: what the desk's MCP server is seeded with on every start) and
``access_requests.jsonl`` (the requests, each with its ``expected`` decision). The same seed
writes the same bytes.

A request is ``{request_id, employee, resource, level, justification}``, ``level`` one of read,
write, admin. Its ``expected`` decision is the desk's written access policy, applied in this
order (the first rule that applies decides; ``rule`` in the label names it):

1. ``unknown``     an employee id the directory does not know: deny.
2. ``left``        a person who has left (status ``terminated``): deny.
3. ``on_leave``    a person on leave: escalate (their manager decides).
4. ``no_policy``   a resource the registry has no policy for: deny.
5. ``held``        access the person already holds, at that level or above: deny.
6. ``conflict``    write or admin on a resource that conflicts with one the person holds
                   write or admin on (paying and approving payments): deny.
7. ``admin``       any admin access: escalate (a person decides).
8. ``contractor``  a contractor asking more than read: deny.
9. ``outside``     a department that does not own the resource: escalate (the owner decides).
10. ``ticket``     write to a restricted resource without a change ticket cited in the
                   justification, in any of the forms people write one (``CHG-4821``,
                   ``chg4821``, ``change 4821``): deny.
11. ``vague``      a justification that gives no purpose ("need access pls", however long):
                   deny.
12. ``ok``         anything else: grant.

No two requests name the same person and resource, and no person asks for both sides of a
conflict, so what the desk grants during a run never changes a later request's decision:
every request's decision depends on itself and the seeded data only, in any order.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path
from typing import Any

DEPARTMENTS = ("engineering", "finance", "hr", "sales", "support", "security")
LEVELS = ("read", "write", "admin")
RANK = {level: i for i, level in enumerate(LEVELS)}

#: name -> (owning departments, restricted, conflicting resources)
RESOURCES: dict[str, tuple[tuple[str, ...], bool, tuple[str, ...]]] = {
    "wiki": (DEPARTMENTS, False, ()),
    "crm": (("sales", "support"), False, ()),
    "support-desk": (("support",), False, ()),
    "source-repo": (("engineering", "security"), False, ()),
    "prod-cluster": (("engineering",), True, ()),
    "payroll-db": (("finance", "hr"), True, ()),
    "hr-records": (("hr",), True, ()),
    "siem": (("security",), True, ()),
    "payments-submit": (("finance",), True, ("payments-approve",)),
    "payments-approve": (("finance",), True, ("payments-submit",)),
}
#: People in the directory, E001 to E090.
PEOPLE = 90
#: Resources people ask for that the registry has no policy for.
UNKNOWN_RESOURCES = ("billing-legacy", "ml-sandbox")

FIRST = [
    "Ada",
    "Alan",
    "Bea",
    "Bo",
    "Cy",
    "Dana",
    "Eli",
    "Fay",
    "Gus",
    "Hana",
    "Ivo",
    "Jun",
    "Kai",
    "Lena",
    "Milo",
    "Nia",
    "Omar",
    "Pia",
    "Quin",
    "Rae",
    "Sol",
    "Tess",
    "Uma",
    "Vik",
    "Wen",
    "Xia",
    "Yan",
    "Zoe",
]
LAST = [
    "Berg",
    "Chen",
    "Diaz",
    "Eng",
    "Fox",
    "Gray",
    "Holt",
    "Ito",
    "Jain",
    "Kim",
    "Lund",
    "Mora",
    "Nash",
    "Ortiz",
    "Park",
    "Roy",
]

PURPOSES = {
    "read": [
        "to look up {thing} for the quarterly review",
        "so I can answer customer questions about {thing}",
        "to check {thing} while on call this week",
        "for the audit of {thing} my manager asked for",
    ],
    "write": [
        "to update {thing} as part of the migration",
        "to fix {thing} reported in the last incident",
        "to roll out the new {thing} my team owns",
    ],
    "admin": [
        "to rotate the service credentials of {thing}",
        "to set up {thing} for the new team",
    ],
}
THINGS = ("the renewal accounts", "the billing records", "the release config", "the dashboards")
#: Justifications with no purpose in them: short ones and long ones.
VAGUE = (
    "need access",
    "pls",
    "asap",
    "for work",
    "I just need access to this for my work please",
    "my manager said I should ask for access to this one",
    "I need it to do my job, please approve quickly",
)
TICKET_FORMS = ("CHG-{n}", "CHG-{n}", "CHG-{n}", "chg{n}", "change {n}")
#: A change ticket in any of those forms.
TICKET = re.compile(r"\b(?:CHG-|chg|change )\d{4}\b")


def _people(rng: random.Random) -> list[dict[str, Any]]:
    people = []
    names = rng.sample([f"{f} {last}" for f in FIRST for last in LAST], PEOPLE)
    for i, name in enumerate(names, start=1):
        department = DEPARTMENTS[(i - 1) % len(DEPARTMENTS)]
        status = "active"
        if i % 19 == 0:
            status = "terminated"
        elif i % 17 == 0:
            status = "on_leave"
        people.append(
            {
                "id": f"E{i:03d}",
                "name": name,
                "department": department,
                "status": status,
                "contractor": i % 7 == 3,
                "manager": f"E{1 + (i - 1) % 6:03d}" if i > 6 else None,
            }
        )
    return people


def _grants(rng: random.Random, people: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What people hold today: mostly read on what their department owns, some write."""
    grants = []
    for person in people:
        owned = [r for r, (owners, _, _) in RESOURCES.items() if person["department"] in owners]
        for resource in rng.sample(owned, min(len(owned), rng.randint(0, 2))):
            level = "write" if rng.random() < 0.3 and not person["contractor"] else "read"
            grants.append({"employee": person["id"], "resource": resource, "level": level})
    return grants


def _justification(rng: random.Random, level: str, restricted: bool) -> str:
    if rng.random() < 0.16:
        return rng.choice(VAGUE)
    text = "Need {level} access " + rng.choice(PURPOSES[level]).format(thing=rng.choice(THINGS))
    text = text.format(level=level)
    if level == "write" and restricted and rng.random() < 0.7:
        ticket = rng.choice(TICKET_FORMS).format(n=rng.randint(1000, 9999))
        text += f" ({ticket})"
    if rng.random() < 0.1:
        # Short but with a purpose: a ticket and a verb are enough.
        text = f"CHG-{rng.randint(1000, 9999)} hotfix deploy" if level == "write" else "on-call"
    return text


def _has_ticket(text: str) -> bool:
    return TICKET.search(text) is not None


def decide(
    request: dict[str, Any],
    people: dict[str, dict[str, Any]],
    grants: list[dict[str, Any]],
) -> tuple[str, str]:
    """The expected decision and the rule that gave it (the module docstring's list)."""
    person = people.get(request["employee"])
    if person is None:
        return "deny", "unknown"
    if person["status"] == "terminated":
        return "deny", "left"
    if person["status"] == "on_leave":
        return "escalate", "on_leave"
    policy = RESOURCES.get(request["resource"])
    if policy is None:
        return "deny", "no_policy"
    owners, restricted, conflicts = policy
    level = request["level"]
    held = {g["resource"]: g["level"] for g in grants if g["employee"] == person["id"]}
    if request["resource"] in held and RANK[held[request["resource"]]] >= RANK[level]:
        return "deny", "held"
    if level != "read" and any(RANK.get(held.get(c, ""), -1) >= 1 for c in conflicts):
        return "deny", "conflict"
    if level == "admin":
        return "escalate", "admin"
    if person["contractor"] and level != "read":
        return "deny", "contractor"
    if person["department"] not in owners:
        return "escalate", "outside"
    if restricted and level == "write" and not _has_ticket(request["justification"]):
        return "deny", "ticket"
    if request["justification"] in VAGUE:
        return "deny", "vague"
    return "grant", "ok"


def generate(seed: int, count: int) -> tuple[list[Any], dict[str, Any], list[dict[str, Any]]]:
    """The directory, the registry and the labelled requests for ``seed``."""
    rng = random.Random(seed)
    people = _people(rng)
    grants = _grants(rng, people)
    by_id = {p["id"]: p for p in people}
    registry = {
        "resources": [
            {"name": name, "owners": list(owners), "restricted": restricted, "conflicts": list(c)}
            for name, (owners, restricted, c) in RESOURCES.items()
        ],
        "grants": grants,
    }
    asked: set[tuple[str, str]] = set()
    requests: list[dict[str, Any]] = []
    while len(requests) < count:
        # A few ids the directory does not know (E100 and up), a few unknown resources.
        unknown = rng.random() < 0.02
        employee = f"E{rng.randint(100, 199)}" if unknown else rng.choice(list(by_id))
        # Mostly what the person's own department owns; now and then anything.
        person = by_id.get(employee)
        owned = [r for r, (o, _, _) in RESOURCES.items() if person and person["department"] in o]
        draw = rng.random()
        pool = owned if draw < 0.8 and owned else [*RESOURCES]
        resource = rng.choice(pool if draw < 0.97 else UNKNOWN_RESOURCES)
        pair = {resource, *RESOURCES.get(resource, ((), False, ()))[2]}
        if any((employee, r) in asked for r in pair):
            continue
        asked.add((employee, resource))
        level = rng.choices(LEVELS, weights=(6, 3, 1))[0]
        restricted = RESOURCES.get(resource, ((), False, ()))[1]
        request = {
            "request_id": f"r-{len(requests) + 1:04d}",
            "employee": employee,
            "resource": resource,
            "level": level,
            "justification": _justification(rng, level, restricted),
        }
        decision, rule = decide(request, by_id, grants)
        requests.append(request | {"expected": {"decision": decision, "rule": rule}})
    return people, registry, requests


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("-o", "--out", type=Path, default=Path(__file__).resolve().parent)
    args = parser.parse_args(argv)
    people, registry, requests = generate(args.seed, args.count)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "access_directory.json").write_text(
        json.dumps({"employees": people}, indent=1) + "\n", encoding="utf-8"
    )
    (args.out / "access_registry.json").write_text(
        json.dumps(registry, indent=1) + "\n", encoding="utf-8"
    )
    with (args.out / "access_requests.jsonl").open("w", encoding="utf-8") as out:
        for request in requests:
            out.write(json.dumps(request, separators=(",", ":")) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
