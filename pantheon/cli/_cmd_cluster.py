"""``pantheon broker | node | keys``: ZeroMQ clusters by hand.

``pantheon run`` starts a broker and nodes by itself for a scenario with
``transport.kind: zmq``; these commands are for clusters laid out by hand, across machines:

    pantheon keys keys/ --name broker; pantheon keys keys/ --name node1
    mkdir allowed && cp keys/node1.key allowed/
    pantheon broker --bind tcp://0.0.0.0:5555 --curve-secret keys/broker.key_secret --allow allowed
    pantheon node --connect tcp://HOST:5555 --agents reasoner,memory --scenario s.yaml \\
        --curve-secret keys/node1.key_secret --server-key keys/broker.key

Exit codes: 0 stopped by SIGINT/SIGTERM (or keys written), 1 refused (a key file exists),
2 a usage error or a broker/node that could not start (the message says which and why).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from pantheon.cli._common import SeedOpt, fail, run_async
from pantheon.scenario import ROLES
from pantheon.scenario.internals import bind_is_local, broker_address_problem

__all__ = ["register"]

#: Agent configuration for a node started without ``--scenario``: the built-in roles at their
#: defaults, less the Reasoner, which asks its team's question and so needs the team's scenario.
_DEFAULT_SCENARIO = (
    "version: 1\nname: node\ninput: {kind: generator, topic: node.idle, count: 1}\nagents:\n"
    + "".join(f"  {role}: {{}}\n" for role in ROLES if role != "reasoner")
)


def _info(message: str) -> None:
    Console(stderr=True, highlight=False, soft_wrap=True).print(escape(message))


def _zmq() -> Any:
    """The ZeroMQ backend, imported on first use: it imports pyzmq, and without it raises
    an ImportError naming the extra to install."""
    try:
        from bus.backends import zeromq
    except ImportError as exc:
        raise fail(str(exc)) from None
    return zeromq


def _load_keys(path: Path, what: str) -> Any:
    """A key pair from a ``pantheon keys`` secret file (``NAME.key_secret``)."""
    zmq = _zmq()
    try:
        keys = zmq.CurveKeys.load(path)
    except (OSError, ValueError) as exc:
        raise fail(f"{what} {path}: cannot read a CURVE key pair: {exc}") from None
    return keys


def _load_public(path: Path, what: str) -> list[bytes]:
    """Public keys from a ``NAME.key`` file, or from every ``*.key`` file in a directory."""
    zmq = _zmq()
    try:
        return list(zmq.load_public_keys(path))
    except (OSError, ValueError) as exc:
        raise fail(f"{what} {path}: {exc}") from None


# -- keys --------------------------------------------------------------------------------------


def keys(
    directory: Annotated[Path, typer.Argument(help="Directory for the key files (created).")],
    name: Annotated[str, typer.Option(help="File name stem: NAME.key and NAME.key_secret.")] = (
        "pantheon"
    ),
) -> None:
    """Write a CURVE key pair (ZeroMQ key files); refuses to overwrite.

    NAME.key is the public key: copy it into the broker's --allow directory (a node's) or
    give it to nodes as --server-key (the broker's). NAME.key_secret holds both keys; keep
    it private (mode 0600).
    """
    if not name or any(c in name for c in "/\\."):
        raise fail(f"--name {name!r}: use a plain file name stem such as 'node1' (no '.' or '/')")
    public, secret = directory / f"{name}.key", directory / f"{name}.key_secret"
    existing = [str(p) for p in (public, secret) if p.exists()]
    if existing:
        raise fail(f"refusing to overwrite {', '.join(existing)}: pick another --name", 1)
    pair = _zmq().CurveKeys.generate()
    public, secret = pair.save(directory / name)
    typer.echo(f"public key  {public}\nsecret key  {secret}\n{pair.public.decode()}")


# -- broker ------------------------------------------------------------------------------------


def broker(
    bind: Annotated[
        str, typer.Option(help="Address to bind; 127.0.0.1 unless you mean the network.")
    ] = "tcp://127.0.0.1:5555",
    curve_secret: Annotated[
        Path | None,
        typer.Option(help="The broker's NAME.key_secret (from `pantheon keys`): CURVE on."),
    ] = None,
    allow: Annotated[
        Path | None,
        typer.Option(
            help="Directory of node public keys (*.key); only those nodes may join. "
            "Required with --curve-secret.",
            show_default=False,
        ),
    ] = None,
    heartbeat: Annotated[float, typer.Option(help="Seconds between heartbeats.")] = 1.0,
    liveness: Annotated[int, typer.Option(help="Missed heartbeats before a node is lost.")] = 3,
    stats_every: Annotated[
        float, typer.Option(help="Seconds between stats lines on stderr; 0: never.")
    ] = 10.0,
    insecure: Annotated[
        bool,
        typer.Option(
            "--insecure",
            help="Bind a network (non-loopback) address without CURVE: anyone who reaches "
            "it may join, read and inject messages.",
        ),
    ] = False,
    control: Annotated[
        bool, typer.Option(hidden=True, help="Driven by `pantheon run` over stdin/stdout.")
    ] = False,
) -> None:
    """Run a ZeroMQ broker until SIGINT/SIGTERM; nodes connect to it with `pantheon node`."""
    if not (math.isfinite(stats_every) and stats_every >= 0):
        raise fail(f"--stats-every {stats_every}: give seconds, 0 or more (0: never)")
    problem = broker_address_problem(bind)
    if problem is not None:
        raise fail(f"--bind {bind}: {problem}")
    if curve_secret is None and not insecure and not bind_is_local(bind):
        # Without CURVE whoever reaches the port joins, and every node links to whatever
        # data endpoint it claims: on a network that has to be a choice, not a default.
        raise fail(
            f"--bind {bind} is reachable from the network and CURVE is off: pass "
            "--curve-secret and --allow, or --insecure to accept anyone who reaches it"
        )
    # CURVE here means authentication, not only encryption: the broker admits the node keys
    # on its allow-list, and each node's data socket admits only nodes the broker lists. So
    # the two options go together; either alone is a usage error, never a warning.
    if allow is not None and curve_secret is None:
        raise fail("--allow needs --curve-secret: keys are only checked with CURVE on")
    if curve_secret is not None and allow is None:
        raise fail(
            "--curve-secret needs --allow DIR, the directory of the public keys (*.key) of "
            "the nodes that may join: a CURVE broker admits only those"
        )
    zmq = _zmq()
    curve = _load_keys(curve_secret, "--curve-secret") if curve_secret else None
    allowed: list[bytes] = []
    if allow is not None:
        if not allow.is_dir():
            raise fail(f"--allow {allow}: not a directory of *.key files")
        allowed = _load_public(allow, "--allow")

    run_async(
        _serve_broker(
            zmq, bind, curve, allowed, heartbeat=heartbeat, liveness=liveness,
            stats_every=stats_every, control=control,
        )
    )  # fmt: skip


async def _serve_broker(
    zmq: Any,
    bind: str,
    curve: Any,
    allowed: list[bytes],
    *,
    heartbeat: float,
    liveness: int,
    stats_every: float,
    control: bool,
) -> None:
    """Start the broker and serve until SIGINT/SIGTERM: driven (``control``), answering the
    driver on stdout; by hand, printing the endpoint and a stats line every
    ``stats_every`` seconds on stderr."""
    from pantheon.runner import install_stop_signals

    stop = asyncio.Event()
    install_stop_signals(stop)
    try:
        server = zmq.Broker(
            bind, curve=curve, allow=allowed, heartbeat=heartbeat, liveness=liveness
        )
        await server.start()
    except Exception as exc:
        if control:
            from pantheon.runner import say_control

            say_control(sys.stdout, "error", message=f"cannot start a broker on {bind}: {exc}")
        raise fail(f"cannot start a broker on {bind}: {exc}") from None
    if control:
        from pantheon.runner import serve_broker

        try:
            await serve_broker(server)
        finally:
            await server.aclose()
        return
    try:
        security = (
            f"CURVE on, {len(allowed)} allowed key(s)"
            if curve
            else "no CURVE: plain text, anyone may join"
        )
        # stdout gets exactly the endpoint, so a script can read the real port of :0.
        print(server.endpoint, flush=True)
        _info(f"broker listening on {server.endpoint} ({security}); Ctrl-C stops it")
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(stats_every or None):
                    await stop.wait()
            if not stop.is_set():
                _info(f"broker {_brief(server.stats())}")
    finally:
        await server.aclose()
    _info(f"broker stopped: {_brief(server.stats())}")


def _brief(stats: dict[str, Any]) -> str:
    numbers = {k: v for k, v in stats.items() if type(v) in (int, float)}
    return ", ".join(f"{k} {v}" for k, v in numbers.items())


# -- node --------------------------------------------------------------------------------------


def node(
    connect: Annotated[str, typer.Option(help="The broker's address.")] = "tcp://127.0.0.1:5555",
    agents: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated agent names to host (default: those the scenario places "
            "on --node).",
            show_default=False,
        ),
    ] = None,
    scenario: Annotated[
        Path | None,
        typer.Option(help="Scenario whose agent settings, policy and seed to use."),
    ] = None,
    name: Annotated[
        str | None,
        typer.Option("--node", help="This node's name (default node-PID).", show_default=False),
    ] = None,
    seed: SeedOpt = None,
    session: Annotated[
        str | None,
        typer.Option(
            help="Session id stamped on messages this node originates; on NATS also the run "
            "whose consumer groups it joins (without one, the team-wide ones)."
        ),
    ] = None,
    outbox: Annotated[
        Path | None, typer.Option(help="JSONL file for the Actor's tool calls.")
    ] = None,
    data: Annotated[
        str | None,
        typer.Option(
            help="Where this node's data socket listens, reachable by the other nodes "
            "(default: beside an ipc broker, or a free port on the interface that reaches "
            "the broker).",
            show_default=False,
        ),
    ] = None,
    curve_secret: Annotated[
        Path | None, typer.Option(help="This node's NAME.key_secret (CURVE on).")
    ] = None,
    server_key: Annotated[
        Path | None, typer.Option(help="The broker's public NAME.key (with --curve-secret).")
    ] = None,
    timeout: Annotated[
        float, typer.Option(help="Seconds to wait for the broker before giving up.")
    ] = 10.0,
    status_every: Annotated[
        float, typer.Option(help="Seconds between status lines on stderr; 0: never.")
    ] = 5.0,
    control: Annotated[
        bool, typer.Option(hidden=True, help="Driven by `pantheon run` over stdin/stdout.")
    ] = False,
    journal: Annotated[
        bool,
        typer.Option(
            hidden=True, help="With --control and --session: ship this node's record to the driver."
        ),
    ] = False,
) -> None:
    """Host some agents on a ZeroMQ broker (or, for a scenario with transport.kind nats, a
    NATS server: --connect nats://...) until SIGINT/SIGTERM."""
    _check_node_options(curve_secret, server_key, timeout, status_every)
    if not connect.startswith(("nats://", "tls://")):
        # libzmq wraps a port over 65535 round (70000 connects to 4464), as --bind would.
        problem = broker_address_problem(connect)
        if problem is not None:
            raise fail(f"--connect {connect}: {problem}")
    loaded = _node_scenario(scenario)
    wanted = [a.strip() for a in agents.split(",") if a.strip()] if agents is not None else None
    if wanted is None and name is None:
        raise fail("name the agents to host with --agents, or a placed node with --node")
    node_name = name or f"node-{os.getpid()}"
    host = _node_host(
        loaded, wanted, node_name, connect=connect, data=data, seed=seed, session=session,
        outbox=outbox, curve_secret=curve_secret, server_key=server_key, timeout=timeout,
        control=control,
    )  # fmt: skip
    if control:
        _serve_driven_node(host, journal=journal and session is not None)
    else:
        run_async(_serve_node(host, node_name, connect, status_every))


def _check_node_options(
    curve_secret: Path | None, server_key: Path | None, timeout: float, status_every: float
) -> None:
    """Exit 2 on options that cannot go together or are out of range."""
    if (curve_secret is None) != (server_key is None):
        raise fail("CURVE needs both --curve-secret (this node's) and --server-key (broker's)")
    if not (math.isfinite(timeout) and timeout > 0):
        raise fail(f"--timeout {timeout}: give seconds, more than 0")
    if not (math.isfinite(status_every) and status_every >= 0):
        raise fail(f"--status-every {status_every}: give seconds, 0 or more (0: never)")


def _node_scenario(path: Path | None) -> Any:
    """The scenario the node builds its agents from: the file given, else the built-in
    roles' defaults; exits 2 when it is invalid or unreadable."""
    from pantheon.scenario import ScenarioError, load_scenario, parse_scenario

    try:
        return (
            load_scenario(path)
            if path is not None
            else parse_scenario(_DEFAULT_SCENARIO, source="<node defaults>")
        )
    except (ScenarioError, OSError) as exc:
        raise fail(f"invalid scenario\n{exc}") from None


def _node_host(
    loaded: Any,
    wanted: list[str] | None,
    node_name: str,
    *,
    connect: str,
    data: str | None,
    seed: int | None,
    session: str | None,
    outbox: Path | None,
    curve_secret: Path | None,
    server_key: Path | None,
    timeout: float,
    control: bool,
) -> Any:
    """The node's host, built and not yet started; exits 2 when it cannot be built, having
    told the driver why first when it is driven (``control``)."""
    from pantheon.runner import AgentSetupError, ClusterError, NodeHost

    keys = _load_keys(curve_secret, "--curve-secret") if curve_secret else None
    server = _load_public(server_key, "--server-key")[0] if server_key else None
    try:
        telemetry = _node_telemetry(loaded, node_name)
        host = NodeHost(
            loaded,
            wanted,
            connect=connect,
            node=node_name,
            data=data,
            seed=seed,
            session_id=session,
            outbox_path=outbox,
            curve=keys,
            server_key=server,
            connect_timeout=timeout,
            telemetry=telemetry,
        )
    except (ClusterError, AgentSetupError) as exc:
        if control:
            from pantheon.runner import say_control

            say_control(sys.stdout, "error", message=str(exc))
        raise fail(str(exc)) from None
    return host


def _serve_driven_node(host: Any, *, journal: bool) -> None:
    """Serve a node ``pantheon run`` drives over stdin/stdout until the driver says to
    leave (``journal``: ship its record to the driver)."""
    from pantheon.live import NodeParts
    from pantheon.runner import ClusterError, serve_node

    try:
        run_async(serve_node(host, journal=journal, live=NodeParts))
    except ClusterError as exc:
        raise fail(str(exc)) from None


async def _serve_node(host: Any, node_name: str, connect: str, status_every: float) -> None:
    """Start a node by hand and serve until SIGINT/SIGTERM, a status line every
    ``status_every`` seconds on stderr, then stop it and say what it handled."""
    from pantheon.runner import ClusterError, install_stop_signals

    stop = asyncio.Event()
    install_stop_signals(stop)
    try:
        await host.start()
    except ClusterError as exc:
        raise fail(str(exc)) from None
    _info(
        f"node {node_name} joined {connect}, hosting {', '.join(host.team.agents)}; Ctrl-C stops it"
    )
    try:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(status_every or None):
                    await stop.wait()
            _info(_node_line(node_name, host.status(), host))
    finally:
        await host.stop_agents()
        report = host.report()
        await host.aclose()
    handled = sum(h["handled"] for h in report["subscribers"].values())
    _info(f"node {node_name} stopped: handled {handled}, dead letters {report['dlq']}")


def _node_telemetry(scenario: Any, node: str) -> Any:
    """Logging, and the exporters the scenario and the ``OTEL_*`` variables ask for, as
    ``pantheon run`` sets them up in its own process (a driven node inherits its
    environment): so a message's trace goes on in this process. A setting that cannot be
    honoured is a ClusterError, reported like any other start-up failure."""
    from pantheon.runner import ClusterError
    from pantheon.telemetry import Telemetry, TelemetryConfigError, configure_logging

    try:
        configure_logging()
        return Telemetry.for_scenario(scenario, node=node)
    except (TelemetryConfigError, ValueError, ImportError) as exc:
        raise ClusterError(f"observability: {exc}") from None


def _node_line(name: str, status: dict[str, Any], host: Any) -> str:
    offset = status.get("clock_offset_ns")
    clock = (
        "exactly known (same machine)"
        if status.get("clock_shared")
        else "not yet measured"
        if offset is None
        else f"{offset / 1000:+.1f} µs (estimated)"
    )
    handled = sum(s.delivered + s.dead_lettered for s in host.bus.stats().subscribers.values())
    return (
        f"node {name}: handled {handled}, outstanding {status['outstanding']}, "
        f"in flight {status['in_flight']}, clock offset to broker {clock}"
    )


# -- run summary -------------------------------------------------------------------------------


def register(app: typer.Typer) -> None:
    """Add ``broker``, ``node`` and ``keys`` to the ``pantheon`` app."""
    app.command("broker")(broker)
    app.command("node")(node)
    app.command("keys")(keys)
