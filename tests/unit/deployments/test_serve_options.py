"""Ray Serve's options of every replica come from the profile through the plan: none typed in deployments/."""

from __future__ import annotations

from pathlib import Path

from deployments.chat import llm_config_from_plan, replica_settings
from planner.plan import build_plan
from planner.profile import ServeSpec, load_profile


def test_each_replica_gets_its_sections_serve_options_and_render_writes_them():
    profile = load_profile("configs/cpu-tiny.yaml")
    profile.gateway.serve = ServeSpec(max_ongoing_requests=100, health_check_timeout_s=45)
    profile.embedder.serve = ServeSpec(max_ongoing_requests=8)
    plan = build_plan(profile)
    gateway, embedder, chat = plan.replica("gateway"), plan.replica("embedder"), plan.replica("chat")
    assert gateway.serve_options()["max_ongoing_requests"] == 100
    assert (
        gateway.serve_options()["health_check_timeout_s"] == 45
        and gateway.serve_options()["health_check_period_s"] == 10
    )
    assert embedder.serve_options()["max_ongoing_requests"] == 8
    assert plan.replica("retriever").serve_options()["max_ongoing_requests"] == 64  # the default
    config = llm_config_from_plan(profile.chat, chat, [])
    assert config.deployment_config["max_ongoing_requests"] == 256
    assert config.deployment_config["health_check_timeout_s"] == 60  # an engine in a long prefill answers late

    from cli.main import serve_config

    rendered = {
        d["name"]: d for d in serve_config(plan, Path("configs/cpu-tiny.yaml"))["applications"][0]["deployments"]
    }
    assert rendered["gateway"]["max_ongoing_requests"] == 100
    assert rendered["PoolserveLLMServer:chat"]["health_check_timeout_s"] == 60


def test_start_wait_and_gateway_timeouts_come_from_the_profile_not_the_code():
    profile = load_profile("configs/cpu-tiny.yaml")
    profile.chat.serve = ServeSpec(max_ongoing_requests=256, start_wait_timeout_s=600)
    profile.gateway.health_timeout_s, profile.gateway.healthy_ttl_s = 7.5, 0.5
    profile.gateway.dashboard_refresh_s, profile.gateway.dashboard_history_sample_s = 9, 30
    plan = build_plan(profile)
    settings = plan.gateway
    assert (settings.health_timeout_s, settings.healthy_ttl_s) == (7.5, 0.5)
    assert (settings.dashboard_refresh_s, settings.dashboard_history_sample_s) == (9, 30)
    assert settings.dashboard_measure_timeout_s == profile.gateway.dashboard_measure_timeout_s
    config = llm_config_from_plan(profile.chat, plan.replica("chat"), [("before", "check_health")])
    assert replica_settings(config).start_wait_timeout_s == 600
    assert replica_settings(config).start_after == [("before", "check_health")]
    # poolserve's own wait is not a Ray Serve option: Ray would refuse an unknown deployment field
    assert "start_wait_timeout_s" not in config.deployment_config
    assert "start_wait_timeout_s" not in plan.replica("embedder").serve_options()


def test_the_chat_replicas_settings_survive_a_copy_of_its_config_through_a_dict():
    from ray.llm._internal.serve.core.configs.llm_config import LLMConfig

    profile = load_profile("configs/cpu-tiny.yaml")
    config = llm_config_from_plan(profile.chat, build_plan(profile).replica("chat"), [("before", "check_health")])
    copied = LLMConfig.model_validate(config.model_dump())
    assert replica_settings(copied) == replica_settings(config)
    assert replica_settings(copied).start_after == [("before", "check_health")]
