"""The wake coordinator's state and decisions, pure (deployments/wake_coordinator.py holds one per pool and
does the sleeping and waking): each on-demand engine's state, requests in flight and last use, and each
tenant's wakes. No Ray, no vLLM, no clock of its own: every method takes `now` (monotonic seconds).
"""

from __future__ import annotations

from collections import deque
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from planner.awake_sets import EngineActivity, engines_to_sleep, fits_awake, idle_past_their_time
from planner.on_demand_plan import OnDemandPlan

EngineState = Literal["awake", "asleep", "waking", "sleeping"]
WAKE_BUDGET_WINDOW_S = 3600.0  # tenant_wakes_per_hour counts the wakes of the last hour


class WakeAnswer(BaseModel):
    """What the coordinator tells the gateway about one request to an on-demand engine."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    outcome: Literal["go", "busy", "over_budget"] = Field(
        description="go: the engine is awake and the request is "
        "counted in flight (the gateway must call request_ended); "
        "busy: 503, nothing could make room in time; "
        "over_budget: 429, the tenant's wakes are spent."
    )
    message: str = Field("", description="Why not, naming the model (and the limit), for the client.")
    retry_after_s: int = Field(0, description="The Retry-After seconds of a refusal.")
    woke: bool = Field(False, description="This request's wait included its engine's wake.")


class WakeLedger:
    """Every on-demand engine of one pool, by model id (the plan's engines are by replica name)."""

    def __init__(self, plan: OnDemandPlan, awake_at_start: list[str], now: float) -> None:
        self.plan = plan
        self.replica_of = {e.model_id: name for name, e in plan.engines.items()}
        self.state: dict[str, EngineState] = {
            m: ("awake" if r in awake_at_start else "asleep") for m, r in self.replica_of.items()
        }
        self.in_flight: dict[str, int] = {m: 0 for m in self.replica_of}
        self.last_used: dict[str, float] = {m: now for m in self.replica_of}  # idle counts from the start
        self._wakes: dict[tuple[str, str], deque[float]] = {}

    def engine(self, model: str):
        return self.plan.engines[self.replica_of[model]]

    # ---- requests ----
    def request_began(self, model: str, now: float) -> None:
        self.in_flight[model] += 1
        self.last_used[model] = now

    def request_ended(self, model: str, now: float) -> None:
        self.in_flight[model] = max(0, self.in_flight[model] - 1)
        self.last_used[model] = now

    # ---- the tenant's wake budget ----
    def within_budget(self, tenant: str, model: str, now: float) -> bool:
        wakes = self._wakes.setdefault((tenant, model), deque())
        while wakes and now - wakes[0] >= WAKE_BUDGET_WINDOW_S:
            wakes.popleft()
        return len(wakes) < self.engine(model).tenant_wakes_per_hour

    def charge_wake(self, tenant: str, model: str, now: float) -> None:
        self._wakes.setdefault((tenant, model), deque()).append(now)

    def over_budget(self, tenant: str, model: str) -> WakeAnswer:
        limit = self.engine(model).tenant_wakes_per_hour
        return WakeAnswer(
            outcome="over_budget",
            retry_after_s=int(WAKE_BUDGET_WINDOW_S / limit),
            message=f"model {model!r} is asleep and this tenant has used its {limit} wakes of it "
            f"per hour (tenant_wakes_per_hour); retry later or use an awake model",
        )

    # ---- room ----
    def activity(self) -> dict[str, EngineActivity]:
        """By replica name, as planner/awake_sets.py takes it: waking and sleeping engines hold awake bytes."""
        return {
            self.replica_of[m]: EngineActivity(
                awake=s != "asleep", in_flight=self.in_flight[m], last_used=self.last_used[m]
            )
            for m, s in self.state.items()
        }

    def to_sleep_for(self, model: str) -> list[str] | None:
        """Model ids to put to sleep, least recently used idle first, so `model` can wake; [] when it can wake
        now, None when it cannot yet (the engines in the way have requests in flight, or are mid-change)."""
        if any(s in ("waking", "sleeping") for m, s in self.state.items() if m != model):
            return None  # their bytes are moving: decide once they are done
        chosen = engines_to_sleep(self.plan, self.activity(), self.replica_of[model])
        if chosen is None:
            return None
        model_of = {r: m for m, r in self.replica_of.items()}
        return [model_of[r] for r in chosen]

    def idle_due(self, now: float) -> list[str]:
        """Awake engines idle past their idle_sleep_s, longest idle first (model ids)."""
        model_of = {r: m for m, r in self.replica_of.items()}
        awake_only = {r: a for r, a in self.activity().items() if self.state[model_of[r]] == "awake"}
        return [model_of[r] for r in idle_past_their_time(self.plan, awake_only, now)]

    # ---- what the engines say ----
    def reconcile(self, reported: dict[str, str]) -> list[str]:
        """Adopt the state an engine reports where both it and the ledger are settled (awake or asleep) and
        differ: a replica Serve replaced starts as the plan says, not as the ledger left it. The models changed."""
        changed = []
        for model, state in reported.items():
            settled = ("awake", "asleep")
            if state in settled and self.state.get(model) in settled and state != self.state[model]:
                self.state[model] = state
                changed.append(model)
        return changed

    def over_the_awake_set(self) -> list[str] | None:
        """Idle awake engines to put to sleep, least recently used first, until the awake set fits the plan
        again ([] when it fits; None when the engines in the way are busy: wait for them)."""
        awake = {m for m, s in self.state.items() if s == "awake"}
        idle = sorted((m for m in awake if self.in_flight[m] == 0), key=lambda m: (self.last_used[m], m))
        chosen: list[str] = []
        while not fits_awake(self.plan, {self.replica_of[m] for m in awake - set(chosen)}):
            if not idle:
                return None
            chosen.append(idle.pop(0))
        return chosen

    def busy(self, model: str, waited_s: float) -> WakeAnswer:
        busy = sorted(m for m, n in self.in_flight.items() if n and m != model)
        why = f" ({', '.join(busy)} busy with requests in flight)" if busy else ""
        return WakeAnswer(
            outcome="busy",
            retry_after_s=max(1, int(self.engine(model).wake_timeout_s / 4)),
            message=f"model {model!r} is asleep and could not be woken within {waited_s:.0f}s: "
            f"the pool holds at most {self.plan.max_awake} on-demand engine(s) awake and "
            f"none could be put to sleep to make room{why}; retry later",
        )
