import json
import os
import sqlite3
import stat
import statistics
import time
from datetime import date

import pytest

from tenancy.keys import ApiKeyHasher, generate_api_key, key_sha256, parse_api_key
from tenancy.models import (
    KEY_ADDED,
    KEY_NONE,
    KEY_REPLACED,
    KEY_REVOKED,
    KEY_UNCHANGED,
    Tenant,
    validate_tenant_name,
)
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
    tenant, key = store.create_tenant("team-a", models=["m1", "m2"], rpm=10, tpm=1000, max_concurrency=2)
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


def test_key_is_stored_only_as_sha256(store, tmp_path):
    _, key = store.create_tenant("secretive")
    secret = parse_api_key(key).secret
    conn = sqlite3.connect(tmp_path / "tenants.db")
    rows = conn.execute("SELECT key_id, key_hash, key_sha256 FROM api_keys").fetchall()
    dump = "\n".join(conn.iterdump())
    conn.close()
    assert rows == [(parse_api_key(key).key_id, "", key_sha256(key))]
    assert secret not in dump and key not in dump


def test_authenticate_right_wrong_and_malformed_keys(store):
    tenant, key = store.create_tenant("auth")
    assert store.authenticate(key) == tenant
    key_id = parse_api_key(key).key_id
    assert store.authenticate(f"ps_{key_id}_{'x' * 43}") is None  # right id, wrong secret
    assert store.authenticate(generate_api_key()) is None  # unknown id
    assert store.authenticate("Bearer nonsense") is None
    assert store.authenticate("") is None and store.authenticate(None) is None


def test_new_keys_never_run_argon2(store, hasher):
    _, key = store.create_tenant("fast")
    extra = store.create_api_key("fast")
    for _ in range(5):
        assert store.authenticate(key) is not None and store.authenticate(extra) is not None
        assert store.authenticate(f"ps_{parse_api_key(key).key_id}_{'x' * 43}") is None
    assert hasher.verifications == 0


def test_flood_of_wrong_secrets_is_cheap_and_does_not_lock_out_the_key(store, hasher):
    tenant, key = store.create_tenant("target")
    key_id = parse_api_key(key).key_id
    timings = []
    for i in range(1000):
        wrong = f"ps_{key_id}_{i:043d}"
        started = time.perf_counter()
        assert store.authenticate(wrong) is None
        timings.append(time.perf_counter() - started)
    assert store.authenticate(key) == tenant
    assert hasher.verifications == 0
    # Microseconds in practice; the bound only catches a return to slow hashing.
    assert statistics.median(timings) < 1e-3


def test_legacy_argon2_row_authenticates_once_then_is_upgraded(store, hasher, tmp_path):
    tenant, _ = store.create_tenant("legacy")
    key = generate_api_key()
    key_id = parse_api_key(key).key_id
    _insert_legacy_key(tmp_path / "tenants.db", "legacy", key, hasher)
    assert store.authenticate(f"ps_{key_id}_{'x' * 43}") is None  # wrong secret: argon2, no upgrade
    assert store.authenticate(key, allow_hashing=False) is None  # the old caller's lockout mode
    assert _stored_digest(tmp_path / "tenants.db", key_id) is None
    assert store.authenticate(key) == tenant
    assert _stored_digest(tmp_path / "tenants.db", key_id) == key_sha256(key)
    verifications = hasher.verifications
    for _ in range(3):
        assert store.authenticate(key) == tenant
        assert store.authenticate(key, allow_hashing=False) == tenant
        assert store.authenticate(f"ps_{key_id}_{'y' * 43}") is None
    assert hasher.verifications == verifications  # upgraded: no more argon2, right or wrong


def _insert_legacy_key(db_path, tenant, key, hasher):
    conn = sqlite3.connect(db_path)
    conn.execute(
        "INSERT INTO api_keys (key_id, tenant, key_hash, origin, created_at) "
        "VALUES (?, ?, ?, 'generated', '2024-01-01T00:00:00+00:00')",
        (parse_api_key(key).key_id, tenant, hasher.hash(key)),
    )
    conn.commit()
    conn.close()


def _stored_digest(db_path, key_id):
    conn = sqlite3.connect(db_path)
    row = conn.execute("SELECT key_sha256 FROM api_keys WHERE key_id = ?", (key_id,)).fetchone()
    conn.close()
    return row[0]


# The schema of databases written before tombstones and SHA-256 (user_version 0).
OLD_SCHEMA = """
CREATE TABLE tenants (name TEXT PRIMARY KEY, models TEXT, rpm INTEGER, tpm INTEGER,
                      max_concurrency INTEGER, created_at TEXT NOT NULL);
CREATE TABLE api_keys (key_id TEXT PRIMARY KEY,
                       tenant TEXT NOT NULL REFERENCES tenants(name) ON DELETE CASCADE,
                       key_hash TEXT NOT NULL, origin TEXT NOT NULL DEFAULT 'generated',
                       created_at TEXT NOT NULL);
CREATE TABLE audit (id INTEGER PRIMARY KEY AUTOINCREMENT, ts TEXT NOT NULL, actor TEXT NOT NULL,
                    action TEXT NOT NULL, target TEXT NOT NULL, detail TEXT NOT NULL);
"""


def test_old_database_is_migrated_with_tombstones_from_the_audit_log(tmp_path, hasher):
    path = tmp_path / "old.db"
    live, revoked, of_deleted = generate_api_key(), generate_api_key(), generate_api_key()
    conn = sqlite3.connect(path)
    conn.executescript(OLD_SCHEMA)
    conn.execute("INSERT INTO tenants VALUES ('demo', NULL, NULL, NULL, NULL, 't0')")
    conn.execute(
        "INSERT INTO api_keys VALUES (?, 'demo', ?, 'config', 't0')", (parse_api_key(live).key_id, hasher.hash(live))
    )
    audit = [
        ("config", "tenant.create", "demo", {}),
        ("config", "key.set", "demo", {"key_id": parse_api_key(revoked).key_id}),
        ("admin-api", "key.revoke", "demo", {"key_id": parse_api_key(revoked).key_id}),
        ("config", "key.set", "demo", {"key_id": parse_api_key(live).key_id}),
        ("config", "tenant.create", "gone", {"key_id": parse_api_key(of_deleted).key_id}),
        ("admin-api", "tenant.delete", "gone", {"removed_keys": 1}),
    ]
    conn.executemany(
        "INSERT INTO audit (ts, actor, action, target, detail) VALUES (?, ?, ?, ?, ?)",
        [
            (f"t{i}", actor, action, target, json.dumps(detail))
            for i, (actor, action, target, detail) in enumerate(audit, 1)
        ],
    )
    conn.commit()
    conn.close()
    with TenantStore(path, hasher=hasher) as store:
        assert store.authenticate(live).name == "demo"  # legacy argon2 row, then upgraded
        assert _stored_digest(path, parse_api_key(live).key_id) == key_sha256(live)
        assert store.is_key_revoked(parse_api_key(revoked).key_id)
        assert store.is_key_revoked(parse_api_key(of_deleted).key_id)
        assert not store.is_key_revoked(parse_api_key(live).key_id)
        gone = store.seed_tenant("gone")  # seeded before the upgrade, deleted since
        assert gone.tenant is None and gone.deleted_at == "t6"
        assert store.seed_tenant("demo", revoked).key_status == KEY_REVOKED
        assert store.create_api_key("demo")  # new rows fit the old NOT NULL key_hash column
    with TenantStore(path, hasher=hasher) as again:  # migrating twice is a no-op
        assert again.authenticate(live).name == "demo"


def test_database_files_are_owner_only(tmp_path, hasher):
    previous = os.umask(0o022)  # a permissive umask: the modes must not depend on it
    try:
        path = tmp_path / "state" / "tenants.db"
        with TenantStore(path, hasher=hasher) as store:
            store.create_tenant("a")
            store.record_usage("a", "m", 1, 1)
            files = [
                p
                for p in (path, tmp_path / "state" / "tenants.db-wal", tmp_path / "state" / "tenants.db-shm")
                if p.exists()
            ]
            assert len(files) == 3  # WAL mode: the db, its -wal and -shm while open
            assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files)
        loose = tmp_path / "loose.db"
        with TenantStore(loose, hasher=hasher):
            pass
        for suffix in ("", "-wal", "-shm"):
            target = tmp_path / f"loose.db{suffix}"
            target.touch()
            target.chmod(0o644)
        with TenantStore(loose, hasher=hasher):
            for suffix in ("", "-wal", "-shm"):
                assert stat.S_IMODE((tmp_path / f"loose.db{suffix}").stat().st_mode) == 0o600
    finally:
        os.umask(previous)


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
    assert store.is_key_revoked(first_id)
    with pytest.raises(ApiKeyNotFound):
        store.revoke_api_key("rotating", first_id)
    with pytest.raises(TenantNotFound):
        store.create_api_key("nobody")


def test_deleting_a_tenant_revokes_its_key_ids_for_good(store):
    _, key = store.create_tenant("doomed")
    store.delete_tenant("doomed")
    assert store.is_key_revoked(parse_api_key(key).key_id)
    recreated, _ = store.create_tenant("doomed")  # the name may be used again ...
    seeded = store.seed_tenant("doomed", key)  # ... but never with the old key
    assert seeded.key_status == KEY_REVOKED and seeded.tenant == recreated
    assert store.authenticate(key) is None


def test_update_tenant_replaces_limits(store):
    store.create_tenant("upd", rpm=5)
    updated = store.update_tenant("upd", models=["m"], tpm=50)
    assert updated.rpm is None and updated.tpm == 50 and updated.models == ("m",)
    assert store.get_tenant("upd") == updated
    with pytest.raises(TenantNotFound):
        store.update_tenant("nobody")


def test_seed_tenant_once_then_only_syncs_the_key(store):
    key = generate_api_key()
    first = store.seed_tenant("demo", key, rpm=100)
    assert first.created and first.seeded and first.key_status == KEY_ADDED
    assert store.authenticate(key) == first.tenant and first.new_key is None
    audit_count = len(store.audit_log())
    again = store.seed_tenant("demo", key, rpm=100)
    assert again.tenant == first.tenant and not again.seeded and again.key_status == KEY_UNCHANGED
    assert len(store.audit_log()) == audit_count  # nothing changed, nothing written

    assert store.seed_tenant("demo", key, rpm=5).tenant.rpm == 100  # seeded: the DB wins
    assert store.seed_tenant("demo", key, rpm=5, reseed=True).tenant.rpm == 5

    admin_key = store.create_api_key("demo")
    new_key = generate_api_key()
    assert store.seed_tenant("demo", new_key).key_status == KEY_ADDED
    assert store.authenticate(key) is None  # the earlier config key is revoked ...
    assert store.is_key_revoked(parse_api_key(key).key_id)
    assert store.seed_tenant("demo", key).key_status == KEY_REVOKED  # ... for good
    assert store.authenticate(new_key) is not None
    assert store.authenticate(admin_key) is not None  # admin-created keys are kept

    # same key id with a different secret replaces the stored digest
    same_id_key = f"ps_{parse_api_key(new_key).key_id}_{'y' * 43}"
    assert store.seed_tenant("demo", same_id_key).key_status == KEY_REPLACED
    assert store.authenticate(new_key) is None
    assert store.authenticate(same_id_key) is not None


def test_seed_tenant_without_key_generates_one_only_when_creating(store):
    created = store.seed_tenant("gen", rpm=3)
    assert created.created and created.key_status == KEY_NONE
    assert store.authenticate(created.new_key) == created.tenant
    assert store.seed_tenant("gen").new_key is None
    assert store.seed_tenant("gen", reseed=True).new_key is None  # exists: no extra key


def test_seed_tenant_upgrades_a_legacy_config_key(store, hasher, tmp_path):
    store.seed_tenant("demo")
    key = generate_api_key()
    _insert_legacy_key(tmp_path / "tenants.db", "demo", key, hasher)
    assert store.seed_tenant("demo", key).key_status == KEY_UNCHANGED
    assert _stored_digest(tmp_path / "tenants.db", parse_api_key(key).key_id) == key_sha256(key)


def test_seed_tenant_rejects_bad_or_foreign_keys(store):
    with pytest.raises(ValueError, match="ps_"):
        store.seed_tenant("demo", "sk-not-a-poolserve-key")
    with pytest.raises(ValueError, match="at least 20"):
        store.seed_tenant("demo", "ps_0123456789ab_short-secret")
    _, key = store.create_tenant("owner")
    with pytest.raises(ValueError, match="another tenant"):
        store.seed_tenant("thief", key)
    assert store.get_tenant("thief") is None and store.get_tenant("demo") is None


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
    assert store.is_key_revoked(parse_api_key(key).key_id)
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


@pytest.mark.parametrize(
    "name, problem",
    [
        ("", "empty"),
        ("a" * 64, "64 characters"),
        ("Team", "lowercase"),
        ("-lead", "starting"),
        ("_lead", "starting"),
        ("has space", "invalid"),
        ("dot.name", "invalid"),
        (3, "string"),
        ("team\n", "invalid"),  # re.match with `$` accepted a trailing newline
    ],
)
def test_invalid_tenant_names_explain_the_problem(store, name, problem):
    with pytest.raises(ValueError, match=problem):
        validate_tenant_name(name)
    with pytest.raises(ValueError):
        store.create_tenant(name)


def test_tenant_to_dict():
    tenant = Tenant(name="x", models=("m",), rpm=1)
    assert tenant.to_dict()["models"] == ["m"]
    assert Tenant(name="y").to_dict()["models"] is None
