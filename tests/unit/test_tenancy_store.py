import json
import sqlite3
from datetime import date

import pytest

from tenancy.keys import ApiKeyHasher, generate_api_key, parse_api_key
from tenancy.models import Tenant, validate_tenant_name
from tenancy.store import ApiKeyNotFound, TenantExists, TenantNotFound, TenantStore


class CountingHasher(ApiKeyHasher):
    """Fast argon2 parameters plus a count of verifications."""

    def __init__(self):
        super().__init__(time_cost=1, memory_cost=8, parallelism=1)
        self.verifications = 0

    def verify(self, key_hash, api_key):
        self.verifications += 1
        return super().verify(key_hash, api_key)


@pytest.fixture
def hasher():
    return CountingHasher()


@pytest.fixture
def store(tmp_path, hasher):
    with TenantStore(tmp_path / "tenants.db", hasher=hasher) as tenant_store:
        yield tenant_store


def test_create_get_list_and_model_access(store):
    tenant, key = store.create_tenant("team-a", models=["m1", "m2"], rpm=10, tpm=1000,
                                      max_concurrency=2)
    assert tenant.models == ("m1", "m2") and tenant.rpm == 10 and tenant.created_at
    assert store.get_tenant("team-a") == tenant
    assert tenant.may_use_model("m1") and not tenant.may_use_model("m3")
    everything, _ = store.create_tenant("all")
    assert everything.models is None and everything.may_use_model("anything")
    assert [t.name for t in store.list_tenants()] == ["all", "team-a"]
    assert store.get_tenant("missing") is None
    assert parse_api_key(key)


def test_duplicate_tenant_raises_tenant_exists(store):
    store.create_tenant("dup")
    with pytest.raises(TenantExists):
        store.create_tenant("dup")


def test_invalid_limits_are_rejected(store):
    with pytest.raises(ValueError, match="rpm"):
        store.create_tenant("x", rpm=0)
    with pytest.raises(ValueError, match="models"):
        store.create_tenant("x", models="m1")
    assert store.get_tenant("x") is None


def test_key_is_stored_only_as_hash(store, tmp_path):
    _, key = store.create_tenant("secretive")
    secret = parse_api_key(key).secret
    conn = sqlite3.connect(tmp_path / "tenants.db")
    rows = conn.execute("SELECT key_id, key_hash FROM api_keys").fetchall()
    dump = "\n".join(conn.iterdump())
    conn.close()
    assert rows[0][0] == parse_api_key(key).key_id
    assert rows[0][1].startswith("$argon2id$")
    assert secret not in dump


def test_authenticate_right_wrong_and_malformed_keys(store):
    tenant, key = store.create_tenant("auth")
    assert store.authenticate(key) == tenant
    key_id = parse_api_key(key).key_id
    assert store.authenticate(f"ps_{key_id}_{'x' * 43}") is None  # right id, wrong secret
    assert store.authenticate(generate_api_key()) is None  # unknown id
    assert store.authenticate("Bearer nonsense") is None
    assert store.authenticate("") is None and store.authenticate(None) is None


def test_authenticate_caches_argon2_verification(store, hasher):
    _, key = store.create_tenant("cached")
    before = hasher.verifications
    for _ in range(5):
        assert store.authenticate(key) is not None
    assert hasher.verifications == before + 1


def test_authenticate_after_delete_fails_even_when_cached(store):
    _, key = store.create_tenant("gone")
    assert store.authenticate(key) is not None
    store.delete_tenant("gone", actor="alice")
    assert store.authenticate(key) is None
    assert store.get_tenant("gone") is None
    assert store.list_api_keys("gone") == []
    with pytest.raises(TenantNotFound):
        store.delete_tenant("gone")


def test_deletion_is_seen_by_another_store_on_the_same_file(tmp_path, hasher):
    path = tmp_path / "shared.db"
    with TenantStore(path, hasher=hasher) as first, TenantStore(path, hasher=hasher) as second:
        _, key = first.create_tenant("shared")
        assert second.authenticate(key) is not None
        first.delete_tenant("shared")
        assert second.authenticate(key) is None


def test_extra_keys_and_revocation(store):
    _, first_key = store.create_tenant("rotating")
    second_key = store.create_api_key("rotating")
    assert store.authenticate(first_key) and store.authenticate(second_key)
    first_id = parse_api_key(first_key).key_id
    store.revoke_api_key("rotating", first_id)
    assert store.authenticate(first_key) is None
    assert store.authenticate(second_key) is not None
    assert [k.key_id for k in store.list_api_keys("rotating")] == [parse_api_key(second_key).key_id]
    with pytest.raises(ApiKeyNotFound):
        store.revoke_api_key("rotating", first_id)
    with pytest.raises(TenantNotFound):
        store.create_api_key("nobody")


def test_update_tenant_replaces_limits(store):
    store.create_tenant("upd", rpm=5)
    updated = store.update_tenant("upd", models=["m"], tpm=50)
    assert updated.rpm is None and updated.tpm == 50 and updated.models == ("m",)
    assert store.get_tenant("upd") == updated
    with pytest.raises(TenantNotFound):
        store.update_tenant("nobody")


def test_ensure_tenant_with_key_is_idempotent_and_replaces_changed_key(store, hasher):
    key = generate_api_key()
    tenant = store.ensure_tenant_with_key("demo", key, rpm=100)
    assert store.authenticate(key) == tenant
    audit_count = len(store.audit_log())
    assert store.ensure_tenant_with_key("demo", key, rpm=100) == tenant
    assert len(store.audit_log()) == audit_count  # nothing changed, nothing written

    admin_key = store.create_api_key("demo")
    new_key = generate_api_key()
    updated = store.ensure_tenant_with_key("demo", new_key, rpm=200)
    assert updated.rpm == 200
    assert store.authenticate(key) is None  # old config key replaced
    assert store.authenticate(new_key) is not None
    assert store.authenticate(admin_key) is not None  # admin-created keys are kept

    # same key id with a different secret replaces the stored hash
    same_id_key = f"ps_{parse_api_key(new_key).key_id}_{'y' * 43}"
    store.ensure_tenant_with_key("demo", same_id_key, rpm=200)
    assert store.authenticate(new_key) is None
    assert store.authenticate(same_id_key) is not None


def test_ensure_tenant_with_key_rejects_bad_or_foreign_keys(store):
    with pytest.raises(ValueError, match="ps_"):
        store.ensure_tenant_with_key("demo", "sk-not-a-poolserve-key")
    _, key = store.create_tenant("owner")
    with pytest.raises(ValueError, match="another tenant"):
        store.ensure_tenant_with_key("thief", key)
    assert store.get_tenant("thief") is None


def test_usage_upsert_sums_per_tenant_model_day(store):
    store.record_usage("t", "m1", 10, 5, day="2025-01-01")
    store.record_usage("t", "m1", 1, 2, day=date(2025, 1, 1))
    store.record_usage("t", "m2", 7, 0, day="2025-01-01")
    store.record_usage("t", "m1", 3, 3, day="2025-01-02")
    store.record_usage("other", "m1", 100, 100, day="2025-01-01")
    rows = store.usage("t")
    assert [(r.day, r.model, r.requests, r.prompt_tokens, r.completion_tokens) for r in rows] == [
        ("2025-01-02", "m1", 1, 3, 3),
        ("2025-01-01", "m1", 2, 11, 7),
        ("2025-01-01", "m2", 1, 7, 0),
    ]
    assert len(store.usage()) == 4
    store.record_usage("t", "m3", 1, 1)  # defaults to today (UTC)
    assert any(r.model == "m3" for r in store.usage("t"))
    with pytest.raises(ValueError):
        store.record_usage("t", "m1", -1, 0)
    with pytest.raises(ValueError):
        store.record_usage("t", "m1", 1, 0, day="01/02/2025")


def test_audit_entries_record_actor_action_and_no_keys(store):
    _, key = store.create_tenant("audited", rpm=3, actor="alice")
    store.update_tenant("audited", rpm=4, actor="bob")
    store.delete_tenant("audited", actor="carol")
    entries = store.audit_log(limit=10)
    assert [(e.actor, e.action, e.target) for e in entries] == [
        ("carol", "tenant.delete", "audited"),
        ("bob", "tenant.update", "audited"),
        ("alice", "tenant.create", "audited"),
    ]
    assert entries[2].detail["rpm"] == 3 and entries[2].detail["key_id"] == parse_api_key(key).key_id
    assert entries[0].detail == {"removed_keys": 1}
    assert parse_api_key(key).secret not in json.dumps([e.detail for e in entries])
    assert len(store.audit_log(limit=1)) == 1
    assert entries[0].id > entries[1].id


def test_data_survives_reopening(tmp_path, hasher):
    path = tmp_path / "nested" / "tenants.db"
    with TenantStore(path, hasher=hasher) as first:
        _, key = first.create_tenant("durable", tpm=9)
    with TenantStore(path, hasher=hasher) as second:
        assert second.authenticate(key).tpm == 9


@pytest.mark.parametrize("name", ["a", "demo", "team-a", "team_b", "0abc", "a" * 63])
def test_valid_tenant_names(name):
    assert validate_tenant_name(name) == name


@pytest.mark.parametrize("name, problem", [
    ("", "empty"), ("a" * 64, "64 characters"), ("Team", "lowercase"), ("-lead", "starting"),
    ("_lead", "starting"), ("has space", "invalid"), ("dot.name", "invalid"), (3, "string"),
])
def test_invalid_tenant_names_explain_the_problem(store, name, problem):
    with pytest.raises(ValueError, match=problem):
        validate_tenant_name(name)
    with pytest.raises(ValueError):
        store.create_tenant(name)


def test_tenant_to_dict():
    tenant = Tenant(name="x", models=("m",), rpm=1)
    assert tenant.to_dict()["models"] == ["m"]
    assert Tenant(name="y").to_dict()["models"] is None
