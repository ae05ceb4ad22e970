/*
 * Apache RocketMQ's 5.x Java client (rocketmq-client-java, gRPC) driven from a test through a
 * RocketMQ 5 proxy (raftmq's mqproxy), one role a process:
 *
 *   java -cp LIB/*:CLASSES Client5Peer produce ENDPOINTS TOPIC INTERVAL_S KIND
 *   java -cp LIB/*:CLASSES Client5Peer simple ENDPOINTS TOPIC GROUP
 *   java -cp LIB/*:CLASSES Client5Peer push ENDPOINTS TOPIC GROUP
 *
 * produce: a Producer sends bodies "0", "1", ... one every INTERVAL_S at most, KIND normal,
 * fifo (message group "g" + n mod 4) or delay (delivered 2 s after it is sent); prints
 * {"event": "sent" or "failed", "n", "start", "end", "msg_id" or "error"} per message.
 * simple: a SimpleConsumer receives (up to 16 a call, 30 s invisible) and acknowledges;
 * push: a PushConsumer whose listener answers SUCCESS. Both print {"event": "started"} once
 * started, then {"event": "consumed", "body", "t", "msg_id", "delivery_attempt", "group"} per
 * delivery, before its acknowledgement. Each runs until stdin closes. Times are
 * System.nanoTime() in seconds (CLOCK_MONOTONIC, as Python's time.monotonic()). TLS is off
 * (the client's default is on).
 */

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Collections;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.consumer.ConsumeResult;
import org.apache.rocketmq.client.apis.consumer.FilterExpression;
import org.apache.rocketmq.client.apis.consumer.FilterExpressionType;
import org.apache.rocketmq.client.apis.consumer.PushConsumer;
import org.apache.rocketmq.client.apis.consumer.SimpleConsumer;
import org.apache.rocketmq.client.apis.message.MessageBuilder;
import org.apache.rocketmq.client.apis.message.MessageView;
import org.apache.rocketmq.client.apis.producer.Producer;
import org.apache.rocketmq.client.apis.producer.SendReceipt;

public final class Client5Peer {

    public static void main(String[] args) throws Exception {
        Events.claimStdout();
        AtomicBoolean running = Events.untilStdinCloses();
        ClientServiceProvider provider = ClientServiceProvider.loadService();
        ClientConfiguration configuration = ClientConfiguration.newBuilder()
            .setEndpoints(args[1]).enableSsl(false).setRequestTimeout(Duration.ofSeconds(3)).build();
        switch (args[0]) {
            case "produce" -> produce(provider, configuration, args[2], Double.parseDouble(args[3]), args[4], running);
            case "simple" -> simple(provider, configuration, args[2], args[3], running);
            case "push" -> push(provider, configuration, args[2], args[3], running);
            default -> {
                System.err.println("unknown role " + args[0] + ": produce, simple or push");
                System.exit(2);
            }
        }
        System.exit(0);
    }

    private static void produce(ClientServiceProvider provider, ClientConfiguration configuration, String topic,
                                double intervalS, String kind, AtomicBoolean running) throws Exception {
        try (Producer producer = provider.newProducerBuilder().setClientConfiguration(configuration)
            .setTopics(topic).build()) {
            for (long n = 0; running.get(); n++) {
                double start = Events.now();
                MessageBuilder builder = provider.newMessageBuilder().setTopic(topic).setTag("TagA")
                    .setBody(Long.toString(n).getBytes(StandardCharsets.UTF_8));
                switch (kind) {
                    case "fifo" -> builder.setMessageGroup("g" + (n % 4));
                    case "delay" -> builder.setDeliveryTimestamp(System.currentTimeMillis() + 2000);
                    case "normal" -> { }
                    default -> throw new IllegalArgumentException("unknown kind " + kind);
                }
                try {
                    SendReceipt receipt = producer.send(builder.build());
                    Events.emit("{\"event\": \"sent\", \"n\": " + n + ", \"start\": " + start + ", \"end\": " + Events.now()
                        + ", \"msg_id\": " + Events.quote(receipt.getMessageId().toString()) + "}");
                } catch (Exception e) {
                    Events.emit("{\"event\": \"failed\", \"n\": " + n + ", \"start\": " + start + ", \"end\": " + Events.now()
                        + ", \"error\": " + Events.quote(e.toString()) + "}");
                }
                long sleepMs = (long) ((start + intervalS - Events.now()) * 1000);
                if (sleepMs > 0) {
                    Thread.sleep(sleepMs);
                }
            }
        }
    }

    private static void consumed(MessageView message) {
        ByteBuffer body = message.getBody();
        byte[] bytes = new byte[body.remaining()];
        body.get(bytes);
        Events.emit("{\"event\": \"consumed\", \"body\": " + Events.quote(new String(bytes, StandardCharsets.UTF_8))
            + ", \"t\": " + Events.now() + ", \"msg_id\": " + Events.quote(message.getMessageId().toString())
            + ", \"delivery_attempt\": " + message.getDeliveryAttempt()
            + ", \"group\": " + Events.quote(message.getMessageGroup().orElse("")) + "}");
    }

    private static void simple(ClientServiceProvider provider, ClientConfiguration configuration, String topic,
                               String group, AtomicBoolean running) throws Exception {
        FilterExpression all = new FilterExpression("*", FilterExpressionType.TAG);
        try (SimpleConsumer consumer = provider.newSimpleConsumerBuilder().setClientConfiguration(configuration)
            .setConsumerGroup(group).setAwaitDuration(Duration.ofSeconds(5))
            .setSubscriptionExpressions(Collections.singletonMap(topic, all)).build()) {
            Events.emit("{\"event\": \"started\"}");
            while (running.get()) {
                try {
                    for (MessageView message : consumer.receive(16, Duration.ofSeconds(30))) {
                        consumed(message);
                        consumer.ack(message);
                    }
                } catch (Exception e) {
                    Events.emit("{\"event\": \"receive_failed\", \"t\": " + Events.now() + ", \"error\": " + Events.quote(e.toString()) + "}");
                    Thread.sleep(100);
                }
            }
        }
    }

    private static void push(ClientServiceProvider provider, ClientConfiguration configuration, String topic,
                             String group, AtomicBoolean running) throws Exception {
        FilterExpression all = new FilterExpression("*", FilterExpressionType.TAG);
        // Not closed at the end: close() waits out the receives in flight (long polls of up
        // to 30 s); the process exits instead, as a consumer killed would.
        PushConsumer consumer = provider.newPushConsumerBuilder().setClientConfiguration(configuration)
            .setConsumerGroup(group).setSubscriptionExpressions(Collections.singletonMap(topic, all))
            .setMessageListener(message -> {
                consumed(message);
                return ConsumeResult.SUCCESS;
            }).build();
        Events.emit("{\"event\": \"started\"}");
        while (running.get()) {
            Thread.sleep(50);
        }
    }
}
