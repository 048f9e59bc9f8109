import pytest

from tenancy import keys
from tenancy.keys import (
    ApiKeyHasher,
    MalformedKey,
    generate_api_key,
    key_sha256,
    parse_api_key,
    redact,
    sha256_matches,
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


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "sk-123",
        "ps_short_" + "x" * 30,
        "ps_0123456789AB_" + "x" * 30,
        "ps_0123456789ab_tooshort",
        "ps_0123456789ab_" + "x" * 25 + "!",
    ],
)
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


def test_sha256_digest_is_of_the_whole_key_and_never_contains_it():
    key = generate_api_key()
    digest = key_sha256(key)
    assert len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)
    assert digest == key_sha256(key)  # deterministic: looked up per key id, compared directly
    assert parse_api_key(key).secret not in digest
    other_secret = f"ps_{parse_api_key(key).key_id}_{'x' * 43}"
    assert key_sha256(other_secret) != digest


def test_sha256_matches_compares_in_constant_time(monkeypatch):
    calls = []
    real_compare = keys.hmac.compare_digest
    monkeypatch.setattr(keys.hmac, "compare_digest", lambda a, b: calls.append((a, b)) or real_compare(a, b))
    key = generate_api_key()
    stored = key_sha256(key)
    assert sha256_matches(stored, key)
    assert not sha256_matches(stored, generate_api_key())
    assert not sha256_matches(stored, key + "x")
    assert not sha256_matches("not-a-digest-é", key)  # garbage in the row: False, no exception
    assert len(calls) == 4
