"""deployments/embedder.py's own decisions, on the replica's class without Ray: document batches shrink to half
while questions come in (embedder.question_window_s), and are whole otherwise."""

from types import SimpleNamespace

from deployments.embedder import Embedder
from rag.retrieval.embed_turns import BatchTurns


def _replica(batch_size: int, window_s: float):
    replica = object.__new__(Embedder.func_or_class)
    replica._turns, replica._question_window_s = BatchTurns(), window_s
    replica.embedder = SimpleNamespace(batch_size=batch_size)
    return replica


def test_document_batches_are_halved_while_questions_come_in():
    replica = _replica(4, 5.0)
    assert replica._document_batch_size() == 4  # no question yet: whole batches, the encoder's best speed
    with replica._turns.turn(question=True, tenant="victim"):
        pass
    assert replica._document_batch_size() == 2


def test_a_batch_of_one_stays_one_and_a_zero_window_never_halves():
    replica = _replica(1, 5.0)
    with replica._turns.turn(question=True):
        pass
    assert replica._document_batch_size() == 1
    replica = _replica(4, 0.0)
    with replica._turns.turn(question=True):
        pass
    assert replica._document_batch_size() == 4


def test_the_host_heap_is_trimmed_after_each_pass_on_cpu_only(monkeypatch):
    """On CPU each pass's activations are host heap, handed back before the next pass (docs/STRESS.md); on a
    GPU they are device memory, and the trim would only add its time to every pass."""
    import deployments.embedder as module
    from rag.retrieval.embed_turns import IdleCores, OneForwardThread

    trims = []
    monkeypatch.setattr(module, "release_freed_heap", lambda collect=True: trims.append(collect))
    for device, expected in (("cpu", [False]), ("cuda", [])):
        replica = _replica(4, 0.0)
        replica._torch_threads = replica._ingest_threads = 1
        replica._forward, replica._idle_cores = OneForwardThread(), IdleCores(1)
        replica._release_heap_per_pass = not device.startswith("cuda")
        trims.clear()
        with replica._batches("t", question=False)(4) as run:
            assert run(lambda: 7) == 7
        assert trims == expected, device


def test_the_heap_is_trimmed_after_each_call_on_cpu_and_with_the_device_cache_once_idle_on_a_gpu(monkeypatch):
    """A trim of a GPU process's ~1 GB heap took 20-140 ms here, and an emptied device cache makes the next call
    allocate again: per call both sat on every embed call of an ingest, so on a GPU they wait until the replica
    is idle, and then both go (the device memory crept over its plan without the device cache's)."""
    import deployments.embedder as module
    from rag.retrieval.embed_turns import WhenIdle

    events = []
    monkeypatch.setattr(module, "release_freed_heap", lambda collect=True: events.append("trim"))
    for device in ("cpu", "cuda"):
        replica = _replica(4, 0.0)
        replica.embedder.release_device_cache = lambda: events.append("device cache")
        timers = []

        def timer(seconds, function, args=(), _timers=timers):
            made = SimpleNamespace(
                seconds=seconds, fire=lambda: function(*args), cancel=lambda: None, start=lambda: None
            )
            _timers.append(made)
            return made

        replica._when_idle = (
            WhenIdle(replica._release_at_rest, module.GPU_CLEANUP_IDLE_S, timer=timer) if device == "cuda" else None
        )
        events.clear()
        with replica._after_call() as cleanup:
            events.append("embed")
        assert cleanup["seconds"] >= 0
        with replica._after_call():
            events.append("query")
        if device == "cpu":
            assert events == ["embed", "trim", "query", "trim"] and timers == []
        else:
            assert events == ["embed", "query"] and cleanup["seconds"] == 0.0
            timers[-1].fire()
            assert events[-2:] == ["trim", "device cache"] and timers[-1].seconds == module.GPU_CLEANUP_IDLE_S


def test_a_gpu_replica_is_at_rest_when_its_warm_up_ends(monkeypatch):
    """Its warm-up batch's device blocks go before the replica answers as ready, not an idle second later."""
    import deployments.embedder as module

    for device, expected in (("cpu", ["embed"]), ("cuda", ["embed", "trim", "device cache"])):
        events = []
        monkeypatch.setattr(module, "release_freed_heap", lambda collect=True: events.append("trim"))
        replica = _replica(4, 0.0)
        replica.embedder = SimpleNamespace(
            batch_size=4, max_seq_length=8, release_device_cache=lambda: events.append("device cache")
        )
        replica._when_idle = object() if device == "cuda" else None
        replica.embed = lambda texts: events.append("embed")
        replica._warm_up()
        assert events == expected, device
