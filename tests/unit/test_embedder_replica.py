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
