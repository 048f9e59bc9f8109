"""What each spawned process of test_tpm_ceiling.py runs, in a module of its own: a spawned child imports the
module of its target, and this one imports only the limiter (the test module imports the gateway, Ray Serve
with it: seconds per child)."""

from __future__ import annotations

from tenancy.limits import TenantLimiter
from tenancy.models import Tenant


def reserve_in_turn(db_path: str, sizes: list[int], tpm: int, now: float, start, results) -> None:
    """One gateway process's requests of `sizes`, admitted on their headers then reserved one by one, all in
    the minute of `now`: puts (the sizes admitted, the sizes refused as too large) on `results`."""
    limiter = TenantLimiter(db_path, clock=lambda: now)
    tenant = Tenant(name="shared", tpm=tpm)
    start.wait(timeout=60)
    admitted, too_large = [], []
    for size in sizes:
        admission = limiter.reserve_more(tenant, limiter.admit(tenant, 1, reserve=False).reservation, size)
        if admission.allowed:
            admitted.append(size)
        elif admission.decision.reason == "request_too_large":
            too_large.append(size)
    results.put((admitted, too_large))
