"""One exception root for ``pantheon``: every error it raises on purpose is a
:class:`pantheon.PantheonError`, drawn in the tree of :mod:`pantheon._errors`, and the ones a
user catches around a run are exported by ``pantheon`` itself."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from types import ModuleType

import pantheon
from pantheon import PantheonError
from pantheon import _errors as errors_module
from pantheon.sessions import RecordedError


def pantheon_modules() -> list[ModuleType]:
    """Every module of the package, private ones too (``__main__`` runs a program)."""
    return [pantheon] + [
        importlib.import_module(info.name)
        for info in pkgutil.walk_packages(pantheon.__path__, "pantheon.")
        if info.name.rpartition(".")[2] != "__main__"
    ]


def public_faces() -> list[ModuleType]:
    """``pantheon`` and every sub-package whose dotted name has no private part."""
    return [
        m
        for m in pantheon_modules()
        if hasattr(m, "__path__") and not any(p.startswith("_") for p in m.__name__.split("."))
    ]


def exceptions_of(module: ModuleType) -> set[type[BaseException]]:
    return {
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj)
        and issubclass(obj, BaseException)
        and obj.__module__.split(".")[0] == "pantheon"
    }


def test_every_exported_exception_is_a_pantheon_error() -> None:
    exported: dict[str, type[BaseException]] = {}
    for face in public_faces():
        for name in face.__all__:
            obj = getattr(face, name)
            if inspect.isclass(obj) and issubclass(obj, BaseException):
                exported[f"{face.__name__}.{name}"] = obj
    # The faces export the families a user catches: the check saw them all.
    assert {"pantheon.ClusterError", "pantheon.sessions.SessionError"} <= set(exported)
    assert {"pantheon.testing.AgentFailed", "pantheon.gateway.TokenError"} <= set(exported)
    outside = {n for n, cls in exported.items() if not issubclass(cls, PantheonError)}
    # The one stand-in for the team's own exception on replay (see pantheon._errors).
    assert outside == {"pantheon.sessions.RecordedError"}


def test_every_public_exception_class_defined_anywhere_is_in_the_tree() -> None:
    defined = {
        cls
        for module in pantheon_modules()
        for cls in exceptions_of(module)
        if not cls.__name__.startswith("_")
    }
    # Raised by modules a user never imports (the gateway's inbox, `pantheon new`), yet
    # reaching a caller: they are in the family too.
    assert {"InboxFull", "InboxClosed", "TeamNameError"} <= {c.__name__ for c in defined}
    for cls in defined - {RecordedError}:
        assert issubclass(cls, PantheonError), cls
        assert cls.__name__ in (errors_module.__doc__ or ""), f"{cls.__name__} is not drawn"
    assert not issubclass(RecordedError, PantheonError)


def test_the_builtin_bases_callers_caught_before_stay() -> None:
    from pantheon.cli._scaffold import TeamNameError
    from pantheon.runner._inputs import InboxClosed, InboxFull
    from pantheon.testing import AgentFailed

    assert issubclass(TeamNameError, ValueError)
    assert issubclass(pantheon.ClusterError, RuntimeError)
    assert issubclass(AgentFailed, AssertionError)
    assert issubclass(InboxFull, Exception) and issubclass(InboxClosed, Exception)


def test_a_run_s_errors_are_caught_from_the_top_level_package() -> None:
    from pantheon.runner._multiprocess import ClusterError

    assert pantheon.ClusterError is ClusterError
    assert {"ScenarioError", "AgentSetupError", "ClusterError"} <= set(pantheon.__all__)
