import os
import stat
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from tenancy.config import TenantsFile, apply_tenants_file, load_tenants_file
from tenancy.demo_key import DEMO_KEY_FILENAME, resolve_demo_key
from tenancy.keys import ApiKeyHasher, generate_api_key, parse_api_key
from tenancy.metrics import TenantMetrics, render_metrics
from tenancy.store import TenantStore

REPO_ROOT = str(Path(__file__).resolve().parents[3])


@pytest.fixture
def store(tmp_path):
    fast = ApiKeyHasher(time_cost=1, memory_cost=8, parallelism=1)
    with TenantStore(tmp_path / "tenants.db", hasher=fast) as tenant_store:
        yield tenant_store


# ---- tenants file ------------------------------------------------------------


def test_example_tenants_file_loads():
    config = load_tenants_file(os.path.join(REPO_ROOT, "configs", "tenants.example.yaml"))
    demo = {spec.name: spec for spec in config.tenants}["demo"]
    assert demo.api_key_env == "POOLSERVE_DEMO_KEY" and demo.models is None


def test_tenants_file_validation(tmp_path):
    path = tmp_path / "tenants.yaml"
    path.write_text("tenants:\n  - name: a\n    rpm: 5\n    models: [m1, m1]\n")
    assert load_tenants_file(path).tenants[0].models == ["m1"]
    path.write_text("")
    assert load_tenants_file(path).tenants == []
    for bad in (
        {"tenants": [{"name": "Bad Name"}]},
        {"tenants": [{"name": "a", "rpm": 0}]},
        {"tenants": [{"name": "a", "unknown": 1}]},
        {"tenants": [{"name": "a"}, {"name": "a"}]},
        {"tenants": [{"name": "a", "api_key_env": "NOT-VALID"}]},
    ):
        with pytest.raises(ValidationError):
            TenantsFile.model_validate(bad)


def test_apply_tenants_file(store):
    env_key = generate_api_key()
    config = TenantsFile.model_validate(
        {
            "tenants": [
                {"name": "demo", "api_key_env": "DEMO_KEY"},
                {"name": "limited", "models": ["m1"], "rpm": 30},
                {"name": "unset", "api_key_env": "MISSING_KEY"},
            ]
        }
    )
    first = apply_tenants_file(store, config, {"DEMO_KEY": env_key})
    assert store.authenticate(env_key).name == "demo"
    assert set(first.new_keys) == {"limited", "unset"}
    assert store.authenticate(first.new_keys["limited"]).rpm == 30
    assert first.seeded == first.synced == ["demo", "limited", "unset"] and first.warnings == []

    config.tenants[1].rpm = 60
    second = apply_tenants_file(store, config, {"DEMO_KEY": env_key})
    assert second.new_keys == {} and second.seeded == []
    assert store.get_tenant("limited").rpm == 30  # seeded once: the file no longer edits it
    assert any("MISSING_KEY" in warning for warning in second.warnings)
    assert second.synced == ["demo", "limited", "unset"]


def _demo_file(**limits):
    return TenantsFile.model_validate({"tenants": [{"name": "demo", "api_key_env": "DEMO_KEY", **limits}]})


def test_deleted_seeded_tenant_stays_deleted(store):
    env = {"DEMO_KEY": generate_api_key()}
    apply_tenants_file(store, _demo_file(), env)
    store.delete_tenant("demo", actor="admin-api")
    again = apply_tenants_file(store, _demo_file(), env)
    assert store.get_tenant("demo") is None and store.authenticate(env["DEMO_KEY"]) is None
    assert again.deleted == ["demo"] and again.synced == [] and again.new_keys == {}
    assert any("'demo' was deleted" in w and "re-seed" in w for w in again.warnings)
    # A fresh key in the environment does not bring the tenant back either.
    assert apply_tenants_file(store, _demo_file(), {"DEMO_KEY": generate_api_key()}).deleted == ["demo"]
    assert store.get_tenant("demo") is None


def test_revoked_env_key_stays_revoked_with_a_warning(store):
    key = generate_api_key()
    key_id, secret = parse_api_key(key).key_id, parse_api_key(key).secret
    apply_tenants_file(store, _demo_file(), {"DEMO_KEY": key})
    spare = store.create_api_key("demo")
    store.revoke_api_key("demo", key_id, actor="admin-api")
    again = apply_tenants_file(store, _demo_file(), {"DEMO_KEY": key})
    assert store.authenticate(key) is None and store.authenticate(spare) is not None
    assert [k.key_id for k in store.list_api_keys("demo")] == [parse_api_key(spare).key_id]
    [warning] = again.warnings
    assert "'demo'" in warning and key_id in warning and "revoked" in warning
    assert secret not in warning and key not in warning


def test_reseed_recreates_deleted_tenant_but_not_its_revoked_key(store):
    key = generate_api_key()
    apply_tenants_file(store, _demo_file(rpm=10), {"DEMO_KEY": key})
    store.update_tenant("demo", rpm=99)
    store.delete_tenant("demo")  # revokes the env key with it
    reseeded = apply_tenants_file(store, _demo_file(rpm=10), {"DEMO_KEY": key}, reseed=True)
    assert store.get_tenant("demo").rpm == 10 and reseeded.seeded == ["demo"]
    assert store.authenticate(key) is None and store.list_api_keys("demo") == []
    assert reseeded.new_keys == {}  # the env var is set: no generated key behind its back
    assert any(parse_api_key(key).key_id in w and "revoked" in w for w in reseeded.warnings)
    fresh = generate_api_key()  # what the operator does: a new key for the variable
    assert apply_tenants_file(store, _demo_file(rpm=10), {"DEMO_KEY": fresh}).warnings == []
    assert store.authenticate(fresh).name == "demo"


def test_reseed_resets_limits_and_regenerates_keys_for_keyless_tenants(store):
    config = TenantsFile.model_validate({"tenants": [{"name": "plain", "rpm": 7}]})
    first = apply_tenants_file(store, config, {})
    store.delete_tenant("plain")
    assert apply_tenants_file(store, config, {}).deleted == ["plain"]
    reseeded = apply_tenants_file(store, config, {}, reseed=True)
    assert store.authenticate(reseeded.new_keys["plain"]).rpm == 7
    assert store.authenticate(first.new_keys["plain"]) is None


def test_new_tenant_added_to_the_file_later_is_seeded(store):
    key = generate_api_key()
    apply_tenants_file(store, _demo_file(), {"DEMO_KEY": key})
    grown = TenantsFile.model_validate(
        {
            "tenants": [
                {"name": "demo", "api_key_env": "DEMO_KEY"},
                {"name": "team-a", "api_key_env": "TEAM_A_KEY", "models": ["m1"], "rpm": 30},
            ]
        }
    )
    team_key = generate_api_key()
    result = apply_tenants_file(store, grown, {"DEMO_KEY": key, "TEAM_A_KEY": team_key})
    assert result.seeded == ["team-a"] and result.synced == ["demo", "team-a"]
    assert store.authenticate(team_key).rpm == 30


def test_admin_edit_of_limits_survives_reapply(store):
    apply_tenants_file(store, _demo_file(rpm=10, tpm=100), {"DEMO_KEY": generate_api_key()})
    store.update_tenant("demo", models=["m1"], rpm=50, actor="admin-api")
    apply_tenants_file(store, _demo_file(rpm=10, tpm=100), {})  # even with the key unset
    tenant = store.get_tenant("demo")
    assert (tenant.models, tenant.rpm, tenant.tpm) == (("m1",), 50, None)


def test_rotating_the_env_key_revokes_the_previous_one(store):
    old, new = generate_api_key(), generate_api_key()
    apply_tenants_file(store, _demo_file(), {"DEMO_KEY": old})
    assert apply_tenants_file(store, _demo_file(), {"DEMO_KEY": new}).warnings == []
    assert store.authenticate(new) is not None and store.authenticate(old) is None
    rolled_back = apply_tenants_file(store, _demo_file(), {"DEMO_KEY": old})
    assert any(parse_api_key(old).key_id in w for w in rolled_back.warnings)
    assert store.authenticate(old) is None and store.authenticate(new) is not None


def test_apply_rejects_malformed_env_key_without_leaking_it(store):
    config = TenantsFile.model_validate({"tenants": [{"name": "demo", "api_key_env": "K"}]})
    with pytest.raises(ValueError) as error:
        apply_tenants_file(store, config, {"K": "sk-my-plain-secret"})
    assert "sk-my-plain-secret" not in str(error.value)
    weak = "ps_0123456789ab_short-secret"  # weaker than MIN_SECRET_CHARS: still refused
    with pytest.raises(ValueError) as error:
        apply_tenants_file(store, config, {"K": weak})
    assert "short-secret" not in str(error.value) and store.get_tenant("demo") is None


# ---- demo key ----------------------------------------------------------------


def test_demo_key_from_environment(tmp_path):
    key = generate_api_key()
    assert resolve_demo_key(tmp_path, {"POOLSERVE_DEMO_KEY": key}) == (key, None)
    assert not (tmp_path / DEMO_KEY_FILENAME).exists()


def test_demo_key_generated_with_mode_0600_then_reused(tmp_path):
    state_dir = tmp_path / "state"
    key, path = resolve_demo_key(state_dir, {})
    assert path == state_dir / DEMO_KEY_FILENAME
    assert parse_api_key(key)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text().strip() == key
    assert resolve_demo_key(state_dir, {}) == (key, None)


def test_demo_key_file_mode_is_fixed(tmp_path):
    key = generate_api_key()
    path = tmp_path / DEMO_KEY_FILENAME
    path.write_text(key + "\n")
    path.chmod(0o644)
    assert resolve_demo_key(tmp_path, {}) == (key, None)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_demo_key_file_with_garbage_is_an_error(tmp_path):
    (tmp_path / DEMO_KEY_FILENAME).write_text("hunter2\n")
    with pytest.raises(ValueError) as error:
        resolve_demo_key(tmp_path, {})
    assert "hunter2" not in str(error.value)


# ---- metrics -----------------------------------------------------------------


def test_metrics_on_own_registry_and_render():
    registry = CollectorRegistry()
    metrics = TenantMetrics(registry)
    metrics.observe_request("demo", "m1", 200)
    metrics.observe_tokens("demo", "m1", prompt_tokens=12, completion_tokens=3)
    metrics.observe_rejection("demo", "rpm")
    metrics.in_flight.labels(tenant="demo").inc()
    body, content_type = render_metrics(registry)
    text = body.decode()
    assert content_type.startswith("text/plain")
    assert 'poolserve_tenant_requests_total{model="m1",status="200",tenant="demo"} 1.0' in text
    assert 'poolserve_tenant_tokens_total{kind="prompt",model="m1",tenant="demo"} 12.0' in text
    assert 'poolserve_tenant_rejections_total{reason="rpm",tenant="demo"} 1.0' in text
    assert registry.get_sample_value("poolserve_tenant_in_flight_requests", {"tenant": "demo"}) == 1

    TenantMetrics(CollectorRegistry())  # a second registry does not clash with the first
    metrics.forget_tenant("demo")
    assert 'tenant="demo"' not in render_metrics(registry)[0].decode()
