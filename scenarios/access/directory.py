"""The intake agent's tool: the company directory, read from
``scenarios/data/access_directory.json`` (written by ``make_access_requests.py``)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

__all__ = ["DIRECTORY", "lookup_employee"]

DIRECTORY = Path(__file__).resolve().parent.parent / "data" / "access_directory.json"


@functools.cache
def _people() -> dict[str, dict[str, Any]]:
    data = json.loads(DIRECTORY.read_text(encoding="utf-8"))
    return {p["id"]: p for p in data["employees"]}


def lookup_employee(employee_id: str) -> dict[str, Any]:
    """The directory's entry for one employee: name, department, status (active, on_leave
    or terminated), whether they are a contractor, and their manager.

    Args:
        employee_id: The employee's id as the request gives it, e.g. "E017".
    """
    person = _people().get(employee_id)
    if person is None:
        raise LookupError(f"the directory has no employee {employee_id!r}")
    return dict(person)
