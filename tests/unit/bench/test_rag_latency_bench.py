"""bench/rag_latency.py without a stack: arguments, corpus selection until N chunks, questions, the
stream parsing and the percentile summary."""

from __future__ import annotations

import gzip
import json

import pytest

from bench import rag_latency as bench
from bench.bench_rag_quality import DATA  # the corpora folder rag_latency reads
from bench.harness.results import BenchResult
from rag.retrieval.pipeline import DocumentInput


def _doc(i: int, chars: int) -> DocumentInput:
    return DocumentInput(id=f"d{i}", text="x" * chars)


def _corpus(tmp_path, name: str, ids: list[str], questions: list[dict]):
    path = tmp_path / f"{name}.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as out:
        out.writelines(json.dumps({"id": i, "title": i.upper(), "text": f"text of {i}"}) + "\n" for i in ids)
    (tmp_path / f"{name}-questions.json").write_text(json.dumps({"about": "t", "questions": questions}))
    return path


def test_default_arguments_keep_the_25_pydoc_documents_and_the_result_name():
    args = bench.parse_args([])
    assert (args.documents, args.corpus, args.target_chunks, args.name) == (25, None, None, "rag-latency")


def test_corpus_and_target_arguments_name_a_new_result():
    corpora = [str(DATA / f"{n}.jsonl.gz") for n in ("stdlib-pydoc", "sqlite-doc", "texlive-pdf")]
    args = bench.parse_args([a for c in corpora for a in ("--corpus", c)] + ["--target-chunks", "10000"])
    assert args.documents is None and len(args.corpus) == 3 and args.target_chunks == 10000
    assert args.name == "rag-latency-10k"
    assert bench.output_name(2500, None) == "rag-latency-2500"
    assert bench.output_name(None, [DATA / "sqlite-doc.jsonl.gz"]) == "rag-latency-sqlite-doc"
    assert bench.output_name(10000, None, "mine") == "mine"


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(SystemExit):
        bench.parse_args(["--target-chunks", "0"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--corpus", str(tmp_path / "missing.jsonl.gz")])


def test_questions_path_follows_the_corpus():
    assert bench.questions_path(DATA / "stdlib-pydoc.jsonl.gz") == DATA / "rag-questions.json"
    assert bench.questions_path(DATA / "texlive-pdf.jsonl.gz") == DATA / "texlive-pdf-questions.json"
    for name in ("stdlib-pydoc", "sqlite-doc", "texlive-pdf"):
        assert bench.questions_path(DATA / f"{name}.jsonl.gz").exists()


def test_load_corpora_prefixes_ids_only_with_several(tmp_path):
    q = [{"id": "q1", "question": "what is a?", "documents": ["a"]}]
    one = _corpus(tmp_path, "one", ["a", "b"], q)
    two = _corpus(tmp_path, "two", ["a"], [{"id": "q2", "question": "and a?", "documents": ["a"]}])
    alone = bench.load_corpora([one])
    assert [d.id for d in alone[0].documents] == ["a", "b"] and alone[0].questions[0]["documents"] == ["a"]
    both = bench.load_corpora([one, two])
    assert [d.id for c in both for d in c.documents] == ["one:a", "one:b", "two:a"]
    assert both[1].questions == [{"question": "and a?", "documents": ["two:a"]}]
    assert both[0].documents[0].metadata == {"title": "A"}  # bench_rag_quality's loader keeps the title


def test_ingest_until_stops_at_the_first_batch_reaching_the_target():
    docs = [_doc(i, 1000) for i in range(100)]  # 2 chunks each at 500 characters a chunk
    posted = []

    def post(batch):
        posted.append(len(batch))
        return 2 * len(batch)

    taken, chunks = bench.ingest_until(post, docs, 51)
    assert chunks >= 51 and chunks - 2 < 51  # the last document crossed it, not a whole batch
    assert taken == chunks // 2 and max(posted) <= bench.BATCH_DOCUMENTS


def test_ingest_until_without_a_target_takes_every_document_in_batches():
    posted = []
    taken, chunks = bench.ingest_until(
        lambda b: posted.append(len(b)) or len(b), [_doc(i, 10) for i in range(25)], None
    )
    assert (taken, chunks, posted) == (25, 25, [10, 10, 5])


def test_ingest_until_runs_out_of_documents_below_the_target():
    assert bench.ingest_until(lambda b: 3 * len(b), [_doc(i, 10) for i in range(4)], 1000) == (4, 12)


def test_next_batch_end_sizes_by_text_length():
    docs = [_doc(0, 100), _doc(1, 5000), _doc(2, 100)]
    assert bench.next_batch_end(docs, 0, None, 700) == 3
    assert bench.next_batch_end(docs, 0, 2, 700) == 2  # 1400 characters needed: the second document covers them
    assert bench.next_batch_end(docs, 2, 1, 700) == 3  # at least one document
    assert bench.next_batch_end(docs, 0, 100, 700, max_docs=2) == 2


def test_questions_interleave_and_answerable_ones_can_come_first():
    docs = [DocumentInput(id=i, text="t") for i in ("a1", "a2", "b1")]
    corpora = [
        bench.Corpus("a", docs[:2], [{"question": f"a{i}", "documents": [f"a{i}"]} for i in (1, 2, 3)]),
        bench.Corpus("b", docs[2:], [{"question": "b1", "documents": ["b1"]}]),
        bench.Corpus("c", [DocumentInput(id="c1", text="t")], [{"question": "c1", "documents": ["c1"]}]),
    ]
    questions = bench.ingested_questions(corpora, {"a1", "b1"})
    assert [q["question"] for q in questions] == ["a1", "b1", "a2", "a3"]  # c: nothing of it ingested
    assert [q["answerable"] for q in questions] == [True, True, False, False]
    first = bench.ingested_questions(corpora, {"a2", "b1"}, answerable_first=True)
    assert [q["question"] for q in first] == ["b1", "a2", "a1", "a3"]


def test_recall_counts_answerable_questions_only():
    questions = [
        {"documents": ["x"], "answerable": True},
        {"documents": ["y"], "answerable": True},
        {"documents": ["z"], "answerable": False},
    ]
    found = [["x", "q", "q", "q"], ["q", "y", "q", "q"], ["z"]]
    assert bench.recall(found, questions) == {"recall@1": 0.5, "recall@2": 1.0, "recall@4": 1.0, "recall_questions": 2}
    assert bench.recall([], [])["recall@1"] is None


def test_summary_ms_interpolates_percentiles():
    summary = bench.summary_ms([0.1, 0.2, 0.3, 0.4, 1.0])
    assert summary["requests"] == 5 and summary["p50"] == pytest.approx(300.0)
    assert summary["p95"] == pytest.approx(880.0)  # linear between 400 and 1000 ms
    assert bench.summary_ms([]) == {"requests": 0, "p50": None, "p95": None}


def test_stream_timing_of_a_rag_stream_and_of_a_chat_stream():
    cited = [{"document_id": "a", "chunk_id": "a:0", "score": 0.5, "text": "alpha"}]
    lines = [
        "data: " + json.dumps({"object": "rag.citations", "citations": cited, "refused": False}),
        "",
        "data: " + json.dumps({"object": "rag.delta", "delta": "Hi"}),
        "data: " + json.dumps({"object": "rag.usage", "usage": {"prompt_tokens": 321, "completion_tokens": 8}}),
        "data: [DONE]",
    ]
    events = bench.sse_events(lines)
    assert len(events) == 3
    timing = bench.stream_timing(list(zip([0.2, 0.5, 0.6], events)), 0.7)
    assert timing == {
        "first_token_s": 0.5,
        "citations_s": 0.2,
        "total_s": 0.7,
        "prompt_tokens": 321,
        "refused": False,
        "citations": cited,
    }
    chat = [
        {"choices": [{"delta": {"role": "assistant", "content": ""}}]},
        {"choices": [{"delta": {"content": "The"}}]},
        {"choices": [], "usage": {"prompt_tokens": 40}},
    ]
    timing = bench.stream_timing(list(zip([0.1, 0.3, 0.4], chat)), 0.4)
    assert (timing["first_token_s"], timing["citations_s"], timing["prompt_tokens"]) == (0.3, None, 40)


def test_replay_messages_are_the_rag_prompt_cut_to_k_passages():
    from rag.retrieval.prompt import RetrievedChunk, rag_messages

    cited = [{"document_id": d, "chunk_id": f"{d}:0", "score": 0.4, "text": f"passage {d}"} for d in "abc"]
    full = bench.replay_messages("why?", cited, 4)
    assert full == rag_messages(
        "why?", [RetrievedChunk(c["document_id"], c["chunk_id"], c["score"], c["text"]) for c in cited]
    )
    assert "[2] passage b" in bench.replay_messages("why?", cited, 2)[0]["content"]
    assert "passage b" not in bench.replay_messages("why?", cited, 1)[0]["content"]
    assert "no passages found" in bench.replay_messages("why?", cited, 0)[0]["content"]


def test_table_keeps_the_old_columns_for_old_results_and_adds_prompt_tokens():
    old = {
        "setting": "search",
        "documents": 25,
        "n": 555,
        "ingest_s": 33.0,
        "requests": 80,
        "p50": 33.9,
        "p95": 42.9,
        "refused": None,
    }
    result = BenchResult(name="rag-latency", commit="x", machine={}, date="d", command=[], rows=[old])
    assert bench.tables(result).splitlines()[0].endswith("| refused (no answer) |")
    new = {**old, "setting": "RAG query streamed: first token", "refused": 2, "prompt_tokens_p50": 812.0}
    table = bench.stack_table([old, new]).splitlines()
    assert (
        table[0].endswith("prompt tokens p50 |") and table[-1].endswith("| 2 | 812 |") and table[2].endswith("|  | |")
    )


def test_chat_omp_threads_is_a_chat_override_and_names_the_result():
    args = bench.parse_args(["--target-chunks", "1000", "--chat-omp-threads", "2"])
    assert args.chat_overrides == {"omp_threads": 2} and args.name == "rag-latency-1k-omp2"
    assert bench.parse_args([]).chat_overrides is None


def test_rows_and_breakdown_of_a_measurement():
    cited = [{"document_id": "a", "chunk_id": "a:0", "score": 0.5, "text": "alpha"}]
    stream = {
        "first_token_s": 1.0,
        "citations_s": 1.0,
        "total_s": 1.5,
        "prompt_tokens": 700,
        "refused": False,
        "citations": cited,
        "question": "q",
    }
    replay = {"first_token_s": 0.9, "citations_s": None, "total_s": 1.2, "prompt_tokens": 700}
    m = {
        "search_s": [0.05] * 4,
        "embed_s": [0.03] * 4,
        "rag_s": [1.4, 1.6],
        "answers": [{"refused": False, "usage": {"prompt_tokens": 690}}, {"refused": True, "usage": {}}],
        "streams": [stream, {**stream, "refused": True}],
        "answered": [stream],
        "replays": {k: [{**replay, "prompt_tokens": 100 + 150 * k}] for k in bench.REPLAY_PASSAGES},
        "recall": {"recall@1": 1.0, "recall_questions": 4},
    }
    common = {"n": 10000, "documents": 3, "ingest_s": 600.0}
    rows = {r["setting"]: r for r in bench.rows_of(m, common)}
    rag = rows[f"RAG query (POST /v1/rag/query, max_tokens {bench.RAG_MAX_TOKENS})"]
    assert (rag["refused"], rag["prompt_tokens_p50"], rag["p50"]) == (1, 690, pytest.approx(1500.0))
    first = rows["RAG query streamed: first token"]
    assert (first["requests"], first["refused"], first["p50"], first["prompt_tokens_p50"]) == (1, 1, 1000.0, 700)
    assert (
        rows["prompt replay, 0 passages (POST /v1/chat/completions, cold cache): first token"]["prompt_tokens_p50"]
        == 100
    )
    assert rows["search (GET /v1/collections/{c}/search)"]["recall@1"] == 1.0
    parts = bench.breakdown(m)
    assert parts["first_token_minus_replay_p50_ms"] == pytest.approx(100.0)
    assert (parts["search_p50_ms"], parts["prefill_replay_p50_ms"]) == (pytest.approx(50.0), pytest.approx(900.0))
    assert "prompt tokens p50" in bench.stack_table(list(rows.values())).splitlines()[0]


def test_budgeted_streams_become_rows_with_the_share_of_answers_in_the_prompt():
    from bench import rag_latency as rl

    def stream(docs, cited, refused=False, tokens=300):
        return {
            "first_token_s": 0.5,
            "citations_s": 0.1,
            "total_s": 0.9,
            "prompt_tokens": tokens,
            "refused": refused,
            "citations": [{"document_id": d} for d in cited],
            "answer_documents": docs,
            "question": "q",
        }

    streams = [stream(["a"], ["a", "b"]), stream(["c"], ["b"]), stream(None, ["x"]), stream(["a"], [], refused=True)]
    assert rl.in_prompt_recall(streams) == {"in_prompt_recall": 0.5, "in_prompt_questions": 2}
    m = {
        "answers": [],
        "answered": streams[:2],
        "streams": streams,
        "search_s": [0.1],
        "embed_s": [0.05],
        "rag_s": [1.0],
        "recall": {},
        "replays": {},
        "budgeted": {300: streams},
    }
    rows = rl.rows_of(m, {"n": 10, "real": 10, "kind": "stack", "documents": 1, "ingest_s": 1.0, "start_s": 1.0})
    [budget_row] = [r for r in rows if "context_tokens 300" in r["setting"]]
    assert budget_row["refused"] == 1 and budget_row["requests"] == 3 and budget_row["in_prompt_recall"] == 0.5
    assert "answer in prompt" in rl.stack_table(rows) and "| 0.500 |" in rl.stack_table(rows)
    assert rl.parse_args(["--context-tokens", "300", "--context-tokens", "450"]).context_tokens == [300, 450]
