"""The Trace tab in headless Chromium: ``pantheon dashboard`` as a process on a model
agent's recorded session, the tab opened, the item that went wrong shown with its tool's
error, then another item picked and its approval's decider shown."""

from __future__ import annotations

from pathlib import Path

import pytest
from refund_trace_team import recorded_refunds
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from test_dashboard_browser import (  # noqa: F401 - the browser fixture and the skip mark
    _click,
    _dashboard,
    _wait_for,
    browser,
    pytestmark,
)


def test_browser_traces_an_item(
    browser: WebDriver,  # noqa: F811 - the fixture
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    path, sid = recorded_refunds(tmp_path_factory.mktemp("refunds"))
    with _dashboard(path, tmp_path) as served:
        browser.get(f"{served.url}/?session={sid}")
        _click(browser, "Trace", css="[role=tab]")
        _wait_for(
            browser,
            "the item that went wrong",
            lambda t: (
                "raised LookupError: no order A-9" in t
                and "outcome: none (expected refund: wrong)" in t
            ),
        )
        picker = browser.find_element(By.CSS_SELECTOR, "input[aria-label^='Item (3, by ticket)']")
        picker.click()
        picker.send_keys("T-2", Keys.ENTER)
        text = _wait_for(
            browser,
            "ticket T-2's story",
            lambda t: 'approved by desk-lead (request 1): note "receipt seen"' in t,
        )
        assert 'tool.order_status(order_id="A-2")' in text
        assert "outcome: refund (expected refund: right)" in text
        browser.save_screenshot(str(tmp_path / "trace.png"))
