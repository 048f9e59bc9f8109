"""docs/PLANNER.md quotes the planner's figures: every generated block must match the code today."""

from __future__ import annotations

from pathlib import Path

from planner.docfigures import BLOCK, regenerate

DOC = Path(__file__).resolve().parents[3] / "docs" / "PLANNER.md"


def test_doc_figures_match_the_planner():
    text = DOC.read_text()
    names = [m.group("name") for m in BLOCK.finditer(text)]
    assert {"cpu-tiny", "dgx-spark", "dgx-spark-128", "dgx-spark-27b", "dgx-spark-27b-plus-small"} <= set(names)
    assert regenerate(text) == text, "docs/PLANNER.md figures drifted: run python -m planner.docfigures"


def test_formula_figures_in_prose():
    """Hand-derived figures the prose quotes, recomputed from the architectures."""
    from planner.architecture import read_architecture

    text = DOC.read_text()
    flash, dense = read_architecture("/absent", "qwen3.8-flash-next"), read_architecture("/absent", "qwen3.8-27b")
    assert flash.state_bytes_per_layer(2, 4, 3) == 3_268_608 and "3,268,608" in text
    assert flash.hybrid_attention_block(2, 2, 4, 16, 3) == 1600 and "**1600**" in text
    assert flash.hybrid_attention_block(1, 2, 4, 16, 3) == 3200 and "**3200**" in text
    assert dense.state_bytes_per_layer(2, 4, 7) == 3_350_528 and "3,350,528" in text
    assert dense.hybrid_attention_block(2, 2, 4, 16, 7) == 832 and "**832**" in text
    assert flash.kv_bytes_per_token(2) + flash.indexer_bytes_per_token() + flash.mtp_kv_bytes_per_token(2) == 31_232
    assert "31,232 B/token" in text
