"""The check the teams of ``scenarios/`` are held to: Pantheon's public API and nothing else
(no module or name that starts with ``_``, no ``internals`` module, and from our packages
only what a public module's ``__all__`` exports)."""

from __future__ import annotations

import ast
import importlib

__all__ = ["private_imports"]

OURS = ("agents", "bus", "pantheon", "dashboard")
# Not ours, and every module may use it.
ALLOWED_DUNDER = {"__future__"}
# A room's face for its sibling rooms (``pantheon.scenario.internals``): Pantheon's own.
INTERNAL = "internals"


def _hidden(part: str) -> bool:
    return part.startswith("_") or part == INTERNAL


def private_imports(source: str) -> list[str]:
    """Every import in ``source`` of a private module or name, or of a name our packages do
    not export, described as ``line: what``."""
    problems: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if any(_hidden(p) for p in parts) and alias.name not in ALLOWED_DUNDER:
                    problems.append(f"{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            parts = [p for p in module.split(".") if p]
            if module not in ALLOWED_DUNDER and any(_hidden(p) for p in parts):
                problems.append(f"{node.lineno}: from {module} import ...")
                continue
            for alias in node.names:
                if _hidden(alias.name) and module not in ALLOWED_DUNDER:
                    problems.append(f"{node.lineno}: from {module} import {alias.name}")
                elif parts and parts[0] in OURS:
                    exported = getattr(importlib.import_module(module), "__all__", ())
                    if alias.name not in exported:
                        problems.append(
                            f"{node.lineno}: from {module} import {alias.name} "
                            f"(not in {module}.__all__)"
                        )
    return problems
