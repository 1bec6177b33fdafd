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

Configuration changes (`LedgerHistory`, `HistoryOperator`)
---------------------------------------------------------
The worker never changes a counter's parameters: a counter keeps the mechanism, epsilon,
delta and calibration it was created with, keyed under the noise identity of the
configuration it was created under, whatever the later configurations say
(on_parameter_change = "keep"); a configuration change only changes the fingerprint its
later releases carry, announced by a "reconfigured" ledger entry from the tick of its first
release under it. Replay, given the current configuration, takes from the published ledger
what the timeline cannot tell: per counter, the parameters and fingerprint of its "created"
entry and the fingerprint in force at each tick (the entry with the largest since_tick <=
t). Everything else is recomputed from the timeline and the key, and every recomputed
entry and release is compared byte for byte, so a ledger that lies about a counter makes
its recomputed releases (or entries) differ. A ledger entry replay cannot use is an
"inconsistent" difference with the reason (parameters the configuration validation
refuses, a creation under the current fingerprint with other parameters than it gives,
two creations of one counter...); a published release whose fingerprint no entry of its
counter announced by its tick is "unexplained".

One thing a restart under a new configuration does is not on the timeline: where it was.
It matters for a counter declared after its start: the worker skipped its events until
the restart and created it at the first marker after it. The creation tag of its ledger
entry names that marker; the restart was after the marker before it, so replay tries
each position in between that changes which of the counter's events count (the
configuration without the counter before it, the current one after) and keeps the one
whose records were published (`_late_declared`): a choice among complete
recomputations, each from the timeline and the key, never a published value taken over.

Replay is inconclusive (ReplayError, exit 2) when the timeline no longer starts at offset
0 (retention deleted its beginning: nothing can be recomputed from there). The private-count
topic must be retained at least as long as the timeline: a release deleted by retention is
missing.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import multiprocessing
import os
import sys
import threading
import time
from bisect import bisect_right
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

import orjson
from confluent_kafka import KafkaException

from processor.core import registry
from processor.core.api import Counter
from processor.core.rng import KEY_FORMATS, NoiseKey
from processor.errors import StreamError
from processor.stream import kafka_io
from processor.stream.bounding import check_kept_set, units_topic
from processor.stream.commit import BatchCommit, CollectingPublisher
from processor.stream.config import (
    ConfigError,
    Settings,
    load_noise_key,
    load_settings,
    with_overrides,
)
from processor.stream.logs import configure_logging
from processor.stream.operator import (
    Operator,
    _calibration,
    counter_id,
    key_fingerprint,
    noise_identity,
)
from processor.stream.records import (
    EventRow,
    LedgerEntry,
    Release,
    TimelineFormatError,
    TimelineMarker,
    decode_timeline_rows,
    marker_tick,
)
from processor.stream.state import CounterState, DictStore, PartitionState

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


class ReplayError(StreamError, RuntimeError):
    """Replay cannot reach a verdict (exit 2): the brokers do not answer or refuse this
    client, a topic does not exist, or the timeline no longer starts at offset 0."""

    error_prefix = "replay: "


@dataclass(frozen=True)
class Difference:
    """One difference: which topic, which record, what is wrong."""

    topic: str  # "counts" (the private-count topic) or "ledger"
    key: RecordKey
    problem: str  # missing, unexpected, different, conflicting, malformed, inconsistent,
    # unexplained (module docstring)
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


#: (mechanism, epsilon, delta, calibration) a counter runs with.
Parameters = tuple[str, float, float, str]


@dataclass
class LedgerHistory:
    """What the published ledger says each counter ran under (module docstring): the
    parameters and fingerprint of its creation, and its fingerprints by since_tick. Only
    entries of this deployment's key are used; `problems` lists the entries replay could
    not use ("inconsistent" differences, with the reason)."""

    #: counter -> (parameters, fingerprint) of its "created" entry.
    created: dict[str, tuple[Parameters, str]] = field(default_factory=dict)
    #: counter -> its entries' since_ticks (sorted) and the fingerprints in force from them.
    since: dict[str, tuple[list[int], list[str]]] = field(default_factory=dict)
    #: fingerprint -> the parameters its configuration gives a new counter (the current
    #: configuration's; an earlier one's from the counters created under it: a creation
    #: always runs the configured parameters).
    configured: dict[str, Parameters] = field(default_factory=dict)
    #: (counter, fingerprint) -> the `parameters` label of its entry: used only for a
    #: fingerprint whose configuration replay cannot know (no counter created under it).
    labels: dict[tuple[str, str], str] = field(default_factory=dict)
    #: counter -> the creation tag of its "created" entry.
    creation: dict[str, str] = field(default_factory=dict)
    #: The published releases and ledger entries (bytes): which of the positions a
    #: restart may have had the worker computed (`_late_declared`).
    published: frozenset[bytes] = frozenset()
    problems: list[Difference] = field(default_factory=list)

    def fingerprint_at(self, counter: str, t: int) -> str | None:
        """The fingerprint of the entry of `counter` in force at local tick t, if any."""
        got = self.since.get(counter)
        if got is None:
            return None
        i = bisect_right(got[0], t) - 1
        return got[1][i] if i >= 0 else None


def _entry_parameters(d: Mapping[str, Any]) -> Parameters:
    p = (d["mechanism"], d["epsilon"], d["delta"], d.get("calibration", "paper"))
    if not (isinstance(p[0], str) and isinstance(p[3], str)
            and all(type(x) is float for x in p[1:3])):
        raise TypeError("mechanism, epsilon, delta or calibration of the wrong type")
    return p


def _ledger_dicts(values: Iterable[bytes | None]) -> list[dict[str, Any]]:
    """The published values that look like ledger entries (the rest are "malformed"
    differences already, `_published`)."""
    out: list[dict[str, Any]] = []
    for raw in values:
        try:
            d = orjson.loads(raw or b"")
        except orjson.JSONDecodeError:
            continue
        if type(d) is dict and type(d.get("counter")) is str:
            out.append(d)
    return out


def ledger_history(settings: Settings, key: NoiseKey, ledger: Iterable[bytes | None],
                   releases: Iterable[bytes | None] = ()) -> LedgerHistory:
    """Read the published ledger into a LedgerHistory for `settings` (the current
    configuration) and `key`, checking each entry replay takes anything from; the
    published `releases` only serve to place a restart (`_late_declared`)."""
    ledger = list(dict.fromkeys(ledger))  # identical re-sends (after a crash) count once
    h = LedgerHistory(published=frozenset(v for v in (*ledger, *releases) if v))
    current = settings.fingerprint()
    key_id = key_fingerprint(key)
    # The operator's own reading of the settings: what a new counter runs with.
    configured_now: Parameters = (*Operator(settings, key)._configured_parameters(),
                                  settings.calibration)
    h.configured[current] = configured_now
    entries: dict[str, dict[int, str]] = {}
    by_fingerprint: dict[str, dict[RecordKey, Parameters]] = {}
    for d in _ledger_dicts(ledger):
        name = d["counter"]
        k: RecordKey = (name, str(d.get("creation", "")), str(d.get("fingerprint", "")))

        def inconsistent(reason: str, k: RecordKey = k) -> None:
            h.problems.append(Difference("ledger", k, "inconsistent", reason))

        fp, since, kind = d.get("fingerprint"), d.get("since_tick"), d.get("entry")
        if d.get("key_id") != key_id:
            inconsistent(f"announced under the noise key {d.get('key_id')!r}, not this "
                         f"deployment's ({key_id}): not used")
            continue
        if type(fp) is not str or type(since) is not int or since < 1 or kind not in (
                "created", "reconfigured"):
            inconsistent("no fingerprint, since_tick or entry kind replay can use")
            continue
        if (kind == "created") != (since == 1):
            inconsistent(f"a {kind!r} entry from tick {since}: created entries start at "
                         "tick 1, reconfigured ones after it")
            continue
        ticks = entries.setdefault(name, {})
        if ticks.get(since, fp) != fp:
            inconsistent(f"two fingerprints in force from tick {since}: "
                         f"{ticks[since]} and {fp}")
            continue
        label = d.get("parameters")
        if type(label) is str:
            h.labels[name, fp] = label
        if kind != "created":
            ticks[since] = fp
            continue
        if name in h.created:
            if h.creation[name] == k[1]:
                continue  # the same creation published twice differently: "conflicting"
            inconsistent("a second creation of the counter (the worker refuses to create "
                         "an announced counter again): not used")
            continue
        try:
            params = _entry_parameters(d)
            with_overrides(settings, mechanism=params[0], epsilon=params[1],
                           delta=params[2], calibration=params[3])
        except (ConfigError, TypeError, KeyError) as exc:
            inconsistent(f"the configuration validation refuses its parameters ({exc}): "
                         "recomputed with the configured ones")
            continue
        if fp == current:
            if params != configured_now:
                inconsistent(f"created under the current configuration's fingerprint with "
                             f"{params}, but that configuration gives {configured_now}")
                continue
        else:
            by_fingerprint.setdefault(fp, {})[k] = params
        ticks[since] = fp
        h.created[name] = (params, fp)
        h.creation[name] = str(d.get("creation", ""))
    for fp, made in by_fingerprint.items():
        if len(set(made.values())) == 1:
            h.configured[fp] = next(iter(made.values()))
            continue
        # One configuration gives every counter it creates the same parameters. Which
        # entry lies the ledger cannot tell (the releases can): each counter is
        # recomputed with its own, and fp's configuration stays unknown.
        listing = "; ".join(f"{k[0]!r}: {p}" for k, p in sorted(made.items()))
        h.problems += [Difference("ledger", k, "inconsistent",
                                  f"counters created under fingerprint {fp} disagree on "
                                  f"the parameters it gives ({listing})") for k in made]
    for name, ticks in entries.items():
        order = sorted(ticks)
        h.since[name] = (order, [ticks[t] for t in order])
    return h


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
    probe = HistoryOperator(settings, key, history)
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
            if probe._creation_tag(c, n, before) == history.creation[c]:
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
    mine: list[Release | LedgerEntry] = [*got.settled, *got.unsettled, *got.settled_ledger,
                                         *got.unsettled_ledger]
    return sum(1 for r in mine if r.counter in names and r.to_json() not in published)


class HistoryOperator(Operator):
    """The worker's Operator, with each counter's parameters, noise identity and
    fingerprints taken from a LedgerHistory instead of the one configuration (module
    docstring); a counter the ledger does not know runs as the configuration says."""

    def __init__(self, settings: Settings, key: NoiseKey, history: LedgerHistory) -> None:
        super().__init__(settings, key)
        self.history = history
        self._identities: dict[str, str] = {}

    def _identity(self, fingerprint: str) -> str:
        got = self._identities.get(fingerprint)
        if got is None:
            got = self._identities[fingerprint] = noise_identity(
                self.settings, self.key, fingerprint)
        return got

    def _make_mechanism(self, name: str) -> Counter:
        created = self.history.created.get(name)
        if created is None:
            return super()._make_mechanism(name)
        (mechanism, eps, delta, calibration), fp = created
        made: Counter = registry.make(mechanism, eps, delta, self.key,
                                      counter_id(self._identity(fp), name),
                                      calibration=calibration)
        return made

    def _creation_identity(self, name: str) -> str:
        created = self.history.created.get(name)
        return self.noise_id if created is None else self._identity(created[1])

    def _fingerprint_at(self, name: str, t: int) -> str:
        return self.history.fingerprint_at(name, t) or self.fingerprint

    def _runs_configured(self, name: str, c: Counter, fingerprint: str) -> bool:
        known = self.history.configured.get(fingerprint)
        if known is None:
            return self.history.labels.get((name, fingerprint)) == "configured"
        return (c.mechanism, c.eps, c.delta, _calibration(c)) == known

    def _check_parameters(self, name: str, cs: CounterState) -> None:
        """No refusal: replay recomputes what the worker ran, and a counter runs with the
        parameters of its creation (the ledger's), whatever the current configuration."""


TimelinePart = Sequence[tuple[int, bytes | None]]


def recompute_timeline(settings: Settings, key: NoiseKey,
                       timeline: Mapping[int, TimelinePart],
                       settled_below: Mapping[int, int], *,
                       operator: Operator | None = None,
                       progress: Progress | None = None, jobs: int = 1,
                       history: LedgerHistory | None = None,
                       stamps: Mapping[int, Mapping[int, int]] | None = None) -> Recomputed:
    """Run BatchCommit over each partition's (offset, value) records in offset order on a
    DictStore (with `operator`, default the registry's mechanisms: a HistoryOperator with
    `history`, else an Operator); what records at offsets >= settled_below[p] produce is
    reported apart. `stamps[p][offset]`: the Kafka timestamps of (at least) the markers,
    which the operator checks as the worker did (Operator.apply).

    With jobs > 1 (no `operator` given, and no other thread running) the partitions are
    recomputed in that many forked processes, each with its own Operator and store. The
    result is the same: a counter lives in one partition (`records.partition_for`; a
    record of another partition's counter is skipped), every state key belongs to one
    partition, so the partitions never share state; the results are merged in partition
    order."""
    # Fork only from a single-threaded process: a lock another thread holds at the fork
    # would stay held in the child forever.
    if operator is None and jobs > 1 and len(timeline) > 1 and single_threaded():
        return _recompute_parallel(settings, key, timeline, settled_below, progress, jobs,
                                   history, stamps)
    if operator is not None or history is None:
        op = operator if operator is not None else Operator(settings, key)
        return asyncio.run(_recompute(op, timeline, settled_below, progress, stamps=stamps))
    total = sum(len(v) for v in timeline.values())
    parts: dict[int, Recomputed] = {}
    for p in sorted(timeline):
        before = sum(r.records for r in parts.values())

        def step(stage: str, done: int, _total: int, before: int = before) -> None:
            if progress is not None:
                progress(stage, before + done, total)

        parts[p] = _recompute_one(settings, key, history, p, timeline[p], settled_below,
                                  step, stamps)
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


async def _recompute(operator: Operator, timeline: Mapping[int, TimelinePart],
                     settled_below: Mapping[int, int],
                     progress: Progress | None,
                     switches: Sequence[tuple[int, Operator]] = (),
                     stamps: Mapping[int, Mapping[int, int]] | None = None) -> Recomputed:
    """Records from offset o of `switches` (o, op) on go through op, as after a worker's
    restart under another configuration (`_late_declared`)."""
    settled = CollectingPublisher()
    unsettled = CollectingPublisher()
    total = sum(len(v) for v in timeline.values())
    records = dups = 0
    store = DictStore()
    for p in sorted(timeline):
        recs = sorted(timeline[p])
        mark = settled_below.get(p, 0)
        cuts = sorted({0, len(recs), *(
            next((i for i, (off, _v) in enumerate(recs) if off >= o), len(recs))
            for o in (mark, *(o for o, _op in switches)))})
        for lo, hi in itertools.pairwise(cuts):
            if lo == hi:
                continue
            part = recs[lo:hi]
            sink = settled if part[0][0] < mark else unsettled
            op = operator
            for o, later in switches:
                if part[0][0] >= o:
                    op = later
            commit = BatchCommit(op, store, sink)
            for i in range(0, len(part), REPLAY_BATCH):
                batch = [(off, v or b"") for off, v in part[i:i + REPLAY_BATCH]]
                out = await commit.commit(p, batch, None if stamps is None else stamps.get(p))
                records += len(batch)
                dups += out.metrics["duplicates_dropped"]
                if progress is not None:
                    progress("recomputed", records, total)
    return Recomputed(settled.releases, unsettled.releases, settled.ledger,
                      unsettled.ledger, records, dups)


def _recompute_one(settings: Settings, key: NoiseKey, history: LedgerHistory | None,
                   partition: int, records: TimelinePart, settled_below: Mapping[int, int],
                   progress: Progress | None,
                   stamps: Mapping[int, Mapping[int, int]] | None = None) -> Recomputed:
    """One partition: with `history`, by HistoryOperators, switching configuration where
    the ledger shows the worker did (`_late_declared`)."""
    timeline = {partition: records}
    if history is None:
        return asyncio.run(_recompute(Operator(settings, key), timeline, settled_below,
                                      progress, stamps=stamps))
    got = asyncio.run(_recompute(HistoryOperator(settings, key, history), timeline,
                                 settled_below, progress, stamps=stamps))
    groups = _late_declared(settings, key, history, sorted(records), got)
    if not groups:
        return got

    def run(ats: Sequence[int]) -> Recomputed:
        # Before ats[i] the counters of groups i.. are not declared yet.
        ops = [HistoryOperator(_without(settings, {n for _c, g in groups[i:] for n in g}),
                               key, history) for i in range(len(groups) + 1)]
        return asyncio.run(_recompute(ops[0], timeline, settled_below, None,
                                      [(at, ops[i + 1]) for i, at in enumerate(ats)],
                                      stamps))

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
            LedgerHistory | None, Mapping[int, Mapping[int, int]] | None] | None = None


def _recompute_partition(partition: int) -> Recomputed:
    assert _JOB is not None
    settings, key, timeline, settled_below, history, stamps = _JOB
    return _recompute_one(settings, key, history, partition, timeline[partition],
                          settled_below, None, stamps)


def _recompute_parallel(settings: Settings, key: NoiseKey,
                        timeline: Mapping[int, TimelinePart],
                        settled_below: Mapping[int, int], progress: Progress | None,
                        jobs: int, history: LedgerHistory | None,
                        stamps: Mapping[int, Mapping[int, int]] | None) -> Recomputed:
    global _JOB
    total = sum(len(v) for v in timeline.values())
    # Largest partitions first, so no process is left with a big one at the end.
    order = sorted(timeline, key=lambda p: -len(timeline[p]))
    parts: dict[int, Recomputed] = {}
    _JOB = (settings, key, timeline, settled_below, history, stamps)
    try:
        with multiprocessing.get_context("fork").Pool(min(jobs, len(order))) as pool:
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
            ledger: Iterable[bytes | None], history: LedgerHistory | None = None,
            ) -> tuple[Tally, Tally, list[Difference]]:
    """Compare a recomputation with the published snapshots under the cut (module doc),
    adding the ledger entries `history` could not use. Returns the release and ledger
    tallies and every difference, sorted by topic, key."""
    diffs: list[Difference] = []
    ledger = list(ledger)
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
    _unexplained(theirs, ledger, diffs)

    mine_ledger, settled_ledger = _recomputed(
        "ledger",
        [((e.counter, e.creation, e.fingerprint), e.to_json()) for e in result.settled_ledger],
        [((e.counter, e.creation, e.fingerprint), e.to_json())
         for e in result.unsettled_ledger], diffs)
    theirs_ledger = _published(ledger, "ledger", _ledger_key, diffs)
    entries_tally = _check("ledger", mine_ledger, settled_ledger, settled_ledger.__contains__,
                           theirs_ledger, diffs)
    if history is not None:
        # An entry replay does not recompute at all (a forged counter) is one difference,
        # "unexpected", with the reason it could not be used.
        unexpected = {d.key: i for i, d in enumerate(diffs)
                      if d.topic == "ledger" and d.problem == "unexpected"}
        for p in history.problems:
            i = unexpected.get(p.key)
            if i is None:
                diffs.append(p)
            else:
                diffs[i] = dataclasses.replace(diffs[i],
                                               detail=f"{diffs[i].detail}; {p.detail}")
    diffs.sort(key=_diff_order)
    return releases, entries_tally, diffs


def _unexplained(theirs: Mapping[RecordKey, bytes], ledger: Iterable[bytes | None],
                 diffs: list[Difference]) -> None:
    """The reason behind a published release that differs or is unexpected: its
    fingerprint is not that of an entry of its counter in force by its tick (an entry with
    that fingerprint and since_tick <= tick, docs/downstream.md)."""
    suspects = [d.key for d in diffs if d.topic == "counts"
                and d.problem in ("different", "unexpected") and d.key in theirs]
    if not suspects:
        return
    announced: dict[str, list[tuple[str, int]]] = {}
    for e in _ledger_dicts(ledger):
        since = e.get("since_tick")
        if type(since) is int:
            announced.setdefault(e["counter"], []).append((str(e.get("fingerprint")), since))
    for k in suspects:
        counter, tick, _kind = k
        fp = orjson.loads(theirs[k]).get("fingerprint")
        if not any(f == fp and isinstance(tick, int) and since <= tick
                   for f, since in announced.get(counter, ())):
            diffs.append(Difference("counts", k, "unexplained",
                                    f"fingerprint {fp!r} is not announced by a ledger entry "
                                    f"of {counter!r} in force by tick {tick}"))


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
    # privacy_unit = "user": the bounding stage's committed offsets come before the
    # timeline's snapshot (its forwards were acknowledged before it committed).
    units_committed = (None if settings.privacy_unit != "user" else
                       kafka_io.committed_offsets(conf, settings.app_id,
                                                  units_topic(settings), timeout_s))
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

    stamps: dict[int, dict[int, int]] = {}
    timeline = kafka_io.read_values(conf, tl_topic, tl_marks, timeout_s=timeout_s,
                                    progress=read_progress, stamps=stamps,
                                    stamp_if=lambda v: marker_tick(v) is not None)
    # The published topics first: the ledger says what each counter ran under
    # (LedgerHistory), the releases place a restart the timeline does not record.
    ledger = [v for recs in kafka_io.read_values(conf, ledger_topic, ledger_marks,
                                                 timeout_s=timeout_s).values()
              for _o, v in recs]
    published = [v for recs in kafka_io.read_values(conf, counts_topic, counts_marks,
                                                    timeout_s=timeout_s).values()
                 for _o, v in recs]
    history = ledger_history(settings, key, ledger, published)
    result = recompute_timeline(settings, key, timeline, committed, progress=progress,
                                jobs=default_jobs(settings) if jobs is None else jobs,
                                history=history, stamps=stamps)
    releases, entries, diffs = compare(result, published, ledger, history)
    if settle_s > 0 and any(d.problem == "missing" for d in diffs):
        diffs = _recheck_missing(conf, diffs, result, {"counts": (counts_topic, counts_marks),
                                                       "ledger": (ledger_topic, ledger_marks)},
                                 settle_s, timeout_s)
    if units_committed is not None:
        diffs += _kept_set_differences(settings, conf, timeline, units_committed, timeout_s)
    cut = {p: (committed.get(p, 0), hi) for p, (_lo, hi) in tl_marks.items()}
    return ReplayReport(result.records, result.duplicates_dropped, releases, entries, cut,
                        diffs)


def _kept_set_differences(settings: Settings, conf: Mapping[str, str],
                          timeline: Mapping[int, Sequence[tuple[int, bytes | None]]],
                          committed: dict[int, int], timeout_s: float) -> list[Difference]:
    """privacy_unit = "user": recompute the bounding stage's kept set from the units topic
    (read after the timeline: every forwarded event's units record is in it) and compare
    it with the events the timeline carries from the stage (bounding.check_kept_set)."""
    topic = units_topic(settings)
    marks = kafka_io.end_offsets(conf, topic, timeout_s)
    log = [(p, o, v or b"") for p, recs in sorted(kafka_io.read_values(
        conf, topic, {p: (0, hi) for p, (_lo, hi) in marks.items()},
        timeout_s=timeout_s).items()) for o, v in recs]
    values = [v for _p, recs in sorted(timeline.items()) for _o, v in recs]
    return [Difference("units", ("kept", p, str(o)), problem,
                       "forwarded to the timeline but not in the kept set recomputed from "
                       "the units topic" if problem == "unexpected" else
                       "in the recomputed kept set of a committed units record, not on "
                       "the timeline")
            for problem, (p, o) in check_kept_set(settings, log, values, committed)]


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
