"""Bearer tokens: JWTs whose subject is the caller's role.

A server verifies tokens with an HMAC secret (HS256) or a public key (RS256 / ES256), never
both; `exp` is honoured when present (a token without it never expires, as with Pulsar's
tokens). `create_token` is what `tablekeeper token create` prints.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

# PyJWT (and the `cryptography` it imports) is imported where a token is made or verified:
# a server without tokens does not pay its import (about 0.1 s of every start).

HMAC_ALGORITHMS = ("HS256",)
PUBLIC_KEY_ALGORITHMS = ("RS256", "ES256")
_VERIFIED_S = 60.0
_VERIFIED_MAX = 10_000
SERVER_ROLE = "tablekeeper-server"
"""The role a server uses for its own calls to other servers (HMAC mode: it signs its own
token); always a superuser."""


class TokenError(ValueError):
    """The token is missing, malformed, tampered with, expired or has no subject. The message
    says which, and never contains the token."""


@dataclass(frozen=True)
class TokenVerifier:
    key: bytes
    algorithms: tuple[str, ...]
    _verified: dict[str, tuple[str, float]] = field(default_factory=dict, compare=False)
    """token -> (role, until when it may be trusted without checking again)"""

    @classmethod
    def from_files(
        cls, *, secret_key: Path | None = None, public_key: Path | None = None
    ) -> TokenVerifier | None:
        """The verifier for `--auth-secret-key` or `--auth-public-key` (None if neither)."""
        if secret_key is not None and public_key is not None:
            raise ValueError("give --auth-secret-key or --auth-public-key, not both")
        if secret_key is not None:
            return cls(read_secret(secret_key), HMAC_ALGORITHMS)
        if public_key is not None:
            return cls(public_key.read_bytes(), PUBLIC_KEY_ALGORITHMS)
        return None

    def role_of(self, token: str) -> str:
        """The token's subject (the role), or `TokenError` saying why it is refused. A verified
        token is remembered (until it expires, at most a minute), so a client sending the same
        token with every call pays for one signature check, not one per call."""
        now = time.time()
        cached = self._verified.get(token)
        if cached is not None and now < cached[1]:
            return cached[0]
        role, expires_at = self._verify(token)
        if len(self._verified) >= _VERIFIED_MAX:
            self._verified.clear()
        self._verified[token] = (role, min(expires_at, now + _VERIFIED_S))
        return role

    def _verify(self, token: str) -> tuple[str, float]:
        import jwt

        try:
            claims = jwt.decode(
                token,
                self.key,
                algorithms=list(self.algorithms),
                options={"require": ["sub"], "verify_aud": False},
            )
        except jwt.ExpiredSignatureError:
            raise TokenError("the token has expired") from None
        except jwt.InvalidSignatureError:
            raise TokenError("the token's signature does not verify") from None
        except jwt.MissingRequiredClaimError:
            raise TokenError("the token has no subject (role)") from None
        except jwt.PyJWTError as exc:
            raise TokenError(f"the token is invalid: {type(exc).__name__}") from None
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject:
            raise TokenError("the token's subject (role) is empty")
        expiry = claims.get("exp")
        return subject, float(expiry) if isinstance(expiry, (int, float)) else float("inf")

    def server_token(self) -> str | None:
        """A token for this server's own calls to other servers (HMAC mode only)."""
        if self.algorithms != HMAC_ALGORITHMS:
            return None
        return create_token(self.key, SERVER_ROLE)


def read_secret(path: Path) -> bytes:
    secret = path.read_bytes().strip()
    if len(secret) < 32:
        raise ValueError(f"{path}: an HMAC secret must be at least 32 bytes")
    return secret


def create_token(secret: bytes, subject: str, expiry_s: float | None = None) -> str:
    """An HS256 token for `subject`, expiring `expiry_s` from now (never, if None)."""
    if not subject:
        raise ValueError("a token needs a subject (the role)")
    claims: dict[str, object] = {"sub": subject}
    if expiry_s is not None:
        claims["exp"] = int(time.time() + expiry_s)
    import jwt

    return jwt.encode(claims, secret, algorithm="HS256")


def parse_duration(text: str) -> float:
    """`90s`, `15m`, `1h`, `7d` (or plain seconds) to seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    number, unit = (text[:-1], text[-1]) if text and text[-1] in units else (text, "s")
    try:
        value = float(number) * units[unit]
    except ValueError:
        raise ValueError(f"not a duration: {text!r} (e.g. 90s, 15m, 1h, 7d)") from None
    if value <= 0:
        raise ValueError(f"a duration must be positive: {text!r}")
    return value
