// Concurrent clients of the real Oxia Java client (io.github.oxia-db:oxia-client, the version
// Pulsar ships) against TableKeeper's Oxia port, recording every operation for the checker
// (tests/robustness/checker).
//
// Usage: java OxiaWorkload HOST:PORT HISTORY CLIENTS KEYS DURATION_S SEED RATE PREFIX
//
// Each client is one SyncOxiaClient (its own connections and assignment stream) running one call
// at a time (at most RATE a second) on keys PREFIXk0..PREFIXkN-1 of namespace "default": gets,
// puts, compare-and-set on the version id (or on absence), deletes. Every value written is unique.
// A get that fails is recorded as "error" (it changed nothing), and so is a write whose connection
// to the shard's leader could not be made or that TableKeeper refused before logging it (see
// neverSent); a conditional write refused for its condition is "fail"; any other failure of a
// write is "unknown" (a write that reached the shard and one whose answer was lost look the same
// to the client). After a failure a client waits 0.3-0.7 s. After DURATION_S it stops issuing,
// lets the calls in flight end (each is bounded by the client's request timeout), writes the
// history and prints DONE.

import io.oxia.client.api.GetResult;
import io.oxia.client.api.OxiaClientBuilder;
import io.oxia.client.api.PutOption;
import io.oxia.client.api.PutResult;
import io.oxia.client.api.SyncOxiaClient;
import io.oxia.client.api.exceptions.KeyAlreadyExistsException;
import io.oxia.client.api.exceptions.UnexpectedVersionIdException;
import java.io.BufferedWriter;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.Set;

public final class OxiaWorkload {
    private static final Duration REQUEST_TIMEOUT = Duration.ofSeconds(5);

    public static void main(String[] args) throws Exception {
        String address = args[0];
        Path out = Path.of(args[1]);
        int clients = Integer.parseInt(args[2]);
        int keys = Integer.parseInt(args[3]);
        long stopAt = System.nanoTime() + (long) (Double.parseDouble(args[4]) * 1e9);
        long seed = Long.parseLong(args[5]);
        double rate = Double.parseDouble(args[6]);
        String prefix = args[7];
        List<Thread> threads = new ArrayList<>();
        List<Throwable> failures = new ArrayList<>();
        try (BufferedWriter history = Files.newBufferedWriter(out, StandardCharsets.UTF_8)) {
            for (int i = 0; i < clients; i++) {
                final int id = i;
                Thread t = new Thread(() -> {
                    try {
                        run(address, id, prefix, keys, stopAt, new Random(seed * 1000 + id), rate,
                                history);
                    } catch (Throwable e) {
                        synchronized (failures) {
                            failures.add(e);
                        }
                    }
                }, "client-" + i);
                threads.add(t);
                t.start();
            }
            for (Thread t : threads) {
                t.join();
            }
        }
        if (!failures.isEmpty()) {
            for (Throwable e : failures) {
                e.printStackTrace();
            }
            System.out.println("FAIL: " + failures.get(0));
            System.out.flush();
            Runtime.getRuntime().halt(1);
        }
        System.out.println("DONE");
        System.out.flush();
        // The clients' threads (reconnecting to a server the nemesis stopped) need not end.
        Runtime.getRuntime().halt(0);
    }

    private static void run(String address, int id, String prefix, int keys, long stopAt,
            Random rng, double rate, BufferedWriter history) throws Exception {
        String session = "oxia-" + id;
        SyncOxiaClient client = OxiaClientBuilder.create(address)
                .namespace("default")
                .clientIdentifier(session)
                // Every other client gives up after 1 s: while a leader is paused it keeps
                // calling (its calls may be answered when the leader resumes).
                .requestTimeout(id % 2 == 0 ? REQUEST_TIMEOUT : Duration.ofSeconds(1))
                .syncClient();
        Map<String, Long> versionIds = new HashMap<>(); // the last version id seen per key; -1 absent
        long pauseNs = (long) (1e9 / rate);
        for (int seq = 0; System.nanoTime() < stopAt; seq++) {
            String key = prefix + "k" + rng.nextInt(keys);
            String value = session + "-" + seq;
            Map<String, Object> r = new HashMap<>();
            r.put("proto", "oxia");
            r.put("session", session);
            r.put("key", key);
            r.put("model", "register");
            int dice = rng.nextInt(100);
            long call = System.nanoTime();
            r.put("call", call);
            if (dice < 40) {
                r.put("op", "get");
                try {
                    GetResult got = client.get(key);
                    r.put("ret", System.nanoTime());
                    r.put("status", "ok");
                    if (got != null) {
                        r.put("found", true);
                        r.put("rvalue", new String(got.getValue(), StandardCharsets.UTF_8));
                        r.put("version", got.getVersion().modificationsCount());
                        r.put("modrev", got.getVersion().versionId());
                        versionIds.put(key, got.getVersion().versionId());
                    } else {
                        versionIds.put(key, -1L);
                    }
                } catch (Exception e) {
                    r.put("ret", System.nanoTime());
                    r.put("status", "error");
                    r.put("error", describe(e));
                }
            } else if (dice < 90) {
                boolean conditional = dice >= 65;
                r.put("op", conditional ? "cas" : "put");
                r.put("value", value);
                Set<PutOption> options = Set.of();
                if (conditional) {
                    long expect = versionIds.getOrDefault(key, -1L);
                    r.put("expect", expect);
                    options = Set.of(expect == -1L
                            ? PutOption.IfRecordDoesNotExist
                            : PutOption.IfVersionIdEquals(expect));
                }
                try {
                    PutResult put = client.put(key, value.getBytes(StandardCharsets.UTF_8), options);
                    r.put("ret", System.nanoTime());
                    r.put("status", "ok");
                    r.put("modrev", put.version().versionId());
                } catch (Exception e) {
                    r.put("ret", System.nanoTime());
                    if (conditional && (cause(e, UnexpectedVersionIdException.class)
                            || cause(e, KeyAlreadyExistsException.class))) {
                        r.put("status", "fail");
                    } else {
                        r.put("status", neverSent(e) ? "error" : "unknown");
                    }
                    r.put("error", describe(e));
                }
            } else {
                r.put("op", "del");
                try {
                    boolean existed = client.delete(key);
                    r.put("ret", System.nanoTime());
                    r.put("status", "ok");
                    r.put("found", existed);
                } catch (Exception e) {
                    r.put("ret", System.nanoTime());
                    r.put("status", neverSent(e) ? "error" : "unknown");
                    r.put("error", describe(e));
                }
            }
            String line = json(r);
            synchronized (history) {
                history.write(line);
                history.newLine();
            }
            String status = (String) r.get("status");
            if (status.equals("error") || status.equals("unknown")) {
                // Back off after a failure, as an application would: an outage then costs a few
                // unknown writes, not hundreds (each of which the checker must place).
                Thread.sleep(300 + rng.nextInt(400));
            }
            Thread.sleep((long) (rng.nextDouble() * 2 * pauseNs) / 1_000_000);
        }
        try {
            client.close();
        } catch (Exception e) {
            // closing a client whose server the nemesis stopped may fail; its history is written
        }
    }

    // Nothing was applied: a connection to the shard's leader that could not be made (the
    // request never left), or TableKeeper's answers given only before a write is logged:
    // UNAVAILABLE "oxia: resource unavailable: ..." (not serving the shard now) and ABORTED
    // "oxia: node is not leader". The checker holds the server to that: a write recorded as
    // "error" must never show.
    private static boolean neverSent(Throwable t) {
        for (Throwable c = t; c != null; c = c.getCause()) {
            if (c instanceof io.grpc.StatusRuntimeException s) {
                io.grpc.Status status = s.getStatus();
                String d = status.getDescription() == null ? "" : status.getDescription();
                if ((status.getCode() == io.grpc.Status.Code.UNAVAILABLE
                                && d.startsWith("oxia: resource unavailable"))
                        || (status.getCode() == io.grpc.Status.Code.ABORTED
                                && d.startsWith("oxia: node is not leader"))) {
                    return true;
                }
            }
        }
        return cause(t, java.net.ConnectException.class);
    }

    private static boolean cause(Throwable t, Class<? extends Throwable> kind) {
        for (Throwable c = t; c != null; c = c.getCause()) {
            if (kind.isInstance(c)) {
                return true;
            }
        }
        return false;
    }

    private static String describe(Throwable t) {
        Throwable root = t;
        while (root.getCause() != null) {
            root = root.getCause();
        }
        return root.getClass().getSimpleName() + ": " + root.getMessage();
    }

    private static String json(Map<String, Object> fields) {
        StringBuilder b = new StringBuilder("{");
        for (Map.Entry<String, Object> e : fields.entrySet()) {
            if (b.length() > 1) {
                b.append(',');
            }
            b.append('"').append(e.getKey()).append("\":");
            Object v = e.getValue();
            if (v instanceof String s) {
                b.append('"');
                for (char c : s.toCharArray()) {
                    if (c == '"' || c == '\\') {
                        b.append('\\').append(c);
                    } else if (c < 0x20) {
                        b.append(String.format("\\u%04x", (int) c));
                    } else {
                        b.append(c);
                    }
                }
                b.append('"');
            } else {
                b.append(v);
            }
        }
        return b.append('}').toString();
    }
}
