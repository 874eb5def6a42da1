package io.tablekeeper.compat.zookeeper;

import static io.tablekeeper.compat.zookeeper.Observations.check;
import static io.tablekeeper.compat.zookeeper.Observations.require;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.stream.Collectors;
import org.apache.zookeeper.AddWatchMode;
import org.apache.zookeeper.CreateMode;
import org.apache.zookeeper.KeeperException;
import org.apache.zookeeper.Op;
import org.apache.zookeeper.OpResult;
import org.apache.zookeeper.WatchedEvent;
import org.apache.zookeeper.Watcher;
import org.apache.zookeeper.ZooDefs;
import org.apache.zookeeper.ZooKeeper;
import org.apache.zookeeper.data.ACL;
import org.apache.zookeeper.data.Id;
import org.apache.zookeeper.data.Stat;
import org.apache.zookeeper.server.auth.DigestAuthenticationProvider;

/**
 * The ZooKeeper Java client (3.9) through its public API against a ZooKeeper server: CRUD with
 * stats, sequential/ephemeral/container nodes, multi and its per-op results, one-shot,
 * persistent and recursive watches, removeWatches, ACLs with digest auth, whoAmI, sessions whose
 * ephemerals go when they close, and a pipelined burst of asynchronous calls.
 *
 * <p>Usage: {@code ZooKeeperClientCompat CONNECT_STRING BASE_PATH}; BASE_PATH must not exist.
 * Every observation is printed as JSON (see {@link Observations}); values never contain zxids,
 * times or session ids, only how they relate.
 */
public final class ZooKeeperClientCompat {
    static final int SESSION_TIMEOUT_MS = 30_000;
    /** A session that expires within seconds of its client going quiet. */
    static final int SHORT_SESSION_TIMEOUT_MS = 4_000;
    static final long WAIT_S = 120; // a hang guard, not a performance bound
    static final byte[] EMPTY = new byte[0];

    private final String connect;
    private final String base;

    private ZooKeeperClientCompat(String connect, String base) {
        this.connect = connect;
        this.base = base;
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 2) {
            System.err.println("usage: ZooKeeperClientCompat CONNECT_STRING BASE_PATH");
            System.exit(2);
        }
        new ZooKeeperClientCompat(args[0], args[1]).run();
        System.exit(0);
    }

    /** A connected client; events of its default watcher (connection states) are dropped. */
    ZooKeeper connect() throws Exception {
        return connect(SESSION_TIMEOUT_MS);
    }

    ZooKeeper connect(int sessionTimeoutMs) throws Exception {
        CountDownLatch connected = new CountDownLatch(1);
        ZooKeeper zk =
                new ZooKeeper(
                        connect,
                        sessionTimeoutMs,
                        event -> {
                            if (event.getState() == Watcher.Event.KeeperState.SyncConnected) {
                                connected.countDown();
                            }
                        });
        require(connected.await(WAIT_S, TimeUnit.SECONDS), "no connection to " + connect);
        return zk;
    }

    static String stat(Stat s) {
        return String.format(
                "version=%d cversion=%d aversion=%d dataLength=%d numChildren=%d ephemeral=%b",
                s.getVersion(),
                s.getCversion(),
                s.getAversion(),
                s.getDataLength(),
                s.getNumChildren(),
                s.getEphemeralOwner() != 0);
    }

    static byte[] bytes(String text) {
        return text.getBytes(StandardCharsets.UTF_8);
    }

    static String text(byte[] data) {
        return data == null ? "null" : new String(data, StandardCharsets.UTF_8);
    }

    /** Events of one-shot and persistent watchers, in the order the client delivered them. */
    static final class Recorder implements Watcher {
        final BlockingQueue<WatchedEvent> events = new LinkedBlockingQueue<>();

        @Override
        public void process(WatchedEvent event) {
            if (event.getType() != Event.EventType.None) {
                events.add(event);
            }
        }

        String next(String base) throws InterruptedException {
            WatchedEvent event = events.poll(WAIT_S, TimeUnit.SECONDS);
            require(event != null, "no watch event within " + WAIT_S + " s");
            return event.getType() + " " + event.getPath().substring(base.length());
        }
    }

    /**
     * Every event delivered to {@code recorder} for {@code zk}'s changes so far: a marker node's
     * NodeCreated comes after them (a server sends a session's events in order), so the list is
     * complete when it arrives.
     */
    List<String> fence(ZooKeeper zk, Recorder recorder, String marker) throws Exception {
        zk.exists(marker, recorder);
        zk.create(marker, EMPTY, ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT);
        List<String> seen = new ArrayList<>();
        while (true) {
            String event = recorder.next(base);
            if (event.equals("NodeCreated " + marker.substring(base.length()))) {
                return seen;
            }
            seen.add(event);
        }
    }

    void run() throws Exception {
        ZooKeeper zk = connect();
        zk.create(base, EMPTY, ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT);
        crud(zk);
        sequentialEphemeralContainer(zk);
        multi(zk);
        watches(zk);
        persistentWatches(zk);
        acls(zk);
        sessions(zk);
        pipelined(zk);
        zk.close();
    }

    void crud(ZooKeeper zk) {
        String a = base + "/a";
        check(
                "create.persistent",
                () -> {
                    Stat s = new Stat();
                    String path =
                            zk.create(a, bytes("hello"), ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT, s);
                    return path.equals(a)
                            + " "
                            + stat(s)
                            + " czxid=mzxid=pzxid:"
                            + (s.getCzxid() == s.getMzxid() && s.getMzxid() == s.getPzxid());
                });
        check(
                "create.exists",
                () -> zk.create(a, EMPTY, ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT));
        check(
                "create.no_parent",
                () -> zk.create(base + "/nope/x", EMPTY, ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT));
        check(
                "create.bad_path",
                () -> zk.create(base + "/x/", EMPTY, ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT));
        check(
                "getData",
                () -> {
                    Stat s = new Stat();
                    byte[] data = zk.getData(a, false, s);
                    return text(data) + " " + stat(s);
                });
        check(
                "setData.version",
                () -> {
                    Stat before = zk.exists(a, false);
                    Stat after = zk.setData(a, bytes("bye"), 0);
                    return stat(after)
                            + " mzxid_grew:"
                            + (after.getMzxid() > before.getMzxid())
                            + " czxid_kept:"
                            + (after.getCzxid() == before.getCzxid());
                });
        check("setData.bad_version", () -> zk.setData(a, bytes("x"), 0));
        check("setData.any_version", () -> stat(zk.setData(a, bytes("any"), -1)));
        check("setData.missing", () -> zk.setData(base + "/missing", EMPTY, -1));
        check("getData.missing", () -> zk.getData(base + "/missing", false, null));
        check("exists.missing", () -> zk.exists(base + "/missing", false));
        check(
                "getChildren2",
                () -> {
                    for (String name : List.of("c2", "c0", "c1")) {
                        zk.create(a + "/" + name, EMPTY, ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT);
                    }
                    zk.create(a + "/c1/grandchild", EMPTY, ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT);
                    Stat s = new Stat();
                    List<String> children = new ArrayList<>(zk.getChildren(a, false, s));
                    Collections.sort(children);
                    return children + " " + stat(s);
                });
        check("getAllChildrenNumber", () -> zk.getAllChildrenNumber(a));
        check("delete.not_empty", () -> deleted(zk, a + "/c1", -1));
        check("delete.bad_version", () -> deleted(zk, a + "/c0", 3));
        check(
                "delete",
                () -> {
                    zk.delete(a + "/c0", 0);
                    Stat s = zk.exists(a, false);
                    return "gone:" + (zk.exists(a + "/c0", false) == null) + " parent " + stat(s);
                });
        check("delete.missing", () -> deleted(zk, a + "/c0", -1));
        check(
                "sync",
                () -> {
                    CountDownLatch done = new CountDownLatch(1);
                    AtomicInteger rc = new AtomicInteger(Integer.MIN_VALUE);
                    String[] synced = new String[1];
                    zk.sync(
                            a,
                            (code, path, ctx) -> {
                                rc.set(code);
                                synced[0] = path;
                                done.countDown();
                            },
                            null);
                    require(done.await(WAIT_S, TimeUnit.SECONDS), "sync never answered");
                    return KeeperException.Code.get(rc.get()) + " " + synced[0].equals(a);
                });
    }

    void sequentialEphemeralContainer(ZooKeeper zk) throws Exception {
        String parent = base + "/seq";
        zk.create(parent, EMPTY, ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT);
        check(
                "create.sequential",
                () -> {
                    List<String> names = new ArrayList<>();
                    names.add(zk.create(parent + "/q-", EMPTY, ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT_SEQUENTIAL));
                    zk.create(parent + "/plain", EMPTY, ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT);
                    names.add(zk.create(parent + "/q-", EMPTY, ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT_SEQUENTIAL));
                    names.add(zk.create(parent + "/e-", EMPTY, ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.EPHEMERAL_SEQUENTIAL));
                    return names.stream().map(n -> n.substring(parent.length() + 1)).collect(Collectors.toList());
                });
        check(
                "create.ephemeral",
                () -> {
                    Stat s = new Stat();
                    zk.create(parent + "/eph", bytes("e"), ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.EPHEMERAL, s);
                    return stat(s) + " owner_is_session:" + (s.getEphemeralOwner() == zk.getSessionId());
                });
        check(
                "create.under_ephemeral",
                () -> zk.create(parent + "/eph/child", EMPTY, ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT));
        check(
                "getEphemerals",
                () -> {
                    List<String> paths = new ArrayList<>(zk.getEphemerals(parent));
                    Collections.sort(paths);
                    return paths.stream().map(p -> p.substring(parent.length())).collect(Collectors.toList());
                });
        check(
                "create.container",
                () -> {
                    Stat s = new Stat();
                    zk.create(base + "/container", EMPTY, ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.CONTAINER, s);
                    zk.create(base + "/container/child", EMPTY, ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT);
                    return stat(zk.exists(base + "/container", false));
                });
    }

    void multi(ZooKeeper zk) {
        String m = base + "/multi";
        check(
                "multi.ok",
                () -> {
                    List<OpResult> results =
                            zk.multi(
                                    List.of(
                                            Op.create(m, bytes("m"), ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT),
                                            Op.create(m + "/s-", EMPTY, ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT_SEQUENTIAL),
                                            Op.setData(m, bytes("m2"), 0),
                                            Op.check(m, 1),
                                            Op.create(m + "/gone", EMPTY, ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT),
                                            Op.delete(m + "/gone", 0)));
                    return results.stream().map(ZooKeeperClientCompat::result).collect(Collectors.toList());
                });
        check(
                "multi.failed",
                () -> {
                    try {
                        zk.multi(
                                List.of(
                                        Op.create(m + "/new", EMPTY, ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT),
                                        Op.check(m, 0),
                                        Op.setData(m, bytes("never"), -1)));
                        return "committed";
                    } catch (KeeperException e) {
                        return e.code()
                                + " "
                                + e.getResults().stream().map(ZooKeeperClientCompat::result).collect(Collectors.toList())
                                + " new_absent:"
                                + (zk.exists(m + "/new", false) == null)
                                + " data:"
                                + text(zk.getData(m, false, null));
                    }
                });
        check(
                "transaction.commit",
                () ->
                        zk.transaction()
                                .create(m + "/t", EMPTY, ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT)
                                .setData(m + "/t", bytes("t"), 0)
                                .commit()
                                .stream()
                                .map(ZooKeeperClientCompat::result)
                                .collect(Collectors.toList()));
        check(
                "multiRead",
                () ->
                        zk.multi(List.of(Op.getData(m + "/t"), Op.getChildren(m), Op.getData(m + "/missing")))
                                .stream()
                                .map(ZooKeeperClientCompat::result)
                                .collect(Collectors.toList()));
    }

    static String deleted(ZooKeeper zk, String path, int version) throws Exception {
        zk.delete(path, version);
        return "deleted";
    }

    static String result(OpResult r) {
        if (r instanceof OpResult.CreateResult c) {
            return "create " + c.getPath().substring(c.getPath().lastIndexOf('/') + 1)
                    + (c.getStat() == null ? "" : " " + c.getStat().getVersion());
        } else if (r instanceof OpResult.SetDataResult s) {
            return "set " + s.getStat().getVersion();
        } else if (r instanceof OpResult.CheckResult) {
            return "check";
        } else if (r instanceof OpResult.DeleteResult) {
            return "delete";
        } else if (r instanceof OpResult.GetDataResult g) {
            return "data " + text(g.getData()) + " " + g.getStat().getVersion();
        } else if (r instanceof OpResult.GetChildrenResult g) {
            List<String> children = new ArrayList<>(g.getChildren());
            Collections.sort(children);
            return "children " + children.stream().map(c -> c.replaceAll("\\d{10}$", "N")).collect(Collectors.toList());
        } else if (r instanceof OpResult.ErrorResult e) {
            return "error " + KeeperException.Code.get(e.getErr());
        }
        return r.getClass().getSimpleName();
    }

    void watches(ZooKeeper zk) throws Exception {
        String w = base + "/w";
        zk.create(w, EMPTY, ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT);
        Recorder recorder = new Recorder();
        check(
                "watch.one_shot",
                () -> {
                    zk.getData(w, recorder, null);
                    zk.getChildren(w, recorder);
                    zk.exists(w + "/x", recorder);
                    zk.setData(w, bytes("1"), -1);
                    zk.setData(w, bytes("2"), -1); // the data watch fired once already
                    zk.create(w + "/x", EMPTY, ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT);
                    zk.create(w + "/y", EMPTY, ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT);
                    zk.getData(w + "/x", recorder, null);
                    zk.delete(w + "/x", -1);
                    return fence(zk, recorder, base + "/w-fence1");
                });
        check(
                "watch.same_watcher_once",
                () -> {
                    // One watcher object set by getData and exists on one node: told once.
                    zk.getData(w + "/y", recorder, null);
                    zk.exists(w + "/y", recorder);
                    zk.setData(w + "/y", bytes("y"), -1);
                    return fence(zk, recorder, base + "/w-fence2");
                });
        check(
                "removeWatches",
                () -> {
                    zk.getData(w + "/y", recorder, null);
                    zk.removeWatches(w + "/y", recorder, Watcher.WatcherType.Data, false);
                    String removed = recorder.next(base);
                    zk.setData(w + "/y", bytes("z"), -1);
                    return removed + " then " + fence(zk, recorder, base + "/w-fence3");
                });
        check(
                "removeWatches.none",
                () -> {
                    zk.removeWatches(w + "/y", recorder, Watcher.WatcherType.Children, false);
                    return "removed";
                });
    }

    void persistentWatches(ZooKeeper zk) throws Exception {
        String p = base + "/p";
        // The persistent watch on a session of its own: a server keeps one watch mode per
        // connection and path (ZooKeeper before 3.9 replaced one mode with the other).
        ZooKeeper second = connect();
        zk.create(p, EMPTY, ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT);
        Recorder recursive = new Recorder();
        Recorder persistent = new Recorder();
        check(
                "addWatch",
                () -> {
                    zk.addWatch(p, recursive, AddWatchMode.PERSISTENT_RECURSIVE);
                    second.addWatch(p, persistent, AddWatchMode.PERSISTENT);
                    zk.create(p + "/a", EMPTY, ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT);
                    zk.create(p + "/a/b", EMPTY, ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT);
                    zk.setData(p + "/a/b", bytes("1"), -1);
                    zk.setData(p, bytes("1"), -1);
                    zk.setData(p, bytes("2"), -1);
                    zk.delete(p + "/a/b", -1);
                    zk.delete(p + "/a", -1);
                    zk.create(p + "/end", EMPTY, ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT);
                    List<String> seen = new ArrayList<>();
                    while (true) {
                        String event = recursive.next(base);
                        seen.add(event);
                        if (event.equals("NodeCreated /p/end")) {
                            break;
                        }
                    }
                    // The persistent (not recursive) watcher: the node and its children list.
                    List<String> own = new ArrayList<>();
                    while (true) {
                        String event = persistent.next(base);
                        own.add(event);
                        if (event.equals("NodeChildrenChanged /p") && own.size() >= 5) {
                            break;
                        }
                    }
                    return "recursive " + seen + " persistent " + own;
                });
        check(
                "removeWatches.persistent_recursive",
                () -> {
                    zk.removeWatches(p, recursive, Watcher.WatcherType.PersistentRecursive, false);
                    return recursive.next(base);
                });
        second.close();
    }

    void acls(ZooKeeper zk) throws Exception {
        String secret = base + "/secret";
        String digest = DigestAuthenticationProvider.generateDigest("alice:pw");
        // Mutable lists: the client looks for null in them, which List.of refuses to be asked.
        List<ACL> aliceOnly = new ArrayList<>(List.of(new ACL(ZooDefs.Perms.ALL, new Id("digest", digest))));
        ZooKeeper other = connect();
        try {
            check(
                    "acl.create_digest",
                    () -> {
                        zk.create(secret, bytes("s"), aliceOnly, CreateMode.PERSISTENT);
                        return zk.getACL(secret, new Stat());
                    });
            check("acl.read_without_auth", () -> text(other.getData(secret, false, null)));
            check("acl.set_without_auth", () -> other.setData(secret, bytes("x"), -1));
            check(
                    "acl.read_with_auth",
                    () -> {
                        other.addAuthInfo("digest", bytes("alice:pw"));
                        return text(other.getData(secret, false, null));
                    });
            check(
                    "acl.whoAmI",
                    () ->
                            other.whoAmI().stream()
                                    .map(info -> info.getAuthScheme() + ":" + info.getUser())
                                    .sorted()
                                    .collect(Collectors.toList()));
            check(
                    "acl.auth_scheme",
                    () -> {
                        other.create(secret + "/mine", EMPTY, ZooDefs.Ids.CREATOR_ALL_ACL, CreateMode.PERSISTENT);
                        Stat s = new Stat();
                        List<ACL> acl = other.getACL(secret + "/mine", s);
                        return acl + " " + stat(s);
                    });
            check(
                    "acl.setACL",
                    () -> {
                        Stat s = other.setACL(secret, ZooDefs.Ids.READ_ACL_UNSAFE, 0);
                        return stat(s) + " then " + text(zk.getData(secret, false, null));
                    });
            check("acl.setACL.bad_version", () -> other.setACL(secret, ZooDefs.Ids.OPEN_ACL_UNSAFE, 0));
            check("acl.write_read_only", () -> zk.setData(secret, bytes("x"), -1));
            check(
                    "acl.invalid",
                    () ->
                            zk.create(
                                    base + "/bad-acl",
                                    EMPTY,
                                    new ArrayList<>(List.of(new ACL(ZooDefs.Perms.ALL, new Id("nosuchscheme", "x")))),
                                    CreateMode.PERSISTENT));
        } finally {
            other.close();
        }
    }

    void sessions(ZooKeeper zk) throws Exception {
        String s = base + "/sessions";
        zk.create(s, EMPTY, ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT);
        check(
                "session.close_deletes_ephemerals",
                () -> {
                    ZooKeeper second = connect();
                    second.create(s + "/e1", EMPTY, ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.EPHEMERAL);
                    second.create(s + "/e2-", EMPTY, ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.EPHEMERAL_SEQUENTIAL);
                    Recorder recorder = new Recorder();
                    zk.exists(s + "/e1", recorder);
                    zk.getChildren(s, recorder);
                    Stat before = zk.exists(s, false);
                    second.close();
                    List<String> events = new ArrayList<>(List.of(recorder.next(base), recorder.next(base)));
                    Collections.sort(events);
                    Stat after = zk.exists(s, false);
                    return events
                            + " children:"
                            + zk.getChildren(s, false)
                            + " numChildren:"
                            + after.getNumChildren()
                            + " cversion+2:"
                            + (after.getCversion() == before.getCversion() + 2)
                            + " pzxid_grew:"
                            + (after.getPzxid() > before.getPzxid());
                });
        check(
                "session.abandoned_expires",
                () -> {
                    // A client that stops talking (its side made to believe the session
                    // expired): the server ends the session after its timeout, and its ephemeral
                    // goes with the events watchers of other sessions asked for.
                    ZooKeeper abandoned = connect(SHORT_SESSION_TIMEOUT_MS);
                    abandoned.create(s + "/abandoned", EMPTY, ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.EPHEMERAL);
                    Recorder recorder = new Recorder();
                    zk.exists(s + "/abandoned", recorder);
                    abandoned.getTestable().injectSessionExpiration();
                    String event = recorder.next(base);
                    abandoned.close();
                    return event + " gone:" + (zk.exists(s + "/abandoned", false) == null);
                });
        check(
                "session.wrong_password",
                () -> {
                    // A connect request naming a live session with a wrong password: answered
                    // expired; the session lives on. ZooKeeper also closes the connection the
                    // session had (it closes it for any connect request naming the session), so
                    // its client reconnects.
                    BlockingQueue<Watcher.Event.KeeperState> states = new LinkedBlockingQueue<>();
                    ZooKeeper original = new ZooKeeper(connect, SESSION_TIMEOUT_MS, event -> states.add(event.getState()));
                    require(states.poll(WAIT_S, TimeUnit.SECONDS) == Watcher.Event.KeeperState.SyncConnected, "no connection");
                    original.create(s + "/original", EMPTY, ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.EPHEMERAL);
                    CountDownLatch expired = new CountDownLatch(1);
                    ZooKeeper bad =
                            new ZooKeeper(
                                    connect,
                                    SESSION_TIMEOUT_MS,
                                    event -> {
                                        if (event.getState() == Watcher.Event.KeeperState.Expired) {
                                            expired.countDown();
                                        }
                                    },
                                    original.getSessionId(),
                                    new byte[16]);
                    boolean told = expired.await(WAIT_S, TimeUnit.SECONDS);
                    bad.close();
                    // The original's next call: on a connection the server closed it fails with
                    // CONNECTIONLOSS and the client reconnects; retried until it is answered.
                    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(WAIT_S);
                    Stat alive = null;
                    while (alive == null && System.nanoTime() < deadline) {
                        try {
                            alive = original.exists(s + "/original", false);
                            require(alive != null, "the original session's ephemeral is gone");
                        } catch (KeeperException.ConnectionLossException e) {
                            Thread.sleep(50);
                        }
                    }
                    List<Watcher.Event.KeeperState> seen = new ArrayList<>();
                    states.drainTo(seen);
                    original.close();
                    return "expired:" + told
                            + " original_alive:" + (alive != null && alive.getEphemeralOwner() == original.getSessionId())
                            + " original_disconnected:" + seen.contains(Watcher.Event.KeeperState.Disconnected);
                });
    }

    void pipelined(ZooKeeper zk) throws Exception {
        String q = base + "/pipelined";
        zk.create(q, EMPTY, ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT);
        int n = 2_000;
        check(
                "async.pipelined",
                () -> {
                    List<Integer> order = Collections.synchronizedList(new ArrayList<>());
                    AtomicInteger failures = new AtomicInteger();
                    CountDownLatch done = new CountDownLatch(n);
                    for (int i = 0; i < n; i++) {
                        final int index = i;
                        if (i % 2 == 0) {
                            zk.create(
                                    q + "/n-",
                                    bytes(Integer.toString(i)),
                                    ZooDefs.Ids.OPEN_ACL_UNSAFE,
                                    CreateMode.PERSISTENT_SEQUENTIAL,
                                    (rc, path, ctx, name) -> {
                                        if (rc != 0) {
                                            failures.incrementAndGet();
                                        }
                                        order.add(index);
                                        done.countDown();
                                    },
                                    null);
                        } else {
                            zk.getChildren(
                                    q,
                                    false,
                                    (rc, path, ctx, children, stat) -> {
                                        // Every create sent before this read is in its answer.
                                        if (rc != 0 || children.size() != (index + 1) / 2) {
                                            failures.incrementAndGet();
                                        }
                                        order.add(index);
                                        done.countDown();
                                    },
                                    null);
                        }
                    }
                    require(done.await(WAIT_S, TimeUnit.SECONDS), "not every call answered");
                    boolean inOrder = true;
                    for (int i = 0; i < n; i++) {
                        inOrder &= order.get(i) == i;
                    }
                    return "answered:" + order.size() + " in_order:" + inOrder + " failures:" + failures.get()
                            + " children:" + zk.getAllChildrenNumber(q);
                });
    }
}
