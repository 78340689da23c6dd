"""What Pantheon's other rooms use of the scenario package beyond its public face.

The runner builds agents from their configs (:func:`agent_class`, :func:`resolve_handler`,
:func:`provider_class`), the CLI checks a broker address (:func:`broker_address_problem`)
and tells a local one (:func:`bind_is_local`), and the what-if overlay reads and locates its
own YAML as a scenario's is (:func:`read_marked` and the location helpers). A team's code
never needs these: ``pantheon.scenario.__all__`` is its face, and tests/oncall refuses an
import from an ``internals`` module.
"""

from pantheon.scenario._agents import agent_class, resolve_handler
from pantheon.scenario._locate import (
    Loc,
    dotted,
    locate,
    read_marked,
    suggest,
)
from pantheon.scenario._schema import bind_is_local, broker_address_problem, provider_class

__all__ = [
    "Loc",
    "agent_class",
    "bind_is_local",
    "broker_address_problem",
    "dotted",
    "locate",
    "provider_class",
    "read_marked",
    "resolve_handler",
    "suggest",
]
