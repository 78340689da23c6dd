"""What the README and docs/ tell a reader holds in this repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_activates_the_venv_before_bare_commands() -> None:
    """The two top commands use .venv/bin/ explicitly; everything after them says
    ``pantheon`` or ``pip``, which only work once the environment is active."""
    text = (ROOT / "README.md").read_text()
    top = [
        "python3 -m venv .venv && .venv/bin/pip install -e . && "
        ".venv/bin/pantheon run scenarios/support_email.yaml",
        "python3 -m venv .venv && .venv/bin/pip install -e '.[dev]' && .venv/bin/python -m pytest",
    ]
    assert all(command in text for command in top)
    after = text[text.index(top[1]) + len(top[1]) :]
    activate = after.index("source .venv/bin/activate")
    first_bare = re.search(r"^(pantheon|pip) ", after, re.MULTILINE)
    assert first_bare is not None and activate < first_bare.start()


def test_docs_name_no_path_outside_the_repository() -> None:
    outside = re.compile(r"\.\./shared|/work/|/tmp/")
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            assert not outside.search(line), f"{doc.relative_to(ROOT)}:{n}: {line}"


def test_docs_do_not_send_malformed_input_to_the_dead_letter_queue() -> None:
    """Malformed records are published on the input's malformed topic, never dead-lettered."""
    for doc in [ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("scenarios/*.yaml")]:
        text = " ".join(doc.read_text().split())
        assert not re.search(r"malformed[^.]*(dead-letter queue|to the DLQ)", text, re.I), doc
