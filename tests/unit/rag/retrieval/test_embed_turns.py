"""rag/retrieval/embed_turns.py: one batch at a time with questions first and tenants in turn, and borrowed idle cores."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from rag.retrieval.embed_turns import BatchTurns, IdleCores, OneForwardThread, threads_for


@pytest.mark.parametrize(
    "idle, least, most, expected",
    [
        (2.0, 1, 2, 2),
        (1.6, 1, 2, 2),  # an idle machine (Ray's background work is noise): borrow
        (1.3, 1, 2, 1),
        (0.2, 1, 2, 1),  # the engine is generating: keep to the planned thread
        (8.0, 1, 4, 4),
        (3.0, 2, 8, 3),
        (0.0, 2, 8, 2),
    ],
)
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
        if turns.questions_waiting == 1:
            break
        time.sleep(0.01)
    assert turns.questions_waiting == 1
    release.set()
    for thread in [first, *waiting]:
        thread.join(5)
    assert order == ["batch 1", "question", "batch 2"]


def _wait_until(condition, seconds=5.0):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert condition()


def test_tenants_take_turns_however_many_calls_one_of_them_sends():
    """Tenant A's bulk ingest: one batch running and three more calls waiting; then B asks for one batch.
    B runs next, not after A's three."""
    turns, order = BatchTurns(), []
    release = threading.Event()

    def batch(tenant, name, hold=False):
        with turns.turn(question=False, tenant=tenant):
            if hold:
                release.wait(5)
            order.append(name)

    first = threading.Thread(target=batch, args=("a", "a1", True))
    first.start()
    _wait_until(lambda: turns._busy)
    waiting = [threading.Thread(target=batch, args=("a", f"a{i}")) for i in (2, 3, 4)]
    for thread in waiting:
        thread.start()
    _wait_until(lambda: len(turns._waiting) == 3)
    late = threading.Thread(target=batch, args=("b", "b1"))
    late.start()
    _wait_until(lambda: len(turns._waiting) == 4)
    release.set()
    for thread in [first, *waiting, late]:
        thread.join(5)
    assert order[:2] == ["a1", "b1"] and sorted(order[2:]) == ["a2", "a3", "a4"]


def test_a_caller_that_lets_go_cannot_barge_ahead_of_another_tenant():
    """One ingest call runs its batches back to back; another tenant's call, waiting, gets every other turn."""
    turns, order = BatchTurns(), []
    started = threading.Event()

    def ingest(tenant, batches):
        for i in range(batches):
            with turns.turn(question=False, tenant=tenant):
                started.set()
                order.append(tenant)
                time.sleep(0.02)

    a = threading.Thread(target=ingest, args=("a", 4))
    a.start()
    assert started.wait(5)
    b = threading.Thread(target=ingest, args=("b", 2))
    b.start()
    a.join(10)
    b.join(10)
    assert order.count("a") == 4 and order.count("b") == 2
    first_b = order.index("b")
    assert first_b <= 2 and order[first_b + 1] == "a" and order[first_b + 2] == "b", order


def test_a_waiter_that_gives_up_does_not_block_the_next():
    turns = BatchTurns()
    release = threading.Event()
    done = []

    def hold():
        with turns.turn(question=False, tenant="a"):
            release.wait(5)

    holder = threading.Thread(target=hold)
    holder.start()
    _wait_until(lambda: turns._busy)

    def gives_up():
        try:
            with turns.turn(question=True, tenant="b"):
                raise AssertionError("never its turn")
        except KeyboardInterrupt:
            done.append("gave up")

    def patient():
        with turns.turn(question=False, tenant="c"):
            done.append("c")

    # A waiter that is interrupted while waiting (wait_for raising) leaves the line cleanly.
    original = turns._changed.wait_for

    def interrupted(predicate, timeout=None):
        if threading.current_thread().name == "quitter":
            raise KeyboardInterrupt
        return original(predicate, timeout)

    turns._changed.wait_for = interrupted
    quitter = threading.Thread(target=gives_up, name="quitter")
    quitter.start()
    quitter.join(5)
    other = threading.Thread(target=patient)
    other.start()
    release.set()
    for thread in (holder, other):
        thread.join(5)
    assert done == ["gave up", "c"] and not turns._waiting


def test_every_forward_pass_runs_on_one_thread_with_its_batchs_thread_count():
    """Callers on many threads (Serve's pool), passes on one: one OpenMP team, one arena."""
    counts = []
    forward = OneForwardThread(set_threads=counts.append)
    ran_on = []

    def call(threads):
        return forward.runner(threads)(lambda: ran_on.append(threading.get_ident()) or threads * 10)

    with ThreadPoolExecutor(4) as callers:
        results = list(callers.map(call, [1, 1, 2, 2, 1]))
    assert results == [10, 10, 20, 20, 10]
    assert len(set(ran_on)) == 1 and ran_on[0] != threading.get_ident()
    assert counts[0] == 1 and len(counts) <= 5 and all(a != b for a, b in zip(counts, counts[1:]))


def test_a_failing_pass_raises_in_its_caller():
    forward = OneForwardThread(set_threads=lambda threads: None)
    with pytest.raises(ZeroDivisionError):
        forward.runner(1)(lambda: 1 / 0)
    assert forward.runner(1)(lambda: "still serving") == "still serving"


def test_turns_remember_when_a_question_last_asked():
    turns = BatchTurns()
    assert not turns.question_within(5.0)  # none yet
    with turns.turn(question=False, tenant="a"):
        pass
    assert not turns.question_within(5.0)  # a document batch is not a question
    with turns.turn(question=True, tenant="b"):
        pass
    asked = time.monotonic()
    assert turns.question_within(5.0)
    assert turns.question_within(5.0, now=asked + 4.9) and not turns.question_within(5.0, now=asked + 5.2)


class _ManualTimer:
    """threading.Timer's shape, fired by the test."""

    made: list["_ManualTimer"] = []

    def __init__(self, seconds, function, args=()):
        self.seconds, self.function, self.args, self.cancelled, self.daemon = seconds, function, args, False, False
        _ManualTimer.made.append(self)

    def start(self):
        pass

    def cancel(self):
        self.cancelled = True

    def fire(self):
        if not self.cancelled:
            self.function(*self.args)


def test_when_idle_cleans_up_once_after_the_last_of_a_run_of_calls():
    from rag.retrieval.embed_turns import WhenIdle

    _ManualTimer.made.clear()
    runs = []
    idle = WhenIdle(lambda: runs.append(1), 1.0, timer=_ManualTimer)
    with idle.call():
        with idle.call():  # overlapping calls: nothing is set until the last one ends
            pass
        assert _ManualTimer.made == []
    first = _ManualTimer.made[-1]
    assert first.seconds == 1.0 and first.daemon
    with idle.call():  # a call within the wait cancels the pending clean-up
        assert first.cancelled
    first.fire()
    assert runs == []
    _ManualTimer.made[-1].fire()
    assert runs == [1]


def test_a_stale_timer_that_fires_anyway_does_not_clean_up_under_a_call():
    from rag.retrieval.embed_turns import WhenIdle

    _ManualTimer.made.clear()
    runs = []
    idle = WhenIdle(lambda: runs.append(1), 1.0, timer=_ManualTimer)
    with idle.call():
        pass
    stale = _ManualTimer.made[-1]
    with idle.call():
        stale.cancelled = False  # a cancel that came too late: the timer's thread was already running
        stale.fire()
        assert runs == []
    _ManualTimer.made[-1].fire()
    assert runs == [1]
