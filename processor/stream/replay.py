"""Replay, the audit: recompute the private-count and ledger streams from the timeline
topic and compare them, record by record, with what was published.

It runs the very code the worker runs, `commit.BatchCommit`, over the timeline (per
partition, in offset order) on a `DictStore` with a publisher that only collects. No
Faust import here. docs/replay.md is the auditor's guide; the cut below is its contract.

The cut (what must have been published, on a live system or after any stop)
--------------------------------------------------------------------------
Replay takes three snapshots, in this order: (1) the offsets C_p the worker's consumer
group (the app id) committed on each timeline partition p; (2) the high watermarks of
the private-count and ledger topics (it reads them up to there); (3) the high watermarks
E_p of the timeline (it recomputes every record below them). The order matters: the
worker publishes a batch's records, awaits every ack, and only later commits its offset,
so whatever C_p covers is in snapshot (2); and whatever snapshot (2) holds came from
timeline records that exist in snapshot (3).

A recomputed release of counter c at tick t, from the timeline record at (p, o), is DUE
(it must be published, byte for byte) when

  - o < C_p (its record is committed), or
  - t <= T_c, the highest tick of c's releases in the published snapshot: one counter's
    releases go to one partition, in tick order, each batch's after the previous batch's
    acks, so the published releases of a counter are always a prefix of its recomputed
    ones (a re-executed batch re-sends identical records).

A recomputed ledger entry is due when its record is committed (o < C_p): ledger entries
and releases go to different topics, whose acks are not ordered.

Everything else recomputed is PENDING: not yet due (a backlog the worker has not applied,
a marker appended during a clean shutdown and never applied, a batch cut short by a kill
-9). Pending records are counted in the verdict, never flagged.

One case lets a committed offset run ahead of what was published: around a rebalance Faust
may commit past records it skipped, which the worker re-reads (app.GapGuard) and applies
at its next record. So a due record missing from the snapshot gets a grace period
(`settle_s`, default 5 s): if it arrives identical meanwhile it is no difference.

A DIFFERENCE is any of: a due record not published ("missing"); a published record that
replay does not recompute ("unexpected", e.g. a forged ledger entry); a published record
whose bytes differ from the recomputed one ("different", e.g. a tampered value); one
(counter, tick, kind) or ledger key published with two different contents
("conflicting"); a published value that is not a release or ledger record ("malformed").
Identical re-sends (after a crash) count once.

Replay is inconclusive (ReplayError, exit 2) when the timeline no longer starts at offset
0 (retention deleted its beginning: nothing can be recomputed from there). The private-count
topic must be retained at least as long as the timeline: a release deleted by retention is
missing.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import orjson
from confluent_kafka import KafkaException

from processor.core.rng import KEY_FORMATS, NoiseKey
from processor.stream import kafka_io
from processor.stream.commit import BatchCommit, CollectingPublisher
from processor.stream.config import Settings, load_noise_key, load_settings
from processor.stream.logs import configure_logging
from processor.stream.operator import Operator
from processor.stream.records import LedgerEntry, Release
from processor.stream.state import DictStore

#: Timeline records per recomputed batch. The outputs do not depend on the batching; the
#: cost does: state is written once per batch, but a marker walks the due ticks consumed
#: earlier in its batch (they are deleted at the commit), which grows with the batch.
REPLAY_BATCH: Final = 128
#: How many differences a report describes (all are counted).
DESCRIBED: Final = 5
#: The cut in one sentence (the JSON verdict carries it; the module docstring explains it).
CUT_DEFINITION: Final = (
    "a recomputed release is due when its timeline record is below the worker's committed "
    "offset or its tick is at most the highest published tick of its counter; a recomputed "
    "ledger entry is due when its record is committed; published records must all be "
    "recomputed, byte for byte; what is not due is pending (counted, not flagged)")

#: (counter, tick, kind) of a release; (counter, creation, fingerprint) of a ledger entry.
RecordKey = tuple[str, int | str, str]
#: Called with (stage, done, total) while replay reads and recomputes.
Progress = Callable[[str, int, int], None]


class ReplayError(RuntimeError):
    """Replay cannot reach a verdict (exit 2): the brokers do not answer or refuse this
    client, a topic does not exist, or the timeline no longer starts at offset 0."""


@dataclass(frozen=True)
class Difference:
    """One difference: which topic, which record, what is wrong."""

    topic: str  # "counts" (the private-count topic) or "ledger"
    key: RecordKey
    problem: str  # missing, unexpected, different, conflicting, malformed
    detail: str

    def describe(self) -> str:
        return f"{self.topic} {self.key}: {self.problem}: {self.detail}"

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "key": list(self.key), "problem": self.problem,
                "detail": self.detail}


@dataclass
class Tally:
    """Record counts of one public topic: recomputed (distinct keys), committed (those of
    committed timeline records), due, published (distinct keys in the snapshot), pending
    (recomputed, not due, not published)."""

    recomputed: int = 0
    committed: int = 0
    due: int = 0
    published: int = 0
    pending: int = 0


@dataclass
class ReplayReport:
    """The verdict: identical iff no difference; the cut per timeline partition."""

    timeline_records: int
    duplicates_dropped: int
    releases: Tally
    ledger: Tally
    #: timeline partition -> (committed offset C_p, end E_p) of the cut.
    cut: dict[int, tuple[int, int]]
    differences: list[Difference] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not self.differences

    @property
    def recomputed(self) -> int:
        """Releases recomputed from committed timeline records (all published)."""
        return self.releases.committed

    def summary(self) -> str:
        r, g = self.releases, self.ledger
        counts = (f"releases: {r.published} published, {r.due} due, {r.pending} pending; "
                  f"ledger entries: {g.published} published, {g.due} due, {g.pending} pending; "
                  f"{self.timeline_records} timeline records")
        if self.identical:
            return f"identical ({counts})"
        first = "; ".join(d.describe() for d in self.differences[:DESCRIBED])
        return f"DIFFERENT ({len(self.differences)} differences; {counts}): first: {first}"

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": "identical" if self.identical else "different",
            "identical": self.identical,
            "cut": {"definition": CUT_DEFINITION,
                    "timeline": {str(p): {"committed": c, "end": e}
                                 for p, (c, e) in sorted(self.cut.items())}},
            "counts": {"timeline_records": self.timeline_records,
                       "duplicates_dropped": self.duplicates_dropped,
                       "releases": vars(self.releases), "ledger": vars(self.ledger)},
            "differences": {"total": len(self.differences),
                            "first": [d.to_json() for d in self.differences[:DESCRIBED]]},
        }


@dataclass
class Recomputed:
    """What the timeline recomputes to: releases and ledger entries of records below the
    committed offsets (settled) and of later records (unsettled)."""

    settled: list[Release]
    unsettled: list[Release]
    settled_ledger: list[LedgerEntry]
    unsettled_ledger: list[LedgerEntry]
    records: int
    duplicates_dropped: int


TimelinePart = Sequence[tuple[int, bytes | None]]


def recompute_timeline(settings: Settings, key: NoiseKey,
                       timeline: Mapping[int, TimelinePart],
                       settled_below: Mapping[int, int], *,
                       operator: Operator | None = None,
                       progress: Progress | None = None, jobs: int = 1) -> Recomputed:
    """Run BatchCommit over each partition's (offset, value) records in offset order on a
    DictStore (with `operator`, default the registry's mechanisms); what records at
    offsets >= settled_below[p] produce is reported apart.

    With jobs > 1 (no `operator` given, and no other thread running) the partitions are
    recomputed in that many forked processes, each with its own Operator and store. The
    result is the same: a counter lives in one partition (`records.partition_for`; a
    record of another partition's counter is skipped), every state key belongs to one
    partition, so the partitions never share state; the results are merged in partition
    order."""
    # Fork only from a single-threaded process: a lock another thread holds at the fork
    # would stay held in the child forever.
    if operator is None and jobs > 1 and len(timeline) > 1 and single_threaded():
        return _recompute_parallel(settings, key, timeline, settled_below, progress, jobs)
    op = operator if operator is not None else Operator(settings, key)
    return asyncio.run(_recompute(op, timeline, settled_below, progress))


def single_threaded() -> bool:
    """Whether forking is safe: one Python thread and no librdkafka thread. Python's
    thread count misses librdkafka's native threads (a live Kafka client has several,
    named "rdk:..."): a fork next to them hung a child forever on a lock one of them held.
    Linux names every thread in /proc/self/task/*/comm; elsewhere the answer is no
    (recompute in this process). Numerical libraries' worker threads are fork-safe."""
    if threading.active_count() != 1:
        return False
    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/comm", encoding="utf-8",
                      errors="replace") as f:
                if f.read().startswith("rdk:"):
                    return False
    except OSError:
        return False
    return True


async def _recompute(operator: Operator, timeline: Mapping[int, TimelinePart],
                     settled_below: Mapping[int, int],
                     progress: Progress | None) -> Recomputed:
    settled = CollectingPublisher()
    unsettled = CollectingPublisher()
    total = sum(len(v) for v in timeline.values())
    records = dups = 0
    store = DictStore()
    for p in sorted(timeline):
        recs = sorted(timeline[p])
        mark = settled_below.get(p, 0)
        split = next((i for i, (off, _v) in enumerate(recs) if off >= mark), len(recs))
        for part, sink in ((recs[:split], settled), (recs[split:], unsettled)):
            commit = BatchCommit(operator, store, sink)
            for i in range(0, len(part), REPLAY_BATCH):
                batch = [(off, v or b"") for off, v in part[i:i + REPLAY_BATCH]]
                out = await commit.commit(p, batch)
                records += len(batch)
                dups += out.metrics["duplicates_dropped"]
                if progress is not None:
                    progress("recomputed", records, total)
    return Recomputed(settled.releases, unsettled.releases, settled.ledger,
                      unsettled.ledger, records, dups)


#: The job of the forked recomputation processes (set before the fork, read after it:
#: the timeline is inherited, never pickled).
_JOB: tuple[Settings, NoiseKey, Mapping[int, TimelinePart], Mapping[int, int]] | None = None


def _recompute_partition(partition: int) -> Recomputed:
    assert _JOB is not None
    settings, key, timeline, settled_below = _JOB
    return asyncio.run(_recompute(Operator(settings, key), {partition: timeline[partition]},
                                  settled_below, None))


def _recompute_parallel(settings: Settings, key: NoiseKey,
                        timeline: Mapping[int, TimelinePart],
                        settled_below: Mapping[int, int], progress: Progress | None,
                        jobs: int) -> Recomputed:
    global _JOB
    total = sum(len(v) for v in timeline.values())
    # Largest partitions first, so no process is left with a big one at the end.
    order = sorted(timeline, key=lambda p: -len(timeline[p]))
    parts: dict[int, Recomputed] = {}
    _JOB = (settings, key, timeline, settled_below)
    try:
        with multiprocessing.get_context("fork").Pool(min(jobs, len(order))) as pool:
            for p, got in zip(order, pool.imap(_recompute_partition, order), strict=True):
                parts[p] = got
                if progress is not None:
                    progress("recomputed", sum(r.records for r in parts.values()), total)
    finally:
        _JOB = None
    merged = Recomputed([], [], [], [], 0, 0)
    for p in sorted(parts):
        r = parts[p]
        merged.settled += r.settled
        merged.unsettled += r.unsettled
        merged.settled_ledger += r.settled_ledger
        merged.unsettled_ledger += r.unsettled_ledger
        merged.records += r.records
        merged.duplicates_dropped += r.duplicates_dropped
    return merged


def _published(values: Iterable[bytes | None], topic: str, key_of: Callable[[Any], RecordKey],
               diffs: list[Difference]) -> dict[RecordKey, bytes]:
    """Published values by key; malformed and conflicting ones become differences."""
    theirs: dict[RecordKey, bytes] = {}
    conflicting: set[RecordKey] = set()
    for raw in values:
        if raw is None:
            diffs.append(Difference(topic, ("", -1, ""), "malformed", "a tombstone"))
            continue
        try:
            k = key_of(orjson.loads(raw))
        except (orjson.JSONDecodeError, TypeError, ValueError, AttributeError, KeyError):
            diffs.append(Difference(topic, ("", -1, ""), "malformed",
                                    f"not a {topic} record ({len(raw)} bytes)"))
            continue
        seen = theirs.get(k)
        if seen is None:
            theirs[k] = raw
        elif seen != raw and k not in conflicting:
            conflicting.add(k)
            diffs.append(Difference(topic, k, "conflicting",
                                    "published twice with different contents"))
    return theirs


def _release_key(d: Any) -> RecordKey:
    return (str(d["counter"]), int(d["tick"]), str(d["kind"]))


def _ledger_key(d: Any) -> RecordKey:
    return (str(d["counter"]), str(d.get("creation", "")), str(d.get("fingerprint", "")))


def _field_detail(mine: bytes, theirs: bytes) -> str:
    a, b = orjson.loads(mine), orjson.loads(theirs)
    fields = sorted(f for f in a.keys() | b.keys() if a.get(f) != b.get(f))
    return ", ".join(f"{f}: replay={a.get(f)!r} published={b.get(f)!r}"
                     for f in fields) or "byte encoding differs"


def _check(topic: str, mine: Mapping[RecordKey, bytes], committed: Collection[RecordKey],
           due: Callable[[RecordKey], bool], theirs: Mapping[RecordKey, bytes],
           diffs: list[Difference]) -> Tally:
    """Compare one topic: every published record recomputed byte for byte, every due
    recomputed record published."""
    tally = Tally(recomputed=len(mine), committed=len(committed), published=len(theirs))
    for k, raw in theirs.items():
        expected = mine.get(k)
        if expected is None:
            diffs.append(Difference(topic, k, "unexpected", "published but not recomputed"))
        elif expected != raw:
            diffs.append(Difference(topic, k, "different", _field_detail(expected, raw)))
    for k in mine:
        if due(k):
            tally.due += 1
            if k not in theirs:
                diffs.append(Difference(topic, k, "missing", "due but not published"))
        elif k not in theirs:
            tally.pending += 1
    return tally


def compare(result: Recomputed, published: Iterable[bytes | None],
            ledger: Iterable[bytes | None]) -> tuple[Tally, Tally, list[Difference]]:
    """Compare a recomputation with the published snapshots under the cut (module doc).
    Returns the release and ledger tallies and every difference, sorted by topic, key."""
    diffs: list[Difference] = []
    mine, settled = _recomputed(
        "counts", [((r.counter, r.tick, r.kind), r.to_json()) for r in result.settled],
        [((r.counter, r.tick, r.kind), r.to_json()) for r in result.unsettled], diffs)
    theirs = _published(published, "counts", _release_key, diffs)
    covered: dict[str, int] = {}  # T_c: the highest published tick of each counter
    for c, t, _kind in theirs:
        if isinstance(t, int) and t > covered.get(c, -1):
            covered[c] = t

    def release_due(k: RecordKey) -> bool:
        t = k[1]
        return k in settled or (isinstance(t, int) and t <= covered.get(k[0], -1))

    releases = _check("counts", mine, settled, release_due, theirs, diffs)

    mine_ledger, settled_ledger = _recomputed(
        "ledger",
        [((e.counter, e.creation, e.fingerprint), e.to_json()) for e in result.settled_ledger],
        [((e.counter, e.creation, e.fingerprint), e.to_json())
         for e in result.unsettled_ledger], diffs)
    theirs_ledger = _published(ledger, "ledger", _ledger_key, diffs)
    entries_tally = _check("ledger", mine_ledger, settled_ledger, settled_ledger.__contains__,
                           theirs_ledger, diffs)
    diffs.sort(key=_diff_order)
    return releases, entries_tally, diffs


def _recomputed(topic: str, settled: Sequence[tuple[RecordKey, bytes]],
                unsettled: Sequence[tuple[RecordKey, bytes]], diffs: list[Difference],
                ) -> tuple[dict[RecordKey, bytes], set[RecordKey]]:
    """The recomputed records of one topic by key (settled first), and the keys of the
    settled ones; a key recomputed with two different values is a difference."""
    mine: dict[RecordKey, bytes] = {}
    for k, raw in (*settled, *unsettled):
        if mine.setdefault(k, raw) != raw:
            diffs.append(Difference(topic, k, "conflicting",
                                    "replay itself produced two different records"))
    return mine, {k for k, _raw in settled}


def _diff_order(d: Difference) -> tuple[str, str, str, str]:
    return (d.topic, str(d.key[0]), str(d.key[1]).zfill(20), str(d.key[2]))


def default_jobs(settings: Settings) -> int:
    """Processes for the recomputation: one per timeline partition, at most one per CPU."""
    return max(1, min(settings.partitions, os.cpu_count() or 1))


def replay(settings: Settings, key: NoiseKey, *, timeout_s: float = 120.0,
           progress: Progress | None = None, jobs: int | None = None,
           settle_s: float = 5.0) -> ReplayReport:
    """Snapshot the topics in the cut's order (module docstring), recompute the timeline
    (in `jobs` processes, default `default_jobs`) and compare both public topics; due
    records missing from the snapshot get `settle_s` seconds to arrive (`_recheck_missing`).
    ReplayError if the brokers do not answer or refuse this client (within
    `kafka_io.PROBE_TIMEOUT_S`, the worker's start rule), a topic is missing, or the
    timeline was truncated."""
    # librdkafka's own log lines (one per failed connection attempt) stay off stderr: a
    # broker that does not answer is reported once, by the error this raises.
    conf = {**kafka_io.base_config(settings), "log_level": "0"}
    try:
        kafka_io.require_brokers(conf, min(timeout_s, kafka_io.PROBE_TIMEOUT_S))
    except kafka_io.BrokerUnavailable as exc:
        raise ReplayError(str(exc)) from None
    topics = [kafka_io.topic_name(settings, t) for t in ("timeline", "counts", "ledger")]
    try:
        missing = kafka_io.missing_topics(conf, topics, timeout_s)
        if missing:
            raise ReplayError(f"no topic {', '.join(map(repr, missing))} on the brokers at "
                              f"{settings.bootstrap_servers}: check [topics] in the "
                              "configuration")
        return _replay(settings, key, conf, timeout_s, progress, jobs, settle_s)
    except KafkaException as exc:
        raise ReplayError(kafka_io.broker_failure(conf, exc)) from None


def _recheck_missing(conf: Mapping[str, str], diffs: list[Difference], result: Recomputed,
                     topics: Mapping[str, tuple[str, Mapping[int, tuple[int, int]]]],
                     settle_s: float, timeout_s: float) -> list[Difference]:
    """Give due records missing from the snapshot `settle_s` seconds to arrive.

    One case makes a committed offset run ahead of what was published: around a rebalance
    Faust may commit past records it skipped, which the worker's GapGuard re-reads and
    applies at its next record. Whatever the topics received since the snapshot is read
    (only for the missing keys): one that arrives identical is no difference, one that
    arrives with other contents is "different"; the rest stay missing."""
    wanted = {(d.topic, d.key) for d in diffs if d.problem == "missing"}
    mine: dict[tuple[str, RecordKey], bytes] = {}
    for r in (*result.settled, *result.unsettled):
        if ("counts", (r.counter, r.tick, r.kind)) in wanted:
            mine["counts", (r.counter, r.tick, r.kind)] = r.to_json()
    for e in (*result.settled_ledger, *result.unsettled_ledger):
        if ("ledger", (e.counter, e.creation, e.fingerprint)) in wanted:
            mine["ledger", (e.counter, e.creation, e.fingerprint)] = e.to_json()
    since = {t: {p: hi for p, (_lo, hi) in marks.items()} for t, (_n, marks) in topics.items()}
    found: dict[tuple[str, RecordKey], bytes] = {}
    deadline = time.monotonic() + settle_s
    while wanted - found.keys() and time.monotonic() < deadline:
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        for t, (name, _marks) in topics.items():
            now = kafka_io.end_offsets(conf, name, timeout_s)
            marks = {p: (since[t].get(p, 0), hi) for p, (_lo, hi) in now.items()}
            key_of = _release_key if t == "counts" else _ledger_key
            for recs in kafka_io.read_values(conf, name, marks, timeout_s=timeout_s).values():
                for _off, raw in recs:
                    try:
                        k = (t, key_of(orjson.loads(raw or b"")))
                    except (orjson.JSONDecodeError, TypeError, ValueError, KeyError):
                        continue  # after the snapshot: not part of this verdict
                    if k in wanted and k not in found and raw is not None:
                        found[k] = raw
            since[t] = {p: hi for p, (_lo, hi) in now.items()}
    kept = [d for d in diffs if not (d.problem == "missing" and (d.topic, d.key) in found)]
    kept += [Difference(t, k, "different", _field_detail(mine[t, k], raw))
             for (t, k), raw in found.items() if raw != mine[t, k]]
    kept.sort(key=_diff_order)
    return kept


def _replay(settings: Settings, key: NoiseKey, conf: Mapping[str, str], timeout_s: float,
            progress: Progress | None, jobs: int | None, settle_s: float) -> ReplayReport:
    tl_topic = kafka_io.topic_name(settings, "timeline")
    counts_topic = kafka_io.topic_name(settings, "counts")
    ledger_topic = kafka_io.topic_name(settings, "ledger")
    # 1. committed offsets, 2. the public snapshot, 3. the timeline: this order is the cut.
    committed, (counts_marks, ledger_marks, tl_marks) = kafka_io.snapshot_offsets(
        conf, settings.app_id, tl_topic, [counts_topic, ledger_topic, tl_topic], timeout_s)
    truncated = sorted(p for p, (lo, _hi) in tl_marks.items() if lo > 0)
    if truncated:
        raise ReplayError(f"the timeline topic {tl_topic!r} no longer starts at offset 0 on "
                          f"partition(s) {truncated} (retention or a deletion): the counts "
                          "cannot be recomputed; keep the timeline for the audit window")
    total = sum(hi for _lo, hi in tl_marks.values())

    def read_progress(n: int) -> None:
        if progress is not None:
            progress("read", n, total)

    timeline = kafka_io.read_values(conf, tl_topic, tl_marks, timeout_s=timeout_s,
                                    progress=read_progress)
    result = recompute_timeline(settings, key, timeline, committed, progress=progress,
                                jobs=default_jobs(settings) if jobs is None else jobs)
    published = kafka_io.read_values(conf, counts_topic, counts_marks, timeout_s=timeout_s)
    ledger = kafka_io.read_values(conf, ledger_topic, ledger_marks, timeout_s=timeout_s)
    releases, entries, diffs = compare(
        result, (v for recs in published.values() for _o, v in recs),
        (v for recs in ledger.values() for _o, v in recs))
    if settle_s > 0 and any(d.problem == "missing" for d in diffs):
        diffs = _recheck_missing(conf, diffs, result, {"counts": (counts_topic, counts_marks),
                                                       "ledger": (ledger_topic, ledger_marks)},
                                 settle_s, timeout_s)
    cut = {p: (committed.get(p, 0), hi) for p, (_lo, hi) in tl_marks.items()}
    return ReplayReport(result.records, result.duplicates_dropped, releases, entries, cut,
                        diffs)


class _StderrProgress:
    """Progress lines on stderr, at most one every `every_s` seconds."""

    def __init__(self, every_s: float = 2.0) -> None:
        self._every = every_s
        self._next = time.monotonic() + every_s

    def __call__(self, stage: str, done: int, total: int) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self._every
        what = "timeline records read" if stage == "read" else "timeline records recomputed"
        print(f"replay: {done}/{total} {what}", file=sys.stderr, flush=True)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m processor replay",
        description="Recompute the private counts and ledger entries from the timeline "
        "topic and compare them with the published topics, through the cut defined in "
        "docs/replay.md (safe on a running worker and after any stop). Exit 0: identical; "
        "1: different; 2: no verdict (an error).")
    p.add_argument("--config", help="TOML configuration (DPC_* environment overrides apply)")
    p.add_argument("--key-file", help="noise key file (default: the configured one)")
    p.add_argument("--key-format", choices=KEY_FORMATS,
                   help="how the key file is read (default: noise_key_format, hex)")
    p.add_argument("--json", action="store_true",
                   help="print the verdict as one JSON object (verdict, cut, counts, the "
                   "first differences) instead of a line of text")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds to wait for the brokers and for each topic read "
                   "(default 120)")
    p.add_argument("--jobs", type=int, default=None,
                   help="processes that recompute timeline partitions in parallel "
                   "(default: one per partition, at most one per CPU; the verdict does not "
                   "depend on it)")
    p.add_argument("--settle", type=float, default=5.0,
                   help="seconds a due record missing from the snapshot may take to arrive "
                   "before it is reported (a worker catching up after a rebalance; default 5)")
    p.add_argument("--quiet", action="store_true",
                   help="no progress lines on stderr (by default one every 2 s)")
    return p


def main_replay(argv: Sequence[str] | None = None) -> int:
    """`python -m processor replay --config F [--key-file K] [--json]`: exit 0 identical,
    1 different; errors propagate to the dispatcher's error policy (one line, exit 2)."""
    args = _parser().parse_args(list(argv) if argv is not None else None)
    configure_logging("warning")  # the client loggers' floors (logs.py)
    settings = load_settings(args.config)
    key = load_noise_key(settings, args.key_file, args.key_format)
    report = replay(settings, key, timeout_s=args.timeout, jobs=args.jobs,
                    settle_s=args.settle,
                    progress=None if args.quiet else _StderrProgress())
    if args.json:
        print(orjson.dumps(report.to_json()).decode())
    else:
        print(report.summary())
    return 0 if report.identical else 1
