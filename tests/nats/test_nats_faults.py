"""Faults on NATS, for real: a node SIGKILLed, the server restarted, a cluster member lost,
a poison message, a client without credentials. Every test counts: what was published is
all delivered or in the dead letter queue (delivered + DLQ covers published)."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import sys
import time
from pathlib import Path

import msgspec
import pytest
from nats_helpers import eventually

from bus import Bus, DeadLetter, Envelope
from bus.backends.nats import (
    AuthorizationError,
    NatsServer,
    NatsTransport,
    nats_cluster,
    start_cluster,
    stop_cluster,
)

CHILD = Path(__file__).with_name("nats_node_child.py")


async def _spawn(
    url: str, node: str, outfile: Path, team: str = "faults", **options: object
) -> asyncio.subprocess.Process:
    args = [str(CHILD), url, team, node, "workers", "jobs", str(outfile)]
    for key, value in options.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *args, stdout=asyncio.subprocess.PIPE, env=os.environ.copy()
    )
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 30)
    assert line.strip() == b"ready", f"node {node} did not start: {line!r}"
    return proc


async def test_a_session_never_handles_another_s_and_what_a_dead_one_left_is_counted(
    server: NatsServer, tmp_path: Path
) -> None:
    """Two runs of one team on one server, with the same node and group names: each
    session's consumer groups are its own, so neither handles the other's messages. A run
    whose member was SIGKILLed holding its messages left them in its groups: listed by
    session (once nobody pulls there), never given to the other run, and gone from the list
    once its groups are discarded."""
    out = tmp_path / "run-1.txt"
    dead = await _spawn(
        server.url, "work", out, team="two", delay=600, ack_wait=600, session="run-1"
    )
    got: list[object] = []
    try:

        def node(session: str, name: str) -> Bus:
            transport = NatsTransport(server.url, team="two", node=name)
            return Bus(transport=transport, session_id=session)

        pub1 = node("run-1", "pub")
        await pub1.start()
        try:
            async with node("run-2", "pub") as pub2, node("run-2", "work") as work2:
                work2.on("jobs", lambda env: got.append(env.payload), name="workers")
                await work2.transport.sync()
                for pub in (pub1, pub2):
                    await eventually(functools.partial(pub.transport.has_remote, "jobs"))
                for i in range(3):
                    await pub1.emit("jobs", f"one-{i}")
                    await pub2.emit("jobs", f"two-{i}")
                await pub2.drain(timeout=10)
                stats = pub1.transport.stats  # type: ignore[attr-defined]
                await eventually(lambda: stats()["awaiting_stream_ack"] == 0)
                dead.kill()  # SIGKILL, holding (or never pulled) what run-1 sent it
                await dead.wait()
                looker = NatsTransport(server.url, team="two", node="looker")
                async with Bus(transport=looker):
                    # Listed once the dead member's pull requests expired on the server;
                    # run-2, still pulling, is not a leftover.
                    left: dict[str, int] = {}

                    async def listed() -> bool:
                        left.update(await looker.leftovers())
                        return bool(left)

                    async with asyncio.timeout(20):
                        while not await listed():  # noqa: ASYNC110 - the server's state
                            await asyncio.sleep(0.2)
                    assert left == {"run-1": 3}
                    assert await looker.discard("run-1") == 3  # one consumer per lane
                    assert await looker.leftovers() == {}
        finally:
            await pub1.aclose(drain=False)
    finally:
        if dead.returncode is None:
            dead.kill()
            await dead.wait()
    assert got == ["two-0", "two-1", "two-2"]
    assert not out.exists() or out.read_text() == ""  # the dead one handled nothing


async def _two_members_talk(url: str, login: dict[str, str], payload: str) -> None:
    """Two buses that log in with ``login`` pass ``payload`` from one to the other."""
    async with (
        Bus(transport=NatsTransport(url, **login)) as a,
        Bus(transport=NatsTransport(url, **login)) as b,
    ):
        got: list[object] = []
        b.on("hello", lambda env: got.append(env.payload), name="greeter")
        await b.transport.sync()
        await eventually(lambda: a.transport.has_remote("hello"))
        await a.emit("hello", payload)
        await eventually(lambda: got == [payload])


def _handled(*files: Path) -> list[int]:
    out: list[int] = []
    for f in files:
        if f.exists():
            out += [int(x) for x in f.read_text().split()]
    return out


async def test_a_sigkilled_node_s_unacked_messages_go_to_another_member(
    server: NatsServer, tmp_path: Path
) -> None:
    """Two processes share the group; one is SIGKILLed holding messages it had not
    acknowledged. After ack_wait the server gives them to the survivor: 0 lost."""
    a_out, b_out = tmp_path / "a.txt", tmp_path / "b.txt"
    opts = {"delay": 0.01, "ack_wait": 1.0, "credit": 16}
    a = await _spawn(server.url, "node-a", a_out, **opts)
    b = await _spawn(server.url, "node-b", b_out, **opts)
    try:
        transport = NatsTransport(server.url, team="faults", node="publisher")
        async with Bus(transport=transport) as bus:
            await eventually(lambda: bus.transport.has_remote("jobs"))
            total = 300
            for i in range(total):
                await bus.emit("jobs", i)
            await eventually(lambda: len(_handled(a_out)) >= 30)
            a.send_signal(signal.SIGKILL)
            await a.wait()
            at_kill = set(_handled(a_out))
            await eventually(lambda: set(_handled(a_out, b_out)) >= set(range(total)), 30)
            dead = await transport.dead_letters()
            assert dead == [] and len(bus.dlq) == 0
        by_b = set(_handled(b_out))
        assert set(_handled(a_out)) == at_kill  # a did nothing after its death
        assert len(at_kill | by_b) == total  # delivered + DLQ covers published; DLQ empty
        b.send_signal(signal.SIGTERM)
        assert b.stdout is not None
        stats = json.loads((await asyncio.wait_for(b.stdout.read(), 30)).decode().splitlines()[-1])
        # What a held unacknowledged when it died reached b again after ack_wait.
        assert stats["redelivered"] >= 1, stats
    finally:
        for proc in (a, b):
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
                await proc.wait()


async def test_a_restarted_server_loses_nothing_acknowledged(tmp_path: Path) -> None:
    """The server is SIGKILLed mid-run, with a backlog acknowledged by the stream and not
    yet handled, and started again on the same port and store: the clients reconnect,
    resend what had no stream ack (deduplicated by Nats-Msg-Id) and pull again; every
    message published arrives, none twice."""
    server = await asyncio.to_thread(NatsServer(store=tmp_path).start)
    try:
        # ack_wait 2 s: what the server had sent when it died (lost on the wire, so never
        # acknowledged) comes again after it, instead of after the default 30 s.
        opts = {"team": "restart", "ack_timeout": 0.5, "ack_wait": 2.0, "connect_timeout": 10.0}
        async with (
            Bus(transport=NatsTransport(server.url, node="pub", **opts)) as pub,
            Bus(transport=NatsTransport(server.url, node="sub", credit=6, **opts)) as sub,
        ):
            got: list[int] = []

            @sub.on("orders.*", name="orders")
            async def slow(env: Envelope) -> None:
                await asyncio.sleep(0.004)  # slower than the publisher: a backlog builds up
                got.append(env.payload)

            await sub.transport.sync()
            await eventually(lambda: pub.transport.has_remote("orders.new"))
            total = 400

            async def publish() -> None:
                for i in range(total):
                    await pub.emit("orders.new", i)
                    await asyncio.sleep(0.001)

            task = asyncio.create_task(publish())
            await eventually(lambda: len(got) >= 60)
            stored = pub.transport.stats()["acked_by_stream"]  # type: ignore[attr-defined]
            # Acknowledged by the stream and not yet handled: only the store has these.
            assert stored - len(got) > 30, (stored, len(got))
            await asyncio.to_thread(server.kill)
            await asyncio.sleep(0.3)
            await asyncio.to_thread(server.start)
            await task
            await eventually(lambda: len(set(got)) == total, 30)
            await pub.drain(timeout=30)
            assert sorted(got) == list(range(total))  # each once: resends were deduplicated
            stats = pub.transport.stats()  # type: ignore[attr-defined]
            assert stats["reconnects"] >= 1
            assert len(pub.dlq) == 0
    finally:
        await asyncio.to_thread(server.stop)


async def test_a_three_server_cluster_survives_losing_one() -> None:
    """A replicated stream (R3) on three routed servers; the server a client is connected
    to is SIGKILLed mid-run: the clients move to the others, the run completes, 0 lost."""
    servers = nats_cluster(3)
    try:
        await asyncio.to_thread(start_cluster, servers)
        urls = [s.url for s in servers]
        opts = {"team": "cluster", "replicas": 3, "ack_timeout": 1.0, "connect_timeout": 20.0}
        async with (
            Bus(transport=NatsTransport(urls[0], node="pub", **opts)) as pub,
            Bus(transport=NatsTransport(urls[1:], node="sub-1", **opts)) as sub1,
            Bus(transport=NatsTransport([urls[2], urls[1]], node="sub-2", **opts)) as sub2,
        ):
            got: list[int] = []
            for b in (sub1, sub2):
                b.on("work", lambda env: got.append(env.payload), name="workers")
                await b.transport.sync()
            await eventually(lambda: pub.transport.has_remote("work"))
            # The publisher's connection is to server 0 only at first; it learns the others
            # from the cluster's INFO and reconnects to one of them.
            total = 300

            async def publish() -> None:
                for i in range(total):
                    await pub.emit("work", i)
                    await asyncio.sleep(0.002)

            task = asyncio.create_task(publish())
            await eventually(lambda: len(got) >= 80)
            await asyncio.to_thread(servers[0].kill)
            await task
            await eventually(lambda: len(set(got)) == total, 40)
            assert set(got) == set(range(total))
            assert len(pub.dlq) == 0
    finally:
        await asyncio.to_thread(stop_cluster, servers)


async def test_a_poison_message_goes_to_the_dlq_and_others_pass(server: NatsServer) -> None:
    """A handler that always fails on one message: after max_deliver deliveries it is in
    the DLQ stream with its count and last error (where any publisher lists it), and the
    other messages are handled once each; redrive republishes it to that subscription."""
    opts = {"team": "poison", "max_deliver": 3, "backoff": (0.02, 0.1)}
    async with (
        Bus(transport=NatsTransport(server.url, node="pub", **opts)) as pub,
        Bus(transport=NatsTransport(server.url, node="worker", **opts)) as sub,
    ):
        handled: list[object] = []
        attempts: list[object] = []
        cured = False

        @sub.on("mail.*", name="triage")
        async def triage(env: Envelope) -> None:
            attempts.append(env.payload)
            if env.payload == "poison" and not cured:
                raise ValueError("cannot parse 'poison'")
            handled.append(env.payload)

        await sub.transport.sync()
        await eventually(lambda: pub.transport.has_remote("mail.in"))
        published: list[object] = [*range(10), "poison", *range(10, 20)]
        for payload in published:
            await pub.emit("mail.in", payload)
        transport = pub.transport
        assert isinstance(transport, NatsTransport)
        await eventually(lambda: transport.stats()["dlq_received"] == 1)
        await pub.drain(timeout=20)
        dead = await transport.dead_letters()
        assert [(d.envelope.payload, d.subscriber, d.deliveries) for d in dead] == [
            ("poison", "triage", 3)
        ]
        assert dead[0].error_type == "ValueError" and "cannot parse" in dead[0].error
        # The receiving bus lists each failed delivery with its traceback; the publisher's
        # own DLQ stays empty: the stream is where publishers see it, once.
        local = sub.dlq.entries()
        assert [(e.subscriber, e.reason, e.envelope.payload) for e in local] == [
            ("triage", "failed", "poison")
        ] * 3
        assert all("cannot parse 'poison'" in (e.traceback or "") for e in local)
        assert len(pub.dlq) == 0
        assert sorted(handled) == list(range(20))  # the others: each once, unaffected
        assert attempts.count("poison") == 3
        assert set(handled) | {d.envelope.payload for d in dead} >= set(published)
        cured = True
        assert await transport.redrive() == 1
        await eventually(lambda: "poison" in handled)
        assert await transport.dead_letters() == []
        assert attempts.count("poison") == 4


async def test_a_client_without_the_credentials_is_refused(tmp_path: Path) -> None:
    server = await asyncio.to_thread(NatsServer(users=[("alice", "s3cret")]).start)
    try:
        for creds in ({}, {"user": "alice", "password": "wrong"}):
            bus = Bus(transport=NatsTransport(server.url, team="auth", connect_timeout=5, **creds))
            with pytest.raises(AuthorizationError) as caught:
                await bus.start()
            message = str(caught.value)
            assert "\n" not in message
            assert message == (
                f"NATS at {server.url} refused node {bus.transport.node!r}: authorization "  # type: ignore[attr-defined]
                "violation (check transport.credentials: user/password, nkey or creds)"
            )
        await _two_members_talk(
            server.url, {"team": "auth", "user": "alice", "password": "s3cret"}, "world"
        )
    finally:
        await asyncio.to_thread(server.stop)


async def test_a_closing_member_gives_its_backlog_back(server: NatsServer) -> None:
    """A member that closes with messages queued and unhandled releases them (nak, no delay):
    the other member of the group handles every one, none waits for ack_wait."""
    opts = {"team": "release", "ack_wait": 60.0}
    async with (
        Bus(transport=NatsTransport(server.url, node="pub", **opts)) as pub,
        Bus(transport=NatsTransport(server.url, node="stays", **opts)) as stays,
    ):
        leaving = Bus(transport=NatsTransport(server.url, node="leaves", **opts))
        await leaving.start()
        hold = asyncio.Event()
        by_leaving: list[int] = []
        by_stays: list[int] = []

        @leaving.on("task", name="workers")
        async def slow(env: Envelope) -> None:
            await hold.wait()
            by_leaving.append(env.payload)

        await leaving.transport.sync()
        await eventually(lambda: pub.transport.has_remote("task"))
        for i in range(40):
            await pub.emit("task", i)
        await eventually(lambda: leaving.stats().subscribers["workers"].queued >= 5)
        stays.on("task", lambda env: by_stays.append(env.payload), name="workers")
        await stays.transport.sync()
        await leaving.aclose(drain=False)  # its backlog: released, not handled there
        released = leaving.transport.stats()["released"]  # type: ignore[attr-defined]
        assert released >= 5
        await eventually(lambda: set(by_stays) | set(by_leaving) == set(range(40)), 10)
        assert by_leaving == []  # it never got past the first message
        assert len(pub.dlq) == 0
        # Nor does the closing member list what it gave back as its own dead letters.
        assert len(leaving.dlq) == 0
        workers = leaving.stats().subscribers["workers"]
        assert workers.dead_lettered == 0
        assert workers.released == workers.published >= 5


async def test_a_client_without_the_nkey_is_refused(tmp_path: Path) -> None:
    import nkeys

    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    public = nkeys.from_seed(bytearray(seed)).public_key.decode()
    seed_file = tmp_path / "user.nk"
    seed_file.write_bytes(seed)
    server = await asyncio.to_thread(NatsServer(nkeys=[public]).start)
    try:
        anonymous = Bus(transport=NatsTransport(server.url, team="nk", connect_timeout=5))
        with pytest.raises(AuthorizationError, match="authorization violation"):
            await anonymous.start()
        await _two_members_talk(server.url, {"team": "nk", "nkey_seed": str(seed_file)}, "signed")
    finally:
        await asyncio.to_thread(server.stop)


async def test_undecodable_messages_in_the_stream_are_counted_dead_lettered_and_passed(
    server: NatsServer,
) -> None:
    """Any client of the server can publish into the team's stream. A message nested
    100,000 deep (RecursionError in the decoder), one whose string is not UTF-8 and a
    truncated one, published between good messages: each is counted as malformed, listed
    in the receiving bus's DLQ with its size and reason, terminated (never redelivered),
    and every good message is still handled once. It used to hang the run."""
    import nats

    opts = {"team": "junk", "max_deliver": 3, "backoff": (0.02, 0.1)}
    async with (
        Bus(transport=NatsTransport(server.url, node="pub", **opts)) as pub,
        Bus(transport=NatsTransport(server.url, node="worker", **opts)) as sub,
    ):
        handled: list[object] = []
        sub.on("mail.*", lambda env: handled.append(env.payload), name="triage")
        await sub.transport.sync()
        await eventually(lambda: pub.transport.has_remote("mail.in"))
        head = b"\x9c\xa7mail.in"  # a 12-field wire array, its topic; then the payload
        rest = msgspec.msgpack.encode([2, 99, None, 0, None, None, 0, 0, None, "pub"])[1:]
        junk = [head + b"\x91" * 100_000 + b"\xc0" + rest, b"\x9c\xa1\xff" + rest, head[:6]]
        client = await nats.connect(server.url)
        try:
            js = client.jetstream()
            for i in range(10):
                await pub.emit("mail.in", i)
                if i < len(junk):
                    await js.publish("pantheon.junk.normal._.mail.in", junk[i])
        finally:
            await client.close()
        transport = sub.transport
        assert isinstance(transport, NatsTransport)
        await eventually(lambda: transport.stats()["malformed"] == 3)
        await pub.drain(timeout=20)
        await eventually(lambda: sorted(handled) == list(range(10)))
        entries = sub.dlq.entries()
        assert [(e.subscriber, e.reason, e.envelope.payload) for e in entries] == [
            ("triage", "malformed", {"size": 100_023, "reason": "too_deep"}),
            ("triage", "malformed", {"size": 16, "reason": "malformed"}),
            ("triage", "malformed", {"size": 6, "reason": "malformed"}),
        ]
        assert [e.error_type for e in entries] == ["DecodeError"] * 3
        assert transport.stats()["redelivered"] == 0


async def test_undecodable_directory_entries_and_dlq_messages_are_skipped(
    server: NatsServer,
) -> None:
    """Junk in the directory bucket (read when a node starts) and in the DLQ stream (read
    when dead letters are listed or redriven): counted or logged and skipped; before, the
    late node's start and the listing raised RecursionError."""
    import nats

    deep = b"\x91" * 100_000 + b"\xc0"
    async with Bus(transport=NatsTransport(server.url, team="junk2", node="pub")) as pub:
        client = await nats.connect(server.url)
        try:
            js = client.jetstream()
            kv = await js.key_value("pantheon_nodes_junk2")
            await kv.put("_.intruder", deep)  # among the session-less nodes
            await js.publish("pantheon.dlq.junk2.pub", deep)
        finally:
            await client.close()
        async with Bus(transport=NatsTransport(server.url, team="junk2", node="late")) as late:
            transport = late.transport
            assert isinstance(transport, NatsTransport)
            assert transport.stats()["malformed"] == 1  # the intruder, read at start
            got: list[object] = []
            late.on("hello", lambda env: got.append(env.payload), name="greeter")
            await late.transport.sync()
            await eventually(lambda: pub.transport.has_remote("hello"))
            await pub.emit("hello", "still talking")
            await eventually(lambda: got == ["still talking"])
            publisher = pub.transport
            assert isinstance(publisher, NatsTransport)
            assert await publisher.dead_letters() == []
            assert await publisher.redrive() == 0


async def test_a_dlq_stream_entry_reads_as_a_bus_dead_letter(server: NatsServer) -> None:
    """What the stream lists is a ``bus.DeadLetter``: the envelope's id and topic, reason
    ``failed`` (its deliveries ran out), attempts its deliveries, and the wall time the
    stream stored it; beside it the node that gave up."""
    opts = {"team": "record", "max_deliver": 2, "backoff": (0.02, 0.05)}
    async with (
        Bus(transport=NatsTransport(server.url, node="pub", **opts)) as pub,
        Bus(transport=NatsTransport(server.url, node="worker", **opts)) as sub,
    ):

        @sub.on("mail.*", name="triage")
        async def triage(env: Envelope) -> None:
            raise ValueError("never")

        await sub.transport.sync()
        await eventually(lambda: pub.transport.has_remote("mail.in"))
        before = time.time()
        await pub.emit("mail.in", "poison")
        transport = pub.transport
        assert isinstance(transport, NatsTransport)
        await eventually(lambda: transport.stats()["dlq_received"] == 1)
        (entry,) = await transport.dead_letters()
    assert isinstance(entry, DeadLetter)
    assert (entry.envelope_id, entry.topic) == (entry.envelope.id, "mail.in")
    assert (entry.reason, entry.attempts, entry.seq, entry.node) == (
        "failed",
        2,
        entry.entry_id,
        "worker",
    )
    assert before - 1 <= entry.time <= time.time() + 1
