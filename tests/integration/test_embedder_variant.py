"""Runs last: configs/cpu-mpnet.yaml, the embedded default with all-mpnet-base-v2 as its embedder
(`make models-mpnet`), started once after every other stack has stopped.

- The session's state directory holds MiniLM's vectors: the launcher refuses to start this profile on it,
  naming both embedders, before it makes a pool or starts anything (rag/store/store_schema.py check_embedder).
- On its own state directory it ingests six real pages of Git's documentation (bench/data/git-doc.jsonl.gz,
  a corpus nobody here wrote), finds each page for a question that avoids the page's command name, answers a
  RAG query with citations, embeds 768-dimensional vectors, and its embedder stays under its planned budget.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import time

import httpx
import pytest

from tests.integration.conftest import ROOT, _free_port, launch_ahead, write_stack_config

pytestmark = [pytest.mark.late("swaps the embedder"), pytest.mark.slow]

PROFILE = "cpu-mpnet.yaml"
# Six short pages and a held-out paraphrase question for each (bench/data/git-doc-questions.json).
QUESTIONS = {
    "g050": "git-credential-cache",
    "g059": "gitmailmap",
    "g062": "git-cherry",
    "g043": "git-reflog",
    "g064": "git-archive",
    "g074": "git-instaweb",
}


def _pages() -> list[dict]:
    with gzip.open(ROOT / "bench" / "data" / "git-doc.jsonl.gz", "rt", encoding="utf-8") as lines:
        wanted = set(QUESTIONS.values())
        return [
            {"id": d["id"], "text": d["text"], "metadata": {"title": d["title"]}}
            for d in map(json.loads, lines)
            if d["id"] in wanted
        ]


def _questions() -> dict[str, str]:
    questions = json.loads((ROOT / "bench" / "data" / "git-doc-questions.json").read_text())["questions"]
    return {q["id"]: q["question"] for q in questions if q["id"] in QUESTIONS}


def test_the_launcher_refuses_this_embedder_on_a_store_minilm_filled(stack, tmp_path_factory):
    stack.stop()  # one stack at a time (the engine variant stopped the session's already)
    assert (stack.state_dir / "knowledge.sqlite3").exists()
    workdir = tmp_path_factory.mktemp("mpnet-refused")
    config = write_stack_config(workdir, _free_port(), base_profile=PROFILE, state_dir=stack.state_dir)
    started = time.monotonic()
    refused = subprocess.run(
        ["bash", str(ROOT / "scripts" / "serve.sh"), str(config), "--pool", "12GiB"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert refused.returncode == 2, refused.stdout + refused.stderr
    said = refused.stdout + refused.stderr
    assert "'all-minilm-l6-v2'" in said and "'all-mpnet-base-v2'" in said and "own state_dir" in said, said
    assert not stack.pids()  # nothing of a stack on that state directory was started
    print(f"refused in {time.monotonic() - started:.1f}s")


@pytest.fixture(scope="module")
def mpnet_stack(stack, tmp_path_factory):
    stack.stop()
    # launched by the on-demand module while its engines woke (or now, when that module is not in this session)
    running = launch_ahead(tmp_path_factory, "mpnet", PROFILE)
    try:
        print(f"all-mpnet-base-v2 stack healthy {running.wait_healthy():.0f}s after its launch")
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def mpnet(mpnet_stack, demo_headers):
    with httpx.Client(base_url=mpnet_stack.url, headers=demo_headers, timeout=300) as http:
        response = http.post("/v1/collections/git/documents", json={"documents": _pages()})
        assert response.status_code == 200, response.text
        yield http


def test_each_page_is_found_first_for_a_question_in_other_words(mpnet):
    ranks = {}
    for qid, question in _questions().items():
        hits = mpnet.post("/v1/collections/git/search", json={"q": question, "top_k": 3}).json()["data"]
        ranks[qid] = next((i for i, hit in enumerate(hits, 1) if hit["document_id"] == QUESTIONS[qid]), None)
    print("ranks:", ranks)
    assert all(rank is not None for rank in ranks.values()), ranks
    assert sum(rank == 1 for rank in ranks.values()) >= 5, ranks


def test_a_rag_answer_cites_the_page(mpnet):
    question = _questions()["g050"]
    answer = mpnet.post("/v1/rag/query", json={"collection": "git", "question": question, "max_tokens": 24}).json()
    assert not answer["refused"] and answer["answer"].strip()
    assert answer["citations"][0]["document_id"] == "git-credential-cache"
    assert len({c["document_id"] for c in answer["citations"]}) == len(answer["citations"])  # one per page


def test_embeddings_are_mpnets(mpnet):
    data = mpnet.post("/v1/embeddings", json={"model": "all-mpnet-base-v2", "input": ["one", "two"]}).json()["data"]
    assert [len(d["embedding"]) for d in data] == [768, 768]


def test_the_embedder_stays_under_its_planned_budget(mpnet, mpnet_stack, admin_headers):
    from planner.plan import build_plan
    from planner.profile import load_profile

    plan = build_plan(load_profile(mpnet_stack.config_path.parent / "profile.yaml"))
    status = httpx.get(f"{mpnet_stack.url}/status", headers=admin_headers, timeout=60).json()
    embedder = next(r for r in status["replicas"] if r["name"] == "embedder")
    planned = plan.replica("embedder")
    print(
        f"embedder measured {embedder['measured_bytes'] / 2**20:.0f} MiB, at-rest plan "
        f"{(planned.planned_bytes - planned.growth_bytes) / 2**20:.0f} MiB, budget {planned.planned_bytes / 2**20:.0f} MiB"
    )
    assert embedder["measured_bytes"] <= planned.planned_bytes, embedder
