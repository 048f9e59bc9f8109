"""Fusion settings compared on saved candidates, without another ingest.

`bench/bench_rag_quality.py --candidates-out PATH` writes each question's 50 dense and 50 lexical
candidates (chunk id, document id, score) as the store returned them. This reads one such file per
corpus and ranks every question again through the stack's own fusion (rag.retrieval.search.fuse) under each
setting of a grid, so an embedder's fusion weights can be chosen on some corpora and checked on others
from the same candidates.

    .venv/bin/python bench/rag_fusion_grid.py tuning=sqlite:/tmp/cand-sqlite.jsonl.gz,pydoc:/tmp/cand-pydoc.jsonl.gz \
        held-out=git:/tmp/cand-git.jsonl.gz --out bench/results/rag-fusion-grid-minilm.json

Each argument is GROUP=NAME:PATH[,NAME:PATH...]; the table gives recall@1 / recall@5 / MRR per corpus
and the questions found at rank 1 and within rank 5 summed over each group.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rag.retrieval.prompt import RetrievedChunk  # noqa: E402
from rag.retrieval.search import FusionSettings, fuse  # noqa: E402

DEPTH = 10  # as bench_rag_quality: a question's rank is that of its first answer among the top 10


def grid() -> dict[str, FusionSettings]:
    """Weighted fusion from dense-only to even, with and without document support, and RRF."""
    settings = {
        "dense only": FusionSettings(method="weighted", dense_weight=1.0, lexical_weight=0.0, document_support=0.0)
    }
    for dense in (0.8, 0.7, 0.6, 0.5, 0.4):
        for support in (0.0, 0.1, 0.2):
            settings[f"weighted {dense:g}/{1 - dense:g}, support {support:g}"] = FusionSettings(
                method="weighted", dense_weight=dense, lexical_weight=round(1 - dense, 2), document_support=support
            )
    for k in (20.0, 60.0):
        for dense, lexical in ((1.0, 1.0), (1.0, 0.5)):
            settings[f"rrf k={k:g} {dense:g}/{lexical:g}"] = FusionSettings(
                method="rrf", rrf_k=k, dense_weight=dense, lexical_weight=lexical, document_support=0.0
            )
    # Each row names every setting it measures, so a changed default cannot relabel it.
    return {label: s.model_copy(update={"chunks_per_document": 0}) for label, s in settings.items()}


def load(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        return [json.loads(line) for line in lines]


def chunks(rows: list) -> list[RetrievedChunk]:
    return [RetrievedChunk(document_id=doc, chunk_id=chunk, score=score, text="") for chunk, doc, score in rows]


def rank(question: dict, settings: FusionSettings, per_document: int | None = None) -> int | None:
    if per_document:
        settings = settings.model_copy(update={"chunks_per_document": per_document})
    hits = fuse(chunks(question["dense"]), chunks(question["lexical"]), DEPTH, settings)
    answers = set(question["documents"])
    return next((i for i, hit in enumerate(hits, start=1) if hit.document_id in answers), None)


def scores(questions: list[dict], settings: FusionSettings, per_document: int | None = None) -> dict:
    ranks = [rank(q, settings, per_document) for q in questions]
    return {
        "at1": sum(r == 1 for r in ranks),
        "at5": sum(r is not None and r <= 5 for r in ranks),
        "mrr": round(sum(1 / r for r in ranks if r) / len(ranks), 4),
        "questions": len(ranks),
        "missed_top5": [q["id"] for q, r in zip(questions, ranks) if r is None or r > 5],
    }


def parse_group(text: str) -> tuple[str, dict[str, Path]]:
    group, _, corpora = text.partition("=")
    return group, {name: Path(path) for name, _, path in (item.partition(":") for item in corpora.split(","))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("groups", nargs="+", help="GROUP=NAME:PATH[,NAME:PATH...]")
    parser.add_argument(
        "--per-document",
        type=int,
        nargs="*",
        default=[],
        help="also rank each setting with rag.fusion.chunks_per_document N",
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    groups = dict(parse_group(g) for g in args.groups)
    corpora = {name: load(path) for members in groups.values() for name, path in members.items()}
    results = {
        f"{label}{f', {most} per document' if most else ''}": {
            name: scores(qs, settings, most) for name, qs in corpora.items()
        }
        for label, settings in grid().items()
        for most in (None, *args.per_document)
    }
    names = list(corpora)
    header = (
        "| fusion | "
        + " | ".join(f"{n} ({len(corpora[n])})" for n in names)
        + " | "
        + " | ".join(f"{g}: @1 / @5 of {sum(len(corpora[n]) for n in m)}" for g, m in groups.items())
        + " |"
    )
    print(header + "\n|---|" + "---|" * (len(names) + len(groups)))
    for label, by_corpus in results.items():
        cells = [
            f"{m['at1'] / m['questions']:.3f} / {m['at5'] / m['questions']:.3f} / {m['mrr']:.3f}"
            for m in by_corpus.values()
        ]
        sums = [
            f"{sum(by_corpus[n]['at1'] for n in m)} / {sum(by_corpus[n]['at5'] for n in m)}" for m in groups.values()
        ]
        print(f"| {label} | " + " | ".join(cells + sums) + " |")
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {"groups": {g: {n: str(p) for n, p in m.items()} for g, m in groups.items()}, "results": results},
                indent=1,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
