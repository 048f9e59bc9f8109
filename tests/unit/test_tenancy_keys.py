import pytest

from tenancy import keys
from tenancy.keys import (
    ApiKeyHasher,
    MalformedKey,
    VerifiedKeyCache,
    generate_api_key,
    parse_api_key,
    redact,
)

FAST_HASHER = ApiKeyHasher(time_cost=1, memory_cost=8, parallelism=1)


def test_generated_keys_are_unique_and_parse():
    first, second = generate_api_key(), generate_api_key()
    assert first != second
    parsed = parse_api_key(first)
    assert first.startswith(f"ps_{parsed.key_id}_")
    assert len(parsed.key_id) == 12
    assert len(parsed.secret) >= 40


def test_secret_with_underscores_still_parses():
    key = "ps_0123456789ab_abc_def_ghi_jkl_mno_pqr"
    assert parse_api_key(key).secret == "abc_def_ghi_jkl_mno_pqr"


@pytest.mark.parametrize("bad", ["", "sk-123", "ps_short_" + "x" * 30, "ps_0123456789AB_" + "x" * 30,
                                 "ps_0123456789ab_tooshort", "ps_0123456789ab_" + "x" * 25 + "!"])
def test_malformed_keys_are_rejected_without_echoing_them(bad):
    with pytest.raises(MalformedKey) as error:
        parse_api_key(bad)
    if bad:
        assert bad not in str(error.value)


def test_stored_hash_is_salted_and_not_the_key():
    key = generate_api_key()
    first, second = FAST_HASHER.hash(key), FAST_HASHER.hash(key)
    assert key not in first and parse_api_key(key).secret not in first
    assert first.startswith("$argon2id$")
    assert first != second  # a fresh salt each time
    assert FAST_HASHER.verify(first, key) and FAST_HASHER.verify(second, key)


def test_wrong_key_and_garbage_hash_are_rejected():
    key = generate_api_key()
    stored = FAST_HASHER.hash(key)
    assert not FAST_HASHER.verify(stored, generate_api_key())
    assert not FAST_HASHER.verify(stored, key + "x")
    assert not FAST_HASHER.verify("not-a-hash", key)


def test_redact_never_shows_the_secret():
    key = generate_api_key()
    parsed = parse_api_key(key)
    shown = redact(key)
    assert parsed.secret not in shown and parsed.key_id in shown
    assert redact("sk-some-secret-value") == "<malformed key>"
    assert redact(None) == "<none>"


def test_cache_compares_hashes_in_constant_time(monkeypatch):
    calls = []
    real_compare = keys.hmac.compare_digest
    monkeypatch.setattr(keys.hmac, "compare_digest",
                        lambda a, b: calls.append((a, b)) or real_compare(a, b))
    cache = VerifiedKeyCache(max_entries=4)
    key = generate_api_key()
    cache.remember(key, "$argon2id$stored")
    assert cache.is_verified(key, "$argon2id$stored")
    assert not cache.is_verified(key, "$argon2id$replaced")
    assert len(calls) == 2
    assert not cache.is_verified(generate_api_key(), "$argon2id$stored")


def test_cache_is_bounded_and_evicts_least_recently_used():
    cache = VerifiedKeyCache(max_entries=2)
    a, b, c = (generate_api_key() for _ in range(3))
    cache.remember(a, "ha")
    cache.remember(b, "hb")
    assert cache.is_verified(a, "ha")  # a is now the most recent
    cache.remember(c, "hc")
    assert len(cache) == 2
    assert cache.is_verified(a, "ha") and cache.is_verified(c, "hc")
    assert not cache.is_verified(b, "hb")
    cache.clear()
    assert len(cache) == 0
