"""The scenario schema: immutable pydantic models whose field names are the contract the
runtime codes against (``frozen``, ``extra="forbid"``: a misspelt key is an error, never a
silently ignored setting).

Checks that span sections (an expectation about an agent that does not exist, ``kill_node`` on
the in-process transport) run on the raw data beside field validation, so they are reported
together with the field errors instead of only after those are fixed.
"""

from __future__ import annotations

import inspect
import ipaddress
import json
import os
import re
import typing
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeAlias

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)

import bus
from agents import Actor, Budget, Learner, Observer, OutcomeSpec, RateLimit
from bus import DeadLetterReason, validate_pattern
from pantheon._imports import (
    INPUT_GROUP,
    PROVIDER_GROUP,
    add_import_roots,
    import_path,
    load_object,
)
from pantheon.scenario._agents import agent_class, agent_problems, model_problem
from pantheon.scenario._locate import Expects, dotted, suggest

__all__ = [
    "DEAD_LETTER_REASONS",
    "DRIVER_NODE",
    "ROLES",
    "SCENARIO_VERSION",
    "SUPPORT_INBOX",
    "AgentConfig",
    "AgentFaultConfig",
    "AnthropicProviderConfig",
    "BreakerConfig",
    "BudgetConfig",
    "BudgetLimit",
    "CountBound",
    "CustomProviderConfig",
    "DeadLetterReason",
    "ExpectConfig",
    "FaultMarkConfig",
    "FaultsConfig",
    "FileInputConfig",
    "FloodConfig",
    "GatewayConfig",
    "GeneratorInputConfig",
    "HttpInputConfig",
    "InProcessTransportConfig",
    "InputConfig",
    "JsonlInputConfig",
    "KillNodeConfig",
    "NatsCredentials",
    "NatsTransportConfig",
    "ObservabilityConfig",
    "OpenAIProviderConfig",
    "PolicyConfig",
    "PriceConfig",
    "ProviderConfig",
    "RateLimitConfig",
    "RetryConfig",
    "Role",
    "RulesProviderConfig",
    "Scenario",
    "StdinInputConfig",
    "TransportConfig",
    "ZmqTransportConfig",
]


#: The only scenario schema version this module reads.
SCENARIO_VERSION = 1
#: The node name of the process that runs a ZeroMQ scenario: it hosts every agent that
#: ``transport.nodes`` does not place, so no node may take the name.
DRIVER_NODE = "driver"

Role = Literal[
    "observer",
    "monitor",
    "sensor",
    "reasoner",
    "planner",
    "memory",
    "guardian",
    "actor",
    "learner",
]
#: The nine roles in pipeline order: perception, cognition, action. A scenario's ``agents``
#: always lists all nine (defaults fill the ones the file leaves out), in this order.
ROLES: tuple[Role, ...] = typing.get_args(Role)

_NAME = r"^[a-z0-9_-]+$"
_TOPIC = r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$"

_AgentName = Annotated[str, Field(pattern=_NAME)]
_Topic = Annotated[str, Field(pattern=_TOPIC)]
_PATTERN = r"^[^\s]+$"


def _token_pattern(pattern: str) -> str:
    # The bus's own rule and message (``email*`` -> "use 'email.>'..."), so a scenario fails
    # at load with file:line instead of at subscribe time in the middle of a run.
    validate_pattern(pattern)
    return pattern


#: A subscription pattern: token wildcards, ``*`` one token, ``>`` one or more (``action.>``).
_Pattern = Annotated[str, Field(pattern=_PATTERN), AfterValidator(_token_pattern)]
_PositiveFloat = Annotated[float, Field(gt=0)]
_Fraction = Annotated[float, Field(ge=0, le=1)]

# Upper bounds. Every numeric setting that sizes something (tasks, queues, windows) or waits
# for something has one, named in its docstring: a typo such as `concurrency: 100000000`
# is then a located error here rather than a MemoryError minutes into `pantheon run`, and
# `.inf` is refused with it. The bounds sit far above any real scenario.
_HOUR = 3600.0
_WEEK = 7 * 24 * _HOUR
_Seconds = Annotated[float, Field(ge=0, le=_HOUR)]
"""A wait in seconds: 0 to an hour."""
_Timeout = Annotated[float, Field(gt=0, le=_HOUR)]
"""A timeout in seconds: above 0, at most an hour."""
_RunSeconds = Annotated[float, Field(ge=0, le=_WEEK)]
"""A point in a run, in seconds: 0 to a week."""
_Rate = Annotated[float, Field(ge=0, le=1_000_000)]
"""Messages per second: at most a million."""
_MAX_MESSAGES = 1_000_000_000


class _Model(BaseModel):
    """Frozen and closed: a scenario is a value, and an unknown key is a typo until proven not."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def _by_kind(default: str) -> Discriminator:
    """Pick a union member by its ``kind`` key, ``default`` when the key is absent.

    Tags carry an ``@`` so the loader can drop them from error locations: pydantic puts the
    chosen member's tag in ``loc`` (``transport.@zmq.broker``), which is no key of the file.
    """

    def discriminate(value: Any) -> str | None:
        if isinstance(value, Mapping):
            kind = value.get("kind", default)
        else:
            kind = getattr(value, "kind", None)
        return None if kind is None else f"@{kind}"

    return Discriminator(discriminate)


# -- transport ---------------------------------------------------------------------------------


class InProcessTransportConfig(_Model):
    """Every agent in this process on one asyncio bus: the default, zero copy."""

    kind: Literal["inprocess"] = "inprocess"


class ZmqTransportConfig(_Model):
    """A ZeroMQ broker and nodes; ``nodes`` places agents (by name) on named nodes.

    An agent listed on several nodes runs there as competing consumers.
    """

    kind: Literal["zmq"]
    broker: str = "tcp://127.0.0.1:5555"
    nodes: dict[_AgentName, tuple[_AgentName, ...]] = Field(default_factory=dict)
    heartbeat: Annotated[float, Field(gt=0, le=60)] = 1.0
    """Seconds between heartbeats (above 0, at most 60); a node silent for
    ``heartbeat * liveness`` is lost and what was in flight to it is redelivered or
    dead-lettered (``node_lost``)."""
    liveness: Annotated[int, Field(ge=1, le=100)] = 3
    """Heartbeats a node may miss before it is lost: 1 to 100."""
    curve: bool = False
    """Encrypt and authenticate every link with CURVE keys made for the run: the broker
    admits only the run's own processes (``pantheon run``; by hand, see ``pantheon keys``)."""
    insecure: bool = False
    """Allow a ``broker`` address reachable from the network without ``curve``: anyone who
    reaches it may then join the run, read its messages and inject others."""

    @field_validator("broker")
    @classmethod
    def _broker_address(cls, value: str) -> str:
        problem = broker_address_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _network_needs_curve(self) -> ZmqTransportConfig:
        if not (self.curve or self.insecure or bind_is_local(self.broker)):
            raise ValueError(
                f"broker {self.broker} is reachable from the network and curve is off: set "
                "curve: true, or insecure: true to accept anyone who reaches it"
            )
        return self


#: A host name or a network interface name (``eth0``), as libzmq takes either.
_HOSTNAME = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9_-]{1,63}(?<!-))*\.?")
#: Bytes of a Unix socket path (``sun_path`` less its terminating NUL).
_MAX_IPC_PATH = 107
_BROKER_FORMS = "tcp://HOST:PORT (port 0 to 65535, 0 for any free port) or ipc://PATH"


def broker_address_problem(address: str) -> str | None:
    """Why ``address`` cannot be a ZeroMQ broker's address, or None: it must be
    ``tcp://HOST:PORT`` (an IPv4 address, ``[IPv6]``, a host or interface name, or ``*``
    for every interface; a port of 0 to 65535, 0 for any free one) or ``ipc://PATH`` (a
    Unix socket file). libzmq takes a port over 65535 and wraps it (70000 binds 4464), and
    an address it cannot parse fails only when the broker starts: both are refused here."""
    if address.startswith("ipc://"):
        path = address[len("ipc://") :]
        if not path or not path.isprintable():
            return f"{address!r:.80} names no socket file: give ipc://PATH"
        if len(path.encode("utf-8", "surrogatepass")) > _MAX_IPC_PATH:
            return f"ipc path is over {_MAX_IPC_PATH} bytes, the limit of a Unix socket path"
        return None
    if address.startswith("inproc://"):
        return (
            "inproc:// reaches only the process that binds it, and the broker is a process of "
            f"its own: give {_BROKER_FORMS}"
        )
    if not address.startswith("tcp://"):
        return f"{address!r:.80} is no ZeroMQ broker address: give {_BROKER_FORMS}"
    rest = address[len("tcp://") :]
    host, sep, port = rest.rpartition(":")
    if not sep or not host or rest.endswith("]"):
        return f"{address!r:.80} has no port: give {_BROKER_FORMS}"
    if not (port.isascii() and port.isdigit()):
        return f"port {port!r:.20} is not a number: give {_BROKER_FORMS}"
    if int(port) > 65_535:
        return f"port {int(port)} is over 65535: give {_BROKER_FORMS}"
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return f"{host!r:.80} is no IPv6 address: give {_BROKER_FORMS}"
        return None
    if host != "*" and (len(host) > 253 or not _HOSTNAME.fullmatch(host)):
        return f"{host!r:.80} is no IP address, host or interface name: give {_BROKER_FORMS}"
    return None


def bind_is_local(bind: str) -> bool:
    """Whether a ZeroMQ ``bind`` address is reachable from this machine only: a loopback
    address (or ``localhost``), an ``ipc://`` socket file or ``inproc://``. Another host
    name counts as the network: what it resolves to can change."""
    if bind.startswith(("ipc://", "inproc://")):
        return True
    if not bind.startswith("tcp://"):
        return False
    host = bind[len("tcp://") :].rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class NatsCredentials(_Model):
    """How a NATS client proves who it is: ``user`` with ``password``, an ``nkey_seed``
    file, a ``creds`` file (JWT + nkey), or a ``token``; exactly one."""

    user: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    password: Annotated[str, Field(min_length=1, max_length=1024)] | None = None
    nkey_seed: Annotated[str, Field(min_length=1)] | None = None
    creds: Annotated[str, Field(min_length=1)] | None = None
    token: Annotated[str, Field(min_length=1, max_length=1024)] | None = None

    @model_validator(mode="after")
    def _one_method(self) -> NatsCredentials:
        if (self.user is None) != (self.password is None):
            raise ValueError("user and password go together")
        methods = [
            m
            for m, on in (
                ("user/password", self.user is not None),
                ("nkey_seed", self.nkey_seed is not None),
                ("creds", self.creds is not None),
                ("token", self.token is not None),
            )
            if on
        ]
        if len(methods) != 1:
            raise ValueError(
                "give exactly one of user/password, nkey_seed, creds or token"
                + (f" (got {', '.join(methods)})" if methods else "")
            )
        return self


_NATS_URL = r"^(nats|tls)://[^\s,]+(,(nats|tls)://[^\s,]+)*$"


class NatsTransportConfig(_Model):
    """NATS JetStream: durable streams, consumer groups, clustering. ``nodes`` places agents
    on node processes as for ZeroMQ; each connects to ``url`` (one server, or several
    comma-separated for a cluster). ``server: auto`` starts a throwaway ``nats-server -js``
    on a free loopback port for the run (and stops it after) instead of using ``url``."""

    kind: Literal["nats"]
    url: Annotated[str, Field(pattern=_NATS_URL)] = "nats://127.0.0.1:4222"
    server: Literal["auto", "external"] = "external"
    team: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]+$", max_length=64)] | None = None
    """The stream's name part (``PANTHEON_<team>``); default: the scenario's name."""
    nodes: dict[_AgentName, tuple[_AgentName, ...]] = Field(default_factory=dict)
    storage: Literal["file", "memory"] = "file"
    replicas: Annotated[int, Field(ge=1, le=5)] = 1
    """Stream replicas: 1, or 3 on a three-server cluster to survive losing one."""
    credit: Annotated[int, Field(ge=1, le=65_536)] = 256
    """Messages one subscription may hold unacknowledged per lane (max_ack_pending)."""
    max_deliver: Annotated[int, Field(ge=1, le=1000)] = 1
    """Deliveries of a failing message before it goes to the DLQ stream. 1 (the default):
    the agent's own ``retry`` policy is the retry, and a run counts dead letters as it does
    in-process. Above 1, NATS redelivers a failed message (nak with backoff) up to this many
    times, each failed delivery listed in the receiving process's DLQ."""
    ack_wait: Annotated[float, Field(gt=0, le=3600)] = 30.0
    """Seconds before the server redelivers what a silent (dead) node held."""
    dedup_window: Annotated[float, Field(gt=0, le=86_400)] = 120.0
    """Seconds the stream remembers a Nats-Msg-Id to drop a repeated publish."""
    heartbeat: Annotated[float, Field(gt=0, le=60)] = 1.0
    liveness: Annotated[int, Field(ge=1, le=100)] = 3
    credentials: NatsCredentials | None = None
    standby: Annotated[
        dict[_AgentName, tuple[_AgentName, ...]] | Literal["driver"],
        Expects("'driver' or a mapping of process -> agents"),
    ] = Field(default_factory=dict)
    """Standby members: process -> agents of ``nodes`` it also hosts, so that SIGKILL of
    their node leaves their work to it (a process not in ``nodes`` is started for its
    standbys alone; ``driver`` is the process running the scenario). ``driver`` alone: the
    driver hosts a standby of every agent placed on a node. A standby is a full member of
    its agent's consumer group from the start (docs/scenarios.md says why)."""
    standby_mode: Literal["hot", "warm"] = "hot"
    """``hot``: a standby shares its agent's work from the start. ``warm``: it pulls nothing
    while its agent's node (or a standby listed before it) is alive, and takes over once
    that process is gone, so an agent that keeps state across messages is one instance at
    a time, as in one process (docs/scenarios.md)."""

    def standby_hosts(self) -> dict[str, tuple[str, ...]]:
        """``standby`` as process -> agents (``driver`` spelled out)."""
        if self.standby == "driver":
            placed = dict.fromkeys(a for agents in self.nodes.values() for a in agents)
            return {DRIVER_NODE: tuple(placed)} if placed else {}
        return dict(self.standby)

    def warm_ahead(self, host: str) -> dict[str, tuple[str, ...]]:
        """With ``standby_mode: warm``, the agents ``host`` is a standby of, each with the
        processes ahead of it: the node that places the agent, then the standbys of it
        listed before ``host``. Nothing for a hot standby, or a process that is none."""
        if self.standby_mode != "warm":
            return {}
        ahead: dict[str, list[str]] = {}
        for node, agents in self.nodes.items():
            for agent in agents:
                ahead.setdefault(agent, []).append(node)
        out: dict[str, tuple[str, ...]] = {}
        for process, agents in self.standby_hosts().items():
            for agent in agents:
                if process == host:
                    out[agent] = tuple(ahead.get(agent, ()))
                ahead.setdefault(agent, []).append(process)
        return out

    @model_validator(mode="after")
    def _auto_server_credentials(self) -> NatsTransportConfig:
        creds = self.credentials
        if self.server == "auto" and creds is not None and (creds.creds or creds.token):
            raise ValueError(
                "server: auto configures user/password or nkey_seed credentials only; use an "
                "external server for creds or token"
            )
        return self


TransportConfig: TypeAlias = InProcessTransportConfig | ZmqTransportConfig | NatsTransportConfig
_Transport = Annotated[
    Annotated[InProcessTransportConfig, Tag("@inprocess")]
    | Annotated[ZmqTransportConfig, Tag("@zmq")]
    | Annotated[NatsTransportConfig, Tag("@nats")],
    _by_kind("inprocess"),
]

# -- provider ----------------------------------------------------------------------------------


def _compile(value: Any) -> Any:
    """Compile a rule now, so a bad regex fails at load time with its index, not mid-run."""
    if isinstance(value, str):
        # `re` warns (FutureWarning) about a pattern whose meaning a later Python changes,
        # such as `[[`: a rule that may match something else tomorrow is reported now, and
        # never escapes as a warning turned error under `-W error`.
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            try:
                return re.compile(value)
            except re.error as exc:
                raise ValueError(f"invalid regular expression {value!r}: {exc}") from None
            except Warning as exc:
                raise ValueError(
                    f"ambiguous regular expression {value!r}: {exc} (escape it: \\[)"
                ) from None
    return value


_Rule = Annotated[re.Pattern[str], BeforeValidator(_compile)]


class RulesProviderConfig(_Model):
    """The offline, deterministic provider: intents recognised by regular expressions.

    ``rules`` maps an intent to its patterns, compiled at load (``pattern.pattern`` gives the
    source back); an email matching none gets ``default_intent``. ``intents`` are the team's
    (the support desk's: question, complaint, refund, bug, spam, outage): the rules may name
    only these, and a tie goes to the one listed first; without them, to the rule listed
    first.
    """

    kind: Literal["rules"] = "rules"
    rules: dict[str, tuple[_Rule, ...]] = Field(default_factory=dict)
    default_intent: str = "question"
    intents: tuple[str, ...] | None = None

    @model_validator(mode="after")
    def _known_intents(self) -> RulesProviderConfig:
        if self.intents is not None:
            unknown = sorted(set(self.rules) - set(self.intents))
            if unknown:
                raise ValueError(
                    f"rules for {', '.join(unknown)}, which intents does not list "
                    f"({', '.join(self.intents)})"
                )
        return self


def _env_base_url() -> str:
    return os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1")


class RateLimitConfig(_Model):
    """Client-side limits on the provider's model calls, as the server meters the key: at
    most ``requests_per_minute`` calls and ``tokens_per_minute`` tokens in any ``window``
    seconds (60 unless a test scales it). Calls over the limit wait their turn, first come
    first served; a 429 the server still sends is retried after its ``Retry-After`` (by
    the OpenAI provider's own retries, or the Anthropic SDK's). One limiter for the whole
    team: on ZeroMQ and NATS the driver's, which the nodes' agents ask for their turns
    (``pantheon.runner._budget_relay``)."""

    requests_per_minute: Annotated[int, Field(ge=1, le=10_000_000)] | None = None
    """Calls per window: 1 to 10,000,000."""
    tokens_per_minute: Annotated[int, Field(ge=1, le=10_000_000_000)] | None = None
    """Tokens (input plus output) per window: 1 to 10,000,000,000."""
    window: _Timeout = 60.0
    """Seconds the limits count over: above 0, at most an hour (60: per minute)."""

    @model_validator(mode="after")
    def _some_limit(self) -> RateLimitConfig:
        if self.requests_per_minute is None and self.tokens_per_minute is None:
            raise ValueError("a rate limit needs requests_per_minute, tokens_per_minute or both")
        return self

    def to_limit(self) -> RateLimit:
        return RateLimit(self.requests_per_minute, self.tokens_per_minute, self.window)


class OpenAIProviderConfig(_Model):
    """Any OpenAI-compatible chat server, local or remote.

    The key itself never goes in a scenario (scenarios are stored with every session): only
    the name of the environment variable holding it.
    """

    kind: Literal["openai"]
    base_url: str = Field(default_factory=_env_base_url)
    model: str = Field(min_length=1)
    api_key_env: str = "OPENAI_API_KEY"
    timeout: _Timeout = 30.0
    """Seconds for a whole request (reading the answer included); at most an hour."""
    connect_timeout: _Timeout = 5.0
    """Seconds to connect; at most an hour."""
    max_retries: Annotated[int, Field(ge=0, le=100)] = 3
    """Retries after a 429, a 5xx or a refused connection, with exponential backoff (0 to
    100)."""
    backoff: _Seconds = 0.2
    """Seconds before the first retry (0 to an hour); doubled each time, jittered, honouring
    Retry-After."""
    max_backoff: _Seconds = 5.0
    """Longest wait between retries, in seconds: 0 to an hour."""
    max_connections: Annotated[int, Field(ge=1, le=1024)] = 32
    """Connections open to the server at once: 1 to 1024."""
    rate_limit: RateLimitConfig | None = None
    """Requests and tokens per minute this team may send (see :class:`RateLimitConfig`)."""
    default_intent: str = "question"
    stand_in: str | None = None
    """A scripted stand-in for the model: ``"module:reply"``, a function of each request body
    answering as :class:`pantheon.testing.ModelServer`'s reply functions do (a ``Reply``,
    text or a mapping). The run then starts a ``ModelServer`` with it on a free port of
    127.0.0.1 before its input flows, points the provider there, and stops it when the run
    ends; a replay, whose calls are served, never starts it, a what-if only for a live call.
    Not with ``base_url``."""

    @field_validator("stand_in")
    @classmethod
    def _stand_in(cls, value: str | None) -> str | None:
        if value is not None:
            fn = load_object(value)
            if not callable(fn) or isinstance(fn, type):
                raise ValueError(
                    f"{value!r} is not a function of the request (it is a "
                    f"{type(fn).__name__}): give one taking the request body and returning "
                    "a Reply, text or a mapping"
                )
        return value

    @model_validator(mode="after")
    def _one_server(self) -> OpenAIProviderConfig:
        if self.stand_in is not None and "base_url" in self.model_fields_set:
            raise ValueError(
                "give base_url (a model server to call) or stand_in (a scripted one the run "
                "starts), not both"
            )
        return self


def _env_anthropic_url() -> str:
    return os.environ.get("ANTHROPIC_BASE_URL", "https://api.anthropic.com")


class AnthropicProviderConfig(_Model):
    """Anthropic's Messages API (or a server speaking it), through the official SDK (the
    ``anthropic`` extra). As for OpenAI, the scenario names the key's environment variable,
    never the key."""

    kind: Literal["anthropic"]
    base_url: str = Field(default_factory=_env_anthropic_url)
    """The API's root, before ``/v1/messages``."""
    model: str = Field(min_length=1)
    api_key_env: str = "ANTHROPIC_API_KEY"
    max_tokens: Annotated[int, Field(ge=1, le=1_000_000)] = 1024
    """Tokens a call may generate when it does not say (the API requires a bound)."""
    params: dict[str, Any] = Field(default_factory=dict)
    """Further request fields sent with every call (``top_k``, ``stop_sequences``,
    ``metadata``...); a call's own arguments win."""
    timeout: _Timeout = 60.0
    """Seconds for a whole request; at most an hour."""
    connect_timeout: _Timeout = 5.0
    """Seconds to connect; at most an hour."""
    max_retries: Annotated[int, Field(ge=0, le=100)] = 3
    """Retries after a 408, 409, 429, 5xx or a refused connection (the SDK's backoff,
    honouring Retry-After): 0 to 100."""
    max_connections: Annotated[int, Field(ge=1, le=1024)] = 32
    """Connections open to the server at once: 1 to 1024."""
    rate_limit: RateLimitConfig | None = None
    """Requests and tokens per minute this team may send (see :class:`RateLimitConfig`); a
    429 past it is the SDK's to retry, after the server's Retry-After."""


class CustomProviderConfig(_Model):
    """A provider of the team's own: ``class`` is ``"module:Name"`` or the name of a
    ``pantheon.providers`` entry point, built as ``Name(**settings)`` and checked at load
    (it must take those settings and have an async ``chat``)."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", populate_by_name=True, serialize_by_alias=True
    )

    kind: Literal["custom"]
    class_: str = Field(alias="class", min_length=1)
    settings: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _buildable(self) -> CustomProviderConfig:
        provider_class(self.class_, self.settings)
        return self


def provider_class(spec: str, settings: Mapping[str, Any]) -> type:
    """The provider class ``spec`` names, checked to take ``settings`` and to chat;
    ``ValueError`` saying what is wrong."""
    cls = load_object(spec, group=PROVIDER_GROUP)
    if not isinstance(cls, type):
        raise ValueError(f"{spec!r} is not a class (it is a {type(cls).__name__})")
    if not inspect.iscoroutinefunction(getattr(cls, "chat", None)):
        raise ValueError(f"{spec!r} has no async chat(messages, ...): it is not a model provider")
    try:
        inspect.signature(cls).bind(**settings)
    except TypeError as exc:
        raise ValueError(f"{spec!r} does not take these settings: {exc}") from None
    return cls


ProviderConfig: TypeAlias = (
    RulesProviderConfig | OpenAIProviderConfig | AnthropicProviderConfig | CustomProviderConfig
)
_Provider = Annotated[
    Annotated[RulesProviderConfig, Tag("@rules")]
    | Annotated[OpenAIProviderConfig, Tag("@openai")]
    | Annotated[AnthropicProviderConfig, Tag("@anthropic")]
    | Annotated[CustomProviderConfig, Tag("@custom")],
    _by_kind("rules"),
]


class BudgetLimit(_Model):
    """What one scope may spend on model calls: tokens (input plus output) and US dollars
    (priced from ``prices``); at least one."""

    tokens: Annotated[int, Field(ge=0)] | None = None
    cost_usd: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None

    @model_validator(mode="after")
    def _some_limit(self) -> BudgetLimit:
        if self.tokens is None and self.cost_usd is None:
            raise ValueError("a budget needs tokens, cost_usd or both")
        return self

    def to_budget(self) -> Budget:
        return Budget(self.tokens, self.cost_usd)


class BudgetConfig(_Model):
    """Live limits on model spending: ``run`` for the whole team, ``agents`` per agent
    name. Once a scope is spent, its further model calls are refused: the message is
    dead-lettered with reason ``budget`` and ``system.budget`` is published (once per
    scope). Calls in flight when the limit is reached may pass it by less than one call."""

    run: BudgetLimit | None = None
    agents: dict[str, BudgetLimit] = Field(default_factory=dict)


class PriceConfig(_Model):
    """What a model's tokens cost, in US dollars per million, as the provider bills them."""

    input: Annotated[float, Field(ge=0)]
    output: Annotated[float, Field(ge=0)]


# -- policy ------------------------------------------------------------------------------------


class PolicyConfig(_Model):
    """What the Guardian enforces before any action runs."""

    refund_limit: Annotated[float, Field(ge=0)] = 200.0
    """Refunds above this need human approval (escalate); at or below, the Actor may reply."""
    min_confidence: _Fraction = 0.6
    """A proposal below this confidence is escalated instead of executed."""
    block_pii_in_replies: bool = True
    over_limit: Literal["escalate", "ask"] = "escalate"
    """A refund over ``refund_limit``: ``escalate`` it to the humans queue, or ``ask`` a
    person to approve or reject it while it waits (bounded by ``approvals``)."""


# -- approvals ---------------------------------------------------------------------------------

_DAY = 24 * _HOUR


class AutoApproverConfig(_Model):
    """A scripted person for tests and demos: decides every request ``approve_after``
    (or ``reject_after``) seconds after it was asked, as ``by``, with ``note``."""

    approve_after: Annotated[float, Field(ge=0, le=_HOUR)] | None = None
    """Approve each request this many seconds after it is asked: 0 to an hour."""
    reject_after: Annotated[float, Field(ge=0, le=_HOUR)] | None = None
    """Reject each request this many seconds after it is asked: 0 to an hour."""
    note: Annotated[str, Field(max_length=500)] = "scripted"
    by: Annotated[str, Field(min_length=1, max_length=100)] = "auto"

    @model_validator(mode="after")
    def _one(self) -> AutoApproverConfig:
        if (self.approve_after is None) == (self.reject_after is None):
            raise ValueError("give approve_after or reject_after, exactly one of them")
        return self


class ApprovalsConfig(_Model):
    """How long an approval request waits for a person, and what happens then."""

    timeout: Annotated[float, Field(gt=0, le=_DAY)] = 300.0
    """Seconds a request waits for a decision before ``default`` applies: above 0, at
    most a day. It keeps an unattended run finite."""
    default: Literal["approve", "reject"] = "reject"
    """The decision when nobody answers in time (recorded as decided by ``timeout``)."""
    poll: Annotated[float, Field(ge=0.01, le=10)] = 0.2
    """Seconds between looks at the session store for decisions made by other processes
    (``pantheon approve``, the dashboards): 0.01 to 10."""
    auto: AutoApproverConfig | None = None
    """A scripted person (tests): ``auto: {approve_after: 0.5}``."""


# -- input -------------------------------------------------------------------------------------

_Priority = Literal["critical", "high", "normal"]


def _resolved(spec: str, info: ValidationInfo, group: str | None = None) -> Any:
    """The object import path ``spec`` names (the scenario's folder is importable, see
    :func:`_import_roots`); ``None`` when the loader was told not to look (a replay
    rebuilding a recorded scenario, whose code may be gone, and which never calls it)."""
    context = info.context or {}
    if not context.get("check_files", True):
        return None
    base_dir = context.get("base_dir")
    return import_path(spec, None if base_dir is None else Path(base_dir).resolve(), group=group)


def _callable_path(spec: str, info: ValidationInfo) -> str:
    obj = _resolved(spec, info)
    if obj is not None and not callable(obj):
        raise ValueError(f"{spec!r} is a {type(obj).__name__}, not a function")
    return spec


def _generator_path(spec: str, info: ValidationInfo) -> str:
    obj = _resolved(spec, info, INPUT_GROUP)
    if obj is not None and not (
        inspect.isgeneratorfunction(obj) or inspect.isasyncgenfunction(obj)
    ):
        raise ValueError(
            f"{spec!r} is not a generator function: write a def (or async def) that yields"
        )
    return spec


def _json_keys(value: Any) -> Any:
    if not isinstance(value, Mapping):
        return value
    return {k if isinstance(k, str) else json.dumps(k): v for k, v in value.items()}


#: ``module:function``, checked at load: the module imports and the name is callable.
_CallablePath = Annotated[str, AfterValidator(_callable_path)]
#: ``module:function`` naming a sync or async generator function.
_GeneratorPath = Annotated[str, AfterValidator(_generator_path)]


class _InputBase(_Model):
    """What every input kind shares: limits, priority, and how a record becomes a message.

    A record's topic is ``topic``, or ``topics[record[topic_field]]`` (``default_topic``
    for a value with no entry). ``label`` names a field of ground truth that is taken out
    before publishing and kept for the Learner under ``record[key]``. A record that cannot
    be read, fails ``validate`` or has no topic is published on ``malformed_topic`` as
    ``{"line": n, "reason": ..., "key": ...}``.
    """

    # `validate` shadows a BaseModel method, so the field has another name and the key as
    # its alias, used for reading and for dumping (a dumped scenario loads again).
    model_config = ConfigDict(frozen=True, extra="forbid", serialize_by_alias=True)

    count: Annotated[int, Field(gt=0, le=_MAX_MESSAGES)] | None = None
    """Stop after this many messages (malformed ones included); at most a billion."""
    duration: Annotated[float, Field(gt=0, le=_WEEK)] | None = None
    """Stop after this many seconds; at most a week."""
    rate: _Rate = 0.0
    """Messages per second, at most a million; 0 means as fast as the bus accepts them."""
    priority: _Priority = "normal"
    """The bus priority every input message is published with."""
    topic: _Topic | None = None
    topic_field: str | None = None
    topics: Annotated[dict[str, _Topic], BeforeValidator(_json_keys)] = Field(default_factory=dict)
    """Field value -> topic; YAML keys that are not strings (``1``, ``true``) are taken in
    their JSON spelling, which is how a record's value is looked up."""
    default_topic: _Topic | None = None
    key: str = "id"
    label: str | None = None
    malformed_topic: _Topic = "input.malformed"
    validator: _CallablePath | None = Field(default=None, alias="validate")
    """``module:function`` called with each record (label removed): a reason string rejects
    it as malformed, ``None`` accepts it."""

    @model_validator(mode="after")
    def _routing(self) -> _InputBase:
        if self.topic is not None and self.topic_field is not None:
            raise ValueError(
                "give topic (one topic for every record) or topic_field (a topic per record), "
                "not both"
            )
        if self.topic_field is None and (self.topics or self.default_topic is not None):
            raise ValueError("topics and default_topic pick a topic by topic_field: set it")
        if self.topic_field is not None and not self.topics:
            raise ValueError("topic_field needs topics: a mapping of field value to topic")
        if self.label is not None and self.label == self.key:
            raise ValueError(f"label and key both name field {self.key!r}")
        return self

    def _need_topic(self, what: str) -> None:
        if self.topic is None and self.topic_field is None:
            raise ValueError(f"{what} needs topic, or topic_field with topics")


def _resolve_path(value: Path, info: ValidationInfo) -> Path:
    context = info.context or {}
    try:
        path = (Path(context.get("base_dir") or Path.cwd()) / value.expanduser()).resolve()
        if context.get("check_files", True) and path.is_dir():
            raise ValueError(f"{path} is a directory, not a file: name the input file in it")
        if context.get("check_files", True) and not path.is_file():
            raise ValueError(f"input file not found: {path}")
    except OSError as exc:  # a name too long, a loop of links: the path is the problem
        raise ValueError(f"input path cannot be used: {exc.strerror or exc}") from None
    return path


class JsonlInputConfig(_InputBase):
    """Records from a JSON-lines file, one JSON object per non-blank line, of any schema.

    ``path`` is relative to the scenario file's directory and is absolute once loaded; a
    missing file is a load error, not a run that quietly ingests nothing (unless the loader
    was told not to look, as a replay that never reads the input does).
    """

    kind: Literal["jsonl"] = "jsonl"
    path: Annotated[Path, AfterValidator(_resolve_path)]

    @model_validator(mode="after")
    def _topic(self) -> JsonlInputConfig:
        self._need_topic("a jsonl input")
        return self


#: What ``kind: file`` (the input of scenarios written before ``jsonl``) means: the support
#: inbox, routed, labelled and checked as the Observer once did for every file (the check is
#: the support team's, ``scenarios/support/emails.py``: a scenario using ``kind: file`` has
#: that folder on its ``path:`` or sits beside it).
SUPPORT_INBOX: dict[str, str] = {
    "topic": "observation.email.received",
    "label": "expected",
    "malformed_topic": "observation.email.malformed",
    "validate": "support.emails:email_problem",
}


class FileInputConfig(_InputBase):
    """``kind: file`` (and an input with no ``kind``): a JSONL input with the support
    inbox's settings (:data:`SUPPORT_INBOX`) as defaults, so scenarios and recorded
    sessions from before ``jsonl`` load and run as they did. Any of them may be overridden."""

    kind: Literal["file"] = "file"
    path: Annotated[Path, AfterValidator(_resolve_path)]

    @model_validator(mode="before")
    @classmethod
    def _support_inbox(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        defaults = dict(SUPPORT_INBOX)
        if "topic_field" in data:
            del defaults["topic"]
        return defaults | dict(data)


class GeneratorInputConfig(_InputBase):
    """Records made by code: ``function`` (``module:name``, the scenario's folder is
    importable, or the name of an entry point in group ``pantheon.inputs``), a sync or
    async generator function called with ``(seed, settings)``; or, without a function,
    copies of ``payload`` on ``topic``, which need an end."""

    kind: Literal["generator"]
    function: _GeneratorPath | None = None
    settings: dict[str, Any] = Field(default_factory=dict)
    payload: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _form(self) -> GeneratorInputConfig:
        if self.function is not None:
            if "payload" in self.model_fields_set:
                raise ValueError("give function or payload, not both")
            return self
        if self.settings:
            raise ValueError("settings are passed to function, which is not set")
        self._need_topic("a generator input with payload")
        if self.count is None and self.duration is None:
            raise ValueError("a generator input needs count or duration, or it never ends")
        return self


class StdinInputConfig(_InputBase):
    """Lines of standard input, until it closes: a line that parses as JSON is that value,
    any other is ``{"text": line}``."""

    kind: Literal["stdin"]

    @model_validator(mode="after")
    def _topic(self) -> StdinInputConfig:
        self._need_topic("a stdin input")
        return self


class HttpInputConfig(_InputBase):
    """A webhook inbox: JSON records POSTed to the gateway's ``/v1/inbox`` (the scenario
    needs a ``gateway:`` section), each published by the Observer like a JSONL line. The
    input ends at ``count`` or ``duration``, or when the gateway stops (Ctrl-C on
    ``pantheon serve``)."""

    kind: Literal["http"]
    buffer: Annotated[int, Field(ge=1, le=100_000)] = 256
    """Records accepted ahead of the Observer, at most 100,000. When the bus holds the
    Observer back (a full mailbox), this fills and the inbox answers 429 with Retry-After,
    so the sender slows down instead of the gateway filling memory."""

    @model_validator(mode="after")
    def _topic(self) -> HttpInputConfig:
        self._need_topic("an http input")
        return self


InputConfig: TypeAlias = (
    JsonlInputConfig | FileInputConfig | GeneratorInputConfig | StdinInputConfig | HttpInputConfig
)
_Input = Annotated[
    Annotated[JsonlInputConfig, Tag("@jsonl")]
    | Annotated[FileInputConfig, Tag("@file")]
    | Annotated[GeneratorInputConfig, Tag("@generator")]
    | Annotated[StdinInputConfig, Tag("@stdin")]
    | Annotated[HttpInputConfig, Tag("@http")],
    _by_kind("file"),
]

# -- gateway -----------------------------------------------------------------------------------

_LOOPBACK = ("127.0.0.1", "::1", "localhost")
_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


def _tokens_path(value: Path | None, info: ValidationInfo) -> Path | None:
    if value is None:
        return None
    context = info.context or {}
    path = (Path(context.get("base_dir") or Path.cwd()) / value.expanduser()).resolve()
    if context.get("check_files", True) and path.is_dir():
        raise ValueError(f"{path} is a directory, not a file: name the tokens file in it")
    if context.get("check_files", True) and not path.is_file():
        raise ValueError(f"tokens file not found: {path}")
    return path


class GatewayConfig(_Model):
    """The HTTP and WebSocket gateway a run exposes (``pantheon run`` with this section,
    or ``pantheon serve``); see docs/gateway.md. Bound to the loopback interface unless
    ``host`` says otherwise, and a gateway reachable from other hosts must have tokens."""

    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65_535)] = 8787
    """TCP port; 0 picks a free one (printed at start)."""
    tokens_file: Annotated[Path | None, AfterValidator(_tokens_path)] = None
    """YAML or JSON file of bearer tokens and their publish/subscribe patterns, relative to
    the scenario's folder."""
    tokens_env: Annotated[str, Field(pattern=_ENV_NAME)] | None = None
    """Name of an environment variable holding the same document (JSON or YAML)."""
    max_body: Annotated[int, Field(ge=1024, le=64 * 1024 * 1024)] = 1024 * 1024
    """Largest request body in bytes (1 KiB to 64 MiB); a bigger one gets 413."""
    max_batch: Annotated[int, Field(ge=1, le=100_000)] = 10_000
    """Most messages in one ``POST /v1/batch`` (at most 100,000); more gets 400."""
    send_queue: Annotated[int, Field(ge=1, le=1_000_000)] = 4096
    """Messages waiting for one WebSocket/SSE client (at most a million). When it is full
    the oldest waiting message is dropped and counted; the client is told the count."""
    max_drops: Annotated[int, Field(ge=0, le=1_000_000_000)] = 100_000
    """Close a client once this many messages were dropped for it (0: never close)."""
    request_timeout: Annotated[float, Field(gt=0, le=_HOUR)] = 30.0
    """Longest wait ``POST /v1/request`` accepts (its ``timeout`` parameter is capped)."""
    retry_after: Annotated[float, Field(gt=0, le=_HOUR)] = 1.0
    """Seconds a 429 for a full mailbox tells the client to wait (an open breaker says
    its own)."""
    idempotency_keys: Annotated[int, Field(ge=0, le=1_000_000)] = 10_000
    """Idempotency keys remembered (the oldest is forgotten first); 0 turns them off."""
    compression: bool = False
    """Offer permessage-deflate to WebSocket clients. Off by default: a broadcast message is
    encoded once for every subscriber, but compressed once per socket, which costs more
    CPU than loopback or LAN bandwidth saves."""
    static: bool = True
    """Serve the example page at ``/`` (decisions streamed over the WebSocket)."""

    @model_validator(mode="after")
    def _exposed(self) -> GatewayConfig:
        if self.host not in _LOOPBACK and self.tokens_file is None and self.tokens_env is None:
            raise ValueError(
                f"host {self.host!r} is reachable from other machines: give tokens_file or "
                "tokens_env so the gateway is not open to anyone"
            )
        return self


# -- agents ------------------------------------------------------------------------------------


class RetryConfig(_Model):
    """Mirrors :class:`bus.Retry`: ``attempts`` counts every call, the first included."""

    attempts: Annotated[int, Field(ge=1, le=100)] = 1
    """Calls in all, the first included: 1 to 100."""
    backoff: _Seconds = 0.0
    """Seconds before the first retry: 0 to an hour."""
    multiplier: Annotated[float, Field(ge=1, le=100)] = 2.0
    """Each wait is the last one times this: 1 to 100."""
    max_backoff: _Seconds = 30.0
    """Longest wait between attempts, in seconds: 0 to an hour."""

    def to_policy(self) -> bus.Retry:
        return bus.Retry(self.attempts, self.backoff, self.multiplier, self.max_backoff)


class BreakerConfig(_Model):
    """Mirrors :class:`bus.BreakerPolicy`; the defaults are the bus's."""

    consecutive_failures: Annotated[int, Field(ge=1, le=10_000)] = (
        bus.DEFAULT_BREAKER.consecutive_failures
    )
    """Failures in a row that open the breaker: 1 to 10,000."""
    failure_rate: Annotated[float, Field(gt=0, le=1)] = bus.DEFAULT_BREAKER.failure_rate
    window: Annotated[int, Field(ge=1, le=10_000)] = bus.DEFAULT_BREAKER.window
    """Last calls the failure rate is taken over (each is remembered): 1 to 10,000."""
    min_calls: Annotated[int, Field(ge=1, le=10_000)] = bus.DEFAULT_BREAKER.min_calls
    """Calls in the window before the rate counts: 1 to 10,000, and at most ``window``."""
    cooldown: _Timeout = bus.DEFAULT_BREAKER.cooldown
    """Seconds open before probing: above 0, at most an hour."""
    probes: Annotated[int, Field(ge=1, le=1000)] = bus.DEFAULT_BREAKER.probes
    """Trial calls let through when half-open: 1 to 1000."""
    probe_timeout: _Timeout = bus.DEFAULT_BREAKER.probe_timeout
    """Seconds a probe may take before it counts as failed: above 0, at most an hour."""

    @model_validator(mode="after")
    def _reachable(self) -> BreakerConfig:
        # The rate rule only looks at the last `window` calls, so it could never fire.
        if self.min_calls > self.window:
            raise ValueError(
                f"min_calls ({self.min_calls}) exceeds window ({self.window}): "
                "the failure-rate rule could never open the breaker"
            )
        return self

    def to_policy(self) -> bus.BreakerPolicy:
        return bus.BreakerPolicy(
            consecutive_failures=self.consecutive_failures,
            failure_rate=self.failure_rate,
            window=self.window,
            min_calls=self.min_calls,
            cooldown=self.cooldown,
            probes=self.probes,
            probe_timeout=self.probe_timeout,
        )


class AgentConfig(_Model):
    """One agent: what runs it, its mailbox, backpressure, retries, breaker and settings.

    What runs it is one of: ``role`` (a built-in; optional for the nine built-in names, which
    are their own role, and required for extra instances, ``actor_2: {role: actor}``),
    ``class`` (``"myteam.agents:Triage"``, an :class:`agents.Agent` subclass, or the name of
    a ``pantheon.agents`` entry point) or ``handler`` (an async function, which needs
    ``subscribe``). ``settings`` are checked against that class's ``Settings`` model.
    """

    model_config = ConfigDict(
        frozen=True, extra="forbid", populate_by_name=True, serialize_by_alias=True
    )

    role: Role | None = None
    class_: str | None = Field(default=None, alias="class", min_length=1)
    handler: str | None = Field(default=None, min_length=1)
    subscribe: tuple[_Pattern, ...] | None = None
    """Topic patterns replacing the class's own ``subscriptions`` for this agent."""
    enabled: bool = True
    concurrency: Annotated[int, Field(ge=1, le=1024)] = 1
    """Messages handled at once, one task each: 1 to 1024."""
    max_queue: Annotated[int, Field(ge=1, le=10_000_000)] = bus.DEFAULT_MAX_QUEUE
    """Messages the mailbox holds before ``overflow`` applies: 1 to 10,000,000."""
    overflow: bus.Overflow = "block"
    block_timeout: _Seconds = bus.DEFAULT_BLOCK_TIMEOUT
    """Seconds a publisher waits on a full mailbox (``overflow: block``): 0 to an hour."""
    retry: RetryConfig = RetryConfig()
    breaker: BreakerConfig | None = BreakerConfig()
    """``null`` in the file disables the consumer-side breaker."""
    settings: dict[str, Any] = Field(default_factory=dict)


# -- faults ------------------------------------------------------------------------------------


class FaultMarkConfig(_Model):
    """A point on the run's timeline, ``{seconds: 2}`` or ``{messages: 300}``: seconds since
    the run started, or the run's inputs taken in before the one a message comes from
    (counted per input topic, in the order the Observer published them: ``{messages: 400}``
    is where the 401st email and everything it causes begin). The number travels in the
    input's id to every message it causes, so every process of a ZeroMQ or NATS run counts
    as one process does. A ``messages`` bound splits the inputs the same way on every run;
    a ``seconds`` bound depends on the run's speed. A redrive continues its
    original run's timeline (it happens later), so a window that ended during the run is
    over for the redrive too."""

    seconds: _RunSeconds | None = None
    """Seconds into the run: 0 to a week."""
    messages: Annotated[int, Field(ge=0, le=_MAX_MESSAGES)] | None = None
    """Inputs taken in before: 0 to a billion."""

    @model_validator(mode="after")
    def _one(self) -> FaultMarkConfig:
        if (self.seconds is None) == (self.messages is None):
            raise ValueError("give seconds or messages, exactly one")
        return self


class AgentFaultConfig(_Model):
    """Injected into one agent's handling: random failures and added latency, for the
    whole run or within a window (``from`` included, ``until`` excluded)."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", populate_by_name=True, serialize_by_alias=True
    )

    failure_rate: _Fraction = 0.0
    latency_ms: Annotated[float, Field(ge=0, le=_HOUR * 1000)] = 0.0
    """Milliseconds added to each handling: 0 to an hour's worth."""
    tool: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    """Only calls of this tool fail: a tool of the Actor the fault names (``reply``,
    ``ticket``, ``escalate`` or one of its ``settings.tools``), checked at load; ``None``:
    the agent's handling of each message may fail."""
    from_: FaultMarkConfig | None = Field(default=None, alias="from")
    """Where the fault starts (``None``: from the start of the run)."""
    until: FaultMarkConfig | None = None
    """Where it ends (``None``: never); a redrive after it gets through."""

    @model_validator(mode="after")
    def _ordered(self) -> AgentFaultConfig:
        a, b = self.from_, self.until
        if a is not None and b is not None:
            same = (a.seconds is None) == (b.seconds is None)
            if same and (a.seconds or a.messages or 0) >= (b.seconds or b.messages or 0):
                raise ValueError("`from` must come before `until`: the window would be empty")
        return self


class FloodConfig(_Model):
    """A runaway publisher: ``count`` extra messages on ``topic`` at ``rate`` per second."""

    topic: _Topic
    rate: Annotated[float, Field(gt=0, le=1_000_000)]
    """Messages per second: above 0, at most a million."""
    count: Annotated[int, Field(gt=0, le=10_000_000)]
    """Messages in all: 1 to 10,000,000."""
    priority: Literal["critical", "high", "normal"] = "normal"


class KillNodeConfig(_Model):
    """Kill ZeroMQ node ``node`` ``at`` seconds into the run."""

    node: _AgentName
    at: _RunSeconds
    """Seconds into the run: 0 to a week."""


class FaultsConfig(_Model):
    agents: dict[str, AgentFaultConfig] = Field(default_factory=dict)
    flood: FloodConfig | None = None
    kill_node: KillNodeConfig | None = None


# -- expectations ------------------------------------------------------------------------------


def _p99_kind(value: Any) -> str:
    return "@per_agent" if isinstance(value, Mapping) else "@all"


#: One bound in milliseconds for every agent, or a bound per agent name.
_LatencyBound = Annotated[
    Annotated[_PositiveFloat, Tag("@all")]
    | Annotated[dict[str, _PositiveFloat], Tag("@per_agent")],
    Discriminator(_p99_kind),
]

#: One accuracy bound for every decision field, or a bound per field name.
_AccuracyBound = Annotated[
    Annotated[_Fraction, Tag("@all")] | Annotated[dict[str, _Fraction], Tag("@per_agent")],
    Discriminator(_p99_kind),
]

#: Why a message is dead-lettered (:data:`bus.DeadLetterReason`, where the list is kept).
DEAD_LETTER_REASONS: tuple[str, ...] = typing.get_args(DeadLetterReason)

#: A topic, or a token pattern over topics as subscriptions take them (``action.*``,
#: ``action.>``).
_TopicPattern = _Pattern


class CountBound(_Model):
    """A count that must lie in ``[min, max]``; either end may be left open, not both."""

    min: Annotated[int, Field(ge=0)] | None = None
    max: Annotated[int, Field(ge=0)] | None = None

    @model_validator(mode="after")
    def _sane(self) -> CountBound:
        if self.min is None and self.max is None:
            raise ValueError("give min, max or both")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) exceeds max ({self.max}): no count could pass")
        return self

    def admits(self, n: int) -> bool:
        return (self.min is None or n >= self.min) and (self.max is None or n <= self.max)

    def __str__(self) -> str:
        if self.min is None:
            return f"<= {self.max}"
        if self.max is None:
            return f">= {self.min}"
        return f"in [{self.min}, {self.max}]"


class ExpectConfig(_Model):
    """Checked after the run; any failing one makes ``pantheon run`` exit non-zero.

    ``None`` (the default for each) means not checked. Latency bounds are timing checks:
    they hold on a quiet machine and say little on a loaded one, so their names say so.
    """

    max_p99_ms: _LatencyBound | None = None
    """Bound on p99 queue wait + p99 handling per subscription (the sum bounds the hop's own
    p99 from above): one number for every agent, or a bound per agent name."""
    p99_handling_ms: _LatencyBound | None = None
    """Bound on each agent's p99 handling time alone (``timing: p99 handling ...``)."""
    p99_queue_wait_ms: _LatencyBound | None = None
    """Bound on each agent's p99 wait in its mailbox alone (``timing: p99 queue wait ...``)."""
    zero_lost: bool = False
    """Every message published is accounted for: delivered, dead-lettered or shed."""
    max_dlq: Annotated[int, Field(ge=0)] | None = None
    """Dead letters of every reason but ``shed``."""
    dlq: dict[DeadLetterReason, CountBound] = Field(default_factory=dict)
    """Dead letters by reason: ``{failed: {max: 0}, shed: {max: 100}}``."""
    topics: dict[_TopicPattern, CountBound] = Field(default_factory=dict)
    """Messages published per topic or glob (summed over matching topics)."""
    min_accuracy: _AccuracyBound | None = None
    """The share of decisions that match the input's labels, per decision field of the
    team's ``outcome``: one bound every field must reach, or a bound per field
    (``{action: 0.8}``)."""
    max_breaker_trips: Annotated[int, Field(ge=0)] | None = None
    min_throughput: Annotated[float, Field(ge=0)] | None = None
    """Messages per second over the run."""
    max_tokens: Annotated[int, Field(ge=0)] | None = None
    """Model tokens, input and output together (the summary's ``usage``)."""
    max_cost_usd: Annotated[float, Field(ge=0)] | None = None
    """Model cost in US dollars (the summary's ``usage``)."""
    strict_timing: bool = False
    """Fail a timing check the machine may have made late (``inconclusive``: the process
    waited for a CPU for a large share of the run, the handlers' own time, less their waits
    for a CPU, within the bound) instead of passing it with a note: for a dedicated CI
    machine, where no other work should be running. ``pantheon run --strict-timing`` sets
    it for one run."""
    custom: tuple[_CallablePath, ...] = ()
    """``module:function`` checks, each called with the run summary: ``True``/``None``
    pass, ``False`` fails, a string fails with that message, ``(passed, message)`` says
    both; an exception fails with its message."""


class OutcomeConfig(_Model):
    """What an item's outcome is, in the team's own terms (``agents.OutcomeSpec``).

    The run summary, ``min_accuracy``, the Learner, ``pantheon diff`` and what-if read every
    decision through it. Without this section an item's outcome is the last message of its
    causal tree on a topic no agent subscribes to, and its decision the fields that message
    adds to or changes from the input record."""

    topics: Annotated[tuple[_TopicPattern, ...], Field(min_length=1)]
    """The topics (or globs) of the messages that carry an item's outcome; the last one
    naming an item is its outcome."""
    key: str | None = None
    """The payload field naming the item; default: the input's ``key`` field."""
    fields: tuple[str, ...] = ()
    """The payload fields that are the decision (``[action]``): what accuracy scores and
    what-if groups by. Empty: every field but the key."""
    label: str | None = None
    """The input's label field (its ground truth), said again for the reader; when the
    input names one it must be the same (an input without ``label`` scores nothing)."""
    rejected: str = "reject"
    """The decision of a record the input refused (published on its ``malformed_topic``),
    in every field: what labels say of a record the team should refuse."""


class ObservabilityConfig(_Model):
    """OpenTelemetry defaults for this scenario. Where spans and metrics go is the
    environment's choice (``OTEL_*`` variables; nothing is exported without them), and
    ``OTEL_TRACES_SAMPLER``/``_ARG`` override ``sampling``."""

    sampling: _Fraction | None = None
    """Share of input messages traced, each with everything it causes (default 1.0)."""
    metrics: bool = True
    """Export the bus's counters when a metrics exporter is configured."""


# -- the scenario ------------------------------------------------------------------------------


class Scenario(_Model):
    """A validated scenario. Build one with :func:`load_scenario` or :func:`parse_scenario`."""

    version: int
    name: str = Field(pattern=_NAME)
    description: str = ""
    seed: Annotated[int, Field(ge=-(2**63), lt=2**63)] = 0
    """Seeds every random choice of the run; a signed 64-bit integer (it is stored as one)."""
    path: tuple[str, ...] = ()
    """Folders (relative to the scenario's) to import the team's modules from, besides the
    scenario's own folder."""
    transport: _Transport = InProcessTransportConfig()
    provider: _Provider = RulesProviderConfig()
    policy: PolicyConfig = PolicyConfig()
    approvals: ApprovalsConfig = ApprovalsConfig()
    prices: dict[str, PriceConfig] = Field(default_factory=dict)
    """Model name (as the server reports it) -> price per million tokens; a run's cost is
    counted from these, and a model missing here is counted in tokens only."""
    budget: BudgetConfig = BudgetConfig()
    """Live limits on model tokens and cost, run-wide and per agent."""
    input: _Input
    agents: dict[_AgentName, AgentConfig] = Field(default_factory=dict, validate_default=True)
    """The team, in the file's order: only the agents listed here run."""
    faults: FaultsConfig = FaultsConfig()
    outcome: OutcomeConfig | None = None
    """What the team decides per item (see :class:`OutcomeConfig`)."""
    expect: ExpectConfig = ExpectConfig()
    observability: ObservabilityConfig = ObservabilityConfig()
    gateway: GatewayConfig | None = None
    """The HTTP/WebSocket gateway this run exposes; none unless given."""

    _text: str = PrivateAttr(default="")
    _source: str = PrivateAttr(default="<string>")
    _base_dir: Path | None = PrivateAttr(default=None)

    @field_validator("version", mode="before")
    @classmethod
    def _supported(cls, value: Any) -> Any:
        if type(value) is not int or value != SCENARIO_VERSION:
            raise ValueError(
                f"unsupported scenario version {value!r}: this Pantheon reads version "
                f"{SCENARIO_VERSION}"
            )
        return value

    @field_validator("agents", mode="after")
    @classmethod
    def _roles(cls, agents: dict[str, AgentConfig]) -> dict[str, AgentConfig]:
        # A built-in name with no class or handler is its own role.
        team = {
            name: cfg.model_copy(update={"role": name})
            if name in ROLES and cfg.role is None and cfg.class_ is None and cfg.handler is None
            else cfg
            for name, cfg in agents.items()
        }
        # The Observer is what reads `input`: a team that lists none gets the built-in one,
        # or its input would go nowhere.
        if "observer" not in team and not any(_observes(n, c) for n, c in team.items()):
            team = {"observer": AgentConfig(role="observer"), **team}
        return team

    @model_validator(mode="before")
    @classmethod
    def _cross_checks(cls, data: Any, info: ValidationInfo) -> Any:
        _import_roots(data, (info.context or {}).get("base_dir"))
        # A recorded scenario rebuilt for a replay serves every model answer from the record:
        # which provider it would have asked does not matter there.
        check_model = (info.context or {}).get("check_files", True)
        problems = _cross_field_problems(data, check_model=check_model)
        sink = (info.context or {}).get("cross_problems")
        if sink is not None:
            sink.extend(problems)  # the loader reports them beside the field errors
        elif problems:
            raise ValueError("; ".join(f"{dotted(loc)}: {msg}" for loc, msg in problems))
        return data

    @property
    def text(self) -> str:
        """The YAML text this scenario was read from (stored with each session)."""
        return self._text

    @property
    def base_dir(self) -> Path | None:
        """The folder relative paths and the team's own modules are taken from (the scenario
        file's folder); ``None`` for a scenario parsed from a string without one."""
        return self._base_dir

    @property
    def source(self) -> str:
        """Where the text came from: the path as given to :func:`load_scenario`, or a label."""
        return self._source

    @property
    def scored(self) -> bool:
        """Whether a run of this team is scored (an accuracy, ``min_accuracy``): its input
        has labels or it declares its outcome."""
        return self.input.label is not None or self.outcome is not None

    def outcome_spec(self) -> OutcomeSpec:
        """The team's outcome for :class:`agents.Outcomes`: its ``outcome:`` section; else,
        for a team with a Learner, the one the Learner has always scored (the Actor's
        ``action.executed`` by its ``key`` setting, deciding ``action``), so sessions
        recorded before ``outcome:`` existed read as they did; else the default (the last
        message of each item's tree on a leaf topic)."""
        inp = self.input
        malformed = getattr(inp, "malformed_topic", None)
        o = self.outcome
        if o is not None:
            return OutcomeSpec(
                topics=o.topics,
                key=o.key or inp.key,
                fields=o.fields,
                input_key=inp.key,
                malformed_topic=malformed,
                rejected=o.rejected,
            )
        classes = {n: agent_class(n, c) for n, c in self.agents.items() if c.enabled}
        if any(issubclass(c, Learner) for c in classes.values()):
            key = next(
                (
                    str(self.agents[n].settings.get("key", "email_id"))
                    for n, c in classes.items()
                    if issubclass(c, Actor)
                ),
                "email_id",
            )
            return OutcomeSpec(
                topics=("action.executed",),
                key=key,
                fields=("action",),
                input_key=inp.key,
                malformed_topic=malformed,
            )
        return OutcomeSpec(key=inp.key, input_key=inp.key, malformed_topic=malformed)

    def agent(self, name: str) -> AgentConfig:
        """The configuration of agent ``name`` (``KeyError`` naming the scenario if the team
        has no such agent)."""
        try:
            return self.agents[name]
        except KeyError:
            raise KeyError(f"no agent {name!r} in scenario {self.name!r}") from None

    def hosts(self) -> dict[str, tuple[str, ...]]:
        """The run's processes, each with the agents it runs: the driver
        (:data:`DRIVER_NODE`) first, with every enabled agent no node places, then the nodes
        of ``transport.nodes`` in order, then the processes ``transport.standby`` adds; a
        standby is appended to its process's agents.

        The one answer to "which processes does this run have": the placement starts them,
        the recorder accepts their journals and the live feed their parts, both numbering
        their dead letters by position here. A process another list left out would run
        with its record dropped."""
        cfg = self.transport
        nodes = {} if isinstance(cfg, InProcessTransportConfig) else dict(cfg.nodes)
        placed = {a for agents in nodes.values() for a in agents}
        enabled = (n for n, a in self.agents.items() if a.enabled and n not in placed)
        hosts = {DRIVER_NODE: tuple(enabled), **nodes}
        if isinstance(cfg, NatsTransportConfig):
            for host, agents in cfg.standby_hosts().items():
                hosts[host] = (*hosts.get(host, ()), *agents)
        return hosts

    def nodes(self) -> tuple[str, ...]:
        """The run's processes other than the driver, in :meth:`hosts` order: every one
        that ships its journal (none for an in-process run)."""
        return tuple(h for h in self.hosts() if h != DRIVER_NODE)


def _observes(name: str, cfg: AgentConfig) -> bool:
    """Whether agent ``name`` reads the scenario's input (its class is an Observer)."""
    if not cfg.enabled:
        return False
    try:
        return issubclass(agent_class(name, cfg), Observer)
    except (ValueError, KeyError):
        return False  # reported by the agent checks


def _import_roots(data: Any, base_dir: Path | None) -> None:
    """Make the team's modules importable before its agents are checked: the scenario's
    folder first, then its ``path:`` entries (relative to that folder)."""
    if base_dir is None:
        return
    roots = [Path(base_dir).resolve()]
    extra = data.get("path") if isinstance(data, Mapping) else None
    if isinstance(extra, list | tuple):
        roots += [(roots[0] / str(p)).resolve() for p in extra if isinstance(p, str)]
    add_import_roots(reversed(roots))  # each goes first: the scenario's folder ends first


def _outcome_problems(data: Mapping[str, Any]) -> list[tuple[tuple[Any, ...], str]]:
    """``outcome.label`` is the input's label field; ``min_accuracy`` bounds per field
    name decision fields the outcome declares."""
    out: list[tuple[tuple[Any, ...], str]] = []
    outcome = data.get("outcome")
    outcome = outcome if isinstance(outcome, Mapping) else {}
    inp = data.get("input")
    inp = inp if isinstance(inp, Mapping) else {}
    label, given = outcome.get("label"), inp.get("label")
    if label is not None and given is not None and label != given:
        out.append(
            (
                ("outcome", "label"),
                f"names label field {label!r}, but the input's label is {given!r}",
            )
        )
    expect = data.get("expect")
    bounds = expect.get("min_accuracy") if isinstance(expect, Mapping) else None
    fields = outcome.get("fields")
    if isinstance(bounds, Mapping):
        if not isinstance(fields, list | tuple) or not fields:
            out.append(
                (
                    ("expect", "min_accuracy"),
                    "a bound per field needs outcome.fields to say which fields are decisions",
                )
            )
        else:
            out.extend(
                (
                    ("expect", "min_accuracy", name),
                    f"{name!r} is not a decision field of the outcome "
                    f"(outcome.fields: {', '.join(map(str, fields))})"
                    f"{suggest(str(name), [str(f) for f in fields])}",
                )
                for name in bounds
                if name not in fields
            )
    return out


def _fault_problems(
    faults: Any, agents: Any, names: list[str]
) -> list[tuple[tuple[Any, ...], str]]:
    """``faults.agents`` against the team: a fault names an enabled agent (a disabled one
    never runs, so nothing would be injected), and a ``tool`` fault names a tool of an
    Actor (only an Actor's tool calls take one; any other agent would ignore it)."""
    if not isinstance(faults, Mapping):
        return []
    team = agents if isinstance(agents, Mapping) else {}
    out: list[tuple[tuple[Any, ...], str]] = []
    for name, fault in faults.items():
        if name not in names:
            continue  # an unknown agent, reported by the name check
        cfg = team.get(name)
        cfg = cfg if isinstance(cfg, Mapping) else {}
        here = ("faults", "agents", name)
        if cfg.get("enabled") is False:
            out.append(
                (
                    here,
                    f"agent {name!r} is disabled (agents.{name}.enabled: false), so a fault "
                    "on it injects nothing: enable the agent or remove the fault",
                )
            )
            continue
        tool = fault.get("tool") if isinstance(fault, Mapping) else None
        if not isinstance(tool, str):
            continue  # no tool, or a shape the field's own validation reports
        try:
            cls = agent_class(str(name), cfg)
        except (ImportError, ValueError, KeyError):
            continue  # reported by the agent checks
        if not issubclass(cls, Actor):
            out.append(
                (
                    (*here, "tool"),
                    f"{name!r} is a {cls.__name__}, not an Actor: only an Actor's tool calls "
                    "can be failed by tool; drop tool to fail its handling of each message",
                )
            )
            continue
        tools = actor_tools(cls, cfg.get("settings"))
        if tool not in tools:
            out.append(
                (
                    (*here, "tool"),
                    f"actor {name!r} has no tool {tool!r}{suggest(tool, tools)}; its tools: "
                    f"{', '.join(tools)}",
                )
            )
    return out


def actor_tools(cls: type[Actor], settings: Any) -> list[str]:
    """The tools an Actor of class ``cls`` runs with ``settings`` (raw): its built-in
    ``TOOLS``, then the ``tools`` its settings add."""
    tools = dict.fromkeys(cls.TOOLS)
    extra = settings.get("tools") if isinstance(settings, Mapping) else None
    if isinstance(extra, Mapping):
        tools.update(dict.fromkeys(str(t) for t in extra))
    return list(tools)


def _cross_field_problems(
    data: Any, *, check_model: bool = True
) -> list[tuple[tuple[Any, ...], str]]:
    """Checks that need more than one section, on the raw mapping.

    Raw, because they must run even when field validation fails elsewhere; each guards its
    own shape and leaves type errors to the fields.
    """
    if not isinstance(data, Mapping):
        return []
    out: list[tuple[tuple[Any, ...], str]] = []
    # The Observer joins a team that lists none (see Scenario._roles).
    names: list[str] = ["observer"]

    agents = data.get("agents")
    if isinstance(agents, Mapping):
        for name, cfg in agents.items():
            if isinstance(name, str) and name not in names:
                names.append(name)
            if not isinstance(cfg, Mapping):
                continue
            role = cfg.get("role")
            if name in ROLES and role is not None and role != name:
                out.append(
                    (
                        ("agents", name, "role"),
                        f"{name!r} is the built-in {name} agent and cannot take role "
                        f"{role!r}; give the extra instance its own name",
                    )
                )
                continue
            problems = agent_problems(str(name), cfg, cfg.get("settings"))
            out.extend(problems)
            if check_model and not problems and cfg.get("enabled", True) is not False:
                model = model_problem(str(name), cfg, data.get("provider"))
                out.extend([model] if model is not None else [])

    def check_names(loc: tuple[Any, ...], mapping: Any, what: str) -> None:
        if isinstance(mapping, Mapping):
            out.extend(
                ((*loc, key), f"{what} names unknown agent {key!r}{suggest(str(key), names)}")
                for key in mapping
                if key not in names
            )

    faults = data.get("faults")
    faults = faults if isinstance(faults, Mapping) else {}
    check_names(("faults", "agents"), faults.get("agents"), "a fault")
    if check_model:  # a recorded scenario rebuilt for a replay is taken as it ran
        out.extend(_fault_problems(faults.get("agents"), agents, names))
    budget = data.get("budget")
    if isinstance(budget, Mapping):
        check_names(("budget", "agents"), budget.get("agents"), "a budget")

    expect = data.get("expect")
    if isinstance(expect, Mapping):
        for bound in ("max_p99_ms", "p99_handling_ms", "p99_queue_wait_ms"):
            check_names(("expect", bound), expect.get(bound), "a latency bound")
    out.extend(_outcome_problems(data))

    transport = data.get("transport")
    transport = transport if isinstance(transport, Mapping) else {}
    kind = transport.get("kind", "inprocess")
    nodes = transport.get("nodes")
    if kind in ("zmq", "nats") and isinstance(nodes, Mapping):
        disabled = {
            name
            for name, cfg in (agents.items() if isinstance(agents, Mapping) else ())
            if isinstance(cfg, Mapping) and cfg.get("enabled") is False
        }
        standbys = transport.get("standby") if kind == "nats" else None
        for node, placed in nodes.items():
            covered = isinstance(standbys, Mapping) and bool(standbys.get(node))
            if isinstance(placed, list | tuple) and not placed and not covered:
                # Its process would start with nothing to run and end the run at once.
                out.append(
                    (
                        ("transport", "nodes", node),
                        f"node {node!r} hosts no agents: list the agents it runs, or remove it",
                    )
                )
            if node == DRIVER_NODE:
                out.append(
                    (
                        ("transport", "nodes", node),
                        f"node name {DRIVER_NODE!r} is reserved for the process that runs "
                        "the scenario (it hosts every agent not placed on a node)",
                    )
                )
            if isinstance(placed, list | tuple):
                for i, agent in enumerate(placed):
                    if agent not in names:
                        out.append(
                            (
                                ("transport", "nodes", node, i),
                                f"node {node!r} hosts unknown agent {agent!r}"
                                f"{suggest(str(agent), names)}",
                            )
                        )
                    elif agent in disabled:
                        out.append(
                            (
                                ("transport", "nodes", node, i),
                                f"node {node!r} hosts agent {agent!r}, which is disabled "
                                f"(agents.{agent}.enabled: false)",
                            )
                        )
                    elif agent in placed[:i]:
                        out.append(
                            (
                                ("transport", "nodes", node, i),
                                f"node {node!r} lists agent {agent!r} twice",
                            )
                        )

    inp = data.get("input")
    if isinstance(inp, Mapping) and inp.get("kind") == "http" and data.get("gateway") is None:
        out.append(
            (
                ("input", "kind"),
                "an http input is fed through the gateway: add a gateway: section",
            )
        )
    if data.get("gateway") is not None and kind == "zmq":
        out.append(
            (
                ("gateway",),
                "the gateway needs transport kind 'inprocess': it serves the bus of the "
                "process that runs the scenario, and a ZeroMQ run's agents are elsewhere",
            )
        )

    standby = transport.get("standby")
    if kind == "nats" and transport.get("standby_mode") == "warm" and not standby:
        out.append(
            (
                ("transport", "standby_mode"),
                "standby_mode: warm applies to standbys: add transport.standby (a process -> "
                "the agents it stands by for, or 'driver')",
            )
        )
    if kind == "nats" and isinstance(nodes, Mapping | None):
        out.extend(_standby_problems(standby, nodes or {}, names, agents))
        if isinstance(standby, Mapping):
            nodes = {**(nodes or {}), **{n: () for n in standby if n != DRIVER_NODE}}

    kill = faults.get("kill_node")
    if kill is not None:
        if kind not in ("zmq", "nats"):
            out.append(
                (
                    ("faults", "kill_node"),
                    f"kill_node needs transport kind 'zmq' or 'nats' (this scenario's is "
                    f"{kind!r}): "
                    "there is no node to kill in one process",
                )
            )
        elif isinstance(kill, Mapping) and isinstance(nodes, Mapping | None):
            node = kill.get("node")
            nodes = nodes or {}
            if node is not None and node not in nodes:
                out.append(
                    (
                        ("faults", "kill_node", "node"),
                        f"unknown node {node!r}{suggest(str(node), map(str, nodes))}; "
                        f"transport.nodes has {', '.join(map(str, nodes)) or 'no nodes'}",
                    )
                )
    return out


def _standby_problems(
    standby: Any, nodes: Mapping[Any, Any], names: list[str], agents: Any
) -> list[tuple[tuple[Any, ...], str]]:
    """``transport.standby`` against the placement: each standby names a known, enabled
    agent that ``transport.nodes`` places on another process, once per process."""
    if not isinstance(standby, Mapping):
        return []  # "driver", or a shape the field's own validation reports
    disabled = {
        name
        for name, cfg in (agents.items() if isinstance(agents, Mapping) else ())
        if isinstance(cfg, Mapping) and cfg.get("enabled") is False
    }
    placed: dict[Any, list[Any]] = {}
    for node, hosted in nodes.items():
        for agent in hosted if isinstance(hosted, list | tuple) else ():
            placed.setdefault(agent, []).append(node)
    out: list[tuple[tuple[Any, ...], str]] = []
    for node, listed in standby.items():
        if isinstance(listed, list | tuple) and not listed:
            out.append(
                (
                    ("transport", "standby", node),
                    f"standby on {node!r} lists no agents: list the agents of transport.nodes "
                    "it stands by for, or remove it",
                )
            )
        for i, agent in enumerate(listed if isinstance(listed, list | tuple) else ()):
            if agent not in names:
                why = f"standby on {node!r} names unknown agent {agent!r}"
                why += suggest(str(agent), names)
            elif agent in disabled:
                why = (
                    f"standby on {node!r} names agent {agent!r}, which is disabled "
                    f"(agents.{agent}.enabled: false)"
                )
            elif agent not in placed:
                why = (
                    f"agent {agent!r} is not placed on a node (the driver hosts it): a "
                    "standby covers an agent of transport.nodes"
                )
            elif node in placed[agent]:
                why = (
                    f"node {node!r} already hosts agent {agent!r} (transport.nodes): a "
                    "standby must be another process"
                )
            elif agent in listed[:i]:
                why = f"standby on {node!r} lists agent {agent!r} twice"
            else:
                continue
            out.append((("transport", "standby", node, i), why))
    return out
