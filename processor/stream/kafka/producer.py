"""The worker's librdkafka producers for everything its stages write: releases, ledger
entries, the bounding stage's forwards and dead letters (`KafkaSink`, the one sink of
every stage), and the state tables' changelog records.

Faust's producer is pure Python on the event loop, one send and one future per record;
the operator's records through it cost more CPU than everything else per counted event.
Here a `produce` call hands a record to librdkafka (C, batched, idempotent: acks=all,
ordered per partition, retried without duplicates), a thread serves the delivery
reports, and `flush()` lets a coroutine wait for all acknowledgements without blocking
the event loop (Faust's heartbeats and the consumer keep running meanwhile).

Two clients, one per kind of report. The tracked one reports every record: delivery
reports tell at which offsets this process's records landed (`on_delivered`), which
restore.ChangelogTracker uses to know whether anything else wrote to a changelog
partition between them. The public one (releases and ledger entries, whose offsets
nobody tracks) reports failures only: its successes are counted by librdkafka (the
client's queue length), not in Python, which saves a Python callback and a message
object per record (about 1 us of a release's 3-4: bench/README.md, "Public records
without a report each").
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
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
OnDelivered = Callable[[str, int, int], None]
#: A coroutine's wait in `flush`: its loop and the future the poll thread resolves.
Waiter = tuple[asyncio.AbstractEventLoop, "asyncio.Future[None]"]


class AsyncProducer:
    """Idempotent librdkafka producers whose acknowledgements a coroutine can await.

    `produce` never blocks (a full local queue is served by polling until it drains);
    `flush()` returns once every record produced before it was acknowledged, and raises
    DeliveryError if any of them failed since the last flush. `on_delivered(topic,
    partition, offset)` is called (in the poll thread) for every acknowledged record but
    those of `produce_stamped`, which go through the public client (module docstring).
    """

    def __init__(self, conf: Mapping[str, str], *, on_delivered: OnDelivered | None = None,
                 linger_ms: int = 5, message_timeout_ms: int = MESSAGE_TIMEOUT_MS) -> None:
        # No compression: Faust (aiokafka) reads the changelog back without lz4 or snappy.
        self._conf = {**conf, "linger.ms": str(linger_ms),
                      "message.timeout.ms": str(message_timeout_ms),
                      "queue.buffering.max.messages": "1000000"}
        # Made at the first produce: a worker that never publishes (tests, a refused
        # start) opens no connection.
        self._client: Producer | None = None
        self._public_client: Producer | None = None
        self._on_delivered = on_delivered
        self._lock = threading.Lock()
        self._in_flight = 0
        self._failed: KafkaError | None = None
        self._waiters: list[Waiter] = []
        # Waiting for the public client's queue to be empty (`_public_drained`).
        self._public_waiters: list[Waiter] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def _producer(self) -> Producer:
        if self._client is None:
            self._client = kafka_io.make_producer(self._conf)
            self._start_thread(self._client, "dpc-producer", lambda: None)
        return self._client

    @property
    def _public(self) -> Producer:
        """The client of the records whose offsets nobody tracks: it reports failures
        only (confluent-kafka's `delivery.report.only.error`, to `_public_failed`)."""
        if self._public_client is None:
            self._public_client = kafka_io.make_producer(
                self._conf, **{"delivery.report.only.error": True,
                               "on_delivery": self._public_failed})
            self._start_thread(self._public_client, "dpc-producer-public",
                               self._public_drained)
        return self._public_client

    def _start_thread(self, client: Producer, name: str, served: Callable[[], None]
                      ) -> None:
        """The poll thread of `client`: serves its reports (their callbacks run there),
        then calls `served`, until `close`."""
        def serve() -> None:
            while not self._stop.is_set():
                client.poll(POLL_S)
                served()

        thread = threading.Thread(target=serve, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

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
        partitioner's choice, through the public client (the public topics: nobody
        tracks their offsets; a million-counter worker sends 16,700 heartbeats a second
        this way, a first start a ledger entry per counter). `flush` waits for them as
        for every other record."""
        client = self._public
        send = client.produce
        for key, value, timestamp, headers in records:
            while True:  # kafka_io.produce_waiting inlined (see produce_many)
                try:
                    # A list as librdkafka takes it (records' `headers()` make one each:
                    # not copied again).
                    send(topic, value, key, timestamp=timestamp,
                         headers=headers if type(headers) is list else list(headers))
                    break
                except BufferError:
                    client.poll(0.05)  # serves reports: maybe the last one a flush awaits
                    self._public_drained()

    async def flush(self) -> None:
        """Wait until every record produced so far is acknowledged (or failed): the
        tracked client's records counted in flight, the public client's queue empty
        (librdkafka counts a record there until its report is served)."""
        loop = asyncio.get_running_loop()
        waits: list[asyncio.Future[None]] = []
        with self._lock:
            if self._in_flight:
                waits.append(loop.create_future())
                self._waiters.append((loop, waits[-1]))
            public = self._public_client
            if public is not None and len(public):
                waits.append(loop.create_future())
                self._public_waiters.append((loop, waits[-1]))
        for fut in waits:
            await fut
        with self._lock:
            failed, self._failed = self._failed, None
        if failed is not None:
            raise DeliveryError(f"a record was not acknowledged ({failed.name()})")

    def close(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=2.0)
        for client in (self._client, self._public_client):
            if client is not None:
                client.flush(timeout_s)

    # -- in the poll threads

    def _public_drained(self) -> None:
        """Wake the flushes waiting for the public client once its queue is empty. Its
        length falls only while reports are served (in a poll), and every poll is
        followed by this check, under the lock a flush registers under: a flush that saw
        records queued is woken by the poll that serves the last one's report."""
        client = self._public_client
        with self._lock:
            if self._public_waiters and client is not None and not len(client):
                _wake(self._public_waiters)
                self._public_waiters = []

    def _public_failed(self, err: KafkaError | None, _msg: Message) -> None:
        """The report of a public record: only failures reach here."""
        if err is not None:
            with self._lock:
                if self._failed is None:
                    self._failed = err

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        if err is None and self._on_delivered is not None:
            offset = msg.offset()
            partition = msg.partition()
            topic = msg.topic()
            if offset is not None and partition is not None and topic is not None:
                self._on_delivered(topic, partition, offset)
        self._acked(err, msg)

    def _acked(self, err: KafkaError | None, _msg: Message) -> None:
        """The accounting of every record of the tracked client."""
        with self._lock:
            self._in_flight -= 1
            if err is not None and self._failed is None:
                self._failed = err
            if self._in_flight == 0 and self._waiters:
                _wake(self._waiters)
                self._waiters = []


def _wake(waiters: list[Waiter]) -> None:
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
