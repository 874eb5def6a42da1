"""Service URIs: one host is handed to gRPC's resolver; several become a static address list,
which gRPC accepts only as IP addresses, so names are resolved first."""

from __future__ import annotations

import pytest

from tablekeeper._transport import parse_service_uri


@pytest.mark.parametrize(
    ("uri", "target"),
    [
        ("bk://127.0.0.1:4181", "127.0.0.1:4181"),
        ("bk://db.example:5000", "db.example:5000"),  # one host: gRPC's DNS resolver
        ("localhost", "localhost:4181"),
        ("bk://[::1]:4181", "[::1]:4181"),
        ("bk://127.0.0.1:1,127.0.0.1:2/", "ipv4:127.0.0.1:1,127.0.0.1:2"),
        ("bk://localhost:4181,localhost:4182", "ipv4:127.0.0.1:4181,127.0.0.1:4182"),
        ("bk://127.0.0.1,localhost", "ipv4:127.0.0.1:4181,127.0.0.1:4181"),
        ("bk://[::1]:1,127.0.0.1:2", "ipv6:[::1]:1,[::ffff:127.0.0.1]:2"),
    ],
)
def test_targets(uri: str, target: str) -> None:
    assert parse_service_uri(uri) == target


@pytest.mark.parametrize(
    "uri", ["http://x:1", "bk://", "bk://a:b", "bk://a:0", "bk://a:1,b:99999", "bk://[::1:4181"]
)
def test_bad_uris_are_refused(uri: str) -> None:
    with pytest.raises(ValueError):
        parse_service_uri(uri)


def test_unresolvable_host_is_named() -> None:
    with pytest.raises(ValueError, match="no-such-host.invalid"):
        parse_service_uri("bk://127.0.0.1:1,no-such-host.invalid:2")
