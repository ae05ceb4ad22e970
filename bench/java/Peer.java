/*
 * Apache RocketMQ's 4.x Java client driven from a test or a benchmark, one role a process.
 *
 *   java -cp LIB/*:CLASSES Peer produce NAMESRV TOPIC INTERVAL_S MODE
 *   java -cp LIB/*:CLASSES Peer consume NAMESRV TOPIC GROUP KIND EXPRESSION
 *
 * produce: DefaultMQProducer sends bodies "0", "1", ... one every INTERVAL_S at most, MODE
 * sync (send), async (send with a callback, one in flight), oneway (sendOneway: nothing
 * comes back, so each is printed "sent" with no msg_id once handed over), orderly (send with a selector:
 * message n goes to queue (n mod 4) mod queues, its key "k" = n mod 4), batch (four messages
 * a send) or transaction (a TransactionMQProducer: message n's local transaction commits when
 * n mod 3 is 0, rolls back when 1, and answers UNKNOW when 2, which its check-back then
 * commits); prints {"event": "sent" or "failed", "n", "start", "end", "msg_id", "queue_id",
 * "queue_offset", "state" or "error"} per message, and {"event": "checked", "n"} per
 * check-back answered.
 *   java -cp LIB/*:CLASSES Peer litepull NAMESRV TOPIC GROUP
 * litepull: DefaultLitePullConsumer subscribed to TOPIC, polling and committing its offsets
 * itself (auto-commit); prints "started", then "consumed" per message as consume does.
 * consume: DefaultMQPushConsumer, KIND concurrent or orderly, subscribed with EXPRESSION (a
 * tag expression, or "sql:" and a SQL92 one); prints {"event": "started"} once started, then
 * {"event": "consumed", "body", "t", "msg_id", "queue_id", "queue_offset", "reconsume_times",
 * "key"} per delivery. A body "fail-N" is answered RECONSUME_LATER for its first N deliveries.
 *
 * RMQ_MAX_RECONSUME_TIMES in the environment sets the consumer's maxReconsumeTimes;
 * RMQ_TRACE_TOPIC turns on the producer's and the consumer's message traces
 * (enableMsgTrace) to that topic.
 *
 * Both run until stdin closes. Times are System.nanoTime() in seconds, CLOCK_MONOTONIC on
 * Linux, the clock Python's time.monotonic() reads. With RMQ_ACCESS_KEY and RMQ_SECRET_KEY
 * in the environment every request is signed (AclClientRPCHook).
 */

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.rocketmq.acl.common.AclClientRPCHook;
import org.apache.rocketmq.acl.common.SessionCredentials;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.MessageSelector;
import org.apache.rocketmq.client.consumer.rebalance.AllocateMessageQueueAveragely;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.ConsumeOrderlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.consumer.listener.MessageListenerOrderly;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendCallback;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.LocalTransactionState;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.client.producer.TransactionListener;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.client.producer.TransactionSendResult;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.remoting.RPCHook;

public final class Peer {
    private static final int KEYS = 4;

    public static void main(String[] args) throws Exception {
        Events.claimStdout();
        AtomicBoolean stdinOpen = Events.untilStdinCloses();
        switch (args[0]) {
            case "produce" -> produce(args[1], args[2], Double.parseDouble(args[3]), args[4], stdinOpen);
            case "consume" -> consume(args[1], args[2], args[3], args[4], args[5], stdinOpen);
            case "litepull" -> litePull(args[1], args[2], args[3], stdinOpen);
            default -> {
                System.err.println("unknown role " + args[0] + ": produce or consume");
                System.exit(2);
            }
        }
        System.exit(0);
    }

    private static RPCHook aclHook() {
        String accessKey = System.getenv("RMQ_ACCESS_KEY");
        String secretKey = System.getenv("RMQ_SECRET_KEY");
        if (accessKey == null || secretKey == null) {
            return null;
        }
        return new AclClientRPCHook(new SessionCredentials(accessKey, secretKey));
    }

    /** RMQ_TRACE_TOPIC: the trace topic when tracing, else null (no traces). */
    private static String traceTopic() {
        return System.getenv("RMQ_TRACE_TOPIC");
    }

    private static void sent(long n, double start, SendResult result, int index) {
        String state = result instanceof TransactionSendResult t ? t.getLocalTransactionState().name() : "";
        boolean ok = result.getSendStatus() == SendStatus.SEND_OK;
        Events.emit("{\"event\": " + Events.quote(ok ? "sent" : "failed") + ", \"n\": " + n + ", \"start\": " + start
            + ", \"end\": " + Events.now() + ", \"msg_id\": " + Events.quote(result.getMsgId().split(",")[index])
            + ", \"queue_id\": " + result.getMessageQueue().getQueueId()
            + ", \"queue_offset\": " + (result.getQueueOffset() + index)
            + ", \"state\": " + Events.quote(state) + ", \"error\": " + Events.quote(result.getSendStatus().name()) + "}");
    }

    /** The error and its causes: the client wraps the broker's answer (code, remark) in its own. */
    private static void failed(long n, double start, Throwable error) {
        StringBuilder text = new StringBuilder(error.toString());
        for (Throwable cause = error.getCause(); cause != null; cause = cause.getCause()) {
            text.append("; caused by ").append(cause);
        }
        Events.emit("{\"event\": \"failed\", \"n\": " + n + ", \"start\": " + start + ", \"end\": " + Events.now()
            + ", \"error\": " + Events.quote(text.toString()) + "}");
    }

    private static Message message(String topic, long n) {
        Message message = new Message(topic, "TagA", Long.toString(n).getBytes(StandardCharsets.UTF_8));
        message.putUserProperty("k", Long.toString(n % KEYS));
        return message;
    }

    private static void produce(String namesrv, String topic, double intervalS, String mode,
                                AtomicBoolean running) throws Exception {
        DefaultMQProducer producer;
        if (mode.equals("transaction")) {
            TransactionMQProducer transactional = new TransactionMQProducer("JavaPeerProducer", aclHook());
            transactional.setTransactionListener(new TransactionListener() {
                public LocalTransactionState executeLocalTransaction(Message message, Object arg) {
                    long n = (Long) arg;
                    return n % 3 == 0 ? LocalTransactionState.COMMIT_MESSAGE
                        : n % 3 == 1 ? LocalTransactionState.ROLLBACK_MESSAGE : LocalTransactionState.UNKNOW;
                }

                // As an application's check reads its own records: a transaction rolled
                // back stays rolled back (its END_TRANSACTION, a oneway, may have died
                // with the master), the open ones are committed.
                public LocalTransactionState checkLocalTransaction(MessageExt message) {
                    String body = new String(message.getBody(), StandardCharsets.UTF_8);
                    Events.emit("{\"event\": \"checked\", \"n\": " + body + "}");
                    return Long.parseLong(body) % 3 == 1 ? LocalTransactionState.ROLLBACK_MESSAGE
                        : LocalTransactionState.COMMIT_MESSAGE;
                }
            });
            producer = transactional;
        } else {
            producer = new DefaultMQProducer("JavaPeerProducer", aclHook(), traceTopic() != null, traceTopic());
        }
        producer.setNamesrvAddr(namesrv);
        producer.setInstanceName("peer-" + ProcessHandle.current().pid());
        producer.start();
        try {
            long step = mode.equals("batch") ? 4 : 1;
            for (long n = 0; running.get(); n += step) {
                double start = Events.now();
                try {
                    switch (mode) {
                        case "sync" -> sent(n, start, producer.send(message(topic, n)), 0);
                        case "oneway" -> {
                            producer.sendOneway(message(topic, n));
                            Events.emit("{\"event\": \"sent\", \"n\": " + n + ", \"start\": " + start
                                + ", \"end\": " + Events.now() + "}");
                        }
                        case "transaction" -> sent(n, start, producer.sendMessageInTransaction(message(topic, n), n), 0);
                        case "orderly" -> sent(n, start, producer.send(message(topic, n),
                            (queues, msg, key) -> queues.get((int) ((Long) key % KEYS) % queues.size()), n), 0);
                        case "async" -> {
                            CompletableFuture<Void> done = new CompletableFuture<>();
                            long number = n;
                            producer.send(message(topic, n), new SendCallback() {
                                public void onSuccess(SendResult result) {
                                    sent(number, start, result, 0);
                                    done.complete(null);
                                }

                                public void onException(Throwable error) {
                                    failed(number, start, error);
                                    done.complete(null);
                                }
                            });
                            done.get();
                        }
                        case "batch" -> {
                            List<Message> batch = new ArrayList<>();
                            for (long k = n; k < n + step; k++) {
                                batch.add(message(topic, k));
                            }
                            SendResult result = producer.send(batch);
                            for (int k = 0; k < step; k++) {
                                sent(n + k, start, result, k);
                            }
                        }
                        default -> throw new IllegalArgumentException("unknown mode " + mode);
                    }
                } catch (IllegalArgumentException e) {
                    throw e;
                } catch (Exception e) {
                    for (long k = n; k < n + step; k++) {
                        failed(k, start, e);
                    }
                }
                long sleepMs = (long) ((start + intervalS - Events.now()) * 1000);
                if (sleepMs > 0) {
                    Thread.sleep(sleepMs);
                }
            }
        } finally {
            producer.shutdown();
        }
    }

    private static void consumed(MessageExt message) {
        String body = new String(message.getBody(), StandardCharsets.UTF_8);
        Events.emit("{\"event\": \"consumed\", \"body\": " + Events.quote(body) + ", \"t\": " + Events.now()
            + ", \"msg_id\": " + Events.quote(message.getMsgId()) + ", \"queue_id\": " + message.getQueueId()
            + ", \"queue_offset\": " + message.getQueueOffset()
            + ", \"reconsume_times\": " + message.getReconsumeTimes()
            + ", \"key\": " + Events.quote(message.getUserProperty("k")) + "}");
    }

    /** Whether a delivery of `message` is to be refused: a body "fail-N", its first N deliveries. */
    private static boolean refused(MessageExt message) {
        String body = new String(message.getBody(), StandardCharsets.UTF_8);
        return body.startsWith("fail-") && message.getReconsumeTimes() < Integer.parseInt(body.substring(5));
    }

    private static void litePull(String namesrv, String topic, String group, AtomicBoolean running)
        throws Exception {
        DefaultLitePullConsumer consumer = new DefaultLitePullConsumer(group, aclHook());
        consumer.setNamesrvAddr(namesrv);
        consumer.setInstanceName("peer-" + ProcessHandle.current().pid());
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.subscribe(topic, "*");
        consumer.start();
        Events.emit("{\"event\": \"started\"}");
        try {
            while (running.get()) {
                for (MessageExt message : consumer.poll(100)) {
                    consumed(message);
                }
            }
        } finally {
            consumer.shutdown();
        }
    }

    private static void consume(String namesrv, String topic, String group, String kind, String expression,
                                AtomicBoolean running) throws Exception {
        DefaultMQPushConsumer consumer = new DefaultMQPushConsumer(
            group, aclHook(), new AllocateMessageQueueAveragely(), traceTopic() != null, traceTopic());
        consumer.setNamesrvAddr(namesrv);
        consumer.setInstanceName("peer-" + ProcessHandle.current().pid());
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        String maxReconsumeTimes = System.getenv("RMQ_MAX_RECONSUME_TIMES");
        if (maxReconsumeTimes != null) {
            consumer.setMaxReconsumeTimes(Integer.parseInt(maxReconsumeTimes));
        }
        if (expression.startsWith("sql:")) {
            consumer.subscribe(topic, MessageSelector.bySql(expression.substring(4)));
        } else {
            consumer.subscribe(topic, expression);
        }
        if (kind.equals("orderly")) {
            consumer.registerMessageListener((MessageListenerOrderly) (messages, context) -> {
                for (MessageExt message : messages) {
                    consumed(message);
                }
                return ConsumeOrderlyStatus.SUCCESS;
            });
        } else {
            consumer.registerMessageListener((MessageListenerConcurrently) (messages, context) -> {
                for (MessageExt message : messages) {
                    consumed(message);
                    if (refused(message)) {
                        return ConsumeConcurrentlyStatus.RECONSUME_LATER;
                    }
                }
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
            });
        }
        consumer.start();
        Events.emit("{\"event\": \"started\"}");
        try {
            while (running.get()) {
                Thread.sleep(50);
            }
        } finally {
            consumer.shutdown();
        }
    }
}
