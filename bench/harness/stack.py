"""A private poolserve stack for a benchmark: its own state dir, port, tenants file and keys, started with
`poolserve up serve.yaml --profile P` (the same path as `make serve`) and ended by its marker.

    with poolserve_stack(Path("configs/cpu-tiny.yaml"), workdir) as server:
        ... server.base_url, server.api_key ...

Every process the launcher starts carries POOLSERVE_STACK=<id of the state dir> (stackctl/processes.py);
on exit the launcher is sent SIGTERM (it stops `serve run`, then its own processes), and whatever still
carries the marker is ended through stackctl.launcher.down, which touches no other stack.
"""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.harness.procs import ProcessGroup, RunningServer, ServerFailed, child_env, free_port, wait_healthy
from planner.profile_file import read_profile_data
from stackctl.launcher import StackLayout, down
from stackctl.processes import stack_pids
from tenancy.keys import generate_api_key

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER_GRACE_S = 120.0  # serve run's own shutdown (60 s) plus the launcher's cleanup


def private_profile_path(workdir: Path) -> Path:
    """Where write_private_stack puts the stack's profile (the raw-vLLM side plans from the same file)."""
    return workdir / "profile.yaml"


@dataclass(frozen=True)
class PrivateStack:
    """The files of one private stack, all under workdir."""

    workdir: Path
    port: int
    profile_path: Path
    serve_config_path: Path

    @property
    def state_dir(self) -> Path:
        return self.workdir / "state"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _absolute(path: str) -> str:
    return str(path if Path(path).is_absolute() else ROOT / path)


def write_private_stack(
    workdir: Path,
    base_profile: Path,
    port: int,
    chat_overrides: Mapping[str, Any] | None = None,
    gateway_overrides: Mapping[str, Any] | None = None,
    on_demand_overrides: Mapping[str, Any] | None = None,
) -> PrivateStack:
    """A copy of base_profile with its own state dir, gateway port and tenants file (the example tenants),
    absolute model paths, and a serve.yaml naming it; overrides replace fields of its chat/gateway sections, and
    of every on-demand engine's `on_demand` section."""
    profile = read_profile_data(base_profile)
    profile["state_dir"] = str(workdir / "state")
    tenants = yaml.safe_load((ROOT / "configs" / "tenants.example.yaml").read_text())
    (workdir / "tenants.yaml").write_text(yaml.safe_dump(tenants))
    profile["tenants_file"] = str(workdir / "tenants.yaml")
    for engine in (profile["chat"], *profile.get("engines", [])):
        engine["model"] = _absolute(engine["model"])
        if engine.get("on_demand") is not None:
            engine["on_demand"] = {**engine["on_demand"], **(on_demand_overrides or {})}
        if engine.get("speculative", {}).get("model"):  # a draft folder, e.g. the GPU profiles' DSpark
            engine["speculative"]["model"] = _absolute(engine["speculative"]["model"])
    profile["embedder"]["model"] = _absolute(profile["embedder"]["model"])
    profile["chat"].update(chat_overrides or {})
    profile["gateway"] = {**profile.get("gateway", {}), **(gateway_overrides or {}), "port": port}
    profile_path = private_profile_path(workdir)
    profile_path.write_text(yaml.safe_dump(profile))
    serve_config = yaml.safe_load((ROOT / "serve.yaml").read_text())
    serve_config["http_options"]["port"] = port
    serve_config["applications"][0]["args"]["profile"] = str(profile_path)
    serve_config_path = workdir / "serve.yaml"
    serve_config_path.write_text(yaml.safe_dump(serve_config))
    return PrivateStack(workdir, port, profile_path, serve_config_path)


def stop_private_stack(group: ProcessGroup, stack: PrivateStack) -> None:
    """SIGTERM the launcher's group, then end what still carries the stack's marker; raises if any is left."""
    group.stop(grace_s=LAUNCHER_GRACE_S)
    layout = StackLayout(stack.state_dir)
    down(layout, log=lambda message: print(f"[stack] {message}", flush=True))
    left = stack_pids(layout.stack_id)
    if left:
        raise RuntimeError(f"processes of the stack in {stack.state_dir} are still running: {left}")


def running_stack(serve_config: Path, api_key: str) -> tuple[RunningServer, Path]:
    """A stack someone else started and stops (`poolserve up serve_config`; the test suite's), measured as
    it is, and its profile (the raw-vLLM side plans from the same file). Its start time is unknown: 0."""
    app = yaml.safe_load(Path(serve_config).read_text())["applications"][0]
    profile_path = Path(app["args"]["profile"])
    layout = StackLayout(Path(yaml.safe_load(profile_path.read_text())["state_dir"]))
    stack_file = layout.run_dir / "stack.yaml"
    if not stack_file.exists():
        raise ServerFailed(f"no running stack for {serve_config}: {stack_file} is missing")
    stack = yaml.safe_load(stack_file.read_text())  # what the launcher wrote: where the gateway listens
    base_url = stack["gateway"] + app.get("route_prefix", "/").rstrip("/")
    server = RunningServer(base_url, api_key, 0.0, lambda: stack_pids(layout.stack_id), stack.get("ray_metrics"))
    return server, profile_path


@contextmanager
def poolserve_stack(
    base_profile: Path,
    workdir: Path,
    timeout_s: float = 400,
    chat_overrides: Mapping[str, Any] | None = None,
    gateway_overrides: Mapping[str, Any] | None = None,
    on_demand_overrides: Mapping[str, Any] | None = None,
) -> Iterator[RunningServer]:
    """The whole stack from base_profile, healthy, with a fresh demo tenant key; stopped on exit."""
    stack = write_private_stack(
        workdir, base_profile, free_port(), chat_overrides, gateway_overrides, on_demand_overrides
    )
    api_key = generate_api_key()
    env = child_env(
        {
            "POOLSERVE_DEMO_KEY": api_key,
            "POOLSERVE_ADMIN_KEY": os.environ.get("POOLSERVE_ADMIN_KEY") or secrets.token_urlsafe(24),
            "RAY_USAGE_STATS_ENABLED": "0",
        }
    )
    env.pop("POOLSERVE_PROFILE", None)  # the --profile below decides, not the caller's shell
    poolserve = Path(sys.executable).parent / "poolserve"
    # Without an installed entry point (the GPU machine's offline bundle), the same command as a module.
    launcher = [str(poolserve)] if poolserve.exists() else [sys.executable, "-m", "cli.main"]
    command = [*launcher, "up", str(stack.serve_config_path), "--profile", str(stack.profile_path)]
    group = ProcessGroup.start(command, env, workdir / "serve.log")
    try:
        start_s = wait_healthy(f"{stack.base_url}/healthz", group, timeout_s)
        layout = StackLayout(stack.state_dir)
        ray_metrics = yaml.safe_load((layout.run_dir / "stack.yaml").read_text()).get("ray_metrics")
        yield RunningServer(stack.base_url, api_key, start_s, lambda: stack_pids(layout.stack_id), ray_metrics)
    finally:
        stop_private_stack(group, stack)
