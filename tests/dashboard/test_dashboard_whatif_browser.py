"""The "Try a change" form in headless Chromium: ``pantheon dashboard`` as a process, a
failed support run, an overlay typed into the form, the moved emails on the page, and the
what-if session opened from there."""

from __future__ import annotations

from pathlib import Path

from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait
from test_dashboard_browser import (  # noqa: F401 - the browser fixture and the skip mark
    _click,
    _dashboard,
    _wait_for,
    browser,
    pytestmark,
)
from whatif_run import expected_moves, failed_run  # noqa: F401 - a shared fixture

from pantheon.sessions import SessionStore


def test_browser_tries_a_change_and_opens_the_what_if(
    failed_run: tuple[Path, str],  # noqa: F811 - the fixture
    browser: WebDriver,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    path, session = failed_run
    expected = expected_moves(path, session)
    with _dashboard(path, tmp_path) as served:
        browser.get(f"{served.url}/?session={session}")
        _wait_for(browser, "the what-if form", lambda t: "Try a change" in t and "Run what-if" in t)
        area = WebDriverWait(browser, 60, poll_frequency=0.2).until(
            lambda d: d.find_element(By.CSS_SELECTOR, "textarea[aria-label='Overlay (YAML)']")
        )
        area.click()
        area.send_keys(Keys.CONTROL, "a")
        area.send_keys(Keys.DELETE)
        area.send_keys("policy:\n  refund_limit: 200.0\n")
        area.send_keys(Keys.CONTROL, Keys.ENTER)  # Streamlit applies a text area's edit
        _click(browser, "Run what-if")
        n = len(expected)
        text = _wait_for(
            browser,
            "the what-if's result",
            lambda t: f"{n} emails changed action: {n} escalate→reply" in t,
        )
        with SessionStore(path, create=False) as store:
            (whatif,) = [s for s in store.sessions() if s.forked_from == session]
        text = _wait_for(
            browser,
            "the result line and the open button",
            lambda t: (
                f"What-if recorded as {whatif.id}" in t
                and f"Open the what-if session {whatif.id}" in t
                and "meets accuracy ≥ 0.8" in t
            ),
        )
        browser.execute_script(
            "document.evaluate(\"//*[contains(text(), 'What-if recorded as')]\", document, null,"
            " XPathResult.FIRST_ORDERED_NODE_TYPE, null).singleNodeValue.scrollIntoView()"
        )
        browser.save_screenshot(str(tmp_path / "whatif.png"))
        _click(browser, f"Open the what-if session {whatif.id}")
        text = _wait_for(
            browser, "the what-if session's page", lambda t: f"What-if of {session}" in t
        )
        assert f"Session {whatif.id}" in text
        assert f"?session={whatif.id}" in browser.current_url
        browser.execute_script(
            "document.evaluate(\"//*[contains(text(), 'What-if of')]\", document, null,"
            " XPathResult.FIRST_ORDERED_NODE_TYPE, null).singleNodeValue.scrollIntoView()"
        )
        browser.save_screenshot(str(tmp_path / "whatif-session.png"))
    for name in ("whatif.png", "whatif-session.png"):
        assert (tmp_path / name).stat().st_size > 10_000
