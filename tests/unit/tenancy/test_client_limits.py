"""Per-client limits for keyless traffic (tenancy/client_limits.py), on a fake clock."""

from __future__ import annotations

from tenancy.client_limits import WINDOW_SECONDS, ClientLimiter
from tests.fakes.clock import FakeClock


def _limiter(clock, **overrides) -> ClientLimiter:
    settings = {"max_concurrent": 2, "per_minute": 3, "login_failures_per_minute": 2, "tracked_clients": 16}
    return ClientLimiter(**{**settings, **overrides}, clock=clock)


def test_requests_in_flight_are_capped_and_given_back():
    limiter = _limiter(FakeClock(), per_minute=100)
    assert limiter.enter("a") is None and limiter.enter("a") is None
    refused = limiter.enter("a")
    assert refused is not None and "gateway.client_max_concurrent" in refused.message
    assert refused.retry_after_seconds == 1 and limiter.enter("b") is None  # other clients unaffected
    limiter.leave("a")
    assert limiter.enter("a") is None and limiter.in_flight("a") == 2


def test_the_rate_is_a_moving_minute_with_a_retry_after_to_its_oldest_hit():
    clock = FakeClock()
    limiter = _limiter(clock, max_concurrent=100)
    for step in range(3):
        clock.now += 10 * step
        assert limiter.enter("a") is None
        limiter.leave("a")
    refused = limiter.enter("a")
    assert "gateway.client_requests_per_minute" in refused.message
    assert refused.retry_after_seconds == 30  # the first hit (t=1000) leaves at 1060; now is 1030
    clock.now = 1000 + WINDOW_SECONDS + 0.5
    assert limiter.enter("a") is None


def test_wrong_keys_count_in_the_minute_and_turn_into_429():
    limiter = _limiter(FakeClock())
    assert [limiter.note_rejected_key("a") is None for _ in range(4)] == [True, True, True, False]


def test_the_login_form_locks_after_its_failures_and_opens_when_they_age_out():
    clock = FakeClock()
    limiter = _limiter(clock)
    assert limiter.login_refusal("a") is None
    limiter.note_failed_login("a")
    clock.now += 5
    limiter.note_failed_login("a")
    refused = limiter.login_refusal("a")
    assert refused is not None and "gateway.login_failures_per_minute" in refused.message
    assert refused.retry_after_seconds == 55 and limiter.login_refusal("b") is None
    clock.now += 56
    assert limiter.login_refusal("a") is None


def test_the_table_is_bounded_but_never_forgets_a_client_with_requests_in_flight():
    limiter = _limiter(FakeClock(), max_concurrent=1, tracked_clients=16)
    assert limiter.enter("busy") is None
    for i in range(100):
        limiter.note_rejected_key(f"10.0.0.{i}")
    assert limiter.tracked() <= 16 + 1 and limiter.in_flight("busy") == 1
    assert limiter.enter("busy") is not None  # still counted: its slot was not forgotten
