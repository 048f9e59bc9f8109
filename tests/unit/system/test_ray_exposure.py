"""Is the Ray the app runs in closed? Its servers' listening sockets and its token (system/ray_exposure.py)."""

from __future__ import annotations

import os

import pytest

from system.ray_exposure import Listener, RayExposure, open_listeners, token_problem


def test_only_listeners_beyond_loopback_count():
    # What plain `serve run` showed (DESIGN-FACTS §7): the GCS and the raylet on every interface.
    found = open_listeners(
        [
            ("gcs_server", "::", 6379),
            ("raylet", "::", 39477),
            ("raylet", "127.0.0.1", 40000),
            ("dashboard", "127.0.0.1", 8265),
            ("raylet", "::1", 41000),
            ("agent", "10.0.0.5", 52365),
            ("gcs_server", "::ffff:127.0.0.1", 43275),
            ("raylet", "::ffff:10.0.0.5", 43276),
            ("gcs_server", "0.0.0.0", 6379),
        ]
    )
    assert [str(x) for x in found] == [
        "agent on 10.0.0.5:52365",
        "gcs_server on 0.0.0.0:6379",
        "gcs_server on :::6379",
        "raylet on :::39477",
        "raylet on ::ffff:10.0.0.5:43276",
    ]
    # poolserve up's Ray on 127.0.0.1, as psutil lists its IPv6 sockets, is loopback.


def test_a_token_must_be_on_and_private(tmp_path):
    token = tmp_path / "ray-auth-token"
    token.write_text("x" * 64)
    os.chmod(token, 0o600)
    assert token_problem({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}) is None
    assert "off" in token_problem({})
    os.chmod(token, 0o644)  # what Ray 2.60 wrote to ~/.ray/auth_token (DESIGN-FACTS §9)
    assert "0644" in token_problem({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)})
    assert "cannot be read" in token_problem({"RAY_AUTH_MODE": "token"}, home=tmp_path / "nobody")
    assert token_problem({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "secret"}) is None


@pytest.mark.parametrize(
    "listeners, token, several, closed",
    [
        ([], None, False, True),  # poolserve up: loopback, private token
        ([Listener("gcs_server", "::", 6379)], None, False, False),  # listening beyond loopback
        ([Listener("gcs_server", "10.0.0.5", 6379)], None, True, True),  # two nodes on their link, with the token
        ([Listener("gcs_server", "10.0.0.5", 6379)], "token off", True, False),
        ([], "token off", False, False),  # loopback, but any local user gets in
    ],
)
def test_what_counts_as_open(listeners, token, several, closed):
    problem = RayExposure("session_x", listeners, token).problem(several_nodes=several)
    assert (problem is None) == closed


def test_the_refusal_names_poolserve_up_and_the_setting(monkeypatch):
    from planner.profile import load_profile
    from deployments import app

    monkeypatch.setattr(
        app,
        "exposure",
        lambda: RayExposure("session_x", [Listener("gcs_server", "::", 6379)], "Ray's token authentication is off"),
    )
    profile = load_profile("configs/cpu-tiny.yaml")
    with pytest.raises(RuntimeError) as refused:
        app.refuse_if_ray_is_open(profile)
    message = str(refused.value)
    assert "poolserve up" in message and "ray.allow_open: true" in message and "gcs_server on :::6379" in message
    app.refuse_if_ray_is_open(profile.model_copy(update={"ray": profile.ray.model_copy(update={"allow_open": True})}))
