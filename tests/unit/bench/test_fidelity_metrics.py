"""bench/fidelity_metrics.py and the fidelity prompt set: how divergences from a reference are counted."""

from __future__ import annotations

import pytest

from bench.bench_engine_fidelity import load_prompts, speed_indices
from bench.fidelity_metrics import compare_sequences, first_difference, teacher_forced


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 9, 3], [1, 2, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2  # stopped early: differs where it ended
    assert first_difference([], [5]) == 0


def test_compare_sequences_splits_divergences_by_margin():
    references = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9]]
    margins = [[3.0, 3.0, 0.1, 3.0], [2.0, 4.0, 2.0, 2.0], [1.0, 1.0, 1.0, 1.0]]
    outputs = [[1, 2, 0, 0], [5, 0, 7, 8], [9, 9, 9, 9]]
    stats = compare_sequences(outputs, references, margins, n_tokens=4)
    assert stats["exact_match"] == pytest.approx(1 / 3)
    assert stats["first_diff"] == [2, 1, None]
    assert stats["first_diff_mean"] == pytest.approx((2 + 1 + 4) / 3)  # equal counts as n_tokens
    assert stats["first_diff_median"] == 2
    assert stats["divergence_margins"] == [0.1, 4.0]
    assert (stats["near_tie_divergences"], stats["large_margin_divergences"]) == (1, 1)
    assert stats["agree_first_8"] == pytest.approx(1 / 3)


def test_compare_sequences_rejects_mismatched_inputs():
    with pytest.raises(ValueError, match="same prompts"):
        compare_sequences([[1]], [[1], [2]], [[0.0]], n_tokens=1)


def test_teacher_forced_counts_mismatches_with_their_margins():
    stats = teacher_forced([[1, 7, 3], [4, 5]], [[1, 2, 3], [4, 6]], [[9.0, 0.2, 9.0], [9.0, 2.5]])
    assert (stats["positions"], stats["mismatches"]) == (5, 2)
    assert (stats["near_tie_mismatches"], stats["large_margin_mismatches"]) == (1, 1)
    assert stats["mismatch_margin_max"] == 2.5
    with pytest.raises(ValueError, match="one argmax"):
        teacher_forced([[1]], [[1, 2]], [[0.0, 0.0]])


def test_prompt_set_is_varied_and_speed_set_covers_every_category():
    prompts = load_prompts()
    categories = {p["category"] for p in prompts}
    assert len(prompts) >= 50
    assert {"factual", "reasoning", "code", "rag", "multilingual", "long", "instructions"} <= categories
    assert len({p["id"] for p in prompts}) == len(prompts)
    chosen = speed_indices(prompts)
    assert len(chosen) == 8 and {prompts[i]["category"] for i in chosen} == categories


def test_tables_render_fidelity_and_speed_rows():
    from bench.bench_engine_fidelity import tables
    from bench.harness.results import new_result
    from bench.report import table_for

    fidelity = compare_sequences([[1, 2], [3, 0]], [[1, 2], [3, 4]], [[5.0, 5.0], [5.0, 0.2]], n_tokens=2)
    forced = teacher_forced([[1, 2], [3, 9]], [[1, 2], [3, 4]], [[5.0, 5.0], [5.0, 0.2]])
    base = {"init_s": 20.0, "pss_init_bytes": 2**30, "pss_work_bytes": 2**30, "tok_s_c1": 20.0, "tok_s_batch8": 50.0}
    rows = [
        {"variant": "bf16 eager", "work": "full", **base, "fidelity": fidelity, "teacher_forced": forced},
        {"variant": "bf16 compiled (warm cache)", "work": "speed", **base, "tok_s_c1": 30.0},
    ]
    config = {"n_prompts": 2, "n_tokens": 2, "near_tie_logits": 0.5, "speed_prompts": ["a"] * 8}
    result = new_result("engine-fidelity", config, {}, rows, command=["x"])
    text = tables(result)
    assert "| bf16 eager | 50% | 1.5 / 1.5 | 50% | 50% | 1 / 0 |" in text
    assert "1 of 4 (1 / 0)" in text
    assert "| 1 | bf16 compiled (warm cache) | speed | 20 | 30.0 | 1.50x | 50.0 | 1.00x | 1,024 | 1,024 |" in text
    assert table_for("engine-fidelity", result) == text
