"""Paraphrase recall (issue 24, item 3): query rewriting and a reranker by the stack's chat model.

Measures, on one ingest of a corpus (bench/bench_rag_quality.py's load_corpus / chunker_for /
RagPipeline ingest, default chunking tokens-200-30, titles embedded) and its questions, what the
chat model of configs/cpu-tiny.yaml (SmolLM2-135M-Instruct) adds to the default hybrid retrieval
(dense + lexical, rag.retrieval.search.fuse with the default FusionSettings, top 10):

- baseline: the question, as bench_rag_quality's hybrid mode retrieves it.
- hyde: the model writes a short passage (<= 64 tokens, greedy) answering the question; retrieved
  with the passage alone (dense and lexical), with question + passage (both), and with the
  passage's vector for dense but the question for lexical.
- keywords: the model lists a few search keywords/synonyms (<= 32 tokens), appended to the question.
- rerank: the fused top --rerank-depth (10) chunks, one prompt per chunk ("Does the passage answer
  the question? Answer yes or no"), one token generated with logprobs=20; score = log P(yes) -
  log P(no) (variants of case and a leading space summed; a word not among the 20 gets the 20th's
  logprob). Reported as the model's order alone and fused with the retrieval rank (RRF, k=60).

The chat model runs in vLLM's offline API (vllm.LLM) with the engine arguments the planner gives
the profile's chat engine (planner.plan.build_plan: dtype, max_model_len, max_num_seqs,
max_num_batched_tokens, kv_cache_memory_bytes, prefix caching, eager, ngram speculation) and its
environment (OMP threads), prompts through the model's chat template, greedy decoding. Each
variant's prompts go through one batched `generate` (the outputs scored; batch throughput from
its wall time), then the first --latency-questions questions one at a time, one `generate` per
question (all of its rerank prompts together): the added latency per question (p50, p90 ms), as
one stream would see it (the prefix cache emptied before each, so nothing of the batch is reused;
within a question, its rerank prompts share the chat template's prefix). Retrieval (ms) is not in
those figures.

Metrics as bench_rag_quality (rank_of, metrics): a question's rank is the first retrieved chunk of
one of its documents; recall@1, recall@5, MRR over the top 10, recall@5 by question kind.

    flock /tmp/poolserve-heavy.lock nice -n 5 timeout 1500 .venv/bin/python bench/bench_rag_rewrite.py \
        --corpus bench/data/sqlite-doc.jsonl.gz --questions bench/data/sqlite-doc-questions.json \
        --out bench/results/rag-rewrite-sqlite-doc.json
    flock /tmp/poolserve-heavy.lock nice -n 5 timeout 1500 .venv/bin/python bench/bench_rag_rewrite.py \
        --corpus bench/data/texlive-pdf.jsonl.gz --questions bench/data/texlive-pdf-questions.json \
        --out bench/results/rag-rewrite-texlive-pdf.json
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_rag_quality import (  # noqa: E402
    CHUNKINGS,
    COLLECTION,
    CORPUS,
    DEFAULT_CHUNKING,
    DEPTH,
    MODEL,
    QUESTIONS,
    TENANT,
    chunker_for,
    load_corpus,
    load_questions,
    metrics,
    rank_of,
)
from rag.retrieval.embedding import SentenceTransformerEmbedder  # noqa: E402
from rag.local import LocalEmbedder, LocalIndex  # noqa: E402
from rag.retrieval.pipeline import PipelineSettings, RagPipeline  # noqa: E402
from rag.retrieval.search import FusionSettings, fuse  # noqa: E402
from rag.store.knowledge_store import KnowledgeStore  # noqa: E402

PROFILE = ROOT / "configs" / "cpu-tiny.yaml"
RRF_K = 60
HYDE_TOKENS, KEYWORD_TOKENS = 64, 32
HYDE_PROMPT = (
    "Write a short passage, as it would appear in the technical documentation, that answers this "
    "question. Only the passage.\n\nQuestion: {q}"
)
KEYWORD_PROMPT = (
    "List five search keywords or synonyms for this question, comma-separated, nothing else.\n\nQuestion: {q}"
)
RERANK_PROMPT = "Passage:\n{p}\n\nQuestion: {q}\n\nDoes the passage answer the question? Answer yes or no."
YES, NO = ("yes", "Yes", " yes", " Yes", "YES"), ("no", "No", " no", " No", "NO")


# --- pure helpers (tests/unit/bench/test_bench_rag_rewrite.py) ------------------------------------------


def word_logprob(top: dict[str, float], words: tuple[str, ...]) -> float:
    """log of the summed probability of `words` among a token's top logprobs ({token text: logprob});
    absent altogether: the lowest logprob listed (an upper bound: it ranked below all of them)."""
    found = [lp for token, lp in top.items() if token in words]
    if not found:
        return min(top.values()) if top else -math.inf
    peak = max(found)
    return peak + math.log(sum(math.exp(lp - peak) for lp in found))


def yes_no_score(top: dict[str, float]) -> float:
    """log P(yes) - log P(no) from one generated token's top logprobs."""
    return word_logprob(top, YES) - word_logprob(top, NO)


def model_order(scores: list[float]) -> list[int]:
    """Candidate positions by the model's score, best first; ties keep the retrieval order."""
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))


def rrf_order(scores: list[float], k: int = RRF_K) -> list[int]:
    """The retrieval order (position i = rank i+1) and the model's order fused by reciprocal ranks."""
    by_model = {i: rank for rank, i in enumerate(model_order(scores), start=1)}
    fused = {i: 1 / (k + i + 1) + 1 / (k + by_model[i]) for i in range(len(scores))}
    return sorted(fused, key=lambda i: (-fused[i], i))


def clean_rewrite(text: str) -> str:
    """A rewrite as retrieval reads it: one line of words, no list markup."""
    return " ".join(text.replace("*", " ").replace("#", " ").split())


def latency_summary(seconds: list[float]) -> dict:
    ms = sorted(s * 1e3 for s in seconds)
    if not ms:
        return {}
    return {
        "p50_ms": round(statistics.median(ms), 1),
        "p90_ms": round(ms[min(len(ms) - 1, int(0.9 * len(ms)))], 1),
        "mean_ms": round(statistics.fmean(ms), 1),
        "questions": len(ms),
    }


# --- the chat model -------------------------------------------------------------------------------


def chat_engine(profile_path: Path, omp_threads: int | None):
    """vllm.LLM with the planner's engine arguments and environment for the profile's chat engine."""
    from planner.plan import build_plan
    from planner.profile import load_profile

    profile = load_profile(profile_path)
    plan = build_plan(profile)
    replica = next(r for r in plan.replicas if r.kind == "chat")
    env = dict(replica.env)
    if omp_threads:
        env |= {"OMP_NUM_THREADS": str(omp_threads), "MKL_NUM_THREADS": str(omp_threads)}
    os.environ.update(env)
    from vllm import LLM

    engine_args = {k: v for k, v in replica.vllm.as_dict().items() if v is not None}
    model = str(ROOT / dict(profile.chat_engines())[replica.name].model)
    llm = LLM(model=model, seed=0, **engine_args)
    return llm, {"model": model, "engine_args": engine_args, "env": env}


def prompts_for(llm, template: str, pairs: list[dict]) -> list[str]:
    tokenizer = llm.get_tokenizer()
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": template.format(**p)}], tokenize=False, add_generation_prompt=True
        )
        for p in pairs
    ]


def run_llm(llm, groups: list[list[str]], params, latency_questions: int) -> tuple[list[list], dict]:
    """groups: each question's prompts. One batched generate over all of them (the outputs used), then
    the first `latency_questions` groups one generate each (the per-question latency)."""
    flat = [p for g in groups for p in g]
    llm.reset_prefix_cache()  # no prompt of an earlier variant (or run) reused
    start = time.perf_counter()
    outputs = llm.generate(flat, params, use_tqdm=False)
    batch_s = time.perf_counter() - start
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outputs)
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    seconds = []
    for g in groups[:latency_questions]:
        llm.reset_prefix_cache()  # else the batch above left this question's prompts cached
        start = time.perf_counter()
        llm.generate(g, params, use_tqdm=False)
        seconds.append(time.perf_counter() - start)
    it = iter(outputs)
    per_question = [[next(it) for _ in g] for g in groups]
    n = len(groups)
    return per_question, {
        "batch_s": round(batch_s, 2),
        "batch_questions_per_s": round(n / batch_s, 2),
        "batch_ms_per_question": round(batch_s / n * 1e3, 1),
        "prompts": len(flat),
        "prompt_tokens_per_question": round(prompt_tokens / n, 1),
        "generated_tokens_per_question": round(generated / n, 1),
        "prefill_tokens_per_s": round(prompt_tokens / batch_s, 1),
        "per_question": latency_summary(seconds),
    }


# --- retrieval ------------------------------------------------------------------------------------


class Retriever:
    """Hybrid retrieval as rag.retrieval.search.retrieve does it (the store's dense and lexical candidates,
    fused), with the dense and lexical texts chosen separately."""

    def __init__(self, store: KnowledgeStore, embedder: SentenceTransformerEmbedder):
        self.store, self.embedder, self.fusion = store, embedder, FusionSettings()

    def hits(self, dense_texts: list[str], lexical_texts: list[str], depth: int = DEPTH) -> list[list]:
        vectors = self.embedder.embed([self.embedder.query_prefix + t for t in dense_texts])["vectors"]
        candidates = max(depth, self.fusion.candidates)
        return [
            fuse(
                self.store.search(TENANT, COLLECTION, v, candidates),
                self.store.search_lexical(TENANT, COLLECTION, t, candidates),
                depth,
                self.fusion,
            )
            for v, t in zip(vectors, lexical_texts)
        ]


def score(hit_lists: list[list], questions: list[dict]) -> dict:
    ranks = [rank_of(hits[:DEPTH], set(q["documents"])) for hits, q in zip(hit_lists, questions)]
    by_kind = {
        kind: metrics([r for r, q in zip(ranks, questions) if q["kind"] == kind])
        for kind in sorted({q["kind"] for q in questions})
    }
    return {
        **metrics(ranks),
        "by_kind": by_kind,
        "missed_top5": [q["id"] for r, q in zip(ranks, questions) if r is None or r > 5],
    }


async def ingest(corpus, embedder, workdir: Path) -> tuple[KnowledgeStore, dict]:
    store = KnowledgeStore(workdir / "store.sqlite3", dim=embedder.dimension)
    local = LocalEmbedder(embedder, chunker_for(DEFAULT_CHUNKING, embedder))
    settings = PipelineSettings(max_top_k=20, embed_title=CHUNKINGS[DEFAULT_CHUNKING][3])
    pipeline = RagPipeline(local, LocalIndex(store, FusionSettings()), settings)
    start, counts = time.perf_counter(), []
    for i in range(0, len(corpus), 16):  # 16 documents per ingest request, as bench_rag_quality
        counts += await pipeline.ingest(TENANT, COLLECTION, corpus[i : i + 16])
    return store, {
        "chunking": DEFAULT_CHUNKING,
        "chunks": sum(counts),
        "ingest_s": round(time.perf_counter() - start, 1),
    }


def table(variants: dict) -> str:
    lines = [
        "| variant | recall@1 | recall@5 | MRR | exact r@5 | paraphrase r@5 | LLM p50 ms/question "
        "| batch ms/question |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, v in variants.items():
        kinds = v["by_kind"]
        r5 = {k: f"{kinds[k]['recall@5']:.3f}" if k in kinds else "-" for k in ("exact", "paraphrase")}
        llm = v.get("llm") or {}
        lines.append(
            f"| {name} | {v['recall@1']:.3f} | {v['recall@5']:.3f} | {v['mrr']:.3f} | {r5['exact']} "
            f"| {r5['paraphrase']} | {llm.get('per_question', {}).get('p50_ms', '-')} "
            f"| {llm.get('batch_ms_per_question', '-')} |"
        )
    return "\n".join(lines)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", default=str(CORPUS))
    parser.add_argument("--questions", default=str(QUESTIONS))
    parser.add_argument("--profile", default=str(PROFILE), help="whose chat engine runs the model")
    parser.add_argument("--variants", default="hyde,keywords,rerank", help="comma-separated of hyde, keywords, rerank")
    parser.add_argument("--rerank-depth", type=int, default=10, help="fused candidates the model scores (<= 20)")
    parser.add_argument("--latency-questions", type=int, default=15, help="questions timed one at a time")
    parser.add_argument("--omp-threads", type=int, default=None, help="override the plan's OMP_NUM_THREADS")
    parser.add_argument("--torch-threads", type=int, default=2, help="the embedder's (ingest and queries)")
    parser.add_argument("--documents", type=int, default=None, help="smoke test: the first N documents")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "rag-rewrite.json"))
    args = parser.parse_args()
    variants = args.variants.split(",")

    import json

    corpus, questions = load_corpus(Path(args.corpus)), load_questions(Path(args.questions))
    if args.documents:
        corpus = corpus[: args.documents]
        kept = {doc.id for doc in corpus}
        questions = [q for q in questions if set(q["documents"]) <= kept]
    import torch

    torch.set_num_threads(args.torch_threads)
    embedder = SentenceTransformerEmbedder(str(MODEL))
    load_before = os.getloadavg()
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        store, ingested = await ingest(corpus, embedder, Path(tmp))
        retriever = Retriever(store, embedder)
        texts = [q["question"] for q in questions]
        base = retriever.hits(texts, texts, depth=max(DEPTH, args.rerank_depth))
        results["baseline (hybrid)"] = score(base, questions)
        print(table(results), flush=True)

        llm, engine = chat_engine(Path(args.profile), args.omp_threads)
        from vllm import SamplingParams

        rewrites: dict = {}
        if "hyde" in variants:
            groups = [[p] for p in prompts_for(llm, HYDE_PROMPT, [{"q": t} for t in texts])]
            outs, cost = run_llm(
                llm, groups, SamplingParams(temperature=0, max_tokens=HYDE_TOKENS), args.latency_questions
            )
            passages = [clean_rewrite(o[0].outputs[0].text) or t for o, t in zip(outs, texts)]
            both = [f"{t} {p}" for t, p in zip(texts, passages)]
            rewrites["hyde"] = passages
            results["hyde: passage"] = {**score(retriever.hits(passages, passages), questions), "llm": cost}
            results["hyde: question + passage"] = {**score(retriever.hits(both, both), questions), "llm": cost}
            results["hyde: dense passage, lexical question"] = {
                **score(retriever.hits(passages, texts), questions),
                "llm": cost,
            }
            results["hyde: dense q+passage, lexical question"] = {
                **score(retriever.hits(both, texts), questions),
                "llm": cost,
            }
            print(table(results), flush=True)
        if "keywords" in variants:
            groups = [[p] for p in prompts_for(llm, KEYWORD_PROMPT, [{"q": t} for t in texts])]
            outs, cost = run_llm(
                llm, groups, SamplingParams(temperature=0, max_tokens=KEYWORD_TOKENS), args.latency_questions
            )
            expanded = [f"{t} {clean_rewrite(o[0].outputs[0].text)}" for o, t in zip(outs, texts)]
            rewrites["keywords"] = expanded
            results["keywords: question + keywords"] = {
                **score(retriever.hits(expanded, expanded), questions),
                "llm": cost,
            }
            results["keywords: lexical only"] = {**score(retriever.hits(texts, expanded), questions), "llm": cost}
            print(table(results), flush=True)
        if "rerank" in variants:
            depth = args.rerank_depth
            groups = [
                prompts_for(llm, RERANK_PROMPT, [{"q": t, "p": h.text} for h in hits[:depth]])
                for t, hits in zip(texts, base)
            ]
            outs, cost = run_llm(
                llm, groups, SamplingParams(temperature=0, max_tokens=1, logprobs=20), args.latency_questions
            )
            scores = [
                [
                    yes_no_score({lp.decoded_token: lp.logprob for lp in o.outputs[0].logprobs[0].values()})
                    for o in group
                ]
                for group in outs
            ]
            cost["rerank_depth"] = depth
            for name, order in (("model order", model_order), ("rrf with retrieval rank", rrf_order)):
                reranked = [[hits[i] for i in order(s)] + hits[depth:] for hits, s in zip(base, scores)]
                results[f"rerank top {depth}: {name}"] = {**score(reranked, questions), "llm": cost}
            rewrites["rerank_scores"] = [[round(x, 3) for x in s] for s in scores]
            print(table(results), flush=True)
        store.close()

    report = {
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "torch_threads": args.torch_threads,
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
        },
        "corpus": {"path": args.corpus, "questions_path": args.questions, "documents": len(corpus), **ingested},
        "questions": {
            "total": len(questions),
            **{k: sum(q["kind"] == k for q in questions) for k in ("exact", "paraphrase")},
        },
        "chat": engine,
        "fusion": FusionSettings().model_dump(),
        "depth": DEPTH,
        "prompts": {"hyde": HYDE_PROMPT, "keywords": KEYWORD_PROMPT, "rerank": RERANK_PROMPT},
        "variants": results,
        "rewrites": {k: dict(zip((q["id"] for q in questions), v)) for k, v in rewrites.items()},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(table(results))
    print(f"-> {args.out}")


if __name__ == "__main__":
    asyncio.run(main())
