"""gateway/middleware/read_lanes.py: a tenant's reads take turns while another tenant works, run together when it is
alone, and wait in a line bounded in length and time."""

import asyncio

import pytest

from gateway.middleware.read_lanes import ReadLanes, ReadsQueued, is_read


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 10))


@pytest.mark.parametrize(
    "method, path, read",
    [
        ("GET", "/v1/collections", True),
        ("GET", "/v1/collections/kb", True),
        ("GET", "/v1/collections/kb/documents", True),
        ("GET", "/v1/collections/kb/search", True),
        ("POST", "/v1/collections/kb/search", True),
        ("POST", "/v1/collections/kb/documents", False),  # an ingest: work, not a read
        ("DELETE", "/v1/collections/kb/documents/d1", False),
        ("GET", "/v1/collections/kb/documents/d1", False),
        ("POST", "/v1/chat/completions", False),
        ("POST", "/v1/rag/query", False),
        ("GET", "/v1/models", False),
    ],
)
def test_reads_are_the_knowledge_base_listings_counts_and_searches(method, path, read):
    assert is_read(method, path) is read


async def _reads(lanes: ReadLanes, tenant: str, count: int, log: list, hold: float = 0.05):
    async def one(n):
        async with lanes.working(tenant), lanes.reading(tenant):
            log.append(("start", tenant, n, asyncio.get_running_loop().time()))
            await asyncio.sleep(hold)
            log.append(("end", tenant, n, asyncio.get_running_loop().time()))

    await asyncio.gather(*(one(n) for n in range(count)))


def _most_at_once(log: list, tenant: str) -> int:
    running = most = 0
    for event, who, _, _ in sorted(log, key=lambda e: (e[3], e[0] == "start")):
        if who == tenant:
            running += 1 if event == "start" else -1
            most = max(most, running)
    return most


def test_a_tenant_alone_reads_several_at_once():
    log = []
    run(_reads(ReadLanes(alone=4, queue_max=32, wait_s=5), "a", 8, log))
    assert _most_at_once(log, "a") == 4


def test_while_another_tenant_works_a_tenants_reads_take_turns():
    lanes = ReadLanes(alone=4, queue_max=32, wait_s=5)
    log = []

    async def scenario():
        async def other_tenant_chats():
            async with lanes.working("b"):
                await asyncio.sleep(0.5)

        other = asyncio.create_task(other_tenant_chats())
        await asyncio.sleep(0)  # b's chat is in flight first
        await _reads(lanes, "a", 6, log)
        await other

    run(scenario())
    assert _most_at_once(log, "a") == 1
    assert len([e for e in log if e[0] == "end"]) == 6  # all of them ran, none was refused


def test_another_tenants_read_never_waits_for_the_first_tenants_line():
    lanes = ReadLanes(alone=4, queue_max=32, wait_s=5)
    log = []

    async def scenario():
        busy = asyncio.create_task(_reads(lanes, "a", 6, log, hold=0.1))
        await asyncio.sleep(0.01)
        start = asyncio.get_running_loop().time()
        await _reads(lanes, "b", 1, log, hold=0)
        waited = asyncio.get_running_loop().time() - start
        await busy
        return waited

    assert run(scenario()) < 0.05  # b's read started at once, beside a's


def test_the_line_is_bounded_in_length_and_in_time():
    lanes = ReadLanes(alone=1, queue_max=2, wait_s=0.2)

    async def scenario():
        outcomes = []

        async def one():
            try:
                async with lanes.working("a"), lanes.reading("a"):
                    await asyncio.sleep(0.5)
                outcomes.append("ran")
            except ReadsQueued as queued:
                outcomes.append(str(queued))

        await asyncio.gather(*(one() for _ in range(4)))
        return outcomes

    outcomes = run(scenario())
    assert outcomes.count("ran") == 1
    assert sum("gateway.reads_queue_max" in o for o in outcomes) == 1  # the fourth found the line full
    assert sum("gateway.reads_wait_s" in o for o in outcomes) == 2  # two waited 0.2 s behind a 0.5 s read
    assert lanes._working == lanes._reading == lanes._waiting == {}  # nothing left behind


def test_a_cancelled_read_gives_its_turn_back():
    lanes = ReadLanes(alone=1, queue_max=8, wait_s=5)

    async def scenario():
        async def one(hold):
            async with lanes.working("a"), lanes.reading("a"):
                await asyncio.sleep(hold)

        first = asyncio.create_task(one(10))
        await asyncio.sleep(0.01)
        waiting = asyncio.create_task(one(0))
        await asyncio.sleep(0.01)
        first.cancel()  # the client hung up
        await asyncio.wait_for(waiting, 1)  # the next read gets the turn
        assert lanes._working == lanes._reading == lanes._waiting == {}

    run(scenario())


def test_while_another_tenant_works_a_read_keeps_its_turn_twice_as_long_as_it_took():
    def gap_between_reads(other_tenant_working: bool) -> float:
        lanes = ReadLanes(alone=1, queue_max=8, wait_s=5, pause_ratio=2)
        log = []

        async def scenario():
            async def other_tenant_chats():
                async with lanes.working("b"):
                    await asyncio.sleep(1)

            other = asyncio.create_task(other_tenant_chats()) if other_tenant_working else None
            await asyncio.sleep(0)
            await _reads(lanes, "a", 2, log, hold=0.1)
            if other:
                other.cancel()

        run(scenario())
        (first_start,), (second_start,) = ([e[3] for e in log if e[0] == "start" and e[2] == n] for n in (0, 1))
        return abs(second_start - first_start)

    assert 0.29 <= gap_between_reads(other_tenant_working=True) < 0.5  # 0.1 s of read, 0.2 s of pause
    assert gap_between_reads(other_tenant_working=False) < 0.15  # alone: the next read starts at once
