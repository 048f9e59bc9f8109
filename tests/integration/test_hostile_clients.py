"""Hostile and careless clients against the real stack (issue 23): while one attacks, another tenant's
chat and RAG query are served as fast as when it is quiet (p95 within 2x) and nothing is refused to it;
the attacker is refused (4xx) or charged. The figures are printed (pytest -s) and in docs/SECURITY.md.
The flood runs last, from an address of its own, which it leaves over its keyless minute."""

from __future__ import annotations

import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.integration.conftest import create_tenant, with_most_of_a_minute_left

pytestmark = pytest.mark.timeout(600)
# Of each of the victim's requests, quiet and under attack: 20, so that the p95 (nearest rank: the 19th of
# 20) is a p95 and not the slowest request (it is with fewer than 20: with 6, one stall of the shared
# machine decided it).
ROUNDS = 20
ATTACKERS = 60
# Less than this is noise on a shared two-core machine: the p95's bound is 2x quiet or quiet + this.
LATENCY_SLACK_S = 1.0
# The 2x, asserted on the median, which one stall of the shared machine cannot move; plus a
# scheduler's few ticks of noise. The strict p95 ratios of each attack are measured in docs/SECURITY.md.
MEDIAN_SLACK_S = 0.05


def _p95(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]  # nearest rank


def _latencies(quiet: list[float], loud: list[float]) -> dict:
    return {
        "p95_quiet": _p95(quiet),
        "p95_attack": _p95(loud),
        "median_quiet": statistics.median(quiet),
        "median_attack": statistics.median(loud),
    }


def assert_within_2x(figures: dict, context) -> None:
    """A victim's latencies under attack against quiet (from _latencies): the p95 within 2x or the slack,
    the median within 2x."""
    assert figures["p95_attack"] <= max(2 * figures["p95_quiet"], figures["p95_quiet"] + LATENCY_SLACK_S), context
    assert figures["median_attack"] <= 2 * figures["median_quiet"] + MEDIAN_SLACK_S, context


@pytest.fixture(scope="module")
def victim(stack, demo_headers):
    """The demo tenant with a small knowledge base, as the one who must not be hurt."""
    with httpx.Client(base_url=stack.url, headers=demo_headers, timeout=120) as http:
        http.delete("/v1/collections/hostile-kb")
        stored = http.post(
            "/v1/collections/hostile-kb/documents",
            json={
                "documents": [
                    {
                        "id": "leave",
                        "text": "Employees get 25 days of paid leave a year. Unused days carry over to March.",
                    }
                ]
            },
        )
        assert stored.status_code == 200, stored.text
        yield http
        http.delete("/v1/collections/hostile-kb")


def _victim_embeddings(http: httpx.Client) -> tuple[list[float], list[int]]:
    """The victim's own document batches: embeddings of 8 passages (two batches of the embedder's 4)."""
    seconds, statuses = [], []
    inputs = [f"Passage {i} of the leave policy: days carry over to March and expire after a year." for i in range(8)]
    for _ in range(ROUNDS):
        started = time.perf_counter()
        statuses.append(http.post("/v1/embeddings", json={"input": inputs}).status_code)
        seconds.append(time.perf_counter() - started)
    return seconds, statuses


@pytest.fixture(scope="module")
def quiet(victim) -> dict:
    """The victim's latencies with nobody attacking: the baseline of every attack below."""
    chat, rag, statuses = _victim_round(victim)
    embeddings, embedding_statuses = _victim_embeddings(victim)
    return {"chat": chat, "rag": rag, "embeddings": embeddings, "statuses": statuses + embedding_statuses}


def _victim_round(http: httpx.Client) -> tuple[list[float], list[float], list[int]]:
    chat, rag, statuses = [], [], []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        reply = http.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "Say OK."}], "max_tokens": 1}
        )
        chat.append(time.perf_counter() - started)
        started = time.perf_counter()
        answer = http.post(
            "/v1/rag/query",
            json={
                "collection": "hostile-kb",
                "max_tokens": 1,
                "question": "How many days of paid leave do employees get?",
            },
        )
        rag.append(time.perf_counter() - started)
        statuses += [reply.status_code, answer.status_code]
    return chat, rag, statuses


# The attacker is another machine in real life: here it is another process (its threads would otherwise
# hold this process's GIL and slow the victim's own client), at the lowest CPU priority so that on two
# shared cores it stands for remote traffic, not for a local CPU hog. It floods until its stdin closes.
ATTACKER = """
import json, sys, threading, httpx
url, count, log, address = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
body = b"[" + b"[]," * (8 * 2**20 // 3) + b"[]]"
stop, lock = threading.Event(), threading.Lock()
def record(outcome):
    with lock, open(log, "a") as out:  # one line per answer, on disk at once: a killed attacker keeps its log
        out.write(json.dumps(outcome) + "\\n")
def attack():
    with httpx.Client(timeout=60, transport=httpx.HTTPTransport(local_address=address)) as http:
        while not stop.is_set():
            try:
                record(http.request("GET", url + "/healthz", content=body).status_code)
            except httpx.TransportError as exc:
                record(type(exc).__name__)
threads = [threading.Thread(target=attack, daemon=True) for _ in range(count)]
"""
# The end of every attacker script: its `threads` run until its stdin closes (attacking_process below).
UNTIL_STDIN_CLOSES = """
for t in threads:
    t.start()
sys.stdin.read()
stop.set()
for t in threads:
    t.join(timeout=120)
"""
ATTACKER += UNTIL_STDIN_CLOSES


def test_parallel_embeddings_cannot_overrun_the_tenants_tpm(stack, admin_headers):
    # A name of its own: usage and refusals are kept by name after a tenant's deletion (accounting), so a
    # rerun against the same stack must not find the last run's.
    name, key = create_tenant(stack, admin_headers, name=f"hostile-tpm-{uuid.uuid4().hex[:6]}", tpm=20000)
    admin = httpx.Client(base_url=stack.url, headers=admin_headers, timeout=120)
    inputs = [f"passage {i}: " + "the quick brown fox jumps over the lazy dog " * 22 for i in range(200)]
    try:

        def embed(_):
            with httpx.Client(base_url=stack.url, headers={"Authorization": f"Bearer {key}"}, timeout=300) as http:
                return http.post("/v1/embeddings", json={"input": inputs})

        with_most_of_a_minute_left(5)  # all four in one TPM minute: refused from the estimate, 0.3-0.4 s each here
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(embed, range(4)))
        statuses = sorted(a.status_code for a in answers)
        refusals = [a.json()["error"]["message"] for a in answers if a.status_code == 429]
        print(f"\nparallel embeddings, tpm 20000: statuses {statuses}; {refusals[:1]}")
        # Each is estimated over the whole TPM (issue 46: one used to be capped to it and run, 2.4x the limit):
        # every one is "Request too large" naming the limit and its estimate, and none ran or was charged.
        assert statuses == [429] * 4, statuses
        assert all(re.search(r"Request too large .*: Limit 20000, Requested \d{5}\.", m) for m in refusals), refusals
        assert all(a.headers.get("x-should-retry") == "false" and "retry-after" not in a.headers for a in answers)
        usage = admin.get(f"/admin/tenants/{name}/usage").json()
        assert usage["rejected_today"] == {"request_too_large": 4} and usage["usage"] == []
    finally:
        admin.delete(f"/admin/tenants/{name}")
        admin.close()


def test_the_login_form_locks_after_a_few_wrong_keys_and_healthz_hides_the_pool(stack):
    # A client address of its own (any 127.x reaches loopback): the failures other tests' logins made from
    # 127.0.0.1 within the minute would count against it otherwise.
    own_address = httpx.HTTPTransport(local_address=f"127.0.0.{random.randint(2, 250)}")
    with httpx.Client(base_url=stack.url, timeout=30, follow_redirects=False, transport=own_address) as http:
        codes = [http.post("/dashboard/login", data={"key": f"guess-{i}"}).status_code for i in range(8)]
        assert codes[:5] == [401] * 5 and set(codes[5:]) == {429}, codes
        assert http.get("/healthz").json()["pool"] == {"state": "ok"}


def test_an_over_long_question_is_a_413_naming_the_limit(victim):
    answer = victim.post("/v1/rag/query", json={"collection": "hostile-kb", "question": "why " * 5000})
    assert answer.status_code == 413 and "rag.max_question_chars" in answer.json()["error"]["message"]


# A real manual nobody here wrote (bench/data): two jobs of it (a tenant's most, rag.max_ingest_jobs_per_tenant)
# make about a minute of the embedder's work, more than the victim's rounds take.
MANUAL = Path(__file__).resolve().parents[2] / "bench" / "data" / "sqlite-doc.jsonl.gz"
BULK_DOCUMENTS_PER_JOB = 40


def _job_settled(http: httpx.Client, job_id: str, seconds: float = 120) -> dict:
    deadline = time.monotonic() + seconds
    while True:
        job = http.get(f"/v1/ingest/jobs/{job_id}").json()
        if job["status"] not in ("in_progress", "cancelling") or time.monotonic() > deadline:
            return job
        time.sleep(0.5)


@contextmanager
def _attacking_tenant(stack, admin_headers, kind: str):
    """A tenant of its own for one attack, its client and an admin client; the ingest jobs it records in
    `jobs` are cancelled and the tenant deleted at the end, whatever happened (never left running for the
    tests after it)."""
    name, key = create_tenant(stack, admin_headers, name=f"hostile-{kind}-{uuid.uuid4().hex[:6]}")
    attacker = SimpleNamespace(
        name=name,
        jobs=[],
        http=httpx.Client(base_url=stack.url, headers={"Authorization": f"Bearer {key}"}, timeout=120),
    )
    admin = httpx.Client(base_url=stack.url, headers=admin_headers, timeout=120)
    try:
        yield attacker, admin
    finally:
        for job in attacker.jobs:
            attacker.http.delete(f"/v1/ingest/jobs/{job}")
        admin.delete(f"/admin/tenants/{name}")
        attacker.http.close()
        admin.close()


@pytest.fixture(scope="module")
def bulk_ingest(stack, admin_headers, victim, quiet) -> dict:
    """The victim's chat, RAG and embeddings while another tenant bulk-ingests a manual in two jobs; the
    jobs are cancelled after the victim's rounds (they must still be embedding then)."""
    import gzip

    with gzip.open(MANUAL, "rt", encoding="utf-8") as lines:
        manual = [json.loads(line) for line in lines]
    with _attacking_tenant(stack, admin_headers, "bulk") as (attacker, admin):
        jobs = attacker.jobs
        for part in range(2):
            documents = [
                {"id": doc["id"], "text": doc["text"]}
                for doc in manual[part * BULK_DOCUMENTS_PER_JOB : (part + 1) * BULK_DOCUMENTS_PER_JOB]
            ]
            answer = attacker.http.post(
                f"/v1/collections/bulk-{part}/documents", json={"documents": documents, "async": True}
            )
            assert answer.status_code == 202, answer.text
            jobs.append(answer.json()["id"])
        deadline = time.monotonic() + 120  # both are embedding before the victim starts: a condition, not a sleep
        while time.monotonic() < deadline and not all(
            attacker.http.get(f"/v1/ingest/jobs/{job}").json()["counts"]["chunks_embedded"] > 0 for job in jobs
        ):
            time.sleep(0.25)
        loud_chat, loud_rag, loud_statuses = _victim_round(victim)
        loud_embeddings, embedding_statuses = _victim_embeddings(victim)
        during = [attacker.http.get(f"/v1/ingest/jobs/{job}").json() for job in jobs]
        for job in jobs:
            attacker.http.delete(f"/v1/ingest/jobs/{job}")
        after = [_job_settled(attacker.http, job) for job in jobs]
        usage = admin.get(f"/admin/tenants/{attacker.name}/usage").json()
    figures = {
        kind: _latencies(quiet[kind], loud)
        for kind, loud in (("chat", loud_chat), ("rag", loud_rag), ("embeddings", loud_embeddings))
    }
    figures.update(
        {
            "loud_statuses": loud_statuses + embedding_statuses,
            "jobs_during": [(job["status"], job["counts"]) for job in during],
            "jobs_after": [job["status"] for job in after],
            "attacker_tokens": sum(row["prompt_tokens"] for row in usage["usage"]),
            "seconds": {
                name: sorted(round(v, 2) for v in samples)
                for name, samples in (
                    ("chat_attack", loud_chat),
                    ("rag_attack", loud_rag),
                    ("embeddings_attack", loud_embeddings),
                    ("embeddings_quiet", quiet["embeddings"]),
                )
            },
        }
    )
    print(f"\nbulk ingest: {figures}")
    return figures


def test_a_bulk_ingest_refuses_the_other_tenant_nothing_and_is_charged_to_its_tenant(bulk_ingest):
    assert set(bulk_ingest["loud_statuses"]) == {200}, bulk_ingest
    # Still embedding when the victim's rounds ended (so every round ran under it), then cancelled.
    assert all(status == "in_progress" for status, _ in bulk_ingest["jobs_during"]), bulk_ingest["jobs_during"]
    assert set(bulk_ingest["jobs_after"]) == {"cancelled"}, bulk_ingest["jobs_after"]
    assert bulk_ingest["attacker_tokens"] > 0  # what it embedded is on its own bill


def test_a_bulk_ingest_leaves_the_other_tenants_p95_within_2x(bulk_ingest):
    """Questions go before waiting document batches, the victim's own batches take turns with the attacker's,
    and a batch is short (embedder.batch_size 4): each waits for at most one of the attacker's batches."""
    for kind in ("chat", "rag"):
        assert_within_2x(bulk_ingest[kind], (kind, bulk_ingest))
    # Its embeddings get their fair half of the embedder (turns with the attacker's batches): the p95 bound only.
    quiet, attack = bulk_ingest["embeddings"]["p95_quiet"], bulk_ingest["embeddings"]["p95_attack"]
    assert attack <= max(2 * quiet, quiet + LATENCY_SLACK_S), bulk_ingest


# What an attack must never leave in any log of the stack (issue 46: "Exception ignored ... MemoryError" was seen
# in the gateway's while the keyless flood ran; it came from the heavy extraction's capped children).
ALARMING = ("MemoryError", "Exception ignored", "Traceback (most recent call last)")


def _stack_logs(stack) -> list[Path]:
    from stackctl.launcher import StackLayout

    ray_logs = StackLayout(stack.state_dir).ray_temp_dir / "session_latest" / "logs"
    found = [stack.log_path] + (sorted(p for p in ray_logs.rglob("*") if p.is_file()) if ray_logs.is_dir() else [])
    return [p for p in found if p.exists()]


def _log_sizes(stack) -> dict[Path, int]:
    return {path: path.stat().st_size for path in _stack_logs(stack)}


def _alarming_lines_since(stack, sizes: dict[Path, int]) -> list[str]:
    """Lines the stack's logs (the launcher's and every Ray log) gained since `sizes` that hold an ALARMING word."""
    found = []
    for path in _stack_logs(stack):
        with open(path, "rb") as log:
            log.seek(sizes.get(path, 0))
            for line in log.read().decode(errors="replace").splitlines():
                if any(word in line for word in ALARMING):
                    found.append(f"{path.name}: {line.strip()[:300]}")
    return found


# The extraction attack: Markdown that is one long list (the costliest input of markdown-it-py and
# inscriptis per character), at most of rag.max_document_chars, two documents in one ingest.
HEAVY_MARKDOWN = "- a\n" * 450_000


@pytest.fixture(scope="module")
def heavy_extraction(stack, admin_headers, victim, quiet) -> dict:
    """The victim's chat and RAG while another tenant's ingest job extracts two 1.8 M-character Markdown lists,
    each in a capped child of the gateway (the victim's rounds start as the job does; the cap ends it after
    about 7 s of CPU, within the rounds); then the job is cancelled if it still runs."""
    logs_before = _log_sizes(stack)
    with _attacking_tenant(stack, admin_headers, "md") as (attacker, admin):
        documents = [{"id": f"list-{i}", "text": HEAVY_MARKDOWN, "content_type": "text/markdown"} for i in range(2)]
        answer = attacker.http.post("/v1/collections/heavy/documents", json={"documents": documents, "async": True})
        assert answer.status_code == 202, answer.text
        job = answer.json()["id"]
        attacker.jobs.append(job)
        loud_chat, loud_rag, loud_statuses = _victim_round(victim)
        during = attacker.http.get(f"/v1/ingest/jobs/{job}").json()
        attacker.http.delete(f"/v1/ingest/jobs/{job}")
        after = _job_settled(attacker.http, job, seconds=180)
        usage = admin.get(f"/admin/tenants/{attacker.name}/usage").json()
    figures = {kind: _latencies(quiet[kind], loud) for kind, loud in (("chat", loud_chat), ("rag", loud_rag))}
    figures.update(
        {
            "loud_statuses": loud_statuses,
            "job_during": (during["status"], during["stage"]),
            "job_after": after["status"],
            "job_error": after.get("error"),
            "charged": {row["model"]: row["prompt_tokens"] for row in usage["usage"]},
            "seconds": {
                "chat_attack": sorted(round(v, 2) for v in loud_chat),
                "rag_attack": sorted(round(v, 2) for v in loud_rag),
            },
        }
    )
    print(f"\nheavy extraction: {figures}")
    # The children dying at their memory cap share the gateway's stderr (issue 46: "Exception ignored ...
    # MemoryError" was found there): their outcome is their answer, and the log is left alone.
    figures["alarming_log_lines"] = _alarming_lines_since(stack, logs_before)
    return figures


def test_a_heavy_extraction_leaves_the_other_tenants_p95_within_2x_and_is_charged(heavy_extraction):
    figures = heavy_extraction
    assert set(figures["loud_statuses"]) == {200}, figures
    # Refused by the child's memory cap (rag.extraction.memory_bytes) a few seconds of CPU in, with a 413 that
    # names it (or cancelled, should a larger cap let it run past the victim's rounds); its CPU time is billed.
    if figures["job_after"] == "failed":
        assert figures["job_error"]["code"] == 413 and "rag.extraction.memory_bytes" in figures["job_error"]["message"]
        assert "signal None" not in figures["job_error"]["message"], "the child answered its 413 itself"
    else:
        assert figures["job_after"] == "cancelled", figures
    assert figures["alarming_log_lines"] == [], "nothing of the capped children in the stack's logs"
    assert figures["charged"].get("poolserve/extraction-cpu-ms", 0) > 1000, figures
    for kind in ("chat", "rag"):
        assert_within_2x(figures[kind], (kind, figures))


def _outcomes(log: Path) -> list:
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.exists() else []


@contextmanager
def attacking_process(script: str, args: list[str], log: Path, started_after: int):
    """`script` in a process of its own at nice 19 (another machine in real life), running until its stdin
    closes; entered once `started_after` outcomes are in its log (under way before the victim starts: a
    condition, not a sleep), and ended, however the body ended, within bounds."""
    attacker = subprocess.Popen(
        [sys.executable, "-c", script, *args], stdin=subprocess.PIPE, text=True, preexec_fn=lambda: os.nice(19)
    )
    try:
        deadline = time.monotonic() + 120
        while len(_outcomes(log)) < started_after and time.monotonic() < deadline and attacker.poll() is None:
            time.sleep(0.25)
        yield attacker
    finally:
        try:
            attacker.communicate(input="", timeout=150)
        except subprocess.TimeoutExpired:
            attacker.kill()
            attacker.communicate()


@pytest.fixture(scope="module")
def healthz_flood(stack, victim, quiet, tmp_path_factory) -> dict:
    """The victim's chat and RAG quiet, then under a keyless flood of 8 MiB bodies on /healthz (once for the
    tests below): latencies, statuses and what the attacker got. The attacker's address ends over its keyless
    minute; this one (127.0.0.1) must still be answered."""
    quiet_chat, quiet_rag, quiet_statuses = quiet["chat"], quiet["rag"], quiet["statuses"]
    log = tmp_path_factory.mktemp("flood") / "outcomes.jsonl"
    # From an address of its own (any 127.x reaches loopback), as an attacker elsewhere would be: the keyless
    # minute it exhausts is its own, not that of the modules after this one, which poll /healthz from 127.0.0.1.
    attacker_address = f"127.0.0.{random.randint(2, 250)}"
    logs_before = _log_sizes(stack)
    with attacking_process(ATTACKER, [stack.url, str(ATTACKERS), str(log), attacker_address], log, ATTACKERS // 4):
        loud_chat, loud_rag, loud_statuses = _victim_round(victim)
    outcomes = _outcomes(log)
    figures = {
        "chat_p95_quiet": _p95(quiet_chat),
        "chat_p95_attack": _p95(loud_chat),
        "rag_p95_quiet": _p95(quiet_rag),
        "rag_p95_attack": _p95(loud_rag),
        "chat": _latencies(quiet_chat, loud_chat),
        "rag": _latencies(quiet_rag, loud_rag),
        "attack_requests": len(outcomes),
        "attack_outcomes": {str(o): outcomes.count(o) for o in set(outcomes)},
        "quiet_statuses": quiet_statuses,
        "loud_statuses": loud_statuses,
        "outcomes": outcomes,
        # every sample, slowest last: a failure shows whether one stall or the whole series moved
        "seconds": {
            name: sorted(round(s, 2) for s in samples)
            for name, samples in (
                ("chat_quiet", quiet_chat),
                ("chat_attack", loud_chat),
                ("rag_quiet", quiet_rag),
                ("rag_attack", loud_rag),
            )
        },
    }
    print(f"\nhealthz flood: { {k: v for k, v in figures.items() if k != 'outcomes'} }")
    figures["healthz_after"] = httpx.get(f"{stack.url}/healthz", timeout=30).status_code
    figures["alarming_log_lines"] = _alarming_lines_since(stack, logs_before)
    return figures


def test_a_keyless_flood_is_refused_unread_and_refuses_the_other_tenant_nothing(healthz_flood):
    figures = healthz_flood
    assert set(figures["quiet_statuses"]) == {200} and set(figures["loud_statuses"]) == {200}, figures
    answered = [o for o in figures["outcomes"] if isinstance(o, int)]
    assert answered and set(answered) <= {413, 429}, figures["attack_outcomes"]  # refused, never served
    assert figures["healthz_after"] == 200
    assert figures["alarming_log_lines"] == [], "the flood left errors in the stack's logs"


# Keyless 8 MiB bodies on the gateway's own paths (the proxy refuses only public paths' bodies, so these reach
# the gateway replica): each is refused from its headers, unread, and nothing alarming is logged.
KEYLESS_ON_THE_GATEWAY = (
    """
import json, sys, threading, httpx
url, count, log, address = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
body = b"[" + b"[]," * (8 * 2**20 // 3) + b"[]]"
stop, lock = threading.Event(), threading.Lock()
paths = ["/v1/embeddings", "/v1/chat/completions", "/v1/collections/kb/documents", "/admin/tenants"]
def record(outcome):
    with lock, open(log, "a") as out:
        out.write(json.dumps(outcome) + "\\n")
def attack(i):
    headers = {"content-type": "application/json", **({"Authorization": "Bearer ps_000000000000_" + "x" * 43}
                                                       if i % 2 else {})}
    with httpx.Client(timeout=60, transport=httpx.HTTPTransport(local_address=address)) as http:
        n = 0
        while not stop.is_set():
            n += 1
            try:
                record(http.post(url + paths[(i + n) % len(paths)], content=body, headers=headers).status_code)
            except Exception as exc:
                record(type(exc).__name__)
threads = [threading.Thread(target=attack, args=(i,), daemon=True) for i in range(count)]
"""
    + UNTIL_STDIN_CLOSES
)


def test_a_keyless_flood_on_the_gateways_paths_is_refused_and_leaves_no_error_in_the_logs(stack, tmp_path):
    log = tmp_path / "outcomes.jsonl"
    before = _log_sizes(stack)
    address = f"127.0.0.{random.randint(2, 250)}"  # its keyless minute is its own
    with attacking_process(KEYLESS_ON_THE_GATEWAY, [stack.url, "16", str(log), address], log, 16):
        time.sleep(15)
    outcomes = _outcomes(log)
    answered = [o for o in outcomes if isinstance(o, int)]
    print(
        f"\nkeyless flood on the gateway's paths: {len(outcomes)} requests, "
        f"{ {str(o): outcomes.count(o) for o in set(outcomes)} }"
    )
    assert answered and set(answered) <= {401, 429}, set(outcomes)  # refused from the headers, never read
    assert httpx.get(f"{stack.url}/healthz", timeout=30).status_code == 200
    assert _alarming_lines_since(stack, before) == []


def test_rays_proxy_refuses_a_public_paths_body_before_the_gateway(stack):
    # The launcher installs gateway/middleware/proxy_guard.py in Ray's proxy: its refusal closes the connection, and the
    # proxy logged that it runs.
    response = httpx.request("GET", f"{stack.url}/healthz", content=b"x" * 1000, timeout=30)
    assert response.status_code == 413 and response.headers.get("connection") == "close", response.headers
    assert "the proxy refuses bodies on public paths itself" in stack.log_path.read_text(errors="replace")


def test_a_keyless_flood_leaves_the_other_tenants_p95_within_2x(healthz_flood):
    for kind in ("chat", "rag"):
        assert_within_2x(healthz_flood[kind], {k: v for k, v in healthz_flood.items() if k != "outcomes"})
