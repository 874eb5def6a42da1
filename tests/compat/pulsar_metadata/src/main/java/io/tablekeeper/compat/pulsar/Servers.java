package io.tablekeeper.compat.pulsar;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;

/**
 * Fresh TableKeeper servers, started by the Python side of the harness: asked with a line
 * {@code @@tk server <n>} on stdout, it starts server n (after stopping the previous one) and
 * answers on stdin with {@code STORE=URL} pairs separated by spaces, or a line starting with
 * {@code error} when it could not start one.
 */
public final class Servers {
    private final BufferedReader answers =
            new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    private Object owner;
    private int ownerSetup = -1;
    private int started;
    private Map<String, String> urls = Map.of();

    /** The URL of {@code store} on the server of this test instance's current set-up. */
    public synchronized String url(String store, Object test, int setupNumber) {
        ensure(test, setupNumber);
        String url = urls.get(store);
        if (url == null) {
            throw new IllegalStateException("the harness gave no URL for " + store + ": " + urls);
        }
        return url;
    }

    /** A server for this test instance's current set-up: the one it has, or a fresh one. */
    public synchronized void ensure(Object test, int setupNumber) {
        if (test != owner || setupNumber != ownerSetup) {
            urls = start();
            owner = test;
            ownerSetup = setupNumber;
        }
    }

    private Map<String, String> start() {
        started++;
        Protocol.line("server", Integer.toString(started));
        String answer;
        try {
            answer = answers.readLine();
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
        if (answer == null || answer.startsWith("error")) {
            throw new IllegalStateException("no TableKeeper server: " + answer);
        }
        Map<String, String> result = new HashMap<>();
        for (String pair : answer.trim().split(" +")) {
            int eq = pair.indexOf('=');
            result.put(pair.substring(0, eq), pair.substring(eq + 1));
        }
        return result;
    }
}
