"""A subscriber to the private-count topic of dp-stream-counts, in Python (confluent-kafka):
it keeps the current private value of every counter, following the contract of
docs/downstream.md.

- Every record must carry `schema_version` >= 1 (this program knows version 1; later
  versions only add fields, which it ignores). A record without one is rejected.
- Records are idempotent by (counter, tick) and may be re-sent after a crash: a counter's
  current value is that of its record with the LARGEST tick, never simply the last one to
  arrive. y_t at any tick t is the value of the largest tick <= t (`Subscriber.y_at`).
- Counters may appear while it runs: a key of an open family (a counter named
  `family[key]`) is published from its admission tick on, its first record carrying its
  whole count; before that tick its y is not published (not 0).

Run (needs only `pip install confluent-kafka`):
    python examples/python/subscriber.py --bootstrap-servers localhost:9092 \\
        --topic dpc-private-counts [--until-end]
Without --until-end it follows the topic and prints one line per new value; with it, it
reads up to the end the topic had at the start and prints one JSON summary:
    {"records": N, "rejected": M, "counters": {"name": {"tick": t, "value": y,
     "error_bound": b, "beta": beta}, ...}}
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

#: The schema version this program was written for (schemas/private-count.schema.json).
KNOWN_VERSION = 1
#: Kafka's "from the beginning of the partition" offset.
OFFSET_BEGINNING = -2


def open_key(counter: str) -> bool:
    """Whether `counter` is a key of an open family, `family[key]` (a declared counter's
    name has no '[')."""
    return "[" in counter and counter.endswith("]")


@dataclass
class Current:
    """A counter's newest release: y at `tick`, its error bound and that bound's beta."""

    tick: int
    value: float
    error_bound: float
    beta: float


@dataclass
class Subscriber:
    """The state a subscriber keeps: per counter its newest release, and (to answer y_t
    at any tick) the ticks and values of its change and heartbeat records."""

    current: dict[str, Current] = field(default_factory=dict)
    history: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    records: int = 0
    rejected: int = 0

    def apply(self, value: bytes | None,
              headers: Iterable[tuple[str, str | bytes | None]] | None) -> Current | None:
        """One record of the topic; the counter's new state, or None if nothing changed."""
        self.records += 1
        for name, raw in headers or ():
            # The schema header names the record's schema and version: private-count/1.
            text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw or ""
            if name == "schema" and not text.startswith("private-count/"):
                return self._reject("not a private-count record")
        try:
            doc: Any = json.loads(value or b"")
        except ValueError:
            return self._reject("not JSON")
        if not isinstance(doc, dict):
            return self._reject("not a JSON object")
        version = doc.get("schema_version")
        if type(version) is not int or version < KNOWN_VERSION:
            return self._reject(f"no schema_version >= {KNOWN_VERSION}")
        counter, tick, y = doc.get("counter"), doc.get("tick"), doc.get("value")
        if (not isinstance(counter, str) or isinstance(tick, bool)
                or not isinstance(tick, int) or isinstance(y, bool)
                or not isinstance(y, int | float)):
            return self._reject("missing counter, tick or value")
        ticks = self.history.setdefault(counter, [])
        i = bisect.bisect_left(ticks, (tick,))
        if i == len(ticks) or ticks[i][0] != tick:
            ticks.insert(i, (tick, float(y)))
        seen = self.current.get(counter)
        if seen is not None and seen.tick >= tick:
            return None  # a re-send or an older tick: the current value stands
        now = Current(tick, float(y), float(doc.get("error_bound") or 0.0),
                      float(doc.get("beta") or 0.0))
        self.current[counter] = now
        return now

    def y_at(self, counter: str, t: int) -> float | None:
        """y_t of `counter`: the value of its record with the largest tick <= t (0 before
        its first record: y starts at 0; but None for an open family's key, whose y is
        not published before its admission); None for a tick beyond the newest record,
        which the stream may not have sealed yet."""
        ticks = self.history.get(counter, [])
        if ticks and t > ticks[-1][0]:
            return None
        i = bisect.bisect_right(ticks, (t, float("inf")))
        if i:
            return ticks[i - 1][1]
        return None if open_key(counter) else 0.0

    def summary(self) -> dict[str, Any]:
        return {"records": self.records, "rejected": self.rejected,
                "counters": {c: asdict(v) for c, v in sorted(self.current.items())}}

    def _reject(self, why: str) -> Current | None:
        self.rejected += 1
        print(f"rejected a record: {why}", file=sys.stderr)
        return None


def run(bootstrap: str, topic: str, until_end: bool) -> Subscriber:
    """Read `topic` from the beginning of every partition (no consumer group: the whole
    topic is the history of y); until its end at the start if `until_end`, else forever."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused",
                         "enable.auto.commit": False})
    sub = Subscriber()
    try:
        meta = consumer.list_topics(topic, timeout=30).topics.get(topic)
        if meta is None or meta.error is not None:
            raise KafkaException(f"topic {topic!r} not found")
        parts = sorted(meta.partitions)
        end = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
               for p in parts}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        todo = {p for p in parts if end[p] > 0}
        while not until_end or todo:
            for msg in consumer.consume(num_messages=500, timeout=0.5):
                if msg.error() is not None:
                    continue
                hdrs = msg.headers()
                now = sub.apply(msg.value(), hdrs if isinstance(hdrs, list) else None)
                if now is not None and not until_end:
                    key = (msg.key() or b"").decode("utf-8", "replace")
                    print(f"{key} tick {now.tick}: {now.value} +- {now.error_bound} "
                          f"(beta {now.beta})", flush=True)
                partition, offset = msg.partition() or 0, msg.offset() or 0
                if offset + 1 >= end.get(partition, 0):
                    todo.discard(partition)
    finally:
        consumer.close()
    return sub


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Keep the current private value per counter.")
    p.add_argument("--bootstrap-servers", default="localhost:9092")
    p.add_argument("--topic", default="dpc-private-counts")
    p.add_argument("--until-end", action="store_true",
                   help="stop at the topic's end (as it was at the start); print a summary")
    args = p.parse_args(argv)
    sub = run(args.bootstrap_servers, args.topic, args.until_end)
    print(json.dumps(sub.summary()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
