"""What every layer shares: the target, the profile's thresholds, the run's tenants and their documents."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from planner.profile import Profile, StressSpec
from stress.client import FACTS, Admin, Gateway
from stress.report import LayerResult
from stress.stack import StackControl

COLLECTION = "stress-kb"


@dataclass
class RunContext:
    base_url: str
    admin_key: str
    profile: Profile
    quick: bool
    run_id: str
    admin: Admin
    stack: StackControl | None
    log: object = print
    keys: dict[str, str] = field(default_factory=dict)  # tenant -> API key made for this run
    acknowledged: dict[str, set[str]] = field(default_factory=dict)  # tenant -> ingested doc ids (200)
    restarted: dict = field(default_factory=dict)  # set by the layer that restarted the whole stack
    thermal: dict = field(default_factory=dict)  # layer 6's sampler, running through layers 3 and 4
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def spec(self) -> StressSpec:
        return self.profile.stress

    @property
    def max_model_len(self) -> int:
        return self.profile.chat.max_model_len

    def gateway(self, tenant: str, timeout_s: float | None = None) -> Gateway:
        return Gateway(
            self.base_url,
            self.keys[tenant],
            timeout_s or self.spec.client_timeout_s,
            self.profile.chat.model_id,
            self.profile.embedder.model_id,
            tenant,
        )

    @property
    def tenants(self) -> list[str]:
        return sorted(self.keys)

    def acknowledge(self, tenant: str, doc_id: str) -> None:
        with self._lock:
            self.acknowledged.setdefault(tenant, set()).add(doc_id)

    def setup_tenants(self, count: int) -> None:
        """Real tenants with real keys, through the admin API; each gets the facts collection."""
        for i in range(count):
            name = f"stress-{self.run_id}-{i}"
            self.keys[name] = self.admin.create_tenant(name)
            gateway = self.gateway(name)
            try:
                documents = [{"id": f"fact-{n}", "text": text} for n, text in enumerate(FACTS)]
                outcome = gateway.ingest(COLLECTION, documents)
                if outcome.kind != "ok":
                    raise RuntimeError(f"seeding {name}'s collection answered {outcome.status}: {outcome.detail}")
                for document in documents:
                    self.acknowledge(name, document["id"])
            finally:
                gateway.close()


def not_local(result: LayerResult, ctx: RunContext, what: str) -> bool:
    """Layers that kill or restart replicas need the stack on this machine; elsewhere they are not run."""
    if ctx.stack is not None:
        return False
    result.verdict = "not run"
    result.notes.append(
        f"{what} needs the stack on this machine: pass --serve-config (and --profile, --pool as it "
        f"was started); against {ctx.base_url} alone it cannot run"
    )
    return True
