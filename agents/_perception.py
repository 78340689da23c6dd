"""Perception: Observer (outside input), Sensor (what is in a message), Monitor (the system)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from agents._base import Agent, AgentSettings
from bus import Envelope, Priority

__all__ = ["Monitor", "Observer", "Sensor", "extract_features", "find_pii", "read_emails"]

_REQUIRED = ("id", "from", "subject", "body")


def read_emails(path: Path) -> Iterator[dict[str, Any]]:
    """Every line of a JSONL inbox as a record; a line that is not a JSON object becomes
    ``{"_line": n, "_error": ..., "_raw": ...}`` so the Observer can report it, not crash."""
    with path.open(encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                yield {"_line": n, "_error": f"not JSON: {exc.msg}", "_raw": line[:200]}
                continue
            if not isinstance(record, dict):
                yield {"_line": n, "_error": "not a JSON object", "_raw": line[:200]}
                continue
            record["_line"] = n
            yield record


def _malformed_reason(record: dict[str, Any]) -> str | None:
    if "_error" in record:
        return str(record["_error"])
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
    control = sum(1 for ch in body if ord(ch) < 32 and ch not in "\t\n\r")
    if control > max(2, len(body) // 20):
        return f"body is binary garbage ({control} control characters)"
    received = record.get("received_at")
    if received is not None:
        try:
            datetime.fromisoformat(str(received).replace("Z", "+00:00"))
        except ValueError:
            return f"received_at {received!r} is not an ISO-8601 time"
    return None


class Observer(Agent):
    """Reads the scenario's inbox and turns each email into an outside observation.

    Settings: ``path`` (JSONL inbox), ``count`` (stop after n), ``duration`` (seconds),
    ``rate`` (emails/s, 0 = as fast as the bus takes them). The ``expected`` labels in the
    data are stripped here: no agent downstream may see the answer.
    """

    role = "observer"

    class Settings(AgentSettings):
        """Filled from the scenario's ``input`` section, not written by hand."""

        path: str | None = None
        count: Annotated[int, Field(gt=0)] | None = None
        duration: Annotated[float, Field(gt=0)] | None = None
        rate: Annotated[float, Field(ge=0)] = 0.0

    def __init__(self, name: str | None = None, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.emitted = 0
        self.malformed = 0
        self.done = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self.settings.path:
            self._task = asyncio.get_running_loop().create_task(self.ingest())
        else:
            self.done.set()

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self.done.set()

    async def ingest(self) -> None:
        try:
            await self._ingest()
        finally:
            self.done.set()

    async def _ingest(self) -> None:
        path = Path(self.settings.path)
        count = self.settings.count
        duration = self.settings.duration
        rate = self.settings.rate
        loop = asyncio.get_running_loop()
        started = loop.time()
        for n, record in enumerate(read_emails(path)):
            if count is not None and n >= count:
                break
            if duration is not None and loop.time() - started >= duration:
                break
            if rate > 0:
                delay = started + n / rate - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
            await self.observe(record)

    async def observe(self, record: dict[str, Any]) -> Envelope:
        """Publish one inbox record as ``observation.email.received`` or ``.malformed``."""
        reason = _malformed_reason(record)
        if reason is not None:
            self.malformed += 1
            return await self.emit(
                "observation.email.malformed",
                {
                    "email_id": record.get("id") if isinstance(record.get("id"), str) else None,
                    "line": record.get("_line"),
                    "reason": reason,
                },
            )
        email = {k: v for k, v in record.items() if k != "expected" and not k.startswith("_")}
        email.setdefault("attachments", [])
        self.emitted += 1
        return await self.emit("observation.email.received", email)


# -- Sensor ------------------------------------------------------------------------------------

_ORDER = re.compile(r"\bORD-\d{4,}\b")
_AMOUNT = re.compile(
    r"(?:[$€£]\s?(\d{1,3}(?:,\d{3})*(?:\.\d{1,2})?|\d+(?:\.\d{1,2})?))"
    r"|(?:\b(\d{1,3}(?:,\d{3})*(?:\.\d{1,2})?|\d+(?:\.\d{1,2})?)\s?(?:USD|EUR|GBP|dollars|euros)\b)"
)
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
        for m in pattern.finditer(text):
            if kind == "phone" and not 7 <= sum(c.isdigit() for c in m.group()) <= 15:
                continue  # E.164 numbers have at most 15 digits; longer runs are not phones
            if free(m.start(), m.end()):
                spans.append({"kind": kind, "start": m.start(), "end": m.end()})
    spans.sort(key=lambda s: s["start"])
    return spans


def extract_features(email: dict[str, Any]) -> dict[str, Any]:
    """Order ids, money amounts, PII spans and attachment facts of one email."""
    text = f"{email.get('subject', '')}\n{email.get('body', '')}"
    amounts = []
    for m in _AMOUNT.finditer(text):
        raw = m.group(1) or m.group(2)
        amounts.append(float(raw.replace(",", "")))
    attachments = email.get("attachments") or []
    names = [str(a.get("name", "")) for a in attachments if isinstance(a, dict)]
    return {
        "order_ids": sorted(set(_ORDER.findall(text))),
        "amounts": amounts,
        "amount": max(amounts) if amounts else None,
        "pii": find_pii(str(email.get("body", ""))),
        "attachments": names,
        "has_invoice": any("invoice" in n.lower() or "receipt" in n.lower() for n in names),
        "follow_up": bool(email.get("thread")),
    }


class Sensor(Agent):
    """Extracts what the Reasoner and Guardian need from the raw email."""

    role = "sensor"
    subscriptions = ("observation.email.received",)

    async def handle(self, env: Envelope) -> None:
        email = env.payload
        await self.emit(
            "sensor.email.enriched", {"email": email, "features": extract_features(email)}
        )


# -- Monitor -----------------------------------------------------------------------------------


class Monitor(Agent):
    """Watches the bus itself: breaker changes, queue depth and dead letters; raises alerts.

    Breaker events arrive as ``system.breaker.*`` messages and are answered per message.
    Depth and DLQ growth are sampled every ``interval`` seconds (setting, default 0.5) from
    ``bus.stats()``; a sampled alert is outside input, so a replay re-publishes it from the
    recording instead of sampling the replaying machine.
    """

    role = "monitor"
    subscriptions = ("system.*",)

    class Settings(AgentSettings):
        interval: Annotated[float, Field(gt=0)] = 0.5
        """Seconds between samples of the bus's queue depths and dead letters."""
        queue_alert_ratio: Annotated[float, Field(gt=0, le=1)] = 0.8
        """A mailbox this full raises a ``queue_depth`` alert."""

    def __init__(self, name: str | None = None, *, sample: bool = True, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.alerts: list[dict[str, Any]] = []
        self._sample = sample
        self._task: asyncio.Task[None] | None = None
        self._last_dlq = 0
        self._hot: set[str] = set()

    async def handle(self, env: Envelope) -> None:
        payload = env.payload
        if not env.topic.startswith("system.breaker.") or not isinstance(payload, dict):
            return
        if payload.get("to") == "open":
            await self._alert(
                "breaker_open",
                f"breaker {payload.get('breaker')} opened: {payload.get('reason')}",
                Priority.CRITICAL,
                breaker=payload.get("breaker"),
            )
        elif payload.get("to") == "closed" and payload.get("from") != "closed":
            await self._alert(
                "breaker_closed",
                f"breaker {payload.get('breaker')} closed again",
                Priority.HIGH,
                breaker=payload.get("breaker"),
            )

    async def _alert(self, kind: str, message: str, priority: int, **fields: Any) -> None:
        alert = {"kind": kind, "message": message, **fields}
        self.alerts.append(alert)
        await self.emit(f"monitor.alert.{kind}", alert, priority)

    async def start(self) -> None:
        if self._sample:
            self._task = asyncio.get_running_loop().create_task(self._watch())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _watch(self) -> None:
        interval = self.settings.interval
        depth_ratio = self.settings.queue_alert_ratio
        while True:
            await asyncio.sleep(interval)
            await self.check(depth_ratio)

    async def check(self, depth_ratio: float = 0.8) -> None:
        """One sample of the bus: alert on mailboxes past ``depth_ratio`` full, and on new
        dead letters since the last sample."""
        stats = self._bus().stats()
        for name, sub in stats.subscribers.items():
            full = sub.queued >= depth_ratio * sub.max_queue
            if full and name not in self._hot:
                self._hot.add(name)
                await self._alert(
                    "queue_depth",
                    f"{name} mailbox at {sub.queued}/{sub.max_queue}",
                    Priority.HIGH,
                    subscriber=name,
                    queued=sub.queued,
                )
            elif not full:
                self._hot.discard(name)
        if stats.dlq_size > self._last_dlq:
            await self._alert(
                "dead_letters",
                f"{stats.dlq_size - self._last_dlq} new dead letter(s), {stats.dlq_size} in all",
                Priority.NORMAL,
                dlq_size=stats.dlq_size,
            )
        self._last_dlq = stats.dlq_size
