package io.tablekeeper.compat;

import io.netty.buffer.ByteBuf;
import io.netty.buffer.Unpooled;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.Locale;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.bookkeeper.api.StorageClient;
import org.apache.bookkeeper.api.kv.Table;
import org.apache.bookkeeper.clients.StorageClientBuilder;
import org.apache.bookkeeper.clients.admin.StorageAdminClient;
import org.apache.bookkeeper.clients.config.StorageClientSettings;
import org.apache.bookkeeper.stream.proto.NamespaceConfiguration;
import org.apache.bookkeeper.stream.proto.StorageType;
import org.apache.bookkeeper.stream.proto.StreamConfiguration;
import org.apache.bookkeeper.stream.protocol.ProtocolConstants;

/**
 * Increment throughput through the BookKeeper Java table client, shaped like Pulsar Functions'
 * state context: the server-side-routing client (enableServerSideRouting(true)), the table opened
 * with openTable, every counter update a unary {@code Table.increment(key, amount)}.
 *
 * <p>Usage: IncrementBench SERVICE_URI NAMESPACE TABLE KEYS IN_FLIGHT SECONDS [WARMUP_SECONDS]
 *
 * <p>Creates the namespace and the table (4 ranges, as the functions worker does) with the admin
 * client if they are missing, warms up, then keeps IN_FLIGHT increments outstanding (a semaphore)
 * over KEYS keys for SECONDS and prints one JSON line: ops_per_s, p50_ms, p99_ms, ops, errors.
 */
public final class IncrementBench {

    private IncrementBench() {
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 6 || args.length > 7) {
            System.err.println(
                "usage: IncrementBench SERVICE_URI NAMESPACE TABLE KEYS IN_FLIGHT SECONDS [WARMUP_SECONDS]");
            System.exit(2);
        }
        String serviceUri = args[0];
        String namespace = args[1];
        String tableName = args[2];
        int keys = Integer.parseInt(args[3]);
        int inFlight = Integer.parseInt(args[4]);
        double seconds = Double.parseDouble(args[5]);
        double warmup = args.length == 7 ? Double.parseDouble(args[6]) : 5.0;
        StorageClientSettings settings = StorageClientSettings.newBuilder()
            .serviceUri(serviceUri)
            .enableServerSideRouting(true)
            .clientName("tablekeeper-increment-bench")
            .build();
        int status = 0;
        try (StorageAdminClient admin = StorageClientBuilder.newBuilder().withSettings(settings).buildAdmin();
             StorageClient client = StorageClientBuilder.newBuilder()
                 .withSettings(settings).withNamespace(namespace).build()) {
            ensureTable(admin, namespace, tableName);
            Table<ByteBuf, ByteBuf> table = client.openTable(tableName).get(60, TimeUnit.SECONDS);
            ByteBuf[] keyBufs = new ByteBuf[keys];
            for (int i = 0; i < keys; i++) {
                keyBufs[i] = Unpooled.unreleasableBuffer(
                    Unpooled.wrappedBuffer(("counter-" + i).getBytes(StandardCharsets.UTF_8)));
            }
            run(table, keyBufs, inFlight, warmup, null);
            Stats stats = new Stats();
            double elapsed = run(table, keyBufs, inFlight, seconds, stats);
            long[] lat = Arrays.copyOf(stats.latenciesNs, (int) Math.min(stats.count.get(), stats.latenciesNs.length));
            Arrays.sort(lat);
            System.out.printf(Locale.ROOT,
                "{\"service\": \"%s\", \"in_flight\": %d, \"keys\": %d, \"seconds\": %.3f, \"ops\": %d,"
                    + " \"ops_per_s\": %.1f, \"p50_ms\": %.3f, \"p99_ms\": %.3f, \"errors\": %d,"
                    + " \"first_error\": %s}%n",
                serviceUri, inFlight, keys, elapsed, stats.ok.get(), stats.ok.get() / elapsed,
                pct(lat, 0.50), pct(lat, 0.99), stats.errors.get(),
                stats.firstError == null ? "null" : "\"" + stats.firstError.replace("\\", "\\\\")
                    .replace("\"", "'").replace("\n", " ") + "\"");
        } catch (Throwable t) {
            t.printStackTrace();
            status = 1;
        }
        System.out.flush();
        // The client's threads are not all daemons: end the JVM here.
        Runtime.getRuntime().halt(status);
    }

    private static void ensureTable(StorageAdminClient admin, String namespace, String tableName)
            throws Exception {
        NamespaceConfiguration nsConf = NamespaceConfiguration.newBuilder()
            .setDefaultStreamConf(ProtocolConstants.DEFAULT_STREAM_CONF)
            .build();
        StreamConfiguration tableConf = StreamConfiguration.newBuilder(ProtocolConstants.DEFAULT_STREAM_CONF)
            .setInitialNumRanges(4)
            .setMinNumRanges(4)
            .setStorageType(StorageType.TABLE)
            .build();
        try {
            admin.getNamespace(namespace).get(60, TimeUnit.SECONDS);
        } catch (Exception e) {
            admin.createNamespace(namespace, nsConf).get(60, TimeUnit.SECONDS);
        }
        try {
            admin.getStream(namespace, tableName).get(60, TimeUnit.SECONDS);
        } catch (Exception e) {
            admin.createStream(namespace, tableName, tableConf).get(60, TimeUnit.SECONDS);
        }
    }

    private static final class Stats {
        final AtomicLong count = new AtomicLong();
        final AtomicLong ok = new AtomicLong();
        final AtomicLong errors = new AtomicLong();
        final long[] latenciesNs = new long[4_000_000];
        volatile String firstError;
    }

    /** Keeps inFlight increments outstanding for `seconds`; returns the seconds it took to drain. */
    private static double run(Table<ByteBuf, ByteBuf> table, ByteBuf[] keys, int inFlight, double seconds,
                              Stats stats) throws InterruptedException {
        Semaphore permits = new Semaphore(inFlight);
        long start = System.nanoTime();
        long end = start + (long) (seconds * 1e9);
        long i = 0;
        while (System.nanoTime() < end) {
            if (!permits.tryAcquire(100, TimeUnit.MILLISECONDS)) {
                continue;
            }
            ByteBuf key = keys[(int) (i++ % keys.length)];
            long sent = System.nanoTime();
            CompletableFuture<Void> f = table.increment(key.duplicate(), 1L);
            f.whenComplete((v, err) -> {
                long took = System.nanoTime() - sent;
                permits.release();
                if (stats == null) {
                    return;
                }
                if (err != null) {
                    stats.errors.incrementAndGet();
                    if (stats.firstError == null) {
                        stats.firstError = err.toString();
                    }
                    return;
                }
                stats.ok.incrementAndGet();
                long slot = stats.count.getAndIncrement();
                if (slot < stats.latenciesNs.length) {
                    stats.latenciesNs[(int) slot] = took;
                }
            });
        }
        permits.acquire(inFlight);  // wait for the calls still outstanding
        return (System.nanoTime() - start) / 1e9;
    }

    private static double pct(long[] sorted, double p) {
        if (sorted.length == 0) {
            return Double.NaN;
        }
        int idx = (int) Math.min(sorted.length - 1, Math.ceil(p * sorted.length) - 1);
        return sorted[Math.max(0, idx)] / 1e6;
    }
}
