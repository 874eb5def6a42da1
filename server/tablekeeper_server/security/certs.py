"""A throw-away certificate authority for local clusters and tests (never for production).

    python -m tablekeeper_server.security.certs DIR [--hosts 127.0.0.1,localhost]
        [--clients alice,bob]

writes `ca.pem`, `server.pem` + `server-key.pem` (valid for the hosts), one `<name>.pem` +
`<name>-key.pem` per client (its common name is the role), and `secret.key` (an HMAC secret for
bearer tokens). Keys are EC P-256; certificates last 30 days.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=30)


@dataclass(frozen=True)
class Authority:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate


def new_authority(name: str = "tablekeeper throw-away CA") -> Authority:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return Authority(key, cert)


def issue(
    authority: Authority, common_name: str, *, hosts: Sequence[str] = (), client: bool = False
) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) for a server (`hosts` in its SAN) or a client."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(authority.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.CLIENT_AUTH]
                if client
                else [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
    )
    if hosts:
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(authority.key, hashes.SHA256())
    return (
        cert.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )


def write_authority(
    directory: Path, *, hosts: list[str], clients: list[str], server_name: str = "server"
) -> Authority:
    """Write the CA, a server certificate, client certificates and an HMAC secret."""
    directory.mkdir(parents=True, exist_ok=True)
    authority = new_authority()
    _write(directory / "ca.pem", authority.cert.public_bytes(serialization.Encoding.PEM))
    cert, key = issue(authority, server_name, hosts=hosts)
    _write(directory / "server.pem", cert)
    _write(directory / "server-key.pem", key, private=True)
    for name in clients:
        cert, key = issue(authority, name, client=True)
        _write(directory / f"{name}.pem", cert)
        _write(directory / f"{name}-key.pem", key, private=True)
    _write(directory / "secret.key", secrets.token_hex(32).encode(), private=True)
    return authority


def _write(path: Path, data: bytes, *, private: bool = False) -> None:
    path.write_bytes(data)
    if private:
        path.chmod(0o600)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tablekeeper_server.security.certs", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("directory", type=Path)
    parser.add_argument("--hosts", default="127.0.0.1,localhost", help="server SAN entries")
    parser.add_argument("--clients", default="", help="client certificates to issue (roles)")
    args = parser.parse_args(argv)
    write_authority(
        args.directory,
        hosts=[h for h in args.hosts.split(",") if h],
        clients=[c for c in args.clients.split(",") if c],
    )
    print(f"wrote a throw-away CA, server and client certificates to {args.directory}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
