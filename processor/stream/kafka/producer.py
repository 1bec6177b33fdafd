"""The worker's librdkafka producer for everything its stages write: releases, ledger
entries, the bounding stage's forwards and dead letters (`KafkaSink`, the one sink of
every stage), and the state tables' changelog records.

Faust's producer is pure Python on the event loop, one send and one future per record;
the operator's records through it cost more CPU than everything else per counted event.
Here a `produce` call hands a record to librdkafka (C, batched, idempotent: acks=all,
ordered per partition, retried without duplicates), a thread serves the delivery
reports, and `flush()` lets a coroutine wait for all acknowledgements without blocking
the event loop (Faust's heartbeats and the consumer keep running meanwhile).

Delivery reports also tell at which offsets this process's records landed
(`on_delivered`): restore.ChangelogTracker uses them to know whether anything else wrote
to a changelog partition between them.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import islice
from typing import Any, Final

from confluent_kafka import KafkaError, Message, Producer

from processor.errors import StreamError
from processor.stream.kafka import kafka_io
from processor.stream.kafka.kafka_io import produce_waiting
from processor.stream.kafka.topics import topic_name
from processor.stream.model.config import Settings
from processor.stream.model.outputs import Output, RecordKind

log = logging.getLogger("processor.stream.producer")

#: How long librdkafka keeps retrying one record before it reports it failed. A worker
#: cut off from the brokers for longer than this fails its checkpoint and exits; its
#: restart rebuilds from the changelog (docs/state.md).
MESSAGE_TIMEOUT_MS: Final = 60_000
#: The poll thread's longest wait per round: poll returns at the first delivery report,
#: so this only bounds how often an idle worker's thread wakes (20 times a second at
#: 0.05 s cost an idle worker about 0.002 CPU-s per second) and how soon `close` is seen.
POLL_S: Final = 0.5


class DeliveryError(StreamError, RuntimeError):
    """A record the brokers did not acknowledge: nothing after it is durable."""

    error_prefix = "Kafka: "


Headers = Sequence[tuple[str, bytes]]
#: (key, value, timestamp_ms, headers) of one record (`produce_stamped`).
StampedRecord = tuple[bytes, bytes, int, Headers]
#: Records `produce_stamped` hands to librdkafka per count of those in flight: bounds
#: what a call holds encoded at once (a ledger entry per counter at a first start).
PRODUCE_CHUNK: Final = 4096
OnDelivered = Callable[[str, int, int], None]


class AsyncProducer:
    """An idempotent librdkafka producer whose acknowledgements a coroutine can await.

    `produce` never blocks (a full local queue is served by polling until it drains);
    `flush()` returns once every record produced before it was acknowledged, and raises
    DeliveryError if any of them failed since the last flush. `on_delivered(topic,
    partition, offset)` is called (in the poll thread) for every acknowledged record but
    those of `produce_stamped`.
    """

    def __init__(self, conf: Mapping[str, str], *, on_delivered: OnDelivered | None = None,
                 linger_ms: int = 5) -> None:
        # No compression: Faust (aiokafka) reads the changelog back without lz4 or snappy.
        self._conf = {**conf, "linger.ms": str(linger_ms),
                      "message.timeout.ms": str(MESSAGE_TIMEOUT_MS),
                      "queue.buffering.max.messages": "1000000"}
        # Made at the first produce: a worker that never publishes (tests, a refused
        # start) opens no connection.
        self._client: Producer | None = None
        self._on_delivered = on_delivered
        self._lock = threading.Lock()
        self._in_flight = 0
        self._failed: KafkaError | None = None
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def _producer(self) -> Producer:
        if self._client is None:
            self._client = kafka_io.make_producer(self._conf)
            self._thread = threading.Thread(target=self._poll, name="dpc-producer",
                                            daemon=True)
            self._thread.start()
        return self._client

    def produce(self, topic: str, value: bytes | None, *, key: bytes | None = None,
                partition: int | None = None, timestamp_ms: int | None = None,
                headers: Headers | None = None) -> None:
        kw: dict[str, Any] = {"value": value, "key": key, "on_delivery": self._delivered}
        if partition is not None:
            kw["partition"] = partition
        if timestamp_ms is not None:
            kw["timestamp"] = timestamp_ms
        if headers:
            kw["headers"] = list(headers)
        with self._lock:
            self._in_flight += 1
        try:
            produce_waiting(self._producer, topic, **kw)
        except BaseException:
            with self._lock:
                self._in_flight -= 1
            raise

    def produce_many(self, topic: str, records: Sequence[tuple[bytes | None, bytes | None]],
                     partition: int = -1) -> None:
        """`produce` of each (key, value) to `partition` (-1: the partitioner's choice, as
        `produce` without one), in order, with what `produce` does per record done once
        per call (a checkpoint of the bounding stage writes a record per unit)."""
        if not records:
            return
        client = self._producer
        send, delivered = client.produce, self._delivered
        with self._lock:
            self._in_flight += len(records)
        for i, (key, value) in enumerate(records):
            # kafka_io.produce_waiting inlined: a call per record costs about 0.25 us
            # here, 40% of the enqueue (a checkpoint's changelog records go this way).
            while True:
                try:
                    send(topic, value, key, partition, delivered)
                    break
                except BufferError:
                    client.poll(0.05)  # the local queue is full: let it drain
                except BaseException:
                    with self._lock:
                        self._in_flight -= len(records) - i
                    raise

    def produce_stamped(self, topic: str, records: Iterable[StampedRecord]) -> None:
        """`produce` of each (key, value, timestamp_ms, headers), in order, to the
        partitioner's choice, with what `produce` does per record done once per chunk of
        PRODUCE_CHUNK (an idle worker's marker round sends thousands of heartbeats, a
        first start a ledger entry per counter). Their deliveries are not reported to
        `on_delivered` (the public topics: nobody tracks their offsets)."""
        client = self._producer
        # No `on_delivered` for these: it tracks where changelog writes landed (a
        # million-counter worker sends 16,700 heartbeats a second this way).
        send, delivered = client.produce, self._acked
        it = iter(records)
        while chunk := list(islice(it, PRODUCE_CHUNK)):
            with self._lock:
                self._in_flight += len(chunk)
            for i, (key, value, timestamp, headers) in enumerate(chunk):
                while True:  # kafka_io.produce_waiting inlined (see produce_many)
                    try:
                        # A list as librdkafka takes it (records' `headers()` make one
                        # each: not copied again).
                        send(topic, value, key, on_delivery=delivered, timestamp=timestamp,
                             headers=headers if type(headers) is list else list(headers))
                        break
                    except BufferError:
                        client.poll(0.05)
                    except BaseException:
                        with self._lock:
                            self._in_flight -= len(chunk) - i
                        raise

    async def flush(self) -> None:
        """Wait until every record produced so far is acknowledged (or failed)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._in_flight:
                fut: asyncio.Future[None] = loop.create_future()
                self._waiters.append((loop, fut))
            else:
                fut = None  # type: ignore[assignment]
        if fut is not None:
            await fut
        with self._lock:
            failed, self._failed = self._failed, None
        if failed is not None:
            raise DeliveryError(f"a record was not acknowledged ({failed.name()})")

    def close(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        if self._client is not None:
            self._client.flush(timeout_s)

    # -- the poll thread

    def _poll(self) -> None:
        client = self._producer
        while not self._stop.is_set():
            client.poll(POLL_S)

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        if err is None and self._on_delivered is not None:
            offset = msg.offset()
            partition = msg.partition()
            topic = msg.topic()
            if offset is not None and partition is not None and topic is not None:
                self._on_delivered(topic, partition, offset)
        self._acked(err, msg)

    def _acked(self, err: KafkaError | None, _msg: Message) -> None:
        """The delivery report of a record whose offset nobody tracks (`produce_stamped`:
        the public topics), and the accounting of every record."""
        with self._lock:
            self._in_flight -= 1
            if err is not None and self._failed is None:
                self._failed = err
            if self._in_flight == 0 and self._waiters:
                waiters, self._waiters = self._waiters, []
                for loop, fut in waiters:
                    loop.call_soon_threadsafe(_resolve, fut)


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class KafkaSink:
    """outputs.Sink on the worker's producer, for every stage: each kind of record to its
    topic, in the order Output lists the kinds (ledger entries, releases, timeline
    forwards to their partition, dead letters); `flush` returns once the brokers
    acknowledged every one. `counted`: the worker metric each kind's count is added to
    at every send, where the stage counts one (`add_metric`)."""

    def __init__(self, producer: AsyncProducer, settings: Settings,
                 add_metric: Callable[[str, int], None],
                 counted: Sequence[tuple[RecordKind, str]]) -> None:
        self._producer = producer
        self._ledger = topic_name(settings, "ledger")
        self._counts = topic_name(settings, "counts")
        self._timeline = topic_name(settings, "timeline")
        self._deadletter = topic_name(settings, "deadletter")
        self._add = add_metric
        self._counted = tuple(counted)

    def send(self, out: Output) -> None:
        # Headers (content type, schema/version) travel beside the value: replay compares
        # values only, and a subscriber can route on them before decoding. Record
        # timestamps come from public fields, not the send time (records.py).
        stamped = self._producer.produce_stamped
        if out.ledger:
            stamped(self._ledger, ((e.key(), e.to_json(), e.timestamp_ms(), e.headers())
                                   for e in out.ledger))
        if out.releases:
            stamped(self._counts, (r.stamped() for r in out.releases))
        produce = self._producer.produce
        for tp, data in out.timeline:
            produce(self._timeline, data, partition=tp)
        self._producer.produce_many(self._deadletter, [(None, d) for d in out.deadletters])
        for kind, metric in self._counted:
            self._add(metric, out.count(kind))

    async def flush(self) -> None:
        await self._producer.flush()
