"""RAG-shaped prompts for the serving benchmarks: a real question over the pydoc corpus, with the passage
that answers it and two passages from other documents, numbered and wrapped in the instruction the stack's
own RAG route sends (rag/retrieval/prompt.py). Answers quote their context, which is what prompt-lookup speculation
and a RAG deployment's traffic look like; random-token prompts are the other end.

    write_prompts(workdir / "rag.json", "rag", n=64)   # vllm.benchmarks.serve's sharegpt dataset format
    write_prompts(workdir / "chat.json", "chat", n=64) # the questions alone: open chat

Deterministic for a seed: both servers of a comparison get the same prompts in the same order.
"""

from __future__ import annotations

import gzip
import json
import random
import re
from pathlib import Path

from rag.retrieval.prompt import RetrievedChunk, context_block, SYSTEM_INSTRUCTION

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "bench" / "data" / "stdlib-pydoc.jsonl.gz"
QUESTIONS = ROOT / "bench" / "data" / "rag-questions.json"
PASSAGE_CHARS = 900  # ~220 tokens; three of them + instruction + question is ~750 prompt tokens


def _window(text: str, center: int, chars: int = PASSAGE_CHARS) -> str:
    """About `chars` characters of text around center, cut at whitespace."""
    start = max(0, center - chars // 2)
    end = min(len(text), start + chars)
    start = max(0, end - chars)
    piece = text[start:end]
    if start > 0 and " " in piece:
        piece = piece.split(" ", 1)[1]
    if end < len(text) and " " in piece:
        piece = piece.rsplit(" ", 1)[0]
    return piece.strip()


def rag_prompts(n: int, seed: int = 0) -> list[str]:
    """n prompts (cycling through the questions when n exceeds them), in a seeded order."""
    documents = {row["id"]: row["text"] for row in map(json.loads, gzip.open(CORPUS, "rt"))}
    questions = json.loads(QUESTIONS.read_text())["questions"]
    rng = random.Random(seed)
    rng.shuffle(questions)
    ids = sorted(documents)
    prompts = []
    for i in range(n):
        question = questions[i % len(questions)]
        gold = question["documents"][0]
        match = re.search(question["evidence"], documents[gold])
        answer = _window(documents[gold], match.start() if match else 0)
        others = rng.sample([d for d in ids if d not in question["documents"]], 2)
        passages = [answer] + [_window(documents[d], rng.randrange(max(1, len(documents[d])))) for d in others]
        rng.shuffle(passages)
        chunks = [RetrievedChunk(document_id="", chunk_id="", score=0.0, text=p) for p in passages]
        prompts.append(f"{SYSTEM_INSTRUCTION}\n\n{context_block(chunks)}\n\nQuestion: {question['question']}")
    return prompts


def chat_prompts(n: int, seed: int = 0) -> list[str]:
    """n open-chat prompts: the same questions with no context (the model answers from its own weights)."""
    questions = json.loads(QUESTIONS.read_text())["questions"]
    random.Random(seed).shuffle(questions)
    return [questions[i % len(questions)]["question"] for i in range(n)]


PROMPT_SETS = {"rag": rag_prompts, "chat": chat_prompts}


def write_prompts(path: Path, dataset: str, n: int, seed: int = 0) -> Path:
    """`dataset`'s prompts (rag or chat) in vllm.benchmarks.serve's ShareGPT format (its `custom` format
    needs pandas): each a human turn sent as the user message as it is, and a placeholder answer the load
    generator ignores when --sharegpt-output-len is given."""
    conversations = [
        {"conversations": [{"from": "human", "value": prompt}, {"from": "gpt", "value": "-"}]}
        for prompt in PROMPT_SETS[dataset](n, seed)
    ]
    path.write_text(json.dumps(conversations))
    return path
