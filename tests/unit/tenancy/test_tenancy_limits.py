import multiprocessing
import os
import stat

import pytest

from tenancy.limits import LimitDecision, TenantLimiter, TokenReservation
from tenancy.models import Tenant
from tests.fakes.clock import FakeClock

START = 6_000_000.0  # a minute boundary: 100_000 * 60


@pytest.fixture
def clock():
    return FakeClock(START)


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / "state" / "limits.sqlite3"


@pytest.fixture
def limiter(db_path, clock):
    with TenantLimiter(db_path, clock=clock) as limiter:
        yield limiter


def test_db_and_wal_files_are_owner_only(limiter, db_path):
    limiter.admit(Tenant(name="t", rpm=5))  # a write, so -wal and -shm exist
    for path in (db_path, f"{db_path}-wal", f"{db_path}-shm"):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path


def test_unlimited_tenant_is_always_allowed(limiter):
    tenant = Tenant(name="free")
    for _ in range(50):
        admission = limiter.admit(tenant, estimated_tokens=10_000)
        assert admission.allowed
        limiter.settle(tenant, admission.reservation, 10_000)
        limiter.charge_tokens(tenant, 10_000)
        assert limiter.try_acquire(tenant).allowed
    assert limiter.tokens_remaining(tenant) is None
    assert limiter.in_flight("free") == 50


def test_rpm_moving_window_and_retry_after(limiter, clock):
    tenant = Tenant(name="slow", rpm=2)
    assert limiter.admit(tenant).allowed
    clock.advance(20)
    assert limiter.admit(tenant).allowed
    clock.advance(10)
    third = limiter.admit(tenant).decision
    assert not third.allowed and third.reason == "rpm"
    assert third.retry_after_seconds == 30  # the first hit leaves the window at START + 60
    clock.advance(29.5)
    assert limiter.admit(tenant).decision.retry_after_seconds == 1  # 0.5 s rounds up
    clock.advance(0.5)
    assert limiter.admit(tenant).allowed  # first hit gone; a fixed window would not tell
    assert limiter.admit(tenant).decision.reason == "rpm"
    clock.advance(20)  # the second hit (START + 20) has left too
    assert limiter.admit(tenant).allowed


def test_rpm_is_per_tenant(limiter):
    busy, other = Tenant(name="busy", rpm=1), Tenant(name="other", rpm=1)
    assert limiter.admit(busy).allowed
    assert not limiter.admit(busy).allowed
    assert limiter.admit(other).allowed


def test_tpm_reserves_the_estimate_and_settles_to_actual(limiter, clock):
    tenant = Tenant(name="tokens", tpm=100)
    first = limiter.admit(tenant, estimated_tokens=60)
    assert first.allowed and first.reservation == TokenReservation(minute=100_000, tokens=60)
    assert limiter.tokens_remaining(tenant) == 40
    refused = limiter.admit(tenant, estimated_tokens=50).decision
    assert not refused.allowed and refused.reason == "tpm"
    clock.advance(15)
    assert limiter.admit(tenant, estimated_tokens=50).decision.retry_after_seconds == 45
    limiter.settle(tenant, first.reservation, 20)  # negative settle gives 40 back
    assert limiter.tokens_remaining(tenant) == 80
    second = limiter.admit(tenant, estimated_tokens=50)
    assert second.allowed
    limiter.settle(tenant, second.reservation, 70)  # positive settle charges the excess
    assert limiter.tokens_remaining(tenant) == 10


def test_settle_never_goes_below_zero(limiter):
    tenant = Tenant(name="refund", tpm=100)
    admission = limiter.admit(tenant, estimated_tokens=30)
    limiter.settle(tenant, TokenReservation(admission.reservation.minute, 90), 0)
    assert limiter.tokens_remaining(tenant) == 100


def test_settle_after_the_minute_ended(limiter, clock):
    tenant = Tenant(name="late", tpm=100)
    short = limiter.admit(tenant, estimated_tokens=80)
    long = limiter.admit(tenant, estimated_tokens=10)
    clock.advance(60)
    limiter.settle(tenant, short.reservation, 5)  # a refund to an ended minute is pointless
    assert limiter.tokens_remaining(tenant) == 100
    limiter.settle(tenant, long.reservation, 40)  # an excess is charged now, not lost
    assert limiter.tokens_remaining(tenant) == 70


def test_unknown_estimate_reserves_one_token(limiter):
    tenant = Tenant(name="unknown", tpm=10)
    admission = limiter.admit(tenant)
    assert admission.allowed and admission.reservation.tokens == 1
    limiter.charge_tokens(tenant, 9)
    assert limiter.admit(tenant).decision.reason == "tpm"  # the minute is spent


def test_use_beyond_the_minute_is_carried_to_the_next_minutes_never_charged_past_the_tpm(limiter, clock):
    tenant = Tenant(name="overshoot", tpm=100)
    limiter.charge_tokens(tenant, 90)
    limiter.charge_tokens(tenant, 150)  # use known after the fact, beyond the minute: it still counts
    assert limiter.tokens_charged(tenant) == (100, 140), "the minute holds its TPM, the rest is carried"
    assert limiter.tokens_remaining(tenant) == 0
    refused = limiter.admit(tenant, estimated_tokens=1).decision
    assert refused.reason == "tpm" and refused.retry_after_seconds == 120, "it waits out the carried minute too"
    clock.advance(60)
    assert limiter.tokens_charged(tenant) == (100, 40) and limiter.tokens_remaining(tenant) == 0
    clock.advance(60)
    assert limiter.tokens_charged(tenant) == (40, 0) and limiter.tokens_remaining(tenant) == 60
    assert limiter.admit(tenant, estimated_tokens=60).allowed
    assert limiter.tokens_charged(tenant) == (100, 0)
    clock.advance(600)  # idle minutes take their TPM each: nothing is owed forever
    assert limiter.tokens_charged(tenant) == (0, 0) and limiter.tokens_remaining(tenant) == 100


def test_a_refund_in_the_minute_shrinks_the_carry_first(limiter):
    tenant = Tenant(name="refund-carry", tpm=100)
    first = limiter.admit(tenant, estimated_tokens=100)
    limiter.charge_tokens(tenant, 30)  # another request's use beyond its estimate: carried
    assert limiter.tokens_charged(tenant) == (100, 30)
    limiter.settle(tenant, first.reservation, 20)  # the first used 20 of its 100
    assert limiter.tokens_charged(tenant) == (50, 0), "20 + 30 were used, all of it in this minute"


def test_an_estimate_above_the_whole_tpm_is_refused_naming_both_and_charges_nothing(limiter, clock):
    tenant = Tenant(name="big", rpm=5, tpm=100)
    refused = limiter.admit(tenant, estimated_tokens=500).decision
    assert (refused.allowed, refused.reason, refused.limit, refused.requested) == (False, "request_too_large", 100, 500)
    assert refused.retry_after_seconds == 0, "no minute could hold it: nothing to wait for"
    assert limiter.tokens_remaining(tenant) == 100, "charged nothing"
    clock.advance(60)  # an unused minute does not help either
    assert limiter.admit(tenant, estimated_tokens=500).decision.reason == "request_too_large"
    admitted = limiter.admit(tenant, estimated_tokens=1)
    refused_more = limiter.reserve_more(tenant, admitted.reservation, 101)
    assert refused_more.decision.reason == "request_too_large" and refused_more.reservation == admitted.reservation
    assert limiter.tokens_remaining(tenant) == 99, "only the admission's own token is held"
    assert limiter.reserve_more(tenant, admitted.reservation, 100).allowed, "the whole TPM fits an unused minute"
    assert limiter.tokens_charged(tenant) == (100, 0)


def test_tpm_refusal_does_not_use_an_rpm_slot(limiter):
    tenant = Tenant(name="both", rpm=1, tpm=10)
    limiter.charge_tokens(tenant, 5)
    assert limiter.admit(tenant, estimated_tokens=8).decision.reason == "tpm"
    admission = limiter.admit(tenant, estimated_tokens=5)
    assert admission.allowed  # the RPM slot was still free
    limiter.settle(tenant, admission.reservation, 0)
    assert limiter.admit(tenant, estimated_tokens=1).decision.reason == "rpm"


def test_rpm_refusal_reserves_no_tokens(limiter):
    tenant = Tenant(name="rpmfirst", rpm=1, tpm=100)
    assert limiter.admit(tenant, estimated_tokens=10).allowed
    assert limiter.admit(tenant, estimated_tokens=10).decision.reason == "rpm"
    assert limiter.tokens_remaining(tenant) == 90


def test_concurrency_leases(limiter):
    tenant = Tenant(name="conc", max_concurrency=2)
    first, second = limiter.try_acquire(tenant), limiter.try_acquire(tenant)
    assert first.allowed and second.allowed and first.lease_id != second.lease_id
    rejected = limiter.try_acquire(tenant)
    assert not rejected.allowed and rejected.reason == "concurrency"
    assert rejected.retry_after_seconds >= 1 and rejected.lease_id is None
    assert limiter.in_flight("conc") == 2
    limiter.release(tenant, first.lease_id)
    third = limiter.try_acquire(tenant)
    assert third.allowed
    limiter.release(tenant, first.lease_id)  # a second release of the same lease does nothing
    assert limiter.in_flight("conc") == 2
    limiter.release(tenant, second.lease_id)
    limiter.release(tenant, third.lease_id)
    limiter.release(tenant, None)
    assert limiter.in_flight("conc") == 0


def _hold_a_lease_and_die(db_path: str) -> None:
    TenantLimiter(db_path).try_acquire(Tenant(name="crashy", max_concurrency=1))
    os._exit(0)  # like a crashed gateway: no release


def test_leases_of_dead_processes_are_reclaimed(limiter, db_path):
    tenant = Tenant(name="crashy", max_concurrency=1)
    child = multiprocessing.get_context("spawn").Process(target=_hold_a_lease_and_die, args=(str(db_path),))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0
    assert limiter.in_flight("crashy") == 1  # the dead child's lease is still there
    decision = limiter.try_acquire(tenant)  # ... until the next acquire reclaims it
    assert decision.allowed
    assert limiter.in_flight("crashy") == 1
    assert not limiter.try_acquire(tenant).allowed  # this process's lease is kept


def test_limiters_on_one_file_share_state(db_path, clock):
    tenant = Tenant(name="same", rpm=1, tpm=10, max_concurrency=1)
    with TenantLimiter(db_path, clock=clock) as first, TenantLimiter(db_path, clock=clock) as second:
        assert first.admit(tenant, estimated_tokens=4).allowed and first.try_acquire(tenant).allowed
        assert second.admit(tenant).decision.reason == "rpm"
        assert second.try_acquire(tenant).reason == "concurrency"
        assert second.tokens_remaining(tenant) == 6


def test_forget_deletes_a_tenants_rows(limiter):
    tenant = Tenant(name="gone", rpm=1, tpm=10, max_concurrency=1)
    assert limiter.admit(tenant, estimated_tokens=10).allowed and limiter.try_acquire(tenant).allowed
    limiter.forget("gone")
    assert limiter.in_flight("gone") == 0 and limiter.tokens_remaining(tenant) == 10
    assert limiter.admit(tenant).allowed


def _admit_many(db_path: str, start, results) -> None:
    limiter = TenantLimiter(db_path)
    start.wait(timeout=60)
    tenant = Tenant(name="shared", rpm=20)
    results.put(sum(limiter.admit(tenant).allowed for _ in range(30)))


def test_two_processes_share_one_rpm_budget(db_path):
    TenantLimiter(db_path).close()  # create the file once, as the first replica would
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Event(), ctx.Queue()
    workers = [ctx.Process(target=_admit_many, args=(str(db_path), start, results)) for _ in range(2)]
    for worker in workers:
        worker.start()
    start.set()
    admitted = [results.get(timeout=60) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    assert sum(admitted) == 20


def test_reject_decision_never_has_zero_retry_after():
    assert LimitDecision.reject("rpm", 0).retry_after_seconds == 1
    assert LimitDecision.reject("tpm", 0.2).retry_after_seconds == 1


# ---- a request's account: reservation held to the end, excess charged at once, rest refunded ----


def test_a_request_account_charges_only_use_beyond_its_reservation_and_settles_the_rest():
    from tenancy.limits import RequestTokens, TokenReservation

    account = RequestTokens(TokenReservation(minute=7, tokens=100))
    assert account.report(30) == 0 and account.report(50) == 0  # an ingest's embedder calls, in parts
    assert account.report(40) == 20 and account.charged == 120  # 120 used: 20 beyond the reservation
    assert account.closing() == (TokenReservation(7, 120), 120)  # nothing left to refund

    grown = RequestTokens(TokenReservation(minute=7, tokens=1))
    grown.report(10)  # the RAG question's embedding, charged beyond the admission's 1 token
    grown.reserved(TokenReservation(minute=7, tokens=500))  # then the answer's estimate
    grown.report(300)
    assert grown.closing() == (TokenReservation(7, 509), 310)  # settle refunds 199: 310 charged in all


def test_a_reserved_request_settles_to_what_it_used_in_the_limiter(tmp_path):
    from tenancy.limits import RequestTokens

    clock = lambda: 6_000_001.0  # noqa: E731
    limiter = TenantLimiter(tmp_path / "l.sqlite3", clock=clock)
    tenant = Tenant(name="t", tpm=1000)
    admission = limiter.reserve_more(tenant, limiter.admit(tenant, 1).reservation, 600)
    account = RequestTokens(admission.reservation)
    assert limiter.tokens_remaining(tenant) == 400
    assert not limiter.reserve_more(tenant, None, 500).allowed  # a parallel call cannot start on 1 token
    assert account.report(250) == 0  # under the 600 reserved: nothing more to charge
    limiter.settle(tenant, *account.closing())
    assert limiter.tokens_remaining(tenant) == 750


def test_text_estimates_are_characters_over_four_capped_per_text_and_with_overlap():
    from tenancy.limits import estimate_ingest_tokens, estimate_text_tokens

    assert estimate_text_tokens(["a" * 400, "b" * 3]) == 102 + 3
    assert estimate_text_tokens(["a" * 4000], per_text_cap=256) == 256
    assert estimate_ingest_tokens(["a" * 800], chunk_tokens=200, chunk_overlap=40) == 250


def test_parallel_admissions_do_not_keep_a_whole_minute_estimate_out_of_an_unused_minute(limiter):
    tenant = Tenant(name="burst", tpm=20000)
    admitted = [limiter.admit(tenant, 1, reserve=False) for _ in range(4)]  # four calls arrive at once
    assert all(a.allowed and a.reservation.tokens == 0 for a in admitted)
    outcomes = [limiter.reserve_more(tenant, a.reservation, 20000).decision for a in admitted]
    assert [o.allowed for o in outcomes] == [True, False, False, False]  # one runs, the rest get 429
    assert {(o.reason, o.limit, o.requested, o.used) for o in outcomes[1:]} == {("tpm", 20000, 20000, 20000)}
    assert not limiter.admit(tenant, 1, reserve=False).allowed  # and the spent minute refuses the next
    too_big = limiter.reserve_more(tenant, None, 47352).decision
    assert (too_big.reason, too_big.limit, too_big.requested) == ("request_too_large", 20000, 47352)


def test_the_heaviest_tenant_holds_the_most_leases_and_more_than_any_other(limiter):
    big, small = Tenant(name="big"), Tenant(name="small")
    assert not limiter.is_heaviest("big", at_least=2)  # nobody in flight
    limiter.try_acquire(big)
    assert not limiter.is_heaviest("big", at_least=2)  # one request is nobody's flood
    limiter.try_acquire(big)
    assert limiter.is_heaviest("big", at_least=2) and not limiter.is_heaviest("small", at_least=2)
    limiter.try_acquire(small)
    limiter.try_acquire(small)
    assert not limiter.is_heaviest("big", at_least=2)  # a tie: no one is heaviest
    limiter.try_acquire(small)
    assert limiter.is_heaviest("small", at_least=2) and not limiter.is_heaviest("big", at_least=2)


def test_acquire_and_admit_is_one_transaction_that_writes_nothing_when_refused(limiter, clock):
    tenant = Tenant(name="acme", rpm=2, tpm=100, max_concurrency=1)
    decision, reservation = limiter.acquire_and_admit(tenant)
    assert decision.allowed and decision.lease_id and reservation.tokens == 0 and limiter.in_flight("acme") == 1
    refused, none = limiter.acquire_and_admit(tenant)
    assert (refused.allowed, refused.reason, none) == (False, "concurrency", None)
    limiter.settle_and_release(tenant, reservation, 0, decision.lease_id)
    assert limiter.in_flight("acme") == 0
    second, _ = limiter.acquire_and_admit(tenant)
    limiter.settle_and_release(tenant, None, 0, second.lease_id)
    over_rpm, _ = limiter.acquire_and_admit(tenant)  # the third request of the minute
    assert (over_rpm.allowed, over_rpm.reason) == (False, "rpm")
    assert limiter.in_flight("acme") == 0, "a refused admission leaves no lease behind"


def test_settle_and_release_settles_the_reservation_and_frees_the_lease(limiter):
    tenant = Tenant(name="acme", tpm=1000)
    decision, reservation = limiter.acquire_and_admit(tenant)
    more = limiter.reserve_more(tenant, reservation, 300)
    assert limiter.tokens_remaining(tenant) == 700
    limiter.settle_and_release(tenant, more.reservation, 120, decision.lease_id)
    assert limiter.tokens_remaining(tenant) == 880 and limiter.in_flight("acme") == 0
    limiter.settle_and_release(tenant, None, 0, None)  # nothing to write: no transaction at all
