"""bench/bench_chat_threads.py's pure parts: the env a variant runs with and the ratios it reports."""

import os

from bench.bench_chat_threads import summarize, thread_env


def test_one_thread_keeps_vllms_auto_bind_and_more_bind_that_many_cores():
    assert thread_env(1)["VLLM_CPU_OMP_THREADS_BIND"] == "auto"
    if len(os.sched_getaffinity(0)) >= 2:
        env = thread_env(2)
        assert env["OMP_NUM_THREADS"] == "2" and len(env["VLLM_CPU_OMP_THREADS_BIND"].split(",")) == 2


def test_each_variant_is_compared_with_one_thread_in_the_same_condition():
    def raw(c1, prefill_s):
        return {
            "tok_s_c1": c1,
            "tok_s_batch8": 4 * c1,
            "prefill": [{"length": 256, "tokens": 260, "seconds": prefill_s}],
        }

    summary = summarize(
        {
            "omp1-idle": raw(10.0, 1.0),
            "omp2-idle": raw(15.0, 0.5),
            "omp1-busy": raw(8.0, 1.0),
            "omp2-busy": raw(6.0, 0.8),
        }
    )
    assert "vs_omp1" not in summary["omp1-idle"]
    assert summary["omp2-idle"]["vs_omp1"] == {"tok_s_c1": 1.5, "tok_s_batch8": 1.5, "prefill_256_tok_s": 2.0}
    assert summary["omp2-busy"]["vs_omp1"]["tok_s_c1"] == 0.75
