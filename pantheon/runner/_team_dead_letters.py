"""The whole team's dead letters for its Monitors, in a multi-process run.

A Monitor samples ``bus.stats()`` of the bus it runs on; in a ZeroMQ or NATS run a dead
letter is in the queue of the process where it happened (a handler that failed on a node,
or the publisher's, for ``node_lost``), so a Monitor on the driver never saw the payer's
failures on its node: one process alerted, three did not, and a diff of the two runs
found the alert in one only. The driver already polls every node's counters while the
run goes (inputs progressing, then quiet); each status now carries the node's dead
letters. The driver's Monitors read the nodes' sum; a node hosting a Monitor is told the
rest of the team's sum (``team_dead_letters``, one line on its control pipe, taken at once
by its reader) whenever that changed. Each figure is as fresh as the last poll (every
20-50 ms while the driver watches; not while it only waits out a ``kill_node`` time), and
a killed node's last figure stays: its dead letters happened.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agents import Monitor
from pantheon.runner._build import Team

__all__ = ["TEAM_DEAD_LETTERS_COMMAND", "TeamDeadLetters", "monitor_nodes"]

#: The driver's line to a node hosting a Monitor: the rest of the team's dead letters.
TEAM_DEAD_LETTERS_COMMAND = "team_dead_letters"


class TeamDeadLetters:
    """Dead letters the team's other processes hold, as this process last heard: what its
    Monitors add to their own bus's (``Monitor.dead_letters_elsewhere``)."""

    __slots__ = ("_told", "elsewhere")

    def __init__(self) -> None:
        self.elsewhere = 0
        #: The driver: what each node hosting a Monitor was told last.
        self._told: dict[str, int] = {}

    def __call__(self) -> int:
        return self.elsewhere

    def serve(self, team: Team) -> None:
        """Give this process's Monitors the figure (a process hosting none needs nothing)."""
        for monitor in team.of_role(Monitor):
            monitor.dead_letters_elsewhere = self

    def heard(self, command: Mapping[str, Any]) -> None:
        """A node: the driver's :data:`TEAM_DEAD_LETTERS_COMMAND` line."""
        self.elsewhere = int(command.get("dead_letters") or 0)

    def polled(
        self,
        own: Mapping[str, Any],
        nodes: Mapping[str, Mapping[str, Any] | None],
        watching: set[str],
    ) -> dict[str, int]:
        """The driver: ``own`` its bus's status, ``nodes`` each node's last polled one (None
        before its first). Keeps the nodes' dead letters summed for the driver's Monitors,
        and returns what to tell each node of ``watching`` (those hosting a Monitor) whose
        figure changed: the team's dead letters but its own."""
        held = {node: int((s or {}).get("dead_letters") or 0) for node, s in nodes.items()}
        self.elsewhere = sum(held.values())
        team = int(own.get("dead_letters") or 0) + self.elsewhere
        tell = {}
        for node in watching:
            rest = team - held.get(node, 0)
            if self._told.get(node) != rest:
                self._told[node] = tell[node] = rest
        return tell


def monitor_nodes(hosts: Mapping[str, tuple[str, ...]], team: Team) -> set[str]:
    """The processes of ``hosts`` (process -> agents) that host one of ``team``'s Monitors
    (``team``: every agent of the scenario)."""
    monitors = {m.name for m in team.of_role(Monitor)}
    return {node for node, agents in hosts.items() if monitors.intersection(agents)}
