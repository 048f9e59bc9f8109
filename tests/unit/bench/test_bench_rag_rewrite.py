"""The pure helpers of bench/bench_rag_rewrite.py: no model, no store."""

import math

from bench.bench_rag_rewrite import clean_rewrite, latency_summary, model_order, rrf_order, word_logprob, yes_no_score


def test_yes_no_score_sums_the_variants_of_each_word():
    top = {"Yes": math.log(0.3), " yes": math.log(0.2), "No": math.log(0.25), "The": math.log(0.1)}
    assert math.isclose(yes_no_score(top), math.log(0.5) - math.log(0.25))


def test_a_word_missing_from_the_top_logprobs_gets_the_lowest_listed():
    top = {"Yes": -0.1, "The": -3.0, "A": -5.0}
    assert word_logprob(top, ("no", "No")) == -5.0
    assert yes_no_score(top) == -0.1 - -5.0
    assert word_logprob({}, ("yes",)) == -math.inf


def test_model_order_is_by_score_and_ties_keep_the_retrieval_order():
    assert model_order([0.0, 2.0, 2.0, -1.0]) == [1, 2, 0, 3]


def test_rrf_order_fuses_retrieval_and_model_ranks():
    # the model puts the last of three first; fused with the retrieval ranks it moves up, but the
    # retrieval's first, second in the model's order, stays ahead (1/61 + 1/62 > 1/63 + 1/61)
    assert rrf_order([1.0, 0.0, 5.0]) == [0, 2, 1]
    assert rrf_order([3.0, 2.0, 1.0]) == [0, 1, 2]


def test_clean_rewrite_drops_markup_and_newlines():
    assert clean_rewrite("**PRAGMA**, journal\n- WAL # mode") == "PRAGMA , journal - WAL mode"


def test_latency_summary():
    s = latency_summary([0.1, 0.2, 0.3, 0.4])
    assert s["p50_ms"] == 250.0 and s["p90_ms"] == 400.0 and s["questions"] == 4
    assert latency_summary([]) == {}
