"""The support desk's inbox: telling an email from a record it cannot act on, and what the
Sensor pulls out of each email.

``scenarios/support_email.yaml`` names these by import path: ``input.validate`` is
``"support.emails:email_problem"``, the Sensor's ``extract`` setting
``"support.emails:extract_features"``. Reading the inbox is the run's (``input: {kind:
jsonl}``); a test that wants it line by line as the run sees it uses
``pantheon.testing.read_jsonl``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from support.pii import find_pii

__all__ = ["email_problem", "extract_features"]

_REQUIRED = ("id", "from", "subject", "body")
#: Control characters other than tab, newline and carriage return (counted in C: a Python
#: loop over every character of every body was a third of the Observer's time).
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f]")


def email_problem(record: Any) -> str | None:
    """Why ``record`` is not an email the support team can act on, or ``None`` if it is.

    The support scenario's ``input.validate`` (``"support.emails:email_problem"``): the Observer
    publishes a record it rejects on the input's malformed topic instead, so the team never
    sees a body that is a dict or a sender that is not an address.
    """
    if not isinstance(record, Mapping):
        return "not a JSON object"
    for key in _REQUIRED:
        if key not in record:
            return f"missing field {key!r}"
        if not isinstance(record[key], str):
            return f"field {key!r} is {type(record[key]).__name__}, not a string"
    if not record["subject"].strip() and not record["body"].strip():
        return "empty subject and body"
    if "@" not in record["from"]:
        return f"sender {record['from']!r} is not an address"
    body = record["body"]
    control = len(_CONTROL.findall(body))
    if control > max(2, len(body) // 20):
        return f"body is binary garbage ({control} control characters)"
    received = record.get("received_at")
    if received is not None:
        try:
            datetime.fromisoformat(str(received).replace("Z", "+00:00"))
        except ValueError:
            return f"received_at {received!r} is not an ISO-8601 time"
    return None


_ORDER = re.compile(r"\bORD-\d{4,}\b")
_AMOUNT = re.compile(
    r"(?:[$€£]\s?(\d{1,3}(?:,\d{3})*(?:\.\d{1,2})?|\d+(?:\.\d{1,2})?))"
    r"|(?:\b(\d{1,3}(?:,\d{3})*(?:\.\d{1,2})?|\d+(?:\.\d{1,2})?)\s?(?:USD|EUR|GBP|dollars|euros)\b)"
)
#: What every match of _AMOUNT contains: a currency sign or a currency word.
_AMOUNT_MARKS = ("$", "€", "£", "USD", "EUR", "GBP", "dollars", "euros")


def extract_features(email: dict[str, Any]) -> dict[str, Any]:
    """Order ids, money amounts, PII spans and attachment facts of one email."""
    text = f"{email.get('subject', '')}\n{email.get('body', '')}"
    amounts = []
    # Each regex scans the whole text; most emails have no amount and no order id, and a
    # substring test (in C) says so for a fraction of a scan: a fifth of the Sensor's cost.
    if any(mark in text for mark in _AMOUNT_MARKS):
        for m in _AMOUNT.finditer(text):
            raw = m.group(1) or m.group(2)
            amounts.append(float(raw.replace(",", "")))
    attachments = email.get("attachments") or []
    names = [str(a.get("name", "")) for a in attachments if isinstance(a, dict)]
    return {
        "order_ids": sorted(set(_ORDER.findall(text))) if "ORD-" in text else [],
        "amounts": amounts,
        "amount": max(amounts) if amounts else None,
        "pii": find_pii(str(email.get("body", ""))),
        "attachments": names,
        "has_invoice": any("invoice" in n.lower() or "receipt" in n.lower() for n in names),
        "follow_up": bool(email.get("thread")),
    }
