"""The on-call team's own expectations, for the scenario's ``expect.custom``.

Accuracy over alerts is what ``min_accuracy`` judges; an on-call desk is judged first on two
numbers that an average hides: every incident that needed a human got a page, and nobody
was woken for nothing too often.
"""

from __future__ import annotations

from typing import Any

import pantheon

__all__ = ["few_false_pages", "no_missed_pages"]


def _pages(summary: pantheon.RunSummary) -> dict[str, Any]:
    pages = (summary.accuracy or {}).get("pages")
    if not isinstance(pages, dict):
        raise ValueError("the run reported no pages: is the Scorer on the team?")
    return pages


def no_missed_pages(summary: pantheon.RunSummary) -> tuple[bool, str]:
    """Every real incident that needed a human got at least one page."""
    pages = _pages(summary)
    missed, needed = pages["missed"], pages["needed"]
    return missed == 0, f"{missed} of {needed} incidents that needed a page got none"


def few_false_pages(summary: pantheon.RunSummary) -> tuple[bool, str]:
    """At most one page in ten went out for an alert that needed nobody."""
    pages = _pages(summary)
    false, sent = pages["false"], pages["sent"]
    return false * 10 <= sent, f"{false} of {sent} pages were for alerts that needed nobody"
