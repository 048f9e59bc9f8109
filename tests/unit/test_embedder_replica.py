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
