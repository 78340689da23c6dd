"""The example page in headless Chromium: a decision streamed over the WebSocket shows up
in the browser, an email posted from the page's own form included."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from gateway_server import ROOT, Server, start_server

pytest.importorskip("selenium.webdriver")
from browser import chromium, needs_browser
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

pytestmark = needs_browser
EXAMPLE = ROOT / "scenarios" / "support_gateway.yaml"


@pytest.fixture
def example(tmp_path: Path) -> Iterator[Server]:
    server = start_server(EXAMPLE, tmp_path)
    try:
        yield server
    finally:
        assert server.stop() == 0


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    with chromium(tmp_path / "chromium-profile", width=1200, height=800) as driver:
        yield driver


def _rows(driver: WebDriver) -> str:
    return str(driver.find_element(By.ID, "rows").text)


def test_the_page_shows_decisions_streamed_over_the_websocket(
    example: Server, browser: WebDriver, tmp_path: Path
) -> None:
    browser.get(f"{example.url}/")
    WebDriverWait(browser, 30).until(lambda d: d.find_element(By.ID, "status").text == "connected")
    r = httpx.post(
        f"{example.url}/v1/inbox",
        json={
            "id": "curl-42",
            "from": "ana@example.com",
            "to": "support@acme.example",
            "subject": "Site down",
            "body": "Your site is down for everyone, 503 errors. Urgent!",
        },
        timeout=30,
    )
    assert r.status_code == 202
    WebDriverWait(browser, 30).until(lambda d: "curl-42" in _rows(d))
    row = next(line for line in _rows(browser).splitlines() if "curl-42" in line)
    assert "ana@example.com" in row and "outage" in row and "escalate" in row
    # the page's own form posts to the inbox; its decision arrives the same way
    browser.find_element(By.CSS_SELECTOR, "#send button").click()
    WebDriverWait(browser, 30).until(lambda d: "web-" in _rows(d))
    assert "refund" in _rows(browser)
    assert browser.find_element(By.ID, "count").text == "2"
    assert browser.find_element(By.ID, "dropped").text == "0"
    shot = tmp_path / "gateway_page.png"
    browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
    if os.environ.get("PANTHEON_SCREENSHOTS"):
        browser.save_screenshot(os.path.join(os.environ["PANTHEON_SCREENSHOTS"], shot.name))
