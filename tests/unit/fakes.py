"""Fakes shared by the unit tests that are not the RAG pipeline's (those are in rag_fakes.py)."""

from __future__ import annotations


class FakeClock:
    """A clock the test moves by hand: call it for the time, advance() to let time pass."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float = 1.0) -> None:
        self.now += seconds


def unplanned_edge(state_dir, gateway: dict | None = None):
    """The gateway's outer settings for an app built alone (no plan): the schema's fixed guard marks and the
    profile schema's gateway section with `gateway`'s fields over it."""
    from planner.guard import unplanned_guard
    from planner.outputs import GatewayEdge
    from planner.profile import GatewaySpec

    return GatewayEdge(
        state_dir=str(state_dir),
        tenants_file=None,
        guard=unplanned_guard(),
        gateway=GatewaySpec.model_validate(gateway or {}),
    )
