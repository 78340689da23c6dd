"""``pantheon diff`` calls a difference timing-dependent (exit 0) only where an effect gave
another answer to the same request: what other messages had got there first. Where the team
asked something else (a what-if's change, a run with other settings) the runs diverged, and
a CI gate on ``pantheon diff`` must fail (QA: a what-if that changed a model agent's
instructions turned two decisions and was called "timing-dependent", exit 0).

A pricing team, not the support desk: the Pricer asks ``tool.price`` for the item at its
markup (a named function: the request has a digest) or through a closure (no digest), and
stamps each quote with ``tool.stamp``, asked with and answering from a counter outside the
team, as the Reasoner asks with the thresholds the Learner had moved by then."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

from cli_run import pantheon

AGENTS = """
from pathlib import Path

from agents import Agent, AgentSettings

COUNTER = Path(__file__).with_name("stamps.txt")


def price(item, markup):
    return round(item["base"] * markup, 2)


def ticks():
    return int(COUNTER.read_text()) if COUNTER.exists() else 0


def stamp(seen):
    n = ticks()
    COUNTER.write_text(str(n + 1))
    return [seen, n]


class Pricer(Agent):
    class Settings(AgentSettings):
        markup: float = 1.0
        closure: bool = False

    async def handle(self, env):
        item = env.payload
        if self.settings.closure:
            m = self.settings.markup
            total = await self.effect("tool.price", lambda: round(item["base"] * m, 2))
        else:
            total = await self.effect("tool.price", price, item, self.settings.markup)
        # Asked with what the agent saw outside: another request in another run.
        n = await self.effect("tool.stamp", stamp, ticks())
        await self.emit("quote.priced", {"id": item["id"], "total": total, "stamp": n})
"""

SCENARIO = """\
version: 1
name: pricing
input: {{kind: jsonl, path: items.jsonl, topic: item.received}}
agents:
  pricer:
    class: "pricing:Pricer"
    subscribe: [item.received]
    settings: {{markup: {markup}, closure: {closure}}}
"""


def _team(folder: Path) -> None:
    (folder / "pricing.py").write_text(textwrap.dedent(AGENTS).lstrip())
    items = [json.dumps({"id": f"IT-{i}", "base": 10.0 + i}) for i in range(6)]
    (folder / "items.jsonl").write_text("\n".join(items) + "\n")
    for name, markup, closure in (
        ("plain", 1.0, "false"),
        ("dearer", 2.0, "false"),
        ("closure", 1.0, "true"),
        ("closure_dearer", 2.0, "true"),
    ):
        text = SCENARIO.format(markup=markup, closure=closure)
        (folder / f"{name}.yaml").write_text(text)
    (folder / "dearer_overlay.yaml").write_text(
        "agents:\n  pricer:\n    settings:\n      markup: 2.0\n"
    )


def _run(folder: Path, *args: str) -> dict[str, Any]:
    proc = pantheon(*args, "--store", "s.db", "--json", cwd=folder)
    assert proc.stdout.strip(), f"exit {proc.returncode}: {proc.stderr}"
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def _diff(folder: Path, a: str, b: str) -> tuple[int, dict[str, Any]]:
    proc = pantheon("diff", a, b, "--store", "s.db", "--json", cwd=folder)
    return proc.returncode, json.loads(proc.stdout)


def test_only_another_answer_to_the_same_request_is_timing(tmp_path: Path) -> None:
    _team(tmp_path)
    a = _run(tmp_path, "run", "plain.yaml")["session_id"]

    # The same team again: every stamp asked and answered otherwise (the counter went on),
    # by an agent configured the same. That is timing, and only that.
    again = _run(tmp_path, "run", "plain.yaml")["session_id"]
    code, diff = _diff(tmp_path, a, again)
    assert (code, diff["timing_only"], diff["timing_effects"]) == (0, True, ["tool.stamp"])
    assert diff["differences"] == 6

    # Other settings, run on their own: tool.price was asked for another markup. Not timing.
    dearer = _run(tmp_path, "run", "dearer.yaml")["session_id"]
    code, diff = _diff(tmp_path, a, dearer)
    assert (code, diff["identical"], diff["timing_only"], diff["timing_effects"]) == (
        1,
        False,
        False,
        [],
    )
    # The first difference names its item by the team's key, not only by message ids.
    assert diff["divergence"]["item"] == "IT-0", diff["divergence"]
    text = pantheon("diff", a, dearer, "--store", "s.db", cwd=tmp_path)
    assert text.returncode == 1 and "runs diverged:" in text.stdout, text.stdout
    assert "on 'quote.priced' for item 'IT-0' from agent 'pricer'" in text.stdout, text.stdout
    assert "timing-dependent" not in text.stdout

    # A what-if of the same change: the prices asked live for the new markup (and the
    # stamps, asked with the counter as it is now). Every difference is the change's.
    whatif = _run(tmp_path, "replay", a, "--with", "dearer_overlay.yaml")
    assert whatif["called_by_name"] == {"tool.price": 6, "tool.stamp": 6}, whatif
    code, diff = _diff(tmp_path, a, whatif["new_session_id"])
    assert (code, diff["timing_only"], diff["differences"]) == (1, False, 6)
    # ... either way round.
    code, diff = _diff(tmp_path, whatif["new_session_id"], a)
    assert (code, diff["timing_only"]) == (1, False)


def test_a_call_with_no_digest_by_an_agent_configured_otherwise_diverges_too(
    tmp_path: Path,
) -> None:
    """A closure's request has no digest: nothing shows it asked the same. Run on its own
    with other settings, or re-run as a what-if of them, its other answer is the change's,
    not timing's."""
    _team(tmp_path)
    a = _run(tmp_path, "run", "closure.yaml")["session_id"]
    whatif = _run(tmp_path, "replay", a, "--with", "dearer_overlay.yaml")
    code, diff = _diff(tmp_path, a, whatif["new_session_id"])
    assert (code, diff["timing_only"], diff["timing_effects"]) == (1, False, [])
    assert diff["differences"] >= 6
    dearer = _run(tmp_path, "run", "closure_dearer.yaml")["session_id"]
    code, diff = _diff(tmp_path, a, dearer)
    assert (code, diff["timing_only"], diff["timing_effects"]) == (1, False, [])


def test_a_replay_with_live_effects_differs_by_timing_only(tmp_path: Path) -> None:
    """``--live-effects`` calls every effect for real: a stamp answered otherwise there is
    what got there first, as between two runs, though the replay re-ran the session."""
    _team(tmp_path)
    a = _run(tmp_path, "run", "plain.yaml")["session_id"]
    live = _run(tmp_path, "replay", a, "--live-effects")
    code, diff = _diff(tmp_path, a, live["new_session_id"])
    assert (code, diff["timing_only"], diff["timing_effects"]) == (0, True, ["tool.stamp"])
