"""RAG retrieval quality: dense, lexical and hybrid retrieval on real reference documents.

Corpus: bench/data/stdlib-pydoc.jsonl.gz, the pydoc text of 179 Python standard-library modules
(bench/make_rag_corpus.py made it). Questions: bench/data/rag-questions.json, hand-written; each
names every document that answers it; "exact" ones hinge on an exact term (function, flag,
constant, error name), "paraphrase" ones ask in plain words.

Everything runs through the real code: rag.retrieval.pipeline.RagPipeline ingests with the real embedder
(models/all-MiniLM-L6-v2, or --embedder PATH with its --query-prefix; sentence-transformers on CPU)
into a real rag.store.knowledge_store.KnowledgeStore (FAISS + SQLite FTS5) in a temporary directory, and retrieves through rag.retrieval.

The no-answer threshold (rag.min_score) is measured on the same ingest: the best cosine similarity
of each question with any chunk (rag.retrieval.search.SearchResult.best_similarity), for the 160
answerable questions and for bench/data/rag-unanswerable.json, 40 questions the corpus does not
answer (20 off-topic, 20 "near misses" about other languages' libraries and tools). At each
candidate threshold: the share of unanswerable questions refused (correct refusals) and of
answerable ones refused (false refusals).

Metrics are per document: a question's rank is the position of the first retrieved chunk that
belongs to one of its documents (top 10 chunks retrieved). recall@1 and recall@5 count ranks 1
and <= 5; MRR averages 1/rank (0 when not in the top 10). Ingest chunks/s is chunking plus
embedding plus storing; query p50 is one question at a time through the pipeline, embedding
included (lexical needs no embedding).

    flock /tmp/poolserve-heavy.lock .venv/bin/python bench/bench_rag_quality.py
    # the chunking comparison (one ingest per chunking, about 2-3 minutes each on 2 cores):
    flock /tmp/poolserve-heavy.lock .venv/bin/python bench/bench_rag_quality.py --chunkings all
    # another corpus (bench/make_outside_corpora.py) and its questions; no refusal table unless
    # --unanswerable names questions that corpus does not answer:
    flock /tmp/poolserve-heavy.lock .venv/bin/python bench/bench_rag_quality.py \
        --corpus bench/data/sqlite-doc.jsonl.gz --questions bench/data/sqlite-doc-questions.json \
        --out bench/results/rag-quality-sqlite-doc.json

Beside the stack's modes: "bm25-pages", BM25 over whole pages (one FTS5 row per document, the
stack's tokenizer and query rule), the baseline a chunk retriever has to beat; and a title-boost
table, lexical retrieval with the document title as a weighted FTS5 field, alone and fused with the
dense candidates (bench/rag_baselines.py).
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import MappingProxyType

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness.ranking import rank_of  # noqa: E402
from bench.rag_baselines import chunk_index, compare_title_boosts, evaluate_pages, page_index  # noqa: E402
from rag.documents.chunking import word_windows  # noqa: E402
from rag.retrieval.embedding import SentenceTransformerEmbedder  # noqa: E402
from rag.local import LocalEmbedder, LocalIndex  # noqa: E402
from rag.documents.locations import LOCATIONS_KEY  # noqa: E402
from rag.retrieval.pipeline import DocumentInput, PipelineSettings, RagPipeline  # noqa: E402
from rag.retrieval.search import RETRIEVAL_MODES, FusionSettings, fuse  # noqa: E402
from rag.store.knowledge_store import KnowledgeStore  # noqa: E402

DATA = ROOT / "bench" / "data"
CORPUS = DATA / "stdlib-pydoc.jsonl.gz"
QUESTIONS = DATA / "rag-questions.json"
UNANSWERABLE = DATA / "rag-unanswerable.json"
# Candidate no-answer thresholds (rag.min_score) compared on best similarities.
THRESHOLDS = (0.15, 0.20, 0.25, 0.30, 0.35, 0.40, 0.45, 0.50)
MODEL = ROOT / "models" / "all-MiniLM-L6-v2"
DEPTH = 10  # chunks retrieved per question for the metrics
TENANT, COLLECTION = "bench", "stdlib"
# name -> (kind, size, overlap, embed_title, embed_section): "tokens" is rag.documents.chunking.Chunker in the
# embedder's tokens (what the stack runs), "words" plain whitespace windows (the baseline of the issue);
# embed_title: each chunk embedded with its document's title in front (rag.retrieval.pipeline); embed_section: and
# with the heading path of its section (corpora whose lines carry "locations": HTML pages).
CHUNKINGS = MappingProxyType(
    {
        "tokens-200-30": ("tokens", 200, 30, True, False),
        "tokens-200-30-section": ("tokens", 200, 30, True, True),
        "tokens-200-30-notitle": ("tokens", 200, 30, False, False),
        "tokens-128-20": ("tokens", 128, 20, True, False),
        "tokens-254-40": ("tokens", 254, 40, True, False),
        "words-200": ("words", 200, 0, True, False),
        "words-200-notitle": ("words", 200, 0, False, False),
    }
)
DEFAULT_CHUNKING = "tokens-200-30"
# Fusion settings compared on the same two candidate lists per question (the default is "weighted 0.7/0.3,
# document support 0.2, 1 per document").
PLAIN = MappingProxyType({"document_support": 0.0, "chunks_per_document": 0})
FUSIONS = MappingProxyType(
    {
        # method="rrf" named: the default method is weighted since 2026-12-02, and these rows measured it, mislabelled,
        # until 2026-12-05.
        # Each row names every setting it measures, so a changed default cannot relabel it; PLAIN: neither a document's
        # other chunks as support nor the top spread over documents.
        "rrf k=60": FusionSettings(method="rrf", dense_weight=1.0, lexical_weight=1.0, **PLAIN),
        "rrf k=20": FusionSettings(method="rrf", rrf_k=20, dense_weight=1.0, lexical_weight=1.0, **PLAIN),
        "rrf k=60 dense x2": FusionSettings(method="rrf", dense_weight=1.0, lexical_weight=0.5, **PLAIN),
        "rrf k=60 lexical x2": FusionSettings(method="rrf", dense_weight=0.5, lexical_weight=1.0, **PLAIN),
        "weighted 0.5/0.5": FusionSettings(method="weighted", dense_weight=0.5, lexical_weight=0.5, **PLAIN),
        "weighted 0.7/0.3": FusionSettings(method="weighted", dense_weight=0.7, lexical_weight=0.3, **PLAIN),
        # With a document's other chunks as support (rag.fusion.document_support; the default is 0.2, with the spread
        # below: docs/BENCHMARKS.md 7.6, 7.8).
        **{
            f"weighted 0.7/0.3, document support {w:g}": FusionSettings(
                method="weighted", dense_weight=0.7, lexical_weight=0.3, document_support=w, chunks_per_document=0
            )
            for w in (0.1, 0.2, 0.4)
        },
        # And with the top 10 spread over documents (rag.fusion.chunks_per_document; 1 is the default since 2026-12-05).
        **{
            f"weighted 0.7/0.3, document support {w:g}, {n} per document": FusionSettings(
                method="weighted", dense_weight=0.7, lexical_weight=0.3, document_support=w, chunks_per_document=n
            )
            for w in (0.1, 0.2)
            for n in (1, 2)
        },
    }
)


def load_corpus(path: Path = CORPUS) -> list[DocumentInput]:
    """One document per line: id, text, and optionally title and locations (then the document's metadata
    title and section map, as the stack stores them)."""

    def metadata(line: dict) -> dict:
        return {
            **({"title": line["title"]} if line.get("title") else {}),
            **({LOCATIONS_KEY: line["locations"]} if line.get("locations") else {}),
        }

    with gzip.open(path, "rt", encoding="utf-8") as lines:
        return [DocumentInput(id=d["id"], text=d["text"], metadata=metadata(d)) for d in map(json.loads, lines)]


def load_questions(path: Path = QUESTIONS) -> list[dict]:
    return json.loads(Path(path).read_text())["questions"]


def load_unanswerable(path: Path = UNANSWERABLE) -> list[dict]:
    return json.loads(Path(path).read_text())["questions"]


def check_questions(corpus: list[DocumentInput], questions: list[dict]) -> list[str]:
    """Problems with the question set: unknown documents, evidence missing from an answer document."""
    texts = {doc.id: doc.text for doc in corpus}
    problems = []
    for q in questions:
        for doc_id in q["documents"]:
            if doc_id not in texts:
                problems.append(f"{q['id']}: document {doc_id!r} is not in the corpus")
            elif not re.search(q["evidence"], texts[doc_id]):
                problems.append(f"{q['id']}: evidence {q['evidence']!r} not found in {doc_id!r}")
    return problems


def chunker_for(name: str, embedder: SentenceTransformerEmbedder):
    kind, size, overlap, *_ = CHUNKINGS[name]
    if kind == "words":
        return lambda text: word_windows(text, size, overlap)
    return embedder.make_chunker(size, overlap).split


def metrics(ranks: list[int | None]) -> dict:
    n = len(ranks)
    return {
        "recall@1": round(sum(r == 1 for r in ranks) / n, 4),
        "recall@5": round(sum(r is not None and r <= 5 for r in ranks) / n, 4),
        "mrr": round(sum(1 / r for r in ranks if r) / n, 4),
        "questions": n,
    }


async def evaluate(pipeline: RagPipeline, questions: list[dict], mode: str) -> dict:
    ranks, seconds = [], []
    for q in questions:
        start = time.perf_counter()
        hits = await pipeline.retrieve(TENANT, COLLECTION, q["question"], top_k=DEPTH, mode=mode)
        seconds.append(time.perf_counter() - start)
        ranks.append(rank_of(hits, set(q["documents"])))
    by_kind = {
        kind: metrics([r for r, q in zip(ranks, questions) if q["kind"] == kind])
        for kind in sorted({q["kind"] for q in questions})
    }
    missed = [q["id"] for r, q in zip(ranks, questions) if r is None or r > 5]
    return {
        **metrics(ranks),
        "query_p50_ms": round(statistics.median(seconds) * 1e3, 2),
        "by_kind": by_kind,
        "missed_top5": missed,
    }


def candidates_of(store: KnowledgeStore, embedder: SentenceTransformerEmbedder, questions: list[dict]) -> list:
    """Each question's dense and lexical candidates from the store, as hybrid retrieval fetches them."""
    depth = FusionSettings().candidates
    vectors = embedder.embed([embedder.query_prefix + q["question"] for q in questions])["vectors"]
    return [
        (store.search(TENANT, COLLECTION, v, depth), store.search_lexical(TENANT, COLLECTION, q["question"], depth))
        for v, q in zip(vectors, questions)
    ]


def compare_fusions(candidates: list, questions: list[dict]) -> dict:
    """Each fusion setting over the same dense and lexical candidates (rag.retrieval.search.fuse)."""
    return {
        name: metrics(
            [
                rank_of(fuse(dense, lexical, DEPTH, settings), set(q["documents"]))
                for (dense, lexical), q in zip(candidates, questions)
            ]
        )
        for name, settings in FUSIONS.items()
    }


async def best_similarities(pipeline: RagPipeline, questions: list[dict]) -> list[float]:
    """Each question's best cosine similarity with any chunk: what the no-answer threshold reads."""
    return [
        round((await pipeline.search(TENANT, COLLECTION, q["question"], top_k=1, mode="dense")).best_similarity, 4)
        for q in questions
    ]


def refusal_rates(
    answerable: list[dict], answerable_best: list[float], unanswerable: list[dict], unanswerable_best: list[float]
) -> list[dict]:
    """At each threshold: the share refused of the unanswerable questions (all and by kind) and of the
    answerable ones (all and by kind)."""

    def share(best: list[float], questions: list[dict], threshold: float, kind: str | None = None) -> float:
        picked = [b for b, q in zip(best, questions) if kind is None or q["kind"] == kind]
        return round(sum(b < threshold for b in picked) / len(picked), 4)

    return [
        {
            "min_score": t,
            "correct_refusals": share(unanswerable_best, unanswerable, t),
            **{
                f"correct_refusals_{k}": share(unanswerable_best, unanswerable, t, k)
                for k in ("off-topic", "near-miss")
            },
            "false_refusals": share(answerable_best, answerable, t),
            **{f"false_refusals_{k}": share(answerable_best, answerable, t, k) for k in ("exact", "paraphrase")},
        }
        for t in THRESHOLDS
    ]


async def measure_refusals(pipeline: RagPipeline, questions: list[dict], unanswerable: list[dict]) -> dict:
    answerable_best = await best_similarities(pipeline, questions)
    unanswerable_best = await best_similarities(pipeline, unanswerable)
    return {
        "rates": refusal_rates(questions, answerable_best, unanswerable, unanswerable_best),
        "answerable": dict(zip((q["id"] for q in questions), answerable_best)),
        "unanswerable": dict(zip((q["id"] for q in unanswerable), unanswerable_best)),
    }


def write_candidates(path: Path, candidates: list, questions: list[dict]) -> None:
    """Each question's dense and lexical candidates (chunk id, document id, score), so fusion settings can be
    compared later without another ingest (bench/rag_fusion_grid.py)."""

    def rows(hits):
        return [[c.chunk_id, c.document_id, round(float(c.score), 6)] for c in hits]

    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as out:
        for (dense, lexical), q in zip(candidates, questions):
            out.write(
                json.dumps(
                    {
                        "id": q["id"],
                        "kind": q["kind"],
                        "documents": q["documents"],
                        "dense": rows(dense),
                        "lexical": rows(lexical),
                    }
                )
                + "\n"
            )


async def run_chunking(
    name: str,
    embedder: SentenceTransformerEmbedder,
    corpus,
    questions,
    fusion: FusionSettings,
    workdir: Path,
    unanswerable: list[dict],
    pages=None,
    candidates_out: Path | None = None,
) -> dict:
    """One ingest with the named chunking, every mode measured on it; with `pages` (a page index) the
    title-boost comparison too; with unanswerable questions, the refusal rates; with `candidates_out`, each
    question's candidates written there."""
    store = KnowledgeStore(workdir / f"{name}.sqlite3", dim=embedder.dimension)
    local = LocalEmbedder(embedder, chunker_for(name, embedder))
    settings = PipelineSettings(max_top_k=DEPTH, embed_title=CHUNKINGS[name][3], embed_section=CHUNKINGS[name][4])
    pipeline = RagPipeline(local, LocalIndex(store, fusion), settings)
    start = time.perf_counter()
    counts = []
    for i in range(0, len(corpus), 16):  # 16 documents per ingest request
        counts += await pipeline.ingest(TENANT, COLLECTION, corpus[i : i + 16])
    ingest_s = time.perf_counter() - start
    await pipeline.retrieve(TENANT, COLLECTION, "warm up", top_k=DEPTH, mode="hybrid")
    candidates = candidates_of(store, embedder, questions)
    if candidates_out is not None:
        write_candidates(
            candidates_out.with_name(f"{candidates_out.name.split('.')[0]}-{name}.jsonl.gz"), candidates, questions
        )
    result = {
        "chunking": name,
        "chunks": sum(counts),
        "ingest_s": round(ingest_s, 1),
        "ingest_chunks_per_s": round(sum(counts) / ingest_s, 1),
        "embedded_tokens": local.tokens,
        "modes": {mode: await evaluate(pipeline, questions, mode) for mode in RETRIEVAL_MODES},
        "fusions": compare_fusions(candidates, questions),
    }
    if pages is not None:
        chunks = chunk_index(corpus, chunker_for(name, embedder))
        result["title_boosts"] = compare_title_boosts(
            pages,
            chunks,
            [dense for dense, _ in candidates],
            questions,
            DEPTH,
            FusionSettings().candidates,
            fusion,
            fuse,
            metrics,
        )
        chunks.close()
    if unanswerable:
        result["refusals"] = await measure_refusals(pipeline, questions, unanswerable)
    store.close()
    return result


def fusion_table(result: dict) -> str:
    lines = [f"| fusion ({result['chunking']}) | recall@1 | recall@5 | MRR |", "|---|---:|---:|---:|"]
    lines += [
        f"| {name} | {m['recall@1']:.3f} | {m['recall@5']:.3f} | {m['mrr']:.3f} |"
        for name, m in result["fusions"].items()
    ]
    return "\n".join(lines)


def title_boost_table(result: dict) -> str:
    kinds = sorted(next(iter(result["title_boosts"].values()))["recall@5_by_kind"])
    lines = [
        f"| title boost ({result['chunking']}) | recall@1 | recall@5 | MRR | "
        + " | ".join(f"{k} r@5" for k in kinds)
        + " |",
        "|---|---:|---:|---:|" + "---:|" * len(kinds),
    ]
    lines += [
        f"| {name} | {m['recall@1']:.3f} | {m['recall@5']:.3f} | {m['mrr']:.3f} | "
        + " | ".join(f"{m['recall@5_by_kind'][k]:.3f}" for k in kinds)
        + " |"
        for name, m in result["title_boosts"].items()
    ]
    return "\n".join(lines)


def refusal_table(result: dict) -> str:
    if "refusals" not in result:
        return "(no unanswerable questions: no refusal table)"
    lines = [
        f"| min_score ({result['chunking']}) | correct refusals (40 unanswerable) | off-topic | near-miss "
        f"| false refusals ({len(result['refusals']['answerable'])} answerable) | exact | paraphrase |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['min_score']:.2f} | {r['correct_refusals']:.3f} | {r['correct_refusals_off-topic']:.3f} "
        f"| {r['correct_refusals_near-miss']:.3f} | {r['false_refusals']:.3f} | {r['false_refusals_exact']:.3f} "
        f"| {r['false_refusals_paraphrase']:.3f} |"
        for r in result["refusals"]["rates"]
    ]
    return "\n".join(lines)


def table(results: list[dict], baselines: dict | None = None, documents: int = 0) -> str:
    """The modes per chunking; `baselines` (bm25-pages) as rows of their own: one entry per document."""
    lines = [
        "| chunking | chunks | ingest chunks/s | mode | recall@1 | recall@5 | MRR | exact r@5 | paraphrase r@5 "
        "| query p50 ms |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]

    def row(chunking, chunks, rate, mode, m):
        kinds = m["by_kind"]
        r5 = {k: f"{kinds[k]['recall@5']:.3f}" if k in kinds else "-" for k in ("exact", "paraphrase")}
        return (
            f"| {chunking} | {chunks} | {rate} | {mode} | {m['recall@1']:.3f} | {m['recall@5']:.3f} | {m['mrr']:.3f} "
            f"| {r5['exact']} | {r5['paraphrase']} | {m['query_p50_ms']} |"
        )

    for r in results:
        lines += [row(r["chunking"], r["chunks"], r["ingest_chunks_per_s"], mode, m) for mode, m in r["modes"].items()]
    lines += [row("whole pages", documents, "-", name, m) for name, m in (baselines or {}).items()]
    return "\n".join(lines)


def extra_tables(result: dict) -> str:
    return "\n\n".join(([title_boost_table(result)] if "title_boosts" in result else []) + [refusal_table(result)])


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--chunkings", default=DEFAULT_CHUNKING, help=f"comma-separated names of {', '.join(CHUNKINGS)}, or 'all'"
    )
    parser.add_argument("--torch-threads", type=int, default=2)
    parser.add_argument("--embedder", default=str(MODEL), help="a sentence-transformers folder to evaluate")
    parser.add_argument(
        "--query-prefix",
        default="",
        help="put in front of every question (the profile's "
        "embedder.query_prefix; bge-*-en-v1.5: 'Represent this sentence for searching relevant "
        "passages: ')",
    )
    parser.add_argument("--corpus", default=str(CORPUS), help="a jsonl.gz of documents (id, text, optional title)")
    parser.add_argument("--questions", default=str(QUESTIONS), help="the questions over --corpus")
    parser.add_argument(
        "--unanswerable",
        default=None,
        help="questions --corpus does not answer, for the refusal "
        f"table (default: {UNANSWERABLE.name} with the default corpus, none otherwise)",
    )
    parser.add_argument("--no-baselines", action="store_true", help="skip bm25-pages and the title-boost table")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "rag-quality.json"))
    parser.add_argument(
        "--candidates-out",
        default=None,
        help="also write each question's dense and lexical candidates, one file per chunking "
        "(PATH's stem + the chunking + .jsonl.gz), for bench/rag_fusion_grid.py",
    )
    parser.add_argument("--check-questions", action="store_true", help="only check the question set")
    parser.add_argument(
        "--documents", type=int, default=None, help="smoke test: the first N documents and the questions they answer"
    )
    parser.add_argument(
        "--first-document-only",
        action="store_true",
        help="count a hit only on each question's first (main) answer document, not on the others "
        "its list names (the Apache set's lists were completed by text matching)",
    )
    args = parser.parse_args()

    unanswerable_path = args.unanswerable or (UNANSWERABLE if Path(args.corpus).resolve() == CORPUS else None)
    corpus, questions = load_corpus(Path(args.corpus)), load_questions(Path(args.questions))
    unanswerable = load_unanswerable(Path(unanswerable_path)) if unanswerable_path else []
    problems = check_questions(corpus, questions)
    if problems or args.check_questions:
        print("\n".join(problems) or f"{len(questions)} questions, all answer documents contain their evidence")
        sys.exit(1 if problems else 0)
    if args.first_document_only:
        questions = [{**q, "documents": q["documents"][:1]} for q in questions]
    if args.documents:
        corpus = corpus[: args.documents]
        kept = {doc.id for doc in corpus}
        questions = [q for q in questions if set(q["documents"]) <= kept]

    import torch

    torch.set_num_threads(args.torch_threads)
    names = list(CHUNKINGS) if args.chunkings == "all" else args.chunkings.split(",")
    import sentence_transformers  # noqa: F401 - imported first, so the RSS delta is the model's alone

    rss_before = psutil.Process().memory_info().rss
    embedder = SentenceTransformerEmbedder(args.embedder, query_prefix=args.query_prefix)
    embedder_memory = {
        "weights_bytes": sum(f.stat().st_size for f in Path(args.embedder).rglob("*.safetensors")),
        "load_rss_delta_bytes": psutil.Process().memory_info().rss - rss_before,
    }
    fusion = FusionSettings()
    pages = None if args.no_baselines else page_index(corpus)
    baselines = {} if pages is None else {"bm25-pages": evaluate_pages(pages, questions, DEPTH, metrics)}
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            results.append(
                await run_chunking(
                    name,
                    embedder,
                    corpus,
                    questions,
                    fusion,
                    Path(tmp),
                    unanswerable,
                    pages,
                    Path(args.candidates_out) if args.candidates_out else None,
                )
            )
            print(
                table(results[-1:], baselines, len(corpus))
                + "\n\n"
                + fusion_table(results[-1])
                + "\n\n"
                + extra_tables(results[-1])
                + "\n",
                flush=True,
            )
    report = {
        "machine": {
            "python": platform.python_version(),
            "cpus": __import__("os").cpu_count(),
            "torch_threads": args.torch_threads,
        },
        "corpus": {
            "path": str(args.corpus),
            "questions_path": str(args.questions),
            "first_document_only": args.first_document_only,
            "documents": len(corpus),
            "characters": sum(len(d.text) for d in corpus),
        },
        "load_average": __import__("os").getloadavg(),
        "questions": {
            "total": len(questions),
            "exact": sum(q["kind"] == "exact" for q in questions),
            "paraphrase": sum(q["kind"] == "paraphrase" for q in questions),
            "unanswerable": len(unanswerable),
        },
        "embedder": {
            "path": args.embedder,
            "query_prefix": args.query_prefix,
            "dimension": embedder.dimension,
            "max_seq_length": embedder.max_seq_length,
            **embedder_memory,
        },
        "fusion": fusion.model_dump(),
        "depth": DEPTH,
        "baselines": baselines,
        "results": results,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(table(results, baselines, len(corpus)))
    for result in results:
        print("\n" + fusion_table(result) + "\n\n" + extra_tables(result))
    print(f"-> {args.out}")


if __name__ == "__main__":
    asyncio.run(main())
