"""What the CPU engine's step-threads worker (vllm_bridge/cpu_worker.py) is told by the plan: its vLLM class name and
its settings, one typed object.

vLLM takes the worker as a qualified-name string (`worker_cls`) and builds it in a process its EngineCore spawns,
so the planner cannot import the class (it imports vLLM, a layer above): vllm_bridge/cpu_worker.py imports this module
and refuses to load unless STEP_THREADS_WORKER names it, so the link is a real import the layers contract checks.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

# The worker vLLM builds for a CPU engine; vllm_bridge/cpu_worker.py checks at import that this names its class.
STEP_THREADS_WORKER = "vllm_bridge.cpu_worker.StepThreadsCPUWorker"
# The Worker is a process vLLM spawns with the replica's environment and nothing else of ours: one variable
# holding the settings' JSON is the single crossing, validated again on the other side.
STEP_WORKER_ENV = "POOLSERVE_STEP_WORKER"


class StepWorkerSettings(BaseModel):
    """The step-threads worker's settings, from the chat section and the plan's thread counts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    narrow_step_threads: int | None = Field(
        ge=1,
        description="OpenMP threads of a step under wide_step_tokens "
        "(decoding); None: every step on the engine's own threads.",
    )
    wide_step_tokens: int = Field(
        ge=1,
        description="A step of at least this many tokens (a prefill) runs on all the "
        "engine's threads (chat.wide_step_tokens).",
    )
    idle_spin_s: float = Field(
        ge=0,
        le=1.0,
        description="How long the Worker busy-waits for its next step before "
        "it sleeps (chat.worker_idle_spin_s; vLLM's own is 1 s).",
    )

    def as_env(self) -> dict[str, str]:
        """The environment variable that carries these settings to the Worker's process."""
        return {STEP_WORKER_ENV: self.model_dump_json()}

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> StepWorkerSettings | None:
        """The settings a plan gave this process; None where none did (the worker then behaves as vLLM's)."""
        raw = environ.get(STEP_WORKER_ENV)
        return None if raw is None else cls.model_validate_json(raw)


def step_threads(scheduled_tokens: int, wide_threads: int, narrow_threads: int, wide_step_tokens: int) -> int:
    """OpenMP threads for one engine step of `scheduled_tokens` tokens."""
    return wide_threads if scheduled_tokens >= wide_step_tokens else min(narrow_threads, wide_threads)
