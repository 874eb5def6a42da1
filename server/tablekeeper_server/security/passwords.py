"""Password hashes of users (the etcd API's `Authenticate`): salted scrypt, never the password.

A stored hash reads `scrypt$N$r$p$<salt hex>$<hash hex>`, so the cost can be raised later without
breaking hashes already stored. Hashing costs about 16 MiB and tens of milliseconds on purpose
(a stolen root range must not give passwords away cheaply): callers on an event loop run it in a
thread.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

_N, _R, _P = 2**14, 8, 1
_SALT_BYTES = 16
_HASH_BYTES = 32
_MAXMEM = 64 * 1024 * 1024
PASSWORD_BYTES_MAX = 1024
"""Longer passwords are refused (scrypt's cost does not depend on it, but a request should be
bounded)."""
NO_PASSWORD = b"nopassword"
"""The record of a user added without a password (etcd's `--no-password`): it can never
authenticate with one (certificates only)."""


def hash_password(password: str) -> bytes:
    """The record to store for `password` (a fresh random salt each time)."""
    if not password:
        raise ValueError("a password must not be empty")
    if len(password.encode()) > PASSWORD_BYTES_MAX:
        raise ValueError(f"a password is at most {PASSWORD_BYTES_MAX} bytes")
    salt = secrets.token_bytes(_SALT_BYTES)
    digest = _scrypt(password, salt, _N, _R, _P)
    return f"scrypt${_N}${_R}${_P}${salt.hex()}${digest.hex()}".encode()


def verify_password(record: bytes, password: str) -> bool:
    """Whether `password` matches the stored `record` (constant-time comparison). A damaged
    record or the no-password record never matches."""
    if record == NO_PASSWORD or not password or len(password.encode()) > PASSWORD_BYTES_MAX:
        return False
    try:
        scheme, n, r, p, salt_hex, digest_hex = record.decode("ascii").split("$")
        if scheme != "scrypt":
            return False
        salt, expected = bytes.fromhex(salt_hex), bytes.fromhex(digest_hex)
        digest = _scrypt(password, salt, int(n), int(r), int(p), len(expected))
    except (UnicodeDecodeError, ValueError):
        return False
    return hmac.compare_digest(digest, expected)


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int, length: int = _HASH_BYTES) -> bytes:
    return hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, maxmem=_MAXMEM, dklen=length)
