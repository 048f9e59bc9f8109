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

from planner.profile_file import read_profile_data

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = float(os.environ.get("POOLSERVE_TEST_START_TIMEOUT", "900"))
ADMIN_KEY = "test-admin-key-0123456789"
DEMO_KEY = "ps_0123456789ab_TestDemoKeyTestDemoKeyTestDemoKeyTestDemoKey123"
SESSION_PROFILE = "cpu-tiny.yaml"  # the session stack's profile, and every variant's base unless it names one


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_stack_config(
    workdir: Path,
    port: int,
    chat_overrides: dict | None = None,
    gateway_overrides: dict | None = None,
    route_prefix: str = "/",
    base_profile: str = SESSION_PROFILE,
    state_dir: Path | None = None,
) -> Path:
    """A profile like the embedded default (or another of configs/), with its own port and state dir (or
    `state_dir`: another stack's, to restart on its data), and a serve.yaml naming it."""
    profile = read_profile_data(ROOT / "configs" / base_profile)
    profile["state_dir"] = str(state_dir or workdir / "state")
    # The example tenants plus one seeded from the file with a generated key (deleted before the restart
    # of test_engine_variant).
    tenants = yaml.safe_load((ROOT / "configs" / "tenants.example.yaml").read_text())
    tenants["tenants"].append({"name": "seeded", "rpm": 100})
    (workdir / "tenants.yaml").write_text(yaml.safe_dump(tenants))
    profile["tenants_file"] = str(workdir / "tenants.yaml")
    profile["chat"]["model"] = str(ROOT / profile["chat"]["model"])
    for engine in profile.get("engines", []):
        engine["model"] = str(ROOT / engine["model"])
    profile["embedder"]["model"] = str(ROOT / profile["embedder"]["model"])
    for key, value in (chat_overrides or {}).items():
        profile["chat"][key] = value
    profile["gateway"] = {**profile.get("gateway", {}), "port": port, **(gateway_overrides or {})}
    profile_path = workdir / "profile.yaml"
    profile_path.write_text(yaml.safe_dump(profile))
    serve_config = yaml.safe_load((ROOT / "serve.yaml").read_text())
    serve_config["http_options"]["port"] = port
    serve_config["applications"][0]["args"]["profile"] = str(profile_path)
    serve_config["applications"][0]["route_prefix"] = route_prefix
    config_path = workdir / "serve.yaml"
    config_path.write_text(yaml.safe_dump(serve_config))
    return config_path


def pool_size_for(profile_path: Path) -> int:
    """The pool a profile's plan asks for (replicas, Ray, page cache, the largest start peak and its
    reserve), rounded up to 256 MiB."""
    from planner.plan import build_plan
    from planner.profile import load_profile

    wanted = build_plan(load_profile(profile_path)).pool.needed_bytes
    step = 256 * 2**20
    return -(-wanted // step) * step


class Stack:
    def __init__(self, config_path: Path, port: int, log_path: Path, route_prefix: str = ""):
        self.config_path, self.port, self.log_path = config_path, port, log_path
        self.origin = f"http://127.0.0.1:{port}"
        self.url = self.origin + route_prefix.rstrip("/")
        self.process: subprocess.Popen | None = None
        self.launched_at = 0.0
        self.stopped = False  # by stop(), since its last launch: another stop() has nothing to end
        self.state_dir = Path(yaml.safe_load((config_path.parent / "profile.yaml").read_text())["state_dir"])
        self.pool_bytes = pool_size_for(config_path.parent / "profile.yaml")

    @property
    def stack_id(self) -> str:
        from stackctl.launcher import StackLayout

        return StackLayout(self.state_dir).stack_id

    def pids(self) -> list[int]:
        from stackctl.processes import stack_pids

        return stack_pids(self.stack_id)

    def start(self, demo_key: bool = True) -> float:
        """Launch and wait until healthy: the seconds it took."""
        self.launch(demo_key)
        return self.wait_healthy()

    def launch(self, demo_key: bool = True) -> None:
        """Start the stack without waiting for it (wait_healthy does)."""
        env = {**os.environ, "POOLSERVE_ADMIN_KEY": ADMIN_KEY, "RAY_USAGE_STATS_ENABLED": "0"}
        env.pop("POOLSERVE_DEMO_KEY", None)
        if demo_key:
            env["POOLSERVE_DEMO_KEY"] = DEMO_KEY
        self.launched_at = time.monotonic()
        self.stopped = False
        log = open(self.log_path, "ab")
        # The same path as `make serve`: plan, `ray start` sized by the plan, `serve run`.
        # Inside a real memory pool (a cgroup) sized from the plan, as `make serve POOL=...` runs it.
        self.process = subprocess.Popen(
            ["bash", str(ROOT / "scripts" / "serve.sh"), str(self.config_path), "--pool", str(self.pool_bytes)],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_healthy(self) -> float:
        """Block until /healthz answers 200 (bounded by START_TIMEOUT_S from the launch): seconds since it."""
        deadline = self.launched_at + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"serve run exited with {self.process.returncode}; see {self.log_path}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=5).status_code == 200:
                    return time.monotonic() - self.launched_at
            except httpx.HTTPError:
                pass
            time.sleep(0.5)  # a start takes a minute or more; a coarser poll only adds to it
        raise TimeoutError(f"stack not healthy after {START_TIMEOUT_S}s; see {self.log_path}")

    def stop(self) -> None:
        """End this stack's processes; once done, a second call (one pool at a time: each later module, then the
        session's end) returns at once instead of searching every process again."""
        if self.stopped:
            return
        if self.process and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)  # the launcher stops `serve run`, then its processes
                self.process.wait(timeout=150)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        # Whatever is left of this stack (and only this stack: found by its marker) is ended here.
        subprocess.run(["bash", str(ROOT / "scripts" / "stop.sh"), str(self.config_path)], timeout=120, check=False)
        self.process = None
        self.stopped = True

    def restart(self, demo_key: bool = True) -> float:
        self.stop()
        return self.start(demo_key=demo_key)


# Development only: the workdir of a stack already started by `python -m tests.integration.conftest DIR`;
# the session then reuses it instead of starting (and stopping) its own.
REUSE_ENV = "POOLSERVE_TEST_REUSE_STACK"
# The session's stack once launched: a test of its own stack variant stops it first (one pool at a time)
# without launching it when it was never asked for.
SESSION_STACKS: list[Stack] = []


def _reused_stack(workdir: Path) -> Stack:
    port = yaml.safe_load((workdir / "profile.yaml").read_text())["gateway"]["port"]
    return Stack(workdir / "serve.yaml", port, workdir / "serve.log")


def new_stack(tmp_path_factory, name: str, base_profile: str = SESSION_PROFILE) -> Stack:
    """A stack of its own from `base_profile`, in a fresh folder named after `name`, on a free port; not started."""
    workdir = tmp_path_factory.mktemp(name)
    port = _free_port()
    return Stack(write_stack_config(workdir, port, base_profile=base_profile), port, workdir / "serve.log")


def launch_session_stack(tmp_path_factory) -> tuple[Stack, bool]:
    """The session's stack, launched and not yet healthy, and whether this session owns it (not when
    REUSE_ENV names one already running)."""
    if os.environ.get(REUSE_ENV):
        return _reused_stack(Path(os.environ[REUSE_ENV])), False
    running = new_stack(tmp_path_factory, "stack")
    running.launch()
    SESSION_STACKS.append(running)
    return running, True


# Variant stacks launched ahead of the module that uses them, by name (`launch_ahead`).
LAUNCHED_AHEAD: dict[str, Stack] = {}


def launch_ahead(tmp_path_factory, name: str, base_profile: str) -> Stack:
    """The `name` variant's stack, launched once and not waited for: launched by an earlier module while its
    own tests mostly wait (the on-demand engines' cold starts use about one core of the two), picked up by
    the module that uses it, which waits until healthy and stops it. The session stops any left."""
    if name not in LAUNCHED_AHEAD:
        running = new_stack(tmp_path_factory, name, base_profile)
        running.launch()
        LAUNCHED_AHEAD[name] = running
    return LAUNCHED_AHEAD[name]


def used_later(request, fixture: str) -> bool:
    """Whether a test of this session uses `fixture` (so launching its stack ahead is not wasted)."""
    return any(fixture in getattr(item, "fixturenames", ()) for item in request.session.items)


@pytest.fixture(scope="session", autouse=True)
def stacks_launched_ahead():
    """Stops, at the session's end, a stack launched ahead whose module never ran (a -k or -x session)."""
    yield LAUNCHED_AHEAD
    for running in LAUNCHED_AHEAD.values():
        if running.process is not None:  # Stack.stop() clears it
            running.stop()


@pytest.fixture(scope="session")
def stack(launched_stack):
    """The session's stack, healthy (launched by tests/conftest.py's `launched_stack`, which stops it)."""
    if launched_stack.process is not None:  # launched by this session, not reused
        print(f"\nsession stack healthy {launched_stack.wait_healthy():.0f}s after its launch")
    return launched_stack


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


if __name__ == "__main__":  # start a stack for REUSE_ENV and leave it running: DIR [chat.FIELD=VALUE ...]
    import sys

    target = Path(sys.argv[1])
    target.mkdir(parents=True, exist_ok=True)
    chat = {key.removeprefix("chat."): yaml.safe_load(value) for key, value in (a.split("=", 1) for a in sys.argv[2:])}
    dev = Stack(write_stack_config(target, _free_port(), chat_overrides=chat), 0, target / "serve.log")
    dev.port = yaml.safe_load((target / "profile.yaml").read_text())["gateway"]["port"]
    dev.url = dev.origin = f"http://127.0.0.1:{dev.port}"
    print(f"healthy in {dev.start():.0f}s at {dev.url}; {REUSE_ENV}={target}")


def with_most_of_a_minute_left(seconds_needed: float) -> None:
    """TPM windows are clock minutes: a test whose requests must share one starts early in one (a new
    minute between them holds none of the first one's tokens). Waits, at most `seconds_needed`, when
    less than that is left of this minute; each test asks for what its requests take, with margin."""
    left = 60.0 - time.time() % 60.0
    if left < seconds_needed:
        time.sleep(left + 0.1)


def create_tenant(stack: "Stack", admin_headers: dict, **fields) -> tuple[str, str]:
    """A tenant made through the admin API (a random name unless `name` is given): its name and key."""
    import uuid

    name = fields.pop("name", f"t-{uuid.uuid4().hex[:8]}")
    response = httpx.post(
        f"{stack.url}/admin/tenants", json={"name": name, **fields}, headers=admin_headers, timeout=30
    )
    assert response.status_code == 201, response.text
    return name, response.json()["api_key"]


def all_documents(http: httpx.Client, collection: str, headers: dict | None = None) -> list[dict]:
    """Every document of a collection, through the paged listing (bounded: 10,000 pages)."""
    documents, after = [], None
    for _ in range(10_000):
        page = http.get(
            f"/v1/collections/{collection}/documents",
            headers=headers,
            params={"limit": 100, **({"after": after} if after else {})},
        ).json()
        documents += page["data"]
        if not page["has_more"]:
            return documents
        after = page["last_id"]
    raise AssertionError(f"{collection}: more than 10,000 pages")
