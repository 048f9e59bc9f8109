"""The real stack (vLLM, sentence-transformers, FAISS, SQLite), started once per test session.

`serve run` runs in its own process group with a temporary state directory and port; teardown
stops Ray and kills any vLLM process left behind, even when a test fails.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = float(os.environ.get("POOLSERVE_TEST_START_TIMEOUT", "900"))
ADMIN_KEY = "test-admin-key-0123456789"
DEMO_KEY = "ps_0123456789ab_TestDemoKeyTestDemoKeyTestDemoKeyTestDemoKey123"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_stack_config(workdir: Path, port: int, chat_overrides: dict | None = None) -> Path:
    """A profile like the embedded default, with its own state dir, and a serve.yaml naming it."""
    profile = yaml.safe_load((ROOT / "configs" / "cpu-tiny.yaml").read_text())
    profile["state_dir"] = str(workdir / "state")
    profile["tenants_file"] = str(ROOT / "configs" / "tenants.example.yaml")
    profile["chat"]["model"] = str(ROOT / profile["chat"]["model"])
    profile["embedder"]["model"] = str(ROOT / profile["embedder"]["model"])
    for key, value in (chat_overrides or {}).items():
        profile["chat"][key] = value
    profile_path = workdir / "profile.yaml"
    profile_path.write_text(yaml.safe_dump(profile))
    serve_config = yaml.safe_load((ROOT / "serve.yaml").read_text())
    serve_config["http_options"]["port"] = port
    serve_config["applications"][0]["args"]["profile"] = str(profile_path)
    config_path = workdir / "serve.yaml"
    config_path.write_text(yaml.safe_dump(serve_config))
    return config_path


class Stack:
    def __init__(self, config_path: Path, port: int, log_path: Path):
        self.config_path, self.port, self.log_path = config_path, port, log_path
        self.url = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen | None = None

    def start(self, demo_key: bool = True) -> float:
        env = {**os.environ, "POOLSERVE_ADMIN_KEY": ADMIN_KEY, "RAY_USAGE_STATS_ENABLED": "0"}
        env.pop("POOLSERVE_DEMO_KEY", None)
        if demo_key:
            env["POOLSERVE_DEMO_KEY"] = DEMO_KEY
        started = time.monotonic()
        log = open(self.log_path, "ab")
        # The same path as `make serve`: plan, `ray start` sized by the plan, `serve run`.
        self.process = subprocess.Popen(
            ["bash", str(ROOT / "scripts" / "serve.sh"), str(self.config_path)],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = started + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"serve run exited with {self.process.returncode}; see {self.log_path}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=5).status_code == 200:
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass
            time.sleep(3)
        raise TimeoutError(f"stack not healthy after {START_TIMEOUT_S}s; see {self.log_path}")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGINT)
                self.process.wait(timeout=120)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        # Ray workers and vLLM's EngineCore/Worker live in other process groups: end them all.
        subprocess.run(["bash", str(ROOT / "scripts" / "stop.sh")], timeout=120, check=False)
        self.process = None

    def restart(self, demo_key: bool = True) -> float:
        self.stop()
        return self.start(demo_key=demo_key)


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("stack")
    port = _free_port()
    config = write_stack_config(workdir, port)
    running = Stack(config, port, workdir / "serve.log")
    try:
        running.start_seconds = running.start()
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="session")
def demo_headers() -> dict:
    return {"Authorization": f"Bearer {DEMO_KEY}"}


@pytest.fixture(scope="session")
def admin_headers() -> dict:
    return {"Authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture()
def client(stack, demo_headers):
    with httpx.Client(base_url=stack.url, headers=demo_headers, timeout=120) as http:
        yield http


@pytest.fixture()
def openai_client(stack):
    from openai import OpenAI

    return OpenAI(base_url=f"{stack.url}/v1", api_key=DEMO_KEY, timeout=120, max_retries=0)
