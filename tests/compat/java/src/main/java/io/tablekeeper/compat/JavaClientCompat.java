package io.tablekeeper.compat;

import io.grpc.Status;
import io.grpc.StatusException;
import io.grpc.StatusRuntimeException;
import io.netty.buffer.ByteBuf;
import io.netty.buffer.Unpooled;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.bookkeeper.api.StorageClient;
import org.apache.bookkeeper.api.kv.PTable;
import org.apache.bookkeeper.api.kv.Table;
import org.apache.bookkeeper.api.kv.exceptions.KvApiException;
import org.apache.bookkeeper.api.kv.op.CompareResult;
import org.apache.bookkeeper.api.kv.options.Options;
import org.apache.bookkeeper.api.kv.options.RangeOption;
import org.apache.bookkeeper.api.kv.result.DeleteResult;
import org.apache.bookkeeper.api.kv.result.KeyValue;
import org.apache.bookkeeper.api.kv.result.RangeResult;
import org.apache.bookkeeper.api.kv.result.Result;
import org.apache.bookkeeper.api.kv.result.TxnResult;
import org.apache.bookkeeper.clients.StorageClientBuilder;
import org.apache.bookkeeper.clients.admin.StorageAdminClient;
import org.apache.bookkeeper.clients.config.StorageClientSettings;
import org.apache.bookkeeper.clients.exceptions.InternalServerException;
import org.apache.bookkeeper.stream.proto.NamespaceConfiguration;
import org.apache.bookkeeper.stream.proto.NamespaceProperties;
import org.apache.bookkeeper.stream.proto.StorageType;
import org.apache.bookkeeper.stream.proto.StreamConfiguration;
import org.apache.bookkeeper.stream.proto.StreamProperties;
import org.apache.bookkeeper.stream.protocol.ProtocolConstants;

/**
 * Drives the unmodified BookKeeper Java table client against one service URI and prints one
 * JSON object per observation on stdout: {"check": NAME, "value": ..., "error": ...}.
 * The expectations live in tests/compat/test_java_client.py, which runs this program.
 *
 * <p>Usage: JavaClientCompat SERVICE_URI routed|simple NAMESPACE CONCURRENT_OPS|restart
 *
 * <p>"routed" is StorageClientImpl (the client resolves every table range to its storage
 * container and talks to the container's owner); "simple" is the server-side-routing client
 * (enableServerSideRouting: every call to the service URI), what Pulsar Functions use.
 */
public final class JavaClientCompat {

    private static final long TIMEOUT_S = 60;
    private static final int SPLIT_KEYS = 200;

    private final StorageAdminClient admin;
    private final StorageClient client;
    private final String namespace;

    private JavaClientCompat(StorageAdminClient admin, StorageClient client, String namespace) {
        this.admin = admin;
        this.client = client;
        this.namespace = namespace;
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 4) {
            System.err.println(
                "usage: JavaClientCompat SERVICE_URI routed|simple NAMESPACE CONCURRENT_OPS|restart|split");
            System.exit(2);
        }
        String serviceUri = args[0];
        boolean simple = switch (args[1]) {
            case "routed" -> false;
            case "simple" -> true;
            default -> throw new IllegalArgumentException("client kind must be routed or simple: " + args[1]);
        };
        String namespace = args[2];
        boolean restart = "restart".equals(args[3]);
        boolean split = "split".equals(args[3]);
        int concurrentOps = restart || split ? 0 : Integer.parseInt(args[3]);
        StorageClientSettings settings = StorageClientSettings.newBuilder()
            .serviceUri(serviceUri)
            .enableServerSideRouting(simple)
            .clientName("tablekeeper-compat-" + args[1])
            .build();
        int status = 0;
        try (StorageAdminClient admin = StorageClientBuilder.newBuilder().withSettings(settings).buildAdmin();
             StorageClient client = StorageClientBuilder.newBuilder()
                 .withSettings(settings).withNamespace(namespace).build()) {
            JavaClientCompat compat = new JavaClientCompat(admin, client, namespace);
            if (restart || split) {
                if (restart) {
                    compat.restartChecks();
                } else {
                    compat.splitChecks();
                }
                emit("done", true, null);
                System.out.flush();
                Runtime.getRuntime().halt(0);
            }
            long started = System.nanoTime();
            compat.adminChecks();
            timing("admin", started);
            Table<ByteBuf, ByteBuf> table = await(client.openTable(namespace, "kv"));
            PTable<ByteBuf, ByteBuf> ptable = await(client.openPTable(namespace, "kv"));
            timing("open", started);
            compat.kvChecks(table);
            compat.rangeChecks(ptable);
            compat.txnChecks(table, ptable);
            timing("kv", started);
            compat.concurrentChecks(table, concurrentOps);
            timing("concurrent", started);
            emit("done", true, null);
        } catch (Throwable t) {
            emit("fatal", null, describe(t));
            t.printStackTrace();
            status = 1;
        }
        System.out.flush();
        // The client's scheduler and gRPC threads are not all daemons: end the JVM here.
        Runtime.getRuntime().halt(status);
    }

    /** Milliseconds since `started`, on stderr (the test shows stderr when it fails). */
    private static void timing(String phase, long started) {
        System.err.printf("timing: %s done after %d ms%n", phase, (System.nanoTime() - started) / 1_000_000);
    }

    /**
     * The client keeps using the owner it found after that server restarts: create a table and
     * write (the client now knows every container's owner), print "paused" and wait for a line on
     * stdin (the test restarts the server meanwhile), then write and read with the same client.
     */
    private void restartChecks() throws Exception {
        NamespaceConfiguration nsConf = NamespaceConfiguration.newBuilder()
            .setDefaultStreamConf(ProtocolConstants.DEFAULT_STREAM_CONF)
            .build();
        StreamConfiguration tableConf = StreamConfiguration.newBuilder(ProtocolConstants.DEFAULT_STREAM_CONF)
            .setStorageType(StorageType.TABLE)
            .build();
        await(admin.createNamespace(namespace, nsConf));
        await(admin.createStream(namespace, "kv", tableConf));
        Table<ByteBuf, ByteBuf> table = await(client.openTable(namespace, "kv"));
        await(table.put(buf("k"), buf("before")));
        emit("paused", true, null);
        System.out.flush();
        new java.io.BufferedReader(new java.io.InputStreamReader(System.in, StandardCharsets.UTF_8)).readLine();
        observe("restart.put", () -> await(table.put(buf("k"), buf("after"))), v -> "ok");
        observe("restart.get", () -> await(table.get(buf("k"))), JavaClientCompat::str);
    }

    /**
     * The client keeps working while the table's ranges split: create a table, put and increment
     * SPLIT_KEYS keys (the client now has the table's ranges), print "paused" and wait for a line
     * on stdin (the test splits ranges meanwhile), then with the same client read every key back,
     * increment every counter again and read the counters.
     */
    private void splitChecks() throws Exception {
        NamespaceConfiguration nsConf = NamespaceConfiguration.newBuilder()
            .setDefaultStreamConf(ProtocolConstants.DEFAULT_STREAM_CONF)
            .build();
        StreamConfiguration tableConf = StreamConfiguration.newBuilder(ProtocolConstants.DEFAULT_STREAM_CONF)
            .setInitialNumRanges(2)
            .setMinNumRanges(2)
            .setStorageType(StorageType.TABLE)
            .build();
        await(admin.createNamespace(namespace, nsConf));
        await(admin.createStream(namespace, "kv", tableConf));
        Table<ByteBuf, ByteBuf> table = await(client.openTable(namespace, "kv"));
        for (int i = 0; i < SPLIT_KEYS; i++) {
            await(table.put(buf("k-" + i), buf("v-" + i)));
            await(table.increment(buf("c-" + i), 1));
        }
        emit("paused", true, null);
        System.out.flush();
        new java.io.BufferedReader(new java.io.InputStreamReader(System.in, StandardCharsets.UTF_8)).readLine();
        observe("split.get", () -> {
            int right = 0;
            for (int i = 0; i < SPLIT_KEYS; i++) {
                if (("v-" + i).equals(str(await(table.get(buf("k-" + i)))))) {
                    right++;
                }
            }
            return right;
        }, n -> n);
        observe("split.counters", () -> {
            int right = 0;
            for (int i = 0; i < SPLIT_KEYS; i++) {
                await(table.increment(buf("c-" + i), 1));
                if (await(table.getNumber(buf("c-" + i))) == 2L) {
                    right++;
                }
            }
            return right;
        }, n -> n);
    }

    // ------------------------------------------------------------------ admin

    private void adminChecks() {
        NamespaceConfiguration nsConf = NamespaceConfiguration.newBuilder()
            .setDefaultStreamConf(ProtocolConstants.DEFAULT_STREAM_CONF)
            .build();
        NamespaceProperties created = observe("ns.create", () -> {
            NamespaceProperties props = await(admin.createNamespace(namespace, nsConf));
            return props;
        }, NamespaceProperties::getNamespaceName);
        observe("ns.create.duplicate", () -> await(admin.createNamespace(namespace, nsConf)), p -> "created");
        observe("ns.get.equals_created",
            () -> await(admin.getNamespace(namespace)), p -> created != null && p.equals(created));
        observe("ns.get.missing", () -> await(admin.getNamespace(namespace + "-missing")), p -> "found");
        observe("ns.delete.missing", () -> await(admin.deleteNamespace(namespace + "-missing")), b -> b);
        observe("ns.create.invalid_name", () -> await(admin.createNamespace("bad name<>", nsConf)), p -> "created");

        StreamConfiguration tableConf = StreamConfiguration.newBuilder(ProtocolConstants.DEFAULT_STREAM_CONF)
            .setMinNumRanges(4)
            .setInitialNumRanges(4)
            .setStorageType(StorageType.TABLE)
            .build();
        StreamProperties table = observe("table.create",
            () -> await(admin.createStream(namespace, "kv", tableConf)),
            p -> p.getStreamName() + " id>=1024:" + (p.getStreamId() >= 1024)
                + " conf_equal:" + p.getStreamConf().equals(tableConf));
        observe("table.create.duplicate", () -> await(admin.createStream(namespace, "kv", tableConf)), p -> "created");
        observe("table.get.equals_created",
            () -> await(admin.getStream(namespace, "kv")), p -> table != null && p.equals(table));
        observe("table.get.missing", () -> await(admin.getStream(namespace, "missing")), p -> "found");
        observe("table.create.missing_ns",
            () -> await(admin.createStream(namespace + "-missing", "t", tableConf)), p -> "created");
        observe("table.create.invalid_name",
            () -> await(admin.createStream(namespace, "bad name<>", tableConf)), p -> "created");
        observe("table.create_delete_get", () -> {
            await(admin.createStream(namespace, "dropped", tableConf));
            boolean deleted = await(admin.deleteStream(namespace, "dropped"));
            try {
                await(admin.getStream(namespace, "dropped"));
                return "deleted:" + deleted + " still found";
            } catch (RuntimeException e) {
                return "deleted:" + deleted + " then " + describe(e);
            }
        }, s -> s);
        observe("table.delete.missing", () -> await(admin.deleteStream(namespace, "missing")), b -> b);
        observe("table.open.missing", () -> await(client.openTable(namespace, "missing")), t -> "opened");
    }

    // ------------------------------------------------------------------ key/value

    private void kvChecks(Table<ByteBuf, ByteBuf> table) {
        observe("kv.put", () -> await(table.put(buf("k1"), buf("v1"))), v -> "ok");
        // The client's default read options: RangeRequest.limit = -1 and revision bounds
        // Long.MIN_VALUE..Long.MAX_VALUE ("no limit, no filter" to BookKeeper's server).
        observe("kv.get.default_options", () -> await(table.get(buf("k1"))), JavaClientCompat::str);
        observe("kv.getKv", () -> await(table.getKv(buf("k1"))), JavaClientCompat::kv);
        observe("kv.put.update", () -> await(table.put(buf("k1"), buf("v2"))), v -> "ok");
        observe("kv.getKv.updated", () -> await(table.getKv(buf("k1"))), JavaClientCompat::kv);
        observe("kv.get.missing", () -> await(table.get(buf("absent"))), JavaClientCompat::str);
        observe("kv.getKv.missing", () -> await(table.getKv(buf("absent"))), JavaClientCompat::kv);

        observe("counter.increment", () -> {
            await(table.increment(buf("c"), 5));
            await(table.increment(buf("c"), 3));
            return await(table.getNumber(buf("c")));
        }, n -> n);
        observe("counter.incrementAndGet", () -> await(table.incrementAndGet(buf("c"), 2)), n -> n);
        observe("counter.getAndIncrement", () -> await(table.getAndIncrement(buf("c"), 1)), n -> n);
        observe("counter.getKv", () -> await(table.getKv(buf("c"))), JavaClientCompat::kv);
        observe("counter.negative", () -> await(table.incrementAndGet(buf("c"), -20)), n -> n);
        observe("counter.getNumber.missing", () -> await(table.getNumber(buf("no-counter"))), n -> n);
        observe("counter.getNumber.bytes_key", () -> await(table.getNumber(buf("k1"))), n -> n);
        observe("counter.increment.bytes_key", () -> await(table.increment(buf("k1"), 1)), v -> "ok");
        observe("kv.put.number_key", () -> await(table.put(buf("c"), buf("x"))), v -> "ok");
        observe("counter.after_refused_put", () -> await(table.getNumber(buf("c"))), n -> n);

        observe("kv.delete", () -> await(table.delete(buf("k1"))), JavaClientCompat::str);
        observe("kv.get.deleted", () -> await(table.get(buf("k1"))), JavaClientCompat::str);
        observe("kv.delete.missing", () -> await(table.delete(buf("k1"))), JavaClientCompat::str);
        observe("kv.put.after_delete", () -> {
            await(table.put(buf("k1"), buf("v3")));
            return await(table.getKv(buf("k1")));
        }, JavaClientCompat::kv);
        observe("kv.put.empty_value", () -> {
            await(table.put(buf("empty"), buf("")));
            return await(table.getKv(buf("empty")));
        }, JavaClientCompat::kv);
        byte[] big = new byte[512 * 1024];
        for (int i = 0; i < big.length; i++) {
            big[i] = (byte) (i * 31);
        }
        observe("kv.put.large_value", () -> {
            await(table.put(buf("big"), Unpooled.wrappedBuffer(big)));
            ByteBuf read = await(table.get(buf("big")));
            byte[] back = new byte[read.readableBytes()];
            read.getBytes(read.readerIndex(), back);
            return java.util.Arrays.equals(big, back);
        }, b -> b);
    }

    // ------------------------------------------------------------------ ranges of one pkey

    private void rangeChecks(PTable<ByteBuf, ByteBuf> ptable) {
        observe("range.put", () -> {
            for (String k : new String[] {"a", "b", "c", "d", "e"}) {
                await(ptable.put(buf("pk"), buf(k), buf("val-" + k)));
            }
            await(ptable.put(buf("pk2"), buf("c"), buf("other-pkey")));
            return "ok";
        }, s -> s);
        observe("range.get.point", () -> await(ptable.get(buf("pk"), buf("c"))), JavaClientCompat::str);
        observe("range.inclusive", () -> await(ptable.range(buf("pk"), buf("a"), buf("e"))), JavaClientCompat::keys);
        observe("range.limit", () -> {
            RangeOption<ByteBuf> option = ptable.opFactory().optionFactory().newRangeOption()
                .limit(2).endKey(buf("e")).build();
            RangeResult<ByteBuf, ByteBuf> result = await(ptable.get(buf("pk"), buf("a"), option));
            return keys(result.kvs()) + " count=" + result.count() + " more=" + result.more();
        }, s -> s);
        observe("range.count_only", () -> {
            RangeOption<ByteBuf> option = ptable.opFactory().optionFactory().newRangeOption()
                .countOnly(true).endKey(buf("e")).build();
            RangeResult<ByteBuf, ByteBuf> result = await(ptable.get(buf("pk"), buf("b"), option));
            return "count=" + result.count() + " kvs=" + result.kvs().size();
        }, s -> s);
        observe("range.delete_range", () -> await(ptable.deleteRange(buf("pk"), buf("b"), buf("d"))),
            JavaClientCompat::keys);
        observe("range.after_delete_range", () -> await(ptable.range(buf("pk"), buf("a"), buf("z"))),
            JavaClientCompat::keys);
        observe("range.other_pkey_untouched", () -> await(ptable.get(buf("pk2"), buf("c"))), JavaClientCompat::str);
        observe("range.delete.blind", () -> {
            DeleteResult<ByteBuf, ByteBuf> result = await(ptable.delete(buf("pk"), buf("a"), Options.delete()));
            return "prev_kvs=" + result.prevKvs().size();
        }, s -> s);
        observe("range.after_blind_delete", () -> await(ptable.range(buf("pk"), buf("a"), buf("z"))),
            JavaClientCompat::keys);
    }

    // ------------------------------------------------------------------ txns

    private void txnChecks(Table<ByteBuf, ByteBuf> table, PTable<ByteBuf, ByteBuf> ptable) {
        observe("txn.putIfAbsent.absent", () -> await(table.putIfAbsent(buf("t1"), buf("t1"), buf("first"))), JavaClientCompat::str);
        observe("txn.putIfAbsent.present", () -> await(table.putIfAbsent(buf("t1"), buf("t1"), buf("second"))), JavaClientCompat::str);
        observe("txn.putIfAbsent.value", () -> await(table.get(buf("t1"))), JavaClientCompat::str);
        observe("txn.vPut.match", () -> await(table.vPut(buf("t1"), buf("t1"), buf("v-next"), 0)), n -> n);
        observe("txn.vPut.mismatch", () -> await(table.vPut(buf("t1"), buf("t1"), buf("v-stale"), 0)), n -> n);
        observe("txn.vPut.missing_key", () -> await(table.vPut(buf("t-missing"), buf("t-missing"), buf("x"), 0)), n -> n);
        observe("txn.vPut.value", () -> await(table.getKv(buf("t1"))), JavaClientCompat::kv);
        observe("txn.delete_if_value.mismatch", () -> await(table.delete(buf("t1"), buf("nope"))), b -> b);
        observe("txn.delete_if_value.match", () -> await(table.delete(buf("t1"), buf("v-next"))), b -> b);
        observe("txn.delete_if_value.gone", () -> await(table.get(buf("t1"))), JavaClientCompat::str);
        observe("txn.vDelete", () -> {
            await(table.put(buf("t2"), buf("x")));
            await(table.put(buf("t2"), buf("y")));
            return await(table.vDelete(buf("t2"), 1));
        }, JavaClientCompat::kv);
        observe("txn.vDelete.mismatch", () -> {
            await(table.put(buf("t3"), buf("x")));
            return await(table.vDelete(buf("t3"), 5));
        }, JavaClientCompat::kv);
        observe("txn.rDelete", () -> {
            KeyValue<ByteBuf, ByteBuf> kv = await(table.getKv(buf("t3")));
            KeyValue<ByteBuf, ByteBuf> deleted = await(table.rDelete(buf("t3"), kv.modifiedRevision()));
            return "mod_revision_matches:" + (deleted != null && deleted.modifiedRevision() == kv.modifiedRevision());
        }, s -> s);
        observe("txn.rDelete.mismatch", () -> {
            await(table.put(buf("t4"), buf("x")));
            return await(table.rDelete(buf("t4"), 1));
        }, JavaClientCompat::kv);
        // A txn with several compares (all must hold) and several ops, in one pkey.
        observe("txn.compares.success", () -> {
            await(ptable.put(buf("tp"), buf("a"), buf("1")));
            await(ptable.put(buf("tp"), buf("b"), buf("2")));
            var op = ptable.opFactory();
            TxnResult<ByteBuf, ByteBuf> result = await(ptable.txn(buf("tp"))
                .If(op.compareVersion(CompareResult.EQUAL, buf("a"), 0),
                    op.compareValue(CompareResult.EQUAL, buf("b"), buf("2")),
                    op.compareValue(CompareResult.EQUAL, buf("absent"), null),
                    op.compareModRevision(CompareResult.GREATER, buf("b"), 0))
                .Then(op.newPut(buf("c"), buf("3"), Options.blindPut()),
                    op.newDelete(buf("a"), Options.deleteAndGet()),
                    op.newRange(buf("b"), Options.get()))
                .Else(op.newRange(buf("a"), Options.get()))
                .commit());
            return "success=" + result.isSuccess() + " " + results(result.results());
        }, s -> s);
        observe("txn.compares.applied", () -> await(ptable.range(buf("tp"), buf("a"), buf("z"))), JavaClientCompat::keys);
        observe("txn.compares.failure", () -> {
            var op = ptable.opFactory();
            TxnResult<ByteBuf, ByteBuf> result = await(ptable.txn(buf("tp"))
                .If(op.compareValue(CompareResult.EQUAL, buf("b"), buf("2")),
                    op.compareVersion(CompareResult.GREATER, buf("c"), 7))
                .Then(op.newPut(buf("d"), buf("never"), Options.blindPut()))
                .Else(op.newRange(buf("b"), Options.get()), op.newPut(buf("e"), buf("else"), Options.blindPut()))
                .commit());
            return "success=" + result.isSuccess() + " " + results(result.results());
        }, s -> s);
        observe("txn.compares.failure_applied", () -> await(ptable.range(buf("tp"), buf("a"), buf("z"))),
            JavaClientCompat::keys);
    }

    // ------------------------------------------------------------------ concurrency

    private void concurrentChecks(Table<ByteBuf, ByteBuf> table, int n) {
        long started = System.nanoTime();
        Map<String, Integer> putErrors = new TreeMap<>();
        List<CompletableFuture<Void>> puts = new ArrayList<>(n);
        for (int i = 0; i < n; i++) {
            puts.add(table.put(buf("cc-" + i), buf("value-" + i)));
        }
        emit("concurrent.put.errors", errorCounts(puts, putErrors), null);
        timing("concurrent puts", started);

        Map<String, Integer> getErrors = new TreeMap<>();
        List<CompletableFuture<ByteBuf>> gets = new ArrayList<>(n);
        for (int i = 0; i < n; i++) {
            gets.add(table.get(buf("cc-" + i)));
        }
        String getErrorCounts = errorCounts(gets, getErrors);
        int mismatches = 0;
        for (int i = 0; i < n; i++) {
            CompletableFuture<ByteBuf> get = gets.get(i);
            if (!get.isCompletedExceptionally() && !("value-" + i).equals(str(get.join()))) {
                mismatches++;
            }
        }
        emit("concurrent.get.errors", getErrorCounts, null);
        emit("concurrent.get.mismatches", mismatches, null);
        timing("concurrent gets", started);

        int counters = 10;
        Map<String, Integer> incrErrors = new TreeMap<>();
        List<CompletableFuture<Void>> incrs = new ArrayList<>(n);
        for (int i = 0; i < n; i++) {
            incrs.add(table.increment(buf("cc-counter-" + (i % counters)), 1));
        }
        emit("concurrent.increment.errors", errorCounts(incrs, incrErrors), null);
        observe("concurrent.increment.total", () -> {
            long total = 0;
            for (int i = 0; i < counters; i++) {
                total += await(table.getNumber(buf("cc-counter-" + i)));
            }
            return total;
        }, t -> t);
        timing("concurrent increments", started);

        // Mixed: puts, increments, reads and txns on overlapping keys, all in flight at once.
        Map<String, Integer> mixedErrors = new TreeMap<>();
        List<CompletableFuture<?>> mixed = new ArrayList<>(n);
        AtomicLong ifAbsentWins = new AtomicLong();
        for (int i = 0; i < n; i++) {
            switch (i % 4) {
                case 0 -> mixed.add(table.put(buf("mx-" + (i % 50)), buf("m" + i)));
                case 1 -> mixed.add(table.increment(buf("mx-counter"), 1));
                case 2 -> mixed.add(table.getKv(buf("mx-" + (i % 50))));
                default -> mixed.add(table.putIfAbsent(buf("mx-once-" + (i % 25)), buf("mx-once-" + (i % 25)), buf("w" + i))
                    .thenAccept(prev -> {
                        if (prev == null) {
                            ifAbsentWins.incrementAndGet();
                        }
                    }));
            }
        }
        emit("concurrent.mixed.errors", errorCounts(mixed, mixedErrors), null);
        emit("concurrent.mixed.putIfAbsent_wins", ifAbsentWins.get(), null);
        observe("concurrent.mixed.counter", () -> await(table.getNumber(buf("mx-counter"))), t -> t);
    }

    /** Wait for every future; "" when all succeeded, else "CAUSE=COUNT,...". */
    private static String errorCounts(List<? extends CompletableFuture<?>> futures, Map<String, Integer> counts) {
        try {
            CompletableFuture.allOf(futures.toArray(new CompletableFuture<?>[0]))
                .handle((v, t) -> null).get(TIMEOUT_S * 2, TimeUnit.SECONDS);
        } catch (InterruptedException | ExecutionException | TimeoutException e) {
            counts.merge("driver-timeout", 1, Integer::sum);
        }
        for (CompletableFuture<?> future : futures) {
            if (!future.isDone()) {
                counts.merge("not-done", 1, Integer::sum);
            } else if (future.isCompletedExceptionally()) {
                try {
                    future.join();
                } catch (RuntimeException e) {
                    counts.merge(describe(e), 1, Integer::sum);
                }
            }
        }
        StringBuilder out = new StringBuilder();
        counts.forEach((k, v) -> out.append(out.length() == 0 ? "" : ",").append(k).append('=').append(v));
        return out.toString();
    }

    // ------------------------------------------------------------------ helpers

    @FunctionalInterface
    private interface Action<T> {
        T run() throws Exception;
    }

    @FunctionalInterface
    private interface Render<T> {
        Object render(T value);
    }

    /** Run `action`; emit its rendered value, or the exception it ended with. */
    private static <T> T observe(String check, Action<T> action, Render<T> render) {
        try {
            T value = action.run();
            emit(check, value == null ? null : render.render(value), null);
            return value;
        } catch (Throwable t) {
            emit(check, null, describe(t));
            return null;
        }
    }

    private static <T> T await(CompletableFuture<T> future) {
        try {
            return future.get(TIMEOUT_S, TimeUnit.SECONDS);
        } catch (ExecutionException e) {
            throw new CompletionException(e.getCause());
        } catch (InterruptedException | TimeoutException e) {
            throw new CompletionException(e);
        }
    }

    /** The cause's class and the part tests match on: a gRPC status, a KV code, a server code. */
    static String describe(Throwable t) {
        while ((t instanceof CompletionException || t instanceof ExecutionException) && t.getCause() != null) {
            t = t.getCause();
        }
        String name = t.getClass().getSimpleName();
        if (t instanceof StatusRuntimeException || t instanceof StatusException) {
            Status status = Status.fromThrowable(t);
            String description = status.getDescription();
            return name + ":" + status.getCode() + (description == null ? "" : " (" + description + ")");
        }
        if (t instanceof KvApiException kv) {
            return name + ":" + kv.getCode();
        }
        if (t instanceof InternalServerException) {
            String message = String.valueOf(t.getMessage());
            int at = message.indexOf("code = ");
            return name + ":" + (at >= 0 ? message.substring(at + 7).trim() : message);
        }
        if (t instanceof TimeoutException) {
            return "Timeout";
        }
        return name;
    }

    private static ByteBuf buf(String s) {
        return Unpooled.wrappedBuffer(s.getBytes(StandardCharsets.UTF_8));
    }

    private static String str(ByteBuf b) {
        return b == null ? null : b.toString(b.readerIndex(), b.readableBytes(), StandardCharsets.UTF_8);
    }

    private static String kv(KeyValue<ByteBuf, ByteBuf> kv) {
        if (kv == null) {
            return null;
        }
        String value = kv.isNumber() ? "number:" + kv.numberValue() : str(kv.value());
        boolean revisions = kv.createRevision() > 0 && kv.modifiedRevision() >= kv.createRevision();
        return str(kv.key()) + "=" + value + " version=" + kv.version() + " revisions_ok=" + revisions;
    }

    private static String keys(List<KeyValue<ByteBuf, ByteBuf>> kvs) {
        StringBuilder out = new StringBuilder();
        for (KeyValue<ByteBuf, ByteBuf> kv : kvs) {
            out.append(out.length() == 0 ? "" : ",").append(str(kv.key())).append('=').append(str(kv.value()));
        }
        return out.toString();
    }

    private static String results(List<Result<ByteBuf, ByteBuf>> results) {
        StringBuilder out = new StringBuilder("[");
        for (Result<ByteBuf, ByteBuf> r : results) {
            out.append(out.length() == 1 ? "" : " ");
            if (r instanceof RangeResult<ByteBuf, ByteBuf> range) {
                out.append("range:").append(keys(range.kvs()));
            } else if (r instanceof DeleteResult<ByteBuf, ByteBuf> delete) {
                out.append("delete:").append(keys(delete.prevKvs()));
            } else {
                out.append(r.type().name().toLowerCase());
            }
        }
        return out.append(']').toString();
    }

    static synchronized void emit(String check, Object value, String error) {
        StringBuilder out = new StringBuilder("{\"check\":").append(quote(check)).append(",\"value\":");
        if (value == null) {
            out.append("null");
        } else if (value instanceof Boolean || value instanceof Number) {
            out.append(value);
        } else {
            out.append(quote(value.toString()));
        }
        out.append(",\"error\":").append(error == null ? "null" : quote(error)).append('}');
        System.out.println(out);
    }

    private static String quote(String s) {
        StringBuilder out = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            switch (c) {
                case '"' -> out.append("\\\"");
                case '\\' -> out.append("\\\\");
                default -> {
                    if (c < 0x20) {
                        out.append(String.format("\\u%04x", (int) c));
                    } else {
                        out.append(c);
                    }
                }
            }
        }
        return out.append('"').toString();
    }
}
