package io.tablekeeper.compat.pulsar;

import java.io.PrintWriter;
import java.io.StringWriter;
import org.testng.ITestListener;
import org.testng.ITestResult;

/**
 * One line per test invocation: {@code @@tk result <status> <class>#<method> <store> <seconds>},
 * status PASS, FAIL, SKIP, or RETRY (failed, and run once more as Pulsar's build allows). A
 * failure's or skip's stack trace follows on lines {@code @@tk trace ...}.
 */
public final class ResultLines implements ITestListener {
    @Override
    public void onTestSuccess(ITestResult result) {
        report("PASS", result);
    }

    @Override
    public void onTestFailure(ITestResult result) {
        report("FAIL", result);
    }

    @Override
    public void onTestFailedButWithinSuccessPercentage(ITestResult result) {
        report("FAIL", result);
    }

    @Override
    public void onTestSkipped(ITestResult result) {
        report(result.wasRetried() ? "RETRY" : "SKIP", result);
    }

    private static void report(String status, ITestResult result) {
        Object[] parameters = result.getParameters();
        String store = parameters.length > 0 ? String.valueOf(parameters[0]) : "-";
        double seconds = (result.getEndMillis() - result.getStartMillis()) / 1000.0;
        Protocol.line("result", String.format("%s %s#%s %s %.3f", status,
                result.getTestClass().getName(), result.getMethod().getMethodName(), store,
                seconds));
        Throwable error = result.getThrowable();
        if (error != null && !status.equals("PASS")) {
            StringWriter trace = new StringWriter();
            error.printStackTrace(new PrintWriter(trace));
            trace.toString().lines().limit(40).forEach(line -> Protocol.line("trace", line));
        }
    }
}
