"""Speculative decoding's acceptance, read from the engine's own Prometheus counters before and after a load.

Raw vLLM serves them at /metrics (`vllm:spec_decode_num_drafts_total`, ...); in the stack the chat replica's
engine exports the same counters through Ray's metrics agent (`ray_vllm_spec_decode_...`, on the port
`poolserve up` records in the state dir's run/stack.yaml), summed here over replicas and label sets. The
arithmetic is vllm.benchmarks.serve's: acceptance rate = accepted / draft tokens, acceptance length =
1 + accepted / drafts (tokens per engine step).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

import httpx

COUNTER = re.compile(
    r"^(?:ray_)?vllm[:_]spec_decode_(?P<name>num_drafts|num_draft_tokens|num_accepted_tokens)"
    r"_total(?:\{[^}]*\})?\s+(?P<value>[0-9.eE+-]+)$"
)
# Ray's agent exports every few seconds: wait this long, at most, for a load's last steps to show.
SETTLE_TIMEOUT_S = 30.0
SETTLE_POLL_S = 2.5


@dataclass(frozen=True)
class SpecCounters:
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0

    def minus(self, before: SpecCounters) -> SpecCounters:
        return SpecCounters(
            self.drafts - before.drafts, self.draft_tokens - before.draft_tokens, self.accepted - before.accepted
        )

    def stats(self) -> dict[str, float] | None:
        """acceptance_rate (%), acceptance_length (tokens per step) and the counts; None without drafts."""
        if self.draft_tokens <= 0 or self.drafts <= 0:
            return None
        return {
            "acceptance_rate": 100 * self.accepted / self.draft_tokens,
            "acceptance_length": 1 + self.accepted / self.drafts,
            "num_drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted,
        }


def parse_counters(text: str) -> SpecCounters | None:
    """The spec-decode counters in a Prometheus text page, summed over label sets; None if there are none."""
    sums = {"num_drafts": 0.0, "num_draft_tokens": 0.0, "num_accepted_tokens": 0.0}
    found = False
    for line in text.splitlines():
        match = COUNTER.match(line.strip())
        if match:
            sums[match["name"]] += float(match["value"])
            found = True
    if not found:
        return None
    return SpecCounters(sums["num_drafts"], sums["num_draft_tokens"], sums["num_accepted_tokens"])


def read_counters(metrics_url: str | None) -> SpecCounters | None:
    if not metrics_url:
        return None
    try:
        response = httpx.get(metrics_url, timeout=10)
    except httpx.HTTPError:
        return None
    return parse_counters(response.text) if response.status_code == 200 else None


def settled_counters(metrics_url: str | None, before: SpecCounters | None) -> SpecCounters | None:
    """The counters once they have moved past `before` and stopped moving (bounded by SETTLE_TIMEOUT_S).
    Call it only for an engine that speculates: one that does not never exports them."""
    if not metrics_url:
        return None
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    last = read_counters(metrics_url)
    while time.monotonic() < deadline:
        time.sleep(SETTLE_POLL_S)
        now = read_counters(metrics_url)
        moved = now is not None and (before is None or now.draft_tokens > before.draft_tokens)
        if moved and now == last:
            return now
        last = now
    return last
