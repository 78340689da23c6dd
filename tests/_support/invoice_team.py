"""An invoice team written into a test's folder, recorded once with an incident: a Checker
that the incident makes flaky, an Approver that asks a person above a limit, a Payer whose
bank refuses large sums when told to. Its dead letters are what a redrive (``pantheon dlq
redrive``, the monitor's ``r``) delivers again through a team that asks for approval."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from cli_run import pantheon

from pantheon.sessions import ApprovalBook, SessionStore, StoredDeadLetter

__all__ = ["AMOUNTS", "PERSON", "SCRIPTED", "person_run", "recorded_run", "write_team"]

#: Invoices: even ones small, odd ones over the Approver's limit (1,000).
AMOUNTS = [400.0 + 10 * i if i % 2 == 0 else 5_000.0 + 100 * i for i in range(40)]

AGENTS = '''
"""An invoice team: checked, approved (a person above the limit), paid."""

from __future__ import annotations

from agents import Agent, AgentSettings


class Checker(Agent):
    async def handle(self, env):
        await self.emit("invoice.checked", dict(env.payload))


class Approver(Agent):
    class Settings(AgentSettings):
        limit: float = 1_000.0

    async def handle(self, env):
        inv = env.payload
        approved = True
        if inv["amount"] > self.settings.limit:
            summary = f"pay {inv['amount']:.2f} EUR ({inv['id']})"
            answer = await self.approve({"summary": summary, "invoice_id": inv["id"]})
            approved = answer.approved
        await self.emit("invoice.decided", {**inv, "approved": approved})


class Payer(Agent):
    class Settings(AgentSettings):
        bank_limit: float = 1e12

    async def handle(self, env):
        inv = env.payload
        if inv["approved"] and inv["amount"] > self.settings.bank_limit:
            raise RuntimeError(f"the bank refuses {inv['amount']:.2f} EUR for {inv['id']}")
        await self.emit("invoice.paid", {"invoice_id": inv["id"]})
'''

SCENARIO = """\
version: 1
name: invoices
seed: 3
approvals: {approvals}
input: {{kind: jsonl, path: invoices.jsonl, topic: invoice.received}}
agents:
  checker:
    class: "redrive_invoices:Checker"
    subscribe: [invoice.received]
    retry: {{attempts: 1}}
  approver:
    class: "redrive_invoices:Approver"
    subscribe: [invoice.checked]
    concurrency: 8
  payer:
    class: "redrive_invoices:Payer"
    subscribe: [invoice.decided]
    retry: {{attempts: 1}}
    breaker: {{consecutive_failures: 1000, min_calls: 1000, window: 1000}}
    settings: {{bank_limit: {bank_limit}}}
faults:
  agents:
    checker: {{failure_rate: 0.3, until: {{messages: 30}}}}
"""

#: A request waits two minutes for a person, then is rejected: nobody is scripted.
PERSON = "{timeout: 120, default: reject, poll: 0.05}"

#: The scripted person approves every request a fifth of a second after it is asked.
SCRIPTED = "{timeout: 60, default: reject, poll: 0.05, auto: {approve_after: 0.2, note: scripted}}"


def write_team(folder: Path, *, approvals: str = SCRIPTED, bank_limit: float = 1e12) -> Path:
    """The team's folder (agents module, invoices, scenario); returns the scenario's path."""
    (folder / "redrive_invoices.py").write_text(textwrap.dedent(AGENTS).lstrip())
    lines = [json.dumps({"id": f"INV-{i:02d}", "amount": a}) for i, a in enumerate(AMOUNTS)]
    (folder / "invoices.jsonl").write_text("\n".join(lines) + "\n")
    path = folder / "invoices.yaml"
    path.write_text(SCENARIO.format(approvals=approvals, bank_limit=bank_limit))
    return path


def recorded_run(tmp_path: Path, **team: object) -> tuple[Path, str, list[StoredDeadLetter]]:
    """A recorded run of the team: the store, the session and its dead letters."""
    scenario = write_team(tmp_path, **team)  # type: ignore[arg-type]
    store = tmp_path / "s.db"
    done = pantheon("run", str(scenario), "--store", str(store), "--json", cwd=tmp_path)
    # The scenario expects nothing of its own, and dead letters are not lost ones.
    assert done.returncode == 0, done.stderr
    with SessionStore(store, create=False) as st:
        sid = st.sessions()[0].id
        return store, sid, st.dead_letters(sid)


def person_run(folder: Path, *, bank_limit: float = 6_000) -> tuple[Path, str]:
    """A recorded run of the team whose requests wait for a person (:data:`PERSON`), a
    person in this process approving each as it comes ("clerk"); its bank refuses
    ``bank_limit`` EUR and more. Its redrive asks a person again, and waits two minutes
    for one: (the store, the session)."""
    scenario = write_team(folder, approvals=PERSON, bank_limit=bank_limit)
    store = folder / "s.db"
    run = subprocess.Popen(
        [sys.executable, "-m", "pantheon.cli", "run", str(scenario), "--store", str(store)],
        cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    try:
        while run.poll() is None:
            assert time.monotonic() < deadline, "the run did not finish"
            if store.exists():
                with SessionStore(store, create=False) as st:
                    book = ApprovalBook(st)
                    for s in st.sessions():
                        for a in book.entries(book.origin(s.id), status="pending"):
                            book.decide(a.origin, a.id, approved=True, by="clerk")
            time.sleep(0.05)
        out, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode == 0, out + err
    with SessionStore(store, create=False) as st:
        return store, st.sessions()[0].id
