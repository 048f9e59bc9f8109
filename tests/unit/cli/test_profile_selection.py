"""One profile argument for every command: command line, else $POOLSERVE_PROFILE, else the CPU default."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from cli.main import app, profile_from_serve_config

ROOT = Path(__file__).resolve().parents[3]
runner = CliRunner()


def _plan_name(*args: str, env: dict | None = None) -> str:
    result = runner.invoke(app, ["plan", *args, "--json"], env=env or {})
    assert result.exit_code == 0, result.output
    return json.loads(result.output)["profile"]


def test_plan_takes_the_profile_from_the_argument_the_environment_or_the_default(monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("POOLSERVE_PROFILE", raising=False)
    assert _plan_name() == "cpu-tiny"
    assert _plan_name(env={"POOLSERVE_PROFILE": "configs/dgx-spark-128.yaml"}) == "dgx-spark-128"
    assert (
        _plan_name("configs/dgx-spark-27b.yaml", env={"POOLSERVE_PROFILE": "configs/dgx-spark-128.yaml"})
        == "dgx-spark-27b"
    )


def test_serve_config_profile_yields_to_the_chosen_one(tmp_path):
    config = tmp_path / "serve.yaml"
    config.write_text(yaml.safe_dump({"applications": [{"args": {"profile": "configs/cpu-tiny.yaml"}}]}))
    assert profile_from_serve_config(config) == tmp_path / "configs/cpu-tiny.yaml"
    chosen = profile_from_serve_config(config, Path("/abs/dgx-spark-128.yaml"))
    assert chosen == Path("/abs/dgx-spark-128.yaml")
    config.write_text(yaml.safe_dump({"applications": [{"name": "poolserve"}]}))  # no args: the CPU default
    assert profile_from_serve_config(config) == tmp_path / "configs/cpu-tiny.yaml"


def test_every_command_that_plans_takes_the_same_profile_argument():
    for command in ("plan", "render", "preflight", "up", "down", "status", "fetch"):
        result = runner.invoke(app, [command, "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0 and "POOLSERVE_PROFILE" in result.output, (command, result.output)


def test_the_app_builder_reads_the_environment_when_serve_yaml_names_no_profile(monkeypatch):
    from deployments.app import AppArgs

    monkeypatch.setenv("POOLSERVE_PROFILE", "configs/dgx-spark-128.yaml")
    assert AppArgs.model_validate({}).profile == "configs/dgx-spark-128.yaml"
    assert AppArgs.model_validate({"profile": "x.yaml"}).profile == "x.yaml"
    monkeypatch.delenv("POOLSERVE_PROFILE")
    assert AppArgs.model_validate({}).profile == "configs/cpu-tiny.yaml"
