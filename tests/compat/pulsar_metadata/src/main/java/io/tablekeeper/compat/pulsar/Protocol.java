package io.tablekeeper.compat.pulsar;

import java.io.PrintStream;

/**
 * The harness's lines on the JVM's real stdout, each starting with {@code @@tk }, read by
 * tests/compat/test_pulsar_metadata.py. Everything else (Pulsar's and the tests' own printing)
 * goes to stderr, so a test's output can never be taken for one of these lines.
 */
final class Protocol {
    private static PrintStream out = System.out;

    private Protocol() {}

    /** Keep the real stdout for these lines and send System.out to stderr. */
    static void claimStdout() {
        out = System.out;
        System.setOut(System.err);
    }

    static synchronized void line(String kind, String text) {
        out.println("@@tk " + kind + " " + text);
        out.flush();
    }
}
