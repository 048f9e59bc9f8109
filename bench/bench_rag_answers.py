"""How long RAG answers run, and whether they end mid-sentence, through a real poolserve stack (issue 46).

    .venv/bin/python bench/bench_rag_answers.py --max-tokens 256,160,128,96 --rag trim_capped_answers=false \
        --name rag-answer-length-untrimmed
    .venv/bin/python bench/bench_rag_answers.py --max-tokens default,256 --stream --name rag-answer-length

Under /tmp/poolserve-stack.lock (one helper stack on the machine at a time): a private stack from the
profile (the embedded default, configs/cpu-tiny.yaml; --rag KEY=VALUE overrides its `rag` section), the
main answer page of each of the first --questions questions of the Git manual (bench/data/git-doc*: man
pages of the commands and concept pages, held out from every tuning) ingested into one collection, then
each question through POST /v1/rag/query, one at a time, once per --max-tokens budget ("default": no
max_tokens, so rag.answer_max_tokens), the budgets in turn for each question. Per answer: seconds to the
whole response, completion tokens, finish_reason, characters, and whether it ends at a sentence end
(rag/retrieval/answer_trim.py's definition).
--stream adds one streamed pass at the first budget: time to the first answer delta, and whether the
streamed text equals the non-streamed answer (greedy decoding, so it should).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when run as a script

import yaml  # noqa: E402

from bench.harness.engine import DEFAULT_PROFILE  # noqa: E402
from bench.harness.results import RESULTS_DIR, new_result, write_result  # noqa: E402
from bench.harness.timing import percentile  # noqa: E402
from bench.rag_latency import LOCK, _take_lock  # noqa: E402
from rag.retrieval.answer_trim import last_sentence_end  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
CORPUS = DATA / "git-doc.jsonl.gz"
QUESTIONS = DATA / "git-doc-questions.json"
COLLECTION = "manual"
# Pages that fill the collection to --collection-chunks beside the answer pages: the rest of the Git manual,
# then the other outside corpora (bench/make_outside_corpora.py), in file order.
FILLER_CORPORA = ("git-doc", "sqlite-doc", "apache-doc", "rsyslog-doc", "stdlib-pydoc", "texlive-pdf")
BATCH_DOCUMENTS = 5
REQUEST_TIMEOUT_S = 300


def ends_at_sentence(text: str) -> bool:
    stripped = text.rstrip()
    return bool(stripped) and last_sentence_end(stripped) == len(stripped)


def load(questions: int) -> tuple[list[dict], list[dict]]:
    """The first `questions` questions and the main answer page of each (corpus order, no repeats)."""
    asked = json.loads(QUESTIONS.read_text())["questions"][:questions]
    wanted = {q["documents"][0] for q in asked}
    with gzip.open(CORPUS, "rt") as f:
        pages = [page for page in map(json.loads, f) if page["id"] in wanted]
    return asked, pages


def filler_pages(skip: set[str]):
    """Every page of FILLER_CORPORA but `skip`, one at a time."""
    for corpus in FILLER_CORPORA:
        with gzip.open(DATA / f"{corpus}.jsonl.gz", "rt") as f:
            for page in map(json.loads, f):
                if page["id"] not in skip:
                    yield {**page, "id": f"{corpus}--{page['id']}"}


def ingest(http, pages) -> None:
    for i in range(0, len(pages), BATCH_DOCUMENTS):
        batch = [{"id": p["id"].replace("/", "--"), "text": p["text"]} for p in pages[i : i + BATCH_DOCUMENTS]]
        response = http.post(f"/v1/collections/{COLLECTION}/documents", json={"documents": batch})
        if response.status_code != 200:
            raise RuntimeError(f"ingest: {response.status_code} {response.text[:300]}")


def fill_to(http, chunks: int, skip: set[str]) -> int:
    """Ingests filler pages until the collection holds at least `chunks` chunks; returns the count reached."""
    count = http.get(f"/v1/collections/{COLLECTION}").json()["chunk_count"]
    pages = filler_pages(skip)
    while count < chunks:
        batch = [page for page, _ in zip(pages, range(BATCH_DOCUMENTS * 4))]
        if not batch:
            break  # every corpus ingested
        ingest(http, batch)
        count = http.get(f"/v1/collections/{COLLECTION}").json()["chunk_count"]
    return count


def profile_with(base: Path, rag: dict, workdir: Path) -> Path:
    """`base` with `rag` merged into its rag section (a profile that extends it)."""
    if not rag:
        return base
    path = workdir / "bench-profile.yaml"
    path.write_text(yaml.safe_dump({"extends": str(Path(base).resolve()), "rag": rag}))
    return path


def ask(http, question: str, budget: int | None) -> dict:
    body = {"collection": COLLECTION, "question": question}
    if budget is not None:
        body["max_tokens"] = budget
    started = time.perf_counter()
    response = http.post("/v1/rag/query", json=body)
    seconds = time.perf_counter() - started
    response.raise_for_status()
    data = response.json()
    answer = data.get("answer") or ""
    return {
        "seconds": seconds,
        "completion_tokens": (data.get("usage") or {}).get("completion_tokens"),
        "finish_reason": data.get("finish_reason"),
        "refused": data.get("refused"),
        "chars": len(answer),
        "ends_at_sentence": ends_at_sentence(answer),
        "answer": answer,
    }


def ask_streamed(http, question: str, budget: int | None) -> dict:
    body = {"collection": COLLECTION, "question": question, "stream": True}
    if budget is not None:
        body["max_tokens"] = budget
    started, first, text, finish, done = time.perf_counter(), None, "", None, False
    with http.stream("POST", "/v1/rag/query", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            payload = line[len("data: ") :]
            if payload == "[DONE]":
                done = True
                continue
            event = json.loads(payload)
            if event.get("object") == "rag.delta":
                first = first if first is not None else time.perf_counter() - started
                text += event["delta"]
            elif event.get("object") == "rag.finish":
                finish = event.get("finish_reason")
    return {
        "seconds": time.perf_counter() - started,
        "first_delta_s": first,
        "finish_reason": finish,
        "done": done,
        "answer": text,
        "ends_at_sentence": ends_at_sentence(text),
    }


def summary(rows: list[dict], budget) -> dict:
    seconds = [r["seconds"] for r in rows]
    answered = [r for r in rows if not r.get("refused")]
    capped = [
        r
        for r in answered
        if r["finish_reason"] == "length"
        or (r["finish_reason"] is None and isinstance(budget, int) and r["completion_tokens"] == budget)
    ]
    return {
        "budget": budget,
        "questions": len(rows),
        "refused": len(rows) - len(answered),
        "capped": len(capped),
        "mid_sentence": sum(not r["ends_at_sentence"] for r in answered),
        "p50_s": round(percentile(seconds, 50), 2),
        "p95_s": round(percentile(seconds, 95), 2),
        "max_s": round(max(seconds), 2),
        "completion_tokens_mean": round(sum(r["completion_tokens"] or 0 for r in answered) / max(1, len(answered)), 1),
        "answer_chars_p50": percentile([r["chars"] for r in answered], 50) if answered else None,
    }


def run(args) -> dict:
    import httpx

    from bench.harness.stack import poolserve_stack

    asked, pages = load(args.questions)
    budgets = [None if b == "default" else int(b) for b in args.max_tokens.split(",")]
    rag = {k: yaml.safe_load(v) for k, v in (item.split("=", 1) for item in args.rag)}
    out = {"budgets": {}, "rows": []}
    with open(LOCK, "a") as lock, tempfile.TemporaryDirectory(prefix="bench-rag-answers-") as tmp:
        print(f"[stack] lock taken after {_take_lock(lock):.0f} s", flush=True)
        profile = profile_with(Path(args.profile), rag, Path(tmp))
        with poolserve_stack(profile, Path(tmp), timeout_s=args.start_timeout) as server:
            out["start_s"] = server.start_s
            headers = {"Authorization": f"Bearer {server.api_key}"}
            with httpx.Client(base_url=server.base_url, headers=headers, timeout=REQUEST_TIMEOUT_S) as http:
                started = time.monotonic()
                ingest(http, pages)
                out["collection_chunks"] = fill_to(http, args.collection_chunks, {p["id"] for p in pages})
                out["ingest_s"] = round(time.monotonic() - started, 1)
                print(
                    f"[stack] ingested {len(pages)} pages and filled to {out['collection_chunks']} chunks in "
                    f"{out['ingest_s']} s",
                    flush=True,
                )
                ask(http, "What does git status show?", 8)  # warm-up, untimed
                out["load_average_before"] = list(os.getloadavg())
                # Each question at every budget in turn, so a change of the machine's load falls on all of them.
                labels = ["default" if budget is None else budget for budget in budgets]
                for q in asked:
                    for budget, label in zip(budgets, labels):
                        row = {"id": q["id"], "budget": label, **ask(http, q["question"], budget)}
                        out["rows"].append(row)
                        print(
                            f"[{label}] {q['id']} {row['seconds']:.1f}s {row['completion_tokens']} tok "
                            f"{row['finish_reason']} sentence-end={row['ends_at_sentence']}",
                            flush=True,
                        )
                for budget, label in zip(budgets, labels):
                    out["budgets"][str(label)] = summary([r for r in out["rows"] if r["budget"] == label], budget)
                if args.stream:
                    streamed = []
                    plain = {
                        r["id"]: r["answer"]
                        for r in out["rows"]
                        if r["budget"] == ("default" if budgets[0] is None else budgets[0])
                    }
                    for q in asked:
                        row = {"id": q["id"], **ask_streamed(http, q["question"], budgets[0])}
                        row["same_as_non_streamed"] = row["answer"] == plain.get(q["id"])
                        streamed.append(row)
                        print(
                            f"[stream] {q['id']} first {row['first_delta_s']}s {row['finish_reason']} "
                            f"same={row['same_as_non_streamed']}",
                            flush=True,
                        )
                    firsts = [r["first_delta_s"] for r in streamed if r["first_delta_s"] is not None]
                    out["stream"] = {
                        "questions": len(streamed),
                        "first_delta_p50_s": round(percentile(firsts, 50), 2),
                        "total_p50_s": round(percentile([r["seconds"] for r in streamed], 50), 2),
                        "same_as_non_streamed": sum(r["same_as_non_streamed"] for r in streamed),
                        "mid_sentence": sum(not r["ends_at_sentence"] for r in streamed),
                        "finish_reasons": sorted({str(r["finish_reason"]) for r in streamed}),
                        "all_done": all(r["done"] for r in streamed),
                    }
                    out["stream_rows"] = streamed
                out["load_average_after"] = list(os.getloadavg())
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default=str(DEFAULT_PROFILE))
    parser.add_argument("--questions", type=int, default=20)
    parser.add_argument("--max-tokens", default="default", help="budgets, comma-separated; 'default' sends none")
    parser.add_argument("--rag", action="append", default=[], help="KEY=VALUE for the profile's rag section")
    parser.add_argument(
        "--collection-chunks",
        type=int,
        default=0,
        help="fill the collection with other outside-corpora pages to at least this many chunks",
    )
    parser.add_argument("--stream", action="store_true", help="a streamed pass at the first budget too")
    parser.add_argument("--name", default="rag-answer-length")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR, help="where the result goes")
    parser.add_argument("--start-timeout", type=float, default=400, help="seconds the stack may take to be healthy")
    args = parser.parse_args(argv)
    out = run(args)
    config = {
        "profile": args.profile,
        "questions": args.questions,
        "corpus": str(CORPUS.name),
        "max_tokens": args.max_tokens,
        "rag": args.rag,
        "stream": args.stream,
        "collection_chunks": args.collection_chunks,
    }
    metrics = {k: v for k, v in out.items() if k not in ("rows", "stream_rows")}
    result = new_result(args.name, config, metrics, out["rows"] + [{"stream": r} for r in out.get("stream_rows", [])])
    path = write_result(result, args.out_dir)
    print(json.dumps(metrics, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
