"""A clock for the code that takes one (`clock=`): the test moves time by hand."""

from __future__ import annotations


class FakeClock:
    """A clock the test moves by hand: call it for the time, advance() to let time pass."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float = 1.0) -> None:
        self.now += seconds
