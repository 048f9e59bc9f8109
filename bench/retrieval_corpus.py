"""Real chunk and question embeddings for bench/bench_retrieval_scale.py, cached under var/bench-cache/.

The stream of chunk texts: the pydoc corpus (bench/data/stdlib-pydoc.jsonl.gz, 179 documents) chunked
as the stack chunks it (rag.retrieval.embedding's tokenizer-aware chunker, the profile's chunk_tokens/overlap,
each chunk embedded with its document's title in front, as rag/retrieval/pipeline.py does), then copies of the
corpus, each perturbed as text before chunking: its paragraphs shuffled and 10% of its words dropped
(seeded by the copy number). The first `real_chunks` texts of that stream are embedded for real with
MiniLM (sentence-transformers, normalize_embeddings=True, max_seq_length of the model: what the
embedder replica runs), in blocks of BLOCK chunks cached one file each, so a rerun embeds nothing and
a larger `real_chunks` embeds only the missing blocks.

Past the real ones, vectors are perturbations of the real vectors: real[i % R] + gaussian noise,
renormalized. The noise's norm is chosen so that a synthetic vector's cosine to its source equals the
median cosine of a text-perturbed chunk to its nearest chunk of the original corpus (measured on the
real copies), so synthetic neighbours sit as close as real near-duplicates do.

Questions: bench/data/rag-questions.json (160, hand-written, none of them in the corpus), embedded
one at a time as the stack embeds a question (query prefix of the profile in front).
"""

from __future__ import annotations

import gzip
import sys
import hashlib
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "bench" / "data" / "stdlib-pydoc.jsonl.gz"
QUESTIONS = ROOT / "bench" / "data" / "rag-questions.json"
CACHE_DIR = ROOT / "var" / "bench-cache" / "retrieval-scale"
BLOCK = 512  # chunks per cached file
WORD_DROPOUT = 0.10


@dataclass(frozen=True)
class EmbedSettings:
    """What decides the vectors; a cache made with other settings is not reused."""

    model: str
    chunk_tokens: int
    chunk_overlap: int
    embed_title: bool
    query_prefix: str

    def key(self) -> str:
        corpus = hashlib.sha256(CORPUS.read_bytes()).hexdigest()[:12]
        text = json.dumps(
            [
                Path(self.model).name,
                self.chunk_tokens,
                self.chunk_overlap,
                self.embed_title,
                WORD_DROPOUT,
                BLOCK,
                corpus,
            ]
        )
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def settings_from_profile(profile_path: Path) -> EmbedSettings:
    from planner.profile import load_profile

    profile = load_profile(profile_path)
    model = profile.embedder.model
    model = model if Path(model).is_absolute() else str(ROOT / model)
    return EmbedSettings(
        model,
        profile.rag.chunk_tokens,
        profile.rag.chunk_overlap,
        profile.rag.embed_title,
        profile.embedder.query_prefix,
    )


def load_documents() -> list[dict]:
    with gzip.open(CORPUS, "rt", encoding="utf-8") as lines:
        return [json.loads(line) for line in lines]


def perturbed(text: str, copy: int, doc_index: int) -> str:
    """Copy 0 is the text itself; copy c shuffles its paragraphs and drops WORD_DROPOUT of its words."""
    if copy == 0:
        return text
    rng = random.Random(copy * 100_003 + doc_index)
    paragraphs = [p for p in text.split("\n\n") if p.strip()]
    head, rest = paragraphs[0], paragraphs[1:]  # the first line stays: it is the document's title
    rng.shuffle(rest)
    kept = []
    for paragraph in rest:
        lines = []
        for line in paragraph.split("\n"):
            indent = line[: len(line) - len(line.lstrip())]
            words = [w for w in line.split() if rng.random() >= WORD_DROPOUT]
            lines.append(indent + " ".join(words))
        kept.append("\n".join(lines))
    return "\n\n".join([head, *kept])


class CorpusEmbedder:
    """The embedder and chunker of the stack, in-process (rag.retrieval.embedding), one torch thread for questions."""

    def __init__(self, settings: EmbedSettings, device: str = "cpu", batch_size: int = 32):
        from rag.documents.chunking import document_title, with_title
        from rag.retrieval.embedding import SentenceTransformerEmbedder

        self.settings = settings
        self.embedder = SentenceTransformerEmbedder(
            settings.model,
            batch_size,
            settings.chunk_tokens,
            settings.chunk_overlap,
            device,
            query_prefix=settings.query_prefix,
        )
        self._title, self._with_title = document_title, with_title

    def texts(self) -> Iterator[tuple[int, str]]:
        """(copy, text to embed) for every chunk of copy 0, 1, 2, ... of the corpus, endlessly."""
        documents = load_documents()
        copy = 0
        while True:
            for i, doc in enumerate(documents):
                text = perturbed(doc["text"], copy, i)
                title = self._title(text) if self.settings.embed_title else None
                for chunk in self.embedder.chunk(text):
                    yield copy, self._with_title(title, chunk.text)
            copy += 1

    def embed_query(self, text: str) -> np.ndarray:
        return self.embedder.embed_query(text)


def _block_path(settings: EmbedSettings, block: int, cache_dir: Path | None = None) -> Path:
    return (cache_dir or CACHE_DIR / settings.key()) / f"block-{block:05d}.npz"


def real_chunk_vectors(
    settings: EmbedSettings,
    real_chunks: int,
    embedder: CorpusEmbedder | None = None,
    threads: int = 1,
    log=print,
    cache_dir: Path | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The first real_chunks vectors of the stream and each one's copy number; missing blocks are embedded
    (and cached) with `threads` torch threads (on the shared 2-core box one measured faster than two)."""
    blocks = -(-real_chunks // BLOCK)
    missing = [b for b in range(blocks) if not _block_path(settings, b, cache_dir).exists()]
    if missing:
        import time

        import torch

        embedder = embedder or CorpusEmbedder(settings)
        torch.set_num_threads(threads)
        texts = embedder.texts()
        started = time.perf_counter()
        for block in range(blocks):
            rows = [next(texts) for _ in range(BLOCK)]
            path = _block_path(settings, block, cache_dir)
            if path.exists():
                continue
            vectors = embedder.embedder.embed([text for _, text in rows])["vectors"]
            path.parent.mkdir(parents=True, exist_ok=True)
            np.savez(path, vectors=vectors, copies=np.array([c for c, _ in rows], dtype=np.int32))
            done = (block + 1) * BLOCK
            log(f"[corpus] embedded block {block + 1}/{blocks} ({done} chunks, {time.perf_counter() - started:.0f} s)")
    parts = [np.load(_block_path(settings, b, cache_dir)) for b in range(blocks)]
    vectors = np.concatenate([p["vectors"] for p in parts])[:real_chunks]
    copies = np.concatenate([p["copies"] for p in parts])[:real_chunks]
    return np.ascontiguousarray(vectors, dtype=np.float32), copies


def cached_real_chunks(settings: EmbedSettings, least: int) -> int:
    """Chunks in the cache's unbroken run of blocks from the first, and at least `least`."""
    blocks = 0
    while _block_path(settings, blocks).exists():
        blocks += 1
    return max(blocks * BLOCK, least)


def noise_norm(vectors: np.ndarray, copies: np.ndarray) -> tuple[float, float]:
    """The noise norm whose perturbation keeps cosine m to the source, where m is the median cosine of a
    text-perturbed chunk (copy >= 1) to its nearest chunk of copy 0; and m. 0.3 when no copy is real."""
    original, others = vectors[copies == 0], vectors[copies > 0]
    if not len(others) or not len(original):
        return 0.3, float(1 / np.sqrt(1 + 0.3**2))
    nearest = np.max(others @ original.T, axis=1)
    m = float(np.clip(np.median(nearest), 0.5, 0.999))
    # |v + s*g| with |v| = 1 and g a random unit direction nearly orthogonal to v: cos = 1/sqrt(1+s^2)
    return float(np.sqrt(1 / m**2 - 1)), m


def chunk_vectors(real: np.ndarray, n: int, norm: float, seed: int) -> np.ndarray:
    """n unit vectors: the real ones first, then real[i % R] plus gaussian noise of the given norm."""
    dim = real.shape[1]
    out = np.empty((n, dim), dtype=np.float32)
    take = min(n, len(real))
    out[:take] = real[:take]
    rng = np.random.default_rng(seed)
    step = 65_536
    for start in range(take, n, step):
        stop = min(n, start + step)
        src = real[np.arange(start, stop) % len(real)]
        noise = rng.standard_normal((stop - start, dim), dtype=np.float32) * np.float32(norm / np.sqrt(dim))
        block = src + noise
        out[start:stop] = block / np.linalg.norm(block, axis=1, keepdims=True)
    return out


def load_questions() -> list[str]:
    return [q["question"] for q in json.loads(QUESTIONS.read_text())["questions"]]


# ---- moving real vectors between machines (embedded on a GPU, used here) --------------------------
FILE_ROWS = 20_480  # fp16 rows per file: 15 MiB, under the device tool's 16 MiB per returned file


def export_vectors(vectors: np.ndarray, copies: np.ndarray, out: Path) -> None:
    """vectors-K.npy (fp16) and copies.npy: files small enough to travel back from a remote machine."""
    out.mkdir(parents=True, exist_ok=True)
    for start in range(0, len(vectors), FILE_ROWS):
        np.save(out / f"vectors-{start // FILE_ROWS}.npy", vectors[start : start + FILE_ROWS].astype(np.float16))
    np.save(out / "copies.npy", copies.astype(np.int16))


def import_vectors(settings: EmbedSettings, source: Path, note: str) -> int:
    """Cache blocks from export_vectors' files (renormalized fp32), with a note of where they were embedded."""
    files = sorted(source.glob("vectors-*.npy"), key=lambda p: int(p.stem.split("-")[1]))
    vectors = np.concatenate([np.load(p).astype(np.float32) for p in files])
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    copies = np.load(source / "copies.npy").astype(np.int32)
    whole = len(vectors) // BLOCK
    for block in range(whole):
        path = _block_path(settings, block)
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = slice(block * BLOCK, (block + 1) * BLOCK)
        np.savez(path, vectors=vectors[rows], copies=copies[rows])
    (CACHE_DIR / settings.key() / "SOURCE.txt").write_text(note + "\n")
    return whole * BLOCK


def main() -> None:
    import typer

    app = typer.Typer(add_completion=False, help="Embed the chunk stream (e.g. on a GPU machine) and import it here.")

    @app.command()
    def embed(
        n: int = typer.Option(..., help="Chunks of the stream to embed."),
        out: Path = typer.Option(..., help="Where the fp16 files go."),
        model: str = typer.Option(
            str(ROOT / "models" / "all-MiniLM-L6-v2"),
            help="sentence-transformers folder (an fp16 copy is cast back to fp32).",
        ),
        device: str = typer.Option("cuda"),
        chunk_tokens: int = 200,
        chunk_overlap: int = 30,
        batch_size: int = 128,
    ) -> None:
        """Embed the first n chunks of the stream and write them as export_vectors files."""
        settings = EmbedSettings(model, chunk_tokens, chunk_overlap, True, "")
        embedder = CorpusEmbedder(settings, device=device, batch_size=batch_size)
        embedder.embedder.model.float()
        vectors, copies = real_chunk_vectors(settings, n, embedder, threads=8, cache_dir=out / "blocks")
        export_vectors(vectors, copies, out)

    @app.command("import")
    def import_(
        source: Path,
        note: str = typer.Option(..., help="Where and how they were embedded."),
        profile: Path = typer.Option(ROOT / "configs" / "cpu-tiny.yaml"),
    ) -> None:
        """Cache the vectors of `embed` for the profile's settings."""
        print(f"imported {import_vectors(settings_from_profile(profile), source, note)} vectors")

    app()


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
