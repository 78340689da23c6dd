"""Headless Chromium for the browser tests, through Debian's chromium and chromium-driver.

``.ci/run`` installs both; under ``CI=1`` a missing browser is an error at import rather than
a skip, because a browser test that quietly skips there proves nothing. Elsewhere the tests
that use :func:`chromium` are skipped (``needs_browser``). Import selenium with
``pytest.importorskip`` before importing this module.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
HAVE_BROWSER = os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)
if not HAVE_BROWSER and os.environ.get("CI") == "1":
    raise RuntimeError(f"CI=1 but {CHROMIUM} or {CHROMEDRIVER} is missing")
needs_browser = pytest.mark.skipif(
    not HAVE_BROWSER, reason="needs Debian's chromium and chromium-driver"
)


@contextmanager
def chromium(profile: Path, *, width: int, height: int) -> Iterator[WebDriver]:
    """A headless Chromium window of that size, its profile in ``profile``, quit after."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-quic",
        "--no-first-run",
        "--disable-component-update",
        "--disable-sync",
        f"--window-size={width},{height}",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
