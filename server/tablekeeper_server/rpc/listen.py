"""Opening a gRPC port, for every front-end alike: plaintext or TLS, and one clear error when the
address cannot be bound."""

from __future__ import annotations

import grpc

from tablekeeper_server.security.tls import ServerTls


def listen(server: grpc.aio.Server, bind_host: str, port: int, tls: ServerTls | None) -> int:
    """Add the listening port to `server` (TLS with `tls`); returns the port. `OSError` if the
    address cannot be bound."""
    address = f"{bind_host}:{port}"
    try:
        bound = (
            server.add_secure_port(address, tls.credentials())
            if tls is not None
            else server.add_insecure_port(address)
        )
    except RuntimeError:  # grpc's way of saying the bind failed
        bound = 0
    if bound == 0:
        raise OSError(f"cannot listen on {address} (port in use, or no such address)")
    return int(bound)
