"""Plain Kafka helpers on confluent-kafka: client configuration from Settings (TLS/SASL
included), topic creation, producing, and reading a whole topic.

Used by the ingest stage, replay, the demo, the tests and the benchmark: everything that
talks to Kafka outside Faust's own clients (Faust's credentials are transport.py's, from
the same `ssl_context`). Nothing here logs record contents or secrets.
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]
from confluent_kafka.cimpl import NewTopic

from processor.errors import StreamError
from processor.stream.model.config import Settings

#: librdkafka's own lines (connection failures, warnings) go through Python logging under
#: this name, so they take the process's level, format and floors (logs.py) instead of
#: landing raw on stderr. librdkafka hands them over when the client is polled.
RDKAFKA_LOGGER = logging.getLogger("rdkafka")


def with_logger(conf: Mapping[str, Any]) -> dict[str, Any]:
    """`conf` plus the `logger` that routes librdkafka's log lines through RDKAFKA_LOGGER
    (unless `conf` names its own); every client this project builds passes through here."""
    return {"logger": RDKAFKA_LOGGER, **conf}  # a caller's own logger wins


# How long the read helpers wait for metadata and for the end of a partition.
_DEFAULT_TIMEOUT_S = 30.0
#: The session timeout of the worker's consumer groups (the operator's, on Faust, and
#: ingest's): a worker killed without leaving its groups is noticed after this long
#: (Faust's default is 60 s); its partitions then move.
SESSION_TIMEOUT_S: Final = 10.0

#: The five topics of a deployment, by role.
TopicRole = Literal["input", "timeline", "counts", "ledger", "deadletter"]


@dataclass(frozen=True)
class KafkaRecord:
    """One record read back from a topic (key/value as raw bytes)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp_ms: int

    def header(self, name: str) -> bytes | None:
        """The last value of header `name`, or None."""
        found: bytes | None = None
        for k, v in self.headers:
            if k == name:
                found = v
        return found


def security_config(settings: Settings) -> dict[str, str]:
    """librdkafka security properties (security.protocol, ssl.*, sasl.*) from Settings."""
    sec = settings.security
    conf: dict[str, str] = {"security.protocol": sec.security_protocol.lower()}
    for value, prop in (
        (sec.ssl_cafile, "ssl.ca.location"),
        (sec.ssl_certfile, "ssl.certificate.location"),
        (sec.ssl_keyfile, "ssl.key.location"),
        (sec.sasl_mechanism, "sasl.mechanism"),
        (sec.sasl_username, "sasl.username"),
        (sec.sasl_password, "sasl.password"),
    ):
        if value:
            conf[prop] = value
    return conf


def ssl_context(settings: Settings) -> ssl.SSLContext | None:
    """The TLS context of the configured protocol (None without TLS): the CA to trust and,
    for mutual TLS, the client certificate; the same files librdkafka is given."""
    sec = settings.security
    if "SSL" not in sec.security_protocol:
        return None
    ctx = ssl.create_default_context(purpose=ssl.Purpose.SERVER_AUTH, cafile=sec.ssl_cafile)
    if sec.ssl_certfile:
        ctx.load_cert_chain(sec.ssl_certfile, sec.ssl_keyfile)
    return ctx


def client_id(settings: Settings) -> str:
    """The client id of every Kafka client of this process: the app id, the host and the
    process id, so that a group's description (`kafka-consumer-groups --describe`, whose
    member ids begin with it) and the brokers' logs tell the workers apart. Nothing in it
    depends on an event."""
    return f"dpc-{settings.app_id}-{socket.gethostname()}-{os.getpid()}"


def base_config(settings: Settings) -> dict[str, str]:
    """Bootstrap servers, security and the client id: the part every librdkafka client
    shares."""
    conf = {"bootstrap.servers": settings.bootstrap_servers, "client.id": client_id(settings)}
    conf.update(security_config(settings))
    return conf


class AccessRefused(StreamError, RuntimeError):
    """The brokers answer but refuse this client (authentication or TLS)."""

    error_prefix = "Kafka: "


def check_access(conf: Mapping[str, str], timeout_s: float) -> None:
    """Return once the brokers answer a metadata request. AccessRefused when they refuse
    this client (failed SASL authentication; a TLS handshake failing either way): that
    arrives within a second and retrying cannot help, so a start reports it at once. The
    message is librdkafka's text for TLS, a fixed sentence for SASL (never a credential).
    The last KafkaException when nothing answers within `timeout_s`."""
    seen: list[KafkaError] = []
    full: dict[str, Any] = {**conf, "log_level": "0", "error_cb": seen.append}
    admin = AdminClient(full)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            admin.list_topics(timeout=min(0.5, max(0.1, deadline - time.monotonic())))
            return
        except KafkaException:
            if time.monotonic() >= deadline:
                raise
            admin.poll(0.1)  # serves error_cb
        for err in seen:
            if err.code() == KafkaError._AUTHENTICATION:
                raise AccessRefused("SASL authentication failed (check the mechanism, "
                                    "username and password)")
            text = str(err.str())
            if err.code() == KafkaError._SSL or "SSL alert" in text:
                raise AccessRefused(text.split(" (after ")[0])  # without the timing suffix


#: How long a command's start waits for the brokers to answer (`require_brokers`).
PROBE_TIMEOUT_S = 10.0


class BrokerUnavailable(StreamError, RuntimeError):
    """The brokers do not answer or refuse this client: one line naming the bootstrap
    servers and the cause (never a credential)."""


def require_brokers(conf: Mapping[str, str], timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """`check_access` at a command's start, its failure as one BrokerUnavailable line:
    a refusal within about a second, brokers that do not answer after `timeout_s`."""
    try:
        check_access(conf, timeout_s)
    except (AccessRefused, KafkaException) as exc:
        raise BrokerUnavailable(broker_failure(conf, exc)) from None


def broker_failure(conf: Mapping[str, str], exc: Exception) -> str:
    """The one line a command prints when the brokers refuse it (AccessRefused) or a
    request to them fails (KafkaException): the bootstrap servers and the cause, never a
    credential."""
    servers = conf.get("bootstrap.servers", "?")
    if isinstance(exc, AccessRefused):
        return f"the Kafka brokers at {servers} refuse this client: {exc}"
    err = exc.args[0] if exc.args else None
    what = err.name() if isinstance(err, KafkaError) else type(exc).__name__
    return (f"the Kafka brokers at {servers} do not answer ({what}); check bootstrap_servers "
            "and the security settings")


def missing_topics(conf: Mapping[str, str], topics: Iterable[str],
                   timeout_s: float = _DEFAULT_TIMEOUT_S) -> list[str]:
    """The topics of `topics` the brokers do not have (one metadata request for all
    topics: naming a missing one could make a broker auto-create it)."""
    md = make_admin(conf).list_topics(timeout=timeout_s)
    return [t for t in topics if t not in md.topics or md.topics[t].error is not None]


def make_producer(conf: Mapping[str, str], **extra: Any) -> Producer:
    """An idempotent producer (acks=all) on top of `conf`."""
    full: dict[str, Any] = dict(conf)
    full.update({"enable.idempotence": "true", "acks": "all", "linger.ms": "5"})
    full.update(extra)
    return Producer(with_logger(full))


def make_admin(conf: Mapping[str, str]) -> AdminClient:
    return AdminClient(with_logger(conf))


def create_topics(
    conf: Mapping[str, str],
    names: Iterable[str],
    partitions: int = 1,
    *,
    replication: int = 1,
    config: Mapping[str, str] | None = None,
    timeout_s: float = _DEFAULT_TIMEOUT_S,
) -> None:
    """Create topics, ignoring ones that already exist; waits until each is created."""
    admin = make_admin(conf)
    new = [
        NewTopic(n, num_partitions=partitions, replication_factor=replication,
                 config=dict(config or {}))
        for n in names
    ]
    if not new:
        return
    futures = admin.create_topics(new, operation_timeout=timeout_s, request_timeout=timeout_s)
    for name, fut in futures.items():
        try:
            fut.result(timeout=timeout_s)
        except KafkaException as exc:
            err = exc.args[0]
            if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue
            raise RuntimeError(f"cannot create topic {name!r}: {err}") from None


#: The topic settings `topic_configs` reads (what decides how long records are kept).
RETENTION_CONFIGS = ("cleanup.policy", "retention.ms", "retention.bytes")


def topic_configs(conf: Mapping[str, str], topics: Iterable[str],
                  timeout_s: float = _DEFAULT_TIMEOUT_S) -> dict[str, dict[str, str]]:
    """topic -> its effective RETENTION_CONFIGS values (its own or the broker's default).
    KafkaException when a topic cannot be described (missing, or no DescribeConfigs
    permission)."""
    resources = [ConfigResource(ConfigResource.Type.TOPIC, t) for t in topics]
    if not resources:
        return {}
    admin = make_admin(conf)  # kept alive until the futures resolve
    out: dict[str, dict[str, str]] = {}
    deadline = time.monotonic() + timeout_s
    while resources:
        futures = admin.describe_configs(resources, request_timeout=timeout_s)
        retry = []
        for res, fut in futures.items():
            try:
                entries = fut.result(timeout=timeout_s)
            except KafkaException as exc:
                # A topic created a moment ago may not have reached every broker yet.
                err = exc.args[0] if exc.args else None
                if (isinstance(err, KafkaError)
                        and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
                        and time.monotonic() < deadline):
                    retry.append(res)
                    continue
                raise
            out[str(res.name)] = {k: str(entries[k].value) for k in RETENTION_CONFIGS
                                  if k in entries}
        resources = retry
        if retry:
            time.sleep(0.2)
    return out


def partition_count(conf: Mapping[str, str], topic: str,
                    timeout_s: float = _DEFAULT_TIMEOUT_S) -> int:
    """Number of partitions of `topic` (0 if it does not exist)."""
    admin = make_admin(conf)
    md = admin.list_topics(topic=topic, timeout=timeout_s)
    t = md.topics.get(topic)
    if t is None or t.error is not None:
        return 0
    return len(t.partitions)


def partitions_with_leaders(conf: Mapping[str, str], topic: str, expected: int,
                            timeout_s: float = _DEFAULT_TIMEOUT_S) -> int:
    """The partition count of `topic` once metadata lists `expected` partitions, each with
    a leader (a just-created topic shows up partition by partition); after `timeout_s`,
    whatever count metadata shows then (0 if the topic does not exist)."""
    admin = make_admin(conf)
    deadline = time.monotonic() + timeout_s
    while True:
        md = admin.list_topics(topic=topic, timeout=max(1.0, deadline - time.monotonic()))
        t = md.topics.get(topic)
        n = 0 if t is None or t.error is not None else len(t.partitions)
        ready = t is not None and all(p.leader >= 0 for p in t.partitions.values())
        if (n == expected and ready) or n > expected or time.monotonic() > deadline:
            return n
        time.sleep(0.1)


def replication_for(conf: Mapping[str, str], timeout_s: float = _DEFAULT_TIMEOUT_S) -> int:
    """Replication factor for the topics we create: min(3, number of live brokers).

    One broker (a laptop, the tests) gets 1; a three-node cluster gets 3, so the timeline,
    the outputs and the state changelog survive the loss of a node.
    """
    md = make_admin(conf).list_topics(timeout=timeout_s)
    return max(1, min(3, len(md.brokers)))


def produce_waiting(producer: Producer, topic: str, *args: Any, **kwargs: Any) -> None:
    """`producer.produce(topic, ...)`, waiting while its local queue is full (BufferError)
    for deliveries to drain it: every producer of the project sends through this."""
    while True:
        try:
            producer.produce(topic, *args, **kwargs)
            return
        except BufferError:
            producer.poll(0.05)


def produce_all(
    conf: Mapping[str, str],
    topic: str,
    records: Iterable[tuple[bytes | None, bytes | None]],
    *,
    partition: int | None = None,
    timeout_s: float = _DEFAULT_TIMEOUT_S,
) -> int:
    """Produce (key, value) records in order (a None value: a deletion) and wait until
    all are acknowledged."""
    producer = make_producer(conf)
    errors: list[str] = []

    def on_delivery(err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    n = 0
    for key, value in records:
        kwargs: dict[str, Any] = {"key": key, "value": value, "on_delivery": on_delivery}
        if partition is not None:
            kwargs["partition"] = partition
        produce_waiting(producer, topic, **kwargs)
        producer.poll(0)
        n += 1
    remaining = producer.flush(timeout_s)
    if remaining or errors:
        raise RuntimeError(f"produce to {topic!r} failed: {remaining} unsent, errors={errors[:3]}")
    return n


def reader_consumer(conf: Mapping[str, str]) -> Consumer:
    """A consumer that reads assigned partitions only (a group id of its own, never
    joined; no offsets committed), committed records only, from the earliest there are."""
    full = dict(conf)
    full.update({
        "group.id": f"dpc-reader-{uuid.uuid4().hex}",
        "enable.auto.commit": "false",
        "auto.offset.reset": "earliest",
        "enable.partition.eof": "false",
        "isolation.level": "read_committed",
    })
    return Consumer(with_logger(full))


def end_offsets(conf: Mapping[str, str], topic: str,
                timeout_s: float = _DEFAULT_TIMEOUT_S) -> dict[int, tuple[int, int]]:
    """partition -> (low, high) watermarks of `topic`."""
    consumer = reader_consumer(conf)
    try:
        return _watermarks(consumer, topic, timeout_s)
    finally:
        consumer.close()


def _partitions(consumer: Consumer, topic: str, timeout_s: float) -> list[int]:
    t = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
    if t is None or t.error is not None:
        raise RuntimeError(f"topic {topic!r} not found")
    return sorted(t.partitions)


def _watermarks(consumer: Consumer, topic: str,
                timeout_s: float) -> dict[int, tuple[int, int]]:
    out: dict[int, tuple[int, int]] = {}
    for p in _partitions(consumer, topic, timeout_s):
        lo, hi = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)
        out[p] = (int(lo), int(hi))
    return out


#: Group-coordinator errors that pass (a broker just started, a coordinator moving).
_COORDINATOR_BUSY = frozenset({KafkaError.NOT_COORDINATOR,
                               KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                               KafkaError.COORDINATOR_NOT_AVAILABLE})


def _committed(consumer: Consumer, tps: list[TopicPartition],
               timeout_s: float) -> list[TopicPartition]:
    """consumer.committed(tps), retried while the group coordinator is busy (it answers
    NOT_COORDINATOR while it loads the offsets topic, e.g. right after a broker start)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            got: list[TopicPartition] = consumer.committed(
                tps, timeout=max(1.0, deadline - time.monotonic()))
            return got
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if (not isinstance(err, KafkaError) or err.code() not in _COORDINATOR_BUSY
                    or time.monotonic() > deadline):
                raise
            time.sleep(0.2)


def committed_offsets(conf: Mapping[str, str], group_id: str, topic: str,
                      timeout_s: float = _DEFAULT_TIMEOUT_S) -> dict[int, int]:
    """partition -> the offset consumer group `group_id` committed on `topic` (the next
    offset it will read; 0 where it committed nothing)."""
    return snapshot_offsets(conf, group_id, topic, (), timeout_s)[0]


def snapshot_offsets(conf: Mapping[str, str], group_id: str, committed_topic: str,
                     topics: Sequence[str], timeout_s: float = _DEFAULT_TIMEOUT_S,
                     ) -> tuple[dict[int, int], list[dict[int, tuple[int, int]]]]:
    """With one client and in this order: the offsets group `group_id` committed on
    `committed_topic` (partition -> next offset, 0 where none), then the (low, high)
    watermarks of each of `topics` in turn (replay's cut is defined by this order). The
    client never joins the group: it only reads the group's committed offsets."""
    consumer = Consumer(with_logger({**conf, "group.id": group_id,
                                     "enable.auto.commit": "false"}))
    try:
        got = _committed(consumer, [TopicPartition(committed_topic, p) for p in
                                    _partitions(consumer, committed_topic, timeout_s)],
                         timeout_s)
        committed = {int(tp.partition): max(0, int(tp.offset)) for tp in got}
        return committed, [_watermarks(consumer, topic, timeout_s) for topic in topics]
    finally:
        consumer.close()


def committed_offset(conf: Mapping[str, str], group_id: str, topic: str, partition: int,
                     timeout_s: float = _DEFAULT_TIMEOUT_S) -> int:
    """The offset group `group_id` committed on (topic, partition), or the partition's low
    watermark if it committed nothing (where a new group starts with offset reset earliest)."""
    full = dict(conf)
    full.update({"group.id": group_id, "enable.auto.commit": "false"})
    consumer = Consumer(with_logger(full))
    try:
        tp = _committed(consumer, [TopicPartition(topic, partition)], timeout_s)[0]
        if tp.offset is not None and tp.offset >= 0:
            return int(tp.offset)
        lo, _hi = consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                 timeout=timeout_s)
        return int(lo)
    finally:
        consumer.close()


def read_range(conf: Mapping[str, str], topic: str, partition: int, start: int, end: int,
               timeout_s: float = _DEFAULT_TIMEOUT_S) -> list[KafkaRecord]:
    """The records of (topic, partition) with start <= offset < end, in offset order."""
    if end <= start:
        return []
    consumer = reader_consumer(conf)
    out: list[KafkaRecord] = []
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        deadline = time.monotonic() + timeout_s
        while True:
            pos = consumer.position([TopicPartition(topic, partition)])[0].offset
            if (out and out[-1].offset >= end - 1) or (pos is not None and pos >= end):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic}[{partition}] {start}..{end}: timed out")
            # Never more than is left: consume() waits for num_messages or the timeout.
            left = end - (out[-1].offset + 1 if out else start)
            batch: list[Any] = consumer.consume(num_messages=max(1, min(1000, left)),
                                                timeout=0.5)
            for msg in batch:
                if msg.error() is None and start <= int(msg.offset()) < end:
                    out.append(_record(msg))
    finally:
        consumer.close()
    return out


def read_topic(conf: Mapping[str, str], topic: str, *,
               timeout_s: float = 60.0) -> dict[int, list[KafkaRecord]]:
    """Every record of `topic` up to its current end, per partition in offset order.

    Takes the high watermarks first, then reads each partition until it reaches them, so
    the result is a consistent snapshot of what was in the topic when the call began.
    """
    return dict(_read(conf, topic, timeout_s))


def iter_topic(conf: Mapping[str, str], topic: str, *,
               timeout_s: float = 60.0) -> Iterator[KafkaRecord]:
    """Like read_topic, flattened partition by partition (each in offset order)."""
    for _p, recs in _read(conf, topic, timeout_s):
        yield from recs


#: Consumer settings of the bulk reader: large fetches, a deep local queue.
_BULK_FETCH = {"fetch.max.bytes": str(64 << 20), "max.partition.fetch.bytes": str(16 << 20),
               "queued.max.messages.kbytes": str(256 << 10), "fetch.wait.max.ms": "10"}


def read_values(conf: Mapping[str, str], topic: str, marks: Mapping[int, tuple[int, int]],
                *, timeout_s: float = 60.0,
                progress: Callable[[int], None] | None = None,
                stamps: dict[int, dict[int, int]] | None = None,
                stamp_if: Callable[[bytes | None], bool] | None = None,
                ) -> dict[int, list[tuple[int, bytes | None]]]:
    """(offset, value) of every record of `topic` from the low to the high watermark given
    in `marks` (`end_offsets`, taken by the caller when its snapshot requires), per
    partition in offset order. The bulk path (replay): no KafkaRecord per message;
    `progress(records read so far)` after each batch. With `stamps`, the timestamp of
    each record whose value passes `stamp_if` goes into stamps[partition][offset]."""
    out: dict[int, list[tuple[int, bytes | None]]] = {p: [] for p in marks}
    for msg in messages(conf, topic, marks, timeout_s, progress):
        value = msg.value()
        out[msg.partition()].append((msg.offset(), value))
        if stamps is not None and (stamp_if is None or stamp_if(value)):
            stamps.setdefault(msg.partition(), {})[msg.offset()] = int(msg.timestamp()[1])
    return out


def messages(conf: Mapping[str, str], topic: str, marks: Mapping[int, tuple[int, int]],
              timeout_s: float, progress: Callable[[int], None] | None = None,
              ) -> Iterator[Any]:
    """The confluent-kafka messages of `topic` in [low, high) of `marks` per partition, in
    offset order within a partition, read in batches of up to 10,000; TimeoutError when a
    partition is incomplete after `timeout_s`."""
    todo = {p: hi for p, (lo, hi) in marks.items() if hi > lo}
    if not todo:
        return
    consumer = reader_consumer({**conf, **_BULK_FETCH})
    n = 0
    nxt = {p: marks[p][0] for p in todo}
    try:
        consumer.assign([TopicPartition(topic, p, marks[p][0]) for p in todo])
        deadline = time.monotonic() + timeout_s
        while todo:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic!r}: partitions {sorted(todo)} incomplete")
            # consume() waits until it has num_messages or the timeout passed: never ask
            # for more than is left, or the last batch always costs the whole timeout.
            left = sum(end - nxt[p] for p, end in todo.items())
            batch: list[Any] = consumer.consume(num_messages=max(1, min(10_000, left)),
                                                timeout=0.5)
            for msg in batch:
                if msg.error() is not None:
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise RuntimeError(f"reading {topic!r}: {msg.error()}")
                p = msg.partition()
                end = todo.get(p)
                off = msg.offset()
                if end is None or off >= end:
                    continue
                yield msg
                nxt[p] = off + 1
                if off + 1 >= end:
                    del todo[p]
            n += len(batch)
            if progress is not None and batch:
                progress(n)
            if batch and len(batch) == min(10_000, left):
                continue  # a full batch: the position check can wait
            for p in list(todo):  # a tail of transaction markers never reaches hi
                pos = consumer.position([TopicPartition(topic, p)])[0].offset
                if pos >= todo[p]:
                    del todo[p]
    finally:
        consumer.close()


def _record(msg: Any) -> KafkaRecord:
    """A confluent-kafka Message as a KafkaRecord."""
    hdrs = tuple((str(k), bytes(v or b"")) for k, v in (msg.headers() or []))
    return KafkaRecord(str(msg.topic()), int(msg.partition()), int(msg.offset()), msg.key(),
                       msg.value(), hdrs, int(msg.timestamp()[1]))


def _read(conf: Mapping[str, str], topic: str,
          timeout_s: float) -> list[tuple[int, list[KafkaRecord]]]:
    marks = end_offsets(conf, topic)
    out: dict[int, list[KafkaRecord]] = {p: [] for p in marks}
    for msg in messages(conf, topic, marks, timeout_s):
        out[msg.partition()].append(_record(msg))
    return sorted(out.items())


def wait_for(
    conf: Mapping[str, str],
    topic: str,
    predicate: Callable[[list[KafkaRecord]], bool],
    *,
    timeout_s: float = 60.0,
    poll_s: float = 0.5,
) -> list[KafkaRecord]:
    """Tail `topic` from the beginning until predicate(all records so far) is true.

    Returns the records seen. Raises TimeoutError at the deadline: tests use this instead
    of sleeping, so they wait exactly as long as the system needs.
    """
    consumer = reader_consumer(conf)
    seen: list[KafkaRecord] = []
    try:
        md = consumer.list_topics(topic, timeout=_DEFAULT_TIMEOUT_S)
        t = md.topics.get(topic)
        if t is None or t.error is not None:
            raise RuntimeError(f"topic {topic!r} not found")
        # OFFSET_BEGINNING = -2: assign directly, no group rebalance to wait for.
        consumer.assign([TopicPartition(topic, p, -2) for p in sorted(t.partitions)])
        deadline = time.monotonic() + timeout_s
        if predicate(seen):
            return seen
        while time.monotonic() < deadline:
            got = False
            batch: list[Any] = consumer.consume(num_messages=1000, timeout=poll_s)
            for msg in batch:
                if msg.error() is not None:
                    continue
                seen.append(_record(msg))
                got = True
            if got and predicate(seen):
                return seen
        raise TimeoutError(f"condition on {topic!r} not met after {timeout_s}s "
                           f"({len(seen)} records seen)")
    finally:
        consumer.close()
