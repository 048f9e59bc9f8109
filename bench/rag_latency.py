"""End-to-end retrieval and RAG latency through a real poolserve stack (bench/harness/stack.py).

    PYTHONPATH=. .venv/bin/python bench/rag_latency.py --documents 25   # writes bench/results/rag-latency.json
    # three corpora, in order, until the collection holds >= 10,000 chunks (-> rag-latency-10k.json):
    PYTHONPATH=. .venv/bin/python bench/rag_latency.py --corpus bench/data/stdlib-pydoc.jsonl.gz \
        --corpus bench/data/sqlite-doc.jsonl.gz --corpus bench/data/texlive-pdf.jsonl.gz --target-chunks 10000

Under /tmp/poolserve-stack.lock (one helper stack on the machine at a time): a private stack from the
profile, documents ingested into one collection (by default the first 25 of the pydoc corpus; with
--corpus, the named corpora in order, loaded by bench/bench_rag_quality.py's loader, ids prefixed with
the corpus name when there are several; with --target-chunks, documents in corpus order until the
collection holds at least N chunks), then, one request at a time (after WARMUP untimed ones each):
  search      GET /v1/collections/{c}/search?q=...   (embed the question, hybrid retrieval, the rows)
  embedding   POST /v1/embeddings of the question     (the question's embedding alone)
  rag query   POST /v1/rag/query, max_tokens RAG_MAX_TOKENS (the same, plus the prompt and a short answer)
  streamed    POST /v1/rag/query, "stream": true: time to the first answer delta (retrieval + prompt +
              prefill + first token) and to [DONE], prompt tokens from the stream's usage event
  replay      each answered streamed query's prompt (rag.retrieval.prompt.rag_messages over its citations, cut to k
              passages) through POST /v1/chat/completions, streamed, a fresh cache_salt (no prefix cache
              hit): time to the first token = prefill + first token, without retrieval.
Questions: those of every ingested corpus (bench/data/rag-questions.json for pydoc, <corpus>-questions.json
for the others), interleaved; the streamed queries use other questions than the non-streamed ones, so
neither finds the other's prompt in the prefix cache. recall@k is read from the search rows: a question
whose answer documents were ingested is a hit when one of the first k passages belongs to one of them.
A RAG query the no-answer threshold refuses gets a fixed reply without generation: the non-streamed row
counts them in its percentiles (as before), the streamed rows leave them out and say how many.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when run as a script

from bench.bench_rag_quality import CORPUS, QUESTIONS, load_corpus, load_questions  # noqa: E402
from bench.harness.engine import DEFAULT_PROFILE  # noqa: E402
from bench.harness.results import RESULTS_DIR, BenchResult, new_result, write_result  # noqa: E402
from bench.harness.timing import Stopwatch, percentile  # noqa: E402
from rag.retrieval.pipeline import DocumentInput  # noqa: E402

NAME = "rag-latency"

LOCK = Path("/tmp/poolserve-stack.lock")
LOCK_WAIT_S = 1800
COLLECTION = "scale"
SEARCH_QUERIES = 80
RAG_QUERIES = 30
STREAM_QUERIES = 40
RAG_MAX_TOKENS = 8
WARMUP = 3
DEFAULT_DOCUMENTS = 25  # pydoc documents when neither --corpus nor --target-chunks is given
BATCH_DOCUMENTS = 10  # documents per ingest request at most
CHARS_PER_CHUNK_GUESS = 700  # before the first batch tells (200-token chunks, 30 overlap)
REPLAY_PASSAGES = (4, 2, 1, 0)  # passages kept in the replayed prompt (the first k of the citations)
RECALL_AT = (1, 2, 4)


@dataclass(frozen=True)
class Corpus:
    name: str
    documents: list[DocumentInput]
    questions: list[dict]  # question, documents (ids as ingested)


def questions_path(corpus: Path) -> Path:
    """The questions over a corpus: rag-questions.json for pydoc, else <corpus>-questions.json beside it."""
    if Path(corpus).resolve() == CORPUS.resolve():
        return QUESTIONS
    return Path(corpus).parent / f"{corpus_name(corpus)}-questions.json"


def corpus_name(path: Path) -> str:
    return Path(path).name.removesuffix(".gz").removesuffix(".jsonl")


def load_corpora(paths: list[Path]) -> list[Corpus]:
    """Each corpus with its questions; with several, ids become '<corpus>:<id>' (pydoc and sqlite-doc share some)."""
    corpora = []
    for path in paths:
        name = corpus_name(path)
        prefix = f"{name}:" if len(paths) > 1 else ""
        docs = [DocumentInput(id=prefix + d.id, text=d.text, metadata=d.metadata) for d in load_corpus(Path(path))]
        questions = [
            {"question": q["question"], "documents": [prefix + i for i in q.get("documents", [])]}
            for q in load_questions(questions_path(path))
        ]
        corpora.append(Corpus(name, docs, questions))
    return corpora


def next_batch_end(
    docs: list[DocumentInput],
    start: int,
    remaining_chunks: int | None,
    chars_per_chunk: float,
    max_docs: int = BATCH_DOCUMENTS,
) -> int:
    """End of the next ingest batch from `start`: up to max_docs documents, and with a chunk target only as many
    as its remaining chunks need by their text length (at least one), so the target is passed by little."""
    end = min(len(docs), start + max_docs)
    if remaining_chunks is None:
        return end
    budget = remaining_chunks * chars_per_chunk
    for i in range(start, end):
        budget -= len(docs[i].text)
        if budget <= 0:
            return i + 1
    return end


def ingest_until(
    post, docs: list[DocumentInput], target_chunks: int | None, max_docs: int = BATCH_DOCUMENTS
) -> tuple[int, int]:
    """post(batch) -> chunks stored, batch after batch, until the chunks reach target_chunks (or the documents
    run out; all of them without a target). Returns (documents taken, chunks)."""
    taken = chunks = chars = 0
    while taken < len(docs) and (target_chunks is None or chunks < target_chunks):
        remaining = None if target_chunks is None else target_chunks - chunks
        ratio = chars / chunks if chunks else CHARS_PER_CHUNK_GUESS
        end = next_batch_end(docs, taken, remaining, ratio, max_docs)
        chunks += post(docs[taken:end])
        chars += sum(len(d.text) for d in docs[taken:end])
        taken = end
    return taken, chunks


def interleave(lists: list[list]) -> list:
    """Round-robin over the lists: a, b, c, a, b, c, ... (a shorter list drops out when it ends)."""
    out = []
    for i in range(max((len(items) for items in lists), default=0)):
        out += [items[i] for items in lists if i < len(items)]
    return out


def ingested_questions(corpora: list[Corpus], ingested: set[str], answerable_first: bool = False) -> list[dict]:
    """The questions of every corpus that has at least one ingested document, interleaved, each marked
    `answerable` when one of its answer documents was ingested; answerable_first: those first (stable)."""
    questions = interleave(
        [
            [{**q, "answerable": bool(set(q["documents"]) & ingested)} for q in c.questions]
            for c in corpora
            if any(d.id in ingested for d in c.documents)
        ]
    )
    return sorted(questions, key=lambda q: not q["answerable"]) if answerable_first else questions


def recall(rows: list[list[str]], questions: list[dict], ks=RECALL_AT) -> dict:
    """recall@k over the answerable questions: rows[i] is question i's retrieved document ids, best first."""
    pairs = [(docs, set(q["documents"])) for docs, q in zip(rows, questions) if q.get("answerable", True)]
    result = {
        f"recall@{k}": round(sum(bool(set(d[:k]) & want) for d, want in pairs) / len(pairs), 4) if pairs else None
        for k in ks
    }
    return {**result, "recall_questions": len(pairs)}


def summary_ms(seconds: list[float]) -> dict:
    """requests, p50 and p95 in ms (None without values)."""
    ms = [s * 1e3 for s in seconds]
    return {"requests": len(ms), "p50": percentile(ms, 50) if ms else None, "p95": percentile(ms, 95) if ms else None}


def sse_events(lines) -> list[dict]:
    return [json.loads(line[6:]) for line in lines if line.startswith("data: ") and line.strip() != "data: [DONE]"]


def content_of(event: dict) -> str:
    """The answer text an event carries: a /v1/rag/query delta or an OpenAI chunk's delta content."""
    if event.get("object") == "rag.delta":
        return event.get("delta") or ""
    return "".join((c.get("delta") or {}).get("content") or "" for c in event.get("choices") or [])


def stream_timing(timed_events: list[tuple[float, dict]], total_s: float) -> dict:
    """From (seconds since the request, event) pairs: first answer token, the citations event, the total,
    prompt tokens (the last usage seen), refused, and the citations."""
    first = next((t for t, e in timed_events if content_of(e)), None)
    cites = next(((t, e) for t, e in timed_events if e.get("object") == "rag.citations"), (None, {}))
    usages = [e["usage"] for _, e in timed_events if isinstance(e.get("usage"), dict)]
    return {
        "first_token_s": first,
        "citations_s": cites[0],
        "total_s": total_s,
        "prompt_tokens": usages[-1].get("prompt_tokens") if usages else None,
        "refused": bool(cites[1].get("refused")),
        "citations": cites[1].get("citations") or [],
    }


def output_name(target_chunks: int | None, corpora: list | None, name: str | None = None) -> str:
    """rag-latency for the default run (its table in docs/BENCHMARKS.md 2.4), else rag-latency-<N> (10k for 10000)."""
    if name:
        return name
    if target_chunks is None:
        return NAME if not corpora else f"{NAME}-{'-'.join(corpus_name(c) for c in corpora)}"
    label = f"{target_chunks // 1000}k" if target_chunks % 1000 == 0 else str(target_chunks)
    return f"{NAME}-{label}"


def replay_messages(question: str, citations: list[dict], passages: int) -> list[dict]:
    """The prompt /v1/rag/query built for this answer (rag.retrieval.pipeline.answer), kept to its first `passages`."""
    from rag.retrieval.prompt import RetrievedChunk, rag_messages

    chunks = [RetrievedChunk(c["document_id"], c["chunk_id"], c["score"], c["text"]) for c in citations[:passages]]
    return rag_messages(question, chunks)


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


def _streamed(http, path: str, body: dict) -> dict:
    started, timed = time.perf_counter(), []
    with http.stream("POST", path, json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            timed += [(time.perf_counter() - started, e) for e in sse_events([line])]
    return stream_timing(timed, time.perf_counter() - started)


class StackClient:
    """The routes measured, over one authenticated client."""

    def __init__(self, http, chat_model: str, embed_model: str):
        self.http, self.chat_model, self.embed_model = http, chat_model, embed_model

    def ingest(self, batch: list[DocumentInput]) -> int:
        body = {"documents": [{"id": d.id, "text": d.text, "metadata": d.metadata} for d in batch]}
        response = self.http.post(f"/v1/collections/{COLLECTION}/documents", json=body)
        response.raise_for_status()
        return response.json()["chunks"]

    def search(self, q: dict) -> list[str]:
        response = self.http.get(f"/v1/collections/{COLLECTION}/search", params={"q": q["question"]})
        response.raise_for_status()
        return [row["document_id"] for row in response.json()["data"]]

    def embed(self, q: dict) -> None:
        self.http.post("/v1/embeddings", json={"model": self.embed_model, "input": q["question"]}).raise_for_status()

    def rag(self, q: dict) -> dict:
        response = self.http.post(
            "/v1/rag/query", json={"collection": COLLECTION, "question": q["question"], "max_tokens": RAG_MAX_TOKENS}
        )
        response.raise_for_status()
        return response.json()

    def rag_stream(self, q: dict, context_tokens: int | None = None) -> dict:
        body = {"collection": COLLECTION, "question": q["question"], "max_tokens": RAG_MAX_TOKENS, "stream": True}
        if context_tokens is not None:
            body["context_tokens"] = context_tokens
        return {
            **_streamed(self.http, "/v1/rag/query", body),
            "question": q["question"],
            "answer_documents": q["documents"] if q.get("answerable", True) else None,
        }

    def replay(self, question: str, citations: list[dict], passages: int) -> dict:
        body = {
            "model": self.chat_model,
            "messages": replay_messages(question, citations, passages),
            "max_tokens": RAG_MAX_TOKENS,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "cache_salt": uuid.uuid4().hex,
        }
        return _streamed(self.http, "/v1/chat/completions", body)


def in_prompt_recall(streams: list[dict]) -> dict:
    """Of the answered streams whose question has an ingested answer document, the share whose prompt
    (its citations: the passages the prompt holds) includes a passage of one of them."""
    pairs = [
        (s["citations"], set(s["answer_documents"])) for s in streams if not s["refused"] and s.get("answer_documents")
    ]
    hits = sum(any(c["document_id"] in want for c in cites) for cites, want in pairs)
    return {"in_prompt_recall": round(hits / len(pairs), 4) if pairs else None, "in_prompt_questions": len(pairs)}


def measure(client: StackClient, questions: list[dict], budgets: tuple[int, ...] = ()) -> dict:
    """Every route's timings on the questions (see the module docstring); with budgets, streamed queries
    at each rag `context_tokens`, each on questions of its own (no prefix cache shared with another row)."""
    search_q = questions[: SEARCH_QUERIES + WARMUP]
    search_s, found = _timed(client.search, search_q)
    embed_s, _ = _timed(client.embed, search_q)
    rag_s, answers = _timed(client.rag, questions[: RAG_QUERIES + WARMUP])
    stream_q = questions[RAG_QUERIES + WARMUP : RAG_QUERIES + STREAM_QUERIES + 2 * WARMUP]
    _, streams = _timed(client.rag_stream, stream_q)
    answered = [s for s in streams if not s["refused"] and s["citations"] and s["first_token_s"] is not None]
    replays = {k: [client.replay(s["question"], s["citations"], k) for s in answered] for k in REPLAY_PASSAGES}
    budgeted, start = {}, RAG_QUERIES + STREAM_QUERIES + 2 * WARMUP
    for budget in budgets:
        batch = questions[start : start + STREAM_QUERIES + WARMUP]
        start += len(batch)
        _, budgeted[budget] = _timed(lambda q, b=budget: client.rag_stream(q, b), batch)
    return {
        "search_s": search_s,
        "embed_s": embed_s,
        "rag_s": rag_s,
        "answers": answers,
        "streams": streams,
        "answered": answered,
        "replays": replays,
        "budgeted": budgeted,
        "recall": recall(found, search_q[WARMUP:]),
    }


def _p50(values: list, scale: float = 1.0) -> float | None:
    values = [v * scale for v in values if v is not None]
    return percentile(values, 50) if values else None


def rows_of(m: dict, common: dict) -> list[dict]:
    answers, answered, streams = m["answers"], m["answered"], m["streams"]
    rows = [
        {
            **common,
            "setting": "search (GET /v1/collections/{c}/search)",
            **summary_ms(m["search_s"]),
            "refused": None,
            **m["recall"],
        },
        {
            **common,
            "setting": f"RAG query (POST /v1/rag/query, max_tokens {RAG_MAX_TOKENS})",
            **summary_ms(m["rag_s"]),
            "refused": sum(1 for a in answers if a.get("refused")),
            "prompt_tokens_p50": _p50(
                [(a.get("usage") or {}).get("prompt_tokens") for a in answers if not a.get("refused")]
            ),
        },
        {**common, "setting": "question embedding (POST /v1/embeddings)", **summary_ms(m["embed_s"]), "refused": None},
    ]
    refused = len(streams) - len(answered)
    tokens = _p50([s["prompt_tokens"] for s in answered])
    for label, key in (("first token", "first_token_s"), ("citations event", "citations_s"), ("total", "total_s")):
        rows.append(
            {
                **common,
                "setting": f"RAG query streamed: {label}",
                "refused": refused,
                "prompt_tokens_p50": tokens,
                **summary_ms([s[key] for s in answered]),
                **(in_prompt_recall(streams) if key == "first_token_s" else {}),
            }
        )
    for budget, budget_streams in m.get("budgeted", {}).items():
        done = [s for s in budget_streams if not s["refused"] and s["first_token_s"] is not None]
        rows.append(
            {
                **common,
                "setting": f"RAG query streamed, context_tokens {budget}: first token",
                "refused": len(budget_streams) - len(done),
                "prompt_tokens_p50": _p50([s["prompt_tokens"] for s in done]),
                **summary_ms([s["first_token_s"] for s in done]),
                **in_prompt_recall(budget_streams),
            }
        )
    for k, replays in m["replays"].items():
        rows.append(
            {
                **common,
                "setting": f"prompt replay, {k} passages (POST /v1/chat/completions, cold cache): first token",
                "refused": None,
                "prompt_tokens_p50": _p50([r["prompt_tokens"] for r in replays]),
                **summary_ms([r["first_token_s"] for r in replays if r["first_token_s"] is not None]),
            }
        )
    return rows


def breakdown(m: dict) -> dict:
    """Where a streamed query's first token goes: p50s of the parts, and per query TTFT minus its cold replay."""
    full = max(REPLAY_PASSAGES)
    pairs = [
        (s["first_token_s"], r["first_token_s"])
        for s, r in zip(m["answered"], m["replays"].get(full, []))
        if r["first_token_s"] is not None
    ]
    return {
        "first_token_p50_ms": _p50([s["first_token_s"] for s in m["answered"]], 1e3),
        "search_p50_ms": _p50(m["search_s"], 1e3),
        "embedding_p50_ms": _p50(m["embed_s"], 1e3),
        "prefill_replay_p50_ms": _p50([r for _, r in pairs], 1e3),
        "first_token_minus_replay_p50_ms": _p50([t - r for t, r in pairs], 1e3),
    }


def stack_latency(
    profile: Path,
    corpus_paths: list[Path] | None,
    documents: int | None,
    target_chunks: int | None,
    chat_overrides: dict | None = None,
    budgets: tuple[int, ...] = (),
) -> tuple[list[dict], dict]:
    import httpx
    import yaml

    from bench.harness.stack import poolserve_stack

    corpora = load_corpora(corpus_paths or [CORPUS])
    docs = [d for c in corpora for d in c.documents]
    if documents is not None:
        docs = docs[:documents]
    spec = yaml.safe_load(Path(profile).read_text())
    with open(LOCK, "a") as lock, tempfile.TemporaryDirectory(prefix="bench-rag-latency-") as tmp:
        waited = _take_lock(lock)
        print(f"[stack] lock taken after {waited:.0f} s", flush=True)
        with poolserve_stack(profile, Path(tmp), chat_overrides=chat_overrides) as server:
            headers = {"Authorization": f"Bearer {server.api_key}"}
            with httpx.Client(base_url=server.base_url, headers=headers, timeout=600) as http:
                client = StackClient(http, spec["chat"]["model_id"], spec["embedder"]["model_id"])
                with Stopwatch() as ingest:
                    taken, chunks = ingest_until(client.ingest, docs, target_chunks)
                print(f"[stack] ingested {taken} documents, {chunks} chunks in {ingest.seconds:.0f} s", flush=True)
                ingested = {d.id for d in docs[:taken]}
                # The default run keeps its question order (2b); a chosen corpus asks what it answers first.
                questions = ingested_questions(corpora, ingested, bool(corpus_paths or target_chunks))
                load_before = os.getloadavg()
                m = measure(client, questions, budgets)
                load_after = os.getloadavg()
    common = {
        "n": chunks,
        "real": chunks,
        "kind": "stack",
        "documents": taken,
        "ingest_s": ingest.seconds,
        "start_s": server.start_s,
    }
    info = {
        "corpora": {c.name: sum(d.id in ingested for d in c.documents) for c in corpora},
        "questions": len(questions),
        "load_average_queries": [list(load_before), list(load_after)],
        "breakdown": breakdown(m),
        "recall": m["recall"],
    }
    return rows_of(m, common), info


def run(
    profile: Path,
    corpus_paths: list[Path] | None,
    documents: int | None,
    target_chunks: int | None,
    name: str,
    chat_overrides: dict | None = None,
    budgets: tuple[int, ...] = (),
) -> BenchResult:
    load_start = os.getloadavg()
    rows, info = stack_latency(profile, corpus_paths, documents, target_chunks, chat_overrides, budgets)
    config = {
        "profile": str(profile),
        "documents": rows[0]["documents"],
        "corpora": [str(c) for c in corpus_paths or []],
        "target_chunks": target_chunks,
        "search_queries": SEARCH_QUERIES,
        "rag_queries": RAG_QUERIES,
        "stream_queries": STREAM_QUERIES,
        "rag_max_tokens": RAG_MAX_TOKENS,
        "warmup": WARMUP,
        "replay_passages": list(REPLAY_PASSAGES),
        "chat_overrides": chat_overrides or {},
        "context_tokens": list(budgets),
    }
    by = {r["setting"]: r for r in rows}
    metrics = {
        "search_p50_ms": rows[0]["p50"],
        "rag_p50_ms": rows[1]["p50"],
        "chunks": rows[0]["n"],
        "rag_stream_first_token_p50_ms": by["RAG query streamed: first token"]["p50"],
        "rag_stream_first_token_p95_ms": by["RAG query streamed: first token"]["p95"],
        "load_average_start": list(load_start),
        "load_average_end": list(os.getloadavg()),
        **info,
    }
    return new_result(name, config, metrics, rows)


def tables(result: BenchResult) -> str:
    return stack_table(result.rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--documents",
        type=int,
        default=None,
        help=f"documents ingested at most (default {DEFAULT_DOCUMENTS} pydoc documents when neither "
        "--corpus nor --target-chunks is given, else all of the corpora)",
    )
    parser.add_argument(
        "--corpus",
        type=Path,
        action="append",
        default=None,
        help="a .jsonl.gz corpus (bench/data/); repeat for several, ingested in the order given",
    )
    parser.add_argument(
        "--target-chunks",
        type=int,
        default=None,
        help="ingest documents in corpus order until the collection holds at least N chunks",
    )
    parser.add_argument(
        "--chat-omp-threads",
        type=int,
        default=None,
        help="the chat engine's OpenMP threads (chat.omp_threads; default: the plan's)",
    )
    parser.add_argument(
        "--context-tokens",
        type=int,
        action="append",
        default=[],
        help="also stream RAG queries with this rag context_tokens budget (repeat for several)",
    )
    parser.add_argument("--name", default=None, help="the result's name (default rag-latency, or rag-latency-<N>)")
    parser.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    if args.target_chunks is not None and args.target_chunks < 1:
        parser.error("--target-chunks must be at least 1")
    if args.documents is None and args.corpus is None and args.target_chunks is None:
        args.documents = DEFAULT_DOCUMENTS
    for path in args.corpus or []:
        if not path.exists() or not questions_path(path).exists():
            parser.error(f"{path}: the corpus or its questions ({questions_path(path).name}) are missing")
    omp = f"-omp{args.chat_omp_threads}" if args.chat_omp_threads and not args.name else ""
    args.name = output_name(args.target_chunks, args.corpus, args.name) + omp
    args.chat_overrides = {"omp_threads": args.chat_omp_threads} if args.chat_omp_threads else None
    return args


def main() -> None:
    args = parse_args()
    result = run(
        args.profile,
        args.corpus,
        args.documents,
        args.target_chunks,
        args.name,
        args.chat_overrides,
        tuple(args.context_tokens),
    )
    print(tables(result))
    print(json.dumps({k: result.metrics[k] for k in ("breakdown", "recall", "corpora")}, indent=1))
    print(f"wrote {write_result(result, args.out_dir)}")


def stack_table(rows: list[dict]) -> str:
    """The rows as docs/BENCHMARKS.md shows them; a prompt-tokens column when the rows have one."""
    tokens = any("prompt_tokens_p50" in r for r in rows)
    in_prompt = any("in_prompt_recall" in r for r in rows)
    lines = [
        "| route | documents | chunks | ingest s | requests | p50 ms | p95 ms | refused (no answer) |"
        + (" prompt tokens p50 |" if tokens else "")
        + (" answer in prompt |" if in_prompt else ""),
        "|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if tokens else "") + ("---:|" if in_prompt else ""),
    ]
    for r in rows:
        refused = "" if r["refused"] is None else str(r["refused"])
        cells = [f"{v:.1f}" if v is not None else "" for v in (r["p50"], r["p95"])]
        line = (
            f"| {r['setting']} | {r['documents']} | {r['n']} | {r['ingest_s']:.0f} | {r['requests']} | "
            f"{cells[0]} | {cells[1]} | {refused} |"
        )
        if tokens:
            value = r.get("prompt_tokens_p50")
            line += f" {value:.0f} |" if value is not None else " |"
        if in_prompt:
            value = r.get("in_prompt_recall")
            line += f" {value:.3f} |" if value is not None else " |"
        lines.append(line)
    return "\n".join(lines)


if __name__ == "__main__":
    main()
