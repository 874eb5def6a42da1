"""Cluster mode's front-end settings and the front-end addresses a server publishes with its
ZooKeeper membership (and reading an older server's node, which holds just its endpoint)."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from tablekeeper_server.cluster.zookeeper import _decode_frontends, _encode_server
from tablekeeper_server.config import ServerConfig
from tablekeeper_server.security.config import SecurityConfig

pytestmark = pytest.mark.unit

CLUSTER = ServerConfig(zk_hosts="127.0.0.1:2181", log_backend="pulsar", checkpoint_store="pulsar")


def test_a_server_node_carries_its_front_end_addresses() -> None:
    raw = _encode_server("127.0.0.1:4181", {"etcd": "127.0.0.1:2379", "oxia": "127.0.0.1:6648"})
    assert raw == b"127.0.0.1:4181 etcd=127.0.0.1:2379 oxia=127.0.0.1:6648"
    assert _decode_frontends(raw) == {"etcd": "127.0.0.1:2379", "oxia": "127.0.0.1:6648"}


def test_an_older_servers_node_has_no_front_ends() -> None:
    assert _encode_server("127.0.0.1:4181", {}) == b"127.0.0.1:4181"
    assert _decode_frontends(b"127.0.0.1:4181") == {}


def test_the_etcd_port_is_allowed_in_cluster_mode() -> None:
    replace(CLUSTER, etcd_port=2379).validate()


def test_the_front_end_ports_with_authentication_are_allowed_in_cluster_mode() -> None:
    """Users and permissions are read from the root range wherever it is
    (tests/integration/test_front_end_security_cluster.py)."""
    secured = SecurityConfig(auth_secret_key=Path("token.key"))
    replace(CLUSTER, etcd_port=2379, oxia_port=6648, security=secured).validate()


def test_the_oxia_port_is_allowed_in_cluster_mode() -> None:
    replace(CLUSTER, oxia_port=6648).validate()


def test_workers_serve_the_etcd_and_oxia_ports() -> None:
    """tests/integration/test_workers.py runs them."""
    ServerConfig(
        workers=2, containers=2, etcd_port=2379, etcd_keyspaces=("apps=2381",), oxia_port=6648
    ).validate()


def test_etcd_keyspaces_each_on_a_port_of_their_own() -> None:
    config = ServerConfig(etcd_port=2379, etcd_keyspaces=("apps=2381", " jobs = 2382"))
    config.validate()
    assert config.etcd_keyspace_ports == {"keyspace": 2379, "apps": 2381, "jobs": 2382}
    assert ServerConfig(etcd_keyspaces=("apps=2381",)).etcd_keyspace_ports == {"apps": 2381}
    replace(CLUSTER, etcd_keyspaces=("apps=2381",)).validate()


@pytest.mark.parametrize(
    ("keyspaces", "message"),
    [
        (("apps",), "'apps' is not NAME=PORT"),
        (("apps=x",), "'apps=x' is not NAME=PORT"),
        (("a b=2381",), "keyspace 'a b': use 1-64 letters"),
        (("a/b=2381",), "keyspace 'a/b': use 1-64 letters"),
        (("apps=2381", "apps=2382"), "keyspace 'apps' is given twice"),
        (("keyspace=2381",), "(keyspace is --etcd-port's)"),
        (("apps=70000",), "port 70000 of 'apps' is not in 1..65535"),
        (("apps=2379",), "etcd port 2379 is also used"),
        (("apps=4181",), "etcd port 4181 is also used"),
    ],
)
def test_bad_etcd_keyspaces_are_refused(keyspaces: tuple[str, ...], message: str) -> None:
    config = ServerConfig(etcd_port=2379, etcd_keyspaces=keyspaces)
    with pytest.raises(ValueError, match=re.escape(message)):
        config.validate()
