/*
 * A subscriber to the private-count topic of dp-stream-counts, in Java (kafka-clients and
 * Jackson): it keeps the current private value of every counter, following the contract
 * of docs/downstream.md.
 *
 *   - Every record must carry "schema_version" >= 1 (this program knows version 1; later
 *     versions only add fields, which it ignores). A record without one is rejected.
 *   - Records are idempotent by (counter, tick) and may be re-sent after a crash: the
 *     current value of a counter is that of its record with the LARGEST tick, never simply
 *     the last one to arrive. y_t at a tick t is the value of the largest tick <= t.
 *   - Counters may appear while it runs (a map keyed by name): a key of an open family, a
 *     counter named "family[key]", is published from its admission tick on, its first
 *     record carrying its whole count; its y before that tick is not published (not 0).
 *
 * Run (after examples/java/fetch-deps.sh):
 *   java -cp 'examples/java/target/lib/*' examples/java/Subscriber.java \
 *       --bootstrap-servers localhost:9092 --topic dpc-private-counts [--until-end]
 * Without --until-end it follows the topic and prints one line per new value; with it, it
 * reads up to the end the topic had at the start and prints one JSON summary:
 *   {"records": N, "rejected": M, "counters": {"name": {"tick": t, "value": y,
 *    "error_bound": b, "beta": beta}, ...}}
 */

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.StringDeserializer;

public final class Subscriber {
    /** The schema version this program was written for (schemas/private-count.schema.json). */
    static final int KNOWN_VERSION = 1;
    static final ObjectMapper JSON = new ObjectMapper();

    record Current(long tick, double value, double errorBound, double beta) {}

    final Map<String, Current> current = new TreeMap<>();
    long records;
    long rejected;

    /** Applies one record; returns the counter's new state, or null if nothing changed. */
    Current apply(byte[] value, Iterable<Header> headers) {
        records++;
        for (Header h : headers) {
            // The schema header names the record's schema and version, e.g. private-count/1.
            if (h.key().equals("schema")
                    && !new String(h.value(), StandardCharsets.UTF_8).startsWith("private-count/")) {
                return reject("not a private-count record");
            }
        }
        JsonNode doc;
        try {
            doc = JSON.readTree(value);
        } catch (Exception e) {
            return reject("not JSON");
        }
        if (doc == null || !doc.isObject()) {
            return reject("not a JSON object");
        }
        JsonNode version = doc.get("schema_version");
        if (version == null || !version.isIntegralNumber() || version.asInt() < KNOWN_VERSION) {
            return reject("no schema_version >= " + KNOWN_VERSION);
        }
        JsonNode counter = doc.get("counter");
        JsonNode tick = doc.get("tick");
        JsonNode y = doc.get("value");
        if (counter == null || !counter.isTextual() || tick == null || !tick.isIntegralNumber()
                || y == null || !y.isNumber()) {
            return reject("missing counter, tick or value");
        }
        Current seen = current.get(counter.asText());
        if (seen != null && seen.tick() >= tick.asLong()) {
            return null; // a re-send or an older tick: the current value stands
        }
        Current now = new Current(tick.asLong(), y.asDouble(),
                doc.path("error_bound").asDouble(), doc.path("beta").asDouble());
        current.put(counter.asText(), now);
        return now;
    }

    Current reject(String why) {
        rejected++;
        System.err.println("rejected a record: " + why);
        return null;
    }

    String summary() {
        ObjectNode out = JSON.createObjectNode();
        out.put("records", records);
        out.put("rejected", rejected);
        ObjectNode counters = out.putObject("counters");
        current.forEach((name, c) -> {
            ObjectNode o = counters.putObject(name);
            o.put("tick", c.tick());
            o.put("value", c.value());
            o.put("error_bound", c.errorBound());
            o.put("beta", c.beta());
        });
        return out.toString();
    }

    public static void main(String[] args) {
        String bootstrap = "localhost:9092";
        String topic = "dpc-private-counts";
        boolean untilEnd = false;
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "--bootstrap-servers" -> bootstrap = args[++i];
                case "--topic" -> topic = args[++i];
                case "--until-end" -> untilEnd = true;
                default -> {
                    System.err.println("usage: Subscriber [--bootstrap-servers S] [--topic T] [--until-end]");
                    System.exit(2);
                }
            }
        }
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        Subscriber sub = new Subscriber();
        try (KafkaConsumer<String, byte[]> consumer = new KafkaConsumer<>(props)) {
            // Every partition from its beginning, without a consumer group: the whole topic
            // is the history of y (a group would resume where it stopped instead).
            List<TopicPartition> parts = new ArrayList<>();
            for (PartitionInfo p : consumer.partitionsFor(topic, Duration.ofSeconds(30))) {
                parts.add(new TopicPartition(topic, p.partition()));
            }
            consumer.assign(parts);
            consumer.seekToBeginning(parts);
            Map<TopicPartition, Long> end = consumer.endOffsets(parts, Duration.ofSeconds(30));
            while (true) {
                for (ConsumerRecord<String, byte[]> r : consumer.poll(Duration.ofMillis(500))) {
                    Current c = sub.apply(r.value(), r.headers());
                    if (c != null && !untilEnd) {
                        System.out.printf("%s tick %d: %s +- %s (beta %s)%n", r.key(), c.tick(),
                                c.value(), c.errorBound(), c.beta());
                    }
                }
                if (untilEnd && parts.stream().allMatch(tp -> consumer.position(tp) >= end.get(tp))) {
                    break;
                }
            }
        }
        System.out.println(sub.summary());
    }
}
