"""RAG prompt building: numbered context, an instruction to answer from it, and citations."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from rag.documents.locations import LOCATIONS_KEY, resolve

SYSTEM_INSTRUCTION = (
    "You answer questions using only the numbered context passages below. "
    "Cite the passages you use as [1], [2], ... "
    "If the context does not contain the answer, say that you don't know."
)


@dataclass(frozen=True)
class RetrievedChunk:
    document_id: str
    chunk_id: str
    score: float
    text: str
    metadata: dict | None = None
    # Character offsets of the chunk in its document (document[start:end] == text); None for chunks
    # stored before offsets were recorded, or by a chunker that rewrites text.
    start: int | None = None
    end: int | None = None

    def citation(self) -> dict:
        """The chunk as cited; a PDF/PPTX/DOCX chunk adds where it sits: page (and page_end when it
        runs onto another page), slide (slide_end), or section (rag/documents/locations.py)."""
        metadata = dict(self.metadata or {})
        where = resolve(metadata.pop(LOCATIONS_KEY, None), self.start, self.end)
        return {
            "document_id": self.document_id,
            "chunk_id": self.chunk_id,
            "score": round(float(self.score), 6),
            "text": self.text,
            "start": self.start,
            "end": self.end,
            **where,
            "metadata": metadata,
        }


def estimate_tokens(text: str) -> int:
    """About four characters a token in English; used where no tokenizer is at hand."""
    return (len(text) + 3) // 4


def fit_context(
    chunks: list[RetrievedChunk], budget: int | None, count_tokens: Callable[[str], int] = estimate_tokens
) -> list[RetrievedChunk]:
    """The best-ranked passages whose text fits `budget` tokens together, in rank order.

    The prompt's prefill is most of a CPU RAG answer's time (about 2.7-4.8 ms a token for SmolLM2 on
    this machine's cores, docs/BENCHMARKS.md section 2.5), so the context is budgeted in the chat model's
    tokens, not counted in chunks. A passage that does not fit ends the context (a lower-ranked
    shorter one is not pulled in ahead of it); the first passage is always kept, cut to the budget
    if it alone is longer (its `end` offset then marks where the cut fell)."""
    if budget is None or not chunks:
        return list(chunks)
    kept, used = [], 0
    for chunk in chunks:
        tokens = count_tokens(chunk.text.strip())
        if used + tokens > budget:
            if not kept:
                kept.append(_cut(chunk, budget, tokens, count_tokens))
            break
        kept.append(chunk)
        used += tokens
    return kept


def _cut(chunk: RetrievedChunk, budget: int, tokens: int, count_tokens: Callable[[str], int]) -> RetrievedChunk:
    """The chunk's longest prefix, ended at a word boundary, that counts at most `budget` tokens
    (shrunk by the measured ratio: a few tokenizer calls at most)."""
    text = chunk.text
    for _ in range(8):
        if tokens <= budget:
            break
        keep = max(1, len(text) * budget // max(tokens, 1) - 1)
        text = text[:keep]
        if " " in text.strip():
            text = text[: text.rstrip().rindex(" ")]
        text = text.rstrip()
        tokens = count_tokens(text)
    end = chunk.start + len(text) if chunk.start is not None else chunk.end
    return replace(chunk, text=text, end=end)


def context_block(chunks: list[RetrievedChunk]) -> str:
    lines = [f"[{i}] {chunk.text.strip()}" for i, chunk in enumerate(chunks, start=1)]
    return "Context:\n" + "\n\n".join(lines) if lines else "Context: (no passages found)"


def rag_messages(question: str, chunks: list[RetrievedChunk], history: list[dict] | None = None) -> list[dict]:
    """Messages for the chat model: instruction + context as system, then the conversation."""
    system = {"role": "system", "content": f"{SYSTEM_INSTRUCTION}\n\n{context_block(chunks)}"}
    turns = list(history or [])
    if question:
        turns.append({"role": "user", "content": question})
    return [system, *turns]


def augment_chat(messages: list[dict], chunks: list[RetrievedChunk]) -> list[dict]:
    """RAG through /v1/chat/completions: keep the client's messages, prepend the context.

    A client system message stays, after ours, so its persona still applies.
    """
    return rag_messages("", chunks, history=messages)


def last_user_text(messages: list[dict]) -> str:
    """The retrieval query for chat-with-RAG: the latest user turn's text."""
    for message in reversed(messages):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            return " ".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def citations(chunks: list[RetrievedChunk]) -> list[dict]:
    return [chunk.citation() for chunk in chunks]
