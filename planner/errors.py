"""Why a profile cannot be planned."""


class PlanError(ValueError):
    """The profile does not fit its pool (or a pinned value cannot be kept); the message says why."""


class Overcommit(ValueError):
    """The plan needs more than the pool has; carries the figures for re-planned advice."""

    def __init__(self, message: str, needed: int, free: int):
        super().__init__(message)
        self.needed, self.free = needed, free


class EngineError(ValueError):
    """The chat section cannot be planned as pinned."""
