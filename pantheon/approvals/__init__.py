"""Approvals: the desk a running team asks, and the decisions people make from anywhere."""

__all__: list[str] = []
