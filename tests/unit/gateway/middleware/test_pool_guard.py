"""The pool guard: sheds ingestion, then all new work, as the memory pool fills; recovers with hysteresis."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.middleware import pool_guard
from gateway.middleware.pool_guard import PoolGuard, PoolReading, read_pool
from system import cgroup
from system.cgroup import MemoryCgroup
from tests.fakes.clock import FakeClock

GiB = 2**30
LIMIT = 1000 * 2**20  # fractions of it are exact: 800 of 1000 MiB is 0.8


class FakeReader:
    def __init__(self, fraction: float = 0.5, limit: int = LIMIT, source: str = "fake pool"):
        self.limit, self.source, self.calls = limit, source, 0
        self.set(fraction)

    def set(self, fraction: float) -> None:
        self.reading = PoolReading(round(fraction * self.limit), self.limit, self.source)

    def __call__(self) -> PoolReading:
        self.calls += 1
        return self.reading


def _guard(reader: FakeReader, clock: FakeClock, registry: CollectorRegistry | None = None, **kwargs) -> PoolGuard:
    options = {
        "shed_ingest_at": 0.8,
        "shed_all_at": 0.9,
        "hysteresis": 0.05,
        "sample_interval_s": 0.25,
        "retry_after_s": 5,
    }
    options.update(kwargs)
    return PoolGuard(reader=reader, clock=clock, registry=registry, **options)


def _state_at(guard: PoolGuard, reader: FakeReader, clock: FakeClock, fraction: float) -> str:
    reader.set(fraction)
    clock.advance(1.0)
    return guard.sample()[0]


def test_ok_below_the_ingest_mark():
    reader, clock = FakeReader(0.5), FakeClock()
    guard = _guard(reader, clock)
    state, reading = guard.sample()
    assert state == "ok"
    assert reading == reader.reading
    assert guard.refusal("ingest") is None
    assert guard.refusal("work") is None
    assert _state_at(guard, reader, clock, 0.79) == "ok"
    assert guard.shed_total == 0


def test_shedding_ingest_refuses_ingest_only():
    reader, clock = FakeReader(0.8), FakeClock()  # exactly at the mark sheds
    guard = _guard(reader, clock)
    assert guard.sample()[0] == "shedding_ingest"
    assert guard.refusal("ingest") is not None
    assert guard.refusal("work") is None
    assert guard.shed_total == 1
    assert _state_at(guard, reader, clock, 0.89) == "shedding_ingest"


def test_shedding_ingest_also_refuses_the_heaviest_tenants_work_and_asks_only_then():
    reader, clock = FakeReader(0.5), FakeClock()
    guard = _guard(reader, clock)
    asked = []

    def heaviest(answer: bool):
        return lambda: asked.append(answer) or answer

    assert guard.refusal("work", heaviest(True)) is None and asked == []  # ok: who is heaviest is not read
    assert _state_at(guard, reader, clock, 0.85) == "shedding_ingest"
    refused = guard.refusal("work", heaviest(True))
    assert refused is not None and "the tenant with the most requests in flight" in refused
    assert guard.refusal("work", heaviest(False)) is None
    assert asked == [True, False]


def test_shedding_all_refuses_both():
    reader, clock = FakeReader(0.9), FakeClock()
    guard = _guard(reader, clock)
    assert guard.sample()[0] == "shedding_all"
    assert guard.refusal("ingest") is not None
    assert guard.refusal("work") is not None
    assert guard.shed_total == 2
    assert _state_at(guard, reader, clock, 0.99) == "shedding_all"


def test_equal_marks_go_straight_to_shedding_all():
    reader, clock = FakeReader(0.9), FakeClock()
    guard = _guard(reader, clock, shed_ingest_at=0.9, shed_all_at=0.9)
    assert guard.sample()[0] == "shedding_all"
    assert _state_at(guard, reader, clock, 0.86) == "shedding_all"  # within the band: still everything
    assert _state_at(guard, reader, clock, 0.84) == "ok"  # below the one band: both recover together


def test_hysteresis_down_from_shedding_all():
    reader, clock = FakeReader(0.5), FakeClock()
    guard = _guard(reader, clock)
    steps = [
        (0.95, "shedding_all"),
        (0.87, "shedding_all"),  # below 0.9 but not below 0.9 - 0.05
        (0.86, "shedding_all"),
        (0.84, "shedding_ingest"),  # below the all band, still above the ingest mark
        (0.78, "shedding_ingest"),  # below 0.8 but not below 0.8 - 0.05
        (0.76, "shedding_ingest"),
        (0.74, "ok"),
        (0.78, "ok"),  # coming up from ok, the band does not apply
        (0.80, "shedding_ingest"),
    ]
    for fraction, expected in steps:
        assert _state_at(guard, reader, clock, fraction) == expected, fraction


def test_hysteresis_shedding_all_can_drop_straight_to_ok():
    reader, clock = FakeReader(0.92), FakeClock()
    guard = _guard(reader, clock)
    assert guard.sample()[0] == "shedding_all"
    assert _state_at(guard, reader, clock, 0.76) == "shedding_ingest"  # in the ingest band
    assert _state_at(guard, reader, clock, 0.92) == "shedding_all"
    assert _state_at(guard, reader, clock, 0.10) == "ok"


def test_sampling_is_cached_for_the_interval():
    reader, clock = FakeReader(0.5), FakeClock()
    guard = _guard(reader, clock, sample_interval_s=0.25)
    assert guard.sample()[0] == "ok"
    assert reader.calls == 1
    reader.set(0.95)  # the pool fills, but within the interval the guard does not look again
    for _ in range(3):
        clock.advance(0.0625)  # binary-exact steps: 3 of them stay short of the 0.25 s interval
        assert guard.sample()[0] == "ok"
        assert guard.refusal("work") is None
        guard.describe()
    assert reader.calls == 1
    clock.advance(0.0625)  # exactly 0.25 s after the first read
    assert guard.sample()[0] == "shedding_all"
    assert reader.calls == 2
    guard.sample()
    assert reader.calls == 2


def test_refusal_message():
    reader = FakeReader(limit=10 * GiB, source="cgroup /sys/fs/cgroup/memory/pool")
    reader.reading = PoolReading(int(8.5 * GiB), 10 * GiB, reader.source)
    clock = FakeClock()
    guard = _guard(reader, clock, retry_after_s=7)
    message = guard.refusal("ingest")
    assert message is not None
    assert "85%" in message
    assert "8.50 of 10.00 GiB" in message
    assert "cgroup /sys/fs/cgroup/memory/pool" in message
    assert "ingestion" in message
    assert "below 75%" in message  # the ingest mark minus the hysteresis
    assert "Retry after 7s" in message

    reader.reading = PoolReading(int(9.5 * GiB), 10 * GiB, reader.source)
    clock.advance(1.0)
    message = guard.refusal("work")
    assert "95%" in message
    assert "9.50 of 10.00 GiB" in message
    assert "new work is refused" in message
    assert "below 85%" in message
    assert "Retry after 7s" in message


def test_describe():
    reader, clock = FakeReader(0.8), FakeClock()
    guard = _guard(reader, clock)
    guard.refusal("ingest")
    described = guard.describe()
    assert described == {
        "state": "shedding_ingest",
        "used_bytes": round(0.8 * LIMIT),
        "limit_bytes": LIMIT,
        "fraction": 0.8,
        "source": "fake pool",
        "peak_bytes": None,
        "shed_ingest_at": 0.8,
        "shed_all_at": 0.9,
        "hysteresis": 0.05,
        "shed_requests": 1,
        "plan_holds_bytes": None,
        "marks_from": "",
    }
    reader.reading = PoolReading(1, 3, "thirds")
    clock.advance(1.0)
    assert guard.describe()["fraction"] == 0.3333  # rounded to 4 places


def test_zero_limit_reads_as_empty():
    assert PoolReading(5, 0, "none").fraction == 0.0
    reader, clock = FakeReader(), FakeClock()
    reader.reading = PoolReading(5, 0, "none")
    assert _guard(reader, clock).sample()[0] == "ok"


@pytest.mark.parametrize(
    "ingest, all_",
    [
        (0.0, 0.9),
        (-0.1, 0.5),
        (0.9, 0.8),
        (0.8, 1.0),
        (0.8, 1.5),
        (1.0, 1.0),
    ],
)
def test_invalid_thresholds(ingest, all_):
    with pytest.raises(ValueError, match="shed_ingest_at"):
        PoolGuard(shed_ingest_at=ingest, shed_all_at=all_, reader=FakeReader(), clock=FakeClock())


def test_prometheus_gauges():
    registry = CollectorRegistry()
    reader, clock = FakeReader(0.5), FakeClock()
    guard = _guard(reader, clock, registry=registry)
    exposition = generate_latest(registry).decode()
    for name in ("poolserve_pool_used_bytes", "poolserve_pool_limit_bytes", "poolserve_pool_guard_state"):
        assert f"# TYPE {name} gauge" in exposition

    guard.sample()
    assert registry.get_sample_value("poolserve_pool_used_bytes") == round(0.5 * LIMIT)
    assert registry.get_sample_value("poolserve_pool_limit_bytes") == LIMIT
    assert registry.get_sample_value("poolserve_pool_guard_state") == 0
    for fraction, code in ((0.85, 1), (0.95, 2), (0.10, 0)):
        _state_at(guard, reader, clock, fraction)
        assert registry.get_sample_value("poolserve_pool_guard_state") == code
        assert registry.get_sample_value("poolserve_pool_used_bytes") == round(fraction * LIMIT)
    exposed = {
        sample.name: sample.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for sample in family.samples
    }
    assert exposed["poolserve_pool_limit_bytes"] == LIMIT
    assert exposed["poolserve_pool_used_bytes"] == round(0.10 * LIMIT)
    assert exposed["poolserve_pool_guard_state"] == 0


def test_guards_with_their_own_registries_do_not_collide():
    _guard(FakeReader(), FakeClock())
    _guard(FakeReader(), FakeClock())


# --- read_pool -----------------------------------------------------------------------------------------


def test_read_pool_on_this_machine():
    reading = read_pool()
    assert isinstance(reading, PoolReading)
    assert 0 < reading.used_bytes <= reading.limit_bytes
    assert 0 < reading.fraction <= 1
    assert reading.source.startswith(("cgroup ", "host "))


def test_host_reading_is_sane():
    reading = pool_guard._host_reading()
    assert reading.source == "host (MemAvailable)"
    assert 0 < reading.used_bytes <= reading.limit_bytes


def _v2_dir(directory: Path, limit: str, usage: int = 0, inactive_file: int = 0) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "memory.max").write_text(f"{limit}\n")
    (directory / "memory.current").write_text(f"{usage}\n")
    (directory / "memory.stat").write_text(f"anon 1\nfile {inactive_file}\ninactive_file {inactive_file}\n")
    (directory / "cgroup.procs").write_text("")
    return directory


def test_read_pool_uses_the_nearest_limited_cgroup(monkeypatch, tmp_path):
    monkeypatch.setattr(cgroup, "CGROUP_ROOT", tmp_path)
    pool = _v2_dir(tmp_path / "pool", str(4 * GiB), usage=3 * GiB, inactive_file=GiB)
    leaf = _v2_dir(pool / "replica", "max", usage=GiB)
    monkeypatch.setattr(cgroup, "own_cgroup", lambda pid="self": MemoryCgroup(leaf, 2))
    assert cgroup.limited_cgroup() == MemoryCgroup(pool, 2)
    reading = read_pool()
    assert reading == PoolReading(2 * GiB, 4 * GiB, f"cgroup {pool}")
    assert reading.fraction == 0.5


def test_read_pool_falls_back_to_the_host_without_a_limit(monkeypatch, tmp_path):
    leaf = _v2_dir(tmp_path / "leaf", "max", usage=GiB)  # tmp_path has no cgroup.procs: the walk stops
    monkeypatch.setattr(cgroup, "own_cgroup", lambda pid="self": MemoryCgroup(leaf, 2))
    assert cgroup.limited_cgroup() is None
    assert read_pool().source == "host (MemAvailable)"
    monkeypatch.setattr(cgroup, "own_cgroup", lambda pid="self": None)
    assert read_pool().source == "host (MemAvailable)"


def test_read_pool_v2_walk_reaching_the_root_cgroup(monkeypatch, tmp_path):
    # On a cgroup v2 host (Ubuntu 22.04+, DGX OS) the walk up an unlimited chain reaches /sys/fs/cgroup,
    # which has cgroup.procs but no memory.max (nor memory.current): read_pool must fall back to the host.
    monkeypatch.setattr(cgroup, "CGROUP_ROOT", tmp_path)
    (tmp_path / "cgroup.procs").write_text("1\n")
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    leaf = _v2_dir(_v2_dir(tmp_path / "user.slice", "max") / "session.scope", "max", usage=GiB)
    monkeypatch.setattr(cgroup, "own_cgroup", lambda pid="self": MemoryCgroup(leaf, 2))
    assert read_pool().source == "host (MemAvailable)"
