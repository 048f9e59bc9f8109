"""`dtype: auto` on a CPU pool follows what the host computes natively."""

from pathlib import Path

from planner.plan import build_plan
from planner.profile import load_profile
from system.cpuinfo import cpu_flags, cpu_has_native_bf16

ROOT = Path(__file__).resolve().parents[3]
EPYC_AVX2 = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx fma avx2\n"
SAPPHIRE = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
GRACE = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"


def test_flags_are_read_from_x86_and_arm_cpuinfo(tmp_path):
    assert {"avx2", "fma"} <= cpu_flags(EPYC_AVX2)
    assert "bf16" in cpu_flags(GRACE)
    for text, native in ((EPYC_AVX2, False), (SAPPHIRE, True), (GRACE, True), ("", False)):
        path = tmp_path / "cpuinfo"
        path.write_text(text)
        assert cpu_has_native_bf16(str(path)) is native
    assert cpu_has_native_bf16(str(tmp_path / "missing")) is False


def test_auto_is_float32_on_an_emulating_cpu_and_bfloat16_on_a_native_one():
    profile = load_profile(ROOT / "configs/cpu-tiny.yaml")
    assert profile.chat.dtype == "auto"
    emulated = build_plan(profile, 24 << 30, cpu_native_bf16=False)
    native = build_plan(profile, 24 << 30, cpu_native_bf16=True)
    assert emulated.replica("chat").vllm.dtype == "float32"
    assert native.replica("chat").vllm.dtype == "bfloat16"
    # float32 weights are twice bf16's, and the plan counts them so
    assert (
        emulated.replica("chat").breakdown["weights.mlp (float32)"]
        > 1.9 * native.replica("chat").breakdown["weights.mlp (bfloat16)"]
    )


def test_the_dtype_benchmark_summarizes_ratios_per_prompt_length():
    from bench.bench_cpu_dtype import AGREEMENT_TOKENS, first_difference, summarize

    def row(seconds, c1, b8, greedy):
        prefill = [
            {"doc": d, "length": n, "tokens": n + 20, "seconds": seconds * n / 1000}
            for d in range(3)
            for n in (256, 2000)
        ]
        return {"init_s": 20.0, "prefill": prefill, "tok_s_c1": c1, "tok_s_batch8": b8, "greedy": greedy}

    same = list(range(AGREEMENT_TOKENS))
    other = same[:5] + [999] * (AGREEMENT_TOKENS - 5)
    summary = summarize(
        {"bfloat16": row(30.0, 11.0, 20.0, [same, same]), "float32": row(6.0, 9.9, 50.0, [same, other])}
    )
    ratios = summary["float32_over_bfloat16"]
    assert abs(ratios["prefill_2000"] - 5.0) < 1e-9 and abs(ratios["prefill_256"] - 5.0) < 1e-9
    assert abs(ratios["tok_s_batch8"] - 2.5) < 1e-9 and abs(ratios["tok_s_c1"] - 0.9) < 1e-9
    assert summary["float32"]["prefill"]["2000"]["prompts"] == 3
    assert summary["greedy_agreement"] == {"prompts": 2, "identical": 1, "first_difference_mean": (32 + 5) / 2}
    assert first_difference([1, 2, 3], [1, 2]) == 2
