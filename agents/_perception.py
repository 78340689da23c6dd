"""Perception: Observer (outside input), Sensor (what is in a message), Monitor (the system)."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field, ImportString

from agents._base import Agent, AgentSettings
from agents._ordinals import InputOrdinals
from bus import BusClosedError, Envelope, Priority

__all__ = [
    "DEFAULT_MAX_LABELS",
    "InputItem",
    "Labels",
    "Monitor",
    "Observer",
    "Sensor",
]

# -- Observer ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InputItem:
    """One piece of outside input, ready to publish.

    ``key`` names the record (its id) and ``label`` is its ground truth, already taken out of
    ``payload``: the Observer files the label under the key for the Learner, and no agent
    downstream sees it. ``malformed`` items are published like the others (on the input's
    malformed topic) but counted apart, so a run says how much of its input was unusable.
    """

    topic: str
    payload: Any
    priority: int = Priority.NORMAL
    key: Any = None
    label: Any = None
    malformed: bool = False


#: Labels a :class:`Labels` keeps before it forgets the oldest.
DEFAULT_MAX_LABELS = 1_000_000


class Labels(Mapping[str, Any]):
    """Ground truth by record key, written by whoever reads the input and read by the Learner.

    One instance is shared by a team's Observer and Learner, so labels that exist only as
    the input is read (a generator's, standard input's) reach the Learner before the outcome
    they score. Keys are strings (``str(key)``), as outcomes carry them. Bounded: past
    ``max_size`` labels the oldest is dropped (counted in ``evicted``) and an outcome for it
    is scored as unlabelled, which an endless generator makes preferable to unbounded growth.
    """

    __slots__ = ("_labels", "evicted", "max_size")

    def __init__(
        self, labels: Mapping[Any, Any] | None = None, *, max_size: int = DEFAULT_MAX_LABELS
    ) -> None:
        if max_size < 1:
            raise ValueError(f"max_size must be at least 1, not {max_size}")
        self._labels: OrderedDict[str, Any] = OrderedDict()
        self.max_size = max_size
        self.evicted = 0
        for key, label in (labels or {}).items():
            self.put(key, label)

    def put(self, key: Any, label: Any) -> None:
        """File ``label`` under ``str(key)``, replacing an earlier label for the same key."""
        k = str(key)
        labels = self._labels
        if k in labels:
            labels.move_to_end(k)
        elif len(labels) >= self.max_size:
            labels.popitem(last=False)
            self.evicted += 1
        labels[k] = label

    def __getitem__(self, key: str) -> Any:
        return self._labels[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._labels)

    def __len__(self) -> int:
        return len(self._labels)

    def __repr__(self) -> str:
        return f"Labels({len(self)} labels, max_size={self.max_size})"


class Observer(Agent):
    """Publishes a team's outside input: every item of its ``source``, at ``rate``.

    The source is any async iterable of :class:`InputItem` (a scenario's ``input:`` section
    builds one: a JSONL file, a generator, standard input); the Observer knows nothing of
    the records' schema, only how fast, how many and for how long (its settings, which a
    scenario fills from ``input``): ``rate`` items per second (0: as fast as the bus takes
    them), at most ``count`` items, for at most ``duration`` seconds. Each item's label goes
    into ``labels`` before the item is published, so the Learner has it by the time the
    outcome arrives. Without a source (a replay, which
    re-publishes the recorded inputs instead) the Observer publishes nothing.

    ``emitted`` and ``malformed`` count what went out; ``error`` holds why the source
    stopped early (a generator that raised, an unreadable file), ``None`` if it ran out.
    """

    role = "observer"

    class Settings(AgentSettings):
        """Filled from the scenario's ``input`` section, not written by hand."""

        count: Annotated[int, Field(gt=0, le=1_000_000_000)] | None = None
        """Stop after this many messages; at most a billion (as the scenario's input)."""
        duration: Annotated[float, Field(gt=0, le=7 * 24 * 3600)] | None = None
        """Stop after this many seconds; at most a week."""
        rate: Annotated[float, Field(ge=0, le=1_000_000)] = 0.0
        """Messages per second, at most a million; 0: as fast as the bus takes them."""

    def __init__(
        self,
        name: str | None = None,
        *,
        source: AsyncIterable[InputItem] | None = None,
        labels: Labels | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(name, **kwargs)
        self.source = source
        self.labels = labels if labels is not None else Labels()
        self.emitted = 0
        self.malformed = 0
        self.error: str | None = None
        #: Numbers the inputs per topic; a resumed run hands it the one that numbered the
        #: recorded inputs, so its own inputs number on from them.
        self.ordinals = InputOrdinals()
        self.done = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._ending = False
        self._publishing = False

    async def start(self) -> None:
        if self.source is not None:
            self._task = asyncio.get_running_loop().create_task(self.ingest())
        else:
            self.done.set()

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self.done.set()

    def end_input(self) -> None:
        """Stop taking input now, between two items (a run's Ctrl-C): the Observer publishes
        nothing more and :attr:`done` is set once its input task has ended, so the run goes
        on to finish what is already in flight. The items left unread are not an error.

        An item being published is published whole first (cancelled halfway, it could reach
        some of its subscribers and not others); a wait for the next item or for the rate's
        next slot is cut short."""
        self._ending = True
        if self._task is None or self._task.done():
            self.done.set()
        elif not self._publishing:
            self._task.cancel()

    async def ingest(self) -> None:
        """Publish the source to its end (or ``count``, or ``duration``); a source that
        fails ends the input with its error in :attr:`error`, not in a lost task."""
        try:
            await self._ingest()
        except asyncio.CancelledError:
            raise
        except BusClosedError:
            # The run is being torn down under it (a second Ctrl-C): not the input's fault,
            # and no traceback to read.
            self.error = "the bus closed before the input ended"
            self.log.warning("input stopped: the bus closed", emitted=self.emitted)
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            self.log.error("input failed", error=self.error, exc_info=True)
        finally:
            self.done.set()

    async def _ingest(self) -> None:
        if self.source is None:
            return
        loop = asyncio.get_running_loop()
        started = loop.time()
        count, duration, rate = self.settings.count, self.settings.duration, self.settings.rate
        items: AsyncIterator[InputItem] = aiter(self.source)
        try:
            n = 0
            # Limits are checked before asking for the next item, never after: a source such
            # as standard input may wait indefinitely for an item the run no longer wants.
            while (count is None or n < count) and not self._ending:
                if duration is None:
                    item = await anext(items, None)
                else:
                    left = started + duration - loop.time()
                    if left <= 0:
                        break
                    try:
                        async with asyncio.timeout(left):
                            item = await anext(items, None)
                    except TimeoutError:
                        break
                if item is None:
                    break
                if rate > 0:
                    delay = started + n / rate - loop.time()
                    if delay > 0:
                        await asyncio.sleep(delay)
                self._publishing = True
                try:
                    await self.observe(item)
                finally:
                    self._publishing = False
                n += 1
        finally:
            close = getattr(items, "aclose", None)
            if close is not None:
                await close()

    async def observe(self, item: InputItem) -> Envelope:
        """File the item's label, then publish it (counted as emitted or malformed) under
        an id that carries its number among this Observer's inputs on its topic
        (:attr:`ordinals`): what a ``messages`` fault window reads, in any process."""
        if item.label is not None and item.key is not None:
            self.labels.put(item.key, item.label)
        if item.malformed:
            self.malformed += 1
        else:
            self.emitted += 1
        id_ = self.ordinals.stamp(item.topic)
        return await self._bus().emit(item.topic, item.payload, item.priority, id=id_)


# -- Sensor ------------------------------------------------------------------------------------


class Sensor(Agent):
    """Extracts what the rest of the team needs from each raw input, once, so no agent after
    it parses the same text again.

    What to extract is the team's: ``extract`` (setting, ``"module:function"``) takes the
    payload and returns its features (plain data); the support desk's is
    ``support.emails:extract_features`` (order ids, amounts, personal data, attachments).
    Without one the features are empty. Each input is published on
    ``sensor.email.enriched`` as ``{"email": payload, "features": ...}``.
    """

    role = "sensor"
    subscriptions = ("observation.email.received",)

    class Settings(AgentSettings):
        extract: ImportString[Callable[[Any], Mapping[str, Any]]] | None = None
        """``"module:function"`` computing a payload's features; none: no features."""

    settings: Settings

    async def handle(self, env: Envelope) -> None:
        payload = env.payload
        extract = self.settings.extract
        features = {} if extract is None else dict(extract(payload))
        await self.emit("sensor.email.enriched", {"email": payload, "features": features})


# -- Monitor -----------------------------------------------------------------------------------


class Monitor(Agent):
    """Watches the bus itself: breaker changes, queue depth and dead letters; raises alerts.

    Breaker events arrive as ``system.breaker.<name>`` messages and are answered per message,
    as is ``system.budget`` (a budget scope is spent: alert ``budget_spent``).
    Depth and DLQ growth are sampled every ``interval`` seconds (setting, default 0.5) from
    ``bus.stats()``; a sampled alert is an outside message (no handling caused it), so a
    replay re-publishes it from the recording instead of sampling the replaying machine,
    without counting it among the run's inputs (the Observer's).

    It watches the team, not only its own bus: in a multi-process run the dead letters of
    the team's other processes come in through :attr:`dead_letters_elsewhere`, which the
    process hosting it sets (:mod:`pantheon.runner._team_dead_letters`), so it alerts on a
    payer's failures on another node as it would in one process.
    """

    role = "monitor"
    subscriptions = ("system.>",)

    class Settings(AgentSettings):
        interval: Annotated[float, Field(gt=0, le=3600)] = 0.5
        """Seconds between samples of the bus's queue depths and dead letters: above 0, at
        most an hour."""
        queue_alert_ratio: Annotated[float, Field(gt=0, le=1)] = 0.8
        """A mailbox this full raises a ``queue_depth`` alert."""

    def __init__(self, name: str | None = None, *, sample: bool = True, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.alerts: list[dict[str, Any]] = []
        self._sample = sample
        self._task: asyncio.Task[None] | None = None
        self._last_dlq = 0
        self._hot: set[str] = set()
        #: Dead letters the team's other processes hold, as this process last heard (None:
        #: its bus is the whole team). Read at every sample, so it must not block.
        self.dead_letters_elsewhere: Callable[[], int] | None = None

    async def handle(self, env: Envelope) -> None:
        payload = env.payload
        if env.topic == "system.budget" and isinstance(payload, dict):
            await self._alert(
                "budget_spent",
                f"budget {payload.get('scope')} spent: model calls of it are refused",
                Priority.HIGH,
                scope=payload.get("scope"),
            )
            return
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
        dead letters since the last sample (the team's, :attr:`dead_letters_elsewhere`
        included)."""
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
        elsewhere = self.dead_letters_elsewhere
        dlq = stats.dlq_size + (0 if elsewhere is None else elsewhere())
        if dlq > self._last_dlq:
            await self._alert(
                "dead_letters",
                f"{dlq - self._last_dlq} new dead letter(s), {dlq} in all",
                Priority.NORMAL,
                dlq_size=dlq,
            )
        self._last_dlq = dlq
