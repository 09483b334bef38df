// An independent reader for the tests: Kafka's own Java client reads back what
// mssql-ces wrote, so that nothing is checked by librdkafka against itself.
//
// Usage: java -cp 'LIB/*:CLASSES' Reader BOOTSTRAP TOPIC ISOLATION TIMEOUT_MS [PROPS_FILE]
//
// Reads every partition of TOPIC from the beginning up to its end as this
// isolation level sees it when the reader starts (the last stable offset under
// read_committed, the high watermark under read_uncommitted), then prints one JSON
// line a record: topic, partition, offset, key, value (base64, or null) and headers
// (name and base64 value). Exits 0 once every partition is read to that end, 1 on
// an error, and 2 if TIMEOUT_MS passes first (naming the partitions not reached).
// PROPS_FILE holds extra client properties (security settings), one a line.

import java.io.FileInputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public class Reader {
    public static void main(String[] args) throws Exception {
        if (args.length < 4) {
            System.err.println("usage: Reader BOOTSTRAP TOPIC ISOLATION TIMEOUT_MS [PROPS_FILE]");
            System.exit(1);
        }
        Properties props = new Properties();
        if (args.length > 4) {
            try (FileInputStream in = new FileInputStream(args[4])) {
                props.load(in);
            }
        }
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, args[2]);
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        String topic = args[1];
        long deadline = System.currentTimeMillis() + Long.parseLong(args[3]);
        PrintStream out = new PrintStream(System.out, false, StandardCharsets.UTF_8);
        Base64.Encoder b64 = Base64.getEncoder();
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props)) {
            List<TopicPartition> partitions = new ArrayList<>();
            for (PartitionInfo p : consumer.partitionsFor(topic, Duration.ofMillis(Math.max(1, deadline - System.currentTimeMillis())))) {
                partitions.add(new TopicPartition(topic, p.partition()));
            }
            consumer.assign(partitions);
            consumer.seekToBeginning(partitions);
            Map<TopicPartition, Long> end = new HashMap<>(consumer.endOffsets(partitions));
            while (true) {
                end.entrySet().removeIf(e -> consumer.position(e.getKey()) >= e.getValue());
                if (end.isEmpty()) {
                    break;
                }
                if (System.currentTimeMillis() > deadline) {
                    out.flush();
                    System.err.println("timed out before reaching the end of " + end);
                    System.exit(2);
                }
                for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(200))) {
                    StringBuilder line = new StringBuilder();
                    line.append("{\"topic\":").append(quote(r.topic()))
                        .append(",\"partition\":").append(r.partition())
                        .append(",\"offset\":").append(r.offset())
                        .append(",\"key\":").append(r.key() == null ? "null" : quote(b64.encodeToString(r.key())))
                        .append(",\"value\":").append(r.value() == null ? "null" : quote(b64.encodeToString(r.value())))
                        .append(",\"headers\":[");
                    boolean first = true;
                    for (Header h : r.headers()) {
                        if (!first) {
                            line.append(',');
                        }
                        first = false;
                        line.append('[').append(quote(h.key())).append(',')
                            .append(h.value() == null ? "null" : quote(b64.encodeToString(h.value()))).append(']');
                    }
                    line.append("]}");
                    out.println(line);
                }
            }
        }
        out.flush();
    }

    private static String quote(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            if (c == '"' || c == '\\') {
                b.append('\\').append(c);
            } else if (c < 0x20) {
                b.append(String.format("\\u%04x", (int) c));
            } else {
                b.append(c);
            }
        }
        return b.append('"').toString();
    }
}
