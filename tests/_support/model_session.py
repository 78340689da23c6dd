"""A fixture several test folders use: a session really recorded against a model server.

On ``sys.path`` through pytest's ``pythonpath`` (``tests/_support`` holds nothing else); the
fixtures ``model_session`` and ``model_scenario`` are ``tests/conftest.py``'s, which records
the session once per run for every folder and xdist worker.

``model_session`` runs the support team on a few emails with its Reasoner asking
a real local OpenAI-compatible server (:class:`pantheon.testing.ModelServer`), a
``summarizer`` handler asking it again for every action taken, and a price table: so the
session has model calls of two agents, with tokens and cost, recorded by ``pantheon run``
exactly as a user runs it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pantheon.testing import ModelServer, classify_reply

ROOT = Path(__file__).resolve().parents[2]

#: USD per million tokens of the model the server answers as (it echoes the one asked for).
MODEL = "local"
PRICES = {MODEL: {"input": 2.5, "output": 10.0}}

_HANDLER = '''"""A second model-calling agent for the usage tests: a note per action taken."""

import json


async def summarize(env, agent):
    note = json.dumps(env.payload, sort_keys=True, default=str)
    await agent.chat(
        [
            {"role": "system", "content": "Write a one-line note for the ticket log."},
            {"role": "user", "content": note},
        ]
    )
'''


@dataclass(frozen=True)
class ModelSession:
    """A finished session with model usage: where it is stored, what the run printed, and
    the model and prices it ran with."""

    store: Path
    session_id: str
    summary: dict[str, Any]
    scenario: Path
    model: str = MODEL
    prices: dict[str, dict[str, float]] = field(default_factory=lambda: PRICES)


def write_model_scenario(
    folder: Path, base_url: str, *, count: int = 24, rate: float = 0, prices: bool = True
) -> Path:
    """A scenario file in ``folder`` (with the ``summarizer``'s module beside it): the
    support team on ``count`` emails at ``rate`` a second (0: as fast as it goes) asking the
    server at ``base_url``, priced by :data:`PRICES` unless ``prices`` is false."""
    data = yaml.safe_load((ROOT / "scenarios" / "support_email.yaml").read_text())
    data["name"] = "support_model"
    data["path"] = [str(ROOT / "scenarios")]  # the support team's package, from elsewhere
    data["provider"] = {
        "kind": "openai",
        "base_url": base_url,
        "model": MODEL,
        "api_key_env": "",
        "max_retries": 0,
    }
    if prices:
        data["prices"] = PRICES
    data["input"] = {
        "kind": "file",
        "path": str(ROOT / "scenarios" / "data" / "support_emails.jsonl"),
        "count": count,
        "rate": rate,
    }
    data["agents"]["summarizer"] = {
        "handler": "usage_team:summarize",
        "subscribe": ["action.executed"],
    }
    data["expect"] = {"zero_lost": True}  # the keyword "model" is not held to an accuracy
    (folder / "usage_team.py").write_text(_HANDLER)
    path = folder / "support_model.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def record_model_session(folder: Path, *, prices: bool = True, count: int = 24) -> ModelSession:
    """One ``pantheon run --json`` of the model scenario, recorded in ``folder``'s store."""
    store = folder / "sessions.db"
    with ModelServer(classify_reply) as server:
        scenario = write_model_scenario(folder, server.base_url, prices=prices, count=count)
        proc = subprocess.run(
            [
                *(sys.executable, "-m", "pantheon.cli", "run", str(scenario)),
                *("--store", str(store), "--json"),
            ],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(proc.stdout)
    usage = summary["usage"]
    assert set(usage["by_agent"]) == {"reasoner", "summarizer"}, usage
    assert usage["priced"] is prices and usage["output_tokens"] > 0
    assert (usage["cost_usd"] > 0) is prices
    return ModelSession(store, summary["session_id"], summary, scenario)
