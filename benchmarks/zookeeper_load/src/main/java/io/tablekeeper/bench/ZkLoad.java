package io.tablekeeper.bench;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Random;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.zookeeper.AsyncCallback;
import org.apache.zookeeper.CreateMode;
import org.apache.zookeeper.KeeperException;
import org.apache.zookeeper.Watcher;
import org.apache.zookeeper.ZooDefs;
import org.apache.zookeeper.ZooKeeper;

/**
 * Keeps N requests in flight on one ZooKeeper session (the real Java client's async API) and
 * reports, per operation, completed operations per second and latency percentiles.
 *
 * <p>Operations: create (new nodes), set (setData on existing keys), get (getData), children
 * (getChildren of a directory of 10), delete (the nodes create made). Each runs a warm-up, then
 * a measured phase; "BEGIN op" is printed when the measured phase starts and "END {json}" when
 * its last request is answered, so the caller can read each server's CPU time at both lines.
 */
public final class ZkLoad {
  private final ZooKeeper zk;
  private final String prefix;
  private final int inflight;
  private final long warmupNanos;
  private final long measureNanos;
  private final int keys;
  private final byte[] value;
  private final Random random = new Random(42);
  private final List<String> created = new ArrayList<>();
  private int deleted;

  private ZkLoad(ZooKeeper zk, String prefix, int inflight, double warmup, double seconds,
      int keys, int valueSize) {
    this.zk = zk;
    this.prefix = prefix;
    this.inflight = inflight;
    this.warmupNanos = (long) (warmup * 1e9);
    this.measureNanos = (long) (seconds * 1e9);
    this.keys = keys;
    this.value = new byte[valueSize];
    random.nextBytes(value);
  }

  public static void main(String[] args) throws Exception {
    String hosts = "127.0.0.1:2181";
    String ops = "create,set,get,children,delete";
    int inflight = 1;
    double seconds = 5;
    double warmup = 1;
    int keys = 1000;
    int valueSize = 100;
    String prefix = "/bench-" + Long.toHexString(System.nanoTime());
    for (int i = 0; i < args.length; i += 2) {
      String value = args[i + 1];
      switch (args[i]) {
        case "--hosts" -> hosts = value;
        case "--ops" -> ops = value;
        case "--inflight" -> inflight = Integer.parseInt(value);
        case "--seconds" -> seconds = Double.parseDouble(value);
        case "--warmup" -> warmup = Double.parseDouble(value);
        case "--keys" -> keys = Integer.parseInt(value);
        case "--value-size" -> valueSize = Integer.parseInt(value);
        case "--prefix" -> prefix = value;
        default -> throw new IllegalArgumentException("unknown option " + args[i]);
      }
    }
    CountDownLatch connected = new CountDownLatch(1);
    ZooKeeper zk = new ZooKeeper(hosts, 30000, event -> {
      if (event.getState() == Watcher.Event.KeeperState.SyncConnected) {
        connected.countDown();
      }
    });
    if (!connected.await(60, TimeUnit.SECONDS)) {
      throw new IllegalStateException("no session with " + hosts);
    }
    ZkLoad load = new ZkLoad(zk, prefix, inflight, warmup, seconds, keys, valueSize);
    load.setUp();
    for (String op : ops.split(",")) {
      load.run(op.trim());
    }
    zk.close();
  }

  private void setUp() throws KeeperException, InterruptedException {
    zk.create(prefix, new byte[0], ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT);
    for (String dir : new String[] {"/k", "/dir", "/c"}) {
      zk.create(prefix + dir, new byte[0], ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT);
    }
    for (int i = 0; i < 10; i++) {
      zk.create(prefix + "/dir/child-" + i, value, ZooDefs.Ids.OPEN_ACL_UNSAFE,
          CreateMode.PERSISTENT);
    }
    Semaphore window = new Semaphore(64);
    CountDownLatch done = new CountDownLatch(keys);
    for (int i = 0; i < keys; i++) {
      window.acquire();
      zk.create(key(i), value, ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT,
          (rc, path, ctx, name) -> {
            window.release();
            done.countDown();
          }, null);
    }
    done.await();
  }

  private String key(int i) {
    return prefix + "/k/key-" + i;
  }

  /**
   * Before the delete phase: the nodes create made, plus more (unmeasured, 64 in flight) up to
   * three times as many, so deletes (which go faster than creates) do not run out.
   */
  private void topUp() throws InterruptedException {
    int target = Math.max(3 * created.size(), 1000);
    Semaphore window = new Semaphore(64);
    while (created.size() < target) {
      window.acquire();
      String path = prefix + "/c/n-" + created.size();
      created.add(path);
      zk.create(path, value, ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT,
          (AsyncCallback.StringCallback) (rc, p, ctx, name) -> window.release(), null);
    }
    window.acquire(64);
  }

  /** One operation's warm-up and measured phase. */
  private void run(String op) throws InterruptedException {
    if (op.equals("delete")) {
      synchronized (created) {
        topUp();
      }
    }
    Semaphore window = new Semaphore(inflight);
    AtomicLong errors = new AtomicLong();
    long[] latencies = new long[1 << 20];
    AtomicLong measured = new AtomicLong();
    long start = System.nanoTime();
    long measureStart = start + warmupNanos;
    long end = measureStart + measureNanos;
    boolean begun = false;
    while (true) {
      long now = System.nanoTime();
      if (!begun && now >= measureStart) {
        System.out.println("BEGIN " + op);
        System.out.flush();
        begun = true;
      }
      if (now >= end) {
        break;
      }
      window.acquire();
      final long sent = System.nanoTime();
      final boolean counted = sent >= measureStart;
      Runnable done = () -> {
        if (counted) {
          long index = measured.getAndIncrement();
          if (index < latencies.length) {
            latencies[(int) index] = System.nanoTime() - sent;
          }
        }
        window.release();
      };
      if (!issue(op, done, errors)) {
        window.release();
        break; // nothing left to delete
      }
    }
    window.acquire(inflight); // every request answered
    double seconds = Math.max(1, System.nanoTime() - measureStart) / 1e9;
    if (!begun) {
      System.out.println("BEGIN " + op);
    }
    int count = (int) Math.min(measured.get(), latencies.length);
    long[] sorted = Arrays.copyOf(latencies, count);
    Arrays.sort(sorted);
    System.out.printf(
        "END {\"op\": \"%s\", \"inflight\": %d, \"ops\": %d, \"seconds\": %.3f, "
            + "\"ops_per_s\": %.1f, \"p50_ms\": %.3f, \"p99_ms\": %.3f, \"errors\": %d}%n",
        op, inflight, count, seconds, count / seconds, percentile(sorted, 50) / 1e6,
        percentile(sorted, 99) / 1e6, errors.get());
    System.out.flush();
  }

  private static double percentile(long[] sorted, double q) {
    if (sorted.length == 0) {
      return Double.NaN;
    }
    int index = (int) Math.min(sorted.length - 1, Math.max(0, Math.ceil(q / 100 * sorted.length) - 1));
    return sorted[index];
  }

  private boolean issue(String op, Runnable done, AtomicLong errors) {
    switch (op) {
      case "create" -> {
        String path;
        synchronized (created) {
          path = prefix + "/c/n-" + created.size();
          created.add(path);
        }
        zk.create(path, value, ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT,
            (AsyncCallback.StringCallback) (rc, p, ctx, name) -> finish(rc, errors, done), null);
      }
      case "set" -> zk.setData(key(random.nextInt(keys)), value, -1,
          (rc, p, ctx, stat) -> finish(rc, errors, done), null);
      case "get" -> zk.getData(key(random.nextInt(keys)), false,
          (rc, p, ctx, data, stat) -> finish(rc, errors, done), null);
      case "children" -> zk.getChildren(prefix + "/dir", false,
          (AsyncCallback.ChildrenCallback) (rc, p, ctx, children) -> finish(rc, errors, done),
          null);
      case "delete" -> {
        String path;
        synchronized (created) {
          if (deleted >= created.size()) {
            return false;
          }
          path = created.get(deleted++);
        }
        zk.delete(path, -1, (rc, p, ctx) -> finish(rc, errors, done), null);
      }
      default -> throw new IllegalArgumentException("unknown op " + op);
    }
    return true;
  }

  private static void finish(int rc, AtomicLong errors, Runnable done) {
    if (rc != 0) {
      errors.incrementAndGet();
    }
    done.run();
  }

  static {
    // Quiet the client's INFO logging (slf4j-simple): warnings and errors still show.
    System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn");
  }
}
