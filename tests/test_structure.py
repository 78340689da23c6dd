"""The tree shows the architecture (#28): pantheon/ is a few top-level modules beside its
rooms (``cli``, ``runner``, ``approvals``, ``rerun``...), no modules import one another in a
circle, no module reaches into another package's private modules, and every room is entered
only through its faces (its ``__init__``, or a module without a leading ``_`` such as
``pantheon.scenario.internals``). Read from the source with ``ast``: a lazy import inside a
function counts, ``if TYPE_CHECKING:`` does not."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest
from import_graph import (
    ROOT,
    Import,
    cycles,
    imports_of,
    modules,
    private_owner,
    read_graph,
)

#: Top-level modules pantheon/ may have beside its sub-packages (``__init__`` counted).
MAX_TOP_LEVEL = 8


def rooms(root: Path = ROOT) -> list[str]:
    """pantheon's rooms: its sub-packages."""
    return sorted(
        f"pantheon.{p.name}" for p in (root / "pantheon").iterdir() if (p / "__init__.py").is_file()
    )


def entered_behind_faces(edges: Iterable[Import], known_rooms: Iterable[str]) -> list[str]:
    """Every import of a room's private module (or of a private name in one) by a module
    outside that room, described as ``source:line imports target``."""
    problems = []
    for e in edges:
        owner = private_owner(e.target)
        if owner is None:
            continue
        for room in known_rooms:
            inside = owner == room or owner.startswith(f"{room}.")
            if inside and e.source != room and not e.source.startswith(f"{room}."):
                problems.append(f"{e.source}:{e.line} imports {e.target}")
    return problems


def test_pantheon_is_a_few_modules_beside_its_rooms() -> None:
    top = sorted(p.name for p in (ROOT / "pantheon").glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL, top
    rooms = {p.name for p in (ROOT / "pantheon").iterdir() if (p / "__init__.py").is_file()}
    assert {"cli", "runner", "approvals", "rerun", "sessions", "scenario"} <= rooms


def test_no_modules_import_one_another_in_a_circle() -> None:
    assert cycles(read_graph(), modules()) == []


def test_no_module_imports_another_package_s_private_module() -> None:
    problems = [
        f"{e.source}:{e.line} imports {e.target}"
        for e in read_graph()
        if (owner := private_owner(e.target)) is not None
        and owner.split(".")[0] != e.source.split(".")[0]
    ]
    assert problems == []


def test_every_room_is_entered_through_its_faces() -> None:
    found = rooms()
    assert {"pantheon.scenario", "pantheon.sessions", "pantheon.rerun"} <= set(found)
    assert entered_behind_faces(read_graph(), found) == []


# -- the checks themselves ---------------------------------------------------------------------


def tree(root: Path, files: dict[str, str]) -> dict[str, Path]:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return modules(root, ["pantheon"])


def circles_in(root: Path, files: dict[str, str]) -> list[list[str]]:
    known = tree(root, files)
    return cycles(read_graph(root, ["pantheon"]), known)


def test_a_lazy_import_closes_a_circle(tmp_path: Path) -> None:
    files = {
        "pantheon/__init__.py": "",
        "pantheon/a.py": "def f():\n    from pantheon.b import g\n",
        "pantheon/b.py": "from pantheon import a\n",
    }
    assert circles_in(tmp_path, files) == [["pantheon.a", "pantheon.b"]]


def test_a_type_checking_import_closes_none(tmp_path: Path) -> None:
    files = {
        "pantheon/__init__.py": "",
        "pantheon/a.py": "from pantheon.b import g\n",
        "pantheon/b.py": (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pantheon.a import f\n"
        ),
    }
    assert circles_in(tmp_path, files) == []


def test_importing_a_private_module_runs_its_package_s_face(tmp_path: Path) -> None:
    # y._m imports x._n, which runs x/__init__ first, which imports y._m: a circle through
    # the face, though no two private modules import each other.
    files = {
        "pantheon/__init__.py": "",
        "pantheon/x/__init__.py": "from pantheon.y._m import f\n",
        "pantheon/x/_n.py": "",
        "pantheon/y/__init__.py": "",
        "pantheon/y/_m.py": "from pantheon.x._n import g\n",
    }
    assert circles_in(tmp_path, files) == [["pantheon.x", "pantheon.y._m"]]


def test_a_module_importing_its_own_package_s_siblings_is_no_circle(tmp_path: Path) -> None:
    files = {
        "pantheon/__init__.py": "",
        "pantheon/x/__init__.py": "from pantheon.x._n import g\n",
        "pantheon/x/_n.py": "from pantheon.x._o import h\n",
        "pantheon/x/_o.py": "",
    }
    assert circles_in(tmp_path, files) == []


def test_a_room_s_private_module_is_refused_to_every_other_module(tmp_path: Path) -> None:
    files = {
        "pantheon/__init__.py": "",
        "pantheon/_api.py": "from pantheon.x._n import g\n",
        "pantheon/x/__init__.py": "from pantheon.x._n import g\n",
        "pantheon/x/_n.py": "from pantheon.x.sub._deep import h\n",
        "pantheon/x/sub/__init__.py": "",
        "pantheon/x/sub/_deep.py": "",
        "pantheon/x/internals.py": "from pantheon.x._n import g\n",
        "pantheon/y/__init__.py": "from pantheon.x import g\n",
        "pantheon/y/_m.py": "from pantheon.x.internals import g\nfrom pantheon.x._n import _k\n",
        "pantheon/y/_o.py": "def f():\n    from pantheon.x.sub import _deep\n",
    }
    tree(tmp_path, files)
    found = rooms(tmp_path)
    assert found == ["pantheon.x", "pantheon.y"]
    assert entered_behind_faces(read_graph(tmp_path, ["pantheon"]), found) == [
        "pantheon._api:1 imports pantheon.x._n",
        "pantheon.y._m:2 imports pantheon.x._n._k",
        "pantheon.y._o:2 imports pantheon.x.sub._deep",
    ]


@pytest.mark.parametrize(
    ("source", "target", "owner"),
    [
        (
            "from pantheon.sessions._store import SessionStore",
            "pantheon.sessions._store",
            "pantheon.sessions",
        ),
        ("import bus._transport", "bus._transport", "bus"),
        ("from agents import _helper", "agents._helper", "agents"),
        ("from pantheon.approvals import who", "pantheon.approvals", None),
        ("from pantheon.cli import __main__", "pantheon.cli.__main__", None),
        ("from . import _relay", "pantheon.approvals._relay", "pantheon.approvals"),
    ],
)
def test_the_owner_of_a_private_import_is_told(source: str, target: str, owner: str | None) -> None:
    known = {"pantheon.approvals._relay", "pantheon.cli.__main__", "bus._transport"}
    [edge] = imports_of("pantheon.approvals", source, known, is_package=True)
    assert edge.target == target
    assert private_owner(target) == owner
