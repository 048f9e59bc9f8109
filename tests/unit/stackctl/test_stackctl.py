"""stackctl: a stack's processes are found by the POOLSERVE_STACK marker in their environment and
only those are ended; the launcher keeps its state private and Ray on loopback with token auth.

Every process here is started by the test itself with a random stack id, and every one is killed
by pid in a finally, so nothing else on the machine (a live stack included) is ever signalled."""

from __future__ import annotations

import os
import secrets
import select
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import yaml

from planner.plan import build_plan
from planner.profile import load_profile
from stackctl.launcher import (
    RAY_PORT_FLAGS,
    StackLayout,
    ensure_token,
    free_ports,
    ray_start_command,
    resolved_serve_config,
    secure_state_dir,
    stack_env,
)
from stackctl.processes import STACK_ENV, end_stack, is_loopback, listening_sockets, stack_pids

ROOT = Path(__file__).resolve().parents[3]
GiB = 1024**3
pytestmark = pytest.mark.timeout(60)


def _spawn(command: list[str], stack_id: str | None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != STACK_ENV}
    if stack_id is not None:
        env[STACK_ENV] = stack_id
    return subprocess.Popen(
        command,
        env=env,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _wait_for_pids(stack_id: str, count: int, ready=lambda pids: True, timeout_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    previous = None
    while time.monotonic() < deadline:
        pids = stack_pids(stack_id)
        # Settled: the same set twice (setsid forks and its parent exits, so the set moves for a moment).
        if len(pids) >= count and ready(pids) and pids == previous:
            return pids
        previous = pids
        time.sleep(0.05)
    raise AssertionError(f"expected {count} marked processes, found {stack_pids(stack_id)}")


def _session(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


@pytest.fixture
def spawned():
    """Processes the test starts; whatever is left of them (and of their marked descendants) is
    SIGKILLed by pid afterwards."""
    procs: list[subprocess.Popen] = []
    ids: list[str] = []
    yield procs, ids
    for stack_id in ids:  # descendants that left the session carry the test's random marker
        for pid in stack_pids(stack_id):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        if proc.stdout:
            proc.stdout.close()


def _new_id(ids: list[str]) -> str:
    ids.append("test-" + secrets.token_hex(8))
    return ids[-1]


def test_end_stack_ends_exactly_the_marked_processes(spawned):
    procs, ids = spawned
    stack_id, other_id = _new_id(ids), _new_id(ids)
    marked = _spawn(["sleep", "60"], stack_id)
    forker = _spawn(["bash", "-c", "setsid sleep 60 & sleep 60"], stack_id)
    unmarked = _spawn(["sleep", "60"], None)
    other = _spawn(["sleep", "60"], other_id)
    procs += [marked, forker, unmarked, other]
    # sleep, bash (or its last sleep), and the grandchild once it is in a session of its own
    pids = _wait_for_pids(
        stack_id, 3, lambda pids: any(_session(p) not in (None, marked.pid, forker.pid) for p in pids)
    )
    assert {marked.pid, forker.pid} <= set(pids)
    assert unmarked.pid not in pids and other.pid not in pids
    assert stack_pids(stack_id, exclude={marked.pid}) == [p for p in pids if p != marked.pid]

    started = time.monotonic()
    assert end_stack(stack_id, grace_s=5) == len(pids)
    assert time.monotonic() - started < 5, "sleep ends on SIGTERM: no need to wait for the grace period"
    assert not any(_alive(p) for p in pids)
    assert stack_pids(stack_id) == []
    assert unmarked.poll() is None and other.poll() is None
    assert end_stack(stack_id, grace_s=1) == 0


def test_the_gcs_is_signalled_after_the_raylet_has_gone(spawned, tmp_path):
    """`ray stop`'s order: raylet first, the rest, the GCS last (by process name)."""
    procs, ids = spawned
    stack_id = _new_id(ids)
    log = tmp_path / "order.log"
    for name, on_term in (("raylet", f"sleep 0.5; echo raylet >> {log}"), ("gcs_server", f"echo gcs >> {log}")):
        shell = tmp_path / name
        shell.write_bytes(Path("/bin/bash").read_bytes())
        shell.chmod(0o700)
        procs.append(
            _spawn([str(shell), "-c", f"trap '{on_term}; exit 0' TERM; while :; do sleep 0.1; done"], stack_id)
        )
    _wait_for_pids(
        stack_id, 4, lambda pids: {psutil.Process(p).name() for p in pids if _alive(p)} >= {"raylet", "gcs_server"}
    )
    assert end_stack(stack_id, grace_s=10) >= 2
    assert log.read_text().split() == ["raylet", "gcs"]


def test_a_process_ignoring_sigterm_is_killed_after_the_grace(spawned):
    procs, ids = spawned
    stack_id = _new_id(ids)
    stubborn = _spawn(["bash", "-c", 'trap "" TERM; sleep 60; true'], stack_id)
    procs.append(stubborn)
    pids = _wait_for_pids(stack_id, 2)  # bash and its sleep, both ignoring TERM
    started = time.monotonic()
    assert end_stack(stack_id, grace_s=1.0) == len(pids)
    elapsed = time.monotonic() - started
    assert 1.0 <= elapsed < 8, elapsed
    assert not any(_alive(p) for p in pids)
    assert stubborn.wait(timeout=5) == -signal.SIGKILL


def test_listening_sockets_of_a_marked_process(spawned):
    procs, ids = spawned
    stack_id = _new_id(ids)
    code = (
        "import socket, sys, time\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
        "print(s.getsockname()[1], flush=True); time.sleep(60)\n"
    )
    server = _spawn([sys.executable, "-c", code], stack_id)
    procs.append(server)
    ready, _, _ = select.select([server.stdout], [], [], 20)
    assert ready, "the child did not report its port"
    port = int(server.stdout.readline())
    pids = stack_pids(stack_id)
    assert pids == [server.pid]
    found = listening_sockets(pids)
    assert (server.pid, "127.0.0.1", port) in found
    assert all(is_loopback(address) for _, address, _ in found)
    assert listening_sockets([]) == []


@pytest.mark.parametrize(
    "address, loopback",
    [
        ("127.0.0.1", True),
        ("127.0.0.53", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.0.2.2", False),
        ("::ffff:192.0.2.2", False),
        ("10.127.0.1", False),
    ],
)
def test_is_loopback(address, loopback):
    assert is_loopback(address) is loopback


# ---- launcher ------------------------------------------------------------------------------


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_secure_state_dir_makes_everything_owner_only(tmp_path):
    state = tmp_path / "var"
    (state / "faiss" / "acme").mkdir(parents=True)
    files = [state / "tenants.sqlite3", state / "faiss" / "index.bin", state / "faiss" / "acme" / "x.json"]
    for path in files:
        path.write_text("x")
        path.chmod(0o644)
    for folder in (state, state / "faiss", state / "faiss" / "acme"):
        folder.chmod(0o755)
    outside = tmp_path / "outside.txt"
    outside.write_text("x")
    outside.chmod(0o644)
    (state / "link").symlink_to(outside)
    secure_state_dir(state)
    assert all(_mode(d) == 0o700 for d in (state, state / "faiss", state / "faiss" / "acme"))
    assert all(_mode(f) == 0o600 for f in files)
    assert _mode(outside) == 0o644, "a symlink's target outside the state dir is left alone"
    fresh = tmp_path / "new" / "var"
    secure_state_dir(fresh)
    assert fresh.is_dir() and _mode(fresh) == 0o700


def test_ensure_token_is_made_once_and_private(tmp_path):
    path = tmp_path / "ray-auth-token"
    token = ensure_token(path)
    assert len(token) == 64 and all(c in "0123456789abcdef" for c in token)
    assert _mode(path) == 0o600
    path.chmod(0o644)
    assert ensure_token(path) == token and _mode(path) == 0o600
    assert ensure_token(tmp_path / "other") != token


def test_stack_layout_id_is_stable_per_path_and_temp_dir_short(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", "/tmp")
    a, b = StackLayout(tmp_path / "a"), StackLayout(tmp_path / "b")
    assert a.stack_id == StackLayout(tmp_path / "a").stack_id != b.stack_id
    monkeypatch.chdir(tmp_path)
    assert StackLayout(Path("a")).stack_id == a.stack_id, "relative and absolute spellings agree"
    assert len(a.stack_id) == 16
    assert len(str(a.ray_temp_dir)) < 40 and a.ray_temp_dir != b.ray_temp_dir
    assert a.token_path.parent == a.state_dir and a.run_dir.parent == a.state_dir


def test_ray_start_command_is_loopback_only_with_a_port_per_flag(tmp_path):
    plan = build_plan(load_profile(ROOT / "configs/cpu-tiny.yaml"), 24 * GiB)
    layout = StackLayout(tmp_path / "var")
    ports = free_ports(len(RAY_PORT_FLAGS))
    assert len(set(ports)) == len(RAY_PORT_FLAGS)
    command = ray_start_command("/bin/ray", plan, layout, ports)
    assert command[:3] == ["/bin/ray", "start", "--head"]
    assert "--node-ip-address=127.0.0.1" in command and "--dashboard-host=127.0.0.1" in command
    assert f"--temp-dir={layout.ray_temp_dir}" in command
    for flag, port in zip(RAY_PORT_FLAGS, ports):
        assert [c for c in command if c.startswith(flag + "=")] == [f"{flag}={port}"]
    assert not any("0.0.0.0" in c for c in command)


def test_stack_env_marks_and_locks_down_ray(tmp_path, monkeypatch):
    layout = StackLayout(tmp_path / "var")
    env = stack_env(layout, {"RAY_ADDRESS": "10.0.0.1:6379", "PATH": "/bin"})
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN_PATH"] == str(layout.token_path)
    assert env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0" and env[STACK_ENV] == layout.stack_id
    assert "RAY_ADDRESS" not in env and env["PATH"] == "/bin"
    assert env["RAY_worker_niceness"] == "0", "replicas (and the engine) at normal priority, not Ray's nice 15"
    monkeypatch.setenv("RAY_ADDRESS", "auto")
    env = stack_env(layout)
    assert "RAY_ADDRESS" not in env and os.environ["RAY_ADDRESS"] == "auto"


def test_resolved_serve_config_takes_the_gateway_address_from_the_profile(monkeypatch):
    monkeypatch.chdir(ROOT)
    profile = load_profile("configs/cpu-tiny.yaml")
    profile = profile.model_copy(
        update={"gateway": profile.gateway.model_copy(update={"host": "0.0.0.0", "port": 9123})}
    )
    serve = yaml.safe_load((ROOT / "serve.yaml").read_text())
    serve["http_options"]["request_timeout_s"] = 30
    serve["http_options"]["keep_alive_timeout_s"] = 7
    before = yaml.safe_dump(serve)
    config = resolved_serve_config(serve, profile, Path("configs/cpu-tiny.yaml"))
    # Host, port and the request timeout come from the profile; other options are kept.
    assert config["http_options"] == {
        "host": "0.0.0.0",
        "port": 9123,
        "keep_alive_timeout_s": 7,
        "request_timeout_s": profile.gateway.request_timeout_s,
    }
    assert config["applications"][0]["args"]["profile"] == str(ROOT / "configs/cpu-tiny.yaml")
    assert yaml.safe_dump(serve) == before, "the input is not modified"


def test_direct_ingress_puts_the_gateway_replica_on_the_gateway_port(monkeypatch):
    from stackctl.launcher import direct_ingress_env

    monkeypatch.chdir(ROOT)
    profile = load_profile("configs/cpu-tiny.yaml")
    serve = yaml.safe_load((ROOT / "serve.yaml").read_text())
    # Off (the default): the proxy serves the gateway's port; a spare proxy port is ignored.
    assert resolved_serve_config(serve, profile, Path("configs/cpu-tiny.yaml"), 40001)["http_options"]["port"] == 8000
    direct = profile.model_copy(update={"gateway": profile.gateway.model_copy(update={"direct_ingress": True})})
    # On: the proxy Ray still starts moves to the private port, and Ray's ingress port range is the gateway's.
    assert resolved_serve_config(serve, direct, Path("configs/cpu-tiny.yaml"), 40001)["http_options"]["port"] == 40001
    env = direct_ingress_env(8000, 40002)
    assert env["RAY_SERVE_ENABLE_DIRECT_INGRESS"] == "1"
    # Ray's range excludes its max: exactly the gateway's port; a restarted gateway gets it back at once.
    assert (env["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"], env["RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT"]) == (
        "8000",
        "8001",
    )
    assert env["RAY_SERVE_PORT_QUARANTINE_S"] == "0"


def test_direct_ingress_refuses_more_than_one_gateway_replica():
    from planner.profile import GatewaySpec

    with pytest.raises(ValueError, match="direct_ingress serves one replica"):
        GatewaySpec(direct_ingress=True, replicas=2)
