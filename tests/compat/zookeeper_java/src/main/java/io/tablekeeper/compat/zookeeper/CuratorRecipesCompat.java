package io.tablekeeper.compat.zookeeper;

import static io.tablekeeper.compat.zookeeper.Observations.check;
import static io.tablekeeper.compat.zookeeper.Observations.require;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.BooleanSupplier;
import java.util.stream.Collectors;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.atomic.AtomicValue;
import org.apache.curator.framework.recipes.atomic.DistributedAtomicLong;
import org.apache.curator.framework.recipes.cache.CuratorCache;
import org.apache.curator.framework.recipes.cache.CuratorCacheListener;
import org.apache.curator.framework.recipes.cache.TreeCache;
import org.apache.curator.framework.recipes.cache.TreeCacheEvent;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.nodes.PersistentNode;
import org.apache.curator.framework.recipes.shared.SharedCount;
import org.apache.curator.framework.recipes.shared.SharedCountListener;
import org.apache.curator.framework.recipes.shared.SharedCountReader;
import org.apache.curator.framework.recipes.watch.PersistentWatcher;
import org.apache.curator.framework.state.ConnectionState;
import org.apache.curator.retry.ExponentialBackoffRetry;
import org.apache.zookeeper.CreateMode;
import org.apache.zookeeper.WatchedEvent;
import org.apache.zookeeper.Watcher;
import org.apache.zookeeper.ZooKeeper;

/**
 * Apache Curator's recipes (5.x) against a ZooKeeper server: InterProcessMutex, LeaderLatch,
 * CuratorCache, TreeCache, DistributedAtomicLong, PersistentNode, PersistentWatcher and
 * SharedCount, each over several clients (sessions) at once.
 *
 * <p>Usage: {@code CuratorRecipesCompat CONNECT_STRING BASE_PATH}; BASE_PATH must not exist.
 * Every observation is printed as JSON (see {@link Observations}).
 */
public final class CuratorRecipesCompat {
    static final int SESSION_TIMEOUT_MS = 30_000;
    /** A session that expires within seconds of its client going quiet. */
    static final int SHORT_SESSION_TIMEOUT_MS = 4_000;
    static final long WAIT_S = 120; // a hang guard, not a performance bound

    private final String connect;
    private final String base;
    private final List<CuratorFramework> clients = new ArrayList<>();

    private CuratorRecipesCompat(String connect, String base) {
        this.connect = connect;
        this.base = base;
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 2) {
            System.err.println("usage: CuratorRecipesCompat CONNECT_STRING BASE_PATH");
            System.exit(2);
        }
        CuratorRecipesCompat driver = new CuratorRecipesCompat(args[0], args[1]);
        try {
            driver.run();
        } finally {
            for (CuratorFramework client : driver.clients) {
                client.close();
            }
        }
        System.exit(0);
    }

    CuratorFramework client() throws InterruptedException {
        return client(SESSION_TIMEOUT_MS);
    }

    CuratorFramework client(int sessionTimeoutMs) throws InterruptedException {
        CuratorFramework client =
                CuratorFrameworkFactory.builder()
                        .connectString(connect)
                        .sessionTimeoutMs(sessionTimeoutMs)
                        .connectionTimeoutMs(SESSION_TIMEOUT_MS)
                        .retryPolicy(new ExponentialBackoffRetry(100, 10, 2_000))
                        .build();
        client.start();
        require(client.blockUntilConnected((int) WAIT_S, TimeUnit.SECONDS), "no connection to " + connect);
        clients.add(client);
        return client;
    }

    static byte[] bytes(String text) {
        return text.getBytes(StandardCharsets.UTF_8);
    }

    static void waitFor(BooleanSupplier condition, String what) throws InterruptedException {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(WAIT_S);
        while (!condition.getAsBoolean()) {
            require(System.nanoTime() < deadline, "never: " + what);
            Thread.sleep(10);
        }
    }

    void run() throws Exception {
        CuratorFramework main = client();
        main.create().forPath(base);
        check("mutex", this::mutex);
        check("mutex.holder_killed", this::mutexHolderKilled);
        check("leaderLatch", this::leaderLatch);
        check("curatorCache", this::curatorCache);
        check("treeCache", this::treeCache);
        check("distributedAtomicLong", this::atomicLong);
        check("persistentNode", this::persistentNode);
        check("persistentWatcher", this::persistentWatcher);
        check("sharedCount", this::sharedCount);
    }

    /**
     * Four clients, each taking the lock 25 times and doing a read-modify-write of a node's
     * value (no version) while holding it: no two ever hold it at once, no update is lost.
     */
    Object mutex() throws Exception {
        String lockPath = base + "/lock";
        String counter = base + "/lock-counter";
        CuratorFramework first = clients.get(0);
        first.create().forPath(counter, bytes("0"));
        int threads = 4;
        int rounds = 25;
        AtomicInteger holders = new AtomicInteger();
        AtomicInteger maxHolders = new AtomicInteger();
        List<CuratorFramework> mine = new ArrayList<>();
        for (int i = 0; i < threads; i++) {
            mine.add(client());
        }
        ExecutorService pool = Executors.newFixedThreadPool(threads);
        try {
            List<Future<Integer>> done = new ArrayList<>();
            for (CuratorFramework client : mine) {
                done.add(
                        pool.submit(
                                () -> {
                                    InterProcessMutex mutex = new InterProcessMutex(client, lockPath);
                                    for (int r = 0; r < rounds; r++) {
                                        require(mutex.acquire(WAIT_S, TimeUnit.SECONDS), "lock not acquired");
                                        try {
                                            maxHolders.accumulateAndGet(holders.incrementAndGet(), Math::max);
                                            // Re-entrant: a second acquire by the holder succeeds at once.
                                            require(mutex.acquire(1, TimeUnit.SECONDS), "not re-entrant");
                                            mutex.release();
                                            int value = Integer.parseInt(new String(client.getData().forPath(counter), StandardCharsets.UTF_8));
                                            client.setData().forPath(counter, bytes(Integer.toString(value + 1)));
                                            holders.decrementAndGet();
                                        } finally {
                                            mutex.release();
                                        }
                                    }
                                    return rounds;
                                }));
            }
            for (Future<Integer> f : done) {
                f.get(WAIT_S, TimeUnit.SECONDS);
            }
        } finally {
            pool.shutdownNow();
        }
        String value = new String(first.getData().forPath(counter), StandardCharsets.UTF_8);
        List<String> left = first.getChildren().forPath(lockPath);
        return "max_holders=" + maxHolders.get() + " counter=" + value + " lock_nodes_left=" + left.size();
    }

    /**
     * A holder that dies without releasing: its client stops talking (as a killed process
     * would), the server expires its session and deletes its lock node, and the contender
     * waiting for the lock takes it.
     */
    Object mutexHolderKilled() throws Exception {
        String lockPath = base + "/killed-lock";
        CuratorFramework holderClient = client(SHORT_SESSION_TIMEOUT_MS);
        CuratorFramework contenderClient = client();
        InterProcessMutex held = new InterProcessMutex(holderClient, lockPath);
        require(held.acquire(WAIT_S, TimeUnit.SECONDS), "lock not acquired");
        InterProcessMutex wanted = new InterProcessMutex(contenderClient, lockPath);
        ExecutorService pool = Executors.newSingleThreadExecutor();
        try {
            // A mutex belongs to the thread that acquired it: the contender's thread releases.
            Future<String> contender =
                    pool.submit(
                            () -> {
                                require(wanted.acquire(WAIT_S, TimeUnit.SECONDS), "never acquired");
                                int nodes = childCount(contenderClient, lockPath);
                                wanted.release();
                                return "acquired_after_holder_died=true lock_nodes_while_held=" + nodes;
                            });
            // The contender is queued (its node is the second child) before the holder dies.
            waitFor(() -> childCount(contenderClient, lockPath) == 2, "the contender queued");
            boolean waitedWhileHeld = !contender.isDone();
            holderClient.getZookeeperClient().getZooKeeper().getTestable().injectSessionExpiration();
            String outcome = contender.get(WAIT_S, TimeUnit.SECONDS);
            return "waited_while_held=" + waitedWhileHeld
                    + " " + outcome
                    + " lock_nodes_left=" + childCount(contenderClient, lockPath);
        } finally {
            pool.shutdownNow();
        }
    }

    static int childCount(CuratorFramework client, String path) {
        try {
            return client.getChildren().forPath(path).size();
        } catch (Exception e) {
            return -1;
        }
    }

    /** Three latches: one leader; when it closes another one leads. */
    Object leaderLatch() throws Exception {
        String path = base + "/leader";
        List<LeaderLatch> latches = new ArrayList<>();
        for (int i = 0; i < 3; i++) {
            LeaderLatch latch = new LeaderLatch(client(), path, "member-" + i);
            latch.start();
            latches.add(latch);
        }
        waitFor(() -> latches.stream().filter(LeaderLatch::hasLeadership).count() == 1, "one leader");
        LeaderLatch leader = latches.stream().filter(LeaderLatch::hasLeadership).findFirst().orElseThrow();
        String firstId = leader.getLeader().getId();
        boolean agreed = latches.stream().allMatch(l -> {
            try {
                return l.getLeader().getId().equals(firstId);
            } catch (Exception e) {
                return false;
            }
        });
        int participants = leader.getParticipants().size();
        leader.close();
        latches.remove(leader);
        waitFor(() -> latches.stream().filter(LeaderLatch::hasLeadership).count() == 1, "a new leader");
        LeaderLatch next = latches.stream().filter(LeaderLatch::hasLeadership).findFirst().orElseThrow();
        String nextId = next.getId();
        for (LeaderLatch latch : latches) {
            latch.close();
        }
        return "participants=" + participants
                + " agreed=" + agreed
                + " first_is_leader=" + firstId.equals(leader.getId())
                + " next_differs=" + !nextId.equals(firstId);
    }

    /** A CuratorCache over a subtree: its events and, at the end, its content. */
    Object curatorCache() throws Exception {
        CuratorFramework client = clients.get(0);
        String root = base + "/cache";
        client.create().forPath(root, bytes("root"));
        client.create().forPath(root + "/before", bytes("b"));
        BlockingQueue<String> events = new LinkedBlockingQueue<>();
        CountDownLatch initialized = new CountDownLatch(1);
        CuratorCache cache = CuratorCache.build(client, root);
        cache.listenable()
                .addListener(
                        CuratorCacheListener.builder()
                                .forCreates(n -> events.add("create " + rel(n.getPath(), root) + "=" + str(n.getData())))
                                .forChanges((old, n) -> events.add("change " + rel(n.getPath(), root) + "=" + str(n.getData())))
                                .forDeletes(old -> events.add("delete " + rel(old.getPath(), root)))
                                .forInitialized(initialized::countDown)
                                .build());
        cache.start();
        try {
            require(initialized.await(WAIT_S, TimeUnit.SECONDS), "cache never initialized");
            List<String> initial = new ArrayList<>();
            events.drainTo(initial);
            Collections.sort(initial);
            // One change at a time, each awaited: the cache reads a node after its event, so
            // a later change could otherwise show in an earlier event.
            List<String> later = new ArrayList<>();
            client.create().forPath(root + "/a", bytes("1"));
            awaitEvent(events, later, "create /a=1");
            client.create().creatingParentsIfNeeded().forPath(root + "/b/c", bytes("2"));
            awaitEvent(events, later, "create /b/c=2");
            client.setData().forPath(root + "/a", bytes("3"));
            awaitEvent(events, later, "change /a=3");
            client.delete().forPath(root + "/before");
            awaitEvent(events, later, "delete /before");
            Map<String, String> content = new TreeMap<>();
            cache.stream().forEach(n -> content.put(rel(n.getPath(), root), str(n.getData())));
            return "initial " + initial + " then " + later + " content " + content;
        } finally {
            cache.close();
        }
    }

    /** Take events until {@code last}, adding them to {@code seen}. */
    static void awaitEvent(BlockingQueue<String> events, List<String> seen, String last) throws InterruptedException {
        while (seen.isEmpty() || !seen.get(seen.size() - 1).equals(last)) {
            String event = events.poll(WAIT_S, TimeUnit.SECONDS);
            require(event != null, "no event " + last + " after " + seen);
            seen.add(event);
        }
    }

    /** A TreeCache over a subtree three levels deep. */
    Object treeCache() throws Exception {
        CuratorFramework client = clients.get(0);
        String root = base + "/tree";
        client.create().creatingParentsIfNeeded().forPath(root + "/x/y/z", bytes("deep"));
        BlockingQueue<String> events = new LinkedBlockingQueue<>();
        TreeCache cache = TreeCache.newBuilder(client, root).build();
        cache.getListenable()
                .addListener(
                        (c, event) -> {
                            if (event.getType() == TreeCacheEvent.Type.INITIALIZED) {
                                events.add("INITIALIZED");
                            } else if (event.getData() != null) {
                                events.add(event.getType() + " " + rel(event.getData().getPath(), root));
                            }
                        });
        cache.start();
        try {
            List<String> initial = new ArrayList<>();
            while (!initial.contains("INITIALIZED")) {
                String event = events.poll(WAIT_S, TimeUnit.SECONDS);
                require(event != null, "tree cache never initialized: " + initial);
                initial.add(event);
            }
            Collections.sort(initial);
            List<String> later = new ArrayList<>();
            client.setData().forPath(root + "/x/y/z", bytes("changed"));
            awaitEvent(events, later, "NODE_UPDATED /x/y/z");
            client.delete().deletingChildrenIfNeeded().forPath(root + "/x/y");
            awaitEvent(events, later, "NODE_REMOVED /x/y");
            client.create().forPath(root + "/end");
            awaitEvent(events, later, "NODE_ADDED /end");
            return "initial " + initial + " then " + later
                    + " children_of_x " + cache.getCurrentChildren(root + "/x").keySet();
        } finally {
            cache.close();
        }
    }

    /** Three clients each add 1 twenty times, optimistically (versioned sets, retried). */
    Object atomicLong() throws Exception {
        String path = base + "/counter";
        List<CuratorFramework> mine = List.of(client(), client(), client());
        ExecutorService pool = Executors.newFixedThreadPool(mine.size());
        AtomicInteger failed = new AtomicInteger();
        try {
            List<Future<?>> done = new ArrayList<>();
            for (CuratorFramework client : mine) {
                done.add(
                        pool.submit(
                                () -> {
                                    DistributedAtomicLong counter =
                                            new DistributedAtomicLong(client, path, new ExponentialBackoffRetry(5, 50, 200));
                                    for (int i = 0; i < 20; i++) {
                                        AtomicValue<Long> result = counter.increment();
                                        if (!result.succeeded() || result.postValue() != result.preValue() + 1) {
                                            failed.incrementAndGet();
                                        }
                                    }
                                    return null;
                                }));
            }
            for (Future<?> f : done) {
                f.get(WAIT_S, TimeUnit.SECONDS);
            }
        } finally {
            pool.shutdownNow();
        }
        DistributedAtomicLong reader = new DistributedAtomicLong(clients.get(0), path, new ExponentialBackoffRetry(5, 3));
        AtomicValue<Long> value = reader.get();
        AtomicValue<Long> cas = reader.compareAndSet(60L, 100L);
        AtomicValue<Long> staleCas = reader.compareAndSet(60L, 7L);
        return "value=" + value.postValue()
                + " failed_increments=" + failed.get()
                + " cas=" + cas.succeeded() + ":" + reader.get().postValue()
                + " stale_cas=" + staleCas.succeeded();
    }

    /**
     * An ephemeral PersistentNode: created; deleted by another client, it comes back; its
     * session expired (another connection closes it), it comes back in the new session.
     */
    Object persistentNode() throws Exception {
        CuratorFramework owner = client(SHORT_SESSION_TIMEOUT_MS);
        CuratorFramework other = clients.get(0);
        String path = base + "/persistent-node";
        List<String> states = Collections.synchronizedList(new ArrayList<>());
        owner.getConnectionStateListenable().addListener((c, state) -> states.add(state.name()));
        PersistentNode node = new PersistentNode(owner, CreateMode.EPHEMERAL, false, path, bytes("here"));
        node.start();
        try {
            require(node.waitForInitialCreate(WAIT_S, TimeUnit.SECONDS), "never created");
            long firstOwner = other.checkExists().forPath(path).getEphemeralOwner();
            other.delete().forPath(path);
            waitFor(() -> exists(other, path), "recreated after a delete");
            ZooKeeper zk = owner.getZookeeperClient().getZooKeeper();
            long sessionId = zk.getSessionId();
            // The owner's client stops talking and takes its session for expired; the server
            // expires it after its (short) timeout and deletes the node, which the recipe then
            // creates again in its new session.
            zk.getTestable().injectSessionExpiration();
            waitFor(() -> states.contains(ConnectionState.LOST.name()), "the session lost");
            waitFor(
                    () -> {
                        try {
                            var stat = other.checkExists().forPath(path);
                            return stat != null && stat.getEphemeralOwner() != sessionId;
                        } catch (Exception e) {
                            return false;
                        }
                    },
                    "recreated in a new session");
            long lastOwner = other.checkExists().forPath(path).getEphemeralOwner();
            return "first_owner_is_session=" + (firstOwner == sessionId)
                    + " new_owner_is_new_session=" + (lastOwner == owner.getZookeeperClient().getZooKeeper().getSessionId())
                    + " data=" + new String(other.getData().forPath(path), StandardCharsets.UTF_8);
        } finally {
            node.close();
        }
    }

    static boolean exists(CuratorFramework client, String path) {
        try {
            return client.checkExists().forPath(path) != null;
        } catch (Exception e) {
            return false;
        }
    }

    /** A recursive PersistentWatcher: every change below its node, in order. */
    Object persistentWatcher() throws Exception {
        CuratorFramework client = clients.get(0);
        String root = base + "/watched";
        client.create().forPath(root);
        BlockingQueue<String> events = new LinkedBlockingQueue<>();
        PersistentWatcher watcher = new PersistentWatcher(client, root, true);
        CountDownLatch ready = new CountDownLatch(1);
        watcher.getResetListenable().addListener(ready::countDown);
        watcher.getListenable()
                .addListener(
                        (WatchedEvent e) -> {
                            if (e.getType() != Watcher.Event.EventType.None) {
                                events.add(e.getType() + " " + rel(e.getPath(), root));
                            }
                        });
        watcher.start();
        try {
            require(ready.await(WAIT_S, TimeUnit.SECONDS), "watch never set");
            client.create().forPath(root + "/a");
            client.create().forPath(root + "/a/b", bytes("1"));
            client.setData().forPath(root + "/a/b", bytes("2"));
            client.delete().deletingChildrenIfNeeded().forPath(root + "/a");
            client.create().forPath(root + "/end");
            List<String> seen = new ArrayList<>();
            while (!seen.contains("NodeCreated /end")) {
                String event = events.poll(WAIT_S, TimeUnit.SECONDS);
                require(event != null, "event missing after " + seen);
                seen.add(event);
            }
            return seen;
        } finally {
            watcher.close();
        }
    }

    /** Two SharedCounts on one node: a change by one reaches the other; a stale trySet fails. */
    Object sharedCount() throws Exception {
        String path = base + "/shared-count";
        SharedCount a = new SharedCount(clients.get(0), path, 0);
        SharedCount b = new SharedCount(client(), path, 0);
        BlockingQueue<Integer> seenByB = new LinkedBlockingQueue<>();
        b.addListener(
                new SharedCountListener() {
                    @Override
                    public void countHasChanged(SharedCountReader reader, int newCount) {
                        seenByB.add(newCount);
                    }

                    @Override
                    public void stateChanged(CuratorFramework client, ConnectionState state) {}
                });
        a.start();
        b.start();
        try {
            var stale = b.getVersionedValue();
            a.setCount(5);
            Integer heard = seenByB.poll(WAIT_S, TimeUnit.SECONDS);
            boolean staleSet = b.trySetCount(stale, 9);
            waitFor(() -> b.getCount() == 5, "b sees 5");
            boolean freshSet = b.trySetCount(b.getVersionedValue(), 6);
            waitFor(() -> a.getCount() == 6, "a sees 6");
            return "b_heard=" + heard + " stale_set=" + staleSet + " fresh_set=" + freshSet + " a=" + a.getCount();
        } finally {
            a.close();
            b.close();
        }
    }

    static String rel(String path, String root) {
        return path.equals(root) ? "/" : path.substring(root.length());
    }

    static String str(byte[] data) {
        return data == null ? "null" : new String(data, StandardCharsets.UTF_8);
    }
}
