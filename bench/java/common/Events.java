/*
 * What the Java drivers (Peer.java, client5/Client5Peer.java) share: their JSON event lines
 * on stdout, kept for them alone (the clients' libraries print to stderr instead), the
 * clock they stamp them with, and stopping when the test closes their stdin.
 */

import java.io.IOException;
import java.io.PrintStream;
import java.util.concurrent.atomic.AtomicBoolean;

final class Events {
    private static final PrintStream OUT = System.out;

    private Events() {
    }

    /** From now on stdout is the events': anything else printed goes to stderr. */
    static void claimStdout() {
        System.setOut(System.err);
    }

    /** True until the test closes our stdin, its cue to stop. */
    static AtomicBoolean untilStdinCloses() {
        AtomicBoolean open = new AtomicBoolean(true);
        Thread watcher = new Thread(() -> {
            try {
                while (System.in.read() >= 0) {
                }
            } catch (IOException ignored) {
            }
            open.set(false);
        });
        watcher.setDaemon(true);
        watcher.start();
        return open;
    }

    /** System.nanoTime() in seconds: CLOCK_MONOTONIC on Linux, Python's time.monotonic(). */
    static double now() {
        return System.nanoTime() / 1e9;
    }

    static synchronized void emit(String json) {
        OUT.println(json);
        OUT.flush();
    }

    /** `text` as a JSON string. */
    static String quote(String text) {
        StringBuilder out = new StringBuilder("\"");
        for (char c : String.valueOf(text).toCharArray()) {
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
