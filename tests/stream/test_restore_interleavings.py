"""The restore's bookkeeping under random interleavings of everything that moves a
partition's changelog, its local databases and their persisted offsets: two workers,
their own checkpoints and the acknowledgements of their writes, a zombie's late writes
landing after the new owner's, rebalances, Faust's recovery, the standby reader, the bulk
load at start, clean stops, kill -9 at any step, SIGSTOP pauses and network cuts. No
broker, no RocksDB, no Faust (docs/state.md, "Restore").

What runs for real: `restore.ChangelogTracker` (where the worker's own writes land),
`restore.persist_after` (the offset a checkpoint's flush then persists),
`restore.merge_changelog` and `state.supersedes` (every changelog apply),
`restore.recovery_takes` (which records Faust's loop buffers) and `restore.load_span` /
`restore.PartitionLoad` (the bulk load). What is a model, line for line of the code it
stands for:

- Faust's recovery (`faust.tables.recovery.Recovery` with worker/recovery.py's loop),
  for active partitions only (a standby partition's record in its queue is skipped:
  `take_standbys` left it none): the active offsets kept across rebalances (`revoke`
  pops them, `_add` sets them from the persisted offset when there is one), the
  changelog queue (a seek does not empty it; the model keeps it across rebalances too,
  where Faust's flow control clears it: harsher; the loop drains it before the operator's first
  checkpoint of an assignment), a fetch under way when an active recovery ends
  (queued after its end), buffers applied when full, at a revocation,
  at the start of a recovery, at its end and at a stop; the end of an active recovery
  once the offset seen reaches the highwater read at the assignment.
- `MonotoneTable.apply_changelog_batch`: the merge, one write, then the persisted offset
  of the buffer's last record.
- The standby reader (worker/standby.py): stopped at each assignment before Faust's
  recovery sees it, its pending records then applied; started on a standby partition
  from just after the database's persisted offset; reads on, in the revocation too,
  while the process is neither paused nor cut off; applies a buffer of
  `STANDBY_BUFFER` records, values and the offset of its last record in one write
  batch; stopped, its records applied, at a clean stop; its records lost at a kill.
- `WorkerStores`: `of` begins tracking at the first write after an assignment; a
  checkpoint writes the database, then sends (counters first, the partition value
  last: `PartitionTransaction`'s plan); its flush awaits every acknowledgement, writes
  everything again after a gap, the stale keys otherwise, up to `REWRITE_ROUNDS`
  times, then persists `persist_after`; `release` at every revocation.
- The operator: one deterministic timeline (per offset, the counters it changes; a
  counter's value is its last change, the partition value its position), so two owners
  at one position write the same bytes; an owner continues from its restored partition
  value; a counter changed once only is an event-less counter.
- The process: the running flag (a kill after the load makes the next start discard the
  database; a kill during the load keeps its write batches, each values and offset
  together), unacknowledged sends lost at a kill, a pause (nothing runs, nothing lands),
  a cut (it runs and writes, nothing lands, it sees no rebalance), the group's session
  expiry, and a zombie that learns of the rebalance only when it talks to the brokers
  again.

Checked: (1) whenever a persisted offset is set, and whenever a recovery ends, every
changelog record at or below it is in the database (no value older than the newest
record of its key there); (2) when an active recovery ends, the database holds every
record the recovery read, and its partition value implies its counters: each counter
the timeline changed at or before the partition value's position is there at least at
that change (the state whose lack made the campaign's worker announce c1,c2 again).

Controls that must fail: a tracker that moves the persisted offset to every acknowledged
own write (Faust's own rule), a merge that takes the last record instead of the newest,
a recovery that ends at the persisted offset without reading on, tracking that begins
at the changelog's end instead of the persisted offset, a checkpoint's write plan
with the partition value before its counters, and a standby reader that, stopped,
persists the offset of what it read without writing its pending records. The defect the schedules
found (Faust's loop applying a record of an active partition after its recovery ended:
1 schedule in 2,000) is a scripted case of its own, with Faust's rule as its control.
False-alarm rate: 0 (fixed seeds, deterministic).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest

from processor.stream.model.restore import (
    ChangelogTracker,
    PartitionLoad,
    load_span,
    merge_changelog,
    persist_after,
    recovery_takes,
)
from processor.stream.model.state import UNIT_MAGIC, stored_offset
from processor.stream.worker.table import REWRITE_ROUNDS
from tests.stream.test_restore_model import Db

TP = 0
PART = b"part"
COUNTERS = [b"c%d" % i for i in range(8)]
#: Records per active recovery buffer and per standby buffer (small: they fill often).
RECOVERY_BUFFER = 3
STANDBY_BUFFER = 5
SEEDS = range(1500)
STEPS = 160

Record = tuple[int, bytes, bytes]
Merge = Callable[[Iterable[tuple[bytes, bytes | None]], Callable[[bytes], Any]],
                 tuple[dict[bytes, bytes | None], set[bytes]]]


def _value(key: bytes, offset: int) -> bytes:
    """A stored value reflecting the timeline through `offset`: the same bytes for the
    same key and offset, whoever computes it."""
    return UNIT_MAGIC + offset.to_bytes(8, "big", signed=True) + key


def _offset(value: bytes | None) -> int:
    got = None if value is None else stored_offset(value)
    return -1 if got is None else got


def last_record_merge(records: Iterable[tuple[bytes, bytes | None]],
                      get: Callable[[bytes], Any]) -> tuple[dict[bytes, bytes | None],
                                                           set[bytes]]:
    """Control: a Faust table's own rule, the last record of a key wins."""
    return dict(records), set()


class FaustTracker(ChangelogTracker):
    """Control: Faust's own rule, the persisted offset moves to every acknowledged write
    of this process, whatever landed in between."""

    def read_through(self, partition: int) -> int | None:
        want = self._expected.get(partition)
        return None if want is None else want - 1


def faust_takes(active: bool, in_recovery: bool, offset: int, seen: int | None) -> bool:
    """Control: Faust's own loop, which takes an active partition's records after its
    recovery ended too (the defect `restore.recovery_takes` closes)."""
    return seen is None or offset > seen


class Timeline:
    """Which counters each timeline offset changes (a counter's first change creates it;
    one changed once only is event-less), drawn as far as the run gets."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self.changes: list[tuple[bytes, ...]] = []
        #: per counter, the sorted offsets that change it
        self.at: dict[bytes, list[int]] = {c: [] for c in COUNTERS}

    def at_offset(self, t: int) -> tuple[bytes, ...]:
        rng = self._rng
        while len(self.changes) <= t:
            n = rng.choice((0, 0, 0, 1, 1, 2))
            pool = COUNTERS[:2] if rng.random() < 0.7 else COUNTERS
            keys = tuple(sorted(set(rng.sample(pool, n)))) if n else ()
            for k in keys:
                self.at[k].append(len(self.changes))
            self.changes.append(keys)
        return self.changes[t]

    def last_change(self, key: bytes, t: int) -> int | None:
        """The last offset at or before `t` that changed `key` (None: none yet)."""
        if t < 0:
            return None
        self.at_offset(t)
        best = None
        for o in self.at[key]:
            if o > t:
                break
            best = o
        return best


@dataclass
class Worker:
    name: str
    tracker_class: type[ChangelogTracker]
    db: Db = field(default_factory=Db)
    flag: bool = False
    phase: str = "down"  # down, loading, joined
    load: PartitionLoad | None = None
    load_pos: int = 0
    paused: bool = False
    cut: bool = False
    gen: int = 0  # the generation whose assignment it runs
    member: bool = False  # in the group, as its coordinator sees it
    # what the worker is doing besides: "", "revoking", "stopping", "rejoining"
    pending_change: str = ""
    # Faust's recovery (one changelog partition, TP)
    role: str | None = None  # "active", "standby" or None
    active_offsets: dict[int, int | None] = field(default_factory=dict)
    highwater: int = -1
    buffer: list[Record] = field(default_factory=list)
    recovering: bool = False
    fetch_pos: int | None = None
    queue: list[Record] = field(default_factory=list)
    # the standby reader (None: not running)
    reader_pos: int | None = None
    reader_pending: list[Record] = field(default_factory=list)
    # the operator and its stores
    tracker: ChangelogTracker = field(init=False)
    opened: bool = False
    started: bool = False
    t: int = -1
    written_t: int = -1
    dirty: set[bytes] = field(default_factory=set)
    stale: set[bytes] = field(default_factory=set)
    pending: list[tuple[bytes, bytes]] = field(default_factory=list)
    flushing: int = 0  # 0: no flush; n: in its n-th round

    def __post_init__(self) -> None:
        self.tracker = self.tracker_class()

    def reset_process(self) -> None:
        """What a process keeps in memory, gone (a kill, a stop)."""
        self.phase, self.load, self.paused, self.cut = "down", None, False, False
        self.member, self.pending_change, self.role = False, "", None
        self.active_offsets = {}
        self.buffer, self.recovering, self.fetch_pos, self.queue = [], False, None, []
        self.reader_pos, self.reader_pending = None, []
        self.tracker = self.tracker_class()
        self.opened = self.started = False
        self.dirty, self.stale, self.pending, self.flushing = set(), set(), [], 0


class Violation(AssertionError):
    pass


@dataclass
class Model:
    rng: random.Random
    merge: Merge = merge_changelog
    tracker_class: type[ChangelogTracker] = ChangelogTracker
    recovery_reads_on: bool = True
    begin_at_end: bool = False
    takes: Callable[[bool, bool, int, int | None], bool] = recovery_takes
    part_first: bool = False
    reader_drops_pending: bool = False
    log: list[Record] = field(default_factory=list)
    #: newest[i]: per key, the newest offset header among log[0..i]
    newest: list[dict[bytes, int]] = field(default_factory=list)
    gen: int = 0
    assignment: dict[str, str] = field(default_factory=dict)
    workers: list[Worker] = field(default_factory=list)
    timeline: Timeline = field(init=False)
    stats: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.timeline = Timeline(self.rng.randrange(1 << 30))
        self.workers = [Worker("a", self.tracker_class), Worker("b", self.tracker_class)]

    def count(self, what: str) -> None:
        self.stats[what] = self.stats.get(what, 0) + 1

    # -- the brokers

    def end(self) -> int:
        return len(self.log)

    def append(self, key: bytes, value: bytes) -> int:
        offset = len(self.log)
        self.log.append((offset, key, value))
        row = dict(self.newest[-1]) if self.newest else {}
        if _offset(value) > row.get(key, -2):
            row[key] = _offset(value)
        self.newest.append(row)
        return offset

    def rebalance(self) -> None:
        """The coordinator's new generation: one member active, the other its standby."""
        self.gen += 1
        members = [w.name for w in self.workers if w.member]
        self.rng.shuffle(members)
        self.assignment = {}
        if members:
            self.assignment[members[0]] = "active"
        for name in members[1:]:
            self.assignment[name] = "standby"
        self.count("rebalances")

    # -- checks

    def check_through(self, w: Worker, through: int | None, what: str) -> None:
        """Every record at or below `through` is in `w`'s database."""
        if through is None or through < 0:
            return
        for key, offset in self.newest[through].items():
            if _offset(w.db.values.get(key)) < offset:
                raise Violation(
                    f"{w.name}: {what}: {key!r} holds offset "
                    f"{_offset(w.db.values.get(key))} but the changelog through "
                    f"{through} has {offset}")

    def check_implied(self, w: Worker) -> None:
        """The partition value implies its counters."""
        t = _offset(w.db.values.get(PART))
        for key in COUNTERS:
            change = self.timeline.last_change(key, t)
            if change is not None and _offset(w.db.values.get(key)) < change:
                raise Violation(
                    f"{w.name}: partition value at {t} but {key!r} at "
                    f"{_offset(w.db.values.get(key))}, changed at {change}")

    def set_persisted(self, w: Worker, offset: int, what: str) -> None:
        w.db.persisted = offset
        self.check_through(w, offset, what)

    # -- Faust's recovery

    def apply(self, w: Worker) -> None:
        """MonotoneTable.apply_changelog_batch of the buffer (Recovery.flush_buffers)."""
        if not w.buffer:
            return
        writes, stale = self.merge(((k, v) for _o, k, v in w.buffer), w.db.values.get)
        w.stale.difference_update(writes)
        w.stale.update(stale)
        w.db.apply(writes)
        self.set_persisted(w, max(o for o, _k, _v in w.buffer), "a changelog apply")
        w.buffer = []

    def faust_add(self, w: Worker, offsets: dict[int, int | None]) -> None:
        if w.db.persisted is not None:
            offsets[TP] = w.db.persisted
        offsets.setdefault(TP, None)

    def faust_rebalance(self, w: Worker, role: str | None) -> None:
        """BatchedTableManager.on_rebalance: the standby reader stopped; then
        Recovery.on_rebalance with the standbys taken out, _restart_recovery's first
        steps, and the reader started on a standby partition."""
        self.reader_stop(w)
        if w.role is not None and role is None:  # the changelog partition is revoked
            w.active_offsets.pop(TP, None)
        w.role, w.recovering = role, False
        if role == "active":
            self.faust_add(w, w.active_offsets)
        else:
            w.active_offsets.pop(TP, None)
        w.fetch_pos = None
        self.apply(w)  # "Must flush any buffers before starting rebalance"
        if role == "active":
            w.highwater = self.end() - 1
            last = w.active_offsets.get(TP)
            w.active_offsets[TP] = -1 if last is None else last  # earliest - 1 is -1
            if not self.recovery_reads_on:
                w.active_offsets[TP] = max(w.active_offsets[TP] or -1, w.highwater)
            w.recovering = True
            w.fetch_pos = max(w.active_offsets[TP] or 0, 0)
            self.maybe_end_recovery(w)
        elif role == "standby":
            w.reader_pos = 0 if w.db.persisted is None else w.db.persisted + 1

    # -- the standby reader

    def reader_apply(self, w: Worker) -> None:
        """StandbyPartition.apply: the merge, and one write batch of the values and the
        offset of the last record."""
        if not w.reader_pending:
            return
        writes, stale = self.merge(((k, v) for _o, k, v in w.reader_pending),
                                   w.db.values.get)
        w.stale.difference_update(writes)
        w.stale.update(stale)
        w.db.apply(writes)
        self.set_persisted(w, w.reader_pending[-1][0], "a standby write")
        w.reader_pending = []
        self.count("standby writes")

    def reader_fetch(self, w: Worker) -> None:
        assert w.reader_pos is not None
        stop = min(self.end(), w.reader_pos + self.rng.randint(1, 6))
        w.reader_pending.extend(self.log[w.reader_pos:stop])
        w.reader_pos = stop
        if len(w.reader_pending) >= STANDBY_BUFFER:
            self.reader_apply(w)

    def reader_stop(self, w: Worker) -> None:
        """StandbyReader.stop: its last records applied, then no reader."""
        if self.reader_drops_pending and w.reader_pending:
            self.set_persisted(w, w.reader_pending[-1][0], "a standby stop")
            w.reader_pending = []
        self.reader_apply(w)
        w.reader_pos = None

    def maybe_end_recovery(self, w: Worker) -> None:
        seen = w.active_offsets.get(TP)
        if (not w.recovering or w.role != "active"
                or (seen is not None and w.highwater - seen > 0)):
            return
        self.apply(w)
        w.recovering = False
        # Recovery pauses the partition; a fetch under way still lands in the queue.
        assert w.fetch_pos is not None
        late = self.log[w.fetch_pos:w.fetch_pos + self.rng.choice((0, 0, 1, 3))]
        w.queue.extend(late)
        w.fetch_pos = None
        self.check_through(w, w.db.persisted, "the end of a recovery")
        self.check_through(w, w.highwater, "the end of a recovery (highwater)")
        self.check_implied(w)
        self.count("recoveries")
        w.started = True  # the operator runs; it continues from its restored state
        w.t = w.written_t = _offset(w.db.values.get(PART))
        w.dirty = set()

    def fetch(self, w: Worker) -> None:
        assert w.fetch_pos is not None
        stop = min(self.end(), w.fetch_pos + self.rng.randint(1, 6))
        w.queue.extend(self.log[w.fetch_pos:stop])
        w.fetch_pos = stop

    def take(self, w: Worker) -> None:
        """BatchedRecovery: every queued record, under the current assignment."""
        batch, w.queue = w.queue, []
        for record in batch:
            if w.role == "active":
                offsets, size = w.active_offsets, RECOVERY_BUFFER
            else:
                continue  # "recovery unknown topic": a standby's is the reader's
            if not self.takes(w.role == "active", w.recovering, record[0], offsets.get(TP)):
                continue
            offsets[TP] = record[0]
            w.buffer.append(record)
            if len(w.buffer) >= size:
                self.apply(w)
        self.maybe_end_recovery(w)

    # -- the worker's own writes

    def advance(self, w: Worker) -> None:
        """The operator applies timeline records in memory."""
        for _ in range(self.rng.randint(1, 3)):
            w.t += 1
            w.dirty.update(self.timeline.at_offset(w.t))

    def checkpoint(self, w: Worker) -> None:
        """The checkpoint's write plan: counters first, the partition value last, the
        database first, then the sends."""
        if w.t == w.written_t:
            return
        if not w.opened:  # WorkerStores.of
            w.tracker.begin(TP, self.end() - 1 if self.begin_at_end else w.db.persisted)
            w.opened = True
        plan: list[tuple[bytes, bytes]] = []
        for key in sorted(w.dirty):
            change = self.timeline.last_change(key, w.t)
            assert change is not None
            if _offset(w.db.values.get(key)) < change:  # the counter's duplicate filter
                plan.append((key, _value(key, change)))
        part = (PART, _value(PART, w.t))
        plan = [part, *plan] if self.part_first else [*plan, part]
        for key, value in plan:
            w.db.values[key] = value
        w.pending.extend(plan)
        w.dirty, w.written_t = set(), w.t
        w.flushing = 1
        self.count("checkpoints")

    def deliver(self, w: Worker) -> None:
        """The producer's next acknowledgement (in order; lost at a kill)."""
        key, value = w.pending.pop(0)
        offset = self.append(key, value)
        w.tracker.delivered(TP, offset)

    def flush_round(self, w: Worker) -> None:
        """WorkerStores.flush after every acknowledgement: rewrite, or persist."""
        if w.opened and w.flushing <= REWRITE_ROUNDS:
            gaps = w.tracker.take_gaps()
            keys = sorted(w.db.values) if TP in gaps else sorted(w.stale)
            w.stale = set()
            again = [(k, w.db.values[k]) for k in keys if k in w.db.values]
            if again:
                w.pending.extend(again)
                w.flushing += 1
                self.count("rewrites")
                return
        w.flushing = 0
        if not w.opened:
            return
        moved = persist_after(w.tracker.read_through(TP), w.db.persisted)
        if moved is not None:
            self.set_persisted(w, moved, "a checkpoint's flush")

    # -- the process

    def start(self, w: Worker) -> None:
        if w.flag:  # an unclean stop after the load: the databases are discarded
            w.db = Db()
            self.count("discards")
        w.flag = False
        span = load_span(TP, w.db.persisted, 0, self.end())
        w.phase = "loading"
        w.load = None if span is None else PartitionLoad(span)
        w.load_pos = 0 if span is None else span.first
        if w.load is None:
            self.joined(w)

    def load_step(self, w: Worker) -> None:
        assert w.load is not None
        span = w.load.span
        stop = min(span.end, w.load_pos + self.rng.randint(1, 8))
        records = [(o, k, v) for o, k, v in self.log[w.load_pos:stop]]
        w.load_pos = stop
        got = w.load.take(records, w.db.values.get)
        if got is not None:  # one write batch: values and offset together
            w.db.apply(got.writes)
            self.set_persisted(w, got.through, "a bulk load batch")
        if w.load_pos >= span.end:
            self.joined(w)

    def joined(self, w: Worker) -> None:
        w.stale.update(w.load.stale if w.load is not None else ())
        w.phase, w.load, w.flag = "joined", None, True
        w.member = True
        self.rebalance()

    def kill(self, w: Worker) -> None:
        if w.member:
            w.member = False
            self.rebalance()
        w.reset_process()
        self.count("kills")

    def begin_change(self, w: Worker, change: str) -> None:
        """A rebalance reaches the worker, it stops, or (a zombie) it learns it was
        expelled: Faust applies its buffers (on_partitions_revoked), the operator's
        checkpoint at revocation writes what it applied."""
        w.pending_change = change
        self.apply(w)
        if w.started:
            self.checkpoint(w)

    def finish_change(self, w: Worker) -> None:
        change, w.pending_change = w.pending_change, ""
        w.tracker.end(TP)  # WorkerStores.release
        w.opened = w.started = False
        w.dirty = set()
        if change == "stopping":
            self.reader_stop(w)  # BatchedTableManager.on_stop
            self.apply(w)  # Recovery.on_stop
            if w.member:
                w.member = False
                self.rebalance()
            w.flag = False  # a clean stop: the databases stay
            w.reset_process()
            self.count("stops")
            return
        if change == "rejoining":  # it was expelled: it joins again
            w.member = True
            self.rebalance()
            return
        w.gen = self.gen
        self.faust_rebalance(w, self.assignment.get(w.name))

    # -- one run

    def moves(self, w: Worker) -> list[tuple[float, Callable[[], None]]]:
        """What may happen next at `w`, with weights."""
        if w.phase == "down":
            return [(1.0, lambda: self.start(w))]
        if w.phase == "loading":
            return [(3.0, lambda: self.load_step(w)), (0.3, lambda: self.kill(w))]
        if w.paused:
            return [(1.0, lambda: self.resume(w))]
        got: list[tuple[float, Callable[[], None]]] = [
            (0.1, lambda: self.kill(w)), (0.1, lambda: self.pause(w))]
        got.append((1.0, lambda: self.heal(w)) if w.cut else (0.1, lambda: self.cut_off(w)))
        if w.pending and not w.cut:
            got.append((4.0, lambda: self.deliver(w)))
        if w.flushing and not w.pending:
            got.append((3.0, lambda: self.flush_round(w)))
        if w.pending_change and not w.flushing and not w.cut:
            got.append((2.0, lambda: self.finish_change(w)))
        if not w.pending_change and not w.cut:
            if not w.member:
                got.append((1.0, lambda: self.begin_change(w, "rejoining")))
            elif w.gen < self.gen:
                got.append((2.0, lambda: self.begin_change(w, "revoking")))
            got.append((0.05, lambda: self.begin_change(w, "stopping")))
        if w.fetch_pos is not None and w.fetch_pos < self.end() and not w.cut:
            got.append((3.0, lambda: self.fetch(w)))
        if w.queue:
            got.append((2.0, lambda: self.take(w)))
        if w.reader_pos is not None and w.reader_pos < self.end() and not w.cut:
            got.append((3.0, lambda: self.reader_fetch(w)))
        if w.started and not w.pending_change:
            got.append((2.0, lambda: self.advance(w)))
            if not w.flushing and (w.opened or not w.queue):
                # the changelog loop drains its queue long before the operator's first
                # checkpoint of an assignment
                got.append((2.0, lambda: self.checkpoint(w)))
        return got

    def pause(self, w: Worker) -> None:
        w.paused = True
        self.count("pauses")

    def resume(self, w: Worker) -> None:
        w.paused = False
        if not w.member and self.rng.random() < 0.5:
            self.kill(w)  # the suspension fence: stopped past half the session timeout

    def cut_off(self, w: Worker) -> None:
        w.cut = True
        self.count("cuts")

    def heal(self, w: Worker) -> None:
        w.cut = False

    def expire(self) -> None:
        """The coordinator expels a member it has not heard from."""
        for w in self.workers:
            if w.member and (w.paused or w.cut):
                w.member = False
                self.rebalance()
                self.count("expulsions")
                return

    def run(self, steps: int) -> None:
        for _ in range(steps):
            moves: list[tuple[float, Callable[[], None]]] = []
            for w in self.workers:
                moves += self.moves(w)
            if any(w.member and (w.paused or w.cut) for w in self.workers):
                moves.append((0.5, self.expire))
            weights = [m[0] for m in moves]
            self.rng.choices([m[1] for m in moves], weights)[0]()
        for w in self.workers:
            if w.phase != "down":
                self.check_through(w, w.db.persisted, "the end of the run")


def _run(seed: int, **variant: Any) -> Model:
    model = Model(random.Random(seed), **variant)
    model.run(STEPS)
    return model


def test_no_interleaving_loses_a_changelog_record() -> None:
    """1,500 seeded schedules of 160 steps: no persisted offset ever passes a record its
    database lacks, every completed recovery holds what it read, and no restored
    partition value outruns its counters. Not vacuous: the totals (today about 9,000
    recoveries, 14,000 checkpoints, 1,300 rewrites after gaps, 3,000 expulsions of a
    paused or cut-off owner, 6,000 databases discarded after a kill) say how often each
    hazard happened."""
    totals: dict[str, int] = {}
    for seed in SEEDS:
        model = _run(seed)
        for key, n in model.stats.items():
            totals[key] = totals.get(key, 0) + n
    assert totals["recoveries"] > 5_000
    assert totals["rewrites"] > 500  # gaps among own writes: zombies' and owners'
    assert totals["expulsions"] > 1_000
    assert totals["discards"] > 1_000
    assert totals["checkpoints"] > 8_000
    assert totals["standby writes"] > 1_000


@pytest.mark.parametrize("variant", [
    {"tracker_class": FaustTracker},
    {"merge": last_record_merge},
    {"recovery_reads_on": False},
    {"begin_at_end": True},
    {"part_first": True},
    {"reader_drops_pending": True},
], ids=["faust-tracker", "last-record-merge", "no-recovery-read", "begin-at-end",
        "partition-value-first", "reader-drops-pending"])
def test_the_model_catches_a_broken_bookkeeping(variant: dict[str, Any]) -> None:
    """Controls: each broken rule fails on some of the first 400 seeds (today 38, 36,
    311, 32, 190 and 235 of them; the fifth, a write plan with the partition value
    before its counters, only on the check that the partition value implies its counters: a kill
    lands it without them)."""
    failed = 0
    for seed in SEEDS[:400]:
        try:
            _run(seed, **variant)
        except Violation:
            failed += 1
    assert failed > 0


def _to(model: Model, w: Worker, t: int) -> None:
    """The operator of `w` applies the timeline through `t`."""
    while w.t < t:
        w.t += 1
        w.dirty.update(model.timeline.at_offset(w.t))


def _acknowledged(model: Model, w: Worker) -> None:
    """Every send of `w` lands, then its checkpoint's flush runs to its end."""
    while w.pending or w.flushing:
        while w.pending:
            model.deliver(w)
        model.flush_round(w)


def _late_write_under_the_new_owner(takes: Callable[[bool, bool, int, int | None], bool]
                                    ) -> Model:
    """The case the random schedules found (Faust's loop, seed 897 of 2,000): A owns the
    partition and is cut off with a checkpoint sent but not landed; B takes over and
    restores A's previous checkpoint; A's late batch lands right after the highwater B's
    recovery read, and a fetch under way when B's recovery ended queues it. Faust's loop
    takes it as an active record and applies it (a full buffer): B's database now holds
    A's newer partition value, and its persisted offset is past it. B's operator, still
    behind A, writes its own older partition value over it (a plain write, as every
    checkpoint's), and its tracker, begun at the persisted offset, sees its own writes
    land right after: the persisted offset moves over a record whose value the database
    no longer holds. B's next restore would start past it."""
    model = Model(random.Random(0), takes=takes)
    a, b = model.workers
    model.start(a)  # an empty changelog: nothing to load; a joins, owns the partition
    model.begin_change(a, "revoking")
    model.finish_change(a)
    assert a.role == "active" and a.started
    _to(model, a, 4)
    model.checkpoint(a)
    _acknowledged(model, a)
    model.cut_off(a)
    t = 5
    while True:  # a's late batch: at least two counters and the partition value
        _to(model, a, t)
        if len(a.dirty) >= 2:
            break
        t += 1
    model.checkpoint(a)  # in a's database; its sends wait
    assert len(a.pending) >= RECOVERY_BUFFER
    model.start(b)
    while b.phase == "loading":
        model.load_step(b)
    model.expire()  # a is expelled: b owns the partition
    model.begin_change(b, "revoking")
    model.finish_change(b)
    assert b.role == "active"
    highwater = b.highwater
    while b.recovering:
        while b.fetch_pos is not None and b.fetch_pos < model.end():
            model.fetch(b)
        model.take(b)
    assert _offset(b.db.values[PART]) == 4
    model.heal(a)
    while a.pending:  # a's late batch lands past the highwater b read
        model.deliver(a)
    b.queue.extend(model.log[highwater + 1:])  # the fetch under way
    model.take(b)
    _to(model, b, 5)
    model.checkpoint(b)
    _acknowledged(model, b)
    return model


def test_a_late_write_fetched_after_the_recovery_is_left_to_the_next_restore() -> None:
    """With `restore.recovery_takes` the late batch stays unapplied: B's own writes land
    after it, its tracker sees the gap, the persisted offset stays at the end of B's
    recovery, and B's next restore reads A's batch. Control: Faust's loop (applying
    it) moves the persisted offset past a newer partition value than the database's."""
    model = _late_write_under_the_new_owner(recovery_takes)
    b = model.workers[1]
    assert b.db.persisted == b.highwater
    assert model.stats["rewrites"] >= 1  # the gap: b wrote everything again
    model.begin_change(b, "revoking")  # b's next assignment restores from there
    model.finish_change(b)
    while b.recovering:
        while b.fetch_pos is not None and b.fetch_pos < model.end():
            model.fetch(b)
        model.take(b)
    assert _offset(b.db.values[PART]) > 5  # a's newer partition value, restored
    with pytest.raises(Violation, match="part"):
        _late_write_under_the_new_owner(faust_takes)


def test_the_pure_rules() -> None:
    """`recovery_takes`: past the offset seen only, an active partition's records only
    while its recovery runs, a standby's always. `persist_after`: forward only, nothing
    when the tracker does not know."""
    assert recovery_takes(True, True, 5, 4) and not recovery_takes(True, True, 4, 4)
    assert recovery_takes(True, True, 0, None)
    assert not recovery_takes(True, False, 5, 4) and not recovery_takes(True, False, 0, None)
    assert recovery_takes(False, False, 5, 4) and not recovery_takes(False, True, 3, 4)
    assert persist_after(7, 5) == 7 and persist_after(7, None) == 7
    assert persist_after(5, 7) is None and persist_after(7, 7) is None
    assert persist_after(None, 3) is None and persist_after(-1, None) is None
