"""Scenarios: the YAML file that says what a Pantheon run is, validated before anything starts.

A scenario names the agents and their settings, the transport, the input, the faults to inject
and the expectations that turn a run into a test (see ``docs`` and ``scenarios/*.yaml``). It is
read once, up front, so every mistake in it must be reported then, all at once, in the words
of the file: ``scenarios/bad.yaml:12:5: agents.actor.overflow: Input should be 'block', 'shed'
or 'reject'``. Hence the two halves of this module:

* immutable pydantic models (``frozen``, ``extra="forbid"``: a misspelt key is an error, never
  a silently ignored setting), whose field names are the contract the runtime codes against;
* a loader that composes the YAML node tree to remember where every key sits, validates, and
  maps each pydantic error location back to a line and column (:class:`ScenarioError`).

Checks that span sections (an expectation about an agent that does not exist, ``kill_node`` on
the in-process transport) run on the raw data beside field validation, so they are reported
together with the field errors instead of only after those are fixed.
Once the sections are valid, the fields a model agent reads of its messages (its template
fields and ``carry``) are checked against the records its input will send it, where those
are known before the run (a JSONL file, a generator's fixed payload): one that none of them
has is a located error, since every message would fail on it or go without it.

Whatever the file holds, loading it raises :class:`ScenarioError` or ``OSError`` and nothing
else: only :data:`MAX_SCENARIO_BYTES` (1 MiB) are read, nesting stops at
:data:`MAX_SCENARIO_DEPTH` levels, a control character or a number Python will not convert
is a located problem, and every numeric setting has an upper bound (in its docstring), so
``concurrency: 100000000`` fails here instead of exhausting memory in ``pantheon run``.
"""

from pantheon.scenario._load import load_scenario, parse_scenario, recorded_scenario
from pantheon.scenario._locate import MAX_SCENARIO_BYTES, MAX_SCENARIO_DEPTH, Problem, ScenarioError
from pantheon.scenario._schema import (
    DEAD_LETTER_REASONS,
    DRIVER_NODE,
    ROLES,
    SCENARIO_VERSION,
    SUPPORT_INBOX,
    AgentConfig,
    AgentFaultConfig,
    AnthropicProviderConfig,
    ApprovalsConfig,
    AutoApproverConfig,
    BreakerConfig,
    BudgetConfig,
    BudgetLimit,
    CountBound,
    CustomProviderConfig,
    DeadLetterReason,
    ExpectConfig,
    FaultMarkConfig,
    FaultsConfig,
    FileInputConfig,
    FloodConfig,
    GatewayConfig,
    GeneratorInputConfig,
    HttpInputConfig,
    InProcessTransportConfig,
    InputConfig,
    JsonlInputConfig,
    KillNodeConfig,
    NatsCredentials,
    NatsTransportConfig,
    ObservabilityConfig,
    OpenAIProviderConfig,
    OutcomeConfig,
    PolicyConfig,
    PriceConfig,
    ProviderConfig,
    RateLimitConfig,
    RetryConfig,
    Role,
    RulesProviderConfig,
    Scenario,
    StdinInputConfig,
    TransportConfig,
    ZmqTransportConfig,
)

__all__ = [
    "DEAD_LETTER_REASONS",
    "DRIVER_NODE",
    "MAX_SCENARIO_BYTES",
    "MAX_SCENARIO_DEPTH",
    "ROLES",
    "SCENARIO_VERSION",
    "SUPPORT_INBOX",
    "AgentConfig",
    "AgentFaultConfig",
    "AnthropicProviderConfig",
    "ApprovalsConfig",
    "AutoApproverConfig",
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
    "OutcomeConfig",
    "PolicyConfig",
    "PriceConfig",
    "Problem",
    "ProviderConfig",
    "RateLimitConfig",
    "RetryConfig",
    "Role",
    "RulesProviderConfig",
    "Scenario",
    "ScenarioError",
    "StdinInputConfig",
    "TransportConfig",
    "ZmqTransportConfig",
    "load_scenario",
    "parse_scenario",
    "recorded_scenario",
]
