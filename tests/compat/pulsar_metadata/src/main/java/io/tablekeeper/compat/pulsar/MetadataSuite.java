package io.tablekeeper.compat.pulsar;

import java.util.ArrayList;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Set;
import org.apache.pulsar.tests.AnnotationListener;
import org.testng.TestNG;

/**
 * Runs Pulsar's metadata test classes, unmodified, against TableKeeper:
 * {@code java MetadataSuite Oxia Etcd -- CLASS...}, talking to the Python side of the harness
 * on stdin/stdout ({@link Servers}, {@link Protocol}).
 *
 * <p>As Pulsar's build runs them: Pulsar's {@code AnnotationListener} (a failed test is run once
 * more, {@code testRetryCount}=1; its default timeouts) and the groups {@code quarantine} and
 * {@code flaky} left out. The store data provider's rows become TableKeeper's stores
 * ({@link TableKeeperStores}); each invocation's outcome is reported ({@link ResultLines}).
 * Exits 0 when TestNG saw no failure.
 */
public final class MetadataSuite {
    private MetadataSuite() {}

    public static void main(String[] args) throws Exception {
        Protocol.claimStdout();
        Set<String> stores = new LinkedHashSet<>();
        List<Class<?>> classes = new ArrayList<>();
        boolean inClasses = false;
        for (String arg : args) {
            if (arg.equals("--")) {
                inClasses = true;
            } else if (inClasses) {
                classes.add(Class.forName(arg));
            } else {
                stores.add(arg);
            }
        }
        if (stores.isEmpty() || classes.isEmpty()) {
            throw new IllegalArgumentException("usage: MetadataSuite STORE... -- TEST_CLASS...");
        }
        TestNG testng = new TestNG(false);
        testng.setTestClasses(classes.toArray(new Class<?>[0]));
        testng.setExcludedGroups("quarantine,flaky");
        testng.addListener(new AnnotationListener());
        TableKeeperStores tableKeeper = new TableKeeperStores(stores, new Servers());
        testng.addListener((org.testng.ITestNGListener) tableKeeper);
        testng.addListener(new ResultLines());
        testng.setVerbose(0);
        testng.run();
        Protocol.line("status", Integer.toString(testng.getStatus()));
        System.exit(testng.hasFailure() ? 1 : 0);
    }
}
