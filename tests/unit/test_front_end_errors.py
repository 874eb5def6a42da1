"""Each front-end's column of the one error table (`errors.ERROR_TABLE`): what an etcd, Oxia or
ZooKeeper client is answered for each of TableKeeper's errors."""

from __future__ import annotations

import grpc
import pytest

from tablekeeper_server import errors as e
from tablekeeper_server.etcd.errors import from_tablekeeper as etcd_answer
from tablekeeper_server.oxia.errors import from_tablekeeper as oxia_answer

pytestmark = pytest.mark.unit

S = grpc.StatusCode
CASES: list[tuple[e.TableKeeperError, tuple[object, str], tuple[object, str]]] = [
    # error, (etcd status, message), (Oxia status, message)
    (
        e.UnavailableError("down"),
        (S.UNAVAILABLE, "etcdserver: down"),
        (S.UNAVAILABLE, "oxia: resource unavailable: down"),
    ),
    (
        e.StorageUnavailableError("disk"),
        (S.UNAVAILABLE, "etcdserver: disk"),
        (S.UNAVAILABLE, "oxia: resource unavailable: disk"),
    ),
    (
        e.LogFencedError("fenced"),
        (S.UNAVAILABLE, "etcdserver: fenced"),
        (S.UNAVAILABLE, "oxia: resource unavailable: fenced"),
    ),
    (
        e.NotServedHereError(3),
        (S.UNAVAILABLE, "etcdserver: storage container 3 is not served here"),
        (S.ABORTED, "oxia: node is not leader"),
    ),
    (e.RangeMovedError("moved"), (S.UNAVAILABLE, "etcdserver: moved"), (S.UNKNOWN, "oxia: moved")),
    (
        e.RouteNotFoundError("no route"),
        (S.UNAVAILABLE, "etcdserver: no route"),
        (S.UNKNOWN, "oxia: no route"),
    ),
    (
        e.ResourceLimitError("big"),
        (S.INVALID_ARGUMENT, "etcdserver: request is too large"),
        (S.RESOURCE_EXHAUSTED, "oxia: big"),
    ),
    (e.BadRequestError("bad"), (S.INVALID_ARGUMENT, "bad"), (S.INVALID_ARGUMENT, "oxia: bad")),
    (e.InvalidKeyError("key"), (S.INTERNAL, "key"), (S.INVALID_ARGUMENT, "oxia: key")),
    (e.CompactedError("old", 7), (S.INTERNAL, "old"), (S.OUT_OF_RANGE, "oxia: old")),
    (e.CorruptionError("rot"), (S.INTERNAL, "rot"), (S.INTERNAL, "oxia: rot")),
    (e.StoreCorruptionError("rot"), (S.INTERNAL, "rot"), (S.INTERNAL, "oxia: rot")),
    (e.IndeterminateError("maybe"), (S.INTERNAL, "maybe"), (S.INTERNAL, "oxia: maybe")),
    (e.IllegalOpError("no"), (S.INTERNAL, "no"), (S.UNKNOWN, "oxia: no")),
    (e.ForwardedError(5, "far"), (S.INTERNAL, "far"), (S.UNKNOWN, "oxia: far")),
    (e.TableKeeperError("other"), (S.INTERNAL, "other"), (S.UNKNOWN, "oxia: other")),
]


@pytest.mark.parametrize(("error", "etcd", "oxia"), CASES, ids=lambda c: type(c).__name__)
def test_each_front_end_answers_from_its_column(
    error: e.TableKeeperError, etcd: tuple[object, str], oxia: tuple[object, str]
) -> None:
    answered = etcd_answer(error)
    assert (answered.code, answered.message) == etcd
    answered_oxia = oxia_answer(error)
    assert (answered_oxia.code, answered_oxia.message) == oxia


ZK_CASES: list[tuple[e.TableKeeperError, int | None]] = [
    # error, ZooKeeper's `KeeperException.Code` (None: the connection is closed: CONNECTIONLOSS)
    (e.UnavailableError("down"), None),
    (e.NotServedHereError(3), None),
    (e.RangeMovedError("moved"), None),
    (e.ResourceLimitError("big"), None),
    (e.IndeterminateError("maybe"), None),
    (e.CorruptionError("rot"), None),
    (e.WatcherTooSlowError("slow"), None),
    (e.BadRequestError("bad"), -8),  # BADARGUMENTS
    (e.InvalidKeyError("key"), -8),
    (e.IllegalOpError("no"), -8),
    (e.PermissionDeniedError("no"), -102),  # NOAUTH
    (e.KeyNotFoundError("gone"), -101),  # NONODE
    (e.BadVersionError("old"), -103),  # BADVERSION
    (e.ForwardedError(5, "far"), -1),  # SYSTEMERROR
    (e.TableKeeperError("other"), -1),
]


@pytest.mark.parametrize(("error", "code"), ZK_CASES, ids=lambda c: type(c).__name__)
def test_zookeeper_column(error: e.TableKeeperError, code: int | None) -> None:
    assert e.wire_rule(error).zookeeper == code
