"""Import paths in scenarios: ``"myteam.agents:Triage"``, a team's own folder, entry points.

A team is a folder with a YAML file and a Python module, nothing installed: the scenario's
folder (and each ``path:`` entry) goes on ``sys.path`` when the scenario is loaded, so its
modules import like any other. An installed package adds agents, providers and inputs
through entry points (groups :data:`AGENT_GROUP`, :data:`PROVIDER_GROUP`,
:data:`INPUT_GROUP`), named in a scenario by their entry-point name instead of a path.

Errors are :class:`ImportProblem` with a one-line message meant to sit after
``file:line:col: field:`` in a scenario error; the loader adds the location.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from pantheon._errors import PantheonError

__all__ = [
    "AGENT_GROUP",
    "INPUT_GROUP",
    "PROVIDER_GROUP",
    "ImportProblem",
    "add_import_roots",
    "import_path",
    "load_object",
]

AGENT_GROUP = "pantheon.agents"
PROVIDER_GROUP = "pantheon.providers"
INPUT_GROUP = "pantheon.inputs"


class ImportProblem(PantheonError, ValueError):
    """An import path that does not lead to a usable object; the message says why."""


def add_import_roots(roots: Iterable[Path]) -> None:
    """Put each folder first on ``sys.path`` (once), so a team's own modules win over an
    installed module of the same name. Modules already imported stay as they are: a
    process imports a module once, so two teams must not share a module name."""
    for root in roots:
        entry = str(root)
        if entry not in sys.path:
            sys.path.insert(0, entry)


def load_object(spec: str, *, group: str | None = None) -> Any:
    """The object ``spec`` names: ``"package.module:attr"`` (``attr`` may be dotted), or,
    without a colon, the entry point of that name in ``group``."""
    module_name, colon, attr = spec.partition(":")
    if not colon:
        if group is not None:
            found = entry_points(group=group, name=spec)
            for ep in found:
                try:
                    return ep.load()
                except Exception as exc:
                    raise ImportProblem(
                        f"entry point {spec!r} ({ep.value}) of {group} failed to load: "
                        f"{type(exc).__name__}: {exc}"
                    ) from None
            names = sorted(ep.name for ep in entry_points(group=group))
            have = f"; installed: {', '.join(names)}" if names else ""
            raise ImportProblem(
                f"{spec!r} is neither an import path 'module:name' nor an entry point of "
                f"{group}{have}"
            )
        raise ImportProblem(f"{spec!r} is not an import path: write it as 'module:name'")
    if not module_name or not attr:
        raise ImportProblem(f"{spec!r} is not an import path: write it as 'module:name'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            raise ImportProblem(
                f"cannot import module {module_name!r}: no such module on the scenario's "
                "folder, its path: entries or the installed packages"
            ) from None
        raise ImportProblem(
            f"importing module {module_name!r} failed: ModuleNotFoundError: {exc}"
        ) from None
    except Exception as exc:
        raise ImportProblem(
            f"importing module {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ImportProblem(f"module {module_name!r} has no attribute {attr!r}") from None
    return obj


def import_path(spec: str, base_dir: Path | None = None, *, group: str | None = None) -> Any:
    """The object ``spec`` (``"package.module:name"``, or an entry point's name in
    ``group``) names, with ``base_dir`` (the scenario's folder) importable, resolved as
    agents' ``class:`` paths are (:func:`load_object`).

    Raises :class:`ImportProblem` saying whether the path is malformed, the module cannot be
    found, importing it raised, or the attribute is missing.
    """
    if base_dir is not None:
        add_import_roots([base_dir])
    module_name = spec.partition(":")[0]
    if module_name and module_name not in sys.modules:
        importlib.invalidate_caches()  # a module written since its folder was last listed
    return load_object(spec, group=group)
