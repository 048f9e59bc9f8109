"""`dtype: auto` on a CPU pool follows what the host computes natively."""

from pathlib import Path

from planner.plan import build_plan
from planner.profile import load_profile
from stackctl.cpuinfo import cpu_flags, cpu_has_native_bf16

ROOT = Path(__file__).resolve().parents[2]
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
    assert emulated.replica("chat").breakdown["weights.mlp (float32)"] > 1.9 * native.replica("chat").breakdown["weights.mlp (bfloat16)"]
