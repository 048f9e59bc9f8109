"""Real documents into a running stack for a soak, with /status's measured and planned bytes per replica.

`poolserve stress --layers 3` sends small generated documents; this adds what real use ingests (issue 46: the
embedder's heap grew with the variety of what it read): pages of the outside corpora that
bench/make_outside_corpora.py built from Debian's documentation packages (bench/data/*.jsonl.gz), whole,
a few per request, in a seeded order, one request every --interval-s, into one collection it deletes at the
end. After each request it reads /status and writes one JSON line: the time, the documents and chunks so far,
and each replica's measured (PSS), anonymous and file bytes beside its planned bytes (its budget).

    POOLSERVE_ADMIN_KEY=... POOLSERVE_API_KEY=... .venv/bin/python bench/soak_documents.py \
        --base-url http://127.0.0.1:PORT --seconds 3600 --out bench/results/soak-documents-DATE.jsonl
    .venv/bin/python bench/soak_documents.py --summarize bench/results/soak-documents-DATE.jsonl
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
CORPORA = ("sqlite-doc", "apache-doc", "git-doc", "rsyslog-doc", "stdlib-pydoc", "texlive-pdf")
MIB = 2**20


def load_pages(seed: int) -> list[dict]:
    pages = []
    for corpus in CORPORA:
        with gzip.open(ROOT / "bench" / "data" / f"{corpus}.jsonl.gz", "rt") as lines:
            for line in lines:
                doc = json.loads(line)
                pages.append(
                    {
                        "id": f"{corpus}.{doc['id'].replace('/', '_')}",
                        "text": doc["text"],
                        "metadata": {"title": doc.get("title") or doc["id"]},
                    }
                )
    random.Random(seed).shuffle(pages)
    return pages


def replicas_of(status: dict) -> dict:
    return {
        r["name"]: {
            "measured_mib": round(r["measured_bytes"] / MIB, 1),
            "anon_mib": round(r.get("anon_bytes", 0) / MIB, 1),
            "file_mib": round(r.get("file_bytes", 0) / MIB, 1),
            "planned_mib": round(r["planned_bytes"] / MIB, 1),
        }
        for r in status["replicas"]
        if "measured_bytes" in r
    }


def run(args) -> None:
    api = {"Authorization": f"Bearer {os.environ['POOLSERVE_API_KEY']}"}
    admin = {"Authorization": f"Bearer {os.environ['POOLSERVE_ADMIN_KEY']}"}
    pages = load_pages(args.seed)
    collection = args.collection
    start, done, chunks, failed, n = time.time(), 0, 0, 0, 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with httpx.Client(base_url=args.base_url, timeout=900) as http, args.out.open("a") as out:
        try:
            while time.time() - start < args.seconds:
                began = time.time()
                batch = [pages[(n + i) % len(pages)] for i in range(args.per_request)]
                n += args.per_request
                # each pass over the corpora is a new set of ids, so every request adds documents
                docs = [{**page, "id": f"{page['id']}.{n // len(pages)}"} for page in batch]
                response = http.post(f"/v1/collections/{collection}/documents", headers=api, json={"documents": docs})
                if response.status_code == 200:
                    done += len(docs)
                    chunks += sum(d.get("chunks", 0) for d in response.json().get("documents", []))
                else:
                    failed += 1
                status = http.get("/status", headers=admin, timeout=120).json()
                point = {
                    "t": round(time.time() - start, 1),
                    "ingest_s": round(time.time() - began, 1),
                    "http": response.status_code,
                    "documents": done,
                    "chunks": chunks,
                    "failed": failed,
                    "replicas": replicas_of(status),
                }
                out.write(json.dumps(point) + "\n")
                out.flush()
                emb = point["replicas"].get("embedder", {})
                print(
                    f"{point['t']:>7.0f}s {done} docs {chunks} chunks; embedder {emb.get('measured_mib')} / "
                    f"{emb.get('planned_mib')} MiB",
                    flush=True,
                )
                time.sleep(max(0.0, args.interval_s - (time.time() - began)))
        finally:
            if not args.keep:
                http.delete(f"/v1/collections/{collection}", headers=api)


def summarize(path: Path) -> None:
    points = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not points:
        sys.exit(f"{path}: no points")
    names = sorted({name for p in points for name in p["replicas"]})
    last = points[-1]
    print(
        f"{len(points)} points over {last['t']:.0f} s; {last['documents']} documents, {last['chunks']} chunks, "
        f"{last['failed']} failed requests"
    )
    print("| replica | budget MiB | measured first | measured max | measured last | max / budget |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in names:
        series = [p["replicas"][name] for p in points if name in p["replicas"]]
        top = max(s["measured_mib"] for s in series)
        print(
            f"| {name} | {series[-1]['planned_mib']:,.1f} | {series[0]['measured_mib']:,.1f} | {top:,.1f} | "
            f"{series[-1]['measured_mib']:,.1f} | {top / series[-1]['planned_mib']:.3f} |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url")
    ap.add_argument("--seconds", type=float, default=3600)
    ap.add_argument("--interval-s", type=float, default=30)
    ap.add_argument("--per-request", type=int, default=4)
    ap.add_argument("--collection", default="soak-documents")
    ap.add_argument("--seed", type=int, default=46)
    ap.add_argument("--keep", action="store_true", help="leave the collection in place")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--summarize", type=Path)
    args = ap.parse_args()
    if args.summarize:
        summarize(args.summarize)
    elif args.base_url and args.out:
        run(args)
    else:
        ap.error("--base-url and --out, or --summarize")


if __name__ == "__main__":
    main()
