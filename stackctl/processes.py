"""The processes one stack started, found by a marker in their environment, and ended.

Ray's `ray stop` and a `pkill -f raylet` end every Ray on the machine, other users' and other
projects' included. Instead every process this stack starts inherits `POOLSERVE_STACK=<id>` (Ray
passes its environment to raylet, workers and vLLM's EngineCore/Worker), so the stack can end
exactly its own processes, even those that left its process group.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import time

import psutil

STACK_ENV = "POOLSERVE_STACK"


def _environ_has(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return needle in handle.read().split(b"\0")
    except OSError:  # gone, or not ours to read
        return False


def stack_pids(stack_id: str, exclude: set[int] | None = None) -> list[int]:
    """Pids of this user's processes whose environment carries the stack's marker."""
    needle = f"{STACK_ENV}={stack_id}".encode()
    skip = (exclude or set()) | {os.getpid()}
    uid = os.getuid()
    pids = []
    for proc in psutil.process_iter(["uids"]):
        try:
            if proc.pid in skip or proc.info["uids"] is None or proc.info["uids"].real != uid:
                continue
        except psutil.Error:
            continue
        if _environ_has(proc.pid, needle):
            pids.append(proc.pid)
    return pids


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _stop_round(pid: int) -> int:
    """When a process is signalled, in `ray stop`'s order: raylets first (their agents and workers share
    their fate), then everything else, the GCS last (signalled while others still talk to it, it lingers
    until SIGKILL: measured 30 s of a 39 s stop when a stack's processes were all signalled at once)."""
    try:
        name = psutil.Process(pid).name()
    except psutil.Error:
        return 1
    return 0 if name == "raylet" else 2 if name == "gcs_server" else 1


def end_stack(stack_id: str, grace_s: float = 30.0, exclude: set[int] | None = None) -> int:
    """SIGTERM every marked process (raylets, then the rest, then the GCS, each round waiting for the one
    before), SIGKILL what is left after `grace_s` in all; returns how many there were.

    Bounded: gives up waiting after grace_s + 10 s even if a process ignores SIGKILL (zombies)."""
    pids = stack_pids(stack_id, exclude)
    if not pids:
        return 0
    rounds = {pid: _stop_round(pid) for pid in pids}  # a process started meanwhile is one of "the rest"
    deadline = time.monotonic() + grace_s
    for round_ in range(3):
        _signal_all([pid for pid in stack_pids(stack_id, exclude) if rounds.get(pid, 1) == round_], signal.SIGTERM)
        while time.monotonic() < deadline:
            alive = [pid for pid in stack_pids(stack_id, exclude) if _is_running(pid)]
            if not any(rounds.get(pid, 1) <= round_ for pid in alive):
                break
            time.sleep(0.2)
    _signal_all(stack_pids(stack_id, exclude), signal.SIGKILL)
    kill_deadline = time.monotonic() + 10
    while time.monotonic() < kill_deadline and any(_is_running(p) for p in stack_pids(stack_id, exclude)):
        time.sleep(0.2)
    return len(pids)


def _is_running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def listening_sockets(pids: list[int]) -> list[tuple[int, str, int]]:
    """(pid, address, port) of every listening TCP socket the given processes hold."""
    wanted = set(pids)
    found = []
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.pid in wanted and conn.laddr:
            found.append((conn.pid, conn.laddr.ip, conn.laddr.port))
    return found


def is_loopback(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return address == "localhost"
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or bool(mapped and mapped.is_loopback)
