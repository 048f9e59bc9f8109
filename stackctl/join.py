"""`poolserve up --join HEAD:PORT --node NAME`: one more node of a profile's cluster (stackctl/cluster.py).

The node runs in the foreground in a memory cgroup of its own pool's size, after a preflight of its own
plan, with the head's Ray token; Ctrl-C, SIGTERM or the loss of its raylet ends exactly its processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from planner.plan import Plan
from planner.profile import Profile
from planner.units import gib
from system.cgroup import PoolUnavailable
from system.private_files import make_private_dir
from stackctl.cluster import join_command, next_node_manager_port, node_plan, pool_spec
from stackctl.launcher import StackLayout, _bin, down, enter_pool, run_preflight, secure_state_dir, stack_env, wind_down
from stackctl.processes import stack_pids

# A raylet that starts while its agents are slow to (a loaded machine) can die before it registers
# (seen here at load 7 on two cores; `ray start` gives it 30 s, ray/_private/node.py); a later start joins.
JOIN_ATTEMPTS = 4
JOIN_RETRY_PAUSE_S = 5.0
# How often a joined node checks that its raylet is still there (it exits when the head is gone for good).
NODE_POLL_S = 1.0


def join(
    profile: Profile,
    plan: Plan,
    node: str,
    head_address: str,
    token_file: Path,
    layout: StackLayout,
    log=print,
    ray_bin: str | None = None,
) -> int:
    """Run one more node of the profile's cluster in the foreground until signalled (or its raylet ends);
    always end this node's processes, and only those, on the way out."""
    if node == profile.pools[0].name:
        log(f"node {node} is the head (the first pool): start it with `poolserve up`, without --join")
        return 2
    spec = pool_spec(profile, node)
    if not token_file.exists():
        log(f"no Ray token at {token_file}: copy the head's {profile.state_dir}/ray-auth-token here (0600)")
        return 2
    os.umask(0o077)
    secure_state_dir(layout.state_dir)
    if stack_pids(layout.stack_id):
        log(f"a node using {layout.state_dir} is already running; `poolserve down` ends it")
        return 1
    stopping = {"signal": None}

    def _on_signal(signum, _frame):
        stopping["signal"] = signum

    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    pool = origin = None
    try:
        if spec.cgroup:
            if spec.total == "auto":
                log(f"node {node}: cgroup needs a size: set its pool's total")
                return 2
            try:
                pool, origin = enter_pool(layout, spec.total, log)
            except PoolUnavailable as exc:
                log(f"cannot make the memory pool: {exc}")
                return 2
        if not run_preflight(node_plan(plan, node), pool, log):
            return 2
        make_private_dir(layout.run_dir)
        env = stack_env(layout, cluster=True)
        env["RAY_AUTH_TOKEN_PATH"] = str(token_file.resolve())
        last_port = layout.run_dir / "node-manager-port"
        for attempt in range(1, JOIN_ATTEMPTS + 1):
            previous_port = int(last_port.read_text()) if last_port.exists() else None
            port = next_node_manager_port(spec, previous_port)
            last_port.write_text(str(port))
            # In a session of its own, as on the head (launcher.py): a Ctrl-C reaches this process, which ends
            # the node's Ray processes in order.
            started = subprocess.run(
                join_command(ray_bin or _bin("ray"), plan, spec, head_address, port),
                env=env,
                start_new_session=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                timeout=180,
            )
            if started.returncode == 0 or stopping["signal"] is not None:
                break
            log(
                f"ray start --address={head_address} failed ({started.returncode}, attempt {attempt} of "
                f"{JOIN_ATTEMPTS}): {started.stderr[-1500:]}"
            )
            down(layout, log)  # what the failed start left (its agents) before trying again
            time.sleep(JOIN_RETRY_PAUSE_S * attempt)  # a loaded machine gets a moment before the next start
        if started.returncode != 0:
            return 1
        log(
            f"node {node} joined {head_address} at {spec.address}, raylet port {port} (pool {gib(spec.total) if spec.total != 'auto' else 'auto'}, "
            f"resource {next(p for p in plan.pools if p.name == node).ray_resources})"
        )
        own = {os.getpid()}
        while stopping["signal"] is None:
            time.sleep(NODE_POLL_S)
            if not stack_pids(layout.stack_id, exclude=own):
                log(f"node {node}: its Ray processes are gone (the head stopped?)")
                return 1
        return 0
    finally:
        wind_down(layout, pool, origin, previous, log)
