"""vllm_bridge.compat.release_engine_caches with the installed vLLM: a stopped engine's tokenizer (with the
thread pool of deep copies vLLM wraps it in) is pinned by vLLM's process-wide caches until they are emptied,
the +41 MiB per CPU wake that the on-demand endurance run measured (issue 48)."""

import gc
import weakref
from pathlib import Path

from vllm.tokenizers.registry import cached_get_tokenizer
from vllm.utils.func_utils import _supports_kw, supports_kw

from vllm_bridge.compat import release_engine_caches

MODEL = Path(__file__).resolve().parents[3] / "models" / "SmolLM2-135M-Instruct"


def _tokenizer_used_as_an_engine_does() -> weakref.ref:
    tokenizer = cached_get_tokenizer(str(MODEL))
    # The serving layer asks which keywords the tokenizer's chat template method takes (vllm/renderers/hf.py).
    supports_kw(tokenizer.apply_chat_template, "tools")
    return weakref.ref(tokenizer)


def test_a_stopped_engines_tokenizer_is_freed_once_the_caches_are_emptied():
    assert (MODEL / "tokenizer.json").exists(), f"no chat model at {MODEL}: run `make models`"
    held = _tokenizer_used_as_an_engine_does()
    gc.collect()
    assert held() is not None  # what the leak was: nothing of ours refers to it, vLLM's caches do
    assert _supports_kw.cache_info().currsize > 0 and cached_get_tokenizer.cache_info().currsize > 0
    emptied = release_engine_caches()
    assert emptied == ["vllm.utils.func_utils._supports_kw", "vllm.tokenizers.registry.cached_get_tokenizer"]
    gc.collect()
    assert held() is None
    assert _supports_kw.cache_info().currsize == 0 and cached_get_tokenizer.cache_info().currsize == 0
