// The real Oxia Java client (io.github.oxia-db:oxia-client, the version Pulsar ships) against a
// TableKeeper cluster's Oxia ports, for tests/integration/test_oxia_cluster.py.
// Usage: java OxiaClusterDriver HOST:PORT NAMESPACE COUNT
//   1. subscribes to notifications, puts COUNT keys (each until acknowledged) and COUNT / 4
//      ephemeral records (its session's, over every shard), reads them all back, prints
//      "WRITTEN";
//   2. waits for a line on stdin (the test kills a server and waits for the new assignment);
//   3. reads every acknowledged key back, and the ephemeral records (the session lives on at
//      the shards' new leaders), puts and reads COUNT new keys and gets a notification of each,
//      prints "PASS".
// A failed call (its shard's leader died, or was not open yet) is tried again until the shard's
// new leader answers, as an application of Oxia's client does; a key read back with another
// value, or missing, fails at once. Any failure prints "FAIL: why" and exits 1.

import io.oxia.client.api.GetResult;
import io.oxia.client.api.Notification;
import io.oxia.client.api.OxiaClientBuilder;
import io.oxia.client.api.PutOption;
import io.oxia.client.api.SyncOxiaClient;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.HashSet;
import java.util.Set;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.Callable;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

public final class OxiaClusterDriver {
    private static final Duration GUARD = Duration.ofSeconds(90);

    public static void main(String[] args) {
        try {
            run(args[0], args[1], Integer.parseInt(args[2]));
            System.out.println("PASS");
            System.out.flush();
            Runtime.getRuntime().halt(0);
        } catch (Throwable t) {
            t.printStackTrace();
            System.out.println("FAIL: " + t);
            System.out.flush();
            Runtime.getRuntime().halt(1);
        }
    }

    private static void run(String address, String namespace, int count) throws Exception {
        SyncOxiaClient client =
                OxiaClientBuilder.create(address)
                        .namespace(namespace)
                        .clientIdentifier("cluster-driver")
                        .requestTimeout(Duration.ofSeconds(10))
                        .syncClient();
        BlockingQueue<Notification> notifications = new LinkedBlockingQueue<>();
        client.notifications(notifications::add);
        for (int i = 0; i < count; i++) {
            put(client, key("before", i), value("before", i));
        }
        for (int i = 0; i < count / 4; i++) {
            String key = key("ephemeral", i);
            byte[] value = value("ephemeral", i).getBytes(StandardCharsets.UTF_8);
            untilAnswered(
                    "put " + key,
                    () -> client.put(key, value, Set.of(PutOption.AsEphemeralRecord)));
        }
        for (int i = 0; i < count; i++) {
            check(client, key("before", i), value("before", i));
        }
        for (int i = 0; i < count / 4; i++) {
            check(client, key("ephemeral", i), value("ephemeral", i));
        }
        System.out.println("WRITTEN");
        System.out.flush();
        BufferedReader stdin =
                new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        if (stdin.readLine() == null) {
            throw new AssertionError("the test ended before the failover");
        }
        for (int i = 0; i < count; i++) {
            check(client, key("before", i), value("before", i));
        }
        for (int i = 0; i < count / 4; i++) {
            check(client, key("ephemeral", i), value("ephemeral", i));
        }
        for (int i = 0; i < count; i++) {
            put(client, key("after", i), value("after", i));
        }
        for (int i = 0; i < count; i++) {
            check(client, key("after", i), value("after", i));
        }
        Set<String> notified = new HashSet<>();
        long deadline = System.nanoTime() + GUARD.toNanos();
        while (notified.size() < count) {
            Notification n = notifications.poll(deadline - System.nanoTime(), TimeUnit.NANOSECONDS);
            if (n == null) {
                throw new AssertionError(
                        "notified of " + notified.size() + " of " + count + " new keys");
            }
            if (n instanceof Notification.KeyCreated && n.key().contains("/after-")) {
                notified.add(n.key());
            }
        }
        client.close();
    }

    private static String key(String phase, int i) {
        return String.format("/cluster/%s-%03d", phase, i);
    }

    private static String value(String phase, int i) {
        return phase + "-value-" + i;
    }

    private static void put(SyncOxiaClient client, String key, String value) throws Exception {
        untilAnswered("put " + key, () -> client.put(key, value.getBytes(StandardCharsets.UTF_8)));
    }

    private static void check(SyncOxiaClient client, String key, String expected) throws Exception {
        GetResult got = untilAnswered("get " + key, () -> client.get(key));
        if (got == null) {
            throw new AssertionError(key + " is missing");
        }
        String actual = new String(got.getValue(), StandardCharsets.UTF_8);
        if (!expected.equals(actual)) {
            throw new AssertionError(key + ": expected " + expected + ", got " + actual);
        }
    }

    private static <T> T untilAnswered(String what, Callable<T> call) throws Exception {
        long deadline = System.nanoTime() + GUARD.toNanos();
        while (true) {
            try {
                return call.call();
            } catch (Exception e) {
                if (System.nanoTime() > deadline) {
                    throw new AssertionError(what + " never succeeded", e);
                }
                System.err.println(what + " failed, trying again: " + e);
                Thread.sleep(100);
            }
        }
    }
}
