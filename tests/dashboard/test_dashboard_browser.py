"""The dashboard in a real browser: ``pantheon dashboard`` as a process, headless Chromium
driven by selenium, from the sessions list to a failed session to its replay's result."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from dashboard_store import Recorded

from pantheon import readmodel as rm
from pantheon.sessions import SessionStore

pytest.importorskip("selenium.webdriver")
from browser import chromium, needs_browser
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

pytestmark = needs_browser
DEADLINE_S = 60.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Served(NamedTuple):
    """A ``pantheon dashboard`` serving: its URL, and its process (Streamlit's: the command
    execs it)."""

    url: str
    process: subprocess.Popen[bytes]


@contextmanager
def _dashboard(store: Path, tmp_path: Path) -> Iterator[Served]:
    """``pantheon dashboard`` on ``store`` and a free port, once it is healthy."""
    port = _free_port()
    log = (tmp_path / "server.log").open("wb")
    pantheon = shutil.which("pantheon", path=str(Path(sys.executable).parent))
    assert pantheon is not None, "the pantheon console script is not installed in this venv"
    proc = subprocess.Popen(
        [pantheon, "dashboard", "--port", str(port), "--store", str(store)],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        cwd=tmp_path,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + DEADLINE_S
        while True:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the dashboard never became healthy"
            time.sleep(0.1)  # polling interval; the deadline decides
        yield Served(url, proc)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture
def server(recorded: Recorded, tmp_path: Path) -> Iterator[str]:
    """``pantheon dashboard`` on the recorded store, stopped after the test."""
    with _dashboard(recorded.path, tmp_path) as served:
        yield served.url


@pytest.fixture
def model_dashboard(model_session: Any, tmp_path: Path) -> Iterator[str]:
    """``pantheon dashboard`` on the store of the session run against a model server."""
    with _dashboard(model_session.store, tmp_path) as served:
        yield served.url


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    with chromium(tmp_path / "chromium-profile", width=1400, height=1100) as driver:
        yield driver


def _body(driver: WebDriver) -> str:
    return str(driver.find_element(By.TAG_NAME, "body").text)


def _wait_for(driver: WebDriver, what: str, ok: Callable[[str], bool]) -> str:
    try:
        WebDriverWait(driver, DEADLINE_S, poll_frequency=0.2).until(lambda d: ok(_body(d)))
    except Exception as exc:
        raise AssertionError(f"waited for {what}; the page says:\n{_body(driver)}") from exc
    return _body(driver)


def _click(driver: WebDriver, label: str, *, css: str = "button") -> None:
    """Click the one button (or other element matching ``css``: ``[role=tab]``) labelled
    ``label`` once it is there: Streamlit draws a page element by element, so text above a
    button can show before the button does, and a rerun may replace the button between
    finding and clicking it."""

    def click(d: WebDriver) -> bool:
        buttons = [b for b in d.find_elements(By.CSS_SELECTOR, css) if b.text == label]
        if len(buttons) != 1:
            return False
        buttons[0].click()
        return True

    wait = WebDriverWait(
        driver,
        DEADLINE_S,
        poll_frequency=0.2,
        ignored_exceptions=(StaleElementReferenceException,),
    )
    try:
        wait.until(click)
    except Exception as exc:
        raise AssertionError(f"no button {label!r}; the page says:\n{_body(driver)}") from exc


def test_browser_opens_a_failed_session_and_replays_it(
    server: str, browser: WebDriver, recorded: Recorded, tmp_path: Path
) -> None:
    browser.get(server)
    text = _wait_for(browser, "the sessions list", lambda t: "Pantheon sessions" in t)
    # Streamlit draws the page element by element: wait for each line read below.
    text = _wait_for(
        browser,
        "the failed session named, with the store and the failure count",
        lambda t: (
            recorded.failed in t
            and "1 session(s) failed or diverged" in t
            and f"Store: {recorded.path}" in t
        ),
    )
    assert "1 session(s) failed or diverged" in text
    assert f"Store: {recorded.path}" in text
    browser.save_screenshot(str(tmp_path / "1-sessions.png"))

    _click(browser, "Open session")  # the picker starts on the failed session
    text = _wait_for(browser, "the session page", lambda t: f"Session {recorded.failed}" in t)
    with SessionStore(recorded.path, create=False) as store:
        dead = len(store.dead_letters(recorded.failed))
    text = _wait_for(
        browser,
        "the failed expectation, the dead letters and the replay panel",
        lambda t: (
            "Replay this session" in t
            and "Failed expectations: dead letters other than shed <= 0" in t
            and f"dead letters\n{dead}" in t
            and "This session has not been replayed yet." in t
        ),
    )
    assert "Failed expectations: dead letters other than shed <= 0" in text
    assert f"dead letters\n{dead}" in text
    assert "This session has not been replayed yet." in text
    assert f"?session={recorded.failed}" in browser.current_url
    browser.save_screenshot(str(tmp_path / "2-failed-session.png"))

    _click(browser, "Replay this session")
    text = _wait_for(browser, "the replay's result", lambda t: "matched the original" in t)
    with SessionStore(recorded.path, create=False) as store:
        (replay,) = [s for s in store.sessions() if s.replay_of == recorded.failed]
    text = _wait_for(
        browser,
        "the reproduced failures and both sides of the replay",
        lambda t: (
            f"{dead} recorded failure(s) reproduced at the same hop" in t
            and f"Original {recorded.failed}" in t
            and f"Replay {replay.id}" in t
        ),
    )
    assert replay.status == "completed"
    assert f"Replay {replay.id} matched the original hop by hop" in text
    assert f"{dead} recorded failure(s) reproduced at the same hop" in text
    assert f"Original {recorded.failed}" in text and f"Replay {replay.id}" in text
    browser.save_screenshot(str(tmp_path / "3-replay.png"))
    for name in ("1-sessions.png", "2-failed-session.png", "3-replay.png"):
        assert (tmp_path / name).stat().st_size > 10_000


#: Each throughput chart's drawn lines: how many, and how tall they stand together (px).
_THROUGHPUT_LINES_JS = """
return [...document.querySelectorAll('.vega-embed')].flatMap(e => {
  const title = e.querySelector('.role-title-text');
  if (!title || !title.textContent.startsWith('throughput per ')) return [];
  const lines = [...e.querySelectorAll('g.mark-line path')]
    .filter(p => (p.getAttribute('d') || '').length > 0)
    .map(p => p.getBoundingClientRect());
  const top = Math.min(...lines.map(r => r.top)), bottom = Math.max(...lines.map(r => r.bottom));
  return [[title.textContent, lines.length, lines.length ? bottom - top : 0]];
});
"""


def test_browser_draws_the_throughput_lines(
    server: str, browser: WebDriver, recorded: Recorded, tmp_path: Path
) -> None:
    """The lines must stand in the plot, not just exist in the SVG: squeezed by Streamlit's
    default ``autosize: fit`` below their legend, they were paths in a plot 0 px tall."""
    with SessionStore(recorded.path, create=False) as store:
        points = rm.throughput(store, recorded.failed)
    keys = {kind: {p.key for p in points if p.kind == kind} for kind in ("topic", "agent")}
    browser.get(f"{server}/?session={recorded.failed}")
    _wait_for(browser, "the session page", lambda t: f"Session {recorded.failed}" in t)
    drawn: list[list[Any]] = []

    def lines_stand_up(d: WebDriver) -> bool:
        drawn[:] = sorted(d.execute_script(_THROUGHPUT_LINES_JS))
        # Half the 260 px plot: the busiest line peaks above that on Vega's nice y scale.
        return len(drawn) == 2 and all(n > 0 and height >= 130 for _, n, height in drawn)

    try:
        WebDriverWait(browser, DEADLINE_S / 4, poll_frequency=0.5).until(lines_stand_up)
    except Exception as exc:
        browser.save_screenshot(str(tmp_path / "throughput.png"))
        raise AssertionError(f"(chart, lines, height in px) drawn: {drawn}") from exc
    assert drawn == [
        ["throughput per agent", len(keys["agent"]), drawn[0][2]],
        ["throughput per topic", len(keys["topic"]), drawn[1][2]],
    ]


def test_browser_page_of_a_running_session_refreshes_by_itself(
    server: str, browser: WebDriver, recorded: Recorded, tmp_path: Path
) -> None:
    # This process "records" the session, so the store keeps it running until we end it.
    with SessionStore(recorded.path) as store:
        sid = store.begin_session(scenario="live")
    browser.get(f"{server}/?session={sid}")
    # The status metric is drawn after the title: wait for it too.
    _wait_for(
        browser, "the running session", lambda t: f"Session {sid}" in t and "status\nrunning" in t
    )
    browser.save_screenshot(str(tmp_path / "live-running.png"))
    with SessionStore(recorded.path) as store:
        store.end_session(sid, "completed", {"passed": True})
    # No click, no reload: the page polls the store while the session runs.
    _wait_for(browser, "the page to see the end", lambda t: "status\ncompleted" in t)
    browser.save_screenshot(str(tmp_path / "live-completed.png"))


def test_browser_shows_a_sessions_model_usage(
    model_dashboard: str, browser: WebDriver, model_session: Any, tmp_path: Path
) -> None:
    """The session run against a model server: its header's tokens and cost, then its
    Model usage tab, as the browser draws them (tables are canvas: read via the text)."""
    sid = model_session.session_id
    with SessionStore(model_session.store, create=False) as store:
        t = rm.usage(store, sid).total
    browser.get(f"{model_dashboard}/?session={sid}")
    text = _wait_for(
        browser,
        "the session's model calls, tokens and cost in its header",
        lambda t_: (
            f"Session {sid}" in t_
            and f"model calls\n{t.calls:,}" in t_
            and f"model cost\n{rm.usd(t.cost_usd)}" in t_
        ),
    )
    assert f"tokens in\n{t.input_tokens:,}" in text
    assert f"tokens out\n{t.output_tokens:,}" in text
    _click(browser, f"Model usage ({t.calls})", css="[role=tab]")
    summary = (
        f"{t.calls:,} model call(s): {t.input_tokens:,} tokens in, {t.output_tokens:,} out, "
        f"{rm.usd(t.cost_usd)}"
    )
    text = _wait_for(
        browser,
        "the usage tab",
        lambda t_: summary in t_ and "The 10 slowest call(s)" in t_ and "Every call" in t_,
    )
    shot = tmp_path / "model-usage.png"
    browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000


def test_browser_approves_a_request_the_running_team_waits_for(
    browser: WebDriver, tmp_path: Path
) -> None:
    from approval_run import stop, waiting_run
    from selenium.webdriver.common.keys import Keys

    run, store, sid, rows = waiting_run(tmp_path)
    first, second = sorted(rows, key=lambda a: a.id)
    try:
        with _dashboard(store, tmp_path) as served:
            url = served.url
            browser.get(f"{url}/?session={sid}")
            _wait_for(browser, "the pending requests", lambda t: "Approvals (2 waiting)" in t)
            note = WebDriverWait(browser, DEADLINE_S).until(
                lambda d: d.find_element(
                    By.CSS_SELECTOR, f".st-key-approval_note_{sid}_{first.id} input"
                )
            )
            note.send_keys("checked in the browser", Keys.ENTER)
            browser.save_screenshot(str(tmp_path / "approvals-pending.png"))
            _click(browser, "Approve", css=f".st-key-approve_{sid}_{first.id} button")
            _wait_for(
                browser,
                "the decision confirmed",
                lambda t: f"#{first.id} approved: checked in the browser" in t,
            )
            _click(browser, "Reject", css=f".st-key-reject_{sid}_{second.id} button")
            _wait_for(browser, "the reject confirmed", lambda t: f"#{second.id} rejected" in t)
            out, err = run.communicate(timeout=60)
            assert run.returncode == 0, err
            assert json.loads(out)["decisions"] == {"approved": 5, "rejected": 1}
            browser.get(f"{url}/?session={sid}")
            # The decided ones are a table (drawn on a canvas): the heading says none waits.
            text = _wait_for(browser, "the approvals heading", lambda t: "\nApprovals\n" in t)
            assert "Approvals (" not in text and "Approve" not in text
            browser.save_screenshot(str(tmp_path / "approvals-decided.png"))
    finally:
        stop(run)
    with SessionStore(store, create=False) as st:
        from pantheon.sessions import ApprovalBook

        decided = {a.id: (a.status, a.note) for a in ApprovalBook(st).entries(sid)}
    assert decided == {
        first.id: ("approved", "checked in the browser"),
        second.id: ("rejected", ""),
    }


def _children(pid: int) -> list[int]:
    """The processes ``pid`` started that still run (Linux: its threads' ``children``)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _runs(pid: int) -> bool:
    """Whether process ``pid`` is there and not a zombie waiting to be reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture(scope="module")
def invoices(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A recorded invoice run whose redrive asks a person, and waits two minutes for one."""
    from invoice_team import person_run

    return person_run(tmp_path_factory.mktemp("invoices"))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_stopping_the_dashboard_stops_the_redrive_it_started(
    sig: signal.Signals, invoices: tuple[Path, str], browser: WebDriver, tmp_path: Path
) -> None:
    """A redrive started on the page runs as a child of the server and waits for a person;
    the server stopped (a supervisor's SIGTERM, Ctrl-C), the redrive goes with it. It used
    to live on until its approval timeout, two minutes, its session ``running``."""
    store = tmp_path / "s.db"
    src, dst = sqlite3.connect(invoices[0]), sqlite3.connect(store)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()
    sid = invoices[1]
    with SessionStore(store, create=False) as st:
        letters = len(st.dead_letters(sid))
    jobs: list[int] = []
    try:
        with _dashboard(store, tmp_path) as served:
            browser.get(f"{served.url}/?session={sid}")
            _click(browser, f"Dead letters ({letters})", css="[role=tab]")
            _click(browser, f"Redrive all {letters} not redriven")
            _wait_for(browser, "the redrive waiting", lambda t: "it waits for a person" in t)
            jobs = _children(served.process.pid)
            assert len(jobs) == 1, jobs
            argv = Path(f"/proc/{jobs[0]}/cmdline").read_bytes().split(b"\0")
            assert argv[3:6] == [b"dlq", b"redrive", sid.encode()], argv
            served.process.send_signal(sig)
            assert served.process.wait(timeout=30) == 0
        deadline = time.monotonic() + 10
        while _runs(jobs[0]):
            assert time.monotonic() < deadline, f"the redrive ({jobs[0]}) outlived the dashboard"
            time.sleep(0.05)
    finally:
        for pid in jobs:  # left running by a failure: it would wait two more minutes
            if _runs(pid):
                os.kill(pid, signal.SIGKILL)
