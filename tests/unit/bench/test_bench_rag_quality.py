"""bench/bench_rag_quality.py on a tiny corpus of its own: --corpus/--questions/--out, the bm25-pages
baseline and the title-boost table, through the real embedder (models/all-MiniLM-L6-v2) and store."""

from __future__ import annotations

import asyncio
import gzip
import json
import sys
from pathlib import Path

import pytest

from bench import bench_rag_quality as bench
from bench.rag_baselines import page_index

MODEL = Path(__file__).resolve().parents[3] / "models" / "all-MiniLM-L6-v2"
DOCUMENTS = [
    {
        "id": "kettle",
        "title": "Electric kettles",
        "text": "Electric kettles\n\nA kettle boils water for tea. The thermostat switches the heating element off "
        "when the water reaches boiling point. Descale it with vinegar when limescale builds up.",
    },
    {
        "id": "bicycle",
        "title": "Bicycle maintenance",
        "text": "Bicycle maintenance\n\nOil the chain every few hundred kilometres. A derailleur moves the chain "
        "between sprockets; adjust its cable tension when gears skip. Check tyre pressure weekly.",
    },
    {
        "id": "sourdough",
        "title": "Sourdough bread",
        "text": "Sourdough bread\n\nA starter of flour and water ferments with wild yeast. Feed the starter daily, "
        "let the dough rise overnight and bake it in a hot Dutch oven.",
    },
]
QUESTIONS = [
    {
        "id": "t1",
        "kind": "exact",
        "question": "What does a derailleur do?",
        "documents": ["bicycle"],
        "evidence": "derailleur",
    },
    {
        "id": "t2",
        "kind": "paraphrase",
        "question": "How do I get rid of mineral crust inside the thing I heat water in?",
        "documents": ["kettle"],
        "evidence": "limescale",
    },
    {
        "id": "t3",
        "kind": "paraphrase",
        "question": "How often should the fermented flour culture be fed?",
        "documents": ["sourdough"],
        "evidence": "[Ff]eed the starter",
    },
]


@pytest.fixture()
def tiny(tmp_path):
    corpus = tmp_path / "tiny.jsonl.gz"
    with gzip.open(corpus, "wt", encoding="utf-8") as out:
        out.writelines(json.dumps(d) + "\n" for d in DOCUMENTS)
    questions = tmp_path / "tiny-questions.json"
    questions.write_text(json.dumps({"about": "test", "questions": QUESTIONS}))
    return corpus, questions


def test_load_corpus_keeps_titles_and_check_questions_reads_evidence(tiny):
    corpus = bench.load_corpus(tiny[0])
    assert [d.metadata["title"] for d in corpus] == [d["title"] for d in DOCUMENTS]
    assert bench.check_questions(corpus, bench.load_questions(tiny[1])) == []
    bad = [{**QUESTIONS[0], "evidence": "carburettor"}, {**QUESTIONS[1], "documents": ["toaster"]}]
    assert len(bench.check_questions(corpus, bad)) == 2


def test_bm25_pages_ranks_whole_documents_and_the_title_field_counts():
    pages = page_index(
        [bench.DocumentInput(id=d["id"], text=d["text"], metadata={"title": d["title"]}) for d in DOCUMENTS]
    )
    assert [h.document_id for h in pages.search("derailleur gears", 10)] == ["bicycle"]
    assert pages.search("the of", 10) == [] or all(h.document_id for h in pages.search("the of", 10))
    assert pages.search("kettles", 10, title_weight=5.0)[0].document_id == "kettle"
    m = bench.evaluate_pages(pages, QUESTIONS, bench.DEPTH, bench.metrics)
    assert (
        m["questions"] == 3
        and set(m["by_kind"]) == {"exact", "paraphrase"}
        and m["by_kind"]["exact"]["recall@1"] == 1.0
    )
    pages.close()


@pytest.mark.skipif(not MODEL.exists(), reason="needs models/all-MiniLM-L6-v2")
def test_main_on_another_corpus_writes_every_mode_bm25_pages_and_title_boosts(tiny, tmp_path, monkeypatch, capsys):
    out = tmp_path / "result.json"
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "bench_rag_quality.py",
            "--corpus",
            str(tiny[0]),
            "--questions",
            str(tiny[1]),
            "--out",
            str(out),
            "--torch-threads",
            "1",
        ],
    )
    asyncio.run(bench.main())
    report = json.loads(out.read_text())
    assert report["corpus"]["documents"] == 3 and report["questions"]["unanswerable"] == 0
    result = report["results"][0]
    assert result["chunking"] == bench.DEFAULT_CHUNKING and "refusals" not in result
    assert set(result["modes"]) == {"dense", "lexical", "hybrid"}
    assert result["modes"]["hybrid"]["recall@5"] == 1.0  # three documents: every answer is in the top 5
    assert report["baselines"]["bm25-pages"]["questions"] == 3
    assert {"lexical, no title", "hybrid, title x2", "bm25-pages, title x5"} <= set(result["title_boosts"])
    printed = capsys.readouterr().out
    assert "| whole pages | 3 | - | bm25-pages |" in printed and "title boost" in printed
