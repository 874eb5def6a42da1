"""Bearer tokens: verification, expiry, and the cache of verified tokens."""

from __future__ import annotations

import pytest

from tablekeeper_server.security.tokens import (
    HMAC_ALGORITHMS,
    TokenError,
    TokenVerifier,
    create_token,
    parse_duration,
)

pytestmark = pytest.mark.unit
SECRET = b"k" * 32


def test_roles_expiry_and_tampering() -> None:
    verifier = TokenVerifier(SECRET, HMAC_ALGORITHMS)
    assert verifier.role_of(create_token(SECRET, "alice", expiry_s=3600)) == "alice"
    with pytest.raises(TokenError, match="expired"):
        verifier.role_of(create_token(SECRET, "alice", expiry_s=-1))
    with pytest.raises(TokenError, match="signature"):
        verifier.role_of(create_token(b"x" * 32, "alice"))
    token = create_token(SECRET, "alice")
    with pytest.raises(TokenError):
        verifier.role_of(token.replace(".", ".x", 1))
    with pytest.raises(TokenError, match="invalid"):
        verifier.role_of("not a token")


def test_a_verified_token_is_remembered_but_never_past_its_expiry() -> None:
    verifier = TokenVerifier(SECRET, HMAC_ALGORITHMS)
    token = create_token(SECRET, "alice", expiry_s=3600)
    assert verifier.role_of(token) == "alice"
    role, until = verifier._verified[token]
    assert role == "alice" and until <= create_token.__globals__["time"].time() + 60
    expired = create_token(SECRET, "bob", expiry_s=-1)
    with pytest.raises(TokenError):
        verifier.role_of(expired)
    assert expired not in verifier._verified


def test_durations() -> None:
    assert [parse_duration(t) for t in ("90", "90s", "15m", "1h", "7d")] == [
        90,
        90,
        900,
        3600,
        7 * 86400,
    ]
    for bad in ("", "h", "-1h", "0", "soon"):
        with pytest.raises(ValueError):
            parse_duration(bad)
