// A test driver for TableKeeper's Oxia front-end: runs one scenario with the real Oxia Java
// client (io.github.oxia-db:oxia-client, the version Pulsar ships) against a server address and
// prints "PASS <scenario>" or "FAIL <scenario>: why" (exit code 1, stack trace on stderr).
// Usage: java OxiaDriver HOST:PORT SCENARIO[+SCENARIO...] [ARGS...]; tests/compat/test_oxia_client.py runs it.
// Not tests: "bench N" prints two human-readable lines; "bench-json N K [VALUE_BYTES]" prints one
// line "BENCH {json}" with per-phase figures, after a "PHASE start|end NAME" line at each phase's
// start and end (benchmarks/oxia_client.py runs it).

import io.oxia.client.api.DeleteOption;
import io.oxia.client.api.GetOption;
import io.oxia.client.api.GetResult;
import io.oxia.client.api.Notification;
import io.oxia.client.api.OxiaClientBuilder;
import io.oxia.client.api.PutOption;
import io.oxia.client.api.PutResult;
import io.oxia.client.api.SyncOxiaClient;
import io.oxia.client.api.exceptions.KeyAlreadyExistsException;
import io.oxia.client.api.exceptions.UnexpectedVersionIdException;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;

public final class OxiaDriver {
    private static final Duration HANG_GUARD = Duration.ofSeconds(60);

    public static void main(String[] args) throws Exception {
        String address = args[0];
        // Several scenarios separated by "+" share one JVM (its start is most of the cost).
        for (String scenario : args[1].split("\\+")) {
            try {
                trace("scenario " + scenario);
                run(address, scenario, args);
            } catch (Throwable t) {
                t.printStackTrace();
                System.out.println("FAIL " + scenario + ": " + t);
                System.out.flush();
                Runtime.getRuntime().halt(1);
            }
            System.out.println("PASS " + scenario);
            System.out.flush();
        }
        trace("done");
        Runtime.getRuntime().halt(0);
    }

    private static void run(String address, String scenario, String[] args) throws Exception {
        switch (scenario) {
            case "versions" -> versions(address);
            case "ranges" -> ranges(address);
            case "comparisons" -> comparisons(address);
            case "ephemeral-close" -> ephemeralClose(address);
            case "ephemeral-crash" -> ephemeralCrash(address, args[2]);
            case "wait-gone" -> waitGone(address, args[2]);
            case "notifications" -> notifications(address);
            case "notifications-restart" -> notificationsRestart(address);
            case "sequences" -> sequences(address);
            case "namespace" -> namespace(address, args[2]);
            case "bench" -> bench(address, Integer.parseInt(args[2]));
            case "bench-json" -> benchJson(address, Integer.parseInt(args[2]),
                    Integer.parseInt(args[3]), args.length > 4 ? Integer.parseInt(args[4]) : 100);
            default -> throw new IllegalArgumentException("unknown scenario " + scenario);
        }
    }

    private static final long STARTED = System.nanoTime();

    static void trace(String what) {
        System.err.printf("[driver %.3fs] %s%n", (System.nanoTime() - STARTED) / 1e9, what);
    }

    // A session outlives a busy machine's pauses (a JVM left unscheduled for a few seconds
    // must not lose it); only the client whose session is meant to expire gets a short one.
    private static final Duration SESSION = Duration.ofSeconds(30);
    // Long enough for its put and get on a busy machine (2 s was not: the session expired
    // before the put), short enough that the test's wait for its expiry stays short.
    private static final Duration EXPIRING_SESSION = Duration.ofSeconds(10);

    private static SyncOxiaClient client(String address, String identity) throws Exception {
        return client(address, identity, SESSION);
    }

    private static SyncOxiaClient client(String address, String identity, Duration session)
            throws Exception {
        trace("connecting as " + identity);
        return OxiaClientBuilder.create(address)
                .namespace("default")
                .clientIdentifier(identity)
                .sessionTimeout(session)
                .requestTimeout(Duration.ofSeconds(30))
                .syncClient();
    }

    private static byte[] b(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    private static String s(byte[] b) {
        return new String(b, StandardCharsets.UTF_8);
    }

    private static void check(boolean condition, String what) {
        if (!condition) {
            throw new AssertionError(what);
        }
    }

    private static <T> void checkEq(T expected, T actual, String what) {
        if (expected == null ? actual != null : !expected.equals(actual)) {
            throw new AssertionError(what + ": expected " + expected + ", got " + actual);
        }
    }

    private static void waitFor(BooleanSupplier condition, String what) throws InterruptedException {
        long deadline = System.nanoTime() + HANG_GUARD.toNanos();
        while (!condition.getAsBoolean()) {
            if (System.nanoTime() > deadline) {
                throw new AssertionError("never happened: " + what);
            }
            Thread.sleep(50);
        }
    }

    interface Action {
        void run() throws Exception;
    }

    private static <T extends Throwable> void expectThrows(Class<T> kind, Action action) {
        try {
            action.run();
        } catch (Throwable t) {
            Throwable cause = t;
            while (cause != null) {
                if (kind.isInstance(cause)) {
                    return;
                }
                cause = cause.getCause();
            }
            throw new AssertionError("expected " + kind.getSimpleName() + ", got " + t, t);
        }
        throw new AssertionError("expected " + kind.getSimpleName() + ", nothing thrown");
    }

    // Puts, gets and deletes with Oxia's version semantics.
    static void versions(String address) throws Exception {
        try (SyncOxiaClient c = client(address, "driver-a")) {
            String key = "/versions/k-" + System.nanoTime();
            trace("connected");
            checkEq(null, c.get(key), "missing key");
            PutResult first = c.put(key, b("v1"));
            var v1 = first.version();
            check(v1.versionId() >= 0, "version id >= 0 (a fresh shard's first write: 0)");
            checkEq(0L, v1.modificationsCount(), "created: 0 modifications");
            check(v1.createdTimestamp() > 0, "created timestamp");
            checkEq(v1.createdTimestamp(), v1.modifiedTimestamp(), "created = modified");
            check(v1.sessionId().isEmpty(), "not ephemeral");
            check(v1.clientIdentifier().isEmpty(), "only ephemeral records carry the identity");

            GetResult got = c.get(key);
            checkEq("v1", s(got.getValue()), "value");
            checkEq(v1.versionId(), got.getVersion().versionId(), "same version on get");

            PutResult second = c.put(key, b("v2"));
            var v2 = second.version();
            check(v2.versionId() > v1.versionId(), "version id grows");
            checkEq(1L, v2.modificationsCount(), "one modification");
            checkEq(v1.createdTimestamp(), v2.createdTimestamp(), "created stays");
            check(v2.modifiedTimestamp() >= v1.modifiedTimestamp(), "modified moves on");

            expectThrows(KeyAlreadyExistsException.class,
                    () -> c.put(key, b("x"), Set.of(PutOption.IfRecordDoesNotExist)));
            expectThrows(UnexpectedVersionIdException.class,
                    () -> c.put(key, b("x"), Set.of(PutOption.IfVersionIdEquals(v1.versionId()))));
            checkEq("v2", s(c.get(key).getValue()), "refused puts changed nothing");
            PutResult third = c.put(key, b("v3"), Set.of(PutOption.IfVersionIdEquals(v2.versionId())));
            checkEq(2L, third.version().modificationsCount(), "compare-and-set put");

            String fresh = key + "-new";
            c.put(fresh, b("n"), Set.of(PutOption.IfRecordDoesNotExist));
            expectThrows(UnexpectedVersionIdException.class,
                    () -> c.put(key + "-missing", b("x"), Set.of(PutOption.IfVersionIdEquals(5))));
            checkEq(null, c.get(key + "-missing"), "refused put created nothing");

            expectThrows(UnexpectedVersionIdException.class,
                    () -> c.delete(key, Set.of(DeleteOption.IfVersionIdEquals(v1.versionId()))));
            check(c.delete(key, Set.of(DeleteOption.IfVersionIdEquals(third.version().versionId()))),
                    "compare-and-set delete");
            checkEq(null, c.get(key), "deleted");
            check(!c.delete(key), "second delete finds nothing");
            check(c.delete(fresh), "blind delete");
            PutResult again = c.put(key, b("again"));
            checkEq(0L, again.version().modificationsCount(), "re-created: 0 modifications again");

            // Many keys: they spread over every shard and read back.
            for (int i = 0; i < 200; i++) {
                c.put(key + "/many/" + i, b("m" + i));
            }
            trace("wrote 200");
            for (int i = 0; i < 200; i++) {
                checkEq("m" + i, s(c.get(key + "/many/" + i).getValue()), "many " + i);
            }
        }
    }

    // list, rangeScan and deleteRange over all shards, in Oxia's key order.
    static void ranges(String address) throws Exception {
        try (SyncOxiaClient c = client(address, "driver-r")) {
            String p = "/ranges-" + System.nanoTime();
            List<String> children = List.of(p + "/a", p + "/b", p + "/c");
            for (String k : children) {
                c.put(k, b(k));
            }
            c.put(p, b("parent"));
            c.put(p + "/a/deeper", b("x"));
            c.put(p + "/b/deeper/still", b("x"));
            c.put(p + "//x", b("x"));
            c.put(p + "/d/", b("x")); // one level deeper than p's children
            checkEq(children, c.list(p + "/", p + "//"), "children only, in order");
            List<String> all = c.list(p + "/", p + "/~");
            checkEq(children, all, "children only, up to ~");
            List<String> deeper = c.list(p + "/a/", p + "/a//");
            checkEq(List.of(p + "/a/deeper"), deeper, "grandchildren of a");

            List<String> scanned = new ArrayList<>();
            for (GetResult r : c.rangeScan(p + "/", p + "//")) {
                scanned.add(r.getKey());
                checkEq(r.getKey(), s(r.getValue()), "scanned value");
            }
            scanned.sort(null); // the client hands each shard's results over as they come
            checkEq(children, scanned, "range scan");

            c.deleteRange(p + "/b", p + "/d");
            checkEq(List.of(p + "/a"), c.list(p + "/", p + "//"), "after delete range");
            checkEq("x", s(c.get(p + "/b/deeper/still").getValue()), "deeper keys stay");
            checkEq("parent", s(c.get(p).getValue()), "parent stays");
        }
    }

    // get with FLOOR, CEILING, LOWER and HIGHER (the client asks every shard and picks).
    static void comparisons(String address) throws Exception {
        try (SyncOxiaClient c = client(address, "driver-c")) {
            String p = "/cmp-" + System.nanoTime() + "/";
            c.put(p + "b", b("b"));
            c.put(p + "d", b("d"));
            c.put(p + "f", b("f"));
            checkEq(p + "d", c.get(p + "d", Set.of(GetOption.ComparisonFloor)).getKey(), "floor =");
            checkEq(p + "d", c.get(p + "e", Set.of(GetOption.ComparisonFloor)).getKey(), "floor");
            checkEq(p + "b", c.get(p + "d", Set.of(GetOption.ComparisonLower)).getKey(), "lower");
            checkEq(p + "d", c.get(p + "d", Set.of(GetOption.ComparisonCeiling)).getKey(), "ceil =");
            checkEq(p + "d", c.get(p + "c", Set.of(GetOption.ComparisonCeiling)).getKey(), "ceiling");
            checkEq(p + "f", c.get(p + "d", Set.of(GetOption.ComparisonHigher)).getKey(), "higher");
            checkEq("f", s(c.get(p + "e", Set.of(GetOption.ComparisonHigher)).getValue()), "value");
            // With a partition key the client asks that key's shard only.
            c.put(p + "pk", b("pk"), Set.of(PutOption.PartitionKey("x")));
            checkEq("pk", s(c.get(p + "pk", Set.of(GetOption.PartitionKey("x"))).getValue()),
                    "equal on the partition key's shard");
            checkEq(p + "pk", c.get(p + "pkz",
                    Set.of(GetOption.ComparisonFloor, GetOption.PartitionKey("x"))).getKey(),
                    "floor on the partition key's shard");
        }
    }

    // An ephemeral record lives as long as its client's session.
    static void ephemeralClose(String address) throws Exception {
        String key = "/ephemeral/close-" + System.nanoTime();
        try (SyncOxiaClient watcher = client(address, "driver-w")) {
            try (SyncOxiaClient owner = client(address, "driver-owner")) {
                PutResult r = owner.put(key, b("mine"), Set.of(PutOption.AsEphemeralRecord));
                check(r.version().sessionId().isPresent(), "ephemeral has a session id");
                GetResult seen = watcher.get(key);
                checkEq("mine", s(seen.getValue()), "others see it");
                checkEq(r.version().sessionId(), seen.getVersion().sessionId(), "session id on get");
                checkEq("driver-owner", seen.getVersion().clientIdentifier().orElse(null), "owner");
            }
            waitFor(() -> watcher.get(key) == null, "ephemeral record gone after close");
        }
    }

    // Creates an ephemeral record, then dies without closing its session.
    static void ephemeralCrash(String address, String key) throws Exception {
        SyncOxiaClient owner = client(address, "driver-crash", EXPIRING_SESSION);
        owner.put(key, b("mine"), Set.of(PutOption.AsEphemeralRecord));
        checkEq("mine", s(owner.get(key).getValue()), "written");
        System.out.println("PASS ephemeral-crash");
        System.out.flush();
        trace("halting without closing the session");
        Runtime.getRuntime().halt(0);
    }

    static void waitGone(String address, String key) throws Exception {
        try (SyncOxiaClient c = client(address, "driver-w")) {
            waitFor(() -> c.get(key) == null, key + " gone after its session expired");
        }
    }

    private static String describe(Notification n) {
        if (n instanceof Notification.KeyCreated k) {
            return "created " + k.key();
        }
        if (n instanceof Notification.KeyModified k) {
            return "modified " + k.key();
        }
        if (n instanceof Notification.KeyDeleted k) {
            return "deleted " + k.key();
        }
        return n.toString();
    }

    private static List<String> take(BlockingQueue<Notification> queue, String prefix, int n)
            throws InterruptedException {
        List<String> out = new ArrayList<>();
        long deadline = System.nanoTime() + HANG_GUARD.toNanos();
        while (out.size() < n) {
            Notification x = queue.poll(deadline - System.nanoTime(), TimeUnit.NANOSECONDS);
            if (x == null) {
                throw new AssertionError("notifications so far: " + out);
            }
            if (x.key().startsWith(prefix)) {
                out.add(describe(x));
            }
        }
        return out;
    }

    // Created, modified and deleted notifications, in order.
    static void notifications(String address) throws Exception {
        try (SyncOxiaClient c = client(address, "driver-n")) {
            BlockingQueue<Notification> queue = new LinkedBlockingQueue<>();
            c.notifications(queue::add);
            String p = "/notify-" + System.nanoTime() + "/";
            c.put(p + "k", b("1"));
            c.put(p + "k", b("2"));
            c.delete(p + "k");
            List<String> got = take(queue, p, 3);
            checkEq(List.of("created " + p + "k", "modified " + p + "k", "deleted " + p + "k"), got,
                    "one key's notifications in order");
        }
    }

    // Notifications across a server restart: pytest restarts the server between the two halves
    // (on "RESTART" it answers a line on stdin); nothing is missed, nothing repeated.
    static void notificationsRestart(String address) throws Exception {
        try (SyncOxiaClient c = client(address, "driver-nr")) {
            BlockingQueue<Notification> queue = new LinkedBlockingQueue<>();
            c.notifications(queue::add);
            String p = "/notify-restart-" + System.nanoTime() + "/";
            c.put(p + "before", b("1"));
            checkEq(List.of("created " + p + "before"), take(queue, p, 1), "before the restart");
            System.out.println("RESTART");
            System.out.flush();
            new BufferedReader(new InputStreamReader(System.in)).readLine();
            // The client reconnects by itself; its writes fail until the server is back.
            long deadline = System.nanoTime() + HANG_GUARD.toNanos();
            while (true) {
                try {
                    c.put(p + "after", b("2"));
                    break;
                } catch (Exception e) {
                    if (System.nanoTime() > deadline) {
                        throw e;
                    }
                    Thread.sleep(100);
                }
            }
            c.put(p + "before", b("3"));
            List<String> got = new ArrayList<>(take(queue, p, 2));
            got.sort(null); // two keys, maybe on two shards: each shard's feed is ordered, not both
            checkEq(List.of("created " + p + "after", "modified " + p + "before"), got, "after");
            Notification extra = queue.poll(500, TimeUnit.MILLISECONDS);
            check(extra == null || !extra.key().startsWith(p), "nothing repeated: " + extra);
        }
    }

    // Sequence keys and partition keys.
    static void sequences(String address) throws Exception {
        try (SyncOxiaClient c = client(address, "driver-s")) {
            String p = "/seq-" + System.nanoTime() + "/item";
            String pk = "partition-" + System.nanoTime();
            BlockingQueue<String> updates = new LinkedBlockingQueue<>();
            var subscription = c.getSequenceUpdates(p, updates::add,
                    Set.of(io.oxia.client.api.GetSequenceUpdatesOption.PartitionKey(pk)));
            List<String> made = new ArrayList<>();
            for (int i = 0; i < 3; i++) {
                PutResult r = c.put(p, b("v" + i),
                        Set.of(PutOption.PartitionKey(pk), PutOption.SequenceKeysDeltas(List.of(1L))));
                made.add(r.key());
            }
            checkEq(List.of(p + String.format("-%020d", 1), p + String.format("-%020d", 2),
                    p + String.format("-%020d", 3)), made, "sequence keys");
            PutResult two = c.put(p, b("x"),
                    Set.of(PutOption.PartitionKey(pk), PutOption.SequenceKeysDeltas(List.of(2L, 5L))));
            checkEq(p + String.format("-%020d-%020d", 5, 5), two.key(), "two-part sequence key");
            checkEq("v1", s(c.get(made.get(1), Set.of(GetOption.PartitionKey(pk))).getValue()),
                    "read with the partition key");
            checkEq(made.subList(0, 3),
                    c.list(p + "-", p + "-~", Set.of(io.oxia.client.api.ListOption.PartitionKey(pk)))
                            .subList(0, 3),
                    "listed on the partition's shard");
            String last = null;
            long deadline = System.nanoTime() + HANG_GUARD.toNanos();
            while (!two.key().equals(last)) {
                String u = updates.poll(deadline - System.nanoTime(), TimeUnit.NANOSECONDS);
                if (u == null) {
                    throw new AssertionError("sequence updates stopped at " + last);
                }
                last = u;
            }
            subscription.close();
            // Partition keys put unrelated keys on one shard: all of them in one list there.
            c.put("/pk/a", b("a"), Set.of(PutOption.PartitionKey(pk)));
            c.put("/pk/b", b("b"), Set.of(PutOption.PartitionKey(pk)));
            checkEq(List.of("/pk/a", "/pk/b"),
                    c.list("/pk/", "/pk//", Set.of(io.oxia.client.api.ListOption.PartitionKey(pk))),
                    "partition's keys together");
        }
    }

    // A namespace other than default: separate keys; an unknown one fails fast.
    static void namespace(String address, String name) throws Exception {
        try (SyncOxiaClient other = OxiaClientBuilder.create(address).namespace(name).syncClient();
                SyncOxiaClient dflt = client(address, "driver-ns")) {
            String key = "/ns-" + System.nanoTime();
            other.put(key, b("other"));
            checkEq(null, dflt.get(key), "namespaces are separate");
            checkEq("other", s(other.get(key).getValue()), "in its namespace");
        }
        expectThrows(io.oxia.client.shard.NamespaceNotFoundException.class,
                () -> OxiaClientBuilder.create(address).namespace("no-such-ns").syncClient().close());
    }

    // Not a test: N puts one after another (latency), then N puts in flight at once (throughput).
    static void bench(String address, int n) throws Exception {
        try (SyncOxiaClient c = client(address, "driver-bench")) {
            String p = "/bench-" + System.nanoTime() + "/";
            byte[] value = new byte[100];
            for (int i = 0; i < 50; i++) {
                c.put(p + "warm-" + i, value);
            }
            long start = System.nanoTime();
            for (int i = 0; i < n; i++) {
                c.put(p + "seq-" + i, value);
            }
            double seqS = (System.nanoTime() - start) / 1e9;
            System.out.printf("sequential puts: %d in %.2fs, %.2f ms each%n", n, seqS, seqS * 1000 / n);
        }
        var async = OxiaClientBuilder.create(address).namespace("default").asyncClient().join();
        String p = "/bench-async-" + System.nanoTime() + "/";
        byte[] value = new byte[100];
        long start = System.nanoTime();
        var futures = new ArrayList<java.util.concurrent.CompletableFuture<PutResult>>();
        for (int i = 0; i < n; i++) {
            futures.add(async.put(p + i, value));
        }
        java.util.concurrent.CompletableFuture.allOf(futures.toArray(new java.util.concurrent.CompletableFuture[0])).join();
        double s = (System.nanoTime() - start) / 1e9;
        System.out.printf("concurrent puts: %d in %.2fs, %.0f puts/s%n", n, s, n / s);
        async.close();
    }

    // benchJson's phases. Latencies are nanoseconds, one slot per operation.
    interface AsyncOp {
        java.util.concurrent.CompletableFuture<Boolean> start(int i);
    }

    interface SyncOp {
        boolean run(int i) throws Exception;
    }

    private static String phaseJson(String name, int inFlight, long[] latNs, int errors, long wallNs) {
        long[] sorted = latNs.clone();
        java.util.Arrays.sort(sorted);
        int n = sorted.length;
        double sum = 0;
        for (long x : sorted) {
            sum += x;
        }
        return String.format(java.util.Locale.ROOT,
                "{\"phase\":\"%s\",\"in_flight\":%d,\"ops\":%d,\"errors\":%d,\"seconds\":%.6f,"
                        + "\"ops_per_s\":%.3f,\"mean_ms\":%.6f,\"p50_ms\":%.6f,\"p99_ms\":%.6f,"
                        + "\"max_ms\":%.6f}",
                name, inFlight, n, errors, wallNs / 1e9, n / (wallNs / 1e9), sum / n / 1e6,
                rank(sorted, 50) / 1e6, rank(sorted, 99) / 1e6, sorted[n - 1] / 1e6);
    }

    // The nearest-rank percentile, as benchmarks/_common.py's percentile().
    private static long rank(long[] sorted, double q) {
        int index = (int) (q / 100.0 * sorted.length + 0.5) - 1;
        return sorted[Math.min(sorted.length - 1, Math.max(0, index))];
    }

    // Phase boundaries on stdout, as they happen: the benchmark samples the server's CPU on them.
    private static void mark(String what, String name) {
        System.out.println("PHASE " + what + " " + name);
        System.out.flush();
    }

    private static String syncPhase(String name, int n, SyncOp op) throws Exception {
        long[] lat = new long[n];
        int errors = 0;
        mark("start", name);
        long start = System.nanoTime();
        for (int i = 0; i < n; i++) {
            long t = System.nanoTime();
            if (!op.run(i)) {
                errors++;
            }
            lat[i] = System.nanoTime() - t;
        }
        long wall = System.nanoTime() - start;
        mark("end", name);
        trace(name + " done");
        return phaseJson(name, 1, lat, errors, wall);
    }

    // At most k operations in flight: the next starts as soon as one completes (closed loop).
    private static String asyncPhase(String name, int n, int k, AsyncOp op) throws Exception {
        long[] lat = new long[n];
        java.util.concurrent.atomic.AtomicInteger errors = new java.util.concurrent.atomic.AtomicInteger();
        java.util.concurrent.Semaphore slots = new java.util.concurrent.Semaphore(k);
        java.util.concurrent.CountDownLatch done = new java.util.concurrent.CountDownLatch(n);
        mark("start", name);
        long start = System.nanoTime();
        for (int i = 0; i < n; i++) {
            final int index = i;
            slots.acquire();
            long t = System.nanoTime();
            op.start(i).whenComplete((ok, error) -> {
                lat[index] = System.nanoTime() - t;
                if (error != null || !Boolean.TRUE.equals(ok)) {
                    errors.incrementAndGet();
                }
                slots.release();
                done.countDown();
            });
        }
        if (!done.await(HANG_GUARD.toSeconds() * 10, TimeUnit.SECONDS)) {
            throw new AssertionError(name + ": operations never completed");
        }
        long wall = System.nanoTime() - start;
        mark("end", name);
        trace(name + " done");
        return phaseJson(name, k, lat, errors.get(), wall);
    }

    // Not a test: N distinct keys per phase, VALUE_BYTES each, the client's default batching
    // (linger, requests per batch). sync-put/sync-get: one call after another through the sync
    // client (latency); async-put/async-get: the async client with K calls in flight
    // (throughput). Each get must find its key. Prints "BENCH {json}".
    static void benchJson(String address, int n, int k, int valueBytes) throws Exception {
        String p = "/bench-" + System.nanoTime() + "/";
        byte[] value = new byte[valueBytes];
        java.util.Arrays.fill(value, (byte) 'v');
        List<String> phases = new ArrayList<>();
        try (SyncOxiaClient c = client(address, "driver-bench-sync")) {
            for (int i = 0; i < 200; i++) { // warm-up: connections, JIT, every shard's leader
                c.put(p + "warm/" + i, value);
                c.get(p + "warm/" + i);
            }
            phases.add(syncPhase("sync-put", n, i -> c.put(String.format("%ssync/k%09d", p, i), value)
                    .version().versionId() >= 0));
            phases.add(syncPhase("sync-get", n, i -> {
                GetResult r = c.get(String.format("%ssync/k%09d", p, i));
                return r != null && r.getValue().length == valueBytes;
            }));
        }
        var async = OxiaClientBuilder.create(address).namespace("default")
                .clientIdentifier("driver-bench-async").asyncClient().join();
        try {
            for (int i = 0; i < 200; i++) {
                async.put(p + "warm-async/" + i, value).join();
            }
            phases.add(asyncPhase("async-put", n, k,
                    i -> async.put(String.format("%sasync/k%09d", p, i), value).thenApply(r -> true)));
            phases.add(asyncPhase("async-get", n, k,
                    i -> async.get(String.format("%sasync/k%09d", p, i))
                            .thenApply(r -> r != null && r.getValue().length == valueBytes)));
        } finally {
            async.close();
        }
        System.out.println("BENCH {\"ops\":" + n + ",\"in_flight\":" + k + ",\"value_bytes\":" + valueBytes
                + ",\"batch_linger_ms\":" + io.oxia.client.OxiaClientBuilderImpl.DefaultBatchLinger.toMillis()
                + ",\"max_requests_per_batch\":" + io.oxia.client.OxiaClientBuilderImpl.DefaultMaxRequestsPerBatch
                + ",\"phases\":[" + String.join(",", phases) + "]}");
        System.out.flush();
    }
}
