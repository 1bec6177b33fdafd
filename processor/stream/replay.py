"""Replay: recompute the private-count stream from the timeline topic and compare it,
record by record, with what was published.

Also home of the pure pieces the Faust worker shares with replay, so both run the very
same code on a timeline record: `TimelineApplier` (duplicate-event filter + Operator) and
`BufferedStore` (state writes held back until the releases are acknowledged).
No Faust import here.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from processor.core.rng import NoiseKey
from processor.stream import kafka_io
from processor.stream.config import Settings, load_settings
from processor.stream.operator import DictStore, LedgerEntry, Operator, Release, StateStore
from processor.stream.records import ValidEvent, encode_marker, partition_for

#: Store key prefix of the duplicate filter: per timeline partition, input partition -> the
#: highest input offset already applied.
DEDUP_PREFIX = "d/"


# --- timeline record helpers (format fixed by the shared stream design) -----------------

def partition_of(counter: str, partitions: int) -> int:
    """The timeline partition of `counter` (the shared records.partition_for)."""
    return partition_for(counter, partitions)


def timeline_event_bytes(event: ValidEvent) -> bytes:
    """Encode a validated event as a timeline event record."""
    return event.to_timeline()


def encode_marker_record(n: int) -> bytes:
    """Encode the marker 'sealed through global tick n'."""
    return encode_marker(n)


def encode_source(partition: int, offset: int) -> bytes:
    """The source header value of a timeline event: its input partition and offset."""
    return f"{int(partition)}:{int(offset)}".encode("ascii")


def decode_source(raw: bytes) -> tuple[int, int] | None:
    """Inverse of encode_source; None for a malformed header (treated as no header)."""
    try:
        p, o = raw.decode("ascii").split(":")
        return int(p), int(o)
    except (UnicodeDecodeError, ValueError):
        return None


def load_noise_key(settings: Settings) -> NoiseKey:
    """The noise key named by the configuration (file)."""
    path = getattr(settings, "noise_key_file", None)
    if not path:
        from processor.core.errors import NoiseKeyError

        raise NoiseKeyError("no noise key configured (noise_key_file / DPC_NOISE_KEY_FILE)")
    return NoiseKey.from_file(path)


# --- the shared apply path -------------------------------------------------------------

class BufferedStore:
    """A StateStore overlay that holds writes until `flush()`.

    The worker sends a record's releases and waits for the broker to acknowledge them
    before it flushes, so a crash can never leave state saying "applied" while a release
    is missing. Flush keeps the operator's own write order (it orders its writes for crash
    safety: e.g. the due index before the counter for an event, the counters before the
    partition for a marker) and writes the duplicate filter (`d/...`) last, so a filter
    entry never exists for an event whose counter state did not reach the changelog.
    """

    def __init__(self, inner: StateStore) -> None:
        self._inner = inner
        self._pending: dict[str, bytes] = {}

    def get(self, key: str) -> bytes | None:
        if key in self._pending:
            return self._pending[key]
        return self._inner.get(key)

    def set(self, key: str, value: bytes) -> None:
        # Re-setting a key moves it to the end: the last write decides its position.
        self._pending.pop(key, None)
        self._pending[key] = value

    def flush(self) -> None:
        last = [k for k in self._pending if k.startswith(DEDUP_PREFIX)]
        for k, v in self._pending.items():
            if not k.startswith(DEDUP_PREFIX):
                self._inner.set(k, v)
        for k in last:
            self._inner.set(k, self._pending[k])
        self._pending.clear()


@dataclass
class ApplyResult:
    """What applying one timeline record produced."""

    releases: list[Release] = field(default_factory=list)
    ledger: list[LedgerEntry] = field(default_factory=list)
    metrics: dict[str, int] = field(default_factory=dict)
    duplicate: bool = False


class TimelineApplier:
    """Operator.apply behind a filter for duplicate timeline events.

    At-least-once ingest re-sends events after a crash; each timeline event carries its
    input (partition, offset). Ingest forwards an input partition in order, so within one
    timeline partition the input offsets of one input partition only increase, except for
    re-sent duplicates: an event whose input offset is at or below the highest already seen
    is a duplicate and is dropped.
    """

    def __init__(self, operator: Operator) -> None:
        self.operator = operator

    def apply(self, store: StateStore, partition: int, offset: int, record: bytes,
              source: bytes | None) -> ApplyResult:
        src = decode_source(source) if source is not None else None
        dkey = f"{DEDUP_PREFIX}{partition}"
        seen: dict[str, int] | None = None
        if src is not None:
            raw = store.get(dkey)
            seen = orjson.loads(raw) if raw else {}
            assert seen is not None
            if src[1] <= int(seen.get(str(src[0]), -1)):
                return ApplyResult(duplicate=True)
        out = self.operator.apply(store, partition, offset, record)
        if src is not None and seen is not None:
            seen[str(src[0])] = src[1]
            store.set(dkey, orjson.dumps(seen))
        return ApplyResult(releases=list(out.releases), ledger=list(out.ledger),
                           metrics=dict(out.metrics))


# --- replay ----------------------------------------------------------------------------

ReleaseKey = tuple[str, int, str]


@dataclass
class ReplayReport:
    """Outcome of a replay: identical, or the first difference in (counter, tick, kind) order."""

    identical: bool
    recomputed: int
    published: int
    timeline_records: int
    duplicates_dropped: int
    first_difference: str | None = None
    differences: int = 0
    #: Recomputed releases of timeline records the worker has not committed yet.
    pending: int = 0

    def summary(self) -> str:
        if self.identical:
            return (f"identical: {self.recomputed} releases recomputed from "
                    f"{self.timeline_records} timeline records match {self.published} "
                    f"published ({self.pending} more not yet due: timeline records the "
                    f"worker has not committed)")
        return (f"DIFFERENT ({self.differences} differences; recomputed {self.recomputed}, "
                f"published {self.published}): first: {self.first_difference}")


def recompute(settings: Settings, key: NoiseKey,
              timeline: Mapping[int, Sequence[kafka_io.KafkaRecord]],
              settled_below: Mapping[int, int] | None = None,
              ) -> tuple[list[Release], int, int]:
    """Run the operator over timeline records (per partition, offset order) on a DictStore.

    Returns (releases, records applied, duplicates dropped). With `settled_below`, the
    releases of records at or beyond `settled_below[p]` are left out (see `replay`).
    """
    full, n, dups = _recompute(settings, key, timeline)
    if settled_below is None:
        return [r for r, _p, _o in full], n, dups
    return [r for r, p, o in full if o < settled_below.get(p, 0)], n, dups


def _recompute(settings: Settings, key: NoiseKey,
               timeline: Mapping[int, Sequence[kafka_io.KafkaRecord]]
               ) -> tuple[list[tuple[Release, int, int]], int, int]:
    applier = TimelineApplier(Operator(settings, key))
    store = DictStore()
    releases: list[tuple[Release, int, int]] = []
    n = dups = 0
    for p in sorted(timeline):
        for rec in sorted(timeline[p], key=lambda r: r.offset):
            res = applier.apply(store, p, rec.offset, rec.value or b"",
                                rec.header(kafka_io.SOURCE_HEADER))
            n += 1
            dups += int(res.duplicate)
            releases.extend((r, p, rec.offset) for r in res.releases)
    return releases, n, dups


def _release_key(d: Mapping[str, Any]) -> ReleaseKey:
    return (str(d.get("counter")), int(d.get("tick", -1)), str(d.get("kind")))


def compare(recomputed: Iterable[bytes], published: Iterable[bytes],
            pending: Iterable[bytes] = ()) -> tuple[int, str | None]:
    """Compare two streams of release JSON records by (counter, tick, kind).

    Identical re-sends of a record (after a crash) count once; two different records for
    the same (counter, tick, kind) are a difference. `pending` are recomputed records the
    worker may not have published yet (from timeline records it has not committed): they
    must match if published, and may be missing. Returns (number of differences, a
    description of the first one in key order).
    """
    diffs: dict[ReleaseKey, str] = {}
    mine: dict[ReleaseKey, bytes] = {}
    for raw in recomputed:
        d = orjson.loads(raw)
        k = _release_key(d)
        if k in mine and mine[k] != raw:
            diffs[k] = f"{k}: replay itself produced two different records"
        mine[k] = raw
    optional: dict[ReleaseKey, bytes] = {}
    for raw in pending:
        k = _release_key(orjson.loads(raw))
        if k not in mine:
            optional[k] = raw
    theirs: dict[ReleaseKey, bytes] = {}
    for raw in published:
        try:
            d = orjson.loads(raw)
        except orjson.JSONDecodeError:
            diffs[("", -1, "")] = "a published record is not JSON"
            continue
        k = _release_key(d)
        if k in theirs and theirs[k] != raw:
            diffs[k] = f"{k}: published twice with different contents"
        theirs[k] = raw
    for k in mine.keys() | theirs.keys():
        if k in diffs:
            continue
        a, b = mine.get(k), theirs.get(k)
        if a is None and b is not None and k in optional:
            a = optional[k]
        if a == b:
            continue
        if a is None:
            diffs[k] = f"{k}: published but not recomputed"
        elif b is None:
            diffs[k] = f"{k}: recomputed but not published"
        else:
            da, db = orjson.loads(a), orjson.loads(b)
            fields = sorted(f for f in da.keys() | db.keys() if da.get(f) != db.get(f))
            detail = ", ".join(f"{f}: replay={da.get(f)!r} published={db.get(f)!r}"
                               for f in fields)
            diffs[k] = f"{k}: {detail or 'byte encoding differs'}"
    if not diffs:
        return 0, None
    first = min(diffs, key=lambda k: (k[0], k[1], k[2]))
    return len(diffs), diffs[first]


def replay(settings: Settings, key: NoiseKey, *, timeout_s: float = 120.0,
           through: str = "committed") -> ReplayReport:
    """Read the timeline and private-count topics and compare record by record.

    through="committed": the worker's consumer group (the app id) has committed offsets on
    the timeline; every release of a record below them must have been published (the worker
    flushes its releases before it commits), releases of later records may still be in
    flight. through="end": every timeline record must have been fully processed.
    Either way, everything published must equal the recomputation.
    """
    conf = kafka_io.base_config(settings)
    tl_topic = kafka_io.topic_name(settings, "timeline")
    timeline = kafka_io.read_topic(conf, tl_topic, timeout_s=timeout_s)
    full, n, dups = _recompute(settings, key, timeline)
    if through == "end":
        settled = {p: 1 << 62 for p in timeline}
    elif through == "committed":
        settled = kafka_io.committed_offsets(conf, settings.app_id, tl_topic)
    else:
        raise ValueError("through must be 'committed' or 'end'")
    published = [r.value for r in kafka_io.iter_topic(
        conf, kafka_io.topic_name(settings, "counts"), timeout_s=timeout_s)
        if r.value is not None]
    mine = [r.to_json() for r, p, o in full if o < settled.get(p, 0)]
    pending = [r.to_json() for r, p, o in full if o >= settled.get(p, 0)]
    ndiff, first = compare(mine, published, pending)
    return ReplayReport(identical=ndiff == 0, recomputed=len(mine), published=len(published),
                        timeline_records=n, duplicates_dropped=dups,
                        first_difference=first, differences=ndiff, pending=len(pending))


def main_replay(argv: Sequence[str] | None = None) -> int:
    """`python -m processor replay --config F [--key-file K]`: 0 identical, 1 different."""
    p = argparse.ArgumentParser(
        prog="python -m processor replay",
        description="Recompute the private counts from the timeline topic and compare them "
        "with the published private-count topic.")
    p.add_argument("--config", help="TOML configuration (DPC_* environment overrides apply)")
    p.add_argument("--key-file", help="noise key file (default: the configured one)")
    p.add_argument("--through", choices=("committed", "end"), default="committed",
                   help="require releases for the timeline up to the worker's committed "
                   "offsets (default) or up to its end (a stopped, fully caught-up worker)")
    args = p.parse_args(list(argv) if argv is not None else None)
    try:
        settings = load_settings(args.config)
        key = NoiseKey.from_file(args.key_file) if args.key_file else load_noise_key(settings)
        report = replay(settings, key, through=args.through)
    except Exception as exc:  # the CLI reports any failure as a message, not a traceback
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    print(report.summary())
    return 0 if report.identical else 1
