"""The pure parts of the retrieval-at-scale benchmark: text perturbation of corpus copies, the synthetic
vectors past the real ones, exact top-k in blocks, recall, the export/import of vectors, the table."""

from __future__ import annotations

import numpy as np
import pytest

from bench import bench_retrieval_scale as scale
from bench import retrieval_corpus as corpus
from bench.harness.results import new_result

TEXT = "Python Library Documentation: module abc\n\nNAME\n    abc - Abstract Base Classes.\n\n" + "\n\n".join(
    f"PARAGRAPH {i}\n    " + " ".join(f"word{i}_{j}" for j in range(40)) for i in range(8)
)


def unit_rows(rng, n, dim=16):
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_copy_zero_is_the_text_and_copies_keep_the_title_shuffle_and_drop_words():
    assert corpus.perturbed(TEXT, 0, 3) == TEXT
    first, second = corpus.perturbed(TEXT, 1, 3), corpus.perturbed(TEXT, 2, 3)
    assert first.split("\n\n")[0] == TEXT.split("\n\n")[0]  # the title line stays first
    assert first != second and first == corpus.perturbed(TEXT, 1, 3)  # seeded per copy
    words, kept = TEXT.split(), first.split()
    assert 0.8 * len(words) < len(kept) < len(words)  # ~10% dropped
    assert set(kept) <= set(words)
    order = [p.split()[0] + p.split()[1] for p in first.split("\n\n")[1:] if p.startswith("PARAGRAPH")]
    assert order != sorted(order, key=lambda s: int(s.removeprefix("PARAGRAPH")))  # paragraphs shuffled


def test_chunk_vectors_keep_the_real_ones_then_perturb_them_at_the_chosen_cosine():
    rng = np.random.default_rng(0)
    real = unit_rows(rng, 50, dim=384)
    norm = 0.372
    out = corpus.chunk_vectors(real, 500, norm, seed=1)
    np.testing.assert_array_equal(out[:50], real)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
    cosines = np.sum(out[50:] * real[np.arange(50, 500) % 50], axis=1)
    assert np.median(cosines) == pytest.approx(1 / np.sqrt(1 + norm**2), abs=0.01)
    np.testing.assert_array_equal(out, corpus.chunk_vectors(real, 500, norm, seed=1))


def test_noise_norm_matches_the_median_cosine_of_text_copies_to_the_originals():
    rng = np.random.default_rng(2)
    original = unit_rows(rng, 40, dim=384)
    noisy = original + 0.5 / np.sqrt(384) * rng.standard_normal(original.shape).astype(np.float32)
    noisy /= np.linalg.norm(noisy, axis=1, keepdims=True)
    vectors = np.vstack([original, noisy])
    copies = np.array([0] * 40 + [1] * 40)
    norm, median = corpus.noise_norm(vectors, copies)
    assert median == pytest.approx(np.median(np.sum(noisy * original, axis=1)), abs=1e-6)
    assert 1 / np.sqrt(1 + norm**2) == pytest.approx(median, abs=1e-6)
    assert corpus.noise_norm(original, np.zeros(40, dtype=int))[0] == 0.3  # no real copy: the fallback


def test_exact_top_in_blocks_equals_a_full_sort(monkeypatch):
    rng = np.random.default_rng(3)
    data, queries = unit_rows(rng, 1000), unit_rows(rng, 7)
    ids, scores = scale.exact_top(data, queries, 10)
    full = np.argsort(-(queries @ data.T), axis=1)[:, :10]
    np.testing.assert_array_equal(ids, full)
    np.testing.assert_allclose(scores, np.take_along_axis(queries @ data.T, full, axis=1), rtol=1e-6)


def test_recalls_count_overlap_ties_and_the_best_chunk():
    rng = np.random.default_rng(4)
    data, queries = unit_rows(rng, 200), unit_rows(rng, 2)
    truth, truth_scores = scale.exact_top(data, queries, scale.TOP_K)
    perfect = scale.recalls(list(truth), truth, truth_scores, data, queries)
    assert perfect == {"recall": 1.0, "recall_ties": 1.0, "top1": 1.0}
    half = [np.concatenate([t[5:], [-1] * 5]) for t in truth]  # the best 5 missed
    assert scale.recalls(half, truth, truth_scores, data, queries) == {"recall": 0.5, "recall_ties": 0.5, "top1": 0.0}


def test_exported_vectors_come_back_as_unit_fp32_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus, "CACHE_DIR", tmp_path / "cache")
    monkeypatch.setattr(corpus, "BLOCK", 8)
    settings = corpus.EmbedSettings("all-MiniLM-L6-v2", 200, 30, True, "")
    rng = np.random.default_rng(5)
    vectors, copies = unit_rows(rng, 20, dim=384), np.arange(20) // 10
    corpus.export_vectors(vectors, copies, tmp_path / "out")
    assert corpus.import_vectors(settings, tmp_path / "out", "test") == 16  # whole blocks only
    assert corpus.cached_real_chunks(settings, 4) == 16
    back, back_copies = corpus.real_chunk_vectors(settings, 16)
    np.testing.assert_allclose(back, vectors[:16], atol=1e-3)  # fp16 on the way
    np.testing.assert_allclose(np.linalg.norm(back, axis=1), 1.0, atol=1e-6)
    np.testing.assert_array_equal(back_copies, copies[:16])


def test_table_has_a_row_per_measurement():
    row = {
        **scale.EMPTY_ROW,
        "n": 1000,
        "real": 1000,
        "kind": "hnsw",
        "setting": "hnsw M32 ef64",
        "store_default": True,
        "build_s": 1.0,
        "memory_mib": 2.0,
        "index_mib": 1.5,
        "p50": 0.1,
        "p95": 0.2,
        "recall": 0.9,
        "recall_ties": 0.91,
        "top1": 0.95,
        "embed_search_p50": 15.0,
        "embed_search_p95": 20.0,
        "embed_part_p50": 14.9,
        "search_part_p50": 0.1,
        "cpu_p50": 14.0,
        "load": 3.0,
    }
    table = scale.tables(new_result("retrieval-scale", {}, {}, [row], command=[]))
    assert "| 1000 | 1000 | hnsw M32 ef64 (store) | 1.0 | 2 | 2 | 0.10 | 0.20 | 0.900 | 0.910 | 0.950 | 15.0 |" in table
