"""API keys: generation, parsing, and how a key is stored and checked.

A key looks like ``ps_<key_id>_<secret>``. The key_id is a short public
lookup id stored in plain text (it shows up in logs and the admin API), so
authentication fetches one candidate row by id. The key itself is shown
once and never stored.

What is stored is the SHA-256 digest of the whole key, compared with
``hmac.compare_digest``. A slow password hash (argon2, bcrypt) exists to
make guessing low-entropy passwords expensive; our secrets are 256 random
bits from ``secrets``, so a leaked digest cannot be brute-forced whatever
the hash, and a fast one is the standard choice for such tokens (GitHub,
Stripe). It also makes a wrong secret cost microseconds, so a flood of
wrong secrets against a public key id needs no lockout, and a lockout is
what would let an attacker deny service to the key's real owner. Keys
given through the environment must still have at least MIN_SECRET_CHARS
secret characters, so weak hand-written keys are refused outright.

Databases written by older versions hold only an argon2 hash per key;
``ApiKeyHasher`` verifies those, and the store then records the SHA-256
digest, so each legacy key pays argon2 once, on its first successful use.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

KEY_PREFIX = "ps"
KEY_ID_HEX_CHARS = 12  # 48 bits: only a lookup id, uniqueness is enforced by the DB
SECRET_BYTES = 32  # 256 bits of entropy in the secret part
MIN_SECRET_CHARS = 20  # refuse weak hand-written keys given through the environment


@dataclass(frozen=True)
class ParsedKey:
    key_id: str
    secret: str


class MalformedKey(ValueError):
    """The string is not of the form ps_<key_id>_<secret>."""


def generate_api_key() -> str:
    """Return a fresh random key ``ps_<12 hex>_<43 urlsafe chars>``."""
    key_id = secrets.token_hex(KEY_ID_HEX_CHARS // 2)
    return f"{KEY_PREFIX}_{key_id}_{secrets.token_urlsafe(SECRET_BYTES)}"


def parse_api_key(api_key: str) -> ParsedKey:
    """Split a key into its public id and secret; raise MalformedKey otherwise.

    The error message never contains the key itself.
    """
    if not isinstance(api_key, str):
        raise MalformedKey("API key must be a string")
    # The key_id is hex, so the first two underscores are the separators even
    # when the urlsafe secret itself contains underscores.
    parts = api_key.split("_", 2)
    if len(parts) != 3 or parts[0] != KEY_PREFIX:
        raise MalformedKey("API key must look like ps_<key_id>_<secret>")
    _, key_id, secret = parts
    if len(key_id) != KEY_ID_HEX_CHARS or any(c not in "0123456789abcdef" for c in key_id):
        raise MalformedKey(f"API key id must be {KEY_ID_HEX_CHARS} lowercase hex characters")
    if len(secret) < MIN_SECRET_CHARS:
        raise MalformedKey(f"API key secret must be at least {MIN_SECRET_CHARS} characters")
    if any(not (c.isascii() and (c.isalnum() or c in "-_")) for c in secret):
        raise MalformedKey("API key secret may only contain letters, digits, '-' and '_'")
    return ParsedKey(key_id=key_id, secret=secret)


def redact(api_key: str | None) -> str:
    """Loggable form of a key: the public prefix and id only, never the secret."""
    if not api_key:
        return "<none>"
    try:
        parsed = parse_api_key(api_key)
    except MalformedKey:
        return "<malformed key>"
    return f"{KEY_PREFIX}_{parsed.key_id}_***"


def key_sha256(api_key: str) -> str:
    """Hex SHA-256 of the whole key: the form in which keys are stored."""
    return hashlib.sha256(api_key.encode("utf-8")).hexdigest()


def sha256_matches(stored_digest: str, api_key: str) -> bool:
    """True if ``api_key`` hashes to ``stored_digest``; compares in constant time."""
    return hmac.compare_digest(stored_digest.encode("ascii", "replace"), key_sha256(api_key).encode("ascii"))


class ApiKeyHasher:
    """Salted argon2id hashing of whole keys: only for rows written by older versions.

    New keys are stored as SHA-256 (see the module docstring). The defaults
    (1 pass, 8 MiB, 1 lane) match what those versions used.
    """

    DEFAULTS = {"time_cost": 1, "memory_cost": 8 * 1024, "parallelism": 1}

    def __init__(
        self, time_cost: int | None = None, memory_cost: int | None = None, parallelism: int | None = None
    ) -> None:
        overrides = {
            name: value
            for name, value in (("time_cost", time_cost), ("memory_cost", memory_cost), ("parallelism", parallelism))
            if value is not None
        }
        self._hasher = PasswordHasher(**{**self.DEFAULTS, **overrides})

    def hash(self, api_key: str) -> str:
        return self._hasher.hash(api_key)

    def verify(self, key_hash: str, api_key: str) -> bool:
        """True if ``api_key`` matches; argon2's verify compares in constant time."""
        try:
            return self._hasher.verify(key_hash, api_key)
        except (VerifyMismatchError, VerificationError, InvalidHashError):
            return False


if __name__ == "__main__":
    # `python -m tenancy.keys` prints a fresh key, e.g. for POOLSERVE_DEMO_KEY.
    print(generate_api_key())
