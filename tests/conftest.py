"""Test order by what a test does to the stack, not by file name.

Integration tests share one stack per variant (tests/integration/conftest.py). Tests that harm it run
after those that only use it, in the order of STAGES; within a stage, collection order. Mark a module
or test with `@pytest.mark.late("<stage>")` (the first stage too: it names where the test stands). `@pytest.mark.slow` marks the long ones (`make test-fast`
leaves them out).
"""

from __future__ import annotations

import pytest

STAGES = (
    "fresh clone",  # a new clone's `make serve`, while the session's stack starts beside it (below)
    "measures the stack",  # memory against the plan, before other tests' inputs shape the replicas' heaps
    "shares the stack",  # the default: reads and writes through the session's stack
    "kills replicas",  # the stack recovers, but its processes and timings are not the fresh ones
    "loads the stack",  # stress: floods, kills and restarts under load
    "stops the stack",  # its own stack variant, after stopping the session's (one engine pool at a time)
    "swaps the embedder",  # another embedder's stack (configs/cpu-mpnet.yaml), after every other stack
)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "late(stage): run after the tests of earlier stages; one of " + ", ".join(STAGES)
    )
    config.addinivalue_line(
        "markers", "slow: minutes of its own (float32 speculation stacks, bench and stress smokes, fresh clone)"
    )


def stage_of(item) -> int:
    marker = item.get_closest_marker("late")
    if marker is None:
        return STAGES.index("shares the stack")
    stage = marker.args[0]
    if stage not in STAGES:
        raise pytest.UsageError(f"{item.nodeid}: unknown late stage {stage!r}; one of {STAGES}")
    return STAGES.index(stage)


def pytest_collection_modifyitems(items):
    items.sort(key=stage_of)  # stable: collection order within a stage


@pytest.fixture(scope="session")
def launched_stack(tmp_path_factory):
    """The integration tests' session stack, launched and not waited for; stopped at the session's end.
    tests/integration/conftest.py's `stack` waits until it is healthy. The README's e2e test, which runs
    first, asks for it before its own `make serve`, so the two stacks start at once: a start is mostly one
    process at a time importing vLLM and torch, about one core of the two (vmstat: 40% idle), so the
    second start costs little more than the first."""
    from tests.integration.conftest import launch_session_stack

    running, owned = launch_session_stack(tmp_path_factory)
    try:
        yield running
    finally:
        if owned:  # a stack reused from a developer's shell is theirs to stop
            running.stop()
