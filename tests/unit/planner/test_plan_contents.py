"""The retriever's plan for what it holds: index bytes per stored chunk and SQLite's cache up to its size."""

from __future__ import annotations

from planner.outputs import ContentsPlan
from planner.plan import build_plan
from planner.profile import load_profile


def test_the_retriever_plans_its_contents_within_its_growth_lines():
    plan = build_plan(load_profile("configs/cpu-tiny.yaml"))
    retriever = plan.replica("retriever")
    contents = retriever.contents
    dim = 384  # MiniLM
    assert contents.per_chunk_bytes == dim * 4 + 56  # flat: the vector and its id map entry
    full = contents.bytes_for(contents.capacity_chunks, database_bytes=10 * contents.cache_bytes)
    assert full == retriever.growth_bytes, "a full store with a warm cache is the whole growth line"
    assert plan.gateway.planned_contents == {"retriever": contents}
    assert all(r.contents is None for r in plan.replicas if r.name != "retriever")


def test_contents_fill_the_cache_up_to_its_size_and_the_index_up_to_capacity():
    contents = ContentsPlan(per_chunk_bytes=1000, cache_bytes=64_000, capacity_chunks=100)
    assert contents.bytes_for(0, 0) == 0
    assert contents.bytes_for(10, database_bytes=5_000) == 10_000 + 5_000
    assert contents.bytes_for(500, database_bytes=10**9) == 100_000 + 64_000
