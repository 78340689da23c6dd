"""The stand-in model: a real local server speaking the OpenAI and Anthropic protocols whose
answers a function writes, and the provider a scenario's ``provider.stand_in`` runs on it.

Its own room because both sides need it: the run starts a scenario's scripted stand-in
(:class:`StandInProvider`), and ``pantheon.testing`` gives tests the server itself. Neither
depends on the other through it: it imports nothing of the run.
"""

from pantheon.standin._provider import StandInProvider, load_reply
from pantheon.standin._server import (
    ModelServer,
    ReceivedRequest,
    Reply,
    Responder,
    classify_reply,
    openai_view,
    schema_reply,
)

__all__ = [
    "ModelServer",
    "ReceivedRequest",
    "Reply",
    "Responder",
    "StandInProvider",
    "classify_reply",
    "load_reply",
    "openai_view",
    "schema_reply",
]
