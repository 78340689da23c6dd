"""The check the teams of ``scenarios/`` are held to: Pantheon's public API and nothing else
(no module or name that starts with ``_``, and from our packages only what a public
module's ``__all__`` exports)."""

from __future__ import annotations

import ast
import importlib

__all__ = ["private_imports"]

OURS = ("agents", "bus", "pantheon", "dashboard")
# Not ours, and every module may use it.
ALLOWED_DUNDER = {"__future__"}


def private_imports(source: str) -> list[str]:
    """Every import in ``source`` of a private module or name, or of a name our packages do
    not export, described as ``line: what``."""
    problems: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if any(p.startswith("_") for p in parts) and alias.name not in ALLOWED_DUNDER:
                    problems.append(f"{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            parts = [p for p in module.split(".") if p]
            if module not in ALLOWED_DUNDER and any(p.startswith("_") for p in parts):
                problems.append(f"{node.lineno}: from {module} import ...")
                continue
            for alias in node.names:
                if alias.name.startswith("_") and module not in ALLOWED_DUNDER:
                    problems.append(f"{node.lineno}: from {module} import {alias.name}")
                elif parts and parts[0] in OURS:
                    exported = getattr(importlib.import_module(module), "__all__", ())
                    if alias.name not in exported:
                        problems.append(
                            f"{node.lineno}: from {module} import {alias.name} "
                            f"(not in {module}.__all__)"
                        )
    return problems
