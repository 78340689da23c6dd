"""The support desk's email code is its own team package, ``scenarios/support/``: ``agents``
neither exports nor imports it, and the support scenarios give it to the built-in roles."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from public_api import private_imports

import agents
from pantheon.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "scenarios"
TEAM = SCENARIOS / "support"
#: What agents exported for the support desk before the team had its own package.
MOVED = {
    "classify",
    "INTENTS",
    "read_emails",
    "email_problem",
    "find_pii",
    "extract_features",
    "redact",
    "ACTION_FOR_INTENT",
}
SUPPORT_SCENARIOS = sorted(
    p
    for p in SCENARIOS.glob("*.yaml")
    if "observation.email.received" in p.read_text(encoding="utf-8")
)


def test_agents_exports_none_of_the_support_desk_s_helpers() -> None:
    assert not MOVED & set(agents.__all__)
    assert not [name for name in MOVED if hasattr(agents, name)]
    import support

    # They live on in the team's package, all but the inbox reader: reading a JSONL input
    # is the run's, and a test reads it with the run's own, pantheon.testing.read_jsonl.
    assert set(support.__all__) >= MOVED - {"read_emails"}
    assert not hasattr(support, "read_emails")


def test_no_agents_module_imports_a_team_package() -> None:
    imported = []
    for path in sorted((ROOT / "agents").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            imported += [
                f"{path.name}: {n}" for n in names if n.split(".")[0] in ("support", "oncall")
            ]
    assert imported == []


def test_importing_all_of_agents_loads_no_team_module() -> None:
    # In a fresh interpreter that *could* import the teams (their folder on the path), as a
    # run of a support scenario has it: importing every agents module loads none of them.
    code = (
        "import importlib, json, pkgutil, sys\n"
        f"sys.path.insert(0, {str(SCENARIOS)!r})\n"
        "import agents\n"
        "for m in pkgutil.walk_packages(agents.__path__, 'agents.'):\n"
        "    importlib.import_module(m.name)\n"
        "print(json.dumps(sorted(n for n in sys.modules if n.split('.')[0] in "
        "('support', 'oncall'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert json.loads(out.stdout) == []


def test_the_team_is_a_package_on_the_public_api() -> None:
    modules = sorted(TEAM.glob("*.py"))
    assert {"__init__.py", "emails.py", "intents.py", "pii.py"} <= {p.name for p in modules}
    for path in modules:
        assert private_imports(path.read_text(encoding="utf-8")) == [], path.name


def test_every_support_scenario_imports_its_email_code_from_the_team() -> None:
    assert {p.name for p in SUPPORT_SCENARIOS} >= {
        "support_email.yaml",
        "support_email_3node.yaml",
        "support_email_nats.yaml",
        "support_email_refunds.yaml",
        "flaky_actor.yaml",
        "flood.yaml",
        "support_gateway.yaml",
    }
    import support

    for path in SUPPORT_SCENARIOS:
        text = path.read_text(encoding="utf-8")
        assert "agents:" + "email_problem" not in text, path.name
        scenario = load_scenario(path)
        assert scenario.input.validator == "support.emails:email_problem", path.name
        agents_cfg = scenario.agents
        assert agents_cfg["sensor"].settings["extract"] == "support.emails:extract_features"
        assert agents_cfg["reasoner"].settings["question"] == "support.intents:classify"
        assert agents_cfg["reasoner"].settings["actions"] == support.ACTION_FOR_INTENT
        assert agents_cfg["guardian"].settings["pii"] == "support.pii:scrub", path.name
        assert tuple(agents_cfg["learner"].settings["intents"]) == support.INTENTS
        assert scenario.provider.intents == support.INTENTS, path.name


def test_a_reasoner_without_the_team_s_question_says_what_it_needs() -> None:
    from agents import Reasoner, RuleProvider

    with pytest.raises(TypeError, match=r"support\.intents:classify"):
        Reasoner(provider=RuleProvider({"question": ["x"]}))
