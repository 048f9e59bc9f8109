"""The card's own command, `serve run serve.yaml`, fails closed: on the Ray it starts with its defaults (every
interface, a token others can read) the app refuses to deploy, names `poolserve up` and the setting that allows
an open Ray on purpose, writes no state, and that `serve run` ends with its Ray: no process and no listening
socket of it is left (deployments/app.py refuse_if_ray_is_open, system/ray_exposure.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import yaml

ROOT = Path(__file__).resolve().parents[2]
REFUSAL_WITHIN_S = 240  # Ray's start, the controller, one build of the app (about 35 s here)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _session_of(log: str) -> str | None:
    from system.ray_exposure import SESSION

    latest = Path("/tmp/ray/session_latest")
    match = SESSION.search(log) or (SESSION.search(os.readlink(latest)) if latest.is_symlink() else None)
    return match.group(0) if match else None


def test_plain_serve_run_refuses_to_deploy_on_an_open_ray_and_leaves_nothing_running(tmp_path):
    port = _free_port()
    profile = tmp_path / "profile.yaml"
    profile.write_text(
        yaml.safe_dump({"extends": str(ROOT / "configs" / "cpu-tiny.yaml"), "state_dir": str(tmp_path / "state")})
    )
    config = yaml.safe_load((ROOT / "serve.yaml").read_text())
    config["http_options"]["port"] = port
    config["applications"][0]["args"]["profile"] = str(profile)
    (tmp_path / "serve.yaml").write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "POOLSERVE_PROFILE"))}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    log_path = tmp_path / "serve-run.log"
    serve = str(Path(sys.executable).parent / "serve")
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [serve, "run", str(tmp_path / "serve.yaml")],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    answered = []
    try:
        deadline = time.monotonic() + REFUSAL_WITHIN_S
        while time.monotonic() < deadline and process.poll() is None:
            try:
                answered.append(httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code)
            except httpx.HTTPError:
                pass
            time.sleep(1)
        assert process.poll() is not None, f"serve run still runs after {REFUSAL_WITHIN_S}s; see {log_path}"
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=60)
    text = log_path.read_text(errors="replace")
    assert "refusing to deploy: the Ray cluster this app runs in is open" in text
    assert "poolserve up" in text and "ray.allow_open: true" in text
    assert 200 not in answered, "the gateway answered on an open Ray"
    assert not (tmp_path / "state").exists(), "a refused stack wrote its state"
    # Its Ray ended with it: no process of that session, nothing listening on the gateway's port.
    session = _session_of(text)
    deadline = time.monotonic() + 60
    left = ["?"]
    while time.monotonic() < deadline and left:
        left = [
            p.pid for p in psutil.process_iter(["cmdline"]) if session and session in " ".join(p.info["cmdline"] or [])
        ]
        time.sleep(1)
    assert session and not left, f"processes of Ray session {session} are still running: {left}"
    assert not [
        c
        for c in psutil.net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
    ], f"something still listens on the gateway's port {port}"
