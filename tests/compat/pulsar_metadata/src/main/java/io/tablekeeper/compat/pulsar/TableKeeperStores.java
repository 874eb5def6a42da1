package io.tablekeeper.compat.pulsar;

import java.lang.reflect.Field;
import java.lang.reflect.Method;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.Set;
import java.util.function.Supplier;
import org.testng.IDataProviderInterceptor;
import org.testng.IDataProviderMethod;
import org.testng.IInvokedMethod;
import org.testng.IInvokedMethodListener;
import org.testng.IMethodInstance;
import org.testng.IMethodInterceptor;
import org.testng.ITestContext;
import org.testng.ITestNGMethod;
import org.testng.ITestResult;
import org.testng.annotations.DataProvider;
import org.testng.annotations.Test;

/**
 * Gives Pulsar's metadata tests TableKeeper's stores, and runs only the tests that take one.
 *
 * <p>The store data providers of Pulsar's {@code BaseMetadataStoreTest} ("impl",
 * "distributedImpl", "zkImpls") hand each test a row {@code {storeName, urlSupplier}}; upstream
 * the Oxia and Etcd suppliers start a container the first time they are asked, and the base
 * class's clean-up (after every failure, as well as after the class) stops it, so the next ask
 * starts a fresh one. Here a row of a store under test keeps its name and gets a supplier that
 * asks {@link Servers} for a fresh TableKeeper server under the same rule: one per test-class
 * instance and set-up (the base class counts its set-ups). The rows of every other store
 * (ZooKeeper, Memory, RocksDB, MockZooKeeper) are dropped.
 *
 * <p>Test methods that do not take their store from the base class's provider (ZooKeeper- or
 * container-only tests, tests of other classes' data) never reach TableKeeper: they are left out
 * and reported ({@code @@tk dropped ...}), as are methods whose provider rows were all of other
 * stores ({@code @@tk norows ...}). Assertions and test bodies are untouched.
 *
 * <p>A test's server is started before the test method is invoked (after its set-up), so the
 * start does not count against a test's own time-out; the supplier then finds it ready.
 */
public final class TableKeeperStores
        implements IDataProviderInterceptor, IMethodInterceptor, IInvokedMethodListener {
    static final String BASE_CLASS = "org.apache.pulsar.metadata.BaseMetadataStoreTest";
    static final String RETRY_SUPPORT_CLASS = "org.apache.pulsar.tests.TestRetrySupport";

    private final Set<String> stores;
    private final Servers servers;

    /** {@code stores}: the store names as Pulsar's provider names them ("Oxia", "Etcd"). */
    public TableKeeperStores(Set<String> stores, Servers servers) {
        this.stores = Set.copyOf(stores);
        this.servers = servers;
    }

    @Override
    public List<IMethodInstance> intercept(List<IMethodInstance> methods, ITestContext context) {
        List<IMethodInstance> kept = new ArrayList<>();
        for (IMethodInstance instance : methods) {
            Method method = instance.getMethod().getConstructorOrMethod().getMethod();
            Method provider = storeProvider(method);
            if (provider != null) {
                kept.add(instance);
            } else {
                Protocol.line("dropped", name(instance.getMethod()));
            }
        }
        return kept;
    }

    @Override
    public Iterator<Object[]> intercept(
            Iterator<Object[]> original,
            IDataProviderMethod dataProviderMethod,
            ITestNGMethod method,
            ITestContext context) {
        if (!dataProviderMethod.getMethod().getDeclaringClass().getName().equals(BASE_CLASS)) {
            return original;
        }
        Object test = method.getInstance();
        List<Object[]> rows = new ArrayList<>();
        while (original.hasNext()) {
            Object[] row = original.next();
            String store = (String) row[0];
            if (stores.contains(store)) {
                Object[] replaced = row.clone();
                replaced[1] = new Url(store, () -> servers.url(store, test, setupNumber(test)));
                rows.add(replaced);
            }
        }
        if (rows.isEmpty()) {
            Protocol.line("norows", name(method) + " " + dataProviderMethod.getName());
        }
        return rows.iterator();
    }

    @Override
    public void beforeInvocation(IInvokedMethod invoked, ITestResult result) {
        if (!invoked.isTestMethod()) {
            return;
        }
        Object[] parameters = result.getParameters();
        if (parameters.length > 1 && parameters[1] instanceof Url) {
            Object test = invoked.getTestMethod().getInstance();
            servers.ensure(test, setupNumber(test));
        }
    }

    static String name(ITestNGMethod method) {
        return method.getRealClass().getName() + "#" + method.getMethodName();
    }

    /** The base class's data provider the method takes its store from, or null. */
    static Method storeProvider(Method method) {
        Test test = method.getAnnotation(Test.class);
        if (test == null) {
            test = method.getDeclaringClass().getAnnotation(Test.class);
        }
        if (test == null || test.dataProvider().isEmpty() || test.dataProviderClass() != Object.class) {
            return null;
        }
        for (Class<?> c = method.getDeclaringClass(); c != null; c = c.getSuperclass()) {
            for (Method candidate : c.getDeclaredMethods()) {
                DataProvider dp = candidate.getAnnotation(DataProvider.class);
                if (dp == null) {
                    continue;
                }
                String dpName = dp.name().isEmpty() ? candidate.getName() : dp.name();
                if (dpName.equals(test.dataProvider())) {
                    return c.getName().equals(BASE_CLASS) ? candidate : null;
                }
            }
        }
        return null;
    }

    /** How many times the test instance has been set up (Pulsar's TestRetrySupport counts). */
    static int setupNumber(Object test) {
        for (Class<?> c = test.getClass(); c != null; c = c.getSuperclass()) {
            if (c.getName().equals(RETRY_SUPPORT_CLASS)) {
                try {
                    Field field = c.getDeclaredField("currentSetupNumber");
                    field.setAccessible(true);
                    return field.getInt(test);
                } catch (ReflectiveOperationException e) {
                    throw new IllegalStateException("cannot read the set-up count of " + test, e);
                }
            }
        }
        throw new IllegalStateException(test.getClass() + " does not extend " + RETRY_SUPPORT_CLASS);
    }

    /** A store URL, shown in test names as the store's name (Pulsar shows "oxia://..."). */
    record Url(String store, Supplier<String> url) implements Supplier<String> {
        @Override
        public String get() {
            return url.get();
        }

        @Override
        public String toString() {
            return store.toLowerCase() + "://tablekeeper";
        }
    }
}
