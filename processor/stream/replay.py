"""Replay, the audit: recompute the private-count stream from the timeline topic and
compare it, record by record, with what was published.

It reads the topics and runs the very code the worker runs, `commit.BatchCommit`, over
the timeline (per partition, in offset order) on a `DictStore` with a publisher that
only collects. No Faust import here.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from processor.core.rng import KEY_FORMATS, NoiseKey
from processor.stream import kafka_io
from processor.stream.commit import BatchCommit, CollectingPublisher
from processor.stream.config import Settings, load_noise_key, load_settings
from processor.stream.logs import configure_logging
from processor.stream.operator import Operator
from processor.stream.records import Release
from processor.stream.state import DictStore

#: Timeline records per recomputed batch (the outputs do not depend on the batching).
REPLAY_BATCH = 500

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


@dataclass
class Recomputed:
    """Releases recomputed from a timeline: those of records below the settled offsets
    (which must have been published) and those of later records (which may be)."""

    settled: list[Release]
    unsettled: list[Release]
    records: int
    duplicates_dropped: int


def recompute_timeline(settings: Settings, key: NoiseKey,
                       timeline: Mapping[int, Sequence[kafka_io.KafkaRecord]],
                       settled_below: Mapping[int, int], *,
                       operator: Operator | None = None) -> Recomputed:
    """Run BatchCommit over each partition's records in offset order on one DictStore
    (with `operator`, default the registry's mechanisms); the releases of records at
    offsets >= settled_below[p] are reported apart."""
    op = operator if operator is not None else Operator(settings, key)
    return asyncio.run(_recompute(op, timeline, settled_below))


async def _recompute(operator: Operator,
                     timeline: Mapping[int, Sequence[kafka_io.KafkaRecord]],
                     settled_below: Mapping[int, int]) -> Recomputed:
    settled: list[Release] = []
    unsettled: list[Release] = []
    records = dups = 0
    commit = BatchCommit(operator, DictStore(), CollectingPublisher())
    for p in sorted(timeline):
        recs = sorted(timeline[p], key=lambda r: r.offset)
        mark = settled_below.get(p, 0)
        for part, sink in (([r for r in recs if r.offset < mark], settled),
                           ([r for r in recs if r.offset >= mark], unsettled)):
            for i in range(0, len(part), REPLAY_BATCH):
                batch = [(r.offset, r.value or b"") for r in part[i:i + REPLAY_BATCH]]
                out = await commit.commit(p, batch)
                sink.extend(out.releases)
                records += len(batch)
                dups += out.metrics["duplicates_dropped"]
    return Recomputed(settled, unsettled, records, dups)


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
    publishes a batch's releases before it commits), releases of later records may still be
    in flight. through="end": every timeline record must have been fully processed.
    Either way, everything published must equal the recomputation.
    """
    if through not in ("committed", "end"):
        raise ValueError("through must be 'committed' or 'end'")
    conf = kafka_io.base_config(settings)
    tl_topic = kafka_io.topic_name(settings, "timeline")
    timeline = kafka_io.read_topic(conf, tl_topic, timeout_s=timeout_s)
    if through == "end":
        settled = {p: 1 << 62 for p in timeline}
    else:
        settled = kafka_io.committed_offsets(conf, settings.app_id, tl_topic)
    result = recompute_timeline(settings, key, timeline, settled)
    published = [r.value for r in kafka_io.iter_topic(
        conf, kafka_io.topic_name(settings, "counts"), timeout_s=timeout_s)
        if r.value is not None]
    mine = [r.to_json() for r in result.settled]
    pending = [r.to_json() for r in result.unsettled]
    ndiff, first = compare(mine, published, pending)
    return ReplayReport(identical=ndiff == 0, recomputed=len(mine), published=len(published),
                        timeline_records=result.records,
                        duplicates_dropped=result.duplicates_dropped,
                        first_difference=first, differences=ndiff, pending=len(pending))


def main_replay(argv: Sequence[str] | None = None) -> int:
    """`python -m processor replay --config F [--key-file K]`: 0 identical, 1 different."""
    p = argparse.ArgumentParser(
        prog="python -m processor replay",
        description="Recompute the private counts from the timeline topic and compare them "
        "with the published private-count topic.")
    p.add_argument("--config", help="TOML configuration (DPC_* environment overrides apply)")
    p.add_argument("--key-file", help="noise key file (default: the configured one)")
    p.add_argument("--key-format", choices=KEY_FORMATS,
                   help="how the key file is read (default: noise_key_format, hex)")
    p.add_argument("--through", choices=("committed", "end"), default="committed",
                   help="require releases for the timeline up to the worker's committed "
                   "offsets (default) or up to its end (a stopped, fully caught-up worker)")
    args = p.parse_args(list(argv) if argv is not None else None)
    configure_logging("warning")  # the client loggers' floors (logs.py)
    try:
        settings = load_settings(args.config)
        key = load_noise_key(settings, args.key_file, args.key_format)
        report = replay(settings, key, through=args.through)
    except Exception as exc:  # the CLI reports any failure as a message, not a traceback
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    print(report.summary())
    return 0 if report.identical else 1
