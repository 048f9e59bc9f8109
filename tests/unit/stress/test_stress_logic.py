"""The pure parts of `poolserve stress`: layer selection, percentiles, memory drift, sustained clock
drops, the thermal judge, the verdicts and the report, and the thresholds' one source (the profile)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.profile import StressSpec, load_profile
from stress.measure import latency_summary, memory_drift, parse_layers, percentile, sustained_drop
from stress.report import LayerResult, StressReport, render_markdown, write_report
from stress.thermal import judge, sysfs_reader

ROOT = Path(__file__).resolve().parents[3]
MIB = 2**20


@pytest.mark.parametrize(
    "text, layers",
    [
        ("1-7", [1, 2, 3, 4, 5, 6, 7]),
        ("1,3,5", [1, 3, 5]),
        ("2-4,7", [2, 3, 4, 7]),
        (" 6 ", [6]),
        ("3,3,1-2", [1, 2, 3]),
    ],
)
def test_layers_are_read_from_ranges_and_lists(text, layers):
    assert parse_layers(text) == layers


@pytest.mark.parametrize(
    "text, problem",
    [
        ("0-3", "no layer 0"),
        ("8", "no layer 8"),
        ("5-2", "backwards"),
        ("1,,2", "empty item"),
        ("a", "cannot read"),
        ("1-2-3", "cannot read"),
    ],
)
def test_bad_layers_are_refused_with_the_reason(text, problem):
    with pytest.raises(ValueError, match=problem):
        parse_layers(text)


def test_percentiles_interpolate_and_summaries_round():
    values = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert percentile(values, 0.5) == 3.0
    assert percentile(values, 0.95) == pytest.approx(4.8)
    assert percentile([], 0.5) is None
    summary = latency_summary([0.1, 0.2, 0.3])
    assert summary["count"] == 3 and summary["mean_s"] == 0.2 and summary["p50_s"] == 0.2
    assert summary["stdev_s"] == 0.1 and summary["max_s"] == 0.3
    assert latency_summary([]) == {"count": 0}


def test_memory_drift_allows_the_larger_of_the_fraction_and_the_floor():
    # chat: 4 GiB baseline -> 2% is 81.9 MiB, more than the 50 MiB floor; gateway: 500 MiB -> the floor.
    samples = [
        {"chat": 4096 * MIB, "gateway": 500 * MIB},
        {"chat": 4100 * MIB, "gateway": 510 * MIB},
        {"chat": 4170 * MIB, "gateway": 560 * MIB},
        {"chat": 4180 * MIB, "gateway": 570 * MIB},
    ]
    drifts = {d.replica: d for d in memory_drift(samples, 0.02, 50 * MIB, window=1)}
    assert drifts["chat"].allowed_bytes == int(4096 * MIB * 0.02)
    assert drifts["chat"].growth_bytes == 84 * MIB and not drifts["chat"].ok  # 84 > 81.9
    assert drifts["gateway"].allowed_bytes == 50 * MIB
    assert drifts["gateway"].growth_bytes == 70 * MIB and not drifts["gateway"].ok
    assert drifts["gateway"].as_dict()["growth_pct"] == 14.0


def test_memory_drift_uses_medians_so_one_busy_sample_does_not_decide():
    flat = [{"embedder": 400 * MIB}] * 3 + [{"embedder": 520 * MIB}] + [{"embedder": 401 * MIB}] * 3
    (drift,) = memory_drift(flat, 0.02, 50 * MIB)
    assert drift.ok and drift.growth_bytes == 1 * MIB
    shrinking = [{"retriever": 300 * MIB}, {"retriever": 200 * MIB}]
    assert memory_drift(shrinking, 0.02, 50 * MIB)[0].ok  # memory given back is never a fail
    # A replica seen once (it was restarting) has no drift to judge.
    assert [d.replica for d in memory_drift([{"chat": 1}, {"chat": 2, "gateway": 3}], 0.02, 0)] == ["chat"]


def test_a_clock_drop_counts_only_when_sustained():
    steady = [(float(t), 3000.0) for t in range(0, 60, 2)]
    brief = steady[:10] + [(20.0, 2000.0), (22.0, 2000.0)] + steady[12:]
    assert not sustained_drop(brief, 0.15, 30)["sustained"]
    assert sustained_drop(brief, 0.15, 30)["longest_drop_s"] == 2.0
    long_drop = steady[:5] + [(float(t), 2400.0) for t in range(10, 60, 2)]
    drop = sustained_drop(long_drop, 0.15, 30)
    assert drop["sustained"] and drop["reference"] == 3000.0 and drop["lowest"] == 2400.0
    assert not sustained_drop(steady[:3], 0.15, 30)["sustained"]  # too few samples to judge


def test_the_thermal_judge_reads_clocks_temperatures_and_nvml_reasons():
    samples = [
        (
            float(t),
            {
                "gpu0_sm_mhz": 2400.0 if t < 10 else 1500.0,
                "gpu0_temp_c": 60.0 + t / 2,
                "gpu0_slowdown_bits": 0x40 if t >= 10 else 0,
            },
        )
        for t in range(0, 60, 2)
    ]
    figures, checks = judge(samples, 0.15, 30, max_temperature_c=90)
    verdicts = {name: ok for name, ok, _ in checks}
    assert verdicts == {"gpu0_sm_mhz no sustained drop": False, "gpu0_temp_c <= 90 C": True}
    assert figures["gpu0_slowdown_bits"]["reasons"] == ["hw_thermal"]
    assert figures["gpu0_temp_c"]["max"] == 89.0


def test_sysfs_reader_reads_cpufreq_and_thermal_zones_or_says_why_not(tmp_path):
    reader, reason = sysfs_reader(tmp_path)
    assert reader is None and "no " in reason
    freq = tmp_path / "devices/system/cpu/cpu0/cpufreq/scaling_cur_freq"
    zone = tmp_path / "class/thermal/thermal_zone0/temp"
    for path, value in ((freq, "2400000"), (zone, "55000")):
        path.parent.mkdir(parents=True)
        path.write_text(value + "\n")
    reader, reason = sysfs_reader(tmp_path)
    assert reader() == {"cpu0_mhz": 2400.0, "thermal_zone0_temp_c": 55.0}
    assert "1 cpufreq, 1 thermal zones" in reason


def test_verdicts_follow_the_checks_and_the_report_renders_every_layer(tmp_path):
    good, bad, blind = LayerResult.start(1), LayerResult.start(3), LayerResult.start(6)
    good.check("chat answered", True)
    bad.check("no client timeouts", False, "2")
    blind.verdict = "not measurable"
    bad.figures["per route"] = {"chat": {"requests": 3, "p95_s": 1.5}}
    for layer in (good, bad, blind):
        layer.settle()
    assert (good.verdict, bad.verdict, blind.verdict) == ("pass", "fail", "not measurable")
    assert LayerResult.start(2).settle().verdict == "fail"  # a layer that checked nothing has not passed
    report = StressReport(
        profile="cpu-tiny",
        base_url="http://127.0.0.1:8000",
        quick=True,
        started_utc="t0",
        layers=[good, bad, blind],
        notes=["shared machine"],
    )
    assert not report.passed
    markdown = render_markdown(report)
    assert "| 3. high concurrency | **fail** |" in markdown and "| no client timeouts | **FAIL** | 2 |" in markdown
    assert "| chat | 3 | 1.5 |" in markdown and "- shared machine" in markdown
    json_path, md_path = write_report(report, tmp_path / "out")
    assert json.loads(json_path.read_text())["layers"][1]["verdict"] == "fail"
    assert md_path.read_text() == markdown


def test_thresholds_come_from_the_profile_with_defaults_and_spark_values():
    default = load_profile(ROOT / "configs" / "cpu-tiny.yaml").stress
    assert default == StressSpec()
    assert default.memory_drift_fraction == 0.02 and default.memory_drift_bytes == 50 * MIB
    for name in ("dgx-spark.yaml", "dgx-spark-128.yaml", "dgx-spark-27b.yaml", "dgx-spark-27b-plus-small.yaml"):
        spark = load_profile(ROOT / "configs" / name)
        assert "stress" in spark.model_fields_set, f"{name} sets no stress thresholds"
        assert spark.stress.max_temperature_c is not None  # a GPU machine is judged on temperature too
    with pytest.raises(ValueError, match="short_prompt_tokens"):
        StressSpec(short_prompt_tokens=600)  # a short prompt is under 512 tokens


def test_stress_signals_the_launcher_only_while_it_is_the_parent_of_a_marked_process():
    from stress.stack import launches_stack

    parents = {101: 50, 102: 101}  # 101: `serve run` (child of the launcher 50); 102: a raylet worker
    assert launches_stack(50, [101, 102], parents.get)
    # A stale stack.yaml: the stack is gone (nothing marked), or its pid now belongs to someone else.
    assert not launches_stack(50, [], parents.get)
    assert not launches_stack(77, [101, 102], parents.get)


def test_memory_drift_allows_what_the_plan_lets_each_replica_grow():
    # The plan's growth line (budget - at-rest) decides; a replica it gives no growth falls back.
    samples = [
        {"chat": 4096 * MIB, "embedder": 400 * MIB, "gateway": 500 * MIB},
        {"chat": 4240 * MIB, "embedder": 560 * MIB, "gateway": 560 * MIB},
    ]
    drifts = {
        d.replica: d
        for d in memory_drift(
            samples, 0.02, 50 * MIB, window=1, planned_growth={"chat": 160 * MIB, "embedder": 144 * MIB, "gateway": 0}
        )
    }
    assert drifts["chat"].allowed_bytes == 160 * MIB and drifts["chat"].ok  # +144 MiB within the plan's 160
    assert drifts["embedder"].allowed_bytes == 144 * MIB and not drifts["embedder"].ok  # +160 over 144
    assert drifts["gateway"].allowed_bytes == 50 * MIB and not drifts["gateway"].ok  # no planned growth: the floor


def test_growth_budgets_come_from_status():
    from stress.client import Admin

    class FakeAdmin(Admin):
        def __init__(self):
            pass

        def status(self):
            return {
                "replicas": [
                    {"name": "chat", "planned_bytes": 1000, "planned_at_rest_bytes": 840},
                    {"name": "old", "measured_bytes": 5},
                ]
            }

    assert FakeAdmin().replica_growth_budgets() == {"chat": 160}


def test_a_request_cut_by_a_later_kill_is_that_kills_not_the_earlier_replicas():
    from types import SimpleNamespace

    from stress.recovery import in_flight_at

    # Sent 2 s after the retriever was killed (t=100), still running when the gateway was killed (t=110).
    request = SimpleNamespace(started=102.0, seconds=9.0)
    assert in_flight_at(request, 110.0) and not in_flight_at(request, 100.0)
    assert not in_flight_at(request, 102.0) and not in_flight_at(request, 111.0)


def test_the_stack_is_reachable_once_a_429_is_waited_out():
    import httpx

    from stress.client import Admin

    answers = iter(
        [
            httpx.Response(429, headers={"retry-after": "0"}),
            httpx.Response(429, headers={"retry-after": "0"}),
            httpx.Response(200),
        ]
    )
    admin = Admin.__new__(Admin)
    admin.http = httpx.Client(base_url="http://stack", transport=httpx.MockTransport(lambda request: next(answers)))
    assert admin.reachable(timeout_s=5)
    admin.http = httpx.Client(
        base_url="http://stack", transport=httpx.MockTransport(lambda request: httpx.Response(503))
    )
    assert not admin.reachable(timeout_s=5)
