"""Kafka plumbing of the stream benchmark: reading topics back with broker append times,
creating topics, producing the load, group descriptions.

Every topic the bench creates uses message.timestamp.type=LogAppendTime, so a record's
timestamp is the moment the broker appended it (one clock, the broker's).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from confluent_kafka import (
    OFFSET_BEGINNING,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)

from processor.devtools.deployment import Deployment
from processor.stream.kafka import kafka_io

if TYPE_CHECKING:
    from processor.devtools.kafka.cluster import LocalKafka

LOG_APPEND = {"message.timestamp.type": "LogAppendTime"}
#: The retention of a deployment's topics: every record kept (what the worker requires of
#: the ledger, and by default of the timeline and the private counts).
KEPT = {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"}

@dataclass(frozen=True, slots=True)
class Rec:
    """One record read back: its place, broker timestamp, key and value."""

    partition: int
    offset: int
    ts: int
    log_append: bool
    key: bytes | None
    value: bytes | None


class Tail:
    """Reads one topic from its beginning, incrementally, without a consumer group."""

    def __init__(self, conf: Mapping[str, str], topic: str) -> None:
        self.topic = topic
        self._c = Consumer({**conf, "group.id": f"dpc-bench-{uuid.uuid4().hex}",
                            "enable.auto.commit": "false", "auto.offset.reset": "earliest",
                            "enable.partition.eof": "false"})
        deadline = time.monotonic() + 30
        while True:  # a topic created a moment ago may not be in the metadata yet
            t = self._c.list_topics(topic, timeout=30).topics.get(topic)
            if (t is not None and t.error is None) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if t is None or t.error is not None:
            self._c.close()
            raise RuntimeError(f"topic {topic!r} not found")
        self.partitions = sorted(t.partitions)
        self._c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in self.partitions])
        self._next = dict.fromkeys(self.partitions, 0)
        self.count = 0
        self.not_log_append = 0

    def catch_up(self, timeout_s: float = 120.0) -> list[Rec]:
        """Everything appended before this call that was not returned yet."""
        return list(self.records(timeout_s))

    def drain(self, timeout_s: float = 120.0) -> None:
        """Read everything appended before this call, keeping none of it (`count` says
        how many were read: a million counters' ledger entries, counted as they come)."""
        for _ in self.records(timeout_s):
            pass

    def records(self, timeout_s: float = 120.0) -> Iterator[Rec]:
        """Everything appended before this call that was not returned yet, a fetch at a
        time: a reader that keeps only what it decodes holds no more than one fetch (a
        million counters' heartbeats over a long window are tens of millions of records,
        too many to hold as a list).

        Fails after `timeout_s` without a record read: a topic of millions of records
        (a million counters' heartbeats) takes longer than that to read, and is not stuck.
        """
        deadline = time.monotonic() + timeout_s
        his = {p: self._high(p, deadline) for p in self.partitions}
        while any(self._next[p] < his[p] for p in self.partitions):
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {self.topic!r} timed out")
            msgs = self._c.consume(num_messages=5000, timeout=0.2)
            if msgs:
                deadline = time.monotonic() + timeout_s
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    if err.fatal():
                        raise RuntimeError(f"reading {self.topic!r}: {err}")
                    continue  # end of partition, or transient: the deadline bounds it
                ts_type, ts = msg.timestamp()
                rec = Rec(int(msg.partition() or 0), int(msg.offset() or 0), int(ts),
                          ts_type == TIMESTAMP_LOG_APPEND_TIME, msg.key(), msg.value())
                self.not_log_append += not rec.log_append
                self._next[rec.partition] = rec.offset + 1
                self.count += 1
                yield rec
            # Compacted or transactional tails never reach the watermark by record offsets.
            for p in self.partitions:
                if self._next[p] < his[p]:
                    pos = self._c.position([TopicPartition(self.topic, p)])[0].offset
                    if pos is not None and pos > self._next[p]:
                        self._next[p] = int(pos)

    def _high(self, p: int, deadline: float) -> int:
        """The high watermark of partition p; retries while a new topic's leader settles."""
        while True:
            try:
                return int(self._c.get_watermark_offsets(TopicPartition(self.topic, p),
                                                         timeout=30)[1])
            except KafkaException as exc:
                err = exc.args[0]
                if time.monotonic() > deadline or not (
                        isinstance(err, KafkaError) and (err.retriable() or err.code() in (
                            KafkaError.NOT_LEADER_FOR_PARTITION,
                            KafkaError.LEADER_NOT_AVAILABLE,
                            KafkaError.UNKNOWN_TOPIC_OR_PART))):
                    raise
                time.sleep(0.2)  # back-off while the broker elects the partition's leader

    def close(self) -> None:
        self._c.close()


@contextlib.contextmanager
def broker(bootstrap: str | None) -> Iterator[str]:
    """`bootstrap` if given, else a local single-node broker for the run
    (processor.devtools.kafka), stopped at the end."""
    with local_kafka(bootstrap, 1) as (servers, _kafka):
        yield servers


@contextlib.contextmanager
def local_kafka(bootstrap: str | None, nodes: int) -> Iterator[tuple[str, LocalKafka | None]]:
    """`bootstrap` if given (no cluster of the run's own: None), else a local Kafka of
    `nodes` nodes (three: replication 3, min ISR 2) started for the run, stopped at the
    end."""
    if bootstrap:
        yield bootstrap, None
        return
    from processor.devtools.kafka.cluster import LocalKafka

    print(f"starting a local Kafka {'broker' if nodes == 1 else f'cluster of {nodes}'} ...",
          flush=True)
    kafka = LocalKafka(nodes, start_timeout=300.0)
    try:
        kafka.start()
        yield kafka.bootstrap_servers, kafka
    finally:
        kafka.stop()


def client_config(bootstrap: str) -> dict[str, str]:
    """The bench's librdkafka clients: errors only on stderr (not its retry chatter)."""
    return {**{"bootstrap.servers": bootstrap}, "log_level": "3"}


def create_topics(conf: Mapping[str, str], names: Sequence[str], partitions: int,
                  config: Mapping[str, str] | None = None) -> None:
    kafka_io.create_topics(conf, names, partitions, replication=kafka_io.replication_for(conf),
                           config={**LOG_APPEND, **(config or {})})


def create_deployment_topics(conf: Mapping[str, str], dep: Deployment) -> None:
    """The deployment's five topics, LogAppendTime, keeping every record (the worker
    refuses a ledger that would not, and warns about the others: app.check_retention)."""
    t = dep.topics
    create_topics(conf, [t.input, t.timeline, t.counts, t.ledger, t.deadletter],
                  dep.settings.partitions, KEPT)


def groups_with_prefix(conf: Mapping[str, str], prefix: str) -> list[str]:
    admin = kafka_io.make_admin(conf)
    res = admin.list_consumer_groups(request_timeout=30).result(timeout=30)
    return sorted(str(g.group_id) for g in res.valid if str(g.group_id).startswith(prefix))


def changelog_topics(conf: Mapping[str, str], app_id: str) -> list[str]:
    md = kafka_io.make_admin(conf).list_topics(timeout=30)
    return sorted(t for t in md.topics if t.startswith(app_id + "-") and t.endswith("-changelog"))


def event_value(counter: str, ts: int) -> bytes:
    """One input event as the processor (and every peer) reads it."""
    return orjson.dumps({"counter": counter, "ts": ts, "value": 1})


@dataclass
class Produced:
    count: int = 0
    first_ts: int | None = None
    last_ts: int = 0
    errors: int = 0
    not_log_append: int = 0

    def on_delivery(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self.errors += 1
            return
        ts_type, ts = msg.timestamp()
        self.not_log_append += ts_type != TIMESTAMP_LOG_APPEND_TIME
        self.count += 1
        self.first_ts = ts if self.first_ts is None else min(self.first_ts, ts)
        self.last_ts = max(self.last_ts, ts)


def produce_one(producer: Producer, topic: str, value: bytes, stats: Produced) -> None:
    while True:
        try:
            producer.produce(topic, value=value, on_delivery=stats.on_delivery)
            return
        except BufferError:
            producer.poll(0.01)


def produce_burst(conf: Mapping[str, str], topic: str, values: Sequence[bytes]) -> Produced:
    """Produce `values` as fast as one producer goes; wait for every acknowledgement."""
    stats = Produced()
    producer = kafka_io.make_producer(conf)
    for v in values:
        produce_one(producer, topic, v, stats)
        producer.poll(0)
    left = producer.flush(60)
    if left or stats.errors or stats.count != len(values):
        raise RuntimeError(f"producing to {topic}: {left} unsent, {stats.errors} errors")
    return stats


def wait_until(pred: Callable[[], bool], timeout_s: float, what: str,
               interval_s: float = 0.25) -> float:
    """Poll `pred` every `interval_s` until true; seconds waited. TimeoutError names
    `what`. The polling only decides when to look again: no figure is a poll time unless
    its definition says so."""
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"{what}: not after {timeout_s:.0f} s")
        time.sleep(interval_s)
    return time.monotonic() - t0


def topics_matching(conf: Mapping[str, str], *parts: str) -> list[str]:
    """The broker's topics whose name contains every one of `parts`."""
    md = kafka_io.make_admin(conf).list_topics(timeout=30)
    return sorted(t for t in md.topics if all(p in t for p in parts))


def records_in(conf: Mapping[str, str], topics: Sequence[str]) -> int:
    """Records appended to `topics` so far: the sum of their partitions' high watermarks
    (no reading: a count before and after a stage is its records)."""
    if not topics:
        return 0
    c = Consumer({**conf, "group.id": f"dpc-bench-{uuid.uuid4().hex}"})
    try:
        total = 0
        md = c.list_topics(timeout=30)
        for t in topics:
            for p in md.topics[t].partitions:
                total += int(c.get_watermark_offsets(TopicPartition(t, p), timeout=30)[1])
        return total
    finally:
        c.close()
