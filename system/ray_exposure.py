"""Is the Ray cluster this process runs in closed to others? Its own servers' listening sockets and its token.

`poolserve up` starts Ray on loopback with token authentication and a 0600 token of the stack's own. Plain
`serve run serve.yaml` starts Ray with its defaults instead: the GCS and the raylet listen on every interface
(`:::6379`), and with no token anyone who reaches them runs code as this user (DESIGN-FACTS §7, §9). The app
builder asks `exposure()` and refuses to deploy on such a Ray (deployments/app.py). Reads /proc through psutil;
no Ray import.
"""

from __future__ import annotations

import ipaddress
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

import psutil

# A Ray session's name, as its servers' command lines carry it (--session-dir=.../session_..., --session-name=...).
SESSION = re.compile(r"session_\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2}_\d+_\d+")
DEFAULT_TOKEN = Path("~/.ray/auth_token")  # where Ray writes and reads its token unless told otherwise


@dataclass(frozen=True)
class Listener:
    process: str
    address: str
    port: int

    def __str__(self) -> str:
        return f"{self.process} on {self.address}:{self.port}"


@dataclass(frozen=True)
class RayExposure:
    session: str | None
    open_listeners: list[Listener] = field(default_factory=list)  # Ray's servers listening beyond loopback
    token_problem: str | None = None  # why no private token protects it; None when one does
    started_by: int | None = None  # the `serve run` process that started this Ray itself, if one did

    def problem(self, several_nodes: bool) -> str | None:
        """Why this Ray is open, or None. One node: loopback only and a private token. Several nodes listen on
        their link by design, so there the private token alone must hold."""
        reasons = []
        if self.open_listeners and not several_nodes:
            shown = ", ".join(str(x) for x in self.open_listeners[:4])
            more = f" and {len(self.open_listeners) - 4} more" if len(self.open_listeners) > 4 else ""
            reasons.append(f"it listens beyond loopback ({shown}{more})")
        if self.token_problem:
            reasons.append(self.token_problem)
        return "; ".join(reasons) or None


def is_loopback(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)  # Ray's servers on 127.0.0.1 show as ::ffff:127.0.0.1
    return (mapped or ip).is_loopback


def open_listeners(listening: list[tuple[str, str, int]]) -> list[Listener]:
    """(process name, address, port) of listening sockets -> those reachable from beyond this machine."""
    return sorted(
        {Listener(name, address, port) for name, address, port in listening if not is_loopback(address)},
        key=lambda x: (x.process, x.port, x.address),
    )


def token_problem(env: dict[str, str], home: Path | None = None) -> str | None:
    """None when Ray's token authentication is on with a token only its owner can read; else why not."""
    if env.get("RAY_AUTH_MODE", "").lower() != "token":
        return "Ray's token authentication is off (RAY_AUTH_MODE is not `token`)"
    if env.get("RAY_AUTH_TOKEN"):
        return None  # the token is in the environment of Ray's own processes, no file to read
    path = (
        Path(env["RAY_AUTH_TOKEN_PATH"])
        if env.get("RAY_AUTH_TOKEN_PATH")
        else (home / ".ray" / "auth_token" if home else DEFAULT_TOKEN.expanduser())
    )
    try:
        mode = path.stat().st_mode
    except OSError:
        return f"Ray's token file {path} cannot be read"
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        return f"Ray's token file {path} is readable by others (mode {stat.S_IMODE(mode):04o}; it must be 0600)"
    return None


def _cmdline(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except (psutil.Error, OSError):
        return ""


def _session_of(process: psutil.Process) -> tuple[str | None, psutil.Process | None]:
    """The Ray session this process belongs to, read from it or its nearest ancestor that names one (a Ray
    worker retitles itself `ray::...`; the raylet that started it keeps its command line), and that ancestor."""
    current: psutil.Process | None = process
    for _ in range(8):
        if current is None:
            break
        match = SESSION.search(_cmdline(current))
        if match:
            return match.group(0), current
        try:
            current = current.parent()
        except psutil.Error:
            break
    return None, None


def _starting_serve_run(holder: psutil.Process | None) -> int | None:
    """The `serve run` process whose `ray.init()` started this session's servers (their parent), if any."""
    try:
        parent = holder.parent() if holder else None
    except psutil.Error:
        return None
    line = _cmdline(parent) if parent else ""
    return parent.pid if parent and re.search(r"\bserve\b.*\brun\b", line) else None


def exposure(env: dict[str, str] | None = None) -> RayExposure:
    """This process's Ray cluster as seen from this machine: its servers' listening sockets and its token."""
    session, holder = _session_of(psutil.Process())
    if session is None:
        return RayExposure(None, token_problem=token_problem(dict(env or os.environ)))
    listening: list[tuple[str, str, int]] = []
    for process in psutil.process_iter(["name"]):
        if session not in _cmdline(process):
            continue
        try:
            for conn in process.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN and conn.laddr:
                    listening.append((process.info["name"] or str(process.pid), conn.laddr.ip, conn.laddr.port))
        except (psutil.Error, OSError):
            continue
    return RayExposure(
        session, open_listeners(listening), token_problem(dict(env or os.environ)), _starting_serve_run(holder)
    )
