"""The server's appliers: every protocol whose commands a range's log may hold.

`main` calls `server_appliers()` once and passes the registry down to every range, follower and
split. It holds every applier whatever the flags say (a front-end switched off today may have
logged commands yesterday): replay never depends on the configuration. A new front-end adds its
applier here (see `range.apply` for the contract).
"""

from __future__ import annotations

from tablekeeper_server.etcd.apply import EtcdApplier
from tablekeeper_server.oxia.apply import OxiaApplier
from tablekeeper_server.range.apply import Appliers
from tablekeeper_server.range.bookkeeper_apply import BookKeeperApplier
from tablekeeper_server.range.session_apply import SessionApplier
from tablekeeper_server.zookeeper.apply import ZooKeeperApplier


def server_appliers() -> Appliers:
    """Every applier of the server. The order is the order in which a split asks them whether
    they refuse it (`Applier.refuse_split`): the front-ends' bookkeeping before sessions."""
    zookeeper = ZooKeeperApplier()
    return Appliers(
        [
            BookKeeperApplier(),
            EtcdApplier(),
            OxiaApplier(),
            zookeeper,
            SessionApplier(session_ending=(zookeeper.session_ending,)),
        ]
    )
