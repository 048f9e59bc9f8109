"""Start and stop one poolserve stack: a private, loopback-only, token-protected Ray head plus `serve run`.

Why not `serve run serve.yaml` on its own: Ray then starts with its defaults, which listen on the
machine's address without authentication (GCS, client server, dashboard agent, worker ports), and
anyone who reaches them can run code as the service user. Here:
  * every Ray server binds 127.0.0.1 (`--node-ip-address=127.0.0.1`; RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
    stops Ray from swapping a loopback address for the machine's one);
  * Ray's token authentication is on (RAY_AUTH_MODE=token), with the token 0600 in the state dir;
  * every port is picked free, and the Ray temp dir is the stack's own, so a second stack (the test
    suite beside `make serve`) never meets the first one;
  * every process carries POOLSERVE_STACK=<id> in its environment, so `poolserve down` ends exactly
    this stack's processes and nobody else's;
  * the umask is 077, so the state dir, its databases and keys are private;
  * with a pool size (`--pool`, `make serve POOL=6GiB`, or `pools[0].cgroup`), everything runs inside a
    memory cgroup of that size, and a preflight compares the live pool with the plan before anything starts.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from gateway.middleware.proxy_guard import proxy_env
from planner.plan import Plan
from planner.profile import Profile
from planner.units import gib
from rag.store.store_schema import STORE_FILE, embedder_mismatch, recorded_embedder
from stackctl.cluster import gcs_address as cluster_gcs_address, is_cluster, node_plan, ray_port_flags, split_refusal
from system.cgroup import MemoryCgroup, PoolUnavailable, create_pool, limited_cgroup, own_cgroup, remove_pool
from system.private_files import make_private_dir, tighten_private, write_private
from stackctl.preflight import (
    biggest_other_processes,
    can_drop_page_cache,
    check,
    drop_clean_page_cache,
    host_fits,
    read_live,
    read_live_gpu,
)
from stackctl.processes import STACK_ENV, end_stack, stack_pids

# Ray ports a head opens; each gets a free port so two stacks on one machine never collide.
RAY_PORT_FLAGS = (
    "--port",
    "--ray-client-server-port",
    "--dashboard-port",
    "--dashboard-agent-listen-port",
    "--dashboard-agent-grpc-port",
    "--metrics-export-port",
    "--runtime-env-agent-port",
    "--node-manager-port",
    "--object-manager-port",
)
SERVE_SHUTDOWN_GRACE_S = 60.0
RAY_MEMORY_USAGE_THRESHOLD = 0.98


@dataclass(frozen=True)
class StackLayout:
    """Where one stack keeps its private files, all derived from its state dir."""

    state_dir: Path

    @property
    def stack_id(self) -> str:
        return hashlib.sha256(str(self.state_dir.resolve()).encode()).hexdigest()[:16]

    @property
    def token_path(self) -> Path:
        return self.state_dir / "ray-auth-token"

    @property
    def run_dir(self) -> Path:
        return self.state_dir / "run"

    @property
    def ray_temp_dir(self) -> Path:
        # Short on purpose: Ray's unix socket paths under it must stay below 108 bytes.
        return Path(tempfile.gettempdir()) / f"poolserve-{self.stack_id[:12]}"


def secure_state_dir(state_dir: Path) -> None:
    """var/ 0700 and everything in it owner-only, including files an older version left 0644."""
    make_private_dir(state_dir).chmod(0o700)  # an existing var/ is tightened too
    for root, dirs, files in os.walk(state_dir):
        for name in dirs:
            path = os.path.join(root, name)
            if not os.path.islink(path):  # never tighten a shared directory a link points to
                os.chmod(path, 0o700)
        for name in files:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                os.chmod(path, 0o600)


def ensure_token(path: Path) -> str:
    """Ray's auth token, made once (Ray's own format: 32 random bytes in hex), kept 0600."""
    if not path.exists():
        write_private(path, secrets.token_hex(32), exclusive=True)
    tighten_private(path)  # a token an older version left 0644
    return path.read_text().strip()


def free_ports(count: int) -> list[int]:
    """Distinct free loopback ports (held open together so none is handed out twice)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def stack_env(layout: StackLayout, base: dict | None = None, cluster: bool = False) -> dict:
    """The environment of every process of the stack. `cluster`: a node of several, whose Ray binds the
    pool's `address` (given explicitly) and lets other nodes join."""
    env = dict(os.environ if base is None else base)
    env.update(
        {
            STACK_ENV: layout.stack_id,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(layout.token_path),
            # "0": one machine, 127.0.0.1 as the node address and no node may join; "1" for a node of several.
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1" if cluster else "0",
            "RAY_USAGE_STATS_ENABLED": "0",
            # Ray's memory monitor kills workers above 95% of the node's memory by default, a loading engine
            # included. The pool guard sheds load at 90/95% of the pool first; Ray acts only past 98%.
            "RAY_memory_usage_threshold": str(RAY_MEMORY_USAGE_THRESHOLD),
            # Ray starts its workers (every replica, and so the engine it forks) at nice 15, behind anything
            # else on the machine: a serving stack runs at normal priority, like raw vLLM. Measured under
            # background load: 219 against 119 tokens/s at 8 streams (docs/BENCHMARKS.md section 4).
            "RAY_worker_niceness": "0",
        }
    )
    env.pop("RAY_ADDRESS", None)  # never join some other cluster the shell points at
    return env


def ray_start_command(ray_bin: str, plan: Plan, layout: StackLayout, ports: list[int]) -> list[str]:
    command = [
        ray_bin,
        "start",
        "--head",
        "--node-ip-address=127.0.0.1",
        f"--temp-dir={layout.ray_temp_dir}",
        f"--num-cpus={plan.ray.num_cpus:g}",
        f"--object-store-memory={plan.ray.object_store_memory}",
        f"--include-dashboard={'true' if plan.ray.include_dashboard else 'false'}",
        "--dashboard-host=127.0.0.1",
        "--disable-usage-stats",
    ]
    command += [f"{flag}={port}" for flag, port in zip(RAY_PORT_FLAGS, ports)]
    return command


def head_start_command(ray_bin: str, plan: Plan, profile: Profile, layout: StackLayout) -> list[str]:
    """The head of several nodes: on its pool's link address and fixed ports (a firewall rule can name
    them), advertising its placement resource. The dashboard stays on loopback."""
    head = profile.pools[0]
    return (
        [
            ray_bin,
            "start",
            "--head",
            f"--node-ip-address={head.address}",
            f"--temp-dir={layout.ray_temp_dir}",
            f"--num-cpus={plan.pool.cpus:g}",
            f"--object-store-memory={plan.ray.object_store_memory}",
            f"--include-dashboard={'true' if plan.ray.include_dashboard else 'false'}",
            "--dashboard-host=127.0.0.1",
            "--disable-usage-stats",
        ]
        + ray_port_flags(head, head=True)
        + node_resources_flag(plan, head.name)
    )


def node_resources_flag(plan: Plan, node: str) -> list[str]:
    """`ray start` flags that advertise a node's placement resource (planner/nodes.py), so that exactly the
    replicas planned on it land there; none on a one-node plan, whose replicas ask no custom resource."""
    pool = next((p for p in plan.pools if p.name == node), None)
    if pool is None:
        raise ValueError(f"node {node!r} is not in the plan; nodes: {', '.join(p.name for p in plan.pools)}")
    if not pool.ray_resources:
        return []
    return [f"--resources={json.dumps(pool.ray_resources, sort_keys=True)}"]


def direct_ingress_env(gateway_port: int, grpc_port: int) -> dict[str, str]:
    """Ray Serve's direct ingress, with the port range (Ray's max is exclusive) narrowed to the gateway's
    port: the gateway replica itself listens there. No quarantine: Ray holds a released port back for
    HAProxy's drain (150 s), which would keep a restarted gateway off its only port."""
    return {
        "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
        "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(gateway_port),
        "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(gateway_port + 1),
        "RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT": str(grpc_port),
        "RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT": str(grpc_port + 1),
        "RAY_SERVE_PORT_QUARANTINE_S": "0",
    }


def resolved_serve_config(
    serve_config: dict, profile: Profile, profile_path: Path, proxy_port: int | None = None, plan: Plan | None = None
) -> dict:
    """serve.yaml with the gateway's address and request timeout taken from the profile (loopback unless
    opened there), and the plan preflight checked, which build_app then deploys as it is. With direct
    ingress the proxy, which Ray still starts, gets proxy_port instead."""
    config = yaml.safe_load(yaml.safe_dump(serve_config))
    port = proxy_port if profile.gateway.direct_ingress and proxy_port else profile.gateway.port
    config["http_options"] = {
        **config.get("http_options", {}),
        "host": profile.gateway.host,
        "port": port,
        "request_timeout_s": profile.gateway.request_timeout_s,
    }
    config["applications"][0]["args"]["profile"] = str(profile_path.resolve())
    if plan is not None:
        config["applications"][0]["args"]["plan"] = plan.model_dump(mode="json")
    return config


def _bin(name: str) -> str:
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else name


def enter_pool(layout: StackLayout, pool_bytes: int, log) -> tuple[MemoryCgroup, MemoryCgroup | None]:
    """Move this process (so everything it starts) into a new memory cgroup of pool_bytes."""
    origin = own_cgroup()
    pool = create_pool(f"poolserve-{layout.stack_id}", pool_bytes)
    pool.add(os.getpid())
    log(
        f"memory pool: cgroup v{pool.version} {pool.path}, limit {gib(pool_bytes)}; Ray, every replica and "
        "the engine run inside it"
    )
    return pool, origin


def embedder_refusal(profile: Profile) -> str | None:
    """Why the stack must not start on this state_dir: its knowledge store records another embedder
    (rag/store/store_schema.py check_embedder, which the retriever applies too, after minutes of start)."""
    store = Path(profile.state_dir) / STORE_FILE
    recorded = recorded_embedder(store)
    if recorded is None or recorded == profile.embedder.model_id:
        return None
    return embedder_mismatch(str(store), recorded, profile.embedder.model_id)


def run_preflight(plan: Plan, pool: MemoryCgroup | None, log) -> bool:
    """The live pool against the plan; drops clean page cache once when that is what stands in the way,
    and on a unified GPU pool before the check, as hygiene: clean pages count as available, but on a GB10
    the driver has failed allocations (NV_ERR_NO_MEMORY) while MemAvailable still showed room (vllm#56824)."""
    if plan.pool.discrete:  # the pool is the GPU's memory; the host lines are checked against the host
        result = check(plan, read_live_gpu())
        host_ok, host_line = host_fits(plan)
        for line in [*result.lines, host_line]:
            log(f"preflight: {line}")
        return result.ok and host_ok
    pool = pool or limited_cgroup()  # e.g. a systemd scope or a container with a memory limit
    if plan.pool.gpu and plan.pool.unified and can_drop_page_cache() and read_live(pool).page_cache > 0:
        log("preflight: dropping clean page cache (root; hygiene on a unified GPU pool)")
        drop_clean_page_cache()
    result = check(plan, read_live(pool))
    if not result.ok and can_drop_page_cache() and read_live(pool).page_cache > 0:
        log("preflight: dropping clean page cache (root) and checking again")
        drop_clean_page_cache()
        result = check(plan, read_live(pool))
    if not result.ok:  # say who holds the memory the plan needs
        result = check(plan, read_live(pool), biggest_other_processes({os.getpid()}))
    for line in result.lines:
        log(f"preflight: {line}")
    return result.ok


def private_temp_dir(path: Path) -> None:
    """Ray's temp dir: ours, 0700, never a link. Its name is predictable, and Ray makes what it creates
    inside 0777; a 0700 root keeps other users out of all of it."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            raise PermissionError(f"{path} exists and is not a directory of this user's; remove it and start again")
    path.chmod(0o700)


def up(
    serve_config_path: Path, profile: Profile, profile_path: Path, plan: Plan, log=print, pool_bytes: int | None = None
) -> int:
    """Run the stack in the foreground until `serve run` exits or we are signalled; always clean up."""
    os.umask(0o077)
    layout = StackLayout(Path(profile.state_dir))
    secure_state_dir(layout.state_dir)
    if stack_pids(layout.stack_id):
        log(f"a stack using {layout.state_dir} is already running; `poolserve down` ends it")
        return 1
    spec = profile.pools[0]
    if (refusal := split_refusal(profile)) is not None:
        log(refusal)
        return 2
    if pool_bytes is None and spec.cgroup:
        if spec.total == "auto":
            log("pools[0].cgroup needs a size: set pools[0].total, or pass --pool / POOL=")
            return 2
        pool_bytes = spec.total
    refusal = embedder_refusal(profile)
    if refusal:
        log(refusal)
        return 2
    serve = None
    stopping = {"signal": None}

    def _on_signal(signum, _frame):
        stopping["signal"] = signum
        if serve is not None and serve.poll() is None:
            serve.send_signal(signal.SIGINT)  # `serve run` shuts the app down on SIGINT

    # Installed before anything is made, so a signal at any point still reaches the cleanup below.
    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    pool = origin = None
    try:
        if pool_bytes:
            try:
                pool, origin = enter_pool(layout, pool_bytes, log)
            except PoolUnavailable as exc:
                log(f"cannot make the memory pool: {exc}")
                return 2
        if not run_preflight(node_plan(plan, spec.name), pool, log):
            return 2
        if stopping["signal"] is not None:
            return 0
        ensure_token(layout.token_path)
        make_private_dir(layout.run_dir)
        private_temp_dir(layout.ray_temp_dir)
        env = stack_env(layout, cluster=is_cluster(profile))
        ports = free_ports(len(RAY_PORT_FLAGS) + 2)
        proxy_port, grpc_port = ports.pop(), ports.pop()
        if profile.gateway.direct_ingress:
            env.update(direct_ingress_env(profile.gateway.port, grpc_port))
        cluster = is_cluster(profile)
        gcs_address = cluster_gcs_address(profile) if cluster else f"127.0.0.1:{ports[0]}"
        metrics_port = (
            spec.ray_ports.metrics_export if cluster else ports[RAY_PORT_FLAGS.index("--metrics-export-port")]
        )
        config = resolved_serve_config(
            yaml.safe_load(serve_config_path.read_text()), profile, profile_path, proxy_port, plan
        )
        resolved_path = layout.run_dir / "serve.yaml"
        resolved_path.write_text(yaml.safe_dump(config, sort_keys=False))
        # Ray's proxy refuses what a public path may not carry itself, before routing it to the gateway.
        env.update(
            proxy_env(
                config["applications"][0].get("route_prefix") or "/",
                profile.gateway.login_form_max_bytes,
                profile.gateway.refusal_delay_s,
                profile.gateway.refusal_delay_max,
                profile.gateway.unavailable_retry_after_s,
            )
        )
        (layout.run_dir / "stack.yaml").write_text(
            yaml.safe_dump(
                {
                    "stack_id": layout.stack_id,
                    "gcs_address": gcs_address,
                    "ray_temp_dir": str(layout.ray_temp_dir),
                    "gateway": f"http://{profile.gateway.host}:{profile.gateway.port}",
                    "launcher_pid": os.getpid(),
                    # Ray's metrics agent (loopback): the engines' vLLM counters, exported as ray_vllm_*.
                    "ray_metrics": f"http://{spec.address if cluster else '127.0.0.1'}:{metrics_port}/metrics",
                }
            )
        )
        command = (
            head_start_command(_bin("ray"), plan, profile, layout)
            if cluster
            else ray_start_command(_bin("ray"), plan, layout, ports)
        )
        # Ray's processes in a session of their own: a Ctrl-C (or a signal to this process group) reaches this
        # launcher and `serve run`, and the launcher ends Ray in `ray stop`'s order (raylet, the rest, the GCS
        # last: a GCS signalled with everything else lingers until the SIGKILL 30 s later).
        started = subprocess.run(
            command,
            env=env,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            timeout=180,
        )
        if started.returncode != 0:
            log(f"ray start failed ({started.returncode}): {started.stderr[-2000:]}")
            return 1
        layout.ray_temp_dir.chmod(0o700)
        log(
            f"ray head on {gcs_address} ({'nodes join there' if cluster else 'loopback only'}, token auth; "
            f"token {layout.token_path}); "
            f"gateway on http://{profile.gateway.host}:{profile.gateway.port}"
        )
        serve = subprocess.Popen([_bin("serve"), "run", "--address", gcs_address, str(resolved_path)], env=env)
        if stopping["signal"] is not None:
            serve.send_signal(signal.SIGINT)
        while True:
            try:
                code = serve.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                if stopping["signal"] is not None:
                    try:
                        code = serve.wait(timeout=SERVE_SHUTDOWN_GRACE_S)
                    except subprocess.TimeoutExpired:
                        code = 130
                    break
        return code if stopping["signal"] is None else 0
    except PermissionError as exc:
        log(str(exc))
        return 1
    finally:
        wind_down(layout, pool, origin, previous, log)


def wind_down(
    layout: StackLayout, pool: MemoryCgroup | None, origin: MemoryCgroup | None, previous: dict, log=print
) -> None:
    """End this stack's (or node's) processes and remove its pool, then give the signals back their
    handlers. A second Ctrl-C while it winds down must not cut the cleanup short."""
    for sig in previous:
        signal.signal(sig, signal.SIG_IGN)
    down(layout, log)
    if pool is not None:
        remove_pool(pool, origin, log)
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def down(layout: StackLayout, log=print) -> int:
    """End every process of this stack (and only those), then remove its Ray temp dir."""
    ended = end_stack(layout.stack_id)
    shutil.rmtree(layout.ray_temp_dir, ignore_errors=True)
    (layout.run_dir / "stack.yaml").unlink(missing_ok=True)
    if ended:
        log(f"stopped {ended} processes of the stack in {layout.state_dir}")
    return ended
