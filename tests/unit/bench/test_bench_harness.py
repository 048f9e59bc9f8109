"""The pure parts of the benchmark harness (bench/harness/): percentiles, the result format, engine
arguments from the plan with overrides, the serving load's command line, the report's marked tables."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench.harness.engine import SPECULATION, apply_overrides, cli_flags, engine_setup, raw_vllm_command
from bench.harness.results import FORMAT_VERSION, BenchResult, new_result, read_result, write_result
from bench.harness.serving import ServingLoad, scalar_metrics, serving_argv
from bench.harness.timing import best_of, percentile, summarize, time_each
from bench.report import render_docs
from planner.plan import build_plan
from planner.profile import load_profile

ROOT = Path(__file__).resolve().parents[3]
PROFILE = ROOT / "configs" / "cpu-tiny.yaml"
GiB = 2**30


# ---- timing ------------------------------------------------------------------------------------
@pytest.mark.parametrize("q", [0, 1, 25, 50, 90, 95, 99, 99.9, 100])
def test_percentile_matches_numpy_linear(q):
    values = [0.31, 7.0, 2.5, 2.5, 11.2, 0.02, 5.5, 3.3, 9.9, 1.0, 4.4]
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentile_of_one_value_and_unsorted_input():
    assert percentile([4.0], 99) == 4.0
    assert percentile([3, 1, 2], 50) == 2


def test_percentile_refuses_nothing_and_out_of_range():
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_summarize_names_percentiles():
    summary = summarize([1.0, 2.0, 3.0, 4.0], percentiles=(50, 99.9))
    assert summary == {"n": 4, "mean": 2.5, "min": 1.0, "max": 4.0, "p50": 2.5, "p99.9": pytest.approx(3.997)}


def test_time_each_warms_up_untimed_and_returns_results():
    calls = []
    seconds, results = time_each(lambda x: calls.append(x) or x * 2, [1, 2, 3], warmup=2)
    assert calls == [1, 2, 1, 2, 3] and results == [2, 4, 6] and len(seconds) == 3


def test_best_of_returns_the_fastest_and_the_last_result():
    runs = []
    best, result = best_of(lambda: runs.append(1) or len(runs), repeats=3, warmup=1)
    assert len(runs) == 4 and result == 4 and best >= 0


# ---- results -----------------------------------------------------------------------------------
def test_result_round_trips_through_its_file(tmp_path):
    result = new_result(
        "retrieval",
        {"sizes": [2000]},
        {"p50": np.float64(0.5)},
        [{"n": np.int64(2000), "path": "store", "p50": 0.25}],
        command=["bench/x.py"],
    )
    path = write_result(result, tmp_path)
    assert path == tmp_path / "retrieval.json"
    data = json.loads(path.read_text())
    assert data["format"] == FORMAT_VERSION
    assert set(data) == {"format", "name", "commit", "machine", "date", "command", "config", "metrics", "rows"}
    loaded = read_result(path)
    assert loaded == BenchResult(
        **{**result.__dict__, "metrics": {"p50": 0.5}, "rows": [{"n": 2000, "path": "store", "p50": 0.25}]}
    )
    assert loaded.command == ["bench/x.py"] and loaded.date.endswith("Z") and loaded.machine["logical_cpus"] >= 1


def test_result_rejects_another_format(tmp_path):
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"script": "bench/bench_gpu_embedder.py", "variants": {}}))
    with pytest.raises(ValueError, match="format"):
        read_result(path)
    path.write_text(json.dumps({"format": FORMAT_VERSION, "name": "x"}))
    with pytest.raises(ValueError, match="lacks"):
        read_result(path)


def test_legacy_list_of_runs_loads_as_rows(tmp_path):
    path = tmp_path / "speculative.json"
    path.write_text(json.dumps([{"method": "none", "results": []}]))
    loaded = read_result(path)
    assert loaded.name == "speculative" and loaded.rows == [{"method": "none", "results": []}]


def test_unknown_values_are_not_silently_stringified(tmp_path):
    with pytest.raises(TypeError):
        write_result(new_result("x", {"bad": object()}, {}, []), tmp_path)


# ---- engine arguments from the plan --------------------------------------------------------------
def test_engine_setup_is_the_plans_chat_replica():
    plan = build_plan(load_profile(PROFILE), 24 * GiB).replica("chat")
    setup = engine_setup(PROFILE, pool_total_bytes=24 * GiB)
    assert setup.args == plan.vllm and setup.env == plan.env
    assert setup.served_model_name == "smollm2-135m-instruct" and setup.model.endswith("SmolLM2-135M-Instruct")
    assert setup.llm_kwargs(seed=0) == {"model": setup.model, **plan.vllm.as_dict(), "seed": 0}


def test_overrides_replace_only_the_named_arguments():
    plan = build_plan(load_profile(PROFILE), 24 * GiB).replica("chat").vllm
    setup = engine_setup(
        PROFILE,
        {"enforce_eager": False, "speculative_config": SPECULATION["draft_model"]},
        env_overrides={"OMP_NUM_THREADS": "2"},
        pool_total_bytes=24 * GiB,
    )
    assert setup.args.enforce_eager is False
    assert setup.args.speculative_config["method"] == "draft_model"
    untouched = {k: v for k, v in plan.as_dict().items() if k not in ("enforce_eager", "speculative_config")}
    assert {k: setup.args.as_dict()[k] for k in untouched} == untouched
    assert setup.env["OMP_NUM_THREADS"] == "2"


def test_none_unsets_an_argument_and_a_typo_is_an_error():
    args = build_plan(load_profile(PROFILE), 24 * GiB).replica("chat").vllm
    assert "speculative_config" not in apply_overrides(args, {"speculative_config": None}).as_dict()
    with pytest.raises(ValueError, match="enforce_eagr"):
        apply_overrides(args, {"enforce_eagr": True})
    with pytest.raises(ValueError):  # validated by EngineArgs itself
        apply_overrides(args, {"max_model_len": "long"})


def test_cli_flags_spell_booleans_and_dicts_as_vllm_reads_them():
    flags = cli_flags(
        {
            "enforce_eager": True,
            "enable_prefix_caching": False,
            "max_model_len": 4096,
            "speculative_config": {"method": "ngram"},
        }
    )
    assert flags == [
        "--enforce-eager",
        "--no-enable-prefix-caching",
        "--max-model-len",
        "4096",
        "--speculative-config",
        '{"method": "ngram"}',
    ]


def test_raw_vllm_command_uses_the_module_not_the_cli():
    setup = engine_setup(PROFILE, pool_total_bytes=24 * GiB)
    command = raw_vllm_command(setup, 8123, python="python")
    assert command[:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    assert command[command.index("--port") + 1] == "8123"
    assert command[command.index("--served-model-name") + 1] == setup.served_model_name
    assert command[command.index("--kv-cache-memory-bytes") + 1] == str(setup.args.kv_cache_memory_bytes)


# ---- serving load ------------------------------------------------------------------------------
def test_serving_argv_is_a_greedy_capped_chat_load():
    argv = serving_argv("http://127.0.0.1:9", "m", "/models/m", ServingLoad(4, 2, 64, 16), api_key="ps_x")
    pairs = dict(zip(argv[::2], argv[1::2]))
    assert pairs["--backend"] == "openai-chat" and pairs["--endpoint"] == "/v1/chat/completions"
    assert pairs["--max-concurrency"] == "2" and pairs["--num-prompts"] == "4" and pairs["--temperature"] == "0"
    assert pairs["--random-input-len"] == "64" and pairs["--random-output-len"] == "16"
    assert argv[argv.index("--header") + 1] == "Authorization=Bearer ps_x"
    assert "--header" not in serving_argv("http://127.0.0.1:9", "m", "/models/m", ServingLoad(4, 2))


def test_scalar_metrics_drop_per_request_lists():
    assert scalar_metrics({"output_throughput": 20.5, "completed": 4, "ttfts": [0.1], "goodput": None}) == {
        "output_throughput": 20.5,
        "completed": 4,
        "goodput": None,
    }


# ---- report ------------------------------------------------------------------------------------
def test_report_replaces_only_marked_tables_with_results():
    limits = new_result(
        "limits",
        {"rounds": 10},
        {"median_ratio_shared_vs_old": 20.0},
        [
            {"path": "shared SQLite limiter", "rounds": 10, "median_us": 80.0, "p99_us": 900.0},
            {"path": "in-process limits (old)", "rounds": 10, "median_us": 4.0, "p99_us": 9.0},
        ],
    )
    text = (
        "# x\nkept\n<!-- bench-report:smoke/limits -->\nold\n<!-- /bench-report:smoke/limits -->\n"
        "<!-- bench-report:serving -->\nstale\n<!-- /bench-report:serving -->\ntail\n"
    )
    updated, missing = render_docs(text, {"smoke/limits": (limits, Path("limits.json"))})
    assert missing == ["serving"]
    assert (
        "\nold\n" not in updated
        and "| 10 | median 80.0 µs, p99 900.0 µs | n/a | median 4.0 µs, p99 9.0 µs | "
        "nanx | 20.0x |\n<!-- /bench-report:smoke/limits -->"
        in updated
    )  # a result from before the 4-step row
    assert updated.startswith("# x\nkept\n") and "stale" in updated and updated.endswith("tail\n")
    assert render_docs(updated, {"smoke/limits": (limits, Path("limits.json"))})[0] == updated


def test_spec_counters_sum_label_sets_of_raw_vllm_and_ray():
    from bench.harness.spec_metrics import SpecCounters, parse_counters

    raw = (
        "# HELP vllm:spec_decode_num_drafts_total Number of drafts.\n"
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0\n'
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 40.0\n'
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 26.0\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 9.0\n'
    )
    assert parse_counters(raw) == SpecCounters(10, 40, 26)
    ray = (
        'ray_vllm_spec_decode_num_drafts_total{ReplicaId="a",engine="0"} 4.0\n'
        'ray_vllm_spec_decode_num_drafts_total{ReplicaId="b",engine="0"} 6.0\n'
        'ray_vllm_spec_decode_num_draft_tokens_total{ReplicaId="a"} 40.0\n'
        'ray_vllm_spec_decode_num_accepted_tokens_total{ReplicaId="a"} 20.0\n'
    )
    counters = parse_counters(ray)
    assert counters == SpecCounters(10, 40, 20)
    stats = counters.minus(SpecCounters(5, 20, 5)).stats()
    assert stats["acceptance_rate"] == 75.0 and stats["acceptance_length"] == 4.0
    assert parse_counters("vllm:num_requests_running 1\n") is None
    assert SpecCounters().stats() is None


def test_cpu_roles_name_the_stack_and_vllm_processes():
    from bench.harness.cpu_accounting import role_of

    assert role_of("ray::ServeReplica:poolserve:PoolserveLLMServer:chat", "python") == "LLMServer replica"
    assert role_of("ray::ServeReplica:poolserve:gateway", "python") == "gateway replica"
    assert role_of("ray::ProxyActor", "python") == "Serve proxy"
    assert role_of("VLLM::EngineCore", "python") == "vLLM EngineCore"
    assert role_of("python -m vllm.entrypoints.openai.api_server --model m", "python") == "vLLM API server"
    # The plan's CPU engine names its worker class on the server's command line.
    assert (
        role_of(
            "python -m vllm.entrypoints.openai.api_server --model m --worker-cls "
            "vllm_bridge.cpu_worker.StepThreadsCPUWorker",
            "python",
        )
        == "vLLM API server"
    )
    assert role_of("VLLM::Worker", "python") == "vLLM worker"
    assert role_of("something-else", "proc") == "proc"


def test_rag_prompts_are_deterministic_and_hold_their_answer():
    import json
    import re

    from bench.harness.prompts import QUESTIONS, chat_prompts, rag_prompts

    first, again = rag_prompts(6, seed=3), rag_prompts(6, seed=3)
    assert first == again and rag_prompts(6, seed=4) != first
    questions = {q["question"]: q for q in json.loads(QUESTIONS.read_text())["questions"]}
    for prompt in first:
        question = prompt.rsplit("Question: ", 1)[1]
        assert all(f"\n[{i}] " in prompt for i in (1, 2, 3)) and "\n[4] " not in prompt
        assert re.search(questions[question]["evidence"], prompt), "the passage that answers it is there"
    assert all(prompt in questions for prompt in chat_prompts(4))


def test_prompt_files_are_sharegpt_for_the_load_generator(tmp_path):
    import json

    from bench.harness.prompts import write_prompts

    rows = json.loads(write_prompts(tmp_path / "rag.json", "rag", 3).read_text())
    assert len(rows) == 3 and [turn["from"] for turn in rows[0]["conversations"]] == ["human", "gpt"]


def test_retrieval_bench_runs_at_a_tiny_size_with_exact_recall_on_flat():
    from bench import bench_retrieval

    result = bench_retrieval.run(sizes=[200], kinds=["flat", "hnsw"], n_queries=12, seed=0)
    flat = [r for r in result.rows if r["kind"] == "flat"]
    assert {r["path"] for r in flat} == {"faiss", "store"} and all(r["recall"] == 1.0 for r in flat)
    assert all(0.0 < r["recall"] <= 1.0 for r in result.rows)
    assert "| 200 |" in bench_retrieval.tables(result)


def test_limits_bench_runs_both_paths_for_a_few_rounds():
    from bench import bench_limits

    result = bench_limits.run(20)
    assert [r["rounds"] for r in result.rows] == [20, 20, 20] and all(r["median_us"] > 0 for r in result.rows)
    assert "| 20 |" in bench_limits.tables(result)


def test_a_result_worker_returns_its_result_line_or_stops_with_its_log(tmp_path):
    import sys

    from bench.harness.procs import run_result_worker

    ok = run_result_worker(
        [sys.executable, "-c", "print('noise'); print('RESULT {\"tok_s\": 1.5}')"], {}, tmp_path / "ok.log", 60, "ok"
    )
    assert ok == {"tok_s": 1.5}
    with pytest.raises(SystemExit, match="broken failed; log .*broken.log:\n.*no result here"):
        run_result_worker([sys.executable, "-c", "print('no result here')"], {}, tmp_path / "broken.log", 60, "broken")


def test_server_timing_header_parts_are_read_in_milliseconds():
    from bench.harness.first_token import server_timing
    from rag.retrieval.pipeline import IngestTimings

    timings = IngestTimings(chunk=0.25, embed=1.5, embedder_busy=1.25)
    parts = server_timing(timings.server_timing())
    assert parts == {
        "extract": 0.0,
        "chunk": 250.0,
        "embed": 1500.0,
        "embedder_busy": 1250.0,
        "embedder_cleanup": 0.0,
        "charge": 0.0,
        "store": 0.0,
    }
    assert server_timing("") == {} and server_timing("db;desc=x, app;dur=2.5") == {"app": 2.5}
