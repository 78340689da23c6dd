"""A scenario's own stand-in model: ``provider: {kind: openai, model: ..., stand_in:
"pkg.module:reply"}`` runs the team against a real :class:`ModelServer` answering with the
team's function, so a team of model agents runs offline, in CI, from its scenario alone.

The server is started by the provider itself on the first model call or
:meth:`StandInProvider.check` (which a run makes before its input flows), on a free port of
127.0.0.1, and stopped when the provider is closed at the end of the run. Started lazily
rather than when the team is built, because the same team is built for a replay, whose
model calls are all served from the record: a replay never starts it, and a what-if starts
it only if one of its model calls runs live.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from agents import ChatResult, OpenAIProvider
from pantheon._imports import load_object
from pantheon.standin._server import ModelServer, Responder

__all__ = ["StandInProvider", "load_reply"]


def load_reply(spec: str) -> Responder:
    """The reply function ``spec`` (``"module:name"``) names: a callable taking the request
    body, as :class:`ModelServer`'s ``reply`` takes. ``ValueError`` (an
    :class:`~pantheon._imports.ImportProblem`) saying what is wrong otherwise."""
    fn = load_object(spec)
    if not callable(fn) or isinstance(fn, type):
        raise ValueError(
            f"{spec!r} is not a function of the request (it is a {type(fn).__name__}): "
            "give a function taking the request body and returning a Reply, text or a mapping"
        )
    reply: Responder = fn
    return reply


class StandInProvider:
    """An OpenAI-compatible provider whose server it runs itself (see the module docstring).

    Named ``openai`` like the provider it wraps: its calls are the ``model.openai.chat``
    effects a real server's would be, so a session recorded on the stand-in and one recorded
    on a real model are compared and replayed alike. ``options`` are
    :class:`agents.OpenAIProvider`'s keyword settings (timeouts, retries, connections)."""

    name = "openai"

    def __init__(self, reply: Responder, model: str, **options: Any) -> None:
        self.model = model
        self._reply = reply
        self._options = options
        self._server: ModelServer | None = None
        self._inner: OpenAIProvider | None = None

    def request_identity(self) -> Any:
        """What decides the answers (:class:`agents.RequestIdentity`): the reply function and
        the model name, not the server's port, which is new at every start."""
        return ("stand-in", self._reply, self.model)

    @property
    def server(self) -> ModelServer | None:
        """The running server; None before the first call and after :meth:`aclose`."""
        return self._server

    def _provider(self) -> OpenAIProvider:
        # No await between the check and the assignment: concurrent first calls on the one
        # event loop start a single server.
        if self._inner is None:
            server = ModelServer(self._reply).start()
            self._server = server
            self._inner = OpenAIProvider(server.base_url, self.model, None, **self._options)
        return self._inner

    async def check(self) -> None:
        """Start the server and ready the client's connection, as a real server's check does."""
        await self._provider().check()

    async def chat(self, messages: Sequence[Mapping[str, Any]], **options: Any) -> ChatResult:
        """The OpenAI provider's call, on the stand-in started by the first one."""
        return await self._provider().chat(messages, **options)

    async def aclose(self) -> None:
        """Close the client, then stop the server (if either was started)."""
        inner, self._inner = self._inner, None
        server, self._server = self._server, None
        if inner is not None:
            await inner.aclose()
        if server is not None:
            # Joins the server's thread (its accept loop polls every 50 ms): off the loop.
            await asyncio.to_thread(server.close)
