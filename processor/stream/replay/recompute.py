"""Recompute the timeline: the worker's own `commit.BatchCommit` over each partition's
records in offset order on a `DictStore`, with a sink that only collects, under the
provenance the published ledger gives (`history.LedgerProvenance`), in forked processes
when there are several partitions.

One thing a restart under a new configuration does is not on the timeline: where it was.
It matters for a counter declared after its start: the worker skipped its events until
the restart and created it at the first marker after it. The creation tag of its ledger
entry names that marker; the restart was after the marker before it, so replay tries
each position in between that changes which of the counter's events count (the
configuration without the counter before it, the current one after) and keeps the one
whose records were published (`_late_declared`): a choice among complete
recomputations, each from the timeline and the key, never a published value taken over.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import itertools
import multiprocessing
import os
import threading
from collections.abc import Callable, Collection, Coroutine, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from processor.commandline import pool_worker_signals
from processor.core.rng import NoiseKey
from processor.stream.model.commit import BatchCommit
from processor.stream.model.config import Settings
from processor.stream.model.identity import creation_tag
from processor.stream.model.operator import Operator, declared_homes
from processor.stream.model.outputs import CollectingSink, Output
from processor.stream.model.records import (
    EncodedRelease,
    EventRow,
    LedgerEntry,
    Release,
    TimelineFormatError,
    TimelineMarker,
    decode_timeline_rows,
    marker_tick,
)
from processor.stream.model.state import DictStore, PartitionState
from processor.stream.replay.history import LedgerHistory, LedgerProvenance
from processor.stream.replay.report import RecordKey

#: Timeline records per recomputed batch. The outputs do not depend on the batching; the
#: cost does: state is written once per batch, but a marker walks the due ticks consumed
#: earlier in its batch (they are deleted at the commit), which grows with the batch.
REPLAY_BATCH: Final = 128
#: The state is written after a marker once the markers since the last write touched this
#: many counters (`_batches`): then the idle counters they released are written and beat
#: from their idle entries. A checkpoint after every marker would write the counters a
#: busy timeline's markers step, again at every tick (twice the CPU in bench_replay.py).
REPLAY_TOUCHED: Final = 1024

#: Called with (stage, done, total) while replay reads and recomputes.
Progress = Callable[[str, int, int], None]
#: One timeline partition's (offset, value) records.
TimelinePart = Sequence[tuple[int, bytes | None]]


#: Public records as their comparison keys and bytes.
Keyed = list[tuple[RecordKey, bytes]]


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
    #: `encoded()`, once computed (the lists above are complete by then).
    _encoded: tuple[Keyed, Keyed, Keyed, Keyed] | None = field(
        default=None, compare=False, repr=False)

    def encoded(self) -> tuple[Keyed, Keyed, Keyed, Keyed]:
        """The four lists as (key, bytes) of each record: (counter, tick, kind) of a
        release, (counter, creation, fingerprint) of a ledger entry. Computed once; a
        forked recomputation computes it before it returns, so that the encoding runs in
        parallel, not in the process that compares."""
        if self._encoded is None:
            self._encoded = (
                [((r.counter, r.tick, r.kind), _kept(r.to_json())) for r in self.settled],
                [((r.counter, r.tick, r.kind), _kept(r.to_json())) for r in self.unsettled],
                [((e.counter, e.creation, e.fingerprint), _kept(e.to_json()))
                 for e in self.settled_ledger],
                [((e.counter, e.creation, e.fingerprint), _kept(e.to_json()))
                 for e in self.unsettled_ledger])
        return self._encoded

    def encoded_only(self) -> None:
        """Keep `encoded()` alone: drop the record objects (half the memory, and what a
        forked recomputation would pickle back besides)."""
        self.encoded()
        for records in (self.settled, self.unsettled, self.settled_ledger,
                        self.unsettled_ledger):
            records.clear()


class KeyedSink:
    """A Sink that keeps releases as what `Recomputed.encoded` makes of them, (counter,
    tick, kind) and bytes, never as objects: an idle counter's heartbeat, which the
    operator writes as bytes from a template (`EncodedRelease`), is kept as those bytes
    (a `CollectingSink` decodes it into a Release, which `encoded` encodes again).
    Ledger entries stay objects (`_late_declared` reads them)."""

    def __init__(self) -> None:
        self.releases: Keyed = []
        self.ledger: list[LedgerEntry] = []

    def send(self, out: Output) -> None:
        self.ledger.extend(out.ledger)
        self.releases += [
            ((r.counter, r.tick, r.kind),
             # Joined to its size already (`ReleaseTemplate.release`); orjson's not.
             r.to_json() if type(r) is EncodedRelease else _kept(r.to_json()))
            for r in out.releases]

    async def flush(self) -> None:
        return None


def _kept(raw: bytes) -> bytes:
    """A copy of `raw` of its own size, to keep: a record fresh from orjson.dumps holds
    about 4 KB of the process's memory as long as it lives (measured: 4.1 KB for a
    273-byte release; the copy, 330 bytes), 30 KB a counter at a million counters."""
    return memoryview(raw).tobytes()


def default_jobs(settings: Settings) -> int:
    """Processes for the recomputation: one per timeline partition, at most one per CPU."""
    return max(1, min(settings.partitions, os.cpu_count() or 1))


def ledger_operator(settings: Settings, key: NoiseKey, history: LedgerHistory) -> Operator:
    """The worker's Operator, with each counter's parameters, noise identity and
    fingerprints taken from `history` instead of the one configuration (a counter the
    ledger does not know runs as `settings` say)."""
    return Operator(settings, key, provenance=LedgerProvenance(settings, key, history),
                    homes=homes_of(settings))


#: The last `homes_of`: its settings and their map.
_HOMES: tuple[Settings, Mapping[str, int]] | None = None


def homes_of(settings: Settings) -> Mapping[str, int]:
    """`operator.declared_homes` of `settings`, made once for the operators of every
    partition (a sha256 per declared counter: each partition's operator made its own,
    of every counter of the deployment). Made before the recomputing processes fork,
    they inherit it. Read only: an operator never changes it."""
    global _HOMES
    if _HOMES is None or _HOMES[0] is not settings:
        _HOMES = (settings, MappingProxyType(declared_homes(settings)))
    return _HOMES[1]


def _without(settings: Settings, names: Collection[str]) -> Settings:
    """`settings` before `names` were declared (its own fingerprint: a restart under the
    full settings files them, as the worker's restart did)."""
    if not names:
        return settings
    return dataclasses.replace(settings, counters=MappingProxyType(
        {c: s for c, s in settings.counters.items() if c not in names}))


def _late_declared(settings: Settings, key: NoiseKey, history: LedgerHistory,
                   records: TimelinePart, got: Recomputed,
                   ) -> list[tuple[list[int], frozenset[str]]]:
    """Counters declared after their start under existing state, found on one partition.

    The worker creates such a counter at the first marker after its restart under the new
    configuration (it files every declared counter without state then), having skipped
    its earlier events as undeclared; replay, declaring it from the start, creates it
    earlier: another creation tag than the ledger's. The marker whose tag is the ledger's
    is the one that created it; the restart was after the marker before it. Returns, per
    such marker (in offset order), the offsets the restart may have been at (the event
    records of these counters in that window, then the creating marker) and the counters."""
    recomputed = {e.counter: e.creation for e in (*got.settled_ledger, *got.unsettled_ledger)
                  if e.entry == "created"}
    late = [c for c, tag in recomputed.items()
            if c in settings.counters and history.creation.get(c, tag) != tag]
    if not late:
        return []
    probe = LedgerProvenance(settings, key, history)
    markers: list[tuple[int, int, int]] = []  # (offset, n, frontier before) sealing anew
    frontier = PartitionState().frontier
    for off, raw in records:
        n = marker_tick(raw)
        if n is not None and n > frontier:
            markers.append((off, n, frontier))
            frontier = n
    windows: dict[int, tuple[int, set[str]]] = {}
    for c in late:
        for i, (off, n, before) in enumerate(markers):
            if creation_tag(probe.creation_identity(c), c, n, before) == history.creation[c]:
                windows.setdefault(off, (markers[i - 1][0] if i else -1, set()))[1].add(c)
                break
    groups = []
    for at, (after, names) in sorted(windows.items()):
        positions = []
        for off, raw in records:
            if after < off < at and raw is not None:
                rec = _decoded(raw)
                if isinstance(rec, list) and any(row[0] in names for row in rec):
                    positions.append(off)
        groups.append(([*positions, at], frozenset(names)))
    return groups


def _decoded(raw: bytes) -> list[EventRow] | TimelineMarker | None:
    try:
        return decode_timeline_rows(raw)
    except TimelineFormatError:
        return None


def _unpublished(got: Recomputed, names: Collection[str], published: Collection[bytes],
                 ) -> int:
    """How many recomputed records of the counters `names` were not published."""
    return sum(1 for keyed in got.encoded() for k, raw in keyed
               if k[0] in names and raw not in published)


@contextmanager
def young_collections_only() -> Iterator[None]:
    """Inside: CPython's cyclic garbage collector collects its young generations only.

    Replay holds every counter's state, its releases and the published records at once
    (about 20 KB a counter: millions of objects with 100,000 counters), none of it garbage
    until it returns. A full collection traverses all of them, and CPython runs one each
    time the long-lived objects grew by a quarter: a third of replay's CPU at 100,000
    counters, reclaiming nothing. The young collections still reclaim the short-lived
    cycles of each step. Forked recomputation processes inherit the setting."""
    young, middle, old = gc.get_threshold()
    gc.set_threshold(young, middle, 1 << 30)
    try:
        yield
    finally:
        gc.set_threshold(young, middle, old)


def recompute_timeline(settings: Settings, key: NoiseKey,
                       timeline: Mapping[int, TimelinePart],
                       settled_below: Mapping[int, int], *,
                       operator: Operator | None = None,
                       progress: Progress | None = None, jobs: int = 1,
                       history: LedgerHistory | None = None,
                       stamps: Mapping[int, Mapping[int, int]] | None = None,
                       objects: bool = True) -> Recomputed:
    """Run BatchCommit over each partition's (offset, value) records in offset order on a
    DictStore (with `operator`, default the registry's mechanisms: `ledger_operator` of
    `history`, else an Operator); what records at offsets >= settled_below[p] produce is
    reported apart. `stamps[p][offset]`: the Kafka timestamps of (at least) the markers,
    which the operator checks as the worker did (Operator.apply).

    With jobs > 1 (no `operator` given, and no other thread running) the partitions are
    recomputed in that many forked processes, each with its own Operator and store. The
    result is the same: a counter lives in one partition (`records.partition_for`; a
    record of another partition's counter is skipped), every state key belongs to one
    partition, so the partitions never share state; the results are merged in partition
    order. `objects=False`: the result holds only its `encoded()` records
    (`Recomputed.encoded_only`), what `compare` reads."""
    with young_collections_only():
        got = _recompute_timeline(settings, key, timeline, settled_below, operator,
                                  progress, jobs, history, stamps, objects)
    if not objects:
        got.encoded_only()
    return got


def _recompute_timeline(settings: Settings, key: NoiseKey,
                        timeline: Mapping[int, TimelinePart],
                        settled_below: Mapping[int, int], operator: Operator | None,
                        progress: Progress | None, jobs: int, history: LedgerHistory | None,
                        stamps: Mapping[int, Mapping[int, int]] | None,
                        objects: bool) -> Recomputed:
    # Fork only from a single-threaded process: a lock another thread holds at the fork
    # would stay held in the child forever.
    if operator is None and jobs > 1 and len(timeline) > 1 and single_threaded():
        return _recompute_parallel(settings, key, timeline, settled_below, progress, jobs,
                                   history, stamps, objects)
    if operator is not None or history is None:
        op = operator if operator is not None else Operator(settings, key)
        return _run(_recompute(op, timeline, settled_below, progress, stamps=stamps))
    total = sum(len(v) for v in timeline.values())
    parts: dict[int, Recomputed] = {}
    for p in sorted(timeline):
        before = sum(r.records for r in parts.values())

        def step(stage: str, done: int, _total: int, before: int = before) -> None:
            if progress is not None:
                progress(stage, before + done, total)

        parts[p] = recompute_partition(settings, key, history, p, timeline[p],
                                       settled_below, stamps, step, keyed=not objects)
    return _merged(parts)


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


def _run(recomputation: Coroutine[Any, Any, Recomputed]) -> Recomputed:
    """asyncio.run without its SIGINT hand-off: in the main thread asyncio.run installs a
    handler holding the main task, and restoring the old one formats that handler's repr,
    the task's result included (Python 3.11): every recomputed record, twice, about 5%
    of replay's CPU with 100,000 counters. Replay's Ctrl-C is the default one."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(recomputation)
    finally:
        loop.close()


async def _recompute(operator: Operator, timeline: Mapping[int, TimelinePart],
                     settled_below: Mapping[int, int],
                     progress: Progress | None,
                     switches: Sequence[tuple[int, Operator]] = (),
                     stamps: Mapping[int, Mapping[int, int]] | None = None,
                     keyed: bool = False) -> Recomputed:
    """Records from offset o of `switches` (o, op) on go through op, as after a worker's
    restart under another configuration (`_late_declared`). `keyed`: the releases are
    kept as keys and bytes only (`KeyedSink`: the result holds them as `encoded()`, its
    lists of Release objects are empty)."""
    settled: CollectingSink | KeyedSink = KeyedSink() if keyed else CollectingSink()
    unsettled: CollectingSink | KeyedSink = KeyedSink() if keyed else CollectingSink()
    total = sum(len(v) for v in timeline.values())
    records = dups = 0
    for p in sorted(timeline):
        recs = sorted(timeline[p])
        mark = settled_below.get(p, 0)
        cuts = sorted({0, len(recs), *(
            next((i for i, (off, _v) in enumerate(recs) if off >= o), len(recs))
            for o in (mark, *(o for o, _op in switches)))})
        # Partitions share no state: a store of their own, dropped after the last one.
        store = DictStore()
        commit: BatchCommit | None = None
        for lo, hi in itertools.pairwise(cuts):
            if lo == hi:
                continue
            op = operator
            for o, later in switches:
                if recs[lo][0] >= o:
                    op = later
            if commit is None or commit.operator is not op:
                if commit is not None:
                    await commit.checkpoint()  # the next operator reads it from the store
                commit = BatchCommit(op, store, settled)
            # Nothing is buffered in a CollectingSink: the outputs of the records from
            # here on go to the other list.
            commit.sink = settled if recs[lo][0] < mark else unsettled
            unwritten = touched = 0
            for i, j in _batches(recs, lo, hi):
                batch = [(off, v or b"") for off, v in recs[i:j]]
                out = await commit.apply(p, batch,
                                         None if stamps is None else stamps.get(p))
                unwritten += len(batch)
                touched += out.metrics["counters_touched"]
                # Written every REPLAY_BATCH records (bounded memory, the due ticks
                # consumed deleted) and after markers that touched REPLAY_TOUCHED
                # counters (`_batches`); never after the partition's last record: nobody
                # reads it. Not full: ⊥-only progress stays deferred, as on the worker.
                if j < hi and (unwritten >= REPLAY_BATCH or touched >= REPLAY_TOUCHED):
                    await commit.checkpoint(full=False)
                    unwritten = touched = 0
                records += len(batch)
                dups += out.metrics["duplicates_dropped"]
                if progress is not None:
                    progress("recomputed", records, total)
    if isinstance(settled, KeyedSink) and isinstance(unsettled, KeyedSink):
        ledger: list[Keyed] = [
            [((e.counter, e.creation, e.fingerprint), _kept(e.to_json())) for e in entries]
            for entries in (settled.ledger, unsettled.ledger)]
        return Recomputed([], [], settled.ledger, unsettled.ledger, records, dups,
                          (settled.releases, unsettled.releases, ledger[0], ledger[1]))
    assert isinstance(settled, CollectingSink) and isinstance(unsettled, CollectingSink)
    return Recomputed(settled.releases, unsettled.releases, settled.ledger,
                      unsettled.ledger, records, dups)


def _batches(recs: TimelinePart, lo: int, hi: int) -> Iterator[tuple[int, int]]:
    """recs[lo:hi] as batches [i, j): each ends at a marker or after REPLAY_BATCH records,
    so that the state can be written right after a marker (`_recompute`). A counter a
    marker released as idle stays staged until the next checkpoint, and while it is, a
    later marker decodes it again instead of beating it from its idle entry
    (`Operator._beat_idle`). The outputs do not depend on the batching."""
    i = lo
    for k in range(lo, hi):
        if k + 1 - i >= REPLAY_BATCH or marker_tick(recs[k][1]) is not None:
            yield i, k + 1
            i = k + 1
    if i < hi:
        yield i, hi


def recompute_partition(settings: Settings, key: NoiseKey, history: LedgerHistory | None,
                        partition: int, records: TimelinePart,
                        settled_below: Mapping[int, int],
                        stamps: Mapping[int, Mapping[int, int]] | None = None,
                        progress: Progress | None = None, *,
                        keyed: bool = False) -> Recomputed:
    """One partition: with `history`, by `ledger_operator`s, switching configuration
    where the ledger shows the worker did (`_late_declared`). `keyed`: releases kept as
    keys and bytes only (`_recompute`)."""
    timeline = {partition: records}
    if history is None:
        return _run(_recompute(Operator(settings, key), timeline, settled_below,
                               progress, stamps=stamps, keyed=keyed))
    got = _run(_recompute(ledger_operator(settings, key, history), timeline,
                          settled_below, progress, stamps=stamps, keyed=keyed))
    groups = _late_declared(settings, key, history, sorted(records), got)
    if not groups:
        return got

    def run(ats: Sequence[int]) -> Recomputed:
        # Before ats[i] the counters of groups i.. are not declared yet.
        ops = [ledger_operator(_without(settings, {n for _c, g in groups[i:] for n in g}),
                               key, history) for i in range(len(groups) + 1)]
        return _run(_recompute(ops[0], timeline, settled_below, None,
                               [(at, ops[i + 1]) for i, at in enumerate(ats)],
                               stamps, keyed))

    # Where the restart was in a window is not on the timeline: try each position that
    # changes which of the new counters' events count, keep the one whose records were
    # published (the others are other computations, never a verdict on their own).
    chosen = [candidates[-1] for candidates, _names in groups]
    for i, (candidates, names) in enumerate(groups):
        scored = []
        for at in candidates:
            trial = run([*chosen[:i], at, *chosen[i + 1:]])
            scored.append((_unpublished(trial, names, history.published), at, trial))
        _misses, chosen[i], got = min(scored, key=lambda x: x[0])
    return got


#: The job of the forked recomputation processes (set before the fork, read after it:
#: the timeline is inherited, never pickled).
_JOB: tuple[Settings, NoiseKey, Mapping[int, TimelinePart], Mapping[int, int],
            LedgerHistory | None, Mapping[int, Mapping[int, int]] | None, bool] | None = None


def _recompute_partition(partition: int) -> Recomputed:
    assert _JOB is not None
    settings, key, timeline, settled_below, history, stamps, objects = _JOB
    got = recompute_partition(settings, key, history, partition, timeline[partition],
                              settled_below, stamps, keyed=not objects)
    if objects:
        got.encoded()
    else:
        got.encoded_only()
    return got


def _recompute_parallel(settings: Settings, key: NoiseKey,
                        timeline: Mapping[int, TimelinePart],
                        settled_below: Mapping[int, int], progress: Progress | None,
                        jobs: int, history: LedgerHistory | None,
                        stamps: Mapping[int, Mapping[int, int]] | None,
                        objects: bool) -> Recomputed:
    global _JOB
    total = sum(len(v) for v in timeline.values())
    # Largest partitions first, so no process is left with a big one at the end.
    order = sorted(timeline, key=lambda p: -len(timeline[p]))
    parts: dict[int, Recomputed] = {}
    _JOB = (settings, key, timeline, settled_below, history, stamps, objects)
    try:
        with multiprocessing.get_context("fork").Pool(
                min(jobs, len(order)), initializer=pool_worker_signals) as pool:
            for p, got in zip(order, pool.imap(_recompute_partition, order), strict=True):
                parts[p] = got
                if progress is not None:
                    progress("recomputed", sum(r.records for r in parts.values()), total)
    finally:
        _JOB = None
    return _merged(parts)


def _merged(parts: Mapping[int, Recomputed]) -> Recomputed:
    """Partitions' recomputations as one, in partition order."""
    merged = Recomputed([], [], [], [], 0, 0)
    for p in sorted(parts):
        r = parts[p]
        merged.settled += r.settled
        merged.unsettled += r.unsettled
        merged.settled_ledger += r.settled_ledger
        merged.unsettled_ledger += r.unsettled_ledger
        merged.records += r.records
        merged.duplicates_dropped += r.duplicates_dropped
    if all(r._encoded is not None for r in parts.values()):
        encoded = [r.encoded() for _p, r in sorted(parts.items())]
        merged._encoded = (
            [x for e in encoded for x in e[0]], [x for e in encoded for x in e[1]],
            [x for e in encoded for x in e[2]], [x for e in encoded for x in e[3]])
    return merged
