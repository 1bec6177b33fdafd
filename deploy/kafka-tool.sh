#!/usr/bin/env bash
# Kafka's own command-line tools, run from the jars deploy/setup.sh fetched (the broker's in
# deploy/.cache/kafka-libs plus org.apache.kafka:kafka-tools in deploy/.cache/kafka-tools):
# no Kafka distribution to download, the same version as the local broker (3.9).
#   bash deploy/kafka-tool.sh kafka-topics --bootstrap-server 127.0.0.1:9092 --list
#   bash deploy/kafka-tool.sh kafka-configs --bootstrap-server B --describe --entity-type topics --entity-name T
#   bash deploy/kafka-tool.sh kafka-consumer-groups --bootstrap-server B --describe --group G
# Tools: kafka-topics, kafka-configs, kafka-consumer-groups, kafka-console-consumer,
# kafka-console-producer, kafka-get-offsets, kafka-log-dirs (each takes --help).
# Needs java on PATH. $LOCAL_KAFKA_LIBS moves the broker jars as for deploy/kafka.py.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
libs="${LOCAL_KAFKA_LIBS:-$root/deploy/.cache/kafka-libs}"
tools="$root/deploy/.cache/kafka-tools"
name="${1:-}"
case "$name" in
    kafka-topics) class=org.apache.kafka.tools.TopicCommand ;;
    kafka-configs) class=kafka.admin.ConfigCommand ;;
    kafka-consumer-groups) class=org.apache.kafka.tools.consumer.group.ConsumerGroupCommand ;;
    kafka-console-consumer) class=org.apache.kafka.tools.consumer.ConsoleConsumer ;;
    kafka-console-producer) class=kafka.tools.ConsoleProducer ;;
    kafka-get-offsets) class=org.apache.kafka.tools.GetOffsetShell ;;
    kafka-log-dirs) class=org.apache.kafka.tools.LogDirsCommand ;;
    *)
        echo "usage: bash deploy/kafka-tool.sh TOOL [options]; TOOL is one of kafka-topics," \
             "kafka-configs, kafka-consumer-groups, kafka-console-consumer," \
             "kafka-console-producer, kafka-get-offsets, kafka-log-dirs" >&2
        exit 2 ;;
esac
shift
if ! ls "$libs"/kafka_2.13-*.jar >/dev/null 2>&1 || ! ls "$tools"/kafka-tools-*.jar >/dev/null 2>&1; then
    echo "kafka-tool: the Kafka jars are not fetched; run: bash deploy/setup.sh" >&2
    exit 3
fi
if ! command -v java >/dev/null 2>&1; then
    echo "kafka-tool: java was not found on PATH; install Java 17" >&2
    exit 3
fi
exec java -Xmx256m -Dlog4j.configuration="file:$root/deploy/kafka/tools-log4j.properties" \
    -cp "$libs/*:$tools/*" "$class" "$@"
