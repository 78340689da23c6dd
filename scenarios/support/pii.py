"""The support desk's personal-data rules: what counts as PII in an email or a reply, and
how a reply is cleaned of it before it goes out.

The built-in Guardian knows nothing of what personal data looks like: the support scenario
gives it :func:`scrub` (its ``pii`` setting), and the Sensor reports :func:`find_pii`'s
spans among an email's features.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["find_pii", "redact", "scrub"]

_EMAIL = re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b")
_CARD = re.compile(r"\b(?:\d[ -]?){12,18}\d\b")
_IBAN = re.compile(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?\b")
# Not inside a longer run of digit groups (a card that failed Luhn is not a phone).
_PHONE = re.compile(
    r"(?<![\w-])(?<!\d )\+?\(?\d{1,4}\)?[ .-]?\d{3,4}[ .-]?\d{3,4}(?:[ .-]?\d{2,4})?(?![ .-]?\d)"
)


def _luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def find_pii(text: str) -> list[dict[str, Any]]:
    """Spans of personal data: card numbers (Luhn-checked), IBANs, email addresses, phones.

    Earlier kinds win overlaps, so a card number is not also reported as a phone."""
    spans: list[dict[str, Any]] = []

    def free(start: int, end: int) -> bool:
        return all(end <= s["start"] or start >= s["end"] for s in spans)

    for m in _CARD.finditer(text):
        digits = re.sub(r"\D", "", m.group())
        if 13 <= len(digits) <= 19 and _luhn(digits):
            spans.append({"kind": "card", "start": m.start(), "end": m.end()})
    for kind, pattern in (("iban", _IBAN), ("email", _EMAIL), ("phone", _PHONE)):
        if pattern is _EMAIL and "@" not in text:
            continue  # a substring test in C skips a regex scan of the whole body
        for m in pattern.finditer(text):
            if kind == "phone" and not 7 <= sum(c.isdigit() for c in m.group()) <= 15:
                continue  # E.164 numbers have at most 15 digits; longer runs are not phones
            if free(m.start(), m.end()):
                spans.append({"kind": kind, "start": m.start(), "end": m.end()})
    spans.sort(key=lambda s: s["start"])
    return spans


def redact(text: str, spans: list[dict[str, Any]]) -> str:
    """Replace each span with ``[REDACTED <kind>]``, right to left so offsets stay valid."""
    for span in sorted(spans, key=lambda s: s["start"], reverse=True):
        text = f"{text[: span['start']]}[REDACTED {span['kind']}]{text[span['end'] :]}"
    return text


def scrub(text: str) -> tuple[str, list[str]]:
    """``text`` with every span :func:`find_pii` finds redacted, and the kinds it found
    (sorted, once each): the Guardian's ``pii`` setting."""
    spans = find_pii(text)
    if not spans:
        return text, []
    return redact(text, spans), sorted({s["kind"] for s in spans})
