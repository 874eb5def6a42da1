// Loads Pulsar-shaped metadata keys into a store as fast as it takes them, with the store's real
// Java client: ZooKeeper's (org.apache.zookeeper 3.9, one session, asynchronous creates) or
// Oxia's (io.github.oxia-db:oxia-client, the one Pulsar 4.0.7 ships, asynchronous puts with its
// default batching). benchmarks/metadata_capacity.py runs it and watches the store's memory.
//
// Usage: java MetadataLoad zk|oxia ADDRESS TOPICS IN_FLIGHT VALUE_BYTES
//
// Topic i (0 <= i < TOPICS) writes three keys, as Pulsar and BookKeeper lay them out:
//   /managed-ledgers/bench/nsN/persistent/tNNNNNNNNN        (its managed ledger; N = i / 10000)
//   /managed-ledgers/bench/nsN/persistent/tNNNNNNNNN/sub    (its subscription's cursor)
//   /ledgers/DD/DDDD/LDDDD                                   (its ledger, id i: BookKeeper's
//                                                             hierarchical ledger layout)
// each with VALUE_BYTES pseudo-random bytes (seeded by the key: incompressible, reproducible).
// Parents come first, with empty values, once each (ZooKeeper needs them; Oxia gets the same keys
// so both hold the same number); ZooKeeper applies one session's requests in order, so a parent
// sent before its child exists when the child is created. At most IN_FLIGHT writes are
// outstanding; the next starts as soon as one completes (closed loop).
//
// Prints one line a second, "PROGRESS {json}": seconds since it connected, keys written, failed
// writes, the last failure; "DONE {json}" when every write has completed, then "VERIFY {json}":
// the keys of up to 1,000 topics spread over the load read back and compared. A write that fails is counted, not
// retried (a parent that exists already is not a failure). Exits 0 after DONE, 1 if it cannot
// connect; the caller stops it (SIGTERM) when it has seen enough.

import io.oxia.client.api.AsyncOxiaClient;
import io.oxia.client.api.OxiaClientBuilder;
import java.time.Duration;
import java.util.SplittableRandom;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.zookeeper.CreateMode;
import org.apache.zookeeper.KeeperException;
import org.apache.zookeeper.ZooDefs;
import org.apache.zookeeper.ZooKeeper;

public final class MetadataLoad {
    interface Store {
        /** Starts writing `key`; completes true when written (or a parent that exists). */
        CompletableFuture<Boolean> write(String key, byte[] value, boolean parent);

        /** The value of `key`, null when it is missing. */
        CompletableFuture<byte[]> read(String key);

        void close() throws Exception;
    }

    static final AtomicLong WRITTEN = new AtomicLong();
    static final AtomicLong FAILED = new AtomicLong();
    static final AtomicReference<String> LAST_ERROR = new AtomicReference<>("");
    static volatile long started = System.nanoTime(); // reset once connected

    public static void main(String[] args) throws Exception {
        String kind = args[0];
        String address = args[1];
        long topics = Long.parseLong(args[2]);
        int inFlight = Integer.parseInt(args[3]);
        int valueBytes = Integer.parseInt(args[4]);
        Store store = switch (kind) {
            case "zk" -> zookeeper(address);
            case "oxia" -> oxia(address);
            default -> throw new IllegalArgumentException("unknown store " + kind);
        };
        started = System.nanoTime();
        Thread reporter = new Thread(() -> {
            try {
                while (true) {
                    Thread.sleep(1000);
                    report("PROGRESS");
                }
            } catch (InterruptedException e) {
                // the load is over
            }
        });
        reporter.setDaemon(true);
        reporter.start();

        Semaphore slots = new Semaphore(inFlight);
        byte[] empty = new byte[0];
        java.util.Set<String> parents = new java.util.HashSet<>();
        for (long i = 0; i < topics; i++) {
            String ns = "/managed-ledgers/bench/ns" + (i / 10000) + "/persistent";
            String id = String.format("%010d", i);
            String ledgerParent = "/ledgers/" + id.substring(0, 2) + "/" + id.substring(2, 6);
            for (String dir : new String[] {ns, ledgerParent}) {
                if (parents.add(dir)) {
                    // every ancestor once, shallowest first
                    int slash = 0;
                    while ((slash = dir.indexOf('/', slash + 1)) > 0) {
                        String ancestor = dir.substring(0, slash);
                        if (parents.add(ancestor)) {
                            submit(store, slots, ancestor, empty, true);
                        }
                    }
                    submit(store, slots, dir, empty, true);
                }
            }
            String topic = ns + String.format("/t%09d", i);
            submit(store, slots, topic, value(topic, valueBytes), false);
            submit(store, slots, topic + "/sub", value(topic + "/sub", valueBytes), false);
            String ledger = ledgerParent + "/L" + id.substring(6);
            submit(store, slots, ledger, value(ledger, valueBytes), false);
        }
        slots.acquire(inFlight); // every write has completed
        report("DONE");
        verify(store, topics, valueBytes);
        store.close();
        Runtime.getRuntime().halt(0);
    }

    // Reads back the keys of up to 1,000 topics spread over the whole load and compares them.
    static void verify(Store store, long topics, int valueBytes) throws Exception {
        long step = Math.max(1, topics / 1000);
        long checked = 0;
        long wrong = 0;
        String firstWrong = "";
        for (long i = 0; i < topics; i += step) {
            String id = String.format("%010d", i);
            String topic = "/managed-ledgers/bench/ns" + (i / 10000) + "/persistent"
                    + String.format("/t%09d", i);
            String ledger = "/ledgers/" + id.substring(0, 2) + "/" + id.substring(2, 6) + "/L"
                    + id.substring(6);
            for (String key : new String[] {topic, topic + "/sub", ledger}) {
                byte[] found = store.read(key).get(60, TimeUnit.SECONDS);
                checked++;
                if (found == null || !java.util.Arrays.equals(found, value(key, valueBytes))) {
                    wrong++;
                    if (firstWrong.isEmpty()) {
                        firstWrong = key + (found == null ? " missing" : " differs");
                    }
                }
            }
        }
        System.out.printf("VERIFY {\"checked\":%d,\"wrong\":%d,\"first_wrong\":\"%s\"}%n",
                checked, wrong, firstWrong);
        System.out.flush();
    }

    static byte[] value(String key, int size) {
        byte[] bytes = new byte[size];
        new SplittableRandom(key.hashCode()).nextBytes(bytes);
        return bytes;
    }

    static void submit(Store store, Semaphore slots, String key, byte[] value, boolean parent)
            throws InterruptedException {
        slots.acquire();
        CompletableFuture<Boolean> write;
        try {
            write = store.write(key, value, parent);
        } catch (RuntimeException e) {
            write = CompletableFuture.failedFuture(e);
        }
        write.whenComplete((ok, error) -> {
            if (error == null && Boolean.TRUE.equals(ok)) {
                WRITTEN.incrementAndGet();
            } else {
                FAILED.incrementAndGet();
                LAST_ERROR.set(key + ": " + (error != null ? error : "refused"));
            }
            slots.release();
        });
    }

    static synchronized void report(String what) {
        String error = LAST_ERROR.get().replace("\\", "\\\\").replace("\"", "\\\"");
        System.out.printf(java.util.Locale.ROOT,
                "%s {\"seconds\":%.3f,\"written\":%d,\"failed\":%d,\"last_error\":\"%s\"}%n",
                what, (System.nanoTime() - started) / 1e9, WRITTEN.get(), FAILED.get(),
                error.length() > 300 ? error.substring(0, 300) : error);
        System.out.flush();
    }

    static Store zookeeper(String address) throws Exception {
        CountDownLatch connected = new CountDownLatch(1);
        ZooKeeper zk = new ZooKeeper(address, 30000, event -> {
            if (event.getState() == org.apache.zookeeper.Watcher.Event.KeeperState.SyncConnected) {
                connected.countDown();
            }
        });
        if (!connected.await(120, TimeUnit.SECONDS)) {
            System.err.println("no ZooKeeper session with " + address);
            Runtime.getRuntime().halt(1);
        }
        return new Store() {
            @Override
            public CompletableFuture<Boolean> write(String key, byte[] value, boolean parent) {
                CompletableFuture<Boolean> done = new CompletableFuture<>();
                zk.create(key, value, ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT,
                        (rc, path, ctx, name) -> {
                            KeeperException.Code code = KeeperException.Code.get(rc);
                            if (code == KeeperException.Code.OK
                                    || (parent && code == KeeperException.Code.NODEEXISTS)) {
                                done.complete(true);
                            } else {
                                done.completeExceptionally(KeeperException.create(code, path));
                            }
                        }, null);
                return done;
            }

            @Override
            public CompletableFuture<byte[]> read(String key) {
                CompletableFuture<byte[]> done = new CompletableFuture<>();
                zk.getData(key, false, (rc, path, ctx, data, stat) -> {
                    KeeperException.Code code = KeeperException.Code.get(rc);
                    if (code == KeeperException.Code.OK || code == KeeperException.Code.NONODE) {
                        done.complete(code == KeeperException.Code.OK ? data : null);
                    } else {
                        done.completeExceptionally(KeeperException.create(code, path));
                    }
                }, null);
                return done;
            }

            @Override
            public void close() throws Exception {
                zk.close();
            }
        };
    }

    static Store oxia(String address) throws Exception {
        AsyncOxiaClient client = OxiaClientBuilder.create(address)
                .namespace("default")
                .clientIdentifier("metadata-load")
                .requestTimeout(Duration.ofSeconds(60))
                .asyncClient()
                .get(120, TimeUnit.SECONDS);
        return new Store() {
            @Override
            public CompletableFuture<Boolean> write(String key, byte[] value, boolean parent) {
                return client.put(key, value).thenApply(result -> true);
            }

            @Override
            public CompletableFuture<byte[]> read(String key) {
                return client.get(key).thenApply(result -> result == null ? null : result.getValue());
            }

            @Override
            public void close() throws Exception {
                client.close();
            }
        };
    }
}
