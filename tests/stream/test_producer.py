"""AsyncProducer.produce_many (processor/stream/kafka/producer.py) on a stand-in for the
librdkafka client: records in order, a full local queue waited out, and the records in
flight counted exactly (what `flush` waits for), also when a produce fails midway; and
KafkaSink, the one sink of every stage, on a stand-in for the producer."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterable
from typing import Any

import pytest
from confluent_kafka import KafkaError

from processor.stream.kafka.kafka_io import produce_waiting
from processor.stream.kafka.producer import AsyncProducer, DeliveryError, KafkaSink
from processor.stream.kafka.topics import topic_name
from processor.stream.model.config import Settings
from processor.stream.model.outputs import Output
from processor.stream.model.records import LedgerEntry, Release


class FakeClient:
    """Takes produce calls as librdkafka's Producer (positional: topic, value, key,
    partition, on_delivery); raises BufferError at the calls in `full` once each, and
    `fail_at`'s exception at that call."""

    def __init__(self, full: Iterable[int] = (), fail_at: int | None = None) -> None:
        self.sent: list[tuple[Any, ...]] = []
        self.calls = 0
        self.polls = 0
        self.full = set(full)
        self.fail_at = fail_at

    def produce(self, topic: str, value: bytes | None, key: bytes | None, partition: int,
                on_delivery: Any) -> None:
        n = self.calls
        self.calls += 1
        if n in self.full:
            self.full.discard(n)
            raise BufferError("queue full")
        if n == self.fail_at:
            raise RuntimeError("broken")
        self.sent.append((topic, value, key, partition, on_delivery))

    def poll(self, timeout: float) -> int:
        self.polls += 1
        return 0


def _producer(client: FakeClient) -> AsyncProducer:
    p = AsyncProducer({})
    p._client = client  # type: ignore[assignment]
    return p


class Delivered:
    def __init__(self, topic: str, partition: int, offset: int) -> None:
        self._t, self._p, self._o = topic, partition, offset

    def topic(self) -> str:
        return self._t

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o


def test_records_in_order_a_full_queue_waited_out_and_flush_waits_for_all() -> None:
    client = FakeClient(full={1})
    p = _producer(client)
    records = [(b"k%d" % i, b"v%d" % i) for i in range(5)]
    p.produce_many("t", records, 3)
    assert [(s[2], s[1], s[3]) for s in client.sent] == [(k, v, 3) for k, v in records]
    assert client.polls == 1

    async def flush_after_acks() -> None:
        waiting = asyncio.ensure_future(p.flush())
        await asyncio.sleep(0)
        assert not waiting.done()  # five in flight
        for i, s in enumerate(client.sent):
            s[4](None, Delivered("t", 3, i))
            await asyncio.sleep(0)
        await asyncio.wait_for(waiting, 1.0)

    asyncio.run(flush_after_acks())
    p.produce_many("t", [])  # nothing: nothing in flight
    asyncio.run(asyncio.wait_for(p.flush(), 1.0))


def test_a_failed_produce_leaves_only_the_sent_records_in_flight() -> None:
    client = FakeClient(fail_at=2)
    p = _producer(client)
    with pytest.raises(RuntimeError):
        p.produce_many("t", [(None, b"a"), (None, b"b"), (None, b"c"), (None, b"d")])
    assert len(client.sent) == 2

    async def flush_after_acks() -> None:
        for i, s in enumerate(client.sent):
            s[4](None, Delivered("t", 0, i))
        await asyncio.wait_for(p.flush(), 1.0)  # returns: the two sent are acknowledged

    asyncio.run(flush_after_acks())


class _FullQueue:
    """A confluent-kafka Producer stand-in whose local queue is full for its first
    `full` produce calls; it records the calls and the polls."""

    def __init__(self, full: int) -> None:
        self.full = full
        self.produced: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.polls: list[float] = []

    def produce(self, topic: str, *args: Any, **kwargs: Any) -> None:
        if self.full > 0:
            self.full -= 1
            raise BufferError("Local: Queue full")
        self.produced.append((topic, args, kwargs))

    def poll(self, timeout: float) -> int:
        self.polls.append(timeout)
        return 0


def test_produce_waiting_polls_while_the_queue_is_full_then_sends_once() -> None:
    """kafka_io.produce_waiting, which every single-record producer path sends through:
    a full local queue is drained by polling (50 ms each) and the record is then sent
    exactly once, with its arguments unchanged. Control: another error is not swallowed."""
    client = _FullQueue(full=2)
    produce_waiting(client, "t", b"v", key=b"k", partition=3)  # type: ignore[arg-type]
    assert client.polls == [0.05, 0.05]
    assert client.produced == [("t", (b"v",), {"key": b"k", "partition": 3})]

    class Broken(_FullQueue):
        def produce(self, topic: str, *args: Any, **kwargs: Any) -> None:
            raise KeyError("not a full queue")

    with pytest.raises(KeyError):
        produce_waiting(Broken(full=0), "t", b"v")  # type: ignore[arg-type]


class RecordingProducer:
    """Takes AsyncProducer's produce and produce_many calls, in one list."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def produce(self, topic: str, value: bytes | None, *, key: bytes | None = None,
                partition: int | None = None, timestamp_ms: int | None = None,
                headers: Any = None) -> None:
        self.calls.append((topic, value, key, partition))

    def produce_many(self, topic: str, records: list[tuple[bytes | None, bytes | None]],
                     partition: int = -1) -> None:
        self.calls.extend((topic, v, k, None) for k, v in records)

    def produce_stamped(self, topic: str, records: Iterable[Any]) -> None:
        self.calls.extend((topic, v, k, None, ts, h) for k, v, ts, h in records)


def test_kafka_sink_sends_each_kind_to_its_topic_in_order_and_counts_the_stages_own(
        ) -> None:
    """The one sink of both stages: ledger entries before releases (keyed by counter),
    timeline forwards to their partition, dead letters; per send, only the metrics the
    stage named (the operator's here: nothing counted for the other kinds)."""
    s = Settings()
    names = {kind: topic_name(s, kind) for kind in ("ledger", "counts", "timeline",
                                                    "deadletter")}
    entry = LedgerEntry("a", "ecc", 1.0, 1e-6, 100, 0)
    release = Release("a", 1, 0, 100, 0.5, "change", "ecc", 1.0, 1e-6, 3.0, 0.05, "fp")
    out = Output(ledger=[entry], releases=[release], timeline=[(3, b"t")],
                 deadletters=[b"d"])
    producer = RecordingProducer()
    counts: collections.Counter[str] = collections.Counter()

    def add(name: str, n: int) -> None:
        counts[name] += n

    sink = KafkaSink(producer, s, add, (("releases", "releases_sent"),))  # type: ignore[arg-type]
    sink.send(out)
    want = [(names["ledger"], entry.to_json(), b"a", None, entry.timestamp_ms(),
             entry.headers()),
            (names["counts"], release.to_json(), b"a", None, release.timestamp_ms(),
             release.headers()),
            (names["timeline"], b"t", None, 3), (names["deadletter"], b"d", None, None)]
    assert producer.calls == want
    assert counts == {"releases_sent": 1}


class StampedClient:
    """Takes produce_stamped's calls as the public librdkafka client (topic, value, key,
    then timestamp and headers by name; no callback per record); BufferError at the
    calls in `full` once each, `fail_at`'s exception at that call. Its length is the
    records whose reports were not served yet, as librdkafka's queue length."""

    def __init__(self, full: Iterable[int] = (), fail_at: int | None = None) -> None:
        self.sent: list[tuple[Any, ...]] = []
        self.calls = 0
        self.polls = 0
        self.unserved = 0
        self.full = set(full)
        self.fail_at = fail_at

    def produce(self, topic: str, value: bytes, key: bytes, *, timestamp: int,
                headers: Any) -> None:
        n = self.calls
        self.calls += 1
        if n in self.full:
            self.full.discard(n)
            raise BufferError("queue full")
        if n == self.fail_at:
            raise RuntimeError("broken")
        self.sent.append((topic, value, key, timestamp, headers))
        self.unserved += 1

    def poll(self, timeout: float) -> int:
        self.polls += 1
        return 0

    def __len__(self) -> int:
        return self.unserved


def _public(client: StampedClient) -> AsyncProducer:
    p = AsyncProducer({})
    p._public_client = client  # type: ignore[assignment]
    return p


def test_stamped_records_in_order_a_full_queue_waited_out_flush_waits_for_all() -> None:
    """produce_stamped: every record once, in order, with its timestamp and headers,
    through the public client; a full queue polled until it drains. flush returns only
    once the client's queue is empty, woken by the check after the poll that served the
    last report (`_public_drained`), and at once when nothing is queued. A failure
    midway leaves exactly the records sent queued."""
    n = 50
    records = [(b"k%d" % i, b"v%d" % i, 1000 + i, [("h", b"x")]) for i in range(n)]
    client = StampedClient(full=[3, 42])
    p = _public(client)
    p.produce_stamped("t", iter(records))
    assert client.sent == [("t", v, k, ts, h) for k, v, ts, h in records]
    assert client.polls == 2

    async def flush_after_reports(step: int) -> None:
        waiting = asyncio.ensure_future(p.flush())
        while client.unserved:
            await asyncio.sleep(0)
            assert not waiting.done()
            client.unserved = max(0, client.unserved - step)  # a poll served `step`
            p._public_drained()
        await asyncio.wait_for(waiting, 1.0)

    asyncio.run(flush_after_reports(7))
    asyncio.run(asyncio.wait_for(p.flush(), 1.0))  # nothing queued: returns at once
    broken = StampedClient(fail_at=20)
    p = _public(broken)
    with pytest.raises(RuntimeError):
        p.produce_stamped("t", records)
    assert len(broken) == len(broken.sent) == 20
    client = broken
    asyncio.run(flush_after_reports(20))


def test_a_failed_public_record_fails_the_flush_that_waits_for_it() -> None:
    """The public client reports failures only (`_public_failed`): the flush waiting for
    the failed record raises DeliveryError once, the next flush is clean. Control: a
    success reported there (never, with `delivery.report.only.error`) fails nothing."""
    client = StampedClient()
    p = _public(client)
    p.produce_stamped("t", [(b"k", b"v", 1, [])])

    async def flush_after(err: Any) -> None:
        waiting = asyncio.ensure_future(p.flush())
        await asyncio.sleep(0)
        p._public_failed(err, None)  # type: ignore[arg-type]
        client.unserved = 0
        p._public_drained()
        await asyncio.wait_for(waiting, 1.0)

    asyncio.run(flush_after(None))
    p.produce_stamped("t", [(b"k", b"v", 1, [])])
    with pytest.raises(DeliveryError):
        asyncio.run(flush_after(KafkaError(KafkaError._MSG_TIMED_OUT)))
    asyncio.run(asyncio.wait_for(p.flush(), 1.0))


@pytest.mark.timeout(60)
def test_records_no_broker_acknowledged_fail_the_flush_on_both_clients() -> None:
    """Real librdkafka clients with no broker to reach (a closed port) and a message
    timeout of 0.3 s: a release (the public client, reporting failures only) and a
    changelog record (the tracked client) each make their flush raise DeliveryError
    instead of returning as if acknowledged."""
    conf = {"bootstrap.servers": "127.0.0.1:9", "log_level": "0"}
    for send in ("stamped", "tracked"):
        p = AsyncProducer(conf, message_timeout_ms=300)
        try:
            if send == "stamped":
                p.produce_stamped("t", [(b"k", b"v", 1, [("h", b"x")])])
            else:
                p.produce("t", b"v", key=b"k", partition=0)
            with pytest.raises(DeliveryError):
                asyncio.run(asyncio.wait_for(p.flush(), 30.0))
        finally:
            p.close(timeout_s=0.0)
