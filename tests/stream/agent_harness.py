"""Drive a stage's agent without a consumer group: Faust's consumer bookkeeping as its
stream and `perform_seek` leave it (its consumer object, never started), a stream that
hands the agent a real timeline partition's records with chosen ones skipped, and a
one-partition deployment whose timeline holds markers (its group committed part-way).
Private Faust names are read here on purpose: the tests that use them pin that
bookkeeping's shape across faust-streaming upgrades."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import faust
from confluent_kafka import Consumer, TopicPartition
from faust.types import TP, Message

from processor.stream.kafka import kafka_io
from processor.stream.model.config import Settings, with_overrides
from processor.stream.model.records import encode_marker


def faust_consumer(app: faust.App, topic: str, committed: int) -> Any:
    """Faust's consumer as its stream sees `topic` partition 0 after `perform_seek` put
    the group's committed offset in its bookkeeping (private: what the tests pin)."""
    consumer: Any = app.consumer
    consumer.app.topics._acking_topics.add(topic)  # done when the agent subscribes
    consumer._committed_offset[TP(topic, 0)] = committed
    return consumer


def message(topic: str, offset: int, value: bytes | None = None,
            timestamp_ms: int = 0) -> Message:
    """A Faust message of `topic` partition 0, as its consumer hands it to a stream."""
    return Message(topic, 0, offset, timestamp_ms / 1000, 0, None, None, value, None,
                   tp=TP(topic, 0))


def next_commit(consumer: Any, topic: str) -> int | None:
    """The offset Faust's next commit of partition 0 would write (None: none)."""
    offset: int | None = consumer._new_offset(TP(topic, 0))
    return offset


@dataclass
class Event:
    message: Message


class SkippingStream:
    """Faust's stream as the operator agent sees it around a skip: it yields the events
    of `offsets` only (the others it skipped without an ack) and acks each event after
    the agent's iteration over it, as Faust's stream iterator does."""

    def __init__(self, consumer: Any, records: Sequence[kafka_io.KafkaRecord],
                 offsets: Sequence[int], acks: bool = True) -> None:
        self._consumer = consumer
        self._records = records
        self._offsets = offsets
        self._acks = acks
        # With the records' own log-append times: the operator checks markers by them.
        self._messages = [message(r.topic, r.offset, r.value, r.timestamp_ms)
                          for r in records if r.offset in offsets]

    def noack(self) -> SkippingStream:
        """The same stream without acks (the agent acknowledges at its checkpoints)."""
        return SkippingStream(self._consumer, self._records, self._offsets, acks=False)

    async def events(self) -> AsyncIterator[Event]:
        for m in self._messages:
            yield Event(m)
            if self._acks:
                self._consumer.ack(m)


def commit_group(conf: dict[str, str], group: str, topic: str, offset: int) -> None:
    c = Consumer({**conf, "group.id": group, "enable.auto.commit": "false",
                  "log_level": "0"})
    try:
        c.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
    finally:
        c.close()


def timeline_with_markers(kafka_bootstrap: str, tmp_path: Path) -> tuple[Settings, list[Any]]:
    """Settings of a one-partition deployment whose timeline holds 12 markers, the
    group committed at 2; and those records."""
    conf = {"bootstrap.servers": kafka_bootstrap}
    suffix = uuid.uuid4().hex[:10]
    base: Settings = with_overrides(Settings(), bootstrap_servers=kafka_bootstrap,
                                    app_id=f"gap-acks-{suffix}", partitions=1, tick_ms=100,
                                    counters={"x": 0}, state_dir=str(tmp_path),
                                    metrics_port=0)
    settings = replace(base, topics=replace(base.topics, timeline=f"gap-acks-tl-{suffix}"))
    topic = settings.topics.timeline
    kafka_io.create_topics(conf, [topic], 1)
    kafka_io.produce_all(conf, topic, [(None, encode_marker(n)) for n in range(1, 13)],
                         partition=0)
    commit_group(conf, settings.app_id, topic, 2)
    records = [r for recs in kafka_io.read_topic(conf, topic, timeout_s=30).values()
               for r in recs]
    assert [r.offset for r in records] == list(range(12))
    return settings, records
