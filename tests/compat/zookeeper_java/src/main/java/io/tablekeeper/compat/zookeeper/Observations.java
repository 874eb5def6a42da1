package io.tablekeeper.compat.zookeeper;

import java.util.concurrent.Callable;
import org.apache.zookeeper.KeeperException;

/**
 * What a driver saw, one JSON object a line on stdout: {"check": NAME, "value": TEXT} when the
 * check's call returned, {"check": NAME, "error": CODE} when it threw (a KeeperException's code
 * name, such as NODEEXISTS, or the exception's class and message otherwise). The Python test
 * compares each line with what ZooKeeper makes the client return.
 */
final class Observations {
    private Observations() {}

    /** Run {@code body} and print what it returned or threw. Never throws. */
    static void check(String name, Callable<Object> body) {
        Object value;
        try {
            value = body.call();
        } catch (KeeperException e) {
            emit(name, "error", e.code().name());
            return;
        } catch (Throwable e) {
            e.printStackTrace(); // to stderr, which the test shows when a check fails
            emit(name, "error", e.getClass().getSimpleName() + ": " + e.getMessage());
            return;
        }
        emit(name, "value", String.valueOf(value));
    }

    static synchronized void emit(String name, String field, String text) {
        System.out.println("{\"check\": " + quote(name) + ", \"" + field + "\": " + quote(text) + "}");
        System.out.flush();
    }

    static String quote(String text) {
        StringBuilder out = new StringBuilder("\"");
        for (char c : text.toCharArray()) {
            switch (c) {
                case '"' -> out.append("\\\"");
                case '\\' -> out.append("\\\\");
                case '\n' -> out.append("\\n");
                case '\r' -> out.append("\\r");
                case '\t' -> out.append("\\t");
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

    /** Fail a check with a message (reported as its error). */
    static void require(boolean condition, String message) {
        if (!condition) {
            throw new IllegalStateException(message);
        }
    }
}
