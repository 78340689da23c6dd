"""Pantheon's runtime: scenarios, sessions, the CLI. Depends on ``agents`` and ``bus``."""
