"""The ingest stage: input topic -> timeline topic (valid events) or dead-letter topic.

Stateless and at-least-once, on confluent-kafka directly (no Faust: its per-message path
was the largest cost of the old ingest agent). One loop, in a thread of the worker process:

1. consume a batch of input records (consumer group `<app_id>-ingest`, no auto-commit):
   while records keep coming, the batch fills for up to its window (`fill_window_s`:
   at most a quarter of the lateness, so no event misses its tick's seal for it) until
   it holds FILL_PER_PARTITION events per timeline partition, because the operator pays
   a fixed cost per timeline record and a stage sharing the input with other workers
   would otherwise cut its share of the load into proportionally smaller records;
2. `route` it: `records.parse_input` per record; valid events grouped by their counter's
   timeline partition, in the order they were read (so within one timeline partition the
   offsets of one input partition only increase: the operator's duplicate filter relies on
   it), one v2 batch record per partition (split above MAX_BATCH_EVENTS / MAX_BATCH_BYTES);
   every rejected record, and any record whose handling raises, becomes a dead letter with
   a reason (the only place its raw bytes go);
3. produce them (idempotent producer, acks=all) and wait until the broker acknowledged
   every one;
4. only then commit the input offsets of the batch.

A crash anywhere before 4 re-reads the batch: its events reach the timeline again, with
the same input (partition, offset), and the operator drops them as duplicates. Nothing is
ever committed past a record that is not on the timeline or in the dead-letter topic.

Logs carry error types, codes and aggregate counts only: never a record, never a counter.
"""

from __future__ import annotations

import argparse
import collections
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Final, cast

import orjson
from confluent_kafka import (
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    TopicCollection,
    TopicPartition,
)

from processor.core.errors import NoiseKeyError
from processor.errors import StreamError, print_error
from processor.stream.kafka import kafka_io
from processor.stream.kafka.topics import topic_name, units_topic
from processor.stream.model.bounding import (
    UnitHasher,
    UnitRow,
    encode_units,
    gc_deferred,
    unit_key,
    unit_partition,
    unit_row,
)
from processor.stream.model.clock import PROBE_RECORD, ClockGuard, Stamp, SystemClock
from processor.stream.model.config import ConfigError, Settings, load_noise_key, load_settings
from processor.stream.model.faults import INGEST_DELIVERED, CrashPoint, FaultPlan
from processor.stream.model.logs import configure_logging
from processor.stream.model.records import (
    MAX_BATCH_BYTES,
    MAX_BATCH_EVENTS,
    Event,
    Rejection,
    deadletter_record,
    encode_batch,
    fit_records,
    parse_input,
    partition_for,
)

log = logging.getLogger("processor.stream.ingest")

#: At most this many input records are consumed (and committed) as one batch.
MAX_CONSUME: Final = 5000
#: How often librdkafka reports its statistics for this stage's clients (ms).
STATS_INTERVAL_MS: Final = 10_000
#: A batch aims at this many events per timeline partition (it stops filling there) ...
FILL_PER_PARTITION: Final = 100
#: ... for at most this long after its first consume began, and at most a quarter of the
#: lateness (`fill_window_s`).
FILL_MAX_S: Final = 0.5
#: Commit errors that mean "the group moved on": the batch was delivered, the new owner
#: of the partition re-reads it and the operator drops the copies.
_REBALANCE_CODES: Final = frozenset({
    KafkaError.REBALANCE_IN_PROGRESS, KafkaError.ILLEGAL_GENERATION,
    KafkaError.UNKNOWN_MEMBER_ID, KafkaError._ASSIGNMENT_LOST,
})


# ------------------------------------------------------------------ routing (pure)


@dataclass(frozen=True, slots=True)
class InputRecord:
    """One consumed input record: where it was read and its raw bytes."""

    partition: int
    offset: int
    value: bytes


@dataclass
class Routed:
    """What one consumed batch becomes: timeline batch records (timeline partition,
    bytes), dead-letter values, and aggregate metrics (never per counter)."""

    timeline: list[tuple[int, bytes]] = field(default_factory=list)
    deadletters: list[bytes] = field(default_factory=list)
    metrics: collections.Counter[str] = field(default_factory=collections.Counter)
    #: privacy_unit = "user": units-topic records (units partition, bytes) instead of
    #: timeline records; the bounding stage forwards what it keeps (bounding.py).
    units: list[tuple[int, bytes]] = field(default_factory=list)


def route(records: Sequence[InputRecord], settings: Settings, now_ms: int, *,
          max_events: int = MAX_BATCH_EVENTS, max_bytes: int = MAX_BATCH_BYTES,
          parse: Callable[..., Event | Rejection] = parse_input,
          source: str = "", unit_key: bytes | None = None) -> Routed:
    """Validate `records` and group the valid events into timeline batch records, each
    naming `source` (the input topic's identity, `InputIdentity`) if it is not empty.

    Per timeline partition, events keep the order of `records`; a partition's events are
    split into records of at most `max_events` events and `max_bytes` bytes. A record
    whose handling raises (here or while encoding) is dead-lettered as a
    schema_violation naming the exception type, never dropped. (`parse` is replaceable
    for tests only.)
    """
    out = Routed()
    input_topic = settings.topics.input
    partitions = settings.partitions
    by_partition: dict[int, list[Event]] = {}
    raw = _Sources(records)

    def dead(rejection: Rejection, rec: InputRecord) -> None:
        out.deadletters.append(deadletter_record(rejection, rec.value, input_topic,
                                                 rec.partition, rec.offset))
        out.metrics[f"deadletter_{rejection.reason}"] += 1

    # User mode: the bounding stage picks each kept event's timeline partition, and
    # _route_units groups the events by unit; no timeline partition is needed here.
    units = settings.privacy_unit == "user"
    # Counter -> timeline partition within the batch: a counter's events repeat in it,
    # and partition_for hashes the name each time.
    home: dict[str, int] = {}
    for rec in records:
        try:
            parsed = parse(rec.value, settings, now_ms, rec.partition, rec.offset)
            if isinstance(parsed, Rejection):
                dead(parsed, rec)
                continue
            if units:
                tp = 0
            else:
                tp = home.get(parsed.counter, -1)
                if tp < 0:
                    tp = home[parsed.counter] = partition_for(parsed.counter, partitions)
            by_partition.setdefault(tp, []).append(parsed)
        except Exception as exc:
            dead(_failure(exc), rec)

    def encode(tp: int, events: Sequence[Event]) -> None:
        try:
            data = encode_batch(events, source)
        except Exception as exc:
            if len(events) == 1:
                dead(_failure(exc), raw(events[0]))
                return
            data = b""
        if data and (len(data) <= max_bytes or len(events) == 1):
            out.timeline.append((tp, data))
            out.metrics["ingested"] += len(events)
            return
        # Too large (or one event in it cannot be encoded): halve, keeping the order.
        half = len(events) // 2
        encode(tp, events[:half])
        encode(tp, events[half:])

    if units:
        with gc_deferred():  # a units row per event (bounding.gc_deferred)
            return _route_units(out, by_partition, raw, settings, unit_key, source,
                                max_events, max_bytes, dead)
    for tp in sorted(by_partition):
        events = by_partition[tp]
        for i in range(0, len(events), max_events):
            encode(tp, events[i:i + max_events])
    out.metrics["timeline_batches"] += len(out.timeline)
    return out


class _Sources:
    """The input record an event of a batch was parsed from (to dead-letter it after its
    parse), looked up by where it was read: the map is made at the first lookup only, not
    a tuple and an entry per event of every batch."""

    def __init__(self, records: Sequence[InputRecord]) -> None:
        self._records = records
        self._by: dict[tuple[int, int], InputRecord] | None = None

    def __call__(self, ev: Event) -> InputRecord:
        if self._by is None:
            self._by = {(r.partition, r.offset): r for r in self._records}
        return self._by[(ev.src_partition, ev.src_offset)]


_HASHERS: dict[bytes, UnitHasher] = {}


def _hasher(unit_key: bytes) -> UnitHasher:
    """One UnitHasher per key for the process (ingest's thread is the only caller)."""
    h = _HASHERS.get(unit_key)
    if h is None:
        _HASHERS.clear()
        h = _HASHERS[unit_key] = UnitHasher(unit_key)
    return h


def _route_units(out: Routed, by_partition: dict[int, list[Event]],
                 raw: Callable[[Event], InputRecord], settings: Settings,
                 unit_key: bytes | None, source: str, max_events: int, max_bytes: int,
                 dead: Callable[[Rejection, InputRecord], None]) -> Routed:
    """privacy_unit = "user": the valid events, their unit ids replaced by the keyed hash,
    grouped by units partition in the order read (the bounding stage decides by that
    order), into units records split like timeline records."""
    if unit_key is None:
        raise IngestError('privacy_unit = "user" needs the unit key (the noise key)')
    hasher = _hasher(unit_key)
    events = sorted((ev for evs in by_partition.values() for ev in evs),
                    key=attrgetter("src_partition", "src_offset"))
    by_unit: dict[int, list[UnitRow]] = {}
    for ev in events:
        if ev.unit is None:  # parse_input rejects these in user mode: never counted
            dead(Rejection("unit_missing", "user is required (privacy_unit = user)"),
                 raw(ev))
            continue
        h = hasher(ev.unit)
        by_unit.setdefault(unit_partition(h, settings.partitions), []).append(unit_row(h, ev))

    def encode(rows: Sequence[UnitRow]) -> bytes:
        return encode_units(rows, source)

    for up in sorted(by_unit):
        rows = by_unit[up]
        out.units.extend((up, data) for data in fit_records(rows, encode, max_events,
                                                              max_bytes))
        out.metrics["ingested"] += len(rows)
    out.metrics["units_batches"] += len(out.units)
    return out


def _failure(exc: BaseException) -> Rejection:
    # The type only: an exception's message may quote the record.
    return Rejection("schema_violation", f"cannot be forwarded ({type(exc).__name__})")


def fill_window_s(settings: Settings, poll_s: float) -> float:
    """How long one batch may fill while records keep coming: FILL_MAX_S, at most a
    quarter of the lateness (an event stamped now then reaches the timeline long before
    the marker that seals its tick), never less than one poll (what a batch always took)."""
    return max(poll_s, min(FILL_MAX_S, settings.lateness_ms / 4000.0))


def committable(records: Sequence[InputRecord]) -> dict[int, int]:
    """Input partition -> the offset to commit after `records` (last offset + 1)."""
    out: dict[int, int] = {}
    for rec in records:
        if rec.offset + 1 > out.get(rec.partition, -1):
            out[rec.partition] = rec.offset + 1
    return out


# ------------------------------------------------------------------ the loop


class IngestError(StreamError, RuntimeError):
    """The ingest stage cannot go on (a delivery failed, a fatal client error)."""

    error_prefix = "ingest: "


class InputIdentity:
    """The input topic's identity (its Kafka topic id), named in every timeline batch so
    that the operator's duplicate filter tells a recreated topic, whose offsets start
    again at 0, from a re-read of the same records.

    Looked up at start, and again whenever a partition's offsets go back (a re-read after
    a rebalance: the same id; a recreated topic: a new one, logged and counted). Where the
    brokers refuse the look-up (no DESCRIBE permission), records name no identity, as
    before, and a recreated topic's records below the old offsets would be dropped: the
    warning says so."""

    def __init__(self, describe: Callable[[], str]) -> None:
        self._describe = describe
        self.source = ""
        self._seen: dict[int, int] = {}
        self.recreated = 0

    def refresh(self) -> None:
        try:
            found = self._describe()
        except (KafkaException, TimeoutError, ValueError) as exc:
            if not self.source:
                log.warning("ingest: cannot look up the input topic's id (%s): a topic "
                            "deleted and recreated under the same name would have its "
                            "first records taken for duplicates; grant DESCRIBE on it",
                            type(exc).__name__)
            return
        if self.source and found != self.source:
            self.recreated += 1
            log.warning("ingest: the input topic was deleted and recreated (a new topic "
                        "id): its records are counted as a new source")
        self.source = found

    def observe(self, records: Sequence[InputRecord]) -> None:
        """Look the identity up again if an offset of `records` went back."""
        back = False
        seen = self._seen
        for rec in records:
            last = seen.get(rec.partition)
            if last is not None and rec.offset <= last:
                back = True
            seen[rec.partition] = rec.offset
        if back:
            self.refresh()


def topic_id_lookup(conf: Mapping[str, str], topic: str,
                    timeout_s: float = 10.0) -> Callable[[], str]:
    """A function returning the topic id of `topic` (its base64 form)."""
    admin = kafka_io.make_admin(conf)

    def describe() -> str:
        futures = admin.describe_topics(TopicCollection([topic]), request_timeout=timeout_s)
        return str(futures[topic].result().topic_id)

    return describe


class Ingest:
    """The ingest loop (see the module docstring) in a thread of its own.

    `start()` starts it, `stop()` asks it to finish the batch in hand and waits. If the loop
    fails, it stops itself without committing the batch in hand, records the error in
    `failure` and calls `on_failure` (the worker then stops: exit code 1). `clock` (shared
    with the worker's marker timer) decides "too far in the future" by the later of the
    local and the brokers' clocks, and learns the brokers' time from the log-append times
    of the timeline records this stage writes (clock.py, docs/time.md).
    """

    def __init__(self, settings: Settings, *,
                 on_failure: Callable[[BaseException], None] | None = None,
                 crash_point: CrashPoint | None = None,
                 on_batch: Callable[[int], None] | None = None,
                 max_consume: int = MAX_CONSUME, poll_s: float = 0.2,
                 delivery_timeout_s: float = 60.0, clock: ClockGuard | None = None,
                 unit_key: bytes | None = None) -> None:
        self.settings = settings
        #: privacy_unit = "user": the HMAC key of unit ids (bounding.unit_key); events go
        #: to the units topic, keyed by it, never with the raw id.
        self._unit_key = unit_key
        self._units = units_topic(settings)
        self._clock = clock if clock is not None else ClockGuard(SystemClock())
        self.group_id = f"{settings.app_id}-ingest"
        self.failure: BaseException | None = None
        self._on_failure = on_failure
        self._crash_point = crash_point
        #: Told the size of every batch delivered (the worker's batch-size histogram).
        self._on_batch = on_batch
        #: time.monotonic() when the loop last came round (None before it started): the
        #: worker's liveness check tells a stuck loop from a slow batch by it.
        self.last_beat: float | None = None
        self._max_consume = max_consume
        self._poll_s = poll_s
        self._fill_s = fill_window_s(settings, poll_s)
        self._fill_target = min(max_consume, FILL_PER_PARTITION * settings.partitions)
        self._delivery_timeout_s = delivery_timeout_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._metrics: collections.Counter[str] = collections.Counter()
        self._timeline = topic_name(settings, "timeline")
        self._deadletter = topic_name(settings, "deadletter")
        #: The input topic's identity (`run` looks it up on the brokers; none until then).
        self.identity = InputIdentity(lambda: "")
        #: librdkafka's latest statistics of this stage's clients, decoded, by client name
        #: ("ingest-consumer", "ingest-producer"); replaced whole at every report (every
        #: STATS_INTERVAL_MS), so a reader (the metrics surface) never sees half of one.
        self.client_stats: dict[str, dict[str, Any]] = {}

    # -- lifecycle

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("ingest already started")
        # A daemon thread: a worker that exits without calling stop() is not held up.
        self._thread = threading.Thread(target=self.run, name="dpc-ingest", daemon=True)
        self._thread.start()

    def alive(self) -> bool:
        """Whether the ingest thread is running."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout_s: float = 60.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _stats_sink(self, client: str) -> Callable[[str], None]:
        """The `stats_cb` of one client: keeps its latest statistics (metrics.py exports
        them). Called from the client's poll, in this stage's thread."""
        def sink(raw: str) -> None:
            try:
                decoded = orjson.loads(raw)
            except orjson.JSONDecodeError:
                return
            if isinstance(decoded, dict):
                self.client_stats = {**self.client_stats, client: decoded}
        return sink

    def metrics(self) -> dict[str, int]:
        """A snapshot of the aggregate counts (thread-safe)."""
        with self._lock:
            return dict(self._metrics)

    def _add(self, counts: Mapping[str, int]) -> None:
        with self._lock:
            self._metrics.update(counts)

    # -- the loop

    def run(self) -> None:
        """The loop itself (the thread's target; tests and the CLI may call it directly)."""
        conf = kafka_io.base_config(self.settings)
        consumer = Consumer(kafka_io.with_logger({
            **conf,
            "group.id": self.group_id,
            "enable.auto.commit": "false",
            "auto.offset.reset": "earliest",
            "enable.partition.eof": "false",
            # As the operator's group: a killed worker's input partitions move as soon.
            "session.timeout.ms": str(int(kafka_io.SESSION_TIMEOUT_S * 1000)),
            "heartbeat.interval.ms": "1000",
            # librdkafka's own statistics (queues, errors, retries, RTT, lag, rebalances),
            # exported by the metrics surface (metrics.client_stats_families).
            "statistics.interval.ms": str(STATS_INTERVAL_MS),
            "stats_cb": self._stats_sink("ingest-consumer"),
        }))
        producer = kafka_io.make_producer(
            cast(dict[str, str], {**conf, "stats_cb": self._stats_sink("ingest-producer")}),
            **{"linger.ms": "2", "statistics.interval.ms": str(STATS_INTERVAL_MS)})
        self.identity = InputIdentity(topic_id_lookup(conf, self.settings.topics.input))
        try:
            self.identity.refresh()
            self._probe_time(producer)
            consumer.subscribe([self.settings.topics.input])
            while not self._stop.is_set():
                self.last_beat = time.monotonic()
                # Serves the producer's statistics callback between batches too (it runs
                # only inside poll/flush); no delivery is pending here: each batch flushed.
                producer.poll(0)
                msgs = self._consume(consumer)
                if msgs:
                    self._handle(consumer, producer, msgs)
        except BaseException as exc:
            self.failure = exc
            # Type only: client errors can quote topic data.
            log.critical("ingest stage failed (%s); stopping the worker", type(exc).__name__)
            if self._on_failure is not None:
                self._on_failure(exc)
        finally:
            # Leave the group at once (its partitions move without waiting for the session
            # timeout); nothing uncommitted is lost: it is re-read by the next owner.
            try:
                consumer.close()
            finally:
                producer.flush(10.0)

    def _consume(self, consumer: Consumer) -> list[Any]:
        """One batch: what one poll brings; while more keeps coming, up to the fill target
        or the end of the fill window (a poll that brings nothing ends it at once)."""
        started = time.monotonic()
        msgs: list[Any] = consumer.consume(num_messages=self._max_consume,
                                           timeout=self._poll_s)
        while msgs and len(msgs) < self._fill_target and not self._stop.is_set():
            left = started + self._fill_s - time.monotonic()
            if left <= 0:
                break
            more = consumer.consume(num_messages=self._fill_target - len(msgs),
                                    timeout=min(left, self._poll_s))
            if not more:
                break
            msgs.extend(more)
        return msgs

    def _handle(self, consumer: Consumer, producer: Any, msgs: Sequence[Any]) -> None:
        records: list[InputRecord] = []
        for msg in msgs:
            err = msg.error()
            if err is not None:
                if err.fatal():
                    raise IngestError(f"consumer error {err.name()}")
                log.warning("ingest: consumer reported %s", err.name())
                continue
            records.append(InputRecord(int(msg.partition()), int(msg.offset()),
                                       bytes(msg.value() or b"")))
        if not records:
            return
        identity = self.identity
        identity.observe(records)
        routed = route(records, self.settings, self._clock.read().future_ms,
                       source=identity.source, unit_key=self._unit_key)
        routed.metrics["input_topic_recreated"] += identity.recreated
        identity.recreated = 0
        failed: list[str] = []
        stamps: list[int] = []
        on_delivery = self._delivery_callback(failed, stamps)
        sent = self._clock.mono_ms()

        for tp, data in routed.timeline:
            self._produce(producer, self._timeline, data, tp, on_delivery)
        for up, data in routed.units:
            self._produce(producer, self._units, data, up, on_delivery)
        for data in routed.deadletters:
            self._produce(producer, self._deadletter, data, None, on_delivery)
        remaining = producer.flush(self._delivery_timeout_s)
        if stamps:
            self._clock.observe(Stamp(max(stamps), sent, self._clock.mono_ms()))
        if remaining or failed:
            raise IngestError(f"{remaining} record(s) unacknowledged, delivery errors "
                              f"{sorted(set(failed))}")
        if self._crash_point is not None:
            self._crash_point(INGEST_DELIVERED)
        # Only partitions this member still holds: a batch filled over several polls may
        # span a rebalance, and the group's broker does not stop a member from committing
        # a partition it lost (that would move its new owner's offset back). A lost
        # partition's records are re-read by its new owner (the operator drops the copies).
        held = {tp.partition for tp in consumer.assignment()}
        offsets = [TopicPartition(self.settings.topics.input, p, o)
                   for p, o in sorted(committable(records).items()) if p in held]
        try:
            if offsets:
                consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            kerr = exc.args[0] if exc.args else None
            if not isinstance(kerr, KafkaError) or kerr.code() not in _REBALANCE_CODES:
                raise
            # Delivered but not committed: the partition's next owner re-reads the batch
            # and the operator drops the copies (duplicate filter).
            log.warning("ingest: commit skipped after a rebalance (%s)", kerr.name())
            routed.metrics["ingest_commits_lost_to_rebalance"] += 1
        routed.metrics["input_records"] += len(records)
        self._add(routed.metrics)
        if self._on_batch is not None:
            self._on_batch(len(records))

    def _delivery_callback(self, failed: list[str],
                           stamps: list[int]) -> Callable[[KafkaError | None, Any], None]:
        """A delivery report callback: errors into `failed`, the brokers' log-append times
        of delivered timeline records into `stamps` (the clock reference)."""
        def on_delivery(err: KafkaError | None, msg: Any) -> None:
            if err is not None:
                failed.append(err.name())
            elif msg.topic() in (self._timeline, self._units):  # both log-append time
                kind, ts = msg.timestamp()
                if kind == TIMESTAMP_LOG_APPEND_TIME:
                    stamps.append(int(ts))
        return on_delivery

    def _probe_time(self, producer: Any) -> None:
        """The brokers' time before the first batch is judged: an empty event batch on
        timeline partition 0 (a no-op for the operator and for replay) whose delivery
        report carries its log-append time. A failed probe leaves the reference unset
        (the wall clock alone decides until a batch is delivered)."""
        failed: list[str] = []
        stamps: list[int] = []
        sent = self._clock.mono_ms()
        self._produce(producer, self._timeline, PROBE_RECORD, 0,
                      self._delivery_callback(failed, stamps))
        # Bounded: an unreachable broker fails the loop below anyway, and a stop request
        # must not wait behind the probe.
        producer.flush(min(self._delivery_timeout_s, 10.0))
        if stamps:
            self._clock.observe(Stamp(max(stamps), sent, self._clock.mono_ms()))

    @staticmethod
    def _produce(producer: Any, topic: str, value: bytes, partition: int | None,
                 on_delivery: Callable[[KafkaError | None, Any], None]) -> None:
        kwargs: dict[str, Any] = {"value": value, "on_delivery": on_delivery}
        if partition is not None:
            kwargs["partition"] = partition
        kafka_io.produce_waiting(producer, topic, **kwargs)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m processor.stream.kafka.ingest --config F`: the ingest stage alone, until
    SIGTERM/SIGINT (the worker runs it in a thread; this entry point serves tests that
    kill the stage on its own and measurements of it)."""
    p = argparse.ArgumentParser(prog="python -m processor.stream.kafka.ingest",
                                description="Run the ingest stage alone.")
    p.add_argument("--config", help="TOML configuration (DPC_* environment overrides apply)")
    p.add_argument("--loglevel", default="warning")
    p.add_argument("--max-consume", type=int, default=MAX_CONSUME,
                   help="input records per batch (default %(default)s)")
    args = p.parse_args(list(argv) if argv is not None else None)
    configure_logging(args.loglevel)  # the client loggers' floors (logs.py)
    try:
        settings = load_settings(args.config)
        faults = FaultPlan.from_env()
        # privacy_unit = "user": unit ids are hashed under a key derived from the noise key.
        ukey = (unit_key(load_noise_key(settings)) if settings.privacy_unit == "user"
                else None)
    except (ConfigError, NoiseKeyError) as exc:
        print_error(f"configuration: {exc}")
        return 2
    ingest = Ingest(settings, crash_point=faults.crash_point(), max_consume=args.max_consume,
                    clock=ClockGuard(faults.clock()), unit_key=ukey)

    def on_signal(_signum: int, _frame: object) -> None:
        ingest.stop(timeout_s=0)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    ingest.run()
    return 1 if ingest.failure is not None else 0


if __name__ == "__main__":
    sys.exit(main())
