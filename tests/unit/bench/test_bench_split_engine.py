"""bench/bench_split_engine.py's pure part: the ratios it reports."""

from bench.bench_split_engine import VARIANTS, ratios


def test_each_split_variant_is_reported_over_the_whole_engine_per_concurrency():
    raw = {
        "whole": {"c1": {"output_throughput": 10.0}, "c8": {"output_throughput": 40.0}},
        "split-own-cores": {"c1": {"output_throughput": 12.0}, "c8": {"output_throughput": 30.0}},
    }
    assert ratios(raw, [1, 8]) == {"split-own-cores_c1_over_whole": 1.2, "split-own-cores_c8_over_whole": 0.75}
    assert ratios({"split-same-core": raw["split-own-cores"]}, [1]) == {}  # no baseline in the run: no ratio


def test_the_variants_put_the_ranks_where_their_names_say():
    assert VARIANTS["whole"][0] is False
    assert VARIANTS["split-same-core"][1] == VARIANTS["split-same-core"][2]
    assert VARIANTS["split-own-cores"][1] != VARIANTS["split-own-cores"][2]
