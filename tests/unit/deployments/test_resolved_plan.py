"""One resolved plan: what `poolserve up` preflighted is what build_app deploys."""

from pathlib import Path

import pytest
import yaml

from planner.plan import PlanError, build_plan, profile_digest, resolved_plan
from planner.profile import load_profile
from stackctl.launcher import resolved_serve_config

ROOT = Path(__file__).resolve().parents[3]
PROFILE = ROOT / "configs/cpu-tiny.yaml"


def test_a_handed_plan_is_deployed_as_it_is_and_none_plans_at_start():
    profile = load_profile(PROFILE)
    plan = build_plan(profile, 20 << 30)
    handed = plan.model_dump(mode="json")
    handed["replicas"][0]["planned_bytes"] += 12345  # a number only the handed plan has
    used = resolved_plan(profile, handed)
    assert used.replicas[0].planned_bytes == plan.replicas[0].planned_bytes + 12345
    assert resolved_plan(profile, None).profile_digest == profile_digest(profile)


def test_a_plan_for_another_version_of_the_profile_is_refused():
    profile = load_profile(PROFILE)
    handed = build_plan(profile, 20 << 30).model_dump(mode="json")
    changed = profile.model_copy(update={"chat": profile.chat.model_copy(update={"max_num_seqs": 4})})
    with pytest.raises(PlanError, match="another version of profile cpu-tiny"):
        resolved_plan(changed, handed)


def test_up_writes_the_preflighted_plan_into_the_serve_config_it_runs():
    profile = load_profile(PROFILE)
    plan = build_plan(profile, 20 << 30)
    serve = yaml.safe_load((ROOT / "serve.yaml").read_text())
    args = resolved_serve_config(serve, profile, PROFILE, plan=plan)["applications"][0]["args"]
    assert resolved_plan(profile, args["plan"]) == plan
    assert "plan" not in resolved_serve_config(serve, profile, PROFILE)["applications"][0]["args"]


def test_app_args_name_an_unknown_key():
    from deployments.app import AppArgs

    with pytest.raises(ValueError, match="resolved_plan"):
        AppArgs.model_validate({"profile": str(PROFILE), "resolved_plan": {}})
