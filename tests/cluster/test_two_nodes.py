"""Two nodes on this machine (issue 25): two Ray nodes on two loopback addresses, each in a memory
cgroup of its own pool's size. node-a (the head: gateway, embedder, retriever) is started by `poolserve
up`, node-b by `poolserve up --join`. Two variants, one cluster each: configs/cpu-two-nodes.yaml (the
chat engine whole on node-b) and configs/cpu-two-nodes-split.yaml (split by pipeline ranks: rank 0 in the
chat replica on node-a, rank 1 in a headless vLLM on node-b).

Checked: every replica runs on the node its plan names, chat and RAG answer through the real `openai`
client, each node's measured memory stays within its plan, losing node-b turns chat into 503 +
Retry-After (never a 500 or a hang) while RAG search goes on, chat recovers when node-b joins again, and
`poolserve down` on node-b ends only node-b's processes.

Not in `make test` (two stacks' worth of start-up, several minutes): `make test-cluster`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.integration.conftest import ADMIN_KEY, DEMO_KEY, ROOT, _free_port, write_stack_config

pytestmark = pytest.mark.timeout(2400)
POOLSERVE = str(Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin" / "poolserve")
START_TIMEOUT_S = 1200
OUTAGE_TIMEOUT_S = 180
CHAT = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "Say OK."}], "max_tokens": 2}
# Ray's process titles of the replicas (ray::ServeReplica:<app>:<deployment>).
REPLICA_TITLES = {
    "chat": "PoolserveLLMServer:chat",
    "chat_ranks": "EngineRankHost",
    "embedder": "poolserve:embedder",
    "retriever": "poolserve:retriever",
    "gateway": "poolserve:gateway",
}
# Each variant's placement: the chat engine whole on node-b, or split with its first rank on node-a (in the
# replica) and its second on node-b (a headless vLLM under an EngineRankHost actor).
PROFILES = {
    "cpu-two-nodes.yaml": {"chat": {"node-b"}, "chat_ranks": set()},
    "cpu-two-nodes-split.yaml": {"chat": {"node-a"}, "chat_ranks": {"node-b"}},
}


class Node:
    """One node's `poolserve up` (the head) or `poolserve up --join` (node-b), in its own session."""

    def __init__(self, name: str, command: list[str], state_dir: Path, log_path: Path, env: dict):
        self.name, self.command, self.state_dir, self.log_path, self.env = name, command, state_dir, log_path, env
        self.process: subprocess.Popen | None = None

    @property
    def stack_id(self) -> str:
        from stackctl.launcher import StackLayout

        return StackLayout(self.state_dir).stack_id

    def pids(self) -> list[int]:
        from stackctl.processes import stack_pids

        return stack_pids(self.stack_id)

    def start(self) -> None:
        self.process = subprocess.Popen(
            self.command,
            cwd=ROOT,
            env=self.env,
            start_new_session=True,
            stdout=open(self.log_path, "ab"),
            stderr=subprocess.STDOUT,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill_hard(self) -> None:
        """The node is lost (power, cable): every process of it SIGKILLed at once, no clean shutdown."""
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=180)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
        from stackctl.processes import end_stack

        end_stack(self.stack_id)


def _replica_nodes(nodes: list[Node]) -> dict[str, set[str]]:
    """Which node's processes hold each replica (by Ray's process title)."""
    found: dict[str, set[str]] = {name: set() for name in REPLICA_TITLES}
    for node in nodes:
        for pid in node.pids():
            try:
                title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            for replica, marker in REPLICA_TITLES.items():
                if marker in title:
                    found[replica].add(node.name)
    return found


def _wait_healthy(url: str, nodes: list[Node], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for node in nodes:
            if node.process.poll() is not None:
                raise RuntimeError(f"{node.name} exited with {node.process.returncode}:\n{node.log()[-3000:]}")
        try:
            if httpx.get(f"{url}/healthz", timeout=10).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(5)
    raise TimeoutError(f"the cluster was not healthy after {timeout_s}s; see {nodes[0].log_path}")


@pytest.fixture(scope="module", params=list(PROFILES), ids=["whole", "split"])
def cluster(request, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("cluster")
    port = _free_port()
    config = write_stack_config(workdir, port, base_profile=request.param)
    profile_path = workdir / "profile.yaml"
    profile = yaml.safe_load(profile_path.read_text())
    # The profile's fixed ports, moved to free ones here (a test must not meet a Ray the user runs).
    from stackctl.launcher import free_ports

    base = 40000 + (os.getpid() % 50) * 400
    # single ports outside the two nodes' ranges below (Ray refuses a port two of its components name)
    singles = iter([p for p in free_ports(40) if not base <= p < base + 400][: 9 + 6])
    for i, pool in enumerate(profile["pools"]):
        fields = [
            "dashboard_agent_listen",
            "dashboard_agent_grpc",
            "metrics_export",
            "runtime_env_agent",
            "node_manager",
            "object_manager",
        ] + (["gcs", "ray_client_server", "dashboard"] if i == 0 else [])
        pool["ray_ports"] = {field: next(singles) for field in fields}
        pool["ray_ports"].update(
            min_worker=base + 200 * i,
            max_worker=base + 200 * i + 159,
            vllm_ports=base + 200 * i + 170,
            vllm_master=base + 200 * i + 190,
        )
    profile_path.write_text(yaml.safe_dump(profile))
    env = {
        **os.environ,
        "POOLSERVE_ADMIN_KEY": ADMIN_KEY,
        "POOLSERVE_DEMO_KEY": DEMO_KEY,
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    head_state = workdir / "state"
    head = Node(
        "node-a",
        [POOLSERVE, "up", str(config), "--profile", str(profile_path)],
        head_state,
        workdir / "node-a.log",
        env,
    )
    gcs = f"{profile['pools'][0]['address']}:{profile['pools'][0]['ray_ports']['gcs']}"
    node_b = Node(
        "node-b",
        [
            POOLSERVE,
            "up",
            str(config),
            "--profile",
            str(profile_path),
            "--join",
            gcs,
            "--node",
            "node-b",
            "--state-dir",
            str(workdir / "state-b"),
            "--token-file",
            str(head_state / "ray-auth-token"),
        ],
        workdir / "state-b",
        workdir / "node-b.log",
        env,
    )
    try:
        head.start()
        deadline = time.monotonic() + 300
        while "ray head on" not in head.log() and time.monotonic() < deadline and head.process.poll() is None:
            time.sleep(1)
        assert "ray head on" in head.log(), head.log()[-3000:]
        node_b.start()
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, [head, node_b], START_TIMEOUT_S)
        from planner.plan import build_plan
        from planner.profile import load_profile

        yield {
            "url": url,
            "head": head,
            "node_b": node_b,
            "plan": build_plan(load_profile(profile_path)),
            "placement": PROFILES[request.param],
            "headers": {"Authorization": f"Bearer {DEMO_KEY}"},
        }
    finally:
        node_b.stop()
        head.stop()


def test_every_replica_runs_on_the_node_its_plan_names(cluster):
    placed = _replica_nodes([cluster["head"], cluster["node_b"]])
    assert placed == {**cluster["placement"], "embedder": {"node-a"}, "retriever": {"node-a"}, "gateway": {"node-a"}}


def test_chat_and_rag_answer_through_the_openai_client(cluster):
    from openai import OpenAI

    client = OpenAI(base_url=f"{cluster['url']}/v1", api_key=DEMO_KEY, timeout=120, max_retries=0)
    reply = client.chat.completions.create(**CHAT)
    assert reply.choices[0].message.content and reply.usage.completion_tokens >= 1
    with httpx.Client(base_url=cluster["url"], headers=cluster["headers"], timeout=120) as http:
        stored = http.post(
            "/v1/collections/two-nodes/documents",
            json={
                "documents": [
                    {"id": "leave", "text": "Employees of Hollow Pine get 27 vacation days per year."},
                    {"id": "parking", "text": "Visitor parking is behind building C."},
                ]
            },
        )
        assert stored.status_code == 200, stored.text
        answer = http.post(
            "/v1/rag/query",
            json={
                "collection": "two-nodes",
                "top_k": 2,
                "max_tokens": 8,
                "question": "How many vacation days do Hollow Pine employees get?",
            },
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["citations"][0]["document_id"] == "leave"


def test_each_node_measures_within_its_plan(cluster):
    from system.cgroup import own_cgroup

    for node in (cluster["head"], cluster["node_b"]):
        planned = next(p for p in cluster["plan"].pools if p.name == node.name)
        pools = {own_cgroup(pid).path for pid in node.pids() if own_cgroup(pid) is not None}
        assert len(pools) == 1, f"{node.name}'s processes are in {pools}"
        pool = own_cgroup(node.pids()[0])
        assert pool.limit_bytes() == planned.total_bytes
        ceiling = planned.planned_bytes + planned.ray_bytes + planned.page_cache_bytes
        used = pool.in_use_bytes()
        print(
            f"{node.name}: {used / 2**30:.2f} GiB in use, plan {ceiling / 2**30:.2f} GiB, pool "
            f"{planned.total_bytes / 2**30:.2f} GiB"
        )
        assert used <= ceiling, f"{node.name} uses {used} B, its plan {ceiling} B"


def test_losing_node_b_is_503_for_chat_while_rag_search_works_and_chat_recovers(cluster):
    url, node_b = cluster["url"], cluster["node_b"]
    node_b.kill_hard()
    lost_at = time.monotonic()
    statuses = []
    with httpx.Client(base_url=url, headers=cluster["headers"], timeout=60) as http:
        while time.monotonic() - lost_at < OUTAGE_TIMEOUT_S:
            response = http.post("/v1/chat/completions", json=CHAT)
            statuses.append(response.status_code)
            assert response.status_code < 500 or response.status_code == 503, response.text
            if response.status_code == 503:
                assert int(response.headers["Retry-After"]) >= 1
                break
            time.sleep(2)
        assert statuses[-1] == 503, f"chat never answered 503 after node-b was lost: {statuses}"
        health = httpx.get(f"{url}/healthz", timeout=30)
        assert health.status_code == 503 and health.json()["replicas"]["chat"] != "ok", health.text
        search = http.get("/v1/collections/two-nodes/search", params={"q": "vacation days", "top_k": 1})
        assert search.status_code == 200, search.text
        assert search.json()["data"][0]["document_id"] == "leave"
        # node-b comes back: chat is placed there again and answers.
        node_b.stop()
        node_b.start()
        _wait_healthy(url, [cluster["head"], node_b], START_TIMEOUT_S)
        assert http.post("/v1/chat/completions", json=CHAT).status_code == 200


def _split_engine_part(pids: set[int]) -> set[int]:
    """node-a's share of a split chat engine: the chat replica and its EngineCore tree, which end (and are
    replaced) by design when the ranks on node-b go."""
    import psutil

    part = set()
    for pid in pids:
        try:
            process = psutil.Process(pid)
            if REPLICA_TITLES["chat"] in " ".join(process.cmdline()):
                part |= {pid, *(child.pid for child in process.children(recursive=True))}
        except psutil.Error:
            continue
    return part


def test_down_on_node_b_ends_only_its_processes(cluster):
    head_before = set(cluster["head"].pids())
    if cluster["placement"]["chat_ranks"]:
        head_before -= _split_engine_part(head_before)
    node_b = cluster["node_b"]
    config = Path(cluster["head"].command[2])
    subprocess.run(
        [POOLSERVE, "down", str(config), "--profile", cluster["head"].command[4], "--state-dir", str(node_b.state_dir)],
        check=True,
        timeout=180,
        env=node_b.env,
    )
    assert node_b.pids() == []
    assert head_before <= set(cluster["head"].pids()), "poolserve down on node-b ended processes of node-a"
