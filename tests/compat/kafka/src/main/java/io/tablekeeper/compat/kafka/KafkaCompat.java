package io.tablekeeper.compat.kafka;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.Callable;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import java.util.stream.Collectors;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.DescribeClusterResult;
import org.apache.kafka.clients.admin.NewPartitions;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * The Kafka Java client against a broker whose metadata lives in ZooKeeper: the cluster and its
 * controller, a topic created (and refused a second time), an idempotent producer (its producer
 * id block comes from ZooKeeper) sending acknowledged messages, a consumer group reading every
 * one back and committing its offsets, a topic config change, more partitions, and the topic
 * deleted.
 *
 * <p>Usage: {@code KafkaCompat BOOTSTRAP TOPIC MESSAGES}. One JSON object a line on stdout:
 * {"check": NAME, "value": TEXT} or {"check": NAME, "error": EXCEPTION_CLASS}.
 */
public final class KafkaCompat {
    static final long WAIT_S = 180; // a hang guard, not a performance bound

    public static void main(String[] args) throws Exception {
        if (args.length != 3) {
            System.err.println("usage: KafkaCompat BOOTSTRAP TOPIC MESSAGES");
            System.exit(2);
        }
        String bootstrap = args[0];
        String topic = args[1];
        int messages = Integer.parseInt(args[2]);
        Properties adminProps = new Properties();
        adminProps.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        adminProps.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, (int) TimeUnit.SECONDS.toMillis(WAIT_S));
        try (Admin admin = Admin.create(adminProps)) {
            check("cluster", () -> {
                DescribeClusterResult cluster = admin.describeCluster();
                return "nodes=" + cluster.nodes().get().size() + " controller=" + cluster.controller().get().id();
            });
            check("topic.create", () -> {
                admin.createTopics(List.of(new NewTopic(topic, 3, (short) 1))).all().get();
                waitFor(() -> leaders(admin, topic) == 3, "a leader for each partition");
                return "partitions=" + describe(admin, topic).partitions().size();
            });
            check("topic.create.again", () -> {
                admin.createTopics(List.of(new NewTopic(topic, 3, (short) 1))).all().get();
                return "created twice";
            });
            check("produce", () -> produce(bootstrap, topic, messages));
            check("consume", () -> consume(bootstrap, topic, messages));
            check("topic.config", () -> {
                ConfigResource resource = new ConfigResource(ConfigResource.Type.TOPIC, topic);
                AlterConfigOp op = new AlterConfigOp(new ConfigEntry("retention.ms", "3600000"), AlterConfigOp.OpType.SET);
                admin.incrementalAlterConfigs(Map.of(resource, List.of(op))).all().get();
                waitFor(() -> "3600000".equals(config(admin, resource, "retention.ms")), "the new retention.ms");
                return "retention.ms=" + config(admin, resource, "retention.ms");
            });
            check("topic.partitions", () -> {
                admin.createPartitions(Map.of(topic, NewPartitions.increaseTo(4))).all().get();
                waitFor(() -> leaders(admin, topic) == 4, "a leader for the new partition");
                return "partitions=" + describe(admin, topic).partitions().size();
            });
            check("topic.delete", () -> {
                admin.deleteTopics(List.of(topic)).all().get();
                waitFor(() -> !topics(admin).contains(topic), "the topic gone");
                return "listed=" + topics(admin).contains(topic);
            });
        }
        System.exit(0);
    }

    static String produce(String bootstrap, String topic, int messages) throws Exception {
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ProducerConfig.ACKS_CONFIG, "all");
        props.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, true);
        props.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, (int) TimeUnit.SECONDS.toMillis(WAIT_S));
        props.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, 60_000);
        props.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, TimeUnit.SECONDS.toMillis(WAIT_S));
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        List<java.util.concurrent.Future<RecordMetadata>> sent = new ArrayList<>();
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(props)) {
            for (int i = 0; i < messages; i++) {
                sent.add(producer.send(new ProducerRecord<>(topic, "k" + i, "m" + i)));
            }
            producer.flush();
        }
        Set<Integer> partitions = new HashSet<>();
        for (var future : sent) {
            partitions.add(future.get(WAIT_S, TimeUnit.SECONDS).partition());
        }
        return "acked=" + sent.size() + " partitions=" + partitions.size();
    }

    static String consume(String bootstrap, String topic, int messages) throws Exception {
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ConsumerConfig.GROUP_ID_CONFIG, "compat-group");
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, false);
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        Set<String> received = new HashSet<>();
        int duplicates = 0;
        Map<TopicPartition, OffsetAndMetadata> committed;
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(props)) {
            consumer.subscribe(List.of(topic));
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(WAIT_S);
            while (received.size() < messages) {
                if (System.nanoTime() > deadline) {
                    throw new IllegalStateException("received " + received.size() + " of " + messages);
                }
                for (ConsumerRecord<String, String> record : consumer.poll(Duration.ofMillis(500))) {
                    if (!record.value().equals("m" + record.key().substring(1))) {
                        throw new IllegalStateException("key and value disagree: " + record);
                    }
                    if (!received.add(record.value())) {
                        duplicates++;
                    }
                }
            }
            consumer.commitSync(Duration.ofSeconds(WAIT_S));
            committed = consumer.committed(consumer.assignment(), Duration.ofSeconds(WAIT_S));
        }
        long offsets = committed.values().stream().mapToLong(OffsetAndMetadata::offset).sum();
        return "received=" + received.size() + " duplicates=" + duplicates + " committed=" + offsets;
    }

    static TopicDescription describe(Admin admin, String topic) throws Exception {
        return admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic);
    }

    static int leaders(Admin admin, String topic) {
        try {
            return (int) describe(admin, topic).partitions().stream().filter(p -> p.leader() != null).count();
        } catch (Exception e) {
            return -1;
        }
    }

    static Set<String> topics(Admin admin) {
        try {
            return admin.listTopics().names().get();
        } catch (Exception e) {
            return Set.of("(unknown)");
        }
    }

    static String config(Admin admin, ConfigResource resource, String name) {
        try {
            ConfigEntry entry = admin.describeConfigs(List.of(resource)).all().get().get(resource).get(name);
            return entry == null ? null : entry.value();
        } catch (Exception e) {
            return null;
        }
    }

    static void waitFor(BooleanSupplier condition, String what) throws InterruptedException {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(WAIT_S);
        while (!condition.getAsBoolean()) {
            if (System.nanoTime() > deadline) {
                throw new IllegalStateException("never: " + what);
            }
            Thread.sleep(100);
        }
    }

    static void check(String name, Callable<Object> body) {
        try {
            emit(name, "value", String.valueOf(body.call()));
        } catch (ExecutionException e) {
            Throwable cause = e.getCause() == null ? e : e.getCause();
            emit(name, "error", cause.getClass().getSimpleName());
        } catch (Throwable e) {
            e.printStackTrace();
            emit(name, "error", e.getClass().getSimpleName() + ": " + e.getMessage());
        }
    }

    static synchronized void emit(String name, String field, String text) {
        System.out.println("{\"check\": \"" + name + "\", \"" + field + "\": \"" + text.replace("\\", "\\\\").replace("\"", "\\\"") + "\"}");
        System.out.flush();
    }
}
