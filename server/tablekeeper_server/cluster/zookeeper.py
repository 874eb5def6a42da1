"""Cluster coordination in ZooKeeper (through kazoo): membership, controller election, the
container assignment, and container ownership epochs. It only reads, writes and watches;
decisions are made by `placement` and by the serving code.

Layout under `/tablekeeper/<cluster>`:

    metadata              ClusterMetadata{num_storage_containers}; written by `cluster init`,
                          raised by `cluster add-containers`
    servers/<endpoint>    ephemeral, one per live server (its gRPC host:port); its data is
                          "<endpoint>[ <front-end>=<host:port>...]": the protocol front-ends it
                          serves (etcd, oxia), so other servers can pass calls on to them
                          (nodes of older servers hold just the endpoint)
    controller/           kazoo Election: the live server that runs the controller
    assignment            ClusterAssignmentData{endpoint -> containers}; its ZooKeeper version is
                          the assignment's revision (writes are compare-and-set on it)
    owners/<container>    "<endpoint> <epoch>[ released]": the container's current owner;
                          every takeover raises the epoch by one (compare-and-set); "released"
                          once the owner has closed it (a live owner is given a few seconds
                          to do so before its logs are fenced)
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from tablekeeper_server.extras import require_kazoo

try:
    from kazoo.client import KazooClient, KazooState
    from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
    from kazoo.recipe.election import Election
except ModuleNotFoundError as exc:  # installed without the `cluster` extra
    require_kazoo(exc, "cluster mode (ZooKeeper)")

from tablekeeper_proto.bookkeeper import cluster_pb2
from tablekeeper_server.cluster.errors import ClusterError as ClusterError
from tablekeeper_server.cluster.placement import Assignment, compute_assignment
from tablekeeper_server.core.clock import Clock

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Ownership:
    endpoint: str
    epoch: int
    released: bool = False
    """The owner closed the container (the next owner need not wait for it)."""


def _encode_owner(ownership: Ownership) -> bytes:
    text = f"{ownership.endpoint} {ownership.epoch}"
    return (text + " released" if ownership.released else text).encode()


def _decode_owner(raw: bytes) -> Ownership:
    endpoint, epoch, *rest = raw.decode().split(" ")
    return Ownership(endpoint, int(epoch), released=rest == ["released"])


def _encode_server(endpoint: str, frontends: Mapping[str, str]) -> bytes:
    return " ".join(
        [endpoint, *(f"{name}={address}" for name, address in frontends.items())]
    ).encode()


def _decode_frontends(raw: bytes) -> dict[str, str]:
    """A server node's front-end addresses (none in an older server's node: just its endpoint)."""
    _, *fields = raw.decode().split(" ")
    return dict(field.split("=", 1) for field in fields if "=" in field)


class ZkCoordinator:
    """One server's (or tool's) connection to the cluster's coordination state.

    Blocking calls; kazoo runs watches and callbacks on its own threads. Session states are
    reported to listeners as "connected", "suspended" (stop acknowledging writes) and "lost"
    (close the containers: ephemeral nodes are gone, another owner may take over).
    """

    def __init__(
        self,
        hosts: str,
        cluster: str,
        *,
        session_timeout_s: float = 2.0,
        clock: Clock,
    ) -> None:
        if not cluster or "/" in cluster:
            raise ValueError(f"invalid cluster name {cluster!r}")
        self.root = f"/tablekeeper/{cluster}"
        self.clock = clock
        """What the hand-over wait and the controller's pauses run on (not ZooKeeper's own
        session timers, which are the client library's)."""
        self.zk = KazooClient(hosts=hosts, timeout=session_timeout_s)
        self._listeners: list[Callable[[str], None]] = []
        self._election: Election | None = None
        self._election_thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._connected = threading.Event()
        self._term = threading.Event()
        """Set when the current controller term must end (session lost, or stopping)."""
        self.zk.add_listener(self._on_state)
        self.frontends: dict[str, str] = {}
        """Front-end name (etcd, oxia) -> this server's address of it, published by
        `register`; set before registering."""

    # ------------------------------------------------------------------ session

    def start(self, timeout_s: float = 15.0) -> None:
        self.zk.start(timeout=timeout_s)
        self._connected.set()

    def stop(self) -> None:
        """Leave the election (ending `lead`), then close the session."""
        self._stopping.set()
        self._term.set()
        if self._election is not None:
            self._election.cancel()
        if self._election_thread is not None:
            self._election_thread.join(timeout=5)
        self.zk.stop()
        self.zk.close()

    @property
    def session_id(self) -> int:
        session = self.zk.client_id
        return int(session[0]) if session else 0

    def add_state_listener(self, listener: Callable[[str], None]) -> None:
        self._listeners.append(listener)

    def _on_state(self, state: str) -> None:
        name = {
            KazooState.CONNECTED: "connected",
            KazooState.SUSPENDED: "suspended",
            KazooState.LOST: "lost",
        }.get(state, str(state).lower())
        if name == "connected":
            self._connected.set()
        else:
            self._connected.clear()
        if name == "lost":
            self._term.set()  # our election node is gone: another server may lead now
        for listener in list(self._listeners):
            try:
                listener(name)
            except Exception:
                log.exception("session listener failed")

    # ------------------------------------------------------------------ metadata

    def init_cluster(self, num_containers: int) -> bool:
        """Create the cluster's nodes. True if created; False if it already exists with at least
        that many containers (it may have grown: `add_containers`); `ClusterError` if it exists
        with fewer."""
        if num_containers < 1:
            raise ValueError("a cluster needs at least one storage container")
        metadata = cluster_pb2.ClusterMetadata(num_storage_containers=num_containers)
        transaction = self.zk.transaction()
        self.zk.ensure_path("/tablekeeper")
        transaction.create(self.root, b"")
        transaction.create(f"{self.root}/metadata", metadata.SerializeToString())
        transaction.create(f"{self.root}/servers", b"")
        transaction.create(f"{self.root}/controller", b"")
        transaction.create(
            f"{self.root}/assignment", cluster_pb2.ClusterAssignmentData().SerializeToString()
        )
        transaction.create(f"{self.root}/owners", b"")
        results = transaction.commit()
        if not any(isinstance(r, Exception) for r in results):
            return True
        existing = self.num_containers()
        if existing < num_containers:
            raise ClusterError(
                f"cluster {self.root} already exists with {existing} containers, "
                f"not {num_containers} (more are added with `tablekeeper cluster add-containers`)"
            )
        return False

    def num_containers(self) -> int:
        try:
            raw, _ = self.zk.get(f"{self.root}/metadata")
        except NoNodeError as exc:
            raise ClusterError(
                f"cluster {self.root} is not initialised (run `tablekeeper cluster init`)"
            ) from exc
        return int(cluster_pb2.ClusterMetadata.FromString(raw).num_storage_containers)

    def add_containers(self, more: int) -> tuple[int, int]:
        """Raise the cluster's number of storage containers by `more` (a compare-and-set of the
        metadata node, repeated if another writer got there first); (before, after). Servers
        follow (`watch_num_containers`): the controller assigns the new containers and new
        tables are placed over all of them. Containers are never removed (their data would
        have to move first)."""
        if more < 1:
            raise ValueError("add at least one storage container")
        path = f"{self.root}/metadata"
        while True:
            try:
                raw, stat = self.zk.get(path)
            except NoNodeError as exc:
                raise ClusterError(
                    f"cluster {self.root} is not initialised (run `tablekeeper cluster init`)"
                ) from exc
            metadata = cluster_pb2.ClusterMetadata.FromString(raw)
            before = int(metadata.num_storage_containers)
            metadata.num_storage_containers = before + more
            try:
                self.zk.set(path, metadata.SerializeToString(), version=stat.version)
            except BadVersionError:
                continue
            log.info("cluster %s: storage containers %d -> %d", self.root, before, before + more)
            return before, before + more

    def watch_num_containers(self, callback: Callable[[int], None]) -> None:
        """Call `callback(number of containers)` now and whenever it changes."""

        def on_change(raw: bytes | None, stat: object) -> None:
            if raw is not None:
                callback(int(cluster_pb2.ClusterMetadata.FromString(raw).num_storage_containers))

        self.zk.DataWatch(f"{self.root}/metadata", on_change)

    # ------------------------------------------------------------------ membership

    def register(self, endpoint: str) -> None:
        """Announce this server as live (an ephemeral node, gone when the session ends)."""
        path = f"{self.root}/servers/{endpoint}"
        data = _encode_server(endpoint, self.frontends)
        try:
            self.zk.create(path, data, ephemeral=True)
        except NodeExistsError:
            # Our own node from a previous session that has not expired yet: replace it.
            self.zk.delete(path)
            self.zk.create(path, data, ephemeral=True)

    def deregister(self, endpoint: str) -> None:
        """Stop being a live server (before shutting down: the controller moves our containers
        while we can still hand them over)."""
        with contextlib.suppress(NoNodeError):
            self.zk.delete(f"{self.root}/servers/{endpoint}")

    def live_servers(self) -> list[str]:
        return sorted(self.zk.get_children(f"{self.root}/servers"))

    def server_frontends(self, endpoint: str) -> dict[str, str] | None:
        """The front-end addresses live server `endpoint` published (None: not live)."""
        try:
            raw, _ = self.zk.get(f"{self.root}/servers/{endpoint}")
        except NoNodeError:
            return None
        return _decode_frontends(raw)

    def watch_servers(self, callback: Callable[[list[str]], None]) -> None:
        """Call `callback(sorted endpoints)` now and whenever membership changes."""

        def on_change(children: list[str]) -> None:
            callback(sorted(children))

        self.zk.ChildrenWatch(f"{self.root}/servers", on_change)

    # ------------------------------------------------------------------ assignment

    def read_assignment(self) -> tuple[Assignment, int]:
        raw, stat = self.zk.get(f"{self.root}/assignment")
        return _decode_assignment(raw), int(stat.version)

    def write_assignment(self, assignment: Assignment, expected_version: int) -> bool:
        """Compare-and-set the assignment; False if someone else wrote it first."""
        data = cluster_pb2.ClusterAssignmentData()
        for endpoint, containers in assignment.items():
            data.servers[endpoint].containers.extend(sorted(containers))
        try:
            self.zk.set(f"{self.root}/assignment", data.SerializeToString(), expected_version)
        except BadVersionError:
            return False
        return True

    def watch_assignment(self, callback: Callable[[Assignment, int], None]) -> None:
        """Call `callback(assignment, version)` now and on every change."""

        def on_change(raw: bytes | None, stat: object) -> None:
            if raw is not None:
                callback(_decode_assignment(raw), int(getattr(stat, "version", -1)))

        self.zk.DataWatch(f"{self.root}/assignment", on_change)

    # ------------------------------------------------------------------ ownership

    def owner(self, container: int) -> Ownership | None:
        try:
            raw, _ = self.zk.get(f"{self.root}/owners/{container}")
        except NoNodeError:
            return None
        return _decode_owner(raw)

    def claim(
        self,
        container: int,
        endpoint: str,
        *,
        handoff_timeout_s: float = 5.0,
        still_wanted: Callable[[], bool] = lambda: True,
    ) -> int:
        """Make `endpoint` the owner of `container` with a new, higher epoch; return it.

        A live previous owner gets up to `handoff_timeout_s` to close the container and
        `release` it (so the requests it is finishing are not cut off by fencing); a dead or
        released one is taken over at once. Returns 0 without claiming if `still_wanted()`
        turns false meanwhile (the assignment moved on). Compare-and-set against concurrent
        claims: of two
        claimants, one wins each round and the other sees the higher epoch on its retry. The
        caller must then fence the container's logs (opening them does) before serving.
        """
        path = f"{self.root}/owners/{container}"
        deadline = self.clock.monotonic_s() + handoff_timeout_s
        while True:
            try:
                raw, stat = self.zk.get(path)
            except NoNodeError:
                try:
                    self.zk.create(path, _encode_owner(Ownership(endpoint, 1)))
                    return 1
                except NodeExistsError:
                    continue
            current = _decode_owner(raw)
            if (
                current.endpoint != endpoint
                and not current.released
                and self.clock.monotonic_s() < deadline
                and current.endpoint in self.live_servers()
            ):
                if not still_wanted():
                    return 0
                self.clock.sleep_blocking(
                    0.05
                )  # the previous owner is alive and closing: let it finish
                continue
            epoch = current.epoch + 1
            try:
                self.zk.set(path, _encode_owner(Ownership(endpoint, epoch)), stat.version)
                return epoch
            except BadVersionError:
                continue

    def release(self, container: int, endpoint: str, epoch: int) -> None:
        """Say the container is closed here, if we still own it at `epoch` (the next owner may
        then take over without waiting)."""
        path = f"{self.root}/owners/{container}"
        try:
            raw, stat = self.zk.get(path)
            if _decode_owner(raw) == Ownership(endpoint, epoch):
                released = Ownership(endpoint, epoch, released=True)
                self.zk.set(path, _encode_owner(released), stat.version)
        except (NoNodeError, BadVersionError):
            pass

    # ------------------------------------------------------------------ controller

    def run_for_controller(self, endpoint: str, lead: Callable[[threading.Event], None]) -> None:
        """Contend for the controller role in a background thread, for as long as this
        coordinator runs. `lead(term)` runs while this server is the controller and must return
        soon after `term` is set: by `stop()`, or when the session is lost (the election node
        goes with it, so another server may be elected). After a lost session the server
        contends again once reconnected."""

        def campaign() -> None:
            while not self._stopping.is_set():
                if not self.clock.wait_blocking(self._connected, 0.5):
                    continue
                self._term = threading.Event()
                election = Election(self.zk, f"{self.root}/controller", endpoint)
                self._election = election
                try:
                    election.run(lead, self._term)
                except Exception as exc:  # connection loss while contending: try again
                    log.info("controller election interrupted: %s", exc)
                self.clock.wait_blocking(self._stopping, 0.2)

        thread = threading.Thread(target=campaign, name="tablekeeper-controller", daemon=True)
        self._election_thread = thread
        thread.start()

    def controller(self) -> str | None:
        contenders = Election(self.zk, f"{self.root}/controller").contenders()
        return str(contenders[0]) if contenders else None


def _decode_assignment(raw: bytes) -> Assignment:
    data = cluster_pb2.ClusterAssignmentData.FromString(raw)
    return {endpoint: frozenset(s.containers) for endpoint, s in data.servers.items()}


RECONCILE_INTERVAL_S = 5.0
"""The controller and each server reconcile at least this often, in case a watch was missed or a
container failed to start."""


class Controller:
    """Keeps the assignment equal to the placement of the live servers. Run by the elected
    controller only; reacts to membership changes at once (no throttle)."""

    def __init__(self, coordinator: ZkCoordinator) -> None:
        self._zk = coordinator
        self._changed = threading.Event()

    def reconcile(self) -> bool:
        """One compare-and-set round; True if the assignment is now what placement wants."""
        assignment, version = self._zk.read_assignment()
        # Read each round: `cluster add-containers` may have raised it.
        containers = self._zk.num_containers()
        wanted = compute_assignment(self._zk.live_servers(), containers, assignment)
        if _nonempty(wanted) == _nonempty(assignment):
            return True
        if self._zk.write_assignment(wanted, version):
            log.info("controller: new assignment %s", _describe(wanted))
            return True
        return False

    def lead(self, stop: threading.Event) -> None:
        """The body of `run_for_controller`: reconcile on every membership change (and every
        few seconds, in case a change was missed) until `stop`."""
        log.info("this server is the controller now")
        self._zk.watch_servers(lambda _: self._changed.set())
        self._zk.watch_num_containers(lambda _: self._changed.set())
        self._changed.set()
        clock = self._zk.clock
        last = 0.0
        while not stop.is_set():
            # Short waits: `stop` must end the term promptly (a server shutting down waits).
            if not clock.wait_blocking(self._changed, 0.2) and (
                clock.monotonic_s() - last < RECONCILE_INTERVAL_S
            ):
                continue
            self._changed.clear()
            last = clock.monotonic_s()
            while not stop.is_set():
                try:
                    if self.reconcile():
                        break
                except Exception as exc:  # ZooKeeper unreachable for now: retry
                    log.warning("controller: reconcile failed: %s", exc)
                    clock.wait_blocking(stop, 0.5)
        log.info("controller term ended")


def _nonempty(assignment: Assignment) -> Assignment:
    return {server: containers for server, containers in assignment.items() if containers}


def _describe(assignment: Assignment) -> str:
    return ", ".join(f"{s}: {sorted(c)}" for s, c in sorted(assignment.items()))
