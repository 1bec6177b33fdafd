"""The processor's timeline, private counts and state changelog, decoded as they are read
(the many-counters and scale-out phases of `bench_stream.py`).

Which marker seals an event, when the commit that applied a marker ended, and the
seal-to-release latency are all read from the deployment's own topics with broker append
times; nothing here is a private channel of the worker.
"""

from __future__ import annotations

import bisect
import itertools
import time
from array import array
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import orjson

# Public names of confluent_kafka.admin that its __init__ re-exports without __all__.
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)
from stream_io import Tail, changelog_topics

from processor.devtools.deployment import Deployment
from processor.stream.kafka import kafka_io
from processor.stream.model.records import (
    TimelineBatch,
    TimelineFormatError,
    TimelineMarker,
    decode_timeline,
    partition_for,
)
from processor.stream.model.state import PartitionState


@dataclass
class Marker:
    offset: int
    n: int
    prev: int  # the partition's frontier before it (effective markers only)
    ts: int


@dataclass
class PartitionLog:
    """The timeline of one partition: effective markers (those raising the frontier) and
    event batches, in offset order."""

    markers: list[Marker] = field(default_factory=list)
    marker_offsets: list[int] = field(default_factory=list)
    marker_ns: list[int] = field(default_factory=list)
    # (offset, append time, highest event tick in the batch, events in it)
    batches: list[tuple[int, int, int, int]] = field(default_factory=list)


class TimelineView:
    """The timeline, the private counts and the state changelog of one deployment,
    decoded as they are read."""

    def __init__(self, conf: Mapping[str, str], dep: Deployment) -> None:
        s = dep.settings
        self.conf = conf
        self.app_id = s.app_id
        self.tick = int(s.tick_ms)
        self.parts = int(s.partitions)
        self.timeline = Tail(conf, s.topics.timeline)
        self.counts = Tail(conf, s.topics.counts)
        self.changelog: Tail | None = None
        self.logs = {p: PartitionLog() for p in range(self.parts)}
        self.sources: set[tuple[int, int]] = set()
        self.event_rows = 0
        self.foreign = 0
        # per timeline partition: the global tick and the append time of each release, in
        # two arrays of 8-byte integers (a million counters' heartbeats over a long window
        # are tens of millions of releases: tuples of them would not fit in memory)
        self.release_ticks: dict[int, array[int]] = {p: array("q") for p in range(self.parts)}
        self.release_ts: dict[int, array[int]] = {p: array("q") for p in range(self.parts)}
        # per timeline partition: the highest input offset per input partition on it
        self.needed: dict[int, dict[int, int]] = {p: {} for p in range(self.parts)}
        # per timeline partition: (append time, marker offset, duplicate filter) of each
        # partition value `p/<partition>` the worker wrote (the last write of a commit)
        self.commits: dict[int, list[tuple[int, bool, int, dict[int, int]]]] = {
            p: [] for p in range(self.parts)}
        # per timeline partition, per input partition: the distinct input offsets of the
        # events on it, sorted (what a commit's duplicate filter says was applied)
        self.offsets: dict[int, dict[int, list[int]]] = {p: {} for p in range(self.parts)}
        # the state table's latest value size per (changelog partition, key)
        self.live: dict[tuple[int, bytes | None], int] = {}
        # append time of every changelog record read
        self.changelog_ts: array[int] = array("q")
        # the format byte of the latest value of each counter key `c/...` (state.py: 4 a
        # mechanism's whole state, 5 the compact form of a key waiting for admission)
        self.live_forms: dict[bytes, int] = {}

    def attach_changelog(self) -> None:
        """Once the worker made its table's changelog topic: broker append times on it
        from now on, and read it."""
        topics = changelog_topics(self.conf, self.app_id)
        if len(topics) != 1:
            raise RuntimeError(f"expected one state changelog topic, found {topics}")
        admin = kafka_io.make_admin(self.conf)
        entry = ConfigEntry("message.timestamp.type", "LogAppendTime",
                            incremental_operation=AlterConfigOpType.SET)
        for fut in admin.incremental_alter_configs([ConfigResource(
                ResourceType.TOPIC, topics[0], incremental_configs=[entry])]).values():
            fut.result(timeout=30)
        self.changelog = Tail(self.conf, topics[0])

    @property
    def not_log_append(self) -> int:
        return self.timeline.not_log_append + self.counts.not_log_append

    def update(self) -> None:
        for r in self.timeline.records():
            try:
                rec = decode_timeline(r.value or b"")
            except TimelineFormatError:
                self.foreign += 1
                continue
            log = self.logs[r.partition]
            if isinstance(rec, TimelineMarker):
                front = log.marker_ns[-1] if log.markers else -(1 << 62)
                if rec.sealed_through > front:
                    log.markers.append(Marker(r.offset, rec.sealed_through, front, r.ts))
                    log.marker_offsets.append(r.offset)
                    log.marker_ns.append(rec.sealed_through)
            elif isinstance(rec, TimelineBatch) and rec.events:
                self.event_rows += len(rec.events)
                need = self.needed[r.partition]
                offs = self.offsets[r.partition]
                for e in rec.events:
                    self.sources.add((e.src_partition, e.src_offset))
                    got = offs.setdefault(e.src_partition, [])
                    if not got or e.src_offset > got[-1]:
                        got.append(e.src_offset)
                    else:  # a re-ingested copy, or a rebalance's reordering
                        i = bisect.bisect_left(got, e.src_offset)
                        if i == len(got) or got[i] != e.src_offset:
                            got.insert(i, e.src_offset)
                    need[e.src_partition] = max(need.get(e.src_partition, -1), e.src_offset)
                log.batches.append((r.offset, r.ts, max(e.ts_ms for e in rec.events)
                                    // self.tick, len(rec.events)))
        for r in self.counts.records():
            d = orjson.loads(r.value or b"{}")
            p = partition_for(str(d["counter"]), self.parts)
            self.release_ticks[p].append(int(d["tick_start_ms"]) // self.tick)
            self.release_ts[p].append(r.ts)
        self._update_changelog()

    def _update_changelog(self) -> None:
        if self.changelog is None:
            return
        for r in self.changelog.records():
            self.changelog_ts.append(r.ts)
            if r.value is None:
                self.live.pop((r.partition, r.key), None)
                if r.key is not None:
                    self.live_forms.pop(r.key, None)
                continue
            self.live[(r.partition, r.key)] = len(r.key or b"") + len(r.value)
            if r.key is not None and r.key.startswith(b"c/") and len(r.value) > 3:
                self.live_forms[r.key] = r.value[3]
            if r.key is not None and r.key.startswith(b"p/"):
                ps = PartitionState.from_bytes(r.value)
                # The duplicate filter names sources "<input topic id>/<partition>".
                seen: dict[int, int] = {}
                for label, offset in ps.input_offsets.items():
                    src = int(label.rsplit("/", 1)[-1])
                    seen[src] = max(offset, seen.get(src, -1))
                self.commits[int(r.key[2:])].append((r.ts, r.log_append, ps.marker_offset,
                                                     seen))

    def releases(self, p: int) -> Iterator[tuple[int, int]]:
        """(global tick, append time) of each release of timeline partition p read so far."""
        return zip(self.release_ticks[p], self.release_ts[p], strict=True)

    def close(self) -> None:
        self.timeline.close()
        self.counts.close()
        if self.changelog is not None:
            self.changelog.close()

    def sealing_marker(self, p: int, offset: int, max_tick: int) -> Marker | None:
        """The marker that seals every event of the batch at `offset` (see the docstring)."""
        log = self.logs[p]
        i = bisect.bisect_right(log.marker_offsets, offset)
        front = log.markers[i - 1].n if i else None
        need = max_tick if front is None else max(max_tick, front + 1)
        j = bisect.bisect_left(log.marker_ns, need, lo=i)
        return log.markers[j] if j < len(log.markers) else None

    def account(self) -> Accounting:
        """Where the processor is with every event on the timeline so far."""
        acc = Accounting(events=len(self.sources), rows=self.event_rows)
        for p, log in self.logs.items():
            if not log.batches:
                continue
            acc.first_batch = min(acc.first_batch or log.batches[0][1], log.batches[0][1])
            acc.last_batch = max(acc.last_batch or 0, max(b[1] for b in log.batches))
            seal: Marker | None = None
            for off, _ts, g, _n in log.batches:
                m = self.sealing_marker(p, off, g)
                if m is None:
                    seal = None
                    break
                if seal is None or m.offset > seal.offset:
                    seal = m
            if seal is None:
                acc.pending.append(p)
                continue
            need = self.needed[p]
            # The commit that applied the sealing marker (and so every event before it,
            # which its duplicate filter confirms) ended with this partition value.
            done = next(((ts, la) for ts, la, marker, applied in self.commits[p]
                         if marker >= seal.offset
                         and all(applied.get(sp, -1) >= so for sp, so in need.items())), None)
            if done is None:
                acc.pending.append(p)
                continue
            acc.not_log_append += not done[1]
            own = [ts for g, ts in self.releases(p) if seal.prev < g <= seal.n]
            acc.released += len(own)
            acc.end = max(acc.end or 0, done[0], *own)
            acc.seal_lag = max(acc.seal_lag, done[0] - seal.ts)
        return acc

    def applied_by(self, t_ms: int) -> int:
        """Events the operator had committed by broker time `t_ms`: per timeline partition,
        those its last partition value written by then says its duplicate filter covers."""
        n = 0
        for p, commits in self.commits.items():
            last = None
            for ts, _la, _m, applied in commits:
                if ts > t_ms:
                    break
                last = applied
            if last is None:
                continue
            for sp, offs in self.offsets[p].items():
                n += bisect.bisect_right(offs, last.get(sp, -1))
        return n

    def marker_lags(self, lo_ms: int, hi_ms: int) -> list[tuple[int, int]]:
        """(marker append time, ms until the commit that applied it) of each effective
        marker appended in [lo_ms, hi_ms] (markers not committed yet are left out)."""
        out: list[tuple[int, int]] = []
        for p, log in self.logs.items():
            commits = self.commits[p]
            applied = list(itertools.accumulate((c[2] for c in commits), max))
            for m in log.markers:
                if lo_ms <= m.ts <= hi_ms:
                    j = bisect.bisect_left(applied, m.offset)
                    if j < len(commits):
                        out.append((m.ts, commits[j][0] - m.ts))
        return out

    def latencies(self, lo_ms: int, hi_ms: int) -> list[tuple[int, int]]:
        """(marker append time, seal-to-release ms) of each release whose sealing marker
        (the first one with n >= its tick) was appended in [lo_ms, hi_ms]."""
        out: list[tuple[int, int]] = []
        for p, log in self.logs.items():
            for g, ts in self.releases(p):
                j = bisect.bisect_left(log.marker_ns, g)
                if j < len(log.markers) and lo_ms <= log.markers[j].ts <= hi_ms:
                    out.append((log.markers[j].ts, ts - log.markers[j].ts))
        return out


@dataclass
class Accounting:
    events: int  # distinct input (partition, offset) on the timeline
    rows: int  # event rows on the timeline (duplicates included)
    first_batch: int | None = None
    last_batch: int | None = None
    end: int | None = None
    released: int = 0  # releases of the sealing markers' ticks
    not_log_append: int = 0  # commit records used that carry no broker append time
    # the longest time from a sealing marker's append to the commit that applied it
    seal_lag: int = 0
    pending: list[int] = field(default_factory=list)

    def done(self, expected: int) -> bool:
        return self.events >= expected and not self.pending and self.end is not None


def wait_accounted(view: TimelineView, expected: int, timeout_s: float,
                   worker_log: Callable[[], str]) -> Accounting | None:
    """Poll the topics until the processor accounted for `expected` events (None at the
    deadline). The polling only decides when to stop looking: every time is a timestamp."""
    deadline = time.monotonic() + timeout_s
    while True:
        view.update()
        acc = view.account()
        if acc.done(expected):
            return acc
        if time.monotonic() > deadline:
            tail = worker_log().strip().splitlines()[-5:]
            print(f"  processor did not account for all events: {acc}; worker log tail: "
                  + " | ".join(tail), flush=True)
            return None
        time.sleep(0.5)  # polling interval of the bench's reader (not part of any figure)
