"""Running a scenario: building the team, its inputs, the run loop, multi-process runs on
either transport, and the report."""

__all__: list[str] = []
