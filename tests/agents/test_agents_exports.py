"""The public face of ``agents``: generic roles and one exception root, :class:`AgentError`."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import types

import agents
from agents import _errors as errors_module


def test_all_is_exactly_the_public_names() -> None:
    public = {
        name
        for name, value in vars(agents).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert len(agents.__all__) == len(set(agents.__all__))
    assert set(agents.__all__) == public


def test_every_exception_the_agents_define_is_an_agent_error_and_exported() -> None:
    defined: set[type[BaseException]] = set()
    for info in pkgutil.walk_packages(agents.__path__, "agents."):
        module = importlib.import_module(info.name)
        defined |= {
            obj
            for obj in vars(module).values()
            if inspect.isclass(obj)
            and issubclass(obj, BaseException)
            and obj.__module__.startswith("agents.")
        }
    assert {c.__name__ for c in defined} >= {
        "AgentError",
        "ProviderError",
        "ApprovalUnavailable",
        "InjectedFault",
    }
    for cls in defined:
        assert issubclass(cls, agents.AgentError), cls
        assert getattr(agents, cls.__name__) is cls, f"{cls.__name__} is not exported"
        assert cls.__name__ in (errors_module.__doc__ or ""), f"{cls.__name__} is not drawn"
    exported = [getattr(agents, n) for n in agents.__all__]
    for obj in exported:
        if inspect.isclass(obj) and issubclass(obj, BaseException):
            assert issubclass(obj, agents.AgentError), obj


def test_runtime_error_stays_a_base_callers_catch() -> None:
    for cls in (agents.ProviderError, agents.ApprovalUnavailable, agents.InjectedFault):
        assert issubclass(cls, RuntimeError), cls
    assert issubclass(agents.ProviderUnavailable, agents.ProviderError)
    assert issubclass(agents.ProviderResponseError, agents.ProviderError)
