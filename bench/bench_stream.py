"""Stream benchmark: the processor next to plain consumers on the same broker, in one run.

    python bench/bench_stream.py [--phase throughput|many|scaleout|all] [--quick]
        [--events 20000] [--repeat 3] [--counters 10000] [--rate 1000] [--seconds 60]
        [--bootstrap HOST:PORT] [--json FILE]

Starts a local single-node broker (processor.devtools.local_kafka) unless --bootstrap or
KAFKA_BOOTSTRAP_SERVERS names one. Every deployment (app id, topics, key, config, state
dirs, logs) lives in one temporary directory outside the repository; workers, child
processes and the broker are stopped on exit, error, Ctrl-C or SIGTERM.

Clock. Every time below is a Kafka record timestamp: all topics the bench creates use
message.timestamp.type=LogAppendTime, so a record's timestamp is the moment the broker
appended it (one clock, the broker's; the report says if any record read was not
LogAppendTime). No figure depends on when the bench polled, or on a consumer's commit.

1. Throughput (--events N, --repeat R). Per repeat, three stages run one after the other,
   in an order rotated between repeats, each on its own fresh input topic (4 partitions)
   carrying the same N events (100 declared counters, value 1):
   (a) a plain Faust agent (a child process: one agent that counts the topic's records,
       in-memory store, Faust defaults), which appends a "done" record to an output topic
       when it has counted N;
   (b) the processor: the worker in the tree (`python -m processor worker`: ingest,
       timeline, markers, operator, RocksDB table and changelog, ledger, dead letters,
       heartbeats), tick 100 ms, lateness 100 ms, heartbeat every 60 ticks, ECC eps=1;
   (c) for context, a plain confluent-kafka loop (a child process: batched consume,
       asynchronous produce of each record to an output topic, one flush at the end).
   Each stage is started, fed ONE warm-up record, and the bench waits until the stage's
   output for it appears (for the processor: the ledger holds every counter and the
   warm-up event is sealed and committed, so every part of the worker runs). Only then
   are the N events produced, as fast as one confluent-kafka producer goes (its duration
   is reported: it is included in every stage alike).
     start = append time of the first of the N input records (the same definition for
             all three: the first record the stage consumed);
     end   = (a) the append time of the agent's "done" record;
             (c) the append time of the last forwarded record;
             (b) the append time of the record that completes the processor's work on
             the last event: per timeline partition, take the last timeline batch
             carrying any of the events, and the marker that seals all of them (the
             first later marker whose "sealed through" n is >= the batch's highest event
             tick and > the partition's frontier at the batch: a late event joins the
             first open tick); the batch commit that applied that marker ends with the
             state write of the partition value `p/<partition>` (commit.py: releases
             first, then state, the partition value last), read from the state
             changelog topic and decoded with state.PartitionState: the first such
             record whose marker offset is >= that marker's and whose duplicate filter
             covers every input offset on the partition. end = the latest of those
             records and of the releases that marker produced, over the partitions.
   The N events are stamped lateness + 2 ticks before production, so at the worker each
   is late and joins the first open tick: the sealing then waits at most one tick (100
   ms) after the operator applied the last batch, not for the wall clock to pass the
   events' own tick ("after last batch ms" = end - append time of the last batch: the
   operator's lag behind ingest plus that wait). rate = N / (end - start); the headline
   is the ratio processor / plain Faust agent, per repeat and its range (target >= 1.5).
   Included in both (a) and (b): fetch, decode, the stage's work, producing its output,
   the broker's append. Excluded from both: process start-up, group join, the warm-up,
   offset commits after the last output, shutdown.

2. Many counters (--counters C, --rate R, --seconds S). One worker with C counters, the
   README configuration otherwise (tick 1 s, lateness 2 s, heartbeat every 60 ticks,
   4 partitions, ECC). After the ledger holds every counter, a paced producer sends R
   events/s, each stamped with the wall clock, cycling over the counters, for a warm-up
   then a measured window of S seconds (before the load: an idle window, the workers'
   CPU with no input). Reported: whether the worker kept up: per marker appended in the
   window, the time to the commit that applied it (the first changelog record `p/<p>`
   whose marker offset reaches it); kept up = its p95 within one tick (otherwise markers
   queue behind the operator). Whether it caught up after the load: every event on the
   timeline and sealed and committed (as in phase 1) within 5 minutes, with the delay
   from the last input record to its timeline batch and to that commit (an event stamped
   now waits lateness + the rest of its tick for the seal). Seal-to-release latency
   p50/p95/max (for each release whose sealing marker was appended inside the window:
   release append time - append time of the first marker that sealed its tick), also
   per first and last third of the window
   (growth means falling behind); the RocksDB directory size at the end (SST / WAL /
   other, and the blocks allocated) against the state table's live size (latest
   non-tombstone value per key in the changelog topic, key + value bytes) and their
   ratio (target <= 3); the worker's resident memory; the machine's CPU busy fraction
   and load average (the machine is shared); warning/error lines of the worker logs.

3. Scale-out (--repeat K: K pairs, default 1): the run of phase 2 with 1 worker and again
   with 2 worker processes of the same app id (one consumer group, a state dir each), in an
   order rotated between pairs (1-2, 2-1, ...): the first worker starts alone and creates
   the counters; the second then joins, and the load starts once the group's assignment is
   stable, after a 10 s pause (standby restore) and the idle window. Per run: CPU-seconds
   (user + system of every thread of the worker processes and their children, psutil;
   per thread group from /proc/<pid>/task/*/stat) over the idle window and over the
   measured window; total CPU per event = the window's CPU / the events produced in it;
   marginal = (the window's CPU - each worker's idle rate x the window) / the same events;
   both also against the events the operator committed in the window (from the partition
   values' duplicate filters; a run that falls behind does not do the window's work in
   the window). Side by side per pair with the ratio 2/1 and its range (target: within
   20%); timeline batch records and events per record, changelog records per event; the
   timeline partitions each worker held (the broker's group description; the second
   worker's member is the one that joined later), before and after the join, with the
   per-partition RocksDB directories each worker's state dir holds (a partition's state
   moves with it, restored from the changelog; with standby replicas Faust also keeps
   copies of the other worker's partitions). The 2-core machine cannot show a wall-clock
   speed-up with the broker and the load on it: CPU per event is the figure.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import itertools
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402
import psutil  # noqa: E402
from confluent_kafka import (  # noqa: E402
    OFFSET_BEGINNING,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)

# Public names of confluent_kafka.admin that its __init__ re-exports without __all__.
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # noqa: E402
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from processor.devtools.deployment import (  # noqa: E402
    Deployment,
    isolated_deployment,
    write_config,
)
from processor.devtools.local_kafka import free_port  # noqa: E402
from processor.stream import kafka_io  # noqa: E402
from processor.stream.config import load_settings, with_overrides  # noqa: E402
from processor.stream.records import (  # noqa: E402
    TimelineBatch,
    TimelineFormatError,
    TimelineMarker,
    decode_timeline,
    partition_for,
)
from processor.stream.state import PartitionState  # noqa: E402

#: Topic config of every topic the bench creates: record timestamps are broker append times.
LOG_APPEND = {"message.timestamp.type": "LogAppendTime"}
#: The retention of a deployment's topics: every record kept (what the worker requires of
#: the ledger, and by default of the timeline and the private counts).
KEPT = {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"}
#: Counters of the throughput phase.
TPUT_COUNTERS = 100
#: Throughput-phase timing of the processor (see the module docstring).
TPUT_TICK_MS = 100
TPUT_LATENESS_MS = 100
#: Phases 2-3: the pause after the assignment is stable, then the idle window (each at
#: most a third of the measured window).
SETTLE_S = 10.0
IDLE_S = 15.0


# ------------------------------------------------------------------------ reading topics

@dataclass(frozen=True, slots=True)
class Rec:
    """One record read back: its place, broker timestamp, key and value."""

    partition: int
    offset: int
    ts: int
    log_append: bool
    key: bytes | None
    value: bytes | None


class Tail:
    """Reads one topic from its beginning, incrementally, without a consumer group."""

    def __init__(self, conf: Mapping[str, str], topic: str) -> None:
        self.topic = topic
        self._c = Consumer({**conf, "group.id": f"dpc-bench-{uuid.uuid4().hex}",
                            "enable.auto.commit": "false", "auto.offset.reset": "earliest",
                            "enable.partition.eof": "false"})
        deadline = time.monotonic() + 30
        while True:  # a topic created a moment ago may not be in the metadata yet
            t = self._c.list_topics(topic, timeout=30).topics.get(topic)
            if (t is not None and t.error is None) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if t is None or t.error is not None:
            self._c.close()
            raise RuntimeError(f"topic {topic!r} not found")
        self.partitions = sorted(t.partitions)
        self._c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in self.partitions])
        self._next = dict.fromkeys(self.partitions, 0)
        self.count = 0
        self.not_log_append = 0

    def catch_up(self, timeout_s: float = 120.0) -> list[Rec]:
        """Everything appended before this call that was not returned yet."""
        deadline = time.monotonic() + timeout_s
        his = {p: self._high(p, deadline) for p in self.partitions}
        out: list[Rec] = []
        while any(self._next[p] < his[p] for p in self.partitions):
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {self.topic!r} timed out")
            for msg in self._c.consume(num_messages=5000, timeout=0.2):
                err = msg.error()
                if err is not None:
                    if err.fatal():
                        raise RuntimeError(f"reading {self.topic!r}: {err}")
                    continue  # end of partition, or transient: the deadline bounds it
                ts_type, ts = msg.timestamp()
                rec = Rec(int(msg.partition() or 0), int(msg.offset() or 0), int(ts),
                          ts_type == TIMESTAMP_LOG_APPEND_TIME, msg.key(), msg.value())
                self.not_log_append += not rec.log_append
                self._next[rec.partition] = rec.offset + 1
                out.append(rec)
            # Compacted or transactional tails never reach the watermark by record offsets.
            for p in self.partitions:
                if self._next[p] < his[p]:
                    pos = self._c.position([TopicPartition(self.topic, p)])[0].offset
                    if pos is not None and pos > self._next[p]:
                        self._next[p] = int(pos)
        self.count += len(out)
        return out

    def _high(self, p: int, deadline: float) -> int:
        """The high watermark of partition p; retries while a new topic's leader settles."""
        while True:
            try:
                return int(self._c.get_watermark_offsets(TopicPartition(self.topic, p),
                                                         timeout=30)[1])
            except KafkaException as exc:
                err = exc.args[0]
                if time.monotonic() > deadline or not (
                        isinstance(err, KafkaError) and (err.retriable() or err.code() in (
                            KafkaError.NOT_LEADER_FOR_PARTITION,
                            KafkaError.LEADER_NOT_AVAILABLE,
                            KafkaError.UNKNOWN_TOPIC_OR_PART))):
                    raise
                time.sleep(0.2)  # back-off while the broker elects the partition's leader

    def close(self) -> None:
        self._c.close()


def client_config(bootstrap: str) -> dict[str, str]:
    """The bench's librdkafka clients: errors only on stderr (not its retry chatter)."""
    return {**kafka_io.plain_config(bootstrap), "log_level": "3"}


def create_topics(conf: Mapping[str, str], names: Sequence[str], partitions: int,
                  config: Mapping[str, str] | None = None) -> None:
    kafka_io.create_topics(conf, names, partitions, replication=kafka_io.replication_for(conf),
                           config={**LOG_APPEND, **(config or {})})


def create_deployment_topics(conf: Mapping[str, str], dep: Deployment) -> None:
    """The deployment's five topics, LogAppendTime, keeping every record (the worker
    refuses a ledger that would not, and warns about the others: app.check_retention)."""
    t = dep.topics
    create_topics(conf, [t.input, t.timeline, t.counts, t.ledger, t.deadletter],
                  dep.settings.partitions, KEPT)


def group_assignment(conf: Mapping[str, str], group: str,
                     topic: str) -> dict[str, list[int]]:
    """member id -> partitions of `topic` it holds, from the broker's group description."""
    admin = kafka_io.make_admin(conf)
    desc = admin.describe_consumer_groups([group], request_timeout=30)[group].result(timeout=30)
    return {str(m.member_id): sorted(int(tp.partition) for tp in m.assignment.topic_partitions
                                     if tp.topic == topic)
            for m in desc.members}


def groups_with_prefix(conf: Mapping[str, str], prefix: str) -> list[str]:
    admin = kafka_io.make_admin(conf)
    res = admin.list_consumer_groups(request_timeout=30).result(timeout=30)
    return sorted(str(g.group_id) for g in res.valid if str(g.group_id).startswith(prefix))


def changelog_topics(conf: Mapping[str, str], app_id: str) -> list[str]:
    md = kafka_io.make_admin(conf).list_topics(timeout=30)
    return sorted(t for t in md.topics if t.startswith(app_id + "-") and t.endswith("-changelog"))


# ------------------------------------------------------------------------ the timeline

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
        # per timeline partition: (global tick, append time) of each release
        self.releases: dict[int, list[tuple[int, int]]] = {p: [] for p in range(self.parts)}
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
        self.changelog_ts: list[int] = []

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
        for r in self.timeline.catch_up():
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
        for r in self.counts.catch_up():
            d = orjson.loads(r.value or b"{}")
            p = partition_for(str(d["counter"]), self.parts)
            self.releases[p].append((int(d["tick_start_ms"]) // self.tick, r.ts))
        if self.changelog is None:
            return
        for r in self.changelog.catch_up():
            self.changelog_ts.append(r.ts)
            if r.value is None:
                self.live.pop((r.partition, r.key), None)
                continue
            self.live[(r.partition, r.key)] = len(r.key or b"") + len(r.value)
            if r.key is not None and r.key.startswith(b"p/"):
                ps = PartitionState.from_bytes(r.value)
                self.commits[int(r.key[2:])].append((r.ts, r.log_append, ps.marker_offset,
                                                     dict(ps.input_offsets)))

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
            own = [ts for g, ts in self.releases[p] if seal.prev < g <= seal.n]
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
        for p, rels in self.releases.items():
            log = self.logs[p]
            for g, ts in rels:
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


# ------------------------------------------------------------------------ child processes

def _child_faust_agent(bootstrap: str, src: str, out: str, n: int, datadir: str) -> None:
    """A Faust app whose one agent counts the records of `src`; it appends b"warm" after
    the first (the warm-up record) and b"done" after n more."""
    import asyncio

    import faust

    app = faust.App(f"bench-faust-{uuid.uuid4().hex[:8]}", broker=f"kafka://{bootstrap}",
                    web_enabled=False, consumer_auto_offset_reset="earliest",
                    store="memory://", datadir=datadir)
    src_topic = app.topic(src, key_type=bytes, value_type=bytes, key_serializer="raw",
                          value_serializer="raw")
    out_topic = app.topic(out, key_type=bytes, value_type=bytes, key_serializer="raw",
                          value_serializer="raw")

    async def count(stream: Any) -> None:
        seen = 0
        async for _value in stream:
            seen += 1
            if seen == 1:
                await out_topic.send(value=b"warm")
            elif seen == n + 1:
                await out_topic.send(value=b"done")

    app.agent(src_topic, name="bench-count")(count)
    asyncio.set_event_loop(asyncio.new_event_loop())
    faust.Worker(app, loglevel="warning", quiet=True).execute_from_commandline()


def _child_kafka_loop(bootstrap: str, src: str, out: str, n: int) -> None:
    """Consume `src` in batches, produce every record to `out` (same partition), flush once
    after the warm-up record and once at the end (n + 1 records)."""
    conf = client_config(bootstrap)
    consumer = Consumer({**conf, "group.id": f"bench-loop-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": "false", "auto.offset.reset": "earliest"})
    producer = kafka_io.make_producer(conf)
    consumer.subscribe([src])
    seen = 0
    try:
        while seen < n + 1:
            for msg in consumer.consume(num_messages=1000, timeout=0.1):
                if msg.error() is not None:
                    continue
                while True:
                    try:
                        producer.produce(out, value=msg.value(),
                                         partition=int(msg.partition() or 0))
                        break
                    except BufferError:
                        producer.poll(0.01)
                seen += 1
                if seen == 1:
                    producer.flush(30)
            producer.poll(0)
        producer.flush(60)
        # Stay until the bench stops this process: exiting would leave the group and
        # nothing after the last produce belongs to the measurement anyway.
        while True:
            time.sleep(3600)
    finally:
        consumer.close()


_NOTABLE = re.compile(r"\b(WARNING|ERROR|CRITICAL)\b|Traceback")


def log_findings(dep: Deployment) -> dict[str, Any]:
    """Warning/error lines of a deployment's worker logs: their count and a few distinct
    ones (digits folded). The worker never logs values or secrets, so they can be shown."""
    found: list[str] = []
    for w in dep.workers:
        with contextlib.suppress(OSError):
            found += [line.strip() for line in w.log_path.read_text(errors="replace")
                      .splitlines() if _NOTABLE.search(line)]
    distinct = list(dict.fromkeys(re.sub(r"\d+", "N", line)[:200] for line in found))
    return {"count": len(found), "examples": distinct[:3]}


class Children:
    """Child processes of the bench (baselines and workers), stopped on every exit path."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.deployments: list[Deployment] = []

    def spawn(self, args: Sequence[str], cwd: Path, log: Path) -> subprocess.Popen[bytes]:
        with open(log, "ab") as fh:
            proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *args],
                                    stdout=fh, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, cwd=str(cwd))
        self.procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)
        if proc in self.procs:
            self.procs.remove(proc)

    def close_deployment(self, dep: Deployment) -> dict[str, Any]:
        """Stop its workers; what their logs say at warning level and above."""
        dep.close()
        if dep in self.deployments:
            self.deployments.remove(dep)
        return log_findings(dep)

    def close(self) -> None:
        for proc in list(self.procs):
            self.stop(proc)
        for dep in list(self.deployments):
            self.close_deployment(dep)


# ------------------------------------------------------------------------ load

def _event(counter: str, ts: int) -> bytes:
    return orjson.dumps({"counter": counter, "ts": ts, "value": 1})


@dataclass
class Produced:
    count: int = 0
    first_ts: int | None = None
    last_ts: int = 0
    errors: int = 0
    not_log_append: int = 0

    def on_delivery(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self.errors += 1
            return
        ts_type, ts = msg.timestamp()
        self.not_log_append += ts_type != TIMESTAMP_LOG_APPEND_TIME
        self.count += 1
        self.first_ts = ts if self.first_ts is None else min(self.first_ts, ts)
        self.last_ts = max(self.last_ts, ts)


def _produce(producer: Producer, topic: str, value: bytes, stats: Produced) -> None:
    while True:
        try:
            producer.produce(topic, value=value, on_delivery=stats.on_delivery)
            return
        except BufferError:
            producer.poll(0.01)


def produce_burst(conf: Mapping[str, str], topic: str, values: Sequence[bytes]) -> Produced:
    """Produce `values` as fast as one producer goes; wait for every acknowledgement."""
    stats = Produced()
    producer = kafka_io.make_producer(conf)
    for v in values:
        _produce(producer, topic, v, stats)
        producer.poll(0)
    left = producer.flush(60)
    if left or stats.errors or stats.count != len(values):
        raise RuntimeError(f"producing to {topic}: {left} unsent, {stats.errors} errors")
    return stats


def wait_until(pred: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Poll `pred` until true; seconds waited. TimeoutError names `what`."""
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"{what}: not after {timeout_s:.0f} s")
        time.sleep(0.25)  # polling interval of the bench (not part of any figure)
    return time.monotonic() - t0


# ------------------------------------------------------------------------ phase 1

def tput_events(n: int, ts: int) -> list[bytes]:
    return [_event(f"k{i % TPUT_COUNTERS:03d}", ts) for i in range(n)]


def stage_baseline(kind: str, conf: Mapping[str, str], bootstrap: str, tmp: Path, n: int,
                   children: Children) -> dict[str, Any]:
    """(a) the plain Faust agent or (c) the plain confluent-kafka loop."""
    uid = uuid.uuid4().hex[:8]
    src, out = f"bench-{kind}-in-{uid}", f"bench-{kind}-out-{uid}"
    create_topics(conf, [src, out], 4)
    work = tmp / f"{kind}-{uid}"
    work.mkdir()
    args = (["--child", "faust-agent", bootstrap, src, out, str(n), str(work)]
            if kind == "faust" else ["--child", "kafka-loop", bootstrap, src, out, str(n)])
    proc = children.spawn(args, work, work / "child.log")
    tail = Tail(conf, out)
    got: list[Rec] = []
    try:
        produce_burst(conf, src, tput_events(1, int(time.time() * 1000)))

        def warm() -> bool:
            got.extend(tail.catch_up())
            return bool(got) or proc.poll() is not None
        wait_until(warm, 180, f"{kind}: warm-up output")
        if proc.poll() is not None:
            raise RuntimeError(f"{kind} child exited: {(work / 'child.log').read_text()[-2000:]}")
        got.clear()
        load = produce_burst(conf, src, tput_events(n, int(time.time() * 1000)))

        def finished() -> bool:
            got.extend(tail.catch_up())
            return (any(r.value == b"done" for r in got) if kind == "faust"
                    else len(got) >= n) or proc.poll() is not None
        wait_until(finished, 600, f"{kind}: all {n} events")
        if proc.poll() is not None:
            raise RuntimeError(f"{kind} child exited: {(work / 'child.log').read_text()[-2000:]}")
    finally:
        children.stop(proc)
        tail.close()
    end = (max(r.ts for r in got if r.value == b"done") if kind == "faust"
           else max(r.ts for r in got))
    assert load.first_ts is not None
    return {"rate": n / max(1e-3, (end - load.first_ts) / 1000), "seconds":
            (end - load.first_ts) / 1000, "produce_s": (load.last_ts - load.first_ts) / 1000,
            "not_log_append": load.not_log_append + tail.not_log_append}


def stage_processor(conf: Mapping[str, str], bootstrap: str, tmp: Path, n: int,
                    children: Children) -> dict[str, Any]:
    """(b) the processor worker in the tree."""
    tick = TPUT_TICK_MS
    start = (int(time.time() * 1000) // tick) * tick - 100 * tick
    names = [f"k{i:03d}" for i in range(TPUT_COUNTERS)]
    dep = isolated_deployment(bootstrap, dict.fromkeys(names, start), parent=tmp,
                              name="bench-tput", create_topics=False, tick_ms=tick,
                              lateness_ms=TPUT_LATENESS_MS, heartbeat_ticks=60, partitions=4,
                              mechanism="ecc", epsilon=1.0, delta=1e-6,
                              metrics_port=free_port())
    children.deployments.append(dep)
    create_deployment_topics(conf, dep)
    view = TimelineView(conf, dep)
    ledger = Tail(conf, dep.topics.ledger)
    try:
        dep.worker.start()
        produce_burst(conf, dep.topics.input, tput_events(1, int(time.time() * 1000)))

        def ready() -> bool:
            if not dep.worker.alive():
                raise RuntimeError("worker exited: " + dep.worker.log_tail())
            ledger.catch_up()
            return ledger.count >= TPUT_COUNTERS
        wait_until(ready, 300, "processor: ledger entries of every counter")
        view.attach_changelog()
        if wait_accounted(view, 1, 120, dep.worker.log_tail) is None:
            raise RuntimeError("processor: the warm-up event was not accounted for")
        # Late at the worker: lateness + 2 ticks before now (see the module docstring).
        stamp = int(time.time() * 1000) - TPUT_LATENESS_MS - 2 * tick
        load = produce_burst(conf, dep.topics.input, tput_events(n, stamp))
        acc = wait_accounted(view, n + 1, 600, dep.worker.log_tail)
        if acc is None or acc.end is None:
            raise RuntimeError("processor did not account for every event")
        rss = psutil.Process(dep.worker.proc.pid).memory_info().rss if dep.worker.proc else 0
        assert load.first_ts is not None
        t0, t1 = load.first_ts, acc.end
        batches = sum(t0 <= b[1] <= t1 for log in view.logs.values() for b in log.batches)
        changelog = sum(t0 <= t <= t1 for t in view.changelog_ts)
    finally:
        view.close()
        ledger.close()
        logs = children.close_deployment(dep)
    assert load.first_ts is not None and acc.last_batch is not None
    secs = (acc.end - load.first_ts) / 1000
    return {"rate": n / max(1e-3, secs), "seconds": secs,
            "produce_s": (load.last_ts - load.first_ts) / 1000,
            "ingest_s": (acc.last_batch - load.first_ts) / 1000,
            "tail_ms": acc.end - acc.last_batch, "released": acc.released,
            "duplicates": acc.rows - acc.events, "rss": rss, "logs": logs,
            "batches": batches, "changelog_per_event": changelog / n,
            "not_log_append": load.not_log_append + view.not_log_append + acc.not_log_append}


def phase_throughput(conf: Mapping[str, str], bootstrap: str, tmp: Path, n: int, repeat: int,
                     children: Children) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    stages = ["faust", "processor", "kafka"]
    for r in range(repeat):
        order = stages[r % 3:] + stages[:r % 3]
        res: dict[str, Any] = {"order": order}
        for kind in order:
            print(f"  repeat {r + 1}/{repeat}: {kind} ...", flush=True)
            res[kind] = (stage_processor(conf, bootstrap, tmp, n, children)
                         if kind == "processor"
                         else stage_baseline(kind, conf, bootstrap, tmp, n, children))
            res[kind]["loadavg"] = os.getloadavg()[0]
            print(f"    {res[kind]['rate']:,.0f} events/s", flush=True)
        res["ratio"] = res["processor"]["rate"] / res["faust"]["rate"]
        runs.append(res)
    return runs


# ------------------------------------------------------------------------ phases 2 and 3

def _proc_tree(pid: int) -> list[psutil.Process]:
    try:
        p = psutil.Process(pid)
        return [p, *p.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def cpu_seconds(pid: int) -> float:
    total = 0.0
    for p in _proc_tree(pid):
        with contextlib.suppress(psutil.NoSuchProcess):
            t = p.cpu_times()
            total += t.user + t.system
    return total


_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def thread_group(tid: int, pid: int, comm: str) -> str:
    """Which part of a worker a thread is, by its kernel name: the main thread runs
    Faust's event loop (the operator agent, timers, aiokafka clients); librdkafka names
    its threads rdk:*, RocksDB rocksdb:*; the other Python threads are the ingest loop,
    the lag probe, the endpoints' server and executor threads (Python does not name
    its threads for the kernel, so they are one group)."""
    if tid == pid:
        return "main"
    if comm.startswith("rdk:"):
        return "librdkafka"
    if comm.startswith("rocksdb"):
        return "rocksdb"
    return "other python"


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU-seconds (user + system) of the threads of `pid` and its children so far, by
    `thread_group` (from /proc/<pid>/task/*/stat). A thread that ended between two
    readings is missing from the later one, so differences are per group, never negative
    by more than such a thread's time (the workers' threads live as long as they do)."""
    out: dict[str, float] = {}
    for p in _proc_tree(pid):
        for task in Path(f"/proc/{p.pid}/task").glob("*"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                raw = (task / "stat").read_text()
                comm = raw[raw.index("(") + 1:raw.rindex(")")]
                fields = raw[raw.rindex(")") + 2:].split()
                # fields[11], fields[12]: utime, stime (stat(5) fields 14 and 15)
                cpu = (int(fields[11]) + int(fields[12])) * _TICK_S
                group = thread_group(int(task.name), pid, comm)
                out[group] = out.get(group, 0.0) + cpu
    return out


def _diff(a: Mapping[str, float], b: Mapping[str, float]) -> dict[str, float]:
    return {k: b.get(k, 0.0) - a.get(k, 0.0) for k in sorted(set(a) | set(b))}


def rss_bytes(pid: int) -> int:
    total = 0
    for p in _proc_tree(pid):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += p.memory_info().rss
    return total


def machine_busy(t0: Any, t1: Any) -> float:
    """Fraction of the machine's CPU time that was not idle between two psutil.cpu_times()."""
    total = sum(t1) - sum(t0)
    idle = (t1.idle - t0.idle) + (getattr(t1, "iowait", 0.0) - getattr(t0, "iowait", 0.0))
    return float(1.0 - idle / total) if total > 0 else float("nan")


def dir_sizes(path: Path) -> dict[str, int]:
    """Bytes under `path` (file sizes): SST files, write-ahead logs, everything else; and
    "disk", the blocks allocated (what du counts: it includes preallocated space)."""
    out = {"sst": 0, "wal": 0, "other": 0}
    disk = 0
    for f in path.rglob("*"):
        if f.is_file():
            kind = "sst" if f.suffix == ".sst" else "wal" if f.suffix == ".log" else "other"
            with contextlib.suppress(OSError):
                st = f.stat()
                out[kind] += st.st_size
                disk += st.st_blocks * 512
    return {**out, "disk": disk}


_DB_RE = re.compile(r"-(\d+)\.db$")


def partition_dbs(path: Path) -> dict[int, int]:
    """timeline partition -> bytes of its RocksDB directory under a worker's state dir."""
    out: dict[int, int] = {}
    for d in path.rglob("*.db"):
        m = _DB_RE.search(d.name)
        if d.is_dir() and m:
            out[int(m.group(1))] = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
    return out


def _pcts(xs: Sequence[float]) -> tuple[float, float, float]:
    if not xs:
        return (float("nan"),) * 3
    s = sorted(xs)
    return (s[len(s) // 2], s[min(len(s) - 1, int(0.95 * len(s)))], s[-1])


def steady_run(conf: Mapping[str, str], bootstrap: str, tmp: Path, workers: int,
               counters: int, rate: float, seconds: float,
               children: Children, standby: int = 1) -> dict[str, Any]:
    """Phase 2 with `workers` worker processes (see the module docstring); `standby` is
    the deployment's standby_replicas."""
    tick = 1000  # the README configuration's tick
    start = (int(time.time() * 1000) // tick) * tick
    names = [f"m{i:05d}" for i in range(counters)]
    dep = isolated_deployment(bootstrap, dict.fromkeys(names, start), parent=tmp,
                              name=f"bench-w{workers}", create_topics=False,
                              metrics_port=free_port(), standby_replicas=standby)
    children.deployments.append(dep)
    s = dep.settings
    create_deployment_topics(conf, dep)
    view = TimelineView(conf, dep)
    ledger = Tail(conf, dep.topics.ledger)
    res: dict[str, Any] = {"workers": workers, "counters": counters, "rate": rate,
                           "tick_ms": s.tick_ms, "lateness_ms": s.lateness_ms,
                           "standby_replicas": standby}
    procs = [dep.worker]
    complete = False
    try:
        t0 = time.monotonic()
        dep.worker.start()

        def created() -> bool:
            for w in procs:
                if not w.alive():
                    raise RuntimeError("worker exited: " + w.log_tail())
            ledger.catch_up()
            return ledger.count >= counters
        wait_until(created, 600, f"ledger entries for {counters} counters")
        res["created_s"] = time.monotonic() - t0
        view.attach_changelog()
        group = s.app_id
        first = group_assignment(conf, group, s.topics.timeline)
        res["assign_before"] = {"worker1": sorted(p for ps in first.values() for p in ps)}
        members = {m: "worker1" for m in first}
        if workers == 2:
            procs.append(dep.add_worker("worker2"))
            # A metrics port of its own: a worker that cannot bind the shared one serves no
            # endpoint and runs no lag probe, and the two workers would not be equal.
            write_config(with_overrides(load_settings(procs[1].config_path, env={}),
                                        metrics_port=free_port()), procs[1].config_path)
            procs[1].start()
            last: list[dict[str, list[int]]] = []

            def stable() -> bool:
                for w in procs:
                    if not w.alive():
                        raise RuntimeError("worker exited: " + w.log_tail())
                a = group_assignment(conf, group, s.topics.timeline)
                last.append(a)
                two = len(a) == 2 and all(a.values())
                return two and len(last) >= 8 and all(x == a for x in last[-8:])
            res["join_s"] = wait_until(stable, 300, "a stable two-worker assignment")
            for m in last[-1]:
                members.setdefault(m, "worker2")
        pids = [w.proc.pid for w in procs if w.proc is not None]
        res["assign_start"] = _named(group_assignment(conf, group, s.topics.timeline), members)
        # Idle: what the workers burn with no input (markers, heartbeats, polling), after
        # a pause: a worker that just joined still restores its standby copies.
        time.sleep(min(SETTLE_S, seconds / 3))
        idle_s = min(IDLE_S, seconds / 3)
        c0 = [cpu_seconds(pid) for pid in pids]
        t0s = [thread_cpu(pid) for pid in pids]
        i0 = time.monotonic()
        time.sleep(idle_s)  # the idle measurement window itself
        idle_s = time.monotonic() - i0
        res["idle_s"] = idle_s
        res["idle_cpu_per_s"] = [(b - a) / idle_s for a, b in
                                 zip(c0, [cpu_seconds(pid) for pid in pids], strict=True)]
        res["idle_threads_per_s"] = [{k: v / idle_s for k, v in _diff(a, thread_cpu(pid))
                                      .items()} for a, pid in zip(t0s, pids, strict=True)]

        # The load: warm-up, then the measured window.
        # Long enough for the first events' ticks to be sealed and released.
        warmup = (s.tick_ms + s.lateness_ms) / 1000 + 2.0
        stats = Produced()
        producer = kafka_io.make_producer(conf)
        cpu0: list[float] = []
        th0: list[dict[str, float]] = []
        machine0 = psutil.cpu_times()
        n0 = 0
        w0_ms = 0
        sent = 0
        t_load = time.monotonic()
        t_win = t_load + warmup
        t_end = t_win + seconds
        while True:
            now = time.monotonic()
            if not cpu0 and now >= t_win:
                cpu0 = [cpu_seconds(pid) for pid in pids]
                th0 = [thread_cpu(pid) for pid in pids]
                machine0 = psutil.cpu_times()
                n0, w0_ms = sent, int(time.time() * 1000)
            if now >= t_end:
                break
            due = int((now - t_load) * rate)
            ts = int(time.time() * 1000)
            while sent < due:
                _produce(producer, dep.topics.input, _event(names[(sent * 7919) % counters], ts),
                         stats)
                sent += 1
            producer.poll(0)
            time.sleep(0.005)  # pacing of the load generator
        cpu1 = [cpu_seconds(pid) for pid in pids]
        res["threads"] = [_diff(a, thread_cpu(pid)) for a, pid in zip(th0, pids, strict=True)]
        res["machine_busy"] = machine_busy(machine0, psutil.cpu_times())
        res["loadavg"] = os.getloadavg()[0]
        w1_ms = int(time.time() * 1000)
        n_window = sent - n0
        res["rss"] = [rss_bytes(pid) for pid in pids]
        res["assign_end"] = _named(group_assignment(conf, group, s.topics.timeline), members)
        ingest = [g for g in groups_with_prefix(conf, s.app_id) if g != group]
        res["ingest_groups"] = {g: sorted(map(len, group_assignment(conf, g, s.topics.input)
                                              .values())) for g in ingest}
        if producer.flush(60) or stats.errors:
            raise RuntimeError("load generator: undelivered events")
        res["events"] = sent
        res["window_events"] = n_window
        res["window_s"] = (w1_ms - w0_ms) / 1000
        res["cpu"] = [b - a for a, b in zip(cpu0, cpu1, strict=True)]
        res["cpu_per_event"] = sum(res["cpu"]) / max(1, n_window)

        # Catch-up: every event on the timeline and accounted for by a release.
        acc = wait_accounted(view, sent, 300, procs[0].log_tail)
        res["caught_up"] = acc is not None
        if acc is not None and acc.end is not None and acc.last_batch is not None:
            res["ingest_delay_ms"] = acc.last_batch - stats.last_ts
            res["accounted_delay_ms"] = acc.end - stats.last_ts
            res["seal_lag_ms"] = acc.seal_lag
            res["released"] = acc.released
        else:
            view.update()
            late = view.account()
            res["missing"] = sent - late.events
            res["pending"] = late.pending
        res["state"] = {f"worker{i + 1}": dir_sizes(Path(w.config_path).parent
                                                      / _state_name(i))
                        for i, w in enumerate(procs)}
        res["dbs"] = {f"worker{i + 1}": partition_dbs(Path(w.config_path).parent
                                                      / _state_name(i))
                      for i, w in enumerate(procs)}
        batches = [len_ for log in view.logs.values() for _o, ts, _g, len_ in log.batches
                   if w0_ms <= ts <= w1_ms]
        res["window_batches"] = len(batches)
        res["window_batch_events"] = sum(batches)
        res["window_changelog"] = sum(w0_ms <= t <= w1_ms for t in view.changelog_ts)
        res["window_applied"] = view.applied_by(w1_ms) - view.applied_by(w0_ms)
        lags = [x for _t, x in view.marker_lags(w0_ms, w1_ms)]
        res["marker_lag"] = _pcts(lags)
        res["marker_lag_n"] = len(lags)
        # Kept up: 95% of the window's markers were applied within one tick of their
        # append, i.e. before the next marker came (no queue of markers behind the operator).
        res["kept_up"] = bool(lags) and res["marker_lag"][1] <= s.tick_ms
        lat = view.latencies(w0_ms, w1_ms)
        res["latency"] = _pcts([x for _t, x in lat])
        res["latency_n"] = len(lat)
        third = (w1_ms - w0_ms) / 3
        res["first_third"] = _pcts([x for t, x in lat if t < w0_ms + third])[:2]
        res["last_third"] = _pcts([x for t, x in lat if t >= w1_ms - third])[:2]
        res["not_log_append"] = (stats.not_log_append + view.not_log_append
                                 + (acc.not_log_append if acc is not None else 0))
        complete = True
    finally:
        ledger.close()
        res["logs"] = children.close_deployment(dep)
        try:
            if complete:
                view.update()  # everything the workers wrote until they stopped
                res["live_keys"], res["live_bytes"] = len(view.live), sum(view.live.values())
        finally:
            view.close()
    return res


def _state_name(i: int) -> str:
    # isolated_deployment's first worker uses "state"; add_worker(label) "<label>-state".
    return "state" if i == 0 else f"worker{i + 1}-state"


def _named(assign: Mapping[str, list[int]], members: Mapping[str, str]) -> dict[str, list[int]]:
    return {members.get(m, f"member-{m[-6:]}"): ps for m, ps in sorted(assign.items())}


# ------------------------------------------------------------------------ report

def _mib(b: float) -> str:
    return f"{b / 2**20:.1f} MiB"


def report_throughput(runs: Sequence[dict[str, Any]], n: int) -> list[str]:
    lines = [f"Phase 1: throughput, {n:,} events, {len(runs)} repeat(s), same broker "
             "(events/s from the first input record's append to the stage's last output)"]
    lines.append(f"  {'repeat':<7}{'plain Faust':>12}{'processor':>12}{'confluent':>12}"
                 f"{'ratio':>8}   processor: ingest s / total s / after last batch ms / "
                 "produce s")
    for i, r in enumerate(runs):
        p = r["processor"]
        lines.append(f"  {i + 1:<7}{r['faust']['rate']:>12,.0f}{p['rate']:>12,.0f}"
                     f"{r['kafka']['rate']:>12,.0f}{r['ratio']:>8.3f}   {p['ingest_s']:.2f} / "
                     f"{p['seconds']:.2f} / {p['tail_ms']} / {p['produce_s']:.2f}"
                     f"  (order {'-'.join(r['order'])})")
    ratios = [r["ratio"] for r in runs]
    lines.append(f"  ratio processor / plain Faust agent: {min(ratios):.3f} - {max(ratios):.3f}"
                 f" (median {statistics.median(ratios):.3f}; target >= 1.5)")
    for key, label in (("faust", "plain Faust agent"), ("processor", "processor"),
                       ("kafka", "confluent-kafka loop")):
        rates = [r[key]["rate"] for r in runs]
        lines.append(f"  {label}: {min(rates):,.0f} - {max(rates):,.0f} events/s")
    lines.append("  processor work for the N events: timeline batch records "
                 + ", ".join(str(r["processor"]["batches"]) for r in runs)
                 + "; changelog records per event "
                 + ", ".join(f"{r['processor']['changelog_per_event']:.3f}" for r in runs))
    loads = [r[k]["loadavg"] for r in runs for k in ("faust", "processor", "kafka")]
    lines.append(f"  machine load average (1 min) after each stage: {min(loads):.1f} - "
                 f"{max(loads):.1f} on {psutil.cpu_count()} CPUs")
    dup = sum(r["processor"]["duplicates"] for r in runs)
    lines.append(f"  processor worker RSS at the end: "
                 f"{', '.join(_mib(r['processor']['rss']) for r in runs)}; duplicate event "
                 f"rows on the timeline: {dup}; releases by the sealing markers: "
                 f"{', '.join(str(r['processor']['released']) for r in runs)}")
    lines += _log_lines([r["processor"]["logs"] for r in runs])
    return lines


def _log_lines(found: Sequence[Mapping[str, Any]]) -> list[str]:
    count = sum(int(f["count"]) for f in found)
    examples = list(dict.fromkeys(e for f in found for e in f["examples"]))[:3]
    return [f"  worker logs: {count} warning/error line(s)"
            + "".join(f"\n    {e}" for e in examples)]


def report_steady(r: Mapping[str, Any], title: str) -> list[str]:
    lines = [f"{title}: {r['workers']} worker(s), {r['counters']:,} counters, "
             f"{r['rate']:,.0f} events/s, tick {r['tick_ms']} ms, lateness "
             f"{r['lateness_ms']} ms"]
    lines.append(f"  counters created (ledger complete) {r['created_s']:.1f} s after the "
                 f"first worker started" + (f"; second worker joined and the assignment was "
                                           f"stable after {r['join_s']:.1f} s"
                                           if "join_s" in r else ""))
    verdict = "yes" if r["kept_up"] else "NO (markers queued behind the operator)"
    ml50, ml95, mlmax = r["marker_lag"]
    lines.append(f"  kept up during the window: {verdict}: markers committed p50 {ml50:.0f} / "
                 f"p95 {ml95:.0f} / max {mlmax:.0f} ms after their append (n="
                 f"{r['marker_lag_n']}; kept up: p95 <= one tick, {r['tick_ms']} ms)")
    if r["caught_up"]:
        lines.append(f"  caught up after the load: yes; last input record -> its timeline "
                     f"batch {r['ingest_delay_ms']} ms, -> the commit of the marker sealing "
                     f"the last events {r['accounted_delay_ms']} ms (that marker's own lag "
                     f"{r['seal_lag_ms']} ms; lateness + the rest of the tick, "
                     f"{r['lateness_ms']} - {r['tick_ms'] + r['lateness_ms']} ms, is the wait "
                     "for the seal)")
    else:
        lines.append(f"  caught up after the load: NO: {r['missing']:,} of {r['events']:,} "
                     f"events not on the timeline, partitions {r['pending']} not sealed and "
                     "committed, at the deadline (5 min after the load)")
    p50, p95, mx = r["latency"]
    lines.append(f"  seal->release latency over the window: p50 {p50:.0f} ms, p95 {p95:.0f} "
                 f"ms, max {mx:.0f} ms (n={r['latency_n']:,}); p50/p95 in the window's "
                 f"first third {r['first_third'][0]:.0f}/{r['first_third'][1]:.0f} ms, last "
                 f"third {r['last_third'][0]:.0f}/{r['last_third'][1]:.0f} ms")
    for w, d in r["state"].items():
        total = d["sst"] + d["wal"] + d["other"]
        lines.append(f"  {w}: RocksDB dir {_mib(total)} (SST {_mib(d['sst'])}, WAL "
                     f"{_mib(d['wal'])}, other {_mib(d['other'])}; {_mib(d['disk'])} "
                     f"allocated on disk); per-partition DBs "
                     f"{ {p: _mib(b) for p, b in sorted(r['dbs'][w].items())} }")
    w1 = r["state"]["worker1"]
    live = max(1, r["live_bytes"])
    lines.append(f"  state table live size: {r['live_keys']:,} keys, {_mib(r['live_bytes'])};"
                 f" ratio RocksDB dir / live = "
                 f"{(w1['sst'] + w1['wal'] + w1['other']) / live:.2f} (worker1; target"
                 f" <= 3); without the WAL {(w1['sst'] + w1['other']) / live:.2f}")
    lines.append(f"  worker RSS: {', '.join(_mib(b) for b in r['rss'])}")
    lines.append(f"  machine over the window: {r['machine_busy']:.0%} of its "
                 f"{psutil.cpu_count()} CPUs busy (all processes), load average "
                 f"{r['loadavg']:.1f} at its end")
    ev = max(1, r["window_events"])
    lines.append(f"  work in the window: {r['window_batches']:,} timeline batch records "
                 f"({r['window_batch_events'] / max(1, r['window_batches']):.1f} events each), "
                 f"{r['window_changelog'] / ev:.2f} changelog records per event")
    lines.append(f"  CPU over the window ({r['window_s']:.1f} s, {r['window_events']:,} "
                 f"events): {', '.join(f'{c:.1f}' for c in r['cpu'])} CPU-s -> "
                 f"{r['cpu_per_event'] * 1e3:.3f} CPU-ms per event; idle before the load: "
                 f"{', '.join(f'{c:.2f}' for c in r['idle_cpu_per_s'])} CPU-s/s")
    lines += _cpu_lines(r)
    lines += _log_lines([r["logs"]])
    lines.append(f"  timeline partitions held: before the join {r['assign_before']}, at the "
                 f"window start {r['assign_start']}, at its end {r['assign_end']}; ingest "
                 f"group members' input partition counts {r['ingest_groups']}")
    return lines


def _cpu_lines(r: Mapping[str, Any]) -> list[str]:
    """Per worker: CPU over the window, its idle rate times the window, the rest (the
    load's), each by thread group."""
    out = []
    w = r["window_s"]
    for i, (cpu, idle, th, ith) in enumerate(zip(r["cpu"], r["idle_cpu_per_s"], r["threads"],
                                               r["idle_threads_per_s"], strict=True)):
        groups = ", ".join(f"{g} {th.get(g, 0.0):.1f}/{ith.get(g, 0.0) * w:.1f}"
                           for g in sorted(set(th) | set(ith)))
        out.append(f"  worker{i + 1}: {cpu:.1f} CPU-s in the window, idle rate x window "
                   f"{idle * w:.1f}, load's {cpu - idle * w:.1f}; by thread (window/idle x "
                   f"window): {groups}")
    return out


def total_cpu_per_event(r: Mapping[str, Any]) -> float:
    """All CPU of the workers over the window / the events produced in it."""
    return float(sum(r["cpu"])) / max(1, int(r["window_events"]))


def marginal_cpu_per_event(r: Mapping[str, Any]) -> float:
    """(CPU over the window - each worker's idle CPU rate x the window) / events."""
    idle = sum(r["idle_cpu_per_s"]) * r["window_s"]
    return float(sum(r["cpu"]) - idle) / max(1, int(r["window_events"]))


def applied_cpu_per_event(r: Mapping[str, Any]) -> float:
    """All CPU of the workers over the window / the events the operator committed in it
    (differs from the produced count when a run falls behind or catches up)."""
    return float(sum(r["cpu"])) / max(1, int(r.get("window_applied", 0)))


def _span(xs: Sequence[float], fmt: str = ".3f") -> str:
    return (f"{min(xs):{fmt}}" if len(xs) == 1 or min(xs) == max(xs)
            else f"{min(xs):{fmt}} - {max(xs):{fmt}}")


def report_scaleout(pairs: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]]) -> list[str]:
    """Side by side per pair (1 worker, 2 workers, run one after the other), then ranges."""
    two0 = pairs[0][1]
    lines = [f"Phase 3: scale-out, CPU-ms per event (user + system of the worker processes "
             f"and all their threads; standby_replicas = {two0.get('standby_replicas', 1)}; "
             f"{len(pairs)} pair(s), order rotated)",
             f"  {'pair':<5}{'1w total':>9}{'2w total':>9}{'ratio':>7}{'1w marg':>9}"
             f"{'2w marg':>9}{'ratio':>7}{'1w idle':>9}{'2w idle':>13}{'ev/batch':>12}"
             f"{'chlog/ev':>12}  kept up  applied  busy"]
    tot, marg, app = [], [], []
    for k, (one, two) in enumerate(pairs):
        ta, tb = total_cpu_per_event(one), total_cpu_per_event(two)
        ma, mb = marginal_cpu_per_event(one), marginal_cpu_per_event(two)
        tot.append(tb / ta)
        marg.append(mb / ma)
        app.append(applied_cpu_per_event(two) / applied_cpu_per_event(one))
        done = [x.get("window_applied", 0) / max(1, x["window_events"]) for x in (one, two)]
        epb = [x["window_batch_events"] / max(1, x["window_batches"]) for x in (one, two)]
        clg = [x["window_changelog"] / max(1, x["window_events"]) for x in (one, two)]
        lines.append(
            f"  {k + 1:<5}{ta * 1e3:>9.3f}{tb * 1e3:>9.3f}{tb / ta:>7.2f}{ma * 1e3:>9.3f}"
            f"{mb * 1e3:>9.3f}{mb / ma:>7.2f}"
            f"{one['idle_cpu_per_s'][0]:>9.3f}"
            f"{'+'.join(f'{c:.3f}' for c in two['idle_cpu_per_s']):>13}"
            f"{epb[0]:>6.1f}/{epb[1]:<5.1f}{clg[0]:>6.2f}/{clg[1]:<5.2f}"
            f"  {'y' if one['kept_up'] else 'N'}/{'y' if two['kept_up'] else 'N'}"
            f"      {done[0]:.0%}/{done[1]:.0%}"
            f"  {one['machine_busy']:.0%}/{two['machine_busy']:.0%}"
            f"  (order {'-'.join(one.get('order', ['1', '2']))})")
    lines.append(f"  ratio 2 workers / 1 worker: total {_span(tot, '.2f')}, marginal "
                 f"{_span(marg, '.2f')} (target 0.8 - 1.2); total per event applied in "
                 f"the window {_span(app, '.2f')}")
    lines.append("  total = all CPU of the workers over the window / events produced in it; "
                 "marginal = the same less each worker's idle CPU rate (measured with no "
                 "input just before the load) x the window; idle in CPU-s per second; "
                 "applied = events the operator committed in the window / events produced "
                 "in it (100% in a steady state)")
    for k, (one, two) in enumerate(pairs):
        lines.append(f"  pair {k + 1} partitions held: 1 worker {one['assign_end']}; "
                     f"2 workers {two['assign_end']} (worker1 alone before the join: "
                     f"{two['assign_before']['worker1']}); per-partition RocksDB dirs "
                     + "; ".join(f"{w} " + ", ".join(f"{p}: {_mib(b)}" for p, b in
                                                      sorted(d.items()))
                                 for w, d in two["dbs"].items()))
    if not all(o.get("kept_up") and t.get("kept_up") for o, t in pairs):
        lines.append("  NOTE: a run that did not keep up worked on larger batches than the "
                     "load alone makes, so its CPU per event is not the steady-state figure")
    return lines


# ------------------------------------------------------------------------ main

def _repo_litter() -> set[str]:
    """Untracked and ignored paths in the checkout (to report what a run left behind)."""
    out = subprocess.run(["git", "status", "--porcelain", "--ignored"], cwd=ROOT,
                         capture_output=True, text=True, check=False).stdout
    return {line[3:] for line in out.splitlines() if line[:2] in ("??", "!!")}


def _interrupt(_signum: int, _frame: FrameType | None) -> None:
    # The first SIGINT/SIGTERM stops the run; later ones are ignored, so that the cleanup
    # it starts (workers, child processes, broker, temporary directory) runs to its end.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


@contextlib.contextmanager
def broker(bootstrap: str) -> Iterator[str]:
    if bootstrap:
        yield bootstrap
        return
    from processor.devtools.local_kafka import LocalKafka

    print("starting a local Kafka broker ...", flush=True)
    kafka = LocalKafka(1)
    try:
        kafka.start()
        yield kafka.bootstrap_servers
    finally:
        kafka.stop()


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in[:2] == ["--child", "faust-agent"]:
        _child_faust_agent(args_in[2], args_in[3], args_in[4], int(args_in[5]), args_in[6])
        return 0
    if args_in[:2] == ["--child", "kafka-loop"]:
        _child_kafka_loop(args_in[2], args_in[3], args_in[4], int(args_in[5]))
        return 0
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--phase", choices=("throughput", "many", "scaleout", "all"), default="all")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: 3,000 events once, 500 counters at 200 events/s for 6 s")
    p.add_argument("--events", type=int, help="throughput phase events (default 20,000)")
    p.add_argument("--repeat", type=int, help="throughput repeats (default 3); scale-out: "
                   "pairs of runs, 1 and 2 workers, order rotated (default 1)")
    p.add_argument("--counters", type=int, help="counters of phases 2-3 (default 10,000)")
    p.add_argument("--rate", type=float, help="steady load, events/s (default 1,000)")
    p.add_argument("--seconds", type=float, help="measured window of phases 2-3 (default 60)")
    p.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", ""))
    p.add_argument("--json", help="also write the results to this file")
    p.add_argument("--standby", type=int, default=1,
                   help="standby_replicas of the phase 2-3 deployments (default 1, the "
                   "README configuration; 0 measures scale-out without standby copies)")
    a = p.parse_args(args_in)
    q = a.quick
    events = a.events or (3000 if q else 20_000)
    repeat = a.repeat or (1 if q else 3)
    counters = a.counters or (500 if q else 10_000)
    rate = a.rate or (200.0 if q else 1000.0)
    seconds = a.seconds or (6.0 if q else 60.0)
    srepeat = a.repeat or 1

    signal.signal(signal.SIGTERM, _interrupt)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupt)
    litter0 = _repo_litter()
    children = Children()
    results: dict[str, Any] = {"events": events, "repeat": repeat}
    lines: list[str] = []
    try:
        # Exits in reverse order: children (workers, baselines) stop while the broker still
        # runs and before their directory goes; then the broker; then the directory.
        with tempfile.TemporaryDirectory(prefix="dpc-bench-") as tmp_s, \
                broker(a.bootstrap) as bootstrap, contextlib.closing(children):
            tmp = Path(tmp_s)
            conf = client_config(bootstrap)
            if a.phase in ("throughput", "all"):
                print("phase 1: throughput", flush=True)
                runs = phase_throughput(conf, bootstrap, tmp, events, repeat, children)
                results["throughput"] = runs
                lines += report_throughput(runs, events)
            if a.phase == "many":
                print("phase 2: many counters, 1 worker", flush=True)
                one = steady_run(conf, bootstrap, tmp, 1, counters, rate, seconds, children,
                                 a.standby)
                results["many"] = one
                lines += report_steady(one, "Phase 2: many counters")
            if a.phase in ("scaleout", "all"):
                pairs = []
                for k in range(srepeat):
                    order = (1, 2) if k % 2 == 0 else (2, 1)
                    got: dict[int, dict[str, Any]] = {}
                    for w in order:
                        print(f"phase {2 if w == 1 else 3}: {w} worker(s), pair {k + 1}",
                              flush=True)
                        got[w] = steady_run(conf, bootstrap, tmp, w, counters, rate, seconds,
                                            children, a.standby)
                        got[w]["order"] = [str(x) for x in order]
                    pairs.append((got[1], got[2]))
                    if k == 0:
                        results["many"] = got[1]
                        lines += report_steady(got[1], "Phase 2: many counters")
                    lines += report_steady(got[2], f"Phase 3: the same load on 2 workers "
                                                   f"(pair {k + 1})")
                    if k > 0:
                        lines += report_steady(got[1], f"Phase 3: 1 worker (pair {k + 1})")
                results["scaleout"] = [{"one": o, "two": t} for o, t in pairs]
                lines += report_scaleout(pairs)
    except KeyboardInterrupt:
        print("interrupted: workers and broker stopped", file=sys.stderr, flush=True)
        return 130
    bad = sum(int(v.get("not_log_append", 0)) for v in _walk(results))
    lines.append(f"timestamps: {'all' if not bad else f'NOT all ({bad} records not)'} "
                 "LogAppendTime (broker append times)")
    left = sorted(_repo_litter() - litter0)
    lines.append("left in the repository: " + (", ".join(left) if left else "nothing")
                 + " (the checkout is shared: other sessions' files would show too)")
    print("\n".join(lines), flush=True)
    if a.json:
        Path(a.json).write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2
                                              | orjson.OPT_NON_STR_KEYS))
    return 0


def _walk(obj: Any) -> Iterator[Mapping[str, Any]]:
    if isinstance(obj, Mapping):
        yield obj
        for v in obj.values():
            yield from _walk(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _walk(v)


if __name__ == "__main__":
    raise SystemExit(main())
