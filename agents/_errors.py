"""The root of every error the agents raise on purpose, so a caller can catch the family.

::

    AgentError
    ├── ProviderError                 the model provider failed or answered something unusable
    │   ├── ProviderUnavailable       the server could not be reached, after retries
    │   └── ProviderResponseError     an HTTP error status (after retries), or an unusable answer
    │       └── ToolArgumentsNotJSON  a tool called with arguments that are no JSON object
    ├── BudgetExceeded                a model call refused: its run's or agent's budget is spent
    ├── BudgetUnavailable             a model call not admitted: its budget's ledgers unreachable
    ├── MCPServerError                an MCP server failed a start or a tool call
    │   ├── MCPServerUnavailable      it could not be started or reached, or it died
    │   ├── MCPToolTimeout            a call had no answer within its timeout
    │   └── MCPToolError              the tool answered an error (isError) or was refused
    ├── ApprovalUnavailable           nobody can be asked, or the request cannot be shown
    ├── ToolError                     a tool could not be made from what was given, or called
    │   └── ToolArgumentsInvalid      the model's arguments do not fit the tool's parameters
    ├── ModelAgentError               a model agent's conversation could not finish
    │   ├── AnswerInvalid             no answer fitted the output type, or tool arguments not JSON
    │   ├── TooManyTurns              max_turns model calls without a final answer
    │   ├── TooManyToolErrors         more failed tool calls than max_tool_errors
    │   ├── TemplateError             a template is malformed or names a missing field
    │   ├── OutputSchemaInvalid       an inline JSON schema output the check cannot honour
    │   └── AgentStopping             a message needed the tool sources after the agent's stop
    └── InjectedFault                 a scenario's fault injection failed this call

Each keeps ``RuntimeError`` as a second base, as it had before the root existed, so code
that caught that goes on working (``TemplateError`` and ``OutputSchemaInvalid`` are
``ValueError`` subclasses too). The classes stay in the modules that raise them
(``_providers``, ``_approvals``, ``_base``, ``_tools``, ``_model_agent``, ``_budget``): a
session records an error by its qualified type name (``agents._base.InjectedFault``), and
moving a class would make a diff of an older session against a newer one report a different
error where nothing changed.
"""

from __future__ import annotations

__all__ = ["AgentError"]


class AgentError(Exception):
    """Root of every error an agent, a provider or an approval desk raises on purpose."""
