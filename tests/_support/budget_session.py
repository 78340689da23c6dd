"""A budgeted team for tests: one model call per ticket, a ``budget:`` that stops the run
part way, run for real against the stand-in model server and recorded in a SQLite store."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from pantheon import RunSummary
from pantheon.testing import ModelServer, run_scenario

MODULE = '''\
from agents import Agent
from bus import Envelope


class Asker(Agent):
    """One model call per ticket."""

    subscriptions = ("ticket.received",)

    async def handle(self, env: Envelope) -> None:
        answer = await self.chat([{"role": "user", "content": env.payload["text"]}])
        await self.emit("ticket.answered", {"id": env.payload["id"], "text": answer.content})


class Listener(Agent):
    """Repeats every system.budget event it hears."""

    subscriptions = ("system.budget",)

    async def handle(self, env: Envelope) -> None:
        await self.emit("budget.heard", dict(env.payload))
'''

TICKETS = 20
#: The stand-in server counts words: 3 in the question and 2 in the answer ("sure thing").
PER_CALL = 5
REPLY = "sure thing"


def budget_team(folder: Path) -> Path:
    """The team's module and tickets in ``folder`` (made), which is returned."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "budget_team_mod.py").write_text(MODULE, encoding="utf-8")
    (folder / "tickets.jsonl").write_text(
        "".join(
            json.dumps({"id": f"t{i}", "text": "please help me"}) + "\n" for i in range(TICKETS)
        ),
        encoding="utf-8",
    )
    return folder


def budget_scenario(folder: Path, budget: str, agents: str, name: str = "budgeted") -> Path:
    """A scenario file in ``folder`` with this ``budget:`` and these ``agents:`` (YAML
    bodies, indented by this function)."""
    path = folder / f"{name}.yaml"
    path.write_text(
        textwrap.dedent(
            """\
            version: 1
            name: {name}
            provider: {{kind: openai, base_url: "http://127.0.0.1:1/v1", model: stand-in}}
            prices:
              stand-in: {{input: 1.0, output: 2.0}}
            input:
              kind: jsonl
              path: tickets.jsonl
              topic: ticket.received
            budget:
            {budget}
            agents:
            {agents}
            """
        ).format(
            name=name,
            budget=textwrap.indent(textwrap.dedent(budget), "  "),
            agents=textwrap.indent(textwrap.dedent(agents), "  "),
        ),
        encoding="utf-8",
    )
    return path


def budgeted_run(folder: Path, store: Path, tokens: int = 23) -> RunSummary:
    """A recorded run whose run-wide budget of ``tokens`` stops it part way."""
    path = budget_scenario(
        budget_team(folder), f"run: {{tokens: {tokens}}}", 'asker: {class: "budget_team_mod:Asker"}'
    )
    with ModelServer(reply=REPLY) as server:
        return run_scenario(path, provider=server, store=store)
