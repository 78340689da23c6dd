"""The support desk's own email code (scenarios/support/): the features the Sensor is given
and the personal-data rules the Guardian is given."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import extract_features, find_pii

from pantheon.testing import read_jsonl

ROOT = Path(__file__).resolve().parents[2]


# -- features ------------------------------------------------------------------------------------


def test_sensor_finds_orders_amounts_and_pii() -> None:
    email = {
        "subject": "Refund ORD-123456",
        "body": "Please refund $349.99 to card 4111 1111 1111 1111, call +1 415 555 0100, "
        "or write to jane.doe@mail.example. IBAN DE89 3704 0044 0532 0130 00.",
        "attachments": [{"name": "invoice-88.pdf"}],
    }
    f = extract_features(email)
    assert f["order_ids"] == ["ORD-123456"]
    assert f["amount"] == 349.99
    kinds = [s["kind"] for s in f["pii"]]
    assert kinds == ["card", "phone", "email", "iban"]
    assert f["has_invoice"] is True


@pytest.mark.parametrize(
    ("text", "amounts"),
    [
        ("Refund 42 euros please", [42.0]),
        ("it was £5.50", [5.5]),
        ("charged 1,200 USD twice", [1200.0]),
        ("€ 30 and 12 GBP", [30.0, 12.0]),
        ("no money here, just 300 items", []),
    ],
)
def test_amounts_are_found_in_every_currency_spelling(text: str, amounts: list[float]) -> None:
    """extract_features skips the amount scan when no currency sign or word occurs: every
    spelling the pattern knows must still be seen."""
    assert extract_features({"subject": "", "body": text})["amounts"] == amounts


def test_the_sensors_prefilters_change_no_feature_of_the_shipped_inbox() -> None:
    """The substring tests in front of the amount, order-id and email scans only skip scans
    that would find nothing: every shipped email gets what the plain scans give."""
    from support.emails import _AMOUNT, _ORDER
    from support.pii import _EMAIL

    inbox = ROOT / "scenarios" / "data" / "support_emails.jsonl"
    # The inbox carries malformed lines on purpose: they have no record.
    emails = [email for _, email, _ in read_jsonl(inbox) if email is not None]
    assert len(emails) > 500
    for email in emails:
        text = f"{email.get('subject', '')}\n{email.get('body', '')}"
        body = str(email.get("body", ""))
        got = extract_features(email)
        assert got["order_ids"] == sorted(set(_ORDER.findall(text)))
        assert got["amounts"] == [
            float((m.group(1) or m.group(2)).replace(",", "")) for m in _AMOUNT.finditer(text)
        ]
        emails_found = [(s["start"], s["end"]) for s in got["pii"] if s["kind"] == "email"]
        assert emails_found == [m.span() for m in _EMAIL.finditer(body)]


def test_pii_ignores_numbers_that_fail_luhn_and_order_ids() -> None:
    assert find_pii("order ORD-123456, ref 4111 1111 1111 1112") == []
