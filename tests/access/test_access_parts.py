"""The access desk's parts on their own: the shipped data is what its generator writes, the
scripted model decides by the policy its instructions write (and misses what it is said to),
and the registry MCP server, a real stdio process on the SDK, starts afresh from its seed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from access.directory import lookup_employee
from access.model import Facts, decide, policy
from access.registry import Registry

from agents import MCPToolError

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "scenarios" / "data"
SCENARIO = ROOT / "scenarios" / "access_requests.yaml"
CHANGE = ROOT / "scenarios" / "changes" / "admin_to_a_person.yaml"
FILES = ("access_directory.json", "access_registry.json", "access_requests.jsonl")


def _instructions(path: Path) -> str:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    text: str = data["agents"]["reviewer"]["settings"]["instructions"]
    return text


def test_the_shipped_data_is_what_the_generator_writes_for_its_seed(tmp_path: Path) -> None:
    script = DATA / "make_access_requests.py"
    args = ["--seed", "5", "--count", "200", "-o", str(tmp_path)]
    subprocess.run([sys.executable, str(script), *args], check=True, timeout=60)
    for name in FILES:
        assert (tmp_path / name).read_bytes() == (DATA / name).read_bytes(), name


def _facts(**request: object) -> Facts:
    base = {"found": True, "status": "active", "department": "finance", "contractor": False}
    base |= {"request_id": "r-1", "employee": "E001", "resource": "payroll-db"}
    policy_of = {"owners": ["finance"], "restricted": True, "conflicts": []}
    return Facts(base | request, policy_of, {})


def test_the_scripted_model_decides_by_the_policy_its_instructions_write() -> None:
    shipped = policy(_instructions(SCENARIO))
    changed = policy(_instructions(CHANGE))
    assert len(shipped) == len(changed) == 12
    admin = _facts(level="admin", justification="Need admin access to rotate the keys")
    assert decide(shipped, admin)[0] == "deny"
    assert decide(changed, admin) == ("escalate", "Escalate every request for admin access.")
    # Only that sentence differs: every other request is decided alike.
    write = _facts(level="write", justification="Need write access for the migration CHG-1234")
    assert decide(shipped, write) == decide(changed, write) == ("grant", "Grant anything else.")
    # A sentence it cannot read is left out, as a model would skip it.
    assert policy("- Deny requests on Fridays.\n- Grant anything else.")[0].decision == "grant"


def test_the_scripted_models_blind_spots_are_the_documented_ones() -> None:
    rules = policy(_instructions(SCENARIO))
    lower = _facts(level="write", justification="Need write access for the migration chg1234")
    assert decide(rules, lower)[0] == "deny"  # the ticket is there, written otherwise
    vague = _facts(level="read", justification="I just need access to this for my work please")
    assert decide(rules, vague)[0] == "grant"  # long, but no purpose in it
    assert decide(rules, _facts(level="read", justification="on-call"))[0] == "deny"


def test_the_directory_tool_knows_its_people_and_says_whom_it_does_not() -> None:
    assert lookup_employee("E001")["id"] == "E001"
    with pytest.raises(LookupError, match="no employee 'E150'"):
        lookup_employee("E150")


async def test_the_registry_server_records_and_starts_again_from_its_seed() -> None:
    registry = Registry()
    await registry.start()
    try:
        tools = {t.name: t for t in registry.tools()}
        assert sorted(tools) == ["current_grants", "record_decision", "resource_policy"]
        found = await tools["resource_policy"]({"resource": "payments-submit"})
        assert found == {
            "resource": "payments-submit",
            "owners": ["finance"],
            "restricted": True,
            "conflicts": ["payments-approve"],
        }
        with pytest.raises(MCPToolError, match="no resource named 'ml-sandbox'"):
            await tools["resource_policy"]({"resource": "ml-sandbox"})
        before = await tools["current_grants"]({"employee": "E001"})
        decision = {"request_id": "t-1", "employee": "E001", "resource": "siem"}
        recorded = await tools["record_decision"](
            decision | {"level": "read", "decision": "grant", "reason": "test"}
        )
        assert recorded == {"request_id": "t-1", "decision": "grant", "recorded": True}
        after = await tools["current_grants"]({"employee": "E001"})
        assert {"resource": "siem", "level": "read"} in after["grants"]
        assert len(after["grants"]) == len(before["grants"]) + 1
    finally:
        await registry.aclose()
    await registry.start()  # a new server, seeded afresh: the grant is not there
    try:
        [grants] = [t for t in registry.tools() if t.name == "current_grants"]
        assert await grants({"employee": "E001"}) == before
    finally:
        await registry.aclose()
