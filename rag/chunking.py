"""Tokenizer-aware chunking: chunks are measured in the embedder's own tokens.

The embedder reads at most `max_seq_length` tokens (256 for MiniLM) and silently drops the
rest, so chunk sizes are counted with its tokenizer, not with characters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from langchain_text_splitters import RecursiveCharacterTextSplitter

# Paragraphs, then lines, then sentences, then words: the splitter tries them in order.
SEPARATORS = ["\n\n", "\n", ". ", "? ", "! ", "; ", ", ", " ", ""]


@dataclass(frozen=True)
class Chunk:
    index: int
    text: str


class Chunker:
    def __init__(self, count_tokens: Callable[[str], int], chunk_tokens: int, overlap_tokens: int):
        if overlap_tokens >= chunk_tokens:
            raise ValueError(f"chunk overlap ({overlap_tokens}) must be smaller than chunk size ({chunk_tokens})")
        self._splitter = RecursiveCharacterTextSplitter(
            chunk_size=chunk_tokens,
            chunk_overlap=overlap_tokens,
            length_function=count_tokens,
            separators=SEPARATORS,
            keep_separator="end",
            strip_whitespace=True,
        )

    def split(self, text: str) -> list[Chunk]:
        pieces = [p for p in self._splitter.split_text(text) if p.strip()]
        return [Chunk(index=i, text=p) for i, p in enumerate(pieces)]


def word_windows(text: str, words: int, overlap: int = 0) -> list[str]:
    """Plain windows of `words` whitespace-separated words, `overlap` shared by neighbours: the
    simplest chunking, kept as the baseline the token-aware Chunker is measured against."""
    if not 0 <= overlap < words:
        raise ValueError(f"overlap ({overlap}) must be at least 0 and smaller than the window ({words})")
    tokens = text.split()
    step = words - overlap
    return [" ".join(tokens[i:i + words]) for i in range(0, max(1, len(tokens) - overlap), step) if tokens[i:i + words]]


TITLE_MAX_CHARS = 120


def document_title(text: str, metadata: dict | None = None) -> str | None:
    """What a document is called: its metadata's "title", else its first line when that line is
    short enough to be a heading (a long one is prose, not a title)."""
    title = (metadata or {}).get("title")
    if isinstance(title, str) and title.strip():
        return title.strip()[:TITLE_MAX_CHARS]
    first = text.strip().split("\n", 1)[0].strip()
    return first if first and len(first) <= TITLE_MAX_CHARS else None


def with_title(title: str | None, chunk: str) -> str:
    """The text to embed for a chunk: its document's title in front, unless the chunk starts with it."""
    return chunk if not title or chunk.startswith(title) else f"{title}\n{chunk}"
