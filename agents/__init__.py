"""The nine agent roles and their base class."""

from agents._effects import Effects, LiveEffects

__all__ = ["Effects", "LiveEffects"]
