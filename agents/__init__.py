"""The nine agent roles of a Pantheon team and the base class they share.

Perception: Observer, Monitor, Sensor. Cognition: Reasoner, Planner, Memory.
Action: Guardian, Actor, Learner. Agents talk only through the bus; anything
non-deterministic goes through :meth:`Agent.effect` so sessions replay exactly.

A team gives the roles its own logic by settings: what the Sensor extracts, the question the
Reasoner asks and the actions its answers call for, what the Guardian redacts, the intents
the Learner tunes, as the support desk does from ``scenarios/support/`` and the on-call team
from ``scenarios/oncall/``. Every error they raise on purpose derives from
:class:`AgentError` (the tree is drawn in :mod:`agents._errors`).
"""

from agents._action import Actor, Guardian, Learner, Outbox
from agents._anthropic import AnthropicProvider
from agents._approvals import (
    APPROVAL_EFFECT,
    ApprovalDesk,
    ApprovalUnavailable,
    Decision,
    check_approval_request,
)
from agents._base import (
    Agent,
    AgentOptions,
    AgentSettings,
    AgentUsage,
    Fault,
    FaultMark,
    FaultTimeline,
    FunctionAgent,
    Handler,
    InjectedFault,
    Prices,
    UsageMeter,
    attach_desk,
    fault_timeline,
    handler_arity,
    total_usage,
)
from agents._budget import (
    BUDGET_EFFECT,
    RUN_SCOPE,
    Budget,
    BudgetExceeded,
    BudgetGuard,
    BudgetLedger,
    BudgetState,
    BudgetUnavailable,
    budget_guards,
)
from agents._cognition import Memory, Planner, Reasoner
from agents._effects import Effects, LiveEffects, RequestIdentity
from agents._errors import AgentError
from agents._mcp import (
    MCPServer,
    MCPServerError,
    MCPServerUnavailable,
    MCPTool,
    MCPToolError,
    MCPToolTimeout,
)
from agents._model_agent import (
    AgentStopping,
    AnswerInvalid,
    ModelAgent,
    ModelAgentError,
    OutputSchemaInvalid,
    Template,
    TemplateError,
    TooManyToolErrors,
    TooManyTurns,
)
from agents._ordinals import InputOrdinals, input_ordinal
from agents._outcomes import (
    Outcomes,
    OutcomeScore,
    OutcomeSpec,
    decision_text,
    label_decision,
    score_decisions,
)
from agents._perception import (
    DEFAULT_MAX_LABELS,
    InputItem,
    Labels,
    Monitor,
    Observer,
    Sensor,
)
from agents._providers import (
    ChatResult,
    ModelProvider,
    OpenAIProvider,
    ProviderError,
    ProviderResponseError,
    ProviderUnavailable,
    RuleProvider,
    SupportsChat,
    ToolArgumentsNotJSON,
    ToolCall,
    Usage,
)
from agents._ratelimit import RateLimit, RateLimiter
from agents._tools import (
    FunctionTool,
    Tool,
    ToolArgumentsInvalid,
    ToolError,
    ToolSource,
    load_tools,
    tool,
    tool_schema,
)

#: Role name -> class, in pipeline order.
ROLES: dict[str, type[Agent]] = {
    cls.role: cls
    for cls in (Observer, Sensor, Memory, Reasoner, Planner, Guardian, Actor, Learner, Monitor)
}

__all__ = [
    "APPROVAL_EFFECT",
    "BUDGET_EFFECT",
    "DEFAULT_MAX_LABELS",
    "ROLES",
    "RUN_SCOPE",
    "Actor",
    "Agent",
    "AgentError",
    "AgentOptions",
    "AgentSettings",
    "AgentStopping",
    "AgentUsage",
    "AnswerInvalid",
    "AnthropicProvider",
    "ApprovalDesk",
    "ApprovalUnavailable",
    "Budget",
    "BudgetExceeded",
    "BudgetGuard",
    "BudgetLedger",
    "BudgetState",
    "BudgetUnavailable",
    "ChatResult",
    "Decision",
    "Effects",
    "Fault",
    "FaultMark",
    "FaultTimeline",
    "FunctionAgent",
    "FunctionTool",
    "Guardian",
    "Handler",
    "InjectedFault",
    "InputItem",
    "InputOrdinals",
    "Labels",
    "Learner",
    "LiveEffects",
    "MCPServer",
    "MCPServerError",
    "MCPServerUnavailable",
    "MCPTool",
    "MCPToolError",
    "MCPToolTimeout",
    "Memory",
    "ModelAgent",
    "ModelAgentError",
    "ModelProvider",
    "Monitor",
    "Observer",
    "OpenAIProvider",
    "Outbox",
    "OutcomeScore",
    "OutcomeSpec",
    "Outcomes",
    "OutputSchemaInvalid",
    "Planner",
    "Prices",
    "ProviderError",
    "ProviderResponseError",
    "ProviderUnavailable",
    "RateLimit",
    "RateLimiter",
    "Reasoner",
    "RequestIdentity",
    "RuleProvider",
    "Sensor",
    "SupportsChat",
    "Template",
    "TemplateError",
    "TooManyToolErrors",
    "TooManyTurns",
    "Tool",
    "ToolArgumentsInvalid",
    "ToolArgumentsNotJSON",
    "ToolCall",
    "ToolError",
    "ToolSource",
    "Usage",
    "UsageMeter",
    "attach_desk",
    "budget_guards",
    "check_approval_request",
    "decision_text",
    "fault_timeline",
    "handler_arity",
    "input_ordinal",
    "label_decision",
    "load_tools",
    "score_decisions",
    "tool",
    "tool_schema",
    "total_usage",
]
