"""Our packages' import graph, read from the source with ``ast`` (nothing is imported): what
the structure test holds the tree to (no circles, no private module of another package)."""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ROOT", "Import", "cycles", "imports_of", "modules", "private_owner", "read_graph"]

ROOT = Path(__file__).resolve().parents[2]
#: Our packages: imports of anything else are not edges.
OURS = ("bus", "agents", "pantheon", "dashboard")


@dataclass(frozen=True, slots=True)
class Import:
    """One module ``source`` imports (``target``, a module of ours), at ``line``."""

    source: str
    target: str
    line: int


def modules(root: Path = ROOT, packages: Iterable[str] = OURS) -> dict[str, Path]:
    """Every module of ``packages`` by dotted name (a package by its ``__init__``)."""
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _type_checking_only(tree: ast.Module) -> set[int]:
    """The ids of the nodes under ``if TYPE_CHECKING:``: never executed, so no edge."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                skipped.update(id(n) for n in ast.walk(child))
    return skipped


def imports_of(name: str, source: str, known: Collection[str], is_package: bool) -> list[Import]:
    """The modules of ours module ``name`` imports, at its top level or inside a function
    (a lazy import closes a circle all the same), ``TYPE_CHECKING`` blocks aside.
    ``from a import b`` is an import of ``a.b`` when that is a module or ``b`` is private,
    else of ``a``."""
    tree = ast.parse(source)
    skipped = _type_checking_only(tree)
    found: list[Import] = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.extend(
                Import(name, a.name, node.lineno)
                for a in node.names
                if a.name.split(".")[0] in OURS
            )
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            if module.split(".")[0] not in OURS:
                continue
            for alias in node.names:
                # A private name stays in the target, so that its owner can be told.
                child = f"{module}.{alias.name}"
                private = alias.name.startswith("_")
                target = child if child in known or private else module
                found.append(Import(name, target, node.lineno))
    return found


def read_graph(root: Path = ROOT, packages: Iterable[str] = OURS) -> list[Import]:
    """Every import between our modules."""
    known = modules(root, packages)
    return [
        edge
        for name, path in known.items()
        for edge in imports_of(
            name, path.read_text(encoding="utf-8"), known, path.name == "__init__.py"
        )
    ]


def cycles(edges: Iterable[Import], known: Iterable[str]) -> list[list[str]]:
    """The import circles: groups of modules each reachable from every other (Tarjan's
    strongly connected components of more than one module). Importing ``a.b.c`` also runs
    ``a.b``'s ``__init__``, so it is an edge to every package on the way, except the
    importer's own enclosing packages (already running when it is imported)."""
    names = set(known)
    graph: dict[str, set[str]] = {n: set() for n in names}
    for edge in edges:
        parts = edge.target.split(".")
        for i in range(1, len(parts) + 1):
            step = ".".join(parts[:i])
            if step in names and step != edge.source and not edge.source.startswith(step + "."):
                graph[edge.source].add(step)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:
        # Iterative: the graph is deeper than Python's default recursion limit allows for.
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return found


def private_owner(target: str) -> str | None:
    """The package a private module belongs to (``pantheon.sessions`` for
    ``pantheon.sessions._store``), or None when ``target`` names no private module."""
    parts = target.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not (part.startswith("__") and part.endswith("__")):
            return ".".join(parts[:i])
    return None
