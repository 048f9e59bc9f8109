"""API keys: generation, parsing, salted hashing and a verified-key cache.

A key looks like ``ps_<key_id>_<secret>``. The key_id is a short public
lookup id stored in plain text, so authentication hashes one candidate
instead of running argon2 (~50 ms) against every stored key. Only an
argon2 hash of the whole key is stored; the key itself is shown once.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
from collections import OrderedDict
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


def key_digest(api_key: str) -> bytes:
    """Fast unsalted digest used only as an in-memory cache key, never stored."""
    return hashlib.sha256(api_key.encode("utf-8")).digest()


class ApiKeyHasher:
    """Salted argon2id hashing of whole keys.

    Keys carry 256 random bits, so no work factor is needed against guessing; what matters is
    that a wrong key cannot make the gateway spend much. The defaults (1 pass, 8 MiB, 1 lane)
    verify in a few milliseconds; argon2-cffi's own defaults take 64 MiB per verification.
    """

    DEFAULTS = {"time_cost": 1, "memory_cost": 8 * 1024, "parallelism": 1}

    def __init__(self, time_cost: int | None = None, memory_cost: int | None = None,
                 parallelism: int | None = None) -> None:
        overrides = {name: value for name, value in
                     (("time_cost", time_cost), ("memory_cost", memory_cost),
                      ("parallelism", parallelism)) if value is not None}
        self._hasher = PasswordHasher(**{**self.DEFAULTS, **overrides})

    def hash(self, api_key: str) -> str:
        return self._hasher.hash(api_key)

    def verify(self, key_hash: str, api_key: str) -> bool:
        """True if ``api_key`` matches; argon2's verify compares in constant time."""
        try:
            return self._hasher.verify(key_hash, api_key)
        except (VerifyMismatchError, VerificationError, InvalidHashError):
            return False


class VerifiedKeyCache:
    """Bounded LRU of keys whose argon2 check already passed in this process.

    Maps sha256(key) to the stored hash that verified it. A hit only counts if
    that hash is still the one in the database, so deleting or replacing a key
    takes effect immediately even in other processes sharing the database.
    """

    def __init__(self, max_entries: int = 1024) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self._max_entries = max_entries
        self._entries: OrderedDict[bytes, str] = OrderedDict()
        self._lock = threading.Lock()

    def is_verified(self, api_key: str, current_key_hash: str) -> bool:
        digest = key_digest(api_key)
        with self._lock:
            cached_hash = self._entries.get(digest)
            if cached_hash is None:
                return False
            self._entries.move_to_end(digest)
        return hmac.compare_digest(cached_hash.encode(), current_key_hash.encode())

    def remember(self, api_key: str, key_hash: str) -> None:
        digest = key_digest(api_key)
        with self._lock:
            self._entries[digest] = key_hash
            self._entries.move_to_end(digest)
            while len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


if __name__ == "__main__":
    # `python -m tenancy.keys` prints a fresh key, e.g. for POOLSERVE_DEMO_KEY.
    print(generate_api_key())
