"""The ZooKeeper front-end's jute codec, paths, stats and ACL rules, against the bytes and rules
of ZooKeeper's own code (zookeeper.jute, PathUtils, DataNode.copyStat, the digest provider)."""

from __future__ import annotations

import base64
import hashlib
import struct

import pytest

from tablekeeper_server.zookeeper import acl as acls
from tablekeeper_server.zookeeper import jute, paths
from tablekeeper_server.zookeeper import protocol as zk
from tablekeeper_server.zookeeper.jute import JuteError
from tablekeeper_server.zookeeper.znode import (
    OPEN_ACL,
    Znode,
    from_record,
    meta_of,
    new_record,
    next_version,
    read_raw,
    record_stat,
    with_children,
    with_data,
)

pytestmark = pytest.mark.unit


def test_strings_and_buffers_round_trip_with_null_as_minus_one() -> None:
    encoded = jute.write_string("/a/é") + jute.write_string(None) + jute.write_buffer(b"\x00x")
    assert encoded[:4] == struct.pack(">i", len("/a/é".encode()))
    value, offset = jute.read_string(encoded, 0)
    assert value == "/a/é"
    missing, offset = jute.read_string(encoded, offset)
    assert missing is None
    data, offset = jute.read_buffer(encoded, offset)
    assert data == b"\x00x" and offset == len(encoded)


def test_bad_utf8_decodes_as_java_does_with_replacement_characters() -> None:
    assert jute.read_string(struct.pack(">i", 2) + b"\xff/", 0)[0] == "\ufffd/"


@pytest.mark.parametrize(
    "raw",
    [
        b"\x00\x00",  # a length cut short
        struct.pack(">i", 5) + b"abc",  # a string past the end
        struct.pack(">i", -2),  # a negative length other than -1
    ],
)
def test_a_record_that_does_not_fit_raises(raw: bytes) -> None:
    with pytest.raises(JuteError):
        jute.read_string(raw, 0)
    with pytest.raises(JuteError):
        jute.read_buffer(raw, 0)


def test_a_path_and_its_data_decode_in_one_step_as_they_do_field_by_field() -> None:
    encoded = jute.write_string("/a/b") + jute.write_buffer(b"xyz") + b"tail"
    assert jute.read_path_data(encoded, 0) == ("/a/b", b"xyz", len(encoded) - 4)
    nulls = jute.write_string(None) + jute.write_buffer(None)
    assert jute.read_path_data(nulls, 0) == (None, None, 8)
    for cut in range(len(encoded) - 4):
        with pytest.raises(JuteError):
            jute.read_path_data(encoded[:cut], 0)
    with pytest.raises(JuteError):
        jute.read_path_data(jute.write_string("/a") + struct.pack(">i", -7), 0)


def test_a_vector_claiming_more_items_than_bytes_raises_before_reading_them() -> None:
    with pytest.raises(JuteError):
        jute.read_strings(struct.pack(">i", 1_000_000) + b"xx", 0)


def test_acl_vectors_round_trip() -> None:
    entries = [(31, "world", "anyone"), (1, "digest", "bob:x+y=")]
    encoded = jute.write_acls(entries)
    assert jute.read_acls(encoded, 0) == (entries, len(encoded))
    assert jute.read_acls(struct.pack(">i", -1), 0) == (None, 4)


def test_a_framed_reply_and_a_notification_have_the_lengths_their_frames_say() -> None:
    reply = jute.frame_reply(7, 42, zk.NO_NODE, b"abc")
    assert struct.unpack_from(">iiqi", reply) == (len(reply) - 4, 7, 42, zk.NO_NODE)
    event = jute.notification(zk.NODE_DELETED, "/x/y", 99)
    length, xid, zxid, err, kind, state = struct.unpack_from(">iiqiii", event)
    assert (length, xid, zxid, err, kind, state) == (len(event) - 4, -1, 99, 0, 2, 3)
    assert jute.read_string(event, 28)[0] == "/x/y"


@pytest.mark.parametrize(
    ("path", "valid"),
    [
        ("/", True),
        ("/a", True),
        ("/a/b-c.d", True),
        ("/a/.hidden", True),
        ("/a/..x", True),
        ("", False),
        ("a", False),
        ("/a/", False),
        ("/a//b", False),
        ("/a/./b", False),
        ("/a/..", False),
        ("/.", False),
        ("/a\x00b", False),
        ("/a\x1fb", False),
        ("/a\x7fb", False),
        ("/a\ue000b", False),  # private use
        ("/a\ufff5b", False),
        ("/a\U0001f600", False),  # a surrogate pair in Java's UTF-16
        ("/né", True),
    ],
)
def test_paths_are_valid_exactly_when_zookeepers_path_utils_says(path: str, valid: bool) -> None:
    assert paths.is_valid(path) is valid


def test_a_nodes_children_are_one_prefix_of_keys_and_its_grandchildren_are_not() -> None:
    child = paths.node_key("/a/b")
    grandchild = paths.node_key("/a/b/c")
    sibling_of_parent = paths.node_key("/ab")
    prefix = paths.children_prefix("/a")
    assert child.startswith(prefix)
    assert not grandchild.startswith(prefix) and not sibling_of_parent.startswith(prefix)
    assert paths.node_key("/x").startswith(paths.children_prefix("/"))
    assert paths.path_of(grandchild) == "/a/b/c"
    assert child[paths.name_offset("/a") :] == b"b"
    assert paths.parent_of("/a/b") == "/a" and paths.parent_of("/a") == "/"


def test_the_stat_clients_see_counts_child_changes_as_zookeeper_does() -> None:
    # Three children created, one of them deleted: cversion 3 stored, 4 changes seen.
    node = Znode(5, 6, 2, 100, 200, 1, 0, 3, 2, 9, OPEN_ACL, b"data")
    stat = jute.STAT.unpack(node.stat())
    assert stat == (5, 6, 100, 200, 2, 4, 1, 0, 4, 2, 9)
    assert from_record(node.record()) == node
    raw = node.record().encode()
    assert read_raw(raw) == (node.stat(), OPEN_ACL, b"data", 0)


def test_null_data_stays_null_and_has_length_zero() -> None:
    node = Znode(1, 1, 0, 0, 0, 0, 0, 0, 0, 1, OPEN_ACL, None)
    stat, _, data, _ = read_raw(node.record().encode())
    assert data is None and jute.STAT.unpack(stat)[8] == 0


def test_versions_wrap_as_java_ints_and_skip_minus_one() -> None:
    assert next_version(0) == 1
    assert next_version(2**31 - 1) == -(2**31)
    assert next_version(-2) == 0  # ZOOKEEPER-4743: never -1, which means "any version"


def test_containers_and_ttl_nodes_show_no_ephemeral_owner() -> None:
    ttl_owner = zk.ttl_owner(5000)
    assert zk.is_ttl_owner(ttl_owner) and zk.ttl_of(ttl_owner) == 5000
    assert not zk.is_session_owner(ttl_owner) and not zk.is_session_owner(zk.CONTAINER_OWNER)
    assert zk.client_owner(ttl_owner) == 0 and zk.client_owner(zk.CONTAINER_OWNER) == 0
    assert zk.client_owner(77) == 77


def test_digest_ids_are_zookeepers() -> None:
    expected = base64.b64encode(hashlib.sha1(b"bob:secret").digest()).decode()
    assert acls.digest_id("bob:secret") == f"bob:{expected}"


def test_acl_checks_follow_perms_schemes_and_ip_networks() -> None:
    digest = acls.digest_id("bob:secret")
    acl = jute.write_acls([(zk.READ, "digest", digest), (zk.ALL, "ip", "10.1.0.0/16")])
    assert acls.allowed(acl, zk.READ, [("digest", digest)])
    assert not acls.allowed(acl, zk.WRITE, [("digest", digest)])
    assert acls.allowed(acl, zk.WRITE, [("ip", "10.1.2.3")])
    assert not acls.allowed(acl, zk.READ, [("ip", "10.2.0.1")])
    assert acls.allowed(OPEN_ACL, zk.ADMIN, [])
    assert acls.masked(acl) == jute.write_acls(
        [(zk.READ, "digest", "bob:x"), (zk.ALL, "ip", "10.1.0.0/16")]
    )


def test_fixup_expands_auth_drops_duplicates_and_refuses_what_zookeeper_refuses() -> None:
    bob = ("digest", acls.digest_id("bob:secret"))
    assert acls.fixup([(31, "world", "anyone"), (31, "world", "anyone")], []) == OPEN_ACL
    expanded = acls.fixup([(zk.ALL, "auth", "")], [("ip", "127.0.0.1"), bob])
    assert jute.read_acls(expanded, 0)[0] == [(zk.ALL, *bob)]
    for refused, auth in (
        ([], []),
        (None, []),
        ([(zk.ALL, "auth", "")], [("ip", "127.0.0.1")]),  # an ip id is not "authenticated"
        ([(zk.ALL, "digest", "no-colon")], []),
        ([(zk.ALL, "digest", "user:")], []),
        ([(zk.ALL, "ip", "300.1.1.1")], []),
        ([(zk.ALL, "world", "someone")], []),
        ([(zk.ALL, "sasl", "x")], []),
    ):
        with pytest.raises(acls.InvalidAclError):
            acls.fixup(refused, auth)


def test_a_commands_caller_ids_round_trip() -> None:
    ids = [("ip", "127.0.0.1"), ("digest", "bob:abc")]
    assert acls.decode_auth(acls.encode_auth(ids)) == ids


@pytest.mark.parametrize("data", [None, b"", b"d" * 300])
@pytest.mark.parametrize("owner", [0, 0x1234, zk.CONTAINER_OWNER, zk.ttl_owner(5000)])
def test_a_znodes_record_changed_in_place_is_the_record_of_the_changed_znode(
    data: bytes | None, owner: int
) -> None:
    """The write path's record edits (`with_children`, `with_data`, `new_record`,
    `record_stat`) make the same bytes as decoding the node, changing it and encoding it."""
    acl = jute.write_acls([(zk.READ, "world", "anyone"), (zk.ALL, "digest", "bob:x")])
    node = Znode(3, 7, 2**31 - 1, 100, 200, 5, owner, 2**31 - 1, 4, 9, acl, data)
    record = node.record()
    assert record_stat(record) == node.stat()
    meta = meta_of(record)

    parent = from_record(record)
    parent.cversion, parent.children, parent.pzxid = -(2**31), 5, 11
    assert with_children(record, meta, -(2**31), 5, 11) == parent.record()

    for new_data in (None, b"", b"n" * 70):
        changed = from_record(record)
        changed.version = next_version(changed.version)
        changed.data, changed.mtime, changed.mzxid = new_data, 300, 12
        assert with_data(record, meta, 12, 300, new_data) == changed.record()
        assert record_stat(changed.record()) == changed.stat()

    created = Znode(13, 13, 0, 400, 400, 0, owner, 0, 0, 13, acl, data)
    assert new_record(13, 400, owner, acl, data) == created.record()
    assert record_stat(created.record()) == created.stat()
