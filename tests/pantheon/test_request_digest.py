"""The request digest: equal requests digest alike whatever order their dicts were built
in; what decides an answer (the rules of a rule provider, the server of a model, a tool's
function, an argument) changes it; what has no stable encoding gives none, never a digest
of an address."""

from __future__ import annotations

import functools
import random
import time
from typing import Any

from agents import OpenAIProvider, RateLimit, RateLimiter, RuleProvider, tool
from agents._base import _recorded_chat
from pantheon.sessions._digest import request_digest

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


def paid(order_id: str) -> float:
    """What was paid."""
    return 1.0


def refunded(order_id: str) -> float:
    """What was refunded."""
    return 0.0


def chat(provider: Any, messages: Any = MESSAGES, limiter: Any = None) -> bytes | None:
    return request_digest(_recorded_chat, (provider, messages, {"temperature": 0}, limiter), {})


def test_equal_requests_digest_alike_and_any_difference_shows() -> None:
    a = OpenAIProvider("http://127.0.0.1:1/v1", model="m")
    same = chat(a)
    assert same is not None and len(same) == 16
    reordered = [{"content": m["content"], "role": m["role"]} for m in MESSAGES]
    assert chat(OpenAIProvider("http://127.0.0.1:1/v1", model="m", api_key="k"), reordered) == same
    # The limiter decides when a call goes, not what it asks.
    assert chat(a, limiter=RateLimiter(RateLimit(requests=1))) == same
    assert chat(OpenAIProvider("http://127.0.0.1:1/v1", model="other")) != same
    assert chat(OpenAIProvider("http://127.0.0.1:2/v1", model="m")) != same
    assert chat(a, [*MESSAGES[:1], {"role": "user", "content": "Hi!"}]) != same
    spam = RuleProvider({"spam": ["(?i)unsubscribe"]})
    assert chat(spam) == chat(RuleProvider({"spam": ["(?i)unsubscribe"]})) != same
    assert chat(spam) != chat(RuleProvider({"spam": ["(?i)winner"]}))
    # A tool is its function; an argument is an argument.
    args = ({"order_id": "A-1"},)
    assert request_digest(tool(paid), args, {}) == request_digest(tool(paid), args, {})
    assert request_digest(tool(paid), args, {}) != request_digest(tool(refunded), args, {})
    assert request_digest(tool(paid), args, {}) != request_digest(
        tool(paid), ({"order_id": "A-2"},), {}
    )
    # A function and a string that spells its name are not the same argument.
    assert request_digest(dict, (paid,), {}) != request_digest(dict, (f"{__name__}:paid",), {})
    assert request_digest(time.time, (), {}) == request_digest(time.time, (), {})
    assert request_digest(functools.partial(paid, "A-1"), (), {}) is not None


class Learner:
    """An object whose answers come from its state: no request identity."""

    def observe(self, outcome: dict[str, Any]) -> int:
        return 0


def test_what_has_no_stable_encoding_gives_no_digest() -> None:
    limit = 3
    assert request_digest(lambda: limit, (), {}) is None  # a closure: its cells are inputs
    assert request_digest(lambda: 3, (), {}) is None  # a lambda: which one, by name?
    assert request_digest(Learner().observe, ({"a": 1},), {}) is None
    assert request_digest(random.Random(1).random, (), {}) is None
    assert request_digest(dict, (Learner(),), {}) is None
    assert request_digest(dict, (2**70,), {}) is None  # past msgpack's integers
    assert request_digest(dict, ({1: "a", "b": 2},), {}) is None  # keys that do not sort


def test_what_stands_for_a_lasting_object_is_worked_out_once_and_digests_as_before() -> None:
    """The stand-ins of functions and identity objects are kept (a rules provider's
    identity was most of a model call's digest): the digests are the very ones a cold
    computation gives, an identity is read once per object, and what is made anew at each
    use (a bound method, a partial) is not kept."""
    from pantheon.sessions import _digest

    class Server:
        reads = 0

        def request_identity(self) -> Any:
            Server.reads += 1
            return {"url": "http://model", "model": "m", "tool": paid}

    server = Server()
    calls = [
        (_recorded_chat, (server, MESSAGES, {}, None), {}),
        (paid, ("A-1",), {}),
        (functools.partial(paid, "A-2"), (), {}),
        (time.time, (), {}),
    ]
    _digest._known.clear()
    cold = [request_digest(*c) for c in calls]
    _digest._known.clear()
    first = [request_digest(*c) for c in calls]
    warm = [request_digest(*c) for c in calls]
    assert None not in cold and cold == first == warm
    assert Server.reads == 2  # once per cold start, not per digest
    assert not any(isinstance(obj, functools.partial) for obj, _ in _digest._known.values())


def _named(fn: Any, module: str, qualname: str) -> Any:
    fn.__module__, fn.__qualname__, fn.__name__ = module, qualname, qualname.rpartition(".")[2]
    return fn


class Tariff:
    """A lasting object that says what stands for it."""

    def request_identity(self) -> Any:
        return {"table": "standard"}

    def price(self, n: int) -> int:
        return n


def test_digests_are_the_ones_stored_sessions_hold() -> None:
    """A what-if compares a live call's digest with one a recording stored, maybe a release
    ago: the bytes that are hashed must not drift. These were computed by the first
    implementation (schema 4); a change here breaks every stored session's what-if."""
    here = "tests.pantheon.test_request_digest"

    def fee(order_id: str) -> float:
        """What was paid."""
        return 1.0

    _named(fee, here, "paid")
    _named(Tariff.price, here, "Tariff.price")
    Tariff.__module__ = here
    cases = {
        "994fb00c6271bc2ed3bc6450179c7a39": chat(OpenAIProvider("http://127.0.0.1:1/v1", "m")),
        "c44f3fceb7eb3769af6164a9f604e6d5": request_digest(
            _recorded_chat, (RuleProvider({"spam": ["(?i)unsubscribe"]}), MESSAGES, {}, None), {}
        ),
        "8b4a40d2fb6ae757e3de388334bad0db": request_digest(tool(fee), ({"order_id": "A-1"},), {}),
        "ff1db936082b05a0c73415f36fe87a37": request_digest(time.time, (), {}),
        "0753de7e5f6ae1e4185bdaedfff5ed5f": request_digest(
            functools.partial(fee, "A-1"), (), {"x": [1, 2.5, None]}
        ),
        "68ac8de7a0e8bb097271f55ebea44c64": request_digest(Tariff().price, (3,), {}),
    }
    for pinned, got in cases.items():
        assert got is not None and got.hex() == pinned
    # Asked again (the function's part kept now), the same bytes.
    assert request_digest(Tariff().price, (3,), {}).hex() == "68ac8de7a0e8bb097271f55ebea44c64"
    # And a model call from its kept lead (the provider worked out at the first call).
    spam = RuleProvider({"spam": ["(?i)unsubscribe"]})
    asked = {request_digest(_recorded_chat, (spam, MESSAGES, {}, None), {}) for _ in range(3)}
    assert [d.hex() for d in asked if d] == ["c44f3fceb7eb3769af6164a9f604e6d5"]


def test_a_lasting_lead_is_hashed_once_and_digests_as_a_cold_computation() -> None:
    """A model call's provider (2 KB of a rules provider's patterns) leads every request it
    makes: the hash state after it is kept, and what follows is hashed onto a copy. Each
    digest is still the one the whole request gives cold, whatever follows the lead."""
    from pantheon.sessions import _digest

    spam, other = RuleProvider({"spam": ["(?i)unsubscribe"]}), RuleProvider({"spam": ["x"]})
    asks = [
        (spam, MESSAGES),
        (spam, [{"role": "user", "content": "Win a prize"}]),
        (other, MESSAGES),
        (spam, [*MESSAGES, {"role": "assistant", "content": "Hi"}]),
    ]
    cold = []
    for provider, messages in asks:
        _digest._known.clear()
        _digest._leads.clear()
        cold.append(chat(provider, messages))
    _digest._known.clear()
    _digest._leads.clear()
    first = [chat(p, m) for p, m in asks]  # a provider's first ask works it out
    warm = [chat(p, m) for p, m in asks]  # from then on, from its kept lead
    assert [lead for lead, _ in _digest._leads.values()] == [spam, other]
    assert None not in cold and cold == first == warm
    assert len(set(warm)) == 4
    # A lead with nothing after it, and a lasting object after the lead.
    alone = request_digest(dict, (spam,), {"k": 1})
    both = (spam, tool(paid), {"order_id": "A-1"})
    once = request_digest(dict, both, {})
    _digest._known.clear()
    _digest._leads.clear()
    assert request_digest(dict, both, {}) == once == request_digest(dict, both, {}) is not None
    assert (
        request_digest(dict, (spam,), {"k": 1}) == alone == request_digest(dict, (spam,), {"k": 1})
    )
    assert request_digest(dict, (spam, tool(refunded), {"order_id": "A-1"}), {}) != once


def test_a_method_of_an_object_kept_as_data_is_encoded_anew() -> None:
    """Only a function whose parts last is kept: a method of an object msgspec encodes as
    data (a Struct, a dataclass) answers from that data, which may change between calls."""
    import msgspec

    class Counter(msgspec.Struct):
        n: int = 0

        def read(self) -> int:
            return self.n

    c = Counter()
    before = request_digest(c.read, (), {})
    c.n = 5
    assert before is not None and request_digest(c.read, (), {}) != before
    # An object with no stable encoding stays so, however often its method is asked.
    learner = Learner()
    assert [request_digest(learner.observe, ({"a": i},), {}) for i in range(3)] == [None] * 3
