"""rag/embed_turns.py: one batch at a time with questions first, and borrowed idle cores."""

import threading
import time

import pytest

from rag.embed_turns import BatchTurns, IdleCores, threads_for


@pytest.mark.parametrize("idle, least, most, expected", [
    (2.0, 1, 2, 2), (1.6, 1, 2, 2),  # an idle machine (Ray's background work is noise): borrow
    (1.3, 1, 2, 1), (0.2, 1, 2, 1),  # the engine is generating: keep to the planned thread
    (8.0, 1, 4, 4), (3.0, 2, 8, 3), (0.0, 2, 8, 2),
])
def test_threads_follow_the_idle_cores_within_bounds(idle, least, most, expected):
    assert threads_for(idle, least, most) == expected


class Counters:
    def __init__(self):
        self.now, self.machine, self.own = 0.0, 0.0, 0.0

    def advance(self, seconds, others_cores, own_cores):
        self.now += seconds
        self.machine += seconds * (others_cores + own_cores)
        self.own += seconds * own_cores


def test_idle_cores_count_everyone_but_this_process():
    c = Counters()
    idle = IdleCores(2, clock=lambda: c.now, machine_busy=lambda: c.machine, own_busy=lambda: c.own)
    assert idle() == 2.0  # nothing measured yet: assume idle
    c.advance(1.0, others_cores=0.1, own_cores=2.0)  # this process used both cores: still idle to it
    assert idle() == pytest.approx(1.9)
    c.advance(1.0, others_cores=1.0, own_cores=1.0)  # the engine generated meanwhile
    assert idle() == pytest.approx(1.0)
    c.advance(0.01, others_cores=2.0, own_cores=0.0)  # too short to say: the last answer stands
    assert idle() == pytest.approx(1.0)


def test_one_batch_at_a_time_and_a_waiting_question_goes_first():
    turns, order = BatchTurns(), []
    inside, release = threading.Event(), threading.Event()

    def document(name, hold):
        with turns.turn(question=False):
            if hold:
                inside.set()
                release.wait(5)  # batch 1 runs until both others are waiting
            order.append(name)

    def question():
        with turns.turn(question=True):
            order.append("question")

    first = threading.Thread(target=document, args=("batch 1", True))
    first.start()
    assert inside.wait(5)
    waiting = [threading.Thread(target=document, args=("batch 2", False)), threading.Thread(target=question)]
    for thread in waiting:  # batch 2 asks first, the question after it
        thread.start()
    for _ in range(500):  # until the question is counted as waiting (a condition, bounded at 5 s)
        if turns._questions_waiting == 1:
            break
        time.sleep(0.01)
    assert turns._questions_waiting == 1
    release.set()
    for thread in [first, *waiting]:
        thread.join(5)
    assert order == ["batch 1", "question", "batch 2"]
