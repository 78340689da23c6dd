"""The ``pantheon`` command: one module per command group, the shared helpers in one place."""

from pantheon.cli._common import run_async
from pantheon.cli._main import app, main

__all__ = ["app", "main", "run_async"]
