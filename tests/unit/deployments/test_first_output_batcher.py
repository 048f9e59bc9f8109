"""The chat replica's stream batcher: the first output leaves at once, later ones per interval."""

import asyncio
import time

import pytest

from deployments.chat import FirstOutputBatcher


async def _engine(steps: list[list[str]], step_s: float, fail: bool = False):
    """An engine stream: each step's chunks back to back, then a pause (the next decode step)."""
    for chunks in steps:
        await asyncio.sleep(step_s)
        for chunk in chunks:
            yield chunk
    if fail:
        raise RuntimeError("engine died")


def _collect(engine, interval_ms) -> list[tuple[float, list[str]]]:
    return asyncio.run(_batches(engine, interval_ms))


async def _batches(engine, interval_ms) -> list[tuple[float, list[str]]]:
    batcher = FirstOutputBatcher(engine, interval_ms=interval_ms)  # needs the running loop
    started, out = time.monotonic(), []
    async for batch in batcher.stream():
        out.append((time.monotonic() - started, list(batch)))
    return out


def test_first_output_leaves_before_the_interval_and_the_rest_is_batched():
    steps = [["role", "Hello"]] + [[f" t{i}"] for i in range(10)]
    batches = _collect(_engine(steps, 0.01), 200)
    first_at, first = batches[0]
    assert first == ["role", "Hello"], "the role chunk and the first token of the same step go together"
    assert first_at < 0.1, f"first batch after {first_at:.3f}s; the interval is 0.2s"
    assert sum(len(b) for _, b in batches) == 12, "nothing lost"
    assert len(batches) <= 3, "after the first, outputs are still batched per interval"


def test_an_engine_failure_reaches_the_caller_and_an_empty_stream_ends():
    with pytest.raises(RuntimeError, match="engine died"):
        _collect(_engine([], 0.01, fail=True), 50)
    with pytest.raises(RuntimeError, match="engine died"):
        _collect(_engine([["a"], ["b"]], 0.01, fail=True), 50)
    assert _collect(_engine([], 0.01), 50) == []


def test_no_batching_and_one_batch_keep_the_batchers_own_behaviour():
    steps = [["a"], ["b"], ["c"]]
    unbatched = _collect(_engine(steps, 0.005), 0)
    assert [b for _, b in unbatched] == [["a"], ["b"], ["c"]]
    whole = _collect(_engine(steps, 0.005), None)
    assert [b for _, b in whole] == [["a", "b", "c"]]
