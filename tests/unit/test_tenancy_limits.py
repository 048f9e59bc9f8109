import pytest

from tenancy.limits import LimitDecision, TenantLimiter
from tenancy.models import Tenant


@pytest.fixture
def limiter():
    return TenantLimiter()


def test_unlimited_tenant_is_always_allowed(limiter):
    tenant = Tenant(name="free")
    for _ in range(50):
        assert limiter.check_request(tenant, estimated_tokens=10_000).allowed
        limiter.charge_tokens(tenant, 10_000)
        assert limiter.try_acquire(tenant).allowed
    assert limiter.tokens_remaining(tenant) is None


def test_rpm_two_rejects_third_request_with_retry_after(limiter):
    tenant = Tenant(name="slow", rpm=2)
    assert limiter.check_request(tenant) == LimitDecision.allow()
    assert limiter.check_request(tenant).allowed
    third = limiter.check_request(tenant)
    assert not third.allowed and third.reason == "rpm"
    assert 1 <= third.retry_after_seconds <= 60


def test_rpm_is_per_tenant(limiter):
    busy, other = Tenant(name="busy", rpm=1), Tenant(name="other", rpm=1)
    assert limiter.check_request(busy).allowed
    assert not limiter.check_request(busy).allowed
    assert limiter.check_request(other).allowed


def test_tpm_checks_estimate_and_charges_actual_tokens(limiter):
    tenant = Tenant(name="tokens", tpm=100)
    assert limiter.check_request(tenant, estimated_tokens=60).allowed
    limiter.charge_tokens(tenant, 60)
    assert limiter.tokens_remaining(tenant) == 40
    rejected = limiter.check_request(tenant, estimated_tokens=50)
    assert not rejected.allowed and rejected.reason == "tpm"
    assert 1 <= rejected.retry_after_seconds <= 60
    assert limiter.check_request(tenant, estimated_tokens=40).allowed
    assert limiter.check_request(tenant).allowed  # unknown estimate: only RPM applies


def test_tpm_overshoot_is_recorded_and_blocks_until_reset(limiter):
    tenant = Tenant(name="overshoot", tpm=100)
    limiter.charge_tokens(tenant, 90)
    limiter.charge_tokens(tenant, 50)  # actual usage beyond the limit still counts
    assert limiter.tokens_remaining(tenant) == 0
    assert limiter.check_request(tenant, estimated_tokens=1).reason == "tpm"


def test_estimate_above_whole_tpm_runs_only_in_an_unused_window(limiter):
    tenant = Tenant(name="big", tpm=100)
    assert limiter.check_request(tenant, estimated_tokens=500).allowed
    limiter.charge_tokens(tenant, 1)
    assert limiter.check_request(tenant, estimated_tokens=500).reason == "tpm"


def test_tpm_rejection_does_not_use_an_rpm_slot(limiter):
    tenant = Tenant(name="both", rpm=1, tpm=10)
    limiter.charge_tokens(tenant, 10)
    assert limiter.check_request(tenant, estimated_tokens=5).reason == "tpm"
    assert limiter.check_request(tenant).allowed  # the RPM slot was still free
    assert limiter.check_request(tenant).reason == "rpm"


def test_concurrency_cap_rejects_instead_of_queueing(limiter):
    tenant = Tenant(name="conc", max_concurrency=2)
    assert limiter.try_acquire(tenant).allowed
    assert limiter.try_acquire(tenant).allowed
    rejected = limiter.try_acquire(tenant)
    assert not rejected.allowed and rejected.reason == "concurrency"
    assert rejected.retry_after_seconds >= 1
    assert limiter.in_flight("conc") == 2
    limiter.release(tenant)
    assert limiter.try_acquire(tenant).allowed
    limiter.release(tenant)
    limiter.release(tenant)
    assert limiter.in_flight("conc") == 0
    limiter.release(tenant)  # an extra release never goes negative
    assert limiter.in_flight("conc") == 0


def test_limiters_do_not_share_state():
    tenant = Tenant(name="same", rpm=1, max_concurrency=1)
    first, second = TenantLimiter(), TenantLimiter()
    assert first.check_request(tenant).allowed and first.try_acquire(tenant).allowed
    assert second.check_request(tenant).allowed and second.try_acquire(tenant).allowed


def test_reject_decision_never_has_zero_retry_after():
    assert LimitDecision.reject("rpm", 0).retry_after_seconds == 1
