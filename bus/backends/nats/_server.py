"""A throwaway ``nats-server -js`` process: for ``transport.server: auto``, tests, benchmarks.

Each :class:`NatsServer` listens on free loopback ports (client, monitoring and, in a
cluster, routes) with a store directory of its own, so it never meets the machine's own NATS
on 4222. ``start`` returns once the server's ``/healthz`` says JetStream is ready, not after a
sleep. :func:`nats_cluster` makes several that route to each other (a JetStream cluster
needs three for a replicated stream to survive losing one).

A throwaway server dies with the process that started it, however that process ends: a
small ``sh`` forks a watcher holding the read end of a pipe whose write end only the
starter has, then becomes the server; at end of file the watcher stops it (SIGTERM). A
``pantheon run`` SIGKILLed mid-run used to leave its ``server: auto`` server running for
good, its store in the temp directory.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "NatsServer",
    "NatsServerError",
    "find_nats_server",
    "free_port",
    "nats_cluster",
    "start_cluster",
    "stop_cluster",
]


class NatsServerError(RuntimeError):
    """nats-server is missing, or did not start (the message carries its last output)."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


#: Becomes ``"$@"`` (the server: same pid, so its starter waits for and reaps it directly)
#: after forking a watcher that sends it SIGTERM once stdin reaches end of file: when the
#: starter closes the pipe (:meth:`NatsServer.stop`) or dies. The pipe is read through fd 3
#: (``sh`` gives a background job /dev/null for stdin). A server that exited by itself may
#: have its pid reused by then: where there is a ``/proc``, the watcher kills the pid only
#: while it runs our config (a dead one has none: left alone); without one (macOS), it is
#: trusted.
_WITH_ITS_STARTER = (
    "exec 3<&0; config=$3; { read -r _ <&3 || :; "
    'if [ ! -r /proc/self/cmdline ] || grep -qaF -- "$config" /proc/$$/cmdline 2>/dev/null; then '
    'kill -TERM $$ 2>/dev/null; fi; } & exec "$@" 3<&-'
)


def _spawn(binary: str, config: Path, log: Path) -> subprocess.Popen[bytes]:
    """nats-server (``binary``) on ``config``, writing ``log``, in a session of its own (a
    Ctrl-C in the terminal is for pantheon, not it), stopped when this process closes its
    stdin or dies."""
    out = log.open("ab")
    try:
        return subprocess.Popen(
            ["sh", "-c", _WITH_ITS_STARTER, "nats-server", binary, "-c", str(config)],
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as exc:  # no sh, or the binary cannot be run
        raise NatsServerError(f"cannot start {binary}: {exc}") from None
    finally:
        out.close()


def find_nats_server() -> str:
    """The nats-server executable (PATH, then Debian's /usr/sbin), or NatsServerError."""
    found = shutil.which("nats-server") or shutil.which("nats-server", path="/usr/sbin:/sbin")
    if found is None:
        raise NatsServerError(
            "nats-server is not installed: `apt-get install nats-server` (Debian) or see "
            "https://docs.nats.io/running-a-nats-service/introduction/installation"
        )
    return found


class NatsServer:
    """One nats-server with JetStream on 127.0.0.1.

    ``users`` adds ``(user, password)`` accounts and ``nkeys`` public user nkeys: with either,
    a client without matching credentials is refused. ``cluster``/``routes``/``cluster_port``
    join it to a cluster (see :func:`nats_cluster`). ``store`` defaults to a temporary
    directory removed by :meth:`stop`; :meth:`kill` then :meth:`start` again is a crash and
    restart on the same port and store.
    """

    def __init__(
        self,
        *,
        name: str = "n1",
        port: int | None = None,
        store: Path | None = None,
        users: Sequence[tuple[str, str]] = (),
        nkeys: Sequence[str] = (),
        cluster: str | None = None,
        cluster_port: int | None = None,
        routes: Sequence[int] = (),
    ) -> None:
        self.name = name
        self.port = port or free_port()
        self.monitor_port = free_port()
        self._own_store = store is None
        self.store = store or Path(tempfile.mkdtemp(prefix="pantheon-nats-"))
        self.users = list(users)
        self.nkeys = list(nkeys)
        self.cluster = cluster
        self.cluster_port = cluster_port or (free_port() if cluster else None)
        self.routes = list(routes)
        self.proc: subprocess.Popen[bytes] | None = None
        self._log = self.store / f"{name}.log"

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def _config(self) -> str:
        lines = [
            f"server_name: {self.name}",
            f"listen: 127.0.0.1:{self.port}",
            f"http: 127.0.0.1:{self.monitor_port}",
            f'jetstream {{ store_dir: "{self.store / self.name}" }}',
        ]
        if self.cluster:
            routes = ", ".join(f"nats-route://127.0.0.1:{p}" for p in self.routes)
            lines.append(
                f"cluster {{ name: {self.cluster}, listen: 127.0.0.1:{self.cluster_port}, "
                f"routes: [{routes}] }}"
            )
        accounts = [f'{{user: "{u}", password: "{p}"}}' for u, p in self.users]
        accounts += [f'{{nkey: "{k}"}}' for k in self.nkeys]
        if accounts:
            lines.append(f"authorization {{ users: [{', '.join(accounts)}] }}")
        return "\n".join(lines) + "\n"

    def start(self, timeout: float = 20.0) -> NatsServer:
        """Start (or restart) the server; return once JetStream is ready."""
        if self.proc is not None and self.proc.poll() is None:
            return self
        try:
            binary = find_nats_server()
        except NatsServerError:
            self.stop()
            raise
        self._close_stdin()  # a crashed one's watcher: nothing left for it to stop
        config = self.store / f"{self.name}.conf"
        config.write_text(self._config())
        try:
            self.proc = _spawn(binary, config, self._log)
        except NatsServerError:
            self.stop()  # a temporary store goes too
            raise
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        # A lone server is ready with JetStream enabled; a cluster member once it is current
        # with the meta leader (so a stream can be created through it).
        path = "/healthz" if self.cluster else "/healthz?js-enabled-only=true"
        url = f"http://127.0.0.1:{self.monitor_port}{path}"
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                message = (
                    f"nats-server {self.name} exited with {self.proc.returncode}: {self.tail(1)}"
                )
                self.stop()  # a temporary store goes too
                raise NatsServerError(message)
            with (
                contextlib.suppress(OSError, urllib.error.URLError),
                urllib.request.urlopen(url, timeout=1.0) as answer,
            ):
                if answer.status == 200:
                    return
            if time.monotonic() > deadline:
                message = (
                    f"nats-server {self.name} on port {self.port} not ready in {timeout}s: "
                    f"{self.tail()}"
                )
                self.stop()
                raise NatsServerError(message)
            time.sleep(0.05)

    def tail(self, lines: int = 5) -> str:
        try:
            text = self._log.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(text[-lines:]) or "(no output)"

    def kill(self) -> None:
        """SIGKILL: a crash, the store left as it was."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._close_stdin()  # its watcher finds no process running this config, and leaves
        self.proc = None

    def _close_stdin(self) -> None:
        if self.proc is not None and self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 5 s) and remove a temporary store."""
        if self.proc is not None and self.proc.poll() is None:
            self._close_stdin()  # its watcher sends the server SIGTERM
            try:
                self.proc.wait(5.0)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._close_stdin()
        self.proc = None
        if self._own_store:
            shutil.rmtree(self.store, ignore_errors=True)

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def nats_cluster(size: int = 3, *, name: str = "pantheon") -> list[NatsServer]:
    """``size`` servers routed to each other on loopback, not started; start each (in any
    order) with ``start``; :func:`start_cluster` starts them all."""
    store = Path(tempfile.mkdtemp(prefix="pantheon-nats-cluster-"))
    ports = [free_port() for _ in range(size)]
    servers = []
    for i in range(size):
        server = NatsServer(
            name=f"{name}-{i}",
            store=store,
            cluster=name,
            cluster_port=ports[i],
            routes=[p for j, p in enumerate(ports) if j != i],
        )
        servers.append(server)
    return servers


def start_cluster(servers: Sequence[NatsServer], timeout: float = 30.0) -> None:
    """Start every server of a cluster: all processes first (each waits for its routes to
    elect a meta leader), then wait until each is ready."""
    for server in servers:
        config = server.store / f"{server.name}.conf"
        config.write_text(server._config())
        server.proc = _spawn(find_nats_server(), config, server._log)
    for server in servers:
        server._wait_ready(timeout)


def stop_cluster(servers: Sequence[NatsServer]) -> None:
    for server in servers:
        server.stop()
    if servers:
        shutil.rmtree(servers[0].store, ignore_errors=True)
