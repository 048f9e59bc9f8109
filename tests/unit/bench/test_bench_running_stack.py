"""bench/run.py smoke --stack: finding a running stack from its serve.yaml (no stack needed here), and
scripts/uv_args.sh, which hands pip's configured sources to uv (`make install`)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from bench.harness.procs import ServerFailed
from bench.harness.stack import running_stack
from stackctl.launcher import StackLayout

ROOT = Path(__file__).resolve().parents[3]


def _stack_files(tmp_path: Path, route_prefix: str = "/", launched: bool = True) -> Path:
    state = tmp_path / "state"
    profile = tmp_path / "profile.yaml"
    profile.write_text(yaml.safe_dump({"state_dir": str(state)}))
    serve = tmp_path / "serve.yaml"
    serve.write_text(
        yaml.safe_dump(
            {
                "http_options": {"port": 1},
                "applications": [
                    {"name": "poolserve", "route_prefix": route_prefix, "args": {"profile": str(profile)}}
                ],
            }
        )
    )
    if launched:
        layout = StackLayout(state)
        layout.run_dir.mkdir(parents=True)
        (layout.run_dir / "stack.yaml").write_text(
            yaml.safe_dump({"gateway": "http://127.0.0.1:43210", "ray_metrics": "http://127.0.0.1:5000/metrics"})
        )
    return serve


@pytest.mark.parametrize("prefix, url", [("/", "http://127.0.0.1:43210"), ("/api/", "http://127.0.0.1:43210/api")])
def test_a_running_stack_is_found_where_its_launcher_says_under_its_prefix(tmp_path, prefix, url):
    server, profile = running_stack(_stack_files(tmp_path, prefix), "key")
    assert (server.base_url, server.api_key, server.start_s) == (url, "key", 0.0)
    assert server.metrics_url == "http://127.0.0.1:5000/metrics"
    assert profile == tmp_path / "profile.yaml"
    assert server.pids() == []  # found by the stack's marker: no process carries this one


def test_a_stack_that_is_not_running_is_an_error_naming_it(tmp_path):
    with pytest.raises(ServerFailed, match="no running stack"):
        running_stack(_stack_files(tmp_path, launched=False), "key")


def _uv_args(tmp_path: Path, config_list: str, env: dict | None = None) -> str:
    fake_pip = tmp_path / "pip"
    fake_pip.write_text(f"#!/bin/sh\ncat <<'END'\n{config_list}\nEND\n")
    fake_pip.chmod(0o755)
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "uv_args.sh"), str(fake_pip)],
        env=env or {},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return done.stdout.strip()


def test_uv_gets_pips_indexes_wheel_folders_and_constraints(tmp_path):
    listed = (
        "global.extra-index-url='file:///opt/a/simple file:///opt/b/simple'\n"
        "global.find-links='/opt/wheels'\nglobal.constraint='/etc/pip/constraints.txt'\nglobal.cert='/x'"
    )
    assert _uv_args(tmp_path, listed) == (
        "--index-strategy unsafe-best-match --extra-index-url file:///opt/a/simple "
        "--extra-index-url file:///opt/b/simple --find-links /opt/wheels "
        "--constraint /etc/pip/constraints.txt"
    )


def test_the_environment_comes_before_install_before_global(tmp_path):
    listed = (
        ":env:.find-links='/env/wheels'\ninstall.find-links='/install/wheels'\nglobal.find-links='/g'\n"
        "install.index-url='https://mirror/simple'\nglobal.index-url='https://other/simple'"
    )
    assert _uv_args(tmp_path, listed) == (
        "--index-strategy unsafe-best-match --index-url https://mirror/simple --find-links /env/wheels"
    )


def test_no_pip_configuration_leaves_uvs_defaults(tmp_path):
    assert _uv_args(tmp_path, "") == "--index-strategy unsafe-best-match"
