"""docs/tutorial.md runs as written: every shell block in order, in a fresh folder, with the
edits its YAML and Python blocks tell the reader to make, and every output it quotes checked.

A quoted output is a comment line of its own in a shell block (``# dead letters 4 ...``);
``...`` in it stands for any text, the rest must match one whole line of what the commands
printed. A comment after a command on the same line is a remark, not output. Two things
differ from a reader's terminal: the model server gets a free port instead of 8099 (tests
run in parallel), and the first block (making the virtualenv) is the one this test runs in.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from dashboard.web import APP
from pantheon import readmodel as rm
from pantheon.sessions import STORE_ENV, SessionStore

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "tutorial.md"
DEADLINE = 60.0


def _blocks(kind: str) -> list[str]:
    return re.findall(rf"^```{kind}\n(.*?)^```", DOC.read_text(), re.MULTILINE | re.DOTALL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


PORT = str(_free_port())


def _env() -> dict[str, str]:
    return os.environ | {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "COLUMNS": "200",
    }


def _commands(block: str) -> str:
    return "\n".join(line for line in block.splitlines() if not line.startswith("#"))


def _sh(command: str, cwd: Path) -> str:
    """Run ``command`` as the reader would (bash, in ``cwd``); stdout and stderr together,
    as a terminal shows them."""
    done = subprocess.run(
        ["bash", "-c", command.replace("8099", PORT)],
        cwd=cwd,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )
    return done.stdout


def _quoted(block: str) -> list[str]:
    return [line[2:] for line in block.splitlines() if line.startswith("# ")]


def _check(block: str, output: str, **names: str) -> None:
    """Every output the block quotes is a whole line of ``output``."""
    lines = output.splitlines()
    for quote in _quoted(block):
        for placeholder, value in names.items():
            quote = quote.replace(placeholder, value)
        quote = quote.replace("8099", PORT)
        pattern = re.compile(".*".join(map(re.escape, quote.split("..."))))
        assert any(pattern.fullmatch(line.rstrip()) for line in lines), (
            f"the tutorial quotes {quote!r}; the commands printed:\n{output}"
        )


@contextmanager
def _model_server(cwd: Path, command: str) -> Iterator[None]:
    """The stand-in model server, started by the tutorial's own command line; stopped as
    Ctrl-C stops it."""
    proc = subprocess.Popen(
        shlex.split(command.replace("8099", PORT)),
        cwd=cwd,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.strip() == f"model server at http://127.0.0.1:{PORT}/v1 (Ctrl-C stops it)"
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        assert proc.stdout is not None
        proc.stdout.close()


def _session(output: str) -> str:
    found = re.search(r"^\S+  session (\S+)  seed", output, re.MULTILINE)
    assert found, output
    return found.group(1)


def test_the_tutorial_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (
        venv,
        new,
        misspelt,
        validate,
        serve,
        with_model,
        failing,
        replay,
        fix,
        watch,
    ) = _blocks("sh")
    agent_py = _blocks("python")
    excerpt, put_on_team, provider, fault, router = _blocks("yaml")
    assert "pip install -e '.[tui,web]'" in venv  # this test runs in such an environment

    # 1. A team that works, its settings checked.
    out = _sh(new, tmp_path)
    assert "all expectations passed" in out and re.search(r"\b7 passed in ", out), out
    desk = tmp_path / "desk"
    scenario = desk / "scenario.yaml"

    # The excerpt of the scenario `pantheon new` wrote is one: its lines are there, in order.
    def code(line: str) -> str:
        return re.sub(r"\s*#.*$", "", line)

    written = iter(code(line) for line in scenario.read_text().splitlines())
    for line in excerpt.splitlines():
        assert any(have == code(line) for have in written), f"{line!r} is not in the scenario"
    listed = _sh("pantheon sessions list", desk)
    assert re.search(rf"{_session(out)} .* completed ", listed), listed
    out = _sh(misspelt, desk)
    _check(misspelt, out)
    assert "urgent_words:" in scenario.read_text()  # the last line put it back

    # 2. An agent that asks a model: refused without a model provider, counted with one.
    (code,) = agent_py
    with (desk / "desk_agents.py").open("a") as f:
        f.write("\n\n" + code)
    text = scenario.read_text()
    assert text.count("  monitor: {}\n") == 1
    scenario.write_text(text.replace("  monitor: {}\n", "  monitor: {}\n" + put_on_team))
    out = _sh(validate, desk)
    _check(validate, out)
    with _model_server(desk, _commands(serve)):
        _check(serve, f"model server at http://127.0.0.1:{PORT}/v1 (Ctrl-C stops it)")
        with scenario.open("a") as f:
            f.write(provider.replace("8099", PORT))
        out = _sh(with_model, desk)
        assert "all expectations passed" in out, out
        _check(with_model, out)

        # 3. The fault the scenario has commented out, turned on: the breaker opens.
        commented = "".join(f"# {line}\n" for line in fault.splitlines())
        text = scenario.read_text()
        assert commented in text, "the tutorial's fault is not the one the template has"
        scenario.write_text(text.replace(commented, fault))
        out = _sh(failing, desk)
        _check(failing, out)
        failed = _session(out)

    # 4. The replay, with the model server stopped.
    refused = _sh("pantheon run scenario.yaml --no-record", desk)
    assert f"cannot reach model server at http://127.0.0.1:{PORT}/v1/" in refused, refused
    assert "connection refused" in refused
    out = _sh(_commands(replay).replace("SESSION", failed), desk)
    _check(replay, out)
    # "the failed run is the newest 'failed' one"
    newest_failed = next(line for line in out.splitlines() if " failed " in line)
    assert failed in newest_failed, out

    # 5. The fix: the Router's retry and breaker lines as the tutorial gives them.
    text = scenario.read_text()
    for line in router.splitlines()[2:]:
        key = line.split(":")[0] + ":"
        [old] = [ln for ln in text.splitlines() if ln.startswith(key)]
        text = text.replace(old + "\n", line + "\n")
    scenario.write_text(text)
    start, run, diff = (line.split("#")[0].strip() for line in _commands(fix).splitlines())
    assert start.endswith("&")  # in the background: the Ctrl-C of step 4 stopped it
    with _model_server(desk, start.removesuffix("&")):
        out = _sh(run, desk)
    assert re.search(r"^dead letters 0  ", out, re.M) and "all expectations passed" in out, out
    fixed = _session(out)
    out = _sh(diff.replace("FAILED_SESSION", failed).replace("FIXED_SESSION", fixed), desk)
    _check(fix, out, FAILED_SESSION=failed, FIXED_SESSION=fixed)

    # 6. The terminal monitor and the web dashboard on the failed session.
    monitor, dashboard = _commands(watch).splitlines()
    _check_monitor(monitor.split("#")[0].replace("SESSION", failed), desk, failed)
    _check_dashboard(dashboard.split("#")[0], desk, failed, monkeypatch)


def _check_monitor(command: str, cwd: Path, session: str) -> None:
    """``pantheon monitor SESSION`` in a real terminal (tmux): the session, failed, with its
    four dead letters on the DLQ panel (key 4)."""
    if shutil.which("tmux") is None:
        pytest.skip("needs tmux for the terminal monitor")
    tmux = ["tmux", "-L", f"tutorial-{uuid.uuid4().hex[:8]}"]
    env = {k: v for k, v in _env().items() if k != "TMUX"} | {"TERM": "xterm-256color"}

    def screen() -> str:
        return subprocess.run(
            [*tmux, "capture-pane", "-p", "-t", "monitor"],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        ).stdout

    def wait_for(pattern: str) -> str:
        end = time.monotonic() + DEADLINE
        while not re.search(pattern, shown := screen()):
            assert time.monotonic() < end, f"waited for {pattern!r}; the screen:\n{shown}"
            time.sleep(0.1)
        return shown

    shell = f"cd {shlex.quote(str(cwd))} && {command}; sleep 600"
    subprocess.run(
        [*tmux, "new-session", "-d", "-s", "monitor", "-x", "140", "-y", "35", shell],
        check=True,
        env=env,
    )
    try:
        wait_for(rf"desk {session}.*\n failed .* DLQ 4 ")
        subprocess.run([*tmux, "send-keys", "-t", "monitor", "4"], check=True, env=env)
        shown = wait_for(r"circuit_open")
        assert len(re.findall(r"router\s+failed\s+3\s", shown)) == 2, shown
        assert len(re.findall(r"router\s+circuit_open\s+0\s", shown)) == 2, shown
    finally:
        subprocess.run([*tmux, "kill-server"], check=False, env=env, capture_output=True)


def _check_dashboard(
    command: str, cwd: Path, session: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``pantheon dashboard`` serves (on a free port here), and its app, under Streamlit's
    ``AppTest`` on the same store, shows what the tutorial says: the failed session standing
    out in the list, and on its page the breaker opening, the dead letters with payload and
    traceback, the model usage per agent, and "Replay this session" matching."""
    port = str(_free_port())
    proc = subprocess.Popen(
        [*shlex.split(command), "--port", port],
        cwd=cwd,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    try:
        end = time.monotonic() + DEADLINE
        while True:
            assert proc.poll() is None, "pantheon dashboard exited"
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/_stcore/health", timeout=2
                ) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < end, "the dashboard never became healthy"
            time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    store = cwd / ".pantheon" / "sessions.db"
    with SessionStore(store, create=False) as st:
        letters = rm.dead_letters(st, session)
        replays = [r.id for r in rm.session_rows(st) if r.replay_of == session]
    monkeypatch.setenv(STORE_ENV, str(store))
    monkeypatch.chdir(cwd)
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.run()
    assert not at.exception, at.exception
    # "the failed session stands out in the sessions list"
    assert re.search(rf"failed or diverged: {session} \(desk\)", at.error[0].value)
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.query_params["session"] = session
    at.run()
    assert not at.exception, at.exception
    metrics = {m.label: m.value for m in at.metric}
    assert (metrics["status"], metrics["dead letters"], metrics["model calls"]) == (
        "failed",
        "4",
        "6",
    )
    # "shows the breaker opening on its timeline, lists the dead letters with payload and
    # traceback, and the model usage per agent"
    frames = {tuple(d.value.columns): d.value for d in at.dataframe}
    [breakers] = [f for cols, f in frames.items() if "new" in cols and "old" in cols]
    assert list(zip(breakers["name"], breakers["new"], strict=True)) == [("router", "open")]
    [dlq] = [f for cols, f in frames.items() if "attempts" in cols]
    assert sorted(dlq["reason"]) == sorted(d.reason for d in letters)
    texts = [e.value for kind in (at.markdown, at.success) for e in kind]
    assert "**Payload**" in texts and "**Traceback**" in texts
    [usage] = [f for cols, f in frames.items() if "calls" in cols and "agent" in cols]
    assert list(zip(usage["agent"], usage["calls"], strict=True)) == [("summarizer", 6)]
    # "Replay this session" replays it and shows that it matched.
    at.button(key="replay_start").click().run()
    end = time.monotonic() + DEADLINE
    while True:
        at.run()
        assert not at.exception, at.exception
        with SessionStore(store, create=False) as st:
            new = [
                r.id for r in rm.session_rows(st) if r.replay_of == session and r.id not in replays
            ]
        done = [s.value for s in at.success if new and f"Replay {new[0]} matched" in s.value]
        if done:
            break
        assert time.monotonic() < end, [s.value for s in at.success]
        time.sleep(0.2)  # polling interval; the deadline decides
