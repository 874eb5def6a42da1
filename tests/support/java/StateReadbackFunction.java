package tablekeeper.functions;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import org.apache.pulsar.functions.api.Context;
import org.apache.pulsar.functions.api.Function;

/**
 * A Pulsar function that reads its own state back, for tests/integration/test_pulsar_functions.py.
 *
 * <p>An input {@code get:KEY} answers {@code get:KEY=VALUE} with VALUE read by {@code getState}
 * ({@code <none>} if the key is absent). Any other input WORD is counted with
 * {@code incrCounter}, stored as the value of the key {@code last} with {@code putState}, and
 * answered with {@code WORD=COUNT last=LAST}, where COUNT is read back by {@code getCounter}
 * and LAST by {@code getState}.
 */
public class StateReadbackFunction implements Function<String, String> {
    @Override
    public String process(String input, Context context) throws Exception {
        if (input.startsWith("get:")) {
            String key = input.substring(4);
            return input + "=" + text(context.getState(key));
        }
        context.incrCounter(input, 1);
        long count = context.getCounter(input);
        context.putState("last", ByteBuffer.wrap(input.getBytes(StandardCharsets.UTF_8)));
        return input + "=" + count + " last=" + text(context.getState("last"));
    }

    private static String text(ByteBuffer value) {
        return value == null ? "<none>" : StandardCharsets.UTF_8.decode(value).toString();
    }
}
