"""ray.serve.llm's node-initialization step: skipped for a model on local disk, kept for remote sources."""

from __future__ import annotations

import asyncio

import pytest

from deployments.chat import llm_config_from_plan
from vllm_bridge.compat import LocalModelNodeInit, LLMConfig
from planner.plan import build_plan
from planner.profile import load_profile


def run_init_node_after_callback(source: str, mirror: dict | None = None) -> bool:
    loading = {"model_id": "m", "model_source": source}
    if mirror:
        loading["model_source"] = mirror
    config = LLMConfig(model_loading_config=loading)
    callback = LocalModelNodeInit(llm_config=config)  # no placement group: nothing here starts Ray
    asyncio.run(callback.run_callback("on_before_node_init"))
    return callback.ctx.run_init_node


@pytest.mark.parametrize("source", ["/models/SmolLM2-135M-Instruct", "models/relative", "Qwen/Qwen3.8-27B"])
def test_local_paths_and_hub_ids_skip_the_download_task(source):
    # a hub id without a mirror is not downloaded by that task either (download_model_files returns it)
    assert run_init_node_after_callback(source) is False


@pytest.mark.parametrize("source", ["s3://bucket/model", "gs://bucket/model"])
def test_remote_sources_keep_the_download_task(source):
    assert run_init_node_after_callback(source) is True


def test_remote_mirror_keeps_the_download_task():
    assert run_init_node_after_callback("", mirror={"bucket_uri": "s3://bucket/model"}) is True


def test_the_plans_chat_config_carries_the_callback():
    profile = load_profile("configs/cpu-tiny.yaml")
    plan = build_plan(profile)
    config = llm_config_from_plan(profile.chat, plan.replica("chat"), [])
    assert config.callback_config.callback_class is LocalModelNodeInit
