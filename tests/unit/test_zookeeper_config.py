"""The ZooKeeper port's settings: session timeouts negotiated as ZooKeeper does (2 and 20 ticks
unless set), and the settings a server refuses."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tablekeeper_server.config import ServerConfig
from tablekeeper_server.security.config import SecurityConfig
from tablekeeper_server.zookeeper.server import ZooKeeperSettings

pytestmark = pytest.mark.unit


def test_session_timeouts_are_clamped_to_two_and_twenty_ticks_by_default() -> None:
    settings = ZooKeeperSettings(tick_ms=2000)
    assert settings.session_bounds_ms == (4000, 40000)
    assert settings.negotiate(100) == 4000
    assert settings.negotiate(30000) == 30000
    assert settings.negotiate(10**9) == 40000
    explicit = ZooKeeperSettings(
        tick_ms=2000, min_session_timeout_ms=500, max_session_timeout_ms=9000
    )
    assert (explicit.negotiate(1), explicit.negotiate(10**6)) == (500, 9000)
    tiny = ZooKeeperSettings(tick_ms=10)  # a range's session lives at least 100 ms
    assert tiny.negotiate(1) == 100


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"zookeeper_port": 70000}, "--zookeeper-port must be in"),
        ({"zookeeper_port": 4181}, "also used by another port"),
        ({"zookeeper_port": 2181, "zookeeper_tick_s": 0}, "--zookeeper-tick-time"),
        (
            {
                "zookeeper_port": 2181,
                "zookeeper_min_session_timeout_s": 9.0,
                "zookeeper_max_session_timeout_s": 3.0,
            },
            "is over",
        ),
        ({"zookeeper_port": 2181, "zookeeper_max_packet_bytes": 100}, "at least 1KiB"),
    ],
)
def test_bad_zookeeper_settings_are_refused(changes: dict[str, object], message: str) -> None:
    config = dataclasses.replace(ServerConfig(), **changes)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message):
        config.validate()


def test_the_port_is_refused_on_a_secured_server_it_cannot_secure(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_text("x")
    key.write_text("x")
    secured = SecurityConfig(tls_cert=cert, tls_key=key)
    config = dataclasses.replace(ServerConfig(), zookeeper_port=2181, security=secured)
    with pytest.raises(ValueError, match="neither TLS nor"):
        config.validate()
    dataclasses.replace(config, zookeeper_port=0).validate()
