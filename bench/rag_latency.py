"""End-to-end retrieval and RAG latency through a real poolserve stack (bench/harness/stack.py).

    PYTHONPATH=. .venv/bin/python bench/rag_latency.py --documents 25   # writes bench/results/rag-latency.json

Under /tmp/poolserve-stack.lock (one helper stack on the machine at a time): a private stack from the
profile, the first `documents` documents of the pydoc corpus ingested into one collection, then, one
request at a time (after a few untimed ones):
  search      GET /v1/collections/{c}/search?q=...        (embed the question, hybrid retrieval, the rows)
  rag query   POST /v1/rag/query, max_tokens RAG_MAX_TOKENS (the same, plus the prompt and a short answer)
with the questions of bench/data/rag-questions.json. A RAG query the no-answer threshold refuses gets a
fixed reply without generation; the rows say how many were refused.
"""

from __future__ import annotations

import argparse
import fcntl
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when run as a script

from bench.harness.engine import DEFAULT_PROFILE  # noqa: E402
from bench.harness.results import RESULTS_DIR, BenchResult, new_result, write_result  # noqa: E402
from bench.harness.timing import Stopwatch, percentile  # noqa: E402

NAME = "rag-latency"

LOCK = Path("/tmp/poolserve-stack.lock")
LOCK_WAIT_S = 1800
COLLECTION = "scale"
SEARCH_QUERIES = 80
RAG_QUERIES = 30
RAG_MAX_TOKENS = 8
WARMUP = 3


def _take_lock(handle) -> float:
    """Seconds waited for the stack lock (bounded: LOCK_WAIT_S)."""
    started = time.monotonic()
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return time.monotonic() - started
        except BlockingIOError:
            if time.monotonic() - started > LOCK_WAIT_S:
                raise TimeoutError(f"{LOCK} still held by another stack after {LOCK_WAIT_S} s") from None
            time.sleep(5)


def _timed(call, items: list) -> tuple[list[float], list]:
    seconds, results = [], []
    for i, item in enumerate(items):
        started = time.perf_counter()
        result = call(item)
        if i >= WARMUP:
            seconds.append(time.perf_counter() - started)
            results.append(result)
    return seconds, results


def stack_latency(profile: Path, documents: int) -> list[dict]:
    import httpx

    from bench.harness.stack import poolserve_stack
    from bench.retrieval_corpus import load_documents, load_questions

    docs = load_documents()[:documents]
    questions = load_questions()
    with open(LOCK, "a") as lock, tempfile.TemporaryDirectory(prefix="bench-rag-latency-") as tmp:
        waited = _take_lock(lock)
        print(f"[stack] lock taken after {waited:.0f} s", flush=True)
        with poolserve_stack(profile, Path(tmp)) as server:
            headers = {"Authorization": f"Bearer {server.api_key}"}
            with httpx.Client(base_url=server.base_url, headers=headers, timeout=600) as http:
                chunks = 0
                with Stopwatch() as ingest:
                    for start in range(0, len(docs), 10):
                        body = {"documents": [{"id": d["id"], "text": d["text"]} for d in docs[start:start + 10]]}
                        response = http.post(f"/v1/collections/{COLLECTION}/documents", json=body)
                        response.raise_for_status()
                        chunks += response.json()["chunks"]
                print(f"[stack] ingested {len(docs)} documents, {chunks} chunks in {ingest.seconds:.0f} s", flush=True)

                def search(question: str) -> dict:
                    response = http.get(f"/v1/collections/{COLLECTION}/search", params={"q": question})
                    response.raise_for_status()
                    return response.json()

                def rag(question: str) -> dict:
                    response = http.post("/v1/rag/query", json={"collection": COLLECTION, "question": question,
                                                                 "max_tokens": RAG_MAX_TOKENS})
                    response.raise_for_status()
                    return response.json()

                search_s, _ = _timed(search, questions[:SEARCH_QUERIES + WARMUP])
                rag_s, answers = _timed(rag, questions[:RAG_QUERIES + WARMUP])
    common = {"n": chunks, "real": chunks, "kind": "stack", "documents": len(docs), "ingest_s": ingest.seconds,
              "start_s": server.start_s}
    refused = sum(1 for a in answers if a.get("refused"))
    return [
        {**common, "setting": "search (GET /v1/collections/{c}/search)", "requests": len(search_s),
         "p50": percentile([s * 1e3 for s in search_s], 50), "p95": percentile([s * 1e3 for s in search_s], 95),
         "refused": None},
        {**common, "setting": f"RAG query (POST /v1/rag/query, max_tokens {RAG_MAX_TOKENS})", "requests": len(rag_s),
         "p50": percentile([s * 1e3 for s in rag_s], 50), "p95": percentile([s * 1e3 for s in rag_s], 95),
         "refused": refused},
    ]


def run(profile: Path, documents: int) -> BenchResult:
    rows = stack_latency(profile, documents)
    config = {"profile": str(profile), "documents": documents, "search_queries": SEARCH_QUERIES,
              "rag_queries": RAG_QUERIES, "rag_max_tokens": RAG_MAX_TOKENS, "warmup": WARMUP}
    metrics = {"search_p50_ms": rows[0]["p50"], "rag_p50_ms": rows[1]["p50"], "chunks": rows[0]["n"]}
    return new_result(NAME, config, metrics, rows)


def tables(result: BenchResult) -> str:
    return stack_table(result.rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=int, default=25, help="pydoc documents ingested first")
    parser.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    result = run(args.profile, args.documents)
    print(tables(result))
    print(f"wrote {write_result(result, args.out_dir)}")


def stack_table(rows: list[dict]) -> str:
    lines = ["| route | documents | chunks | ingest s | requests | p50 ms | p95 ms | refused (no answer) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        refused = "" if r["refused"] is None else str(r["refused"])
        lines.append(f"| {r['setting']} | {r['documents']} | {r['n']} | {r['ingest_s']:.0f} | {r['requests']} | "
                     f"{r['p50']:.1f} | {r['p95']:.1f} | {refused} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
