"""The view's only Kafka reader: the public private-count and ledger topics, from the
beginning, then live.

`PublicFeed` runs one confluent-kafka consumer in a thread of its own. The consumer is
assigned the partitions of exactly two topics, `topics.counts` and `topics.ledger`
(`PUBLIC_ROLES`): the view never reads the input, timeline, dead-letter or changelog topics
(docs/operator-channels.md), so anyone who may read the public topics may run it. It
commits nothing (a group id of its own, auto-commit off) and joins no group: the partitions
are assigned directly.

Records are kept in arrival order with a sequence number each, so the page asks for
"everything after n" (`FeedLog.since`). librdkafka's log lines go through Python logging
(logger `confluent_kafka.view`), never straight to the terminal.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from processor.stream.kafka.kafka_io import TopicRole, broker_failure

#: The topics the view reads, by role: the public ones, and only those.
PUBLIC_ROLES: tuple[TopicRole, ...] = ("counts", "ledger")

log = logging.getLogger("processor.view")

# The release fields the page needs, with the JSON types they must have; a record without
# them (a tombstone, a foreign record) is counted as unreadable and skipped.
_RELEASE_FIELDS: Mapping[str, tuple[type, ...]] = {
    "counter": (str,), "tick": (int,), "value": (int, float), "error_bound": (int, float),
}


def release_ok(obj: object) -> bool:
    """Whether a decoded record has the release fields the page plots."""
    if type(obj) is not dict:
        return False
    return all(type(obj.get(k)) in types for k, types in _RELEASE_FIELDS.items())


def ledger_ok(obj: object) -> bool:
    """Whether a decoded record looks like a ledger entry (a counter and a mechanism)."""
    return (type(obj) is dict and type(obj.get("counter")) is str
            and type(obj.get("mechanism")) is str)


@dataclass
class FeedLog:
    """The records seen so far, per topic in arrival order (thread-safe).

    At most `cap` releases are kept: the oldest half is dropped past it, so a view left
    running for weeks keeps bounded memory; `since` then starts at the oldest kept one.
    """

    cap: int = 50_000
    releases: list[dict[str, Any]] = field(default_factory=list)
    ledger: list[dict[str, Any]] = field(default_factory=list)
    #: Sequence number of releases[0] (grows when old releases are dropped).
    release_base: int = 0
    unreadable: int = 0
    status: str = "starting"
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, topic_role: TopicRole, raw: bytes | None) -> None:
        try:
            obj = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            obj = None
        with self._lock:
            if topic_role == "counts" and release_ok(obj):
                assert isinstance(obj, dict)
                self.releases.append(obj)
                if len(self.releases) > self.cap:
                    drop = len(self.releases) // 2
                    del self.releases[:drop]
                    self.release_base += drop
            elif topic_role == "ledger" and ledger_ok(obj):
                assert isinstance(obj, dict)
                self.ledger.append(obj)
            else:
                self.unreadable += 1

    def set_status(self, status: str) -> None:
        with self._lock:
            self.status = status

    def since(self, releases_after: int, ledger_after: int,
              limit: int = 5000) -> dict[str, Any]:
        """At most `limit` releases with sequence number >= releases_after and the ledger
        entries from index ledger_after on, with the numbers to ask for next time; `more`
        says whether releases are left (a page opened on a long topic catches up in
        pages instead of one response of megabytes)."""
        with self._lock:
            start = max(0, releases_after - self.release_base)
            rel = self.releases[start:start + limit]
            led = self.ledger[max(0, ledger_after):]
            nxt = self.release_base + start + len(rel)
            return {
                "releases": rel, "releases_next": nxt,
                "more": nxt < self.release_base + len(self.releases),
                "ledger": led, "ledger_next": len(self.ledger),
                "unreadable": self.unreadable, "status": self.status,
            }


class PublicFeed:
    """Tails the public topics `topics` (role -> name) into a `FeedLog`, in a thread."""

    def __init__(self, conf: Mapping[str, str], topics: Mapping[TopicRole, str],
                 log_: FeedLog | None = None) -> None:
        unknown = set(topics) - set(PUBLIC_ROLES)
        if unknown:
            raise ValueError(f"the view reads public topics only, not {sorted(unknown)}")
        self.conf = dict(conf)
        self.topics = dict(topics)
        self.log = log_ if log_ is not None else FeedLog()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="view-feed", daemon=True)

    def start(self) -> PublicFeed:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _consumer(self) -> Any:
        from confluent_kafka import Consumer

        full: dict[str, Any] = dict(self.conf)
        full.update({
            "group.id": f"dpc-view-{uuid.uuid4().hex}",
            "enable.auto.commit": "false",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            # Through Python logging: never a raw `%3|...|FAIL|` line on the terminal.
            "logger": logging.getLogger("confluent_kafka.view"),
        })
        return Consumer(full)

    def _assign(self, consumer: Any) -> dict[str, TopicRole] | None:
        """Assign every partition of both topics at their beginning; None while one of
        them does not exist yet (the worker creates them)."""
        from confluent_kafka import TopicPartition

        tps = []
        for name in self.topics.values():
            md = consumer.list_topics(name, timeout=5.0)
            t = md.topics.get(name)
            if t is None or t.error is not None or not t.partitions:
                return None
            tps += [TopicPartition(name, p, -2) for p in sorted(t.partitions)]  # -2: beginning
        consumer.assign(tps)
        return {name: role for role, name in self.topics.items()}

    def _run(self) -> None:
        try:
            consumer = self._consumer()
        except Exception as exc:
            self.log.set_status(f"error: {exc}")
            log.error("view: cannot create the Kafka consumer: %s", exc)
            return
        try:
            roles: dict[str, TopicRole] | None = None
            while not self._stop.is_set() and roles is None:
                try:
                    roles = self._assign(consumer)
                    if roles is None:
                        self.log.set_status("waiting for the topics "
                                            + ", ".join(self.topics.values()))
                except Exception as exc:  # broker not reachable (any more): keep trying
                    # One readable line, never librdkafka's raw KafkaError{code=...} repr.
                    why = broker_failure(self.conf, exc)
                    self.log.set_status(f"waiting: {why}")
                    log.warning("view: waiting: %s", why)
                if roles is None:
                    self._stop.wait(1.0)
            if roles is not None:
                self.log.set_status("live")
            while not self._stop.is_set() and roles is not None:
                batch: list[Any] = consumer.consume(num_messages=500, timeout=0.25)
                for msg in batch:
                    if msg.error() is not None:
                        continue
                    role = roles.get(str(msg.topic()))
                    if role is not None:
                        self.log.add(role, msg.value())
        finally:
            t0 = time.monotonic()
            consumer.close()
            log.debug("view: consumer closed in %.2fs", time.monotonic() - t0)
