"""`rpc.envoy`'s TLS secrets: the files Envoy reads its certificate and client CA from, and
rewrites of them (SIGHUP) that refuse unusable files. Envoy serving them, and SIGHUP reloading
them, is tests/integration/test_security.py's, on both runtimes."""

from __future__ import annotations

import base64
import json
import stat
from pathlib import Path
from typing import Any

import pytest

from tablekeeper_server.rpc.envoy_launch import _secrets_from_files, write_tls_secrets
from tablekeeper_server.security.certs import write_authority
from tablekeeper_server.security.tls import TlsFiles

pytestmark = pytest.mark.unit


def secret(directory: Path, name: str) -> dict[str, Any]:
    [resource] = json.loads((directory / f"{name}.json").read_text())["resources"]
    assert resource["name"] == name
    return resource  # type: ignore[no-any-return]


def inline(data_source: dict[str, str]) -> bytes:
    return base64.b64decode(data_source["inline_bytes"])


def test_the_secrets_are_the_files_and_only_the_server_reads_them(tmp_path: Path) -> None:
    write_authority(tmp_path / "ca", hosts=["127.0.0.1"], clients=[])
    files = TlsFiles(
        tmp_path / "ca" / "server.pem",
        tmp_path / "ca" / "server-key.pem",
        tmp_path / "ca" / "ca.pem",
    )
    out = tmp_path / "data" / "envoy-tls" / "4181"
    write_tls_secrets(files, out)
    certificate = secret(out, "certificate")["tls_certificate"]
    assert inline(certificate["certificate_chain"]) == files.cert.read_bytes()
    assert inline(certificate["private_key"]) == files.key.read_bytes()
    assert files.client_ca is not None
    trusted = secret(out, "client-ca")["validation_context"]["trusted_ca"]
    assert inline(trusted) == files.client_ca.read_bytes()
    for path in out.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    assert sorted(p.name for p in out.iterdir()) == ["certificate.json", "client-ca.json"]


def test_a_key_that_is_not_the_certificates_is_refused_and_the_secret_kept(
    tmp_path: Path,
) -> None:
    write_authority(tmp_path / "a", hosts=["127.0.0.1"], clients=[])
    write_authority(tmp_path / "b", hosts=["127.0.0.1"], clients=[])
    out = tmp_path / "tls"
    write_tls_secrets(
        TlsFiles(tmp_path / "a" / "server.pem", tmp_path / "a" / "server-key.pem"), out
    )
    before = (out / "certificate.json").read_bytes()
    mismatched = TlsFiles(tmp_path / "a" / "server.pem", tmp_path / "b" / "server-key.pem")
    with pytest.raises(ValueError, match="server-key.pem"):
        write_tls_secrets(mismatched, out)
    missing = TlsFiles(tmp_path / "a" / "gone.pem", tmp_path / "a" / "server-key.pem")
    with pytest.raises(OSError):
        write_tls_secrets(missing, out)
    assert (out / "certificate.json").read_bytes() == before
    assert not (out / "client-ca.json").exists()


@pytest.mark.parametrize("client_ca", [False, True])
def test_envoy_reads_the_certificate_from_the_watched_secret_files(
    tmp_path: Path, client_ca: bool
) -> None:
    context: dict[str, Any] = {
        "tls_certificates": [{"certificate_chain": {"inline_bytes": "eA=="}}],
        "validation_context": {"trusted_ca": {"inline_bytes": "eA=="}},
        "alpn_protocols": ["h2"],
    }
    chain = {"transport_socket": {"typed_config": {"common_tls_context": context}}}
    doc = {"static_resources": {"listeners": [{"filter_chains": [chain]}]}}
    _secrets_from_files(doc, tmp_path, client_ca=client_ca)
    assert "tls_certificates" not in context and context["alpn_protocols"] == ["h2"]
    [certificate] = context["tls_certificate_sds_secret_configs"]
    source = certificate["sds_config"]["path_config_source"]
    assert certificate["name"] == "certificate"
    assert source == {
        "path": str(tmp_path / "certificate.json"),
        "watched_directory": {"path": str(tmp_path)},
    }
    if client_ca:
        validation = context["validation_context_sds_secret_config"]
        assert "validation_context" not in context and validation["name"] == "client-ca"
        assert validation["sds_config"]["path_config_source"]["path"] == str(
            tmp_path / "client-ca.json"
        )
    else:
        assert "validation_context_sds_secret_config" not in context
