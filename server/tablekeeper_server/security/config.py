"""Security settings of a server: TLS, authentication, and who is a superuser."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tablekeeper_server.security.tls import ServerTls, TlsFiles
from tablekeeper_server.settings import BOOL, LIST, PATH, STRING, Setting

if TYPE_CHECKING:  # tokens need pyjwt (the `server` extra); the CLI imports this module without
    from tablekeeper_server.security.auth import Authenticator


@dataclass(frozen=True)
class SecurityConfig:
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    """Require client certificates signed by this CA (mTLS); their common name is a role."""
    tls_ca: Path | None = None
    """CA this server trusts when calling other servers (default: the client CA)."""
    metrics_tls: bool = False
    """Serve /metrics over TLS with the same certificate."""
    auth_secret_key: Path | None = None
    auth_public_key: Path | None = None
    anonymous_role: str | None = None
    superuser_roles: tuple[str, ...] = ()

    @property
    def tls_on(self) -> bool:
        return self.tls_cert is not None

    @property
    def auth_on(self) -> bool:
        """Calls are authenticated: tokens are verified, or client certificates are required."""
        return (
            self.auth_secret_key is not None
            or self.auth_public_key is not None
            or self.tls_client_ca is not None
        )

    def validate(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together")
        if not self.tls_on and (self.tls_client_ca or self.tls_ca or self.metrics_tls):
            raise ValueError(
                "--tls-client-ca, --tls-ca and --metrics-tls need --tls-cert and --tls-key"
            )
        if self.auth_secret_key is not None and self.auth_public_key is not None:
            raise ValueError("give --auth-secret-key or --auth-public-key, not both")
        if self.anonymous_role is not None and not self.auth_on:
            raise ValueError("--anonymous-role needs authentication on (a token key or mTLS)")
        for path in (self.tls_cert, self.tls_key, self.tls_client_ca, self.tls_ca):
            if path is not None and not path.is_file():
                raise ValueError(f"{path}: no such file")

    def is_superuser(self, role: str | None) -> bool:
        from tablekeeper_server.security.tokens import SERVER_ROLE

        return role == SERVER_ROLE or role in self.superuser_roles

    def tls_files(self) -> TlsFiles | None:
        """The server's TLS files; None without TLS."""
        if self.tls_cert is None or self.tls_key is None:
            return None
        return TlsFiles(self.tls_cert, self.tls_key, self.tls_client_ca, self.tls_ca)

    def server_tls(self) -> ServerTls | None:
        files = self.tls_files()
        return None if files is None else ServerTls(files)

    def authenticator(self) -> Authenticator | None:
        if not self.auth_on:
            return None
        from tablekeeper_server.security.auth import Authenticator
        from tablekeeper_server.security.tokens import TokenVerifier

        verifier = TokenVerifier.from_files(
            secret_key=self.auth_secret_key, public_key=self.auth_public_key
        )
        return Authenticator(
            verifier,
            certificate_roles=self.tls_client_ca is not None,
            anonymous_role=self.anonymous_role,
            superuser_roles=self.superuser_roles,
        )


SECURITY_SETTINGS = (
    Setting("tls-cert", PATH, None, "PEM certificate chain: serve TLS", "tls_cert"),
    Setting("tls-key", PATH, None, "PEM private key of --tls-cert", "tls_key"),
    Setting(
        "tls-client-ca",
        PATH,
        None,
        "PEM CA: require client certificates it signed (mTLS); a certificate's common name is "
        "the caller's role",
        "tls_client_ca",
    ),
    Setting(
        "tls-ca",
        PATH,
        None,
        "PEM CA trusted when this server calls other servers",
        "tls_ca",
        default_text="--tls-client-ca",
    ),
    Setting("metrics-tls", BOOL, False, "serve /metrics over TLS too (same cert)", "metrics_tls"),
    Setting(
        "auth-secret-key",
        PATH,
        None,
        "file with the HMAC secret (>= 32 bytes) that verifies HS256 bearer tokens",
        "auth_secret_key",
    ),
    Setting(
        "auth-public-key",
        PATH,
        None,
        "PEM public key that verifies RS256/ES256 bearer tokens",
        "auth_public_key",
    ),
    Setting(
        "anonymous-role",
        STRING,
        None,
        "role of calls without credentials (BookKeeper clients send none); without it they are "
        "refused when authentication is on",
        "anonymous_role",
    ),
    Setting(
        "superuser-roles",
        LIST,
        (),
        "roles allowed everything: namespaces, permissions, admin calls",
        "superuser_roles",
        metavar="ROLE[,ROLE...]",
    ),
)
"""The flags (and configuration keys, under `[security]`) of `SecurityConfig`'s fields; the
server's configuration (`tablekeeper_server.config`) reads them with its other settings."""
