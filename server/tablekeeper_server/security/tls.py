"""TLS for the gRPC port: the server's certificate, optional client certificates (mTLS), and
reloading both without dropping the server.

`reload()` (the server calls it on SIGHUP) re-reads the files; gRPC asks for the configuration
at every new handshake, so new connections use the new certificate while open ones go on.
A reload that fails (a missing or unreadable file) keeps the old configuration and says why.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # grpc is imported where it is used: the server's settings name these classes
    import grpc

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TlsFiles:
    cert: Path
    """PEM certificate chain the server presents."""
    key: Path
    """PEM private key of `cert`."""
    client_ca: Path | None = None
    """PEM CA bundle; set, every client must present a certificate it signed (mTLS)."""
    ca: Path | None = None
    """PEM CA bundle this server trusts when it calls other servers (default: `client_ca`)."""

    def read(self) -> tuple[bytes, bytes, bytes | None]:
        key, cert = self.key.read_bytes(), self.cert.read_bytes()
        client_ca = self.client_ca.read_bytes() if self.client_ca else None
        if b"PRIVATE KEY" not in key or b"CERTIFICATE" not in cert:
            raise ValueError(f"{self.key} / {self.cert}: not a PEM key and certificate")
        return key, cert, client_ca


class ServerTls:
    """The server side: credentials for `add_secure_port`, reloadable."""

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        key, cert, client_ca = files.read()
        import grpc

        self._lock = threading.Lock()
        self._pending: grpc.ServerCertificateConfiguration | None = None
        self._initial = grpc.ssl_server_certificate_configuration([(key, cert)], client_ca)
        self.reloads = 0

    def credentials(self) -> grpc.ServerCredentials:
        import grpc

        return grpc.dynamic_ssl_server_credentials(
            self._initial,
            self._fetch,
            require_client_authentication=self.files.client_ca is not None,
        )

    def reload(self) -> bool:
        """Re-read the certificate files; True if they are in use for new connections now."""
        import grpc

        try:
            key, cert, client_ca = self.files.read()
            config = grpc.ssl_server_certificate_configuration([(key, cert)], client_ca)
        except (OSError, ValueError) as exc:
            log.error("TLS reload failed, keeping the current certificate: %s", exc)
            return False
        with self._lock:
            self._pending = config
            self.reloads += 1
        log.info("TLS: certificate files re-read (%s)", self.files.cert)
        return True

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        # Called by gRPC on a handshake: a new configuration once after each reload, else None
        # (keep the current one).
        with self._lock:
            config, self._pending = self._pending, None
        return config

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """What this server uses to call the others: it trusts `ca` (or `client_ca`) and
        presents its own certificate (needed when the others require client certificates)."""
        import grpc

        files = self.files
        trusted = files.ca or files.client_ca
        return grpc.ssl_channel_credentials(
            root_certificates=trusted.read_bytes() if trusted else None,
            private_key=files.key.read_bytes(),
            certificate_chain=files.cert.read_bytes(),
        )
