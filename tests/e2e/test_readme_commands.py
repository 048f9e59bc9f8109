"""The README's main command on a fresh clone: `make serve` sets everything up and answers RAG.

Clones the committed tree, runs `make serve` (venv, pinned install, model preparation, stack),
waits for /healthz, asks a question over a posted document, then Ctrl-C's it and checks that
none of that stack's processes (found by its marker, never by name) is left behind.

In CI (.ci/run) the checkout under test is itself a fresh clone that `make test` has just set up
from nothing, through the same `setup` target `make serve` runs first; POOLSERVE_E2E_CHECKOUT
names it, and the test runs `make serve` there instead of installing a second venv (~4 minutes).
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

# First of all (tests/conftest.py STAGES), while the integration tests' stack starts beside it.
pytestmark = [pytest.mark.late("fresh clone"), pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SETUP_AND_START_TIMEOUT_S = 1500


def _leftovers(state_dir: Path) -> list[int]:
    from stackctl.launcher import StackLayout
    from stackctl.processes import stack_pids

    return stack_pids(StackLayout(state_dir).stack_id)


def _port_in_use(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _launch_the_session_stack_beside(request) -> None:
    """When this session's integration tests need their stack, launch it now (tests/conftest.py
    `launched_stack`): both starts then share the two cores instead of running one after the other."""
    if any("stack" in item.fixturenames for item in request.session.items):
        request.getfixturevalue("launched_stack")


def test_make_serve_on_a_fresh_clone_answers_rag(tmp_path, request):
    _launch_the_session_stack_beside(request)
    if _port_in_use(8000):  # never disturb a stack the user is running
        pytest.skip("127.0.0.1:8000 is in use (a `make serve` stack?); the README's command serves there")
    given = os.environ.get("POOLSERVE_E2E_CHECKOUT")
    clone = Path(given) if given else tmp_path / "fresh"
    if not given:
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    elif (clone / "var" / "demo-api-key").exists():
        pytest.fail(f"{clone} has served before (var/demo-api-key exists): not a fresh clone")
    log = open(tmp_path / "make-serve.log", "wb")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POOLSERVE_", "VIRTUAL_ENV"))}
    process = subprocess.Popen(
        ["make", "serve"], cwd=clone, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
    )
    try:
        deadline = time.monotonic() + SETUP_AND_START_TIMEOUT_S
        healthy = False
        while time.monotonic() < deadline and process.poll() is None:
            try:
                healthy = httpx.get("http://127.0.0.1:8000/healthz", timeout=5).status_code == 200
            except httpx.HTTPError:
                healthy = False
            if healthy:
                break
            time.sleep(1)
        assert healthy, f"make serve never became healthy; see {tmp_path / 'make-serve.log'}"
        key_file = clone / "var" / "demo-api-key"
        assert oct(key_file.stat().st_mode & 0o777) == "0o600"
        headers = {"Authorization": f"Bearer {key_file.read_text().strip()}"}
        with httpx.Client(base_url="http://127.0.0.1:8000", headers=headers, timeout=120) as http:
            posted = http.post(
                "/v1/collections/handbook/documents",
                json={
                    "documents": [
                        {"id": "vacation", "text": "Employees of Hollow Pine Ltd get 27 vacation days per year."},
                        {"id": "parking", "text": "Visitor parking is behind building C."},
                    ]
                },
            )
            assert posted.status_code == 200, posted.text
            answer = http.post(
                "/v1/rag/query",
                json={
                    "collection": "handbook",
                    "top_k": 2,
                    "question": "How many vacation days do Hollow Pine employees get?",
                },
            ).json()
        assert answer["citations"][0]["document_id"] == "vacation"
        assert "27" in answer["answer"]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)
            try:
                process.wait(timeout=180)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
        left = []
        for _ in range(30):
            left = _leftovers(clone / "var")
            if not left:
                break
            time.sleep(2)
        if left:
            subprocess.run(["bash", str(clone / "scripts" / "stop.sh")], cwd=clone, timeout=120)
    assert not left, f"processes of the clone's stack left after Ctrl-C: {left}"
