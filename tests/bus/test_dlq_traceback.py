"""A dead letter's traceback reads exactly as Python prints one, minus the ``^^^`` markers.

``bus._dlq.traceback_text`` formats frames itself (the standard path cost 100+ µs per dead
letter); these pin that nothing a reader relies on changed: chained causes and contexts,
suppressed contexts, summarized recursion, qualified exception names, an empty message.
"""

from __future__ import annotations

import json
import re
import sys
import traceback

import pytest

from bus._dlq import traceback_text


def _lookup(key: str) -> int:
    return {"a": 1}[key]


def _caused() -> None:
    try:
        _lookup("b")
    except KeyError as exc:
        raise RuntimeError("no price") from exc


def _during() -> None:
    try:
        1 / 0  # noqa: B018
    except ZeroDivisionError:
        raise ValueError  # noqa: B904 - the implicit context is what is under test


def _suppressed() -> None:
    try:
        _lookup("c")
    except KeyError:
        raise LookupError("gone") from None


def _recurse(n: int) -> int:
    return _recurse(n + 1)


def _library() -> None:
    json.loads("{bad")


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no")


def _unprintable() -> None:
    raise _Unprintable


@pytest.mark.parametrize(
    "fail", [_caused, _during, _suppressed, _library, _unprintable, lambda: _recurse(0)]
)
def test_the_text_is_the_standard_traceback_without_markers(fail) -> None:  # type: ignore[no-untyped-def]
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(150)
    try:
        fail()
    except Exception as exc:
        caught = exc
    finally:
        sys.setrecursionlimit(limit)
    standard = "".join(traceback.format_exception(caught))
    without_markers = re.sub(r"\n *[~^]+ *(?=\n)", "", standard)
    assert traceback_text(caught) == without_markers
    assert "^^^" not in traceback_text(caught)


def test_recursion_is_summarized_not_listed_frame_by_frame() -> None:
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(150)
    try:
        _recurse(0)
    except RecursionError as exc:
        text = traceback_text(exc)
    finally:
        sys.setrecursionlimit(limit)
    assert text.count("return _recurse(n + 1)") == 3
    assert re.search(r"\[Previous line repeated \d+ more times\]", text)


def test_a_chain_a_thousand_causes_long_is_formatted_not_recursed() -> None:
    """A client that re-raises ``from`` its last error on every retry builds long chains;
    formatting one must not hit the recursion limit where a message is being dead-lettered."""
    error: BaseException = ValueError("attempt 0")
    for attempt in range(1, 2000):
        try:
            raise ValueError(f"attempt {attempt}") from error
        except ValueError as exc:
            error = exc
    text = traceback_text(error)
    assert text == "".join(traceback.format_exception(error))
    assert text.count("The above exception was the direct cause") == 1999
    assert text.rstrip().endswith("ValueError: attempt 1999")


def test_source_lines_of_a_module_imported_from_a_zip_are_shown(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A zipapp or egg module's source comes from its loader, as the standard traceback
    finds it."""
    import importlib
    import zipfile

    archive = tmp_path / "lib.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("zipped_mod.py", "def boom():\n    raise KeyError('zipped')\n")
    monkeypatch.syspath_prepend(str(archive))
    module = importlib.import_module("zipped_mod")
    try:
        module.boom()
    except KeyError as exc:
        text = traceback_text(exc)
    assert "raise KeyError('zipped')" in text
    assert "zipped_mod.py" in text
