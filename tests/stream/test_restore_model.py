"""The restore's bookkeeping against a reference, under random interleavings (no Kafka,
no RocksDB): model/restore.py's bulk load (`load_span`, `PartitionLoad`) and a model of
Faust's recovery after it, on one changelog partition that other writers append to at
any moment, through starts, crashes (kill -9, in the load and after it), clean stops,
assignments and revocations.

The claim checked (docs/state.md, "Restore"): whenever the recovery of an assignment
completes, the local database holds exactly the monotone merge of every changelog record
below the partition's end at that assignment (and the records past it that the
recovery's last fetch brought, nothing else). The reference computes that merge on its
own: per key, the value with the highest offset header among its records (a key with
deletions only is absent), never through `merge_changelog`.

The model of Faust's side is what recovery.py and table.py do: at an assignment, read from
the persisted offset (Faust seeks there, inclusive, and skips what it has seen) up to the
high watermark read then; apply the buffer when full, at the end, at a revocation and at
a clean stop, then persist its last offset. A kill -9 after the load leaves the running
flag: the next start discards the databases (app._prepare_state_dir); a kill -9 during the
load leaves them as the load's write batches made them (one batch: values and persisted
offset together). Offsets without a record stand for transaction markers and compacted
records.

Controls, each of which must fail on some seeds: a load that persists the high watermark
instead of its last record's offset; one that stops a record early but persists as if it
read it; one that writes the persisted offset before the values (a crash in between).
False-alarm rate: 0 (deterministic, fixed seeds).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from processor.stream.model.restore import (
    Chunk,
    LoadSpan,
    PartitionLoad,
    load_span,
    merge_changelog,
)
from processor.stream.model.state import UNIT_MAGIC, stored_offset

KEYS = [b"k%d" % i for i in range(6)]
SEEDS = range(300)
#: Records Faust's recovery buffers before it applies them (small: buffers fill often).
BUFFER = 3


def _value(key: bytes, offset: int) -> bytes:
    """A stored value reflecting the timeline through `offset`: the same bytes for the same
    key and offset, as in production."""
    return UNIT_MAGIC + offset.to_bytes(8, "big", signed=True) + key


Record = tuple[int, bytes | None, bytes | None]


def _reference(log: list[Record], end: int) -> dict[bytes, bytes]:
    """Per key, the value with the highest offset header among the records below `end`."""
    best: dict[bytes, bytes] = {}
    for offset, key, value in log:
        if offset >= end or key is None or value is None:
            continue
        held = best.get(key)
        if held is None or (stored_offset(value) or 0) > (stored_offset(held) or 0):
            best[key] = value
    return best


@dataclass
class Db:
    values: dict[bytes, bytes] = field(default_factory=dict)
    persisted: int | None = None

    def apply(self, writes: dict[bytes, bytes | None]) -> None:
        for key, value in writes.items():
            if value is None:
                self.values.pop(key, None)
            else:
                self.values[key] = value


class Crash(Exception):
    """The process was killed (raised where a kill may fall between two writes)."""


@dataclass
class Model:
    rng: random.Random
    load_class: type[PartitionLoad] = PartitionLoad
    offset_first: bool = False
    log: list[Record] = field(default_factory=list)
    next_offset: int = 0
    db: Db = field(default_factory=Db)
    flag: bool = False
    phase: str = "down"  # down, loading, joined
    load: PartitionLoad | None = None
    position: int = 0
    # Faust's recovery of the current assignment (None: not assigned or done).
    recovering: bool = False
    seen: int = -1
    highwater: int = 0
    buffer: list[Record] = field(default_factory=list)
    checked: int = 0
    load_kills: int = 0

    # -- the brokers

    def append(self) -> None:
        for _ in range(self.rng.randint(1, 4)):
            self.next_offset += self.rng.choice((0, 0, 0, 1))  # a marker's offset
            key = self.rng.choice(KEYS)
            value = (None if self.rng.random() < 0.1
                     else _value(key, self.rng.randint(0, 40)))
            self.log.append((self.next_offset, key, value))
            self.next_offset += 1

    def end(self) -> int:
        return self.next_offset

    def read(self, start: int, stop: int) -> list[Record]:
        return [r for r in self.log if start <= r[0] < stop]

    # -- the worker

    def start(self) -> None:
        if self.flag:  # an unclean stop after the load: the databases are discarded
            self.db = Db()
        self.flag = False
        span = load_span(0, self.db.persisted, 0, self.end())
        self.phase = "loading"
        self.load = None if span is None else self.load_class(span)
        self.position = span.first if span is not None else 0
        if self.load is None:
            self.joined()

    def load_step(self) -> None:
        assert self.load is not None
        span = self.load.span
        stop = min(span.end, self.position + self.rng.randint(1, 5))
        records = self.read(self.position, stop)
        self.position = stop
        chunk = self.load.take(records, self.db.values.get)
        if chunk is not None:
            self.write(chunk)
        if self.position >= span.end:
            self.joined()

    def write(self, chunk: Chunk) -> None:
        if not self.offset_first:
            self.db.apply(chunk.writes)  # one write batch: both or neither
            self.db.persisted = chunk.through
            return
        self.db.persisted = chunk.through
        if self.rng.random() < 0.3:
            raise Crash
        self.db.apply(chunk.writes)

    def joined(self) -> None:
        self.phase, self.load, self.flag = "joined", None, True

    def assign(self) -> None:
        self.recovering = True
        self.seen = self.db.persisted if self.db.persisted is not None else -1
        self.position = max(self.seen, 0)
        self.highwater = self.end()
        self.buffer = []
        self.recover_step()

    def recover_step(self) -> None:
        stop = min(self.end(), self.position + self.rng.randint(1, 5))
        for record in self.read(self.position, stop):
            if record[0] <= self.seen:
                continue
            self.seen = record[0]
            self.buffer.append(record)
            if len(self.buffer) >= BUFFER:
                self.flush()
        self.position = stop
        if self.seen >= self.highwater - 1 or self.position >= self.highwater:
            self.flush()
            self.recovering = False
            self.check()

    def flush(self) -> None:
        if not self.buffer:
            return
        writes, _stale = merge_changelog(((k, v) for _o, k, v in self.buffer
                                          if k is not None), self.db.values.get)
        self.db.apply(writes)
        self.db.persisted = max(o for o, _k, _v in self.buffer)
        self.buffer = []

    def revoke(self) -> None:
        self.flush()
        self.recovering = False

    def stop(self) -> None:
        if self.phase == "joined":
            self.revoke()
            self.flag = False
        self.phase = "down"

    def kill(self) -> None:
        if self.phase == "loading" and self.db.persisted is not None:
            self.load_kills += 1
        self.phase, self.recovering, self.buffer, self.load = "down", False, [], None

    def check(self) -> None:
        """Every record below the end at the assignment is applied: the recovery read
        through `position` >= that end (a fetch may bring records past it, applied too),
        and the database is the merge of exactly the records below `position`."""
        assert self.position >= self.highwater or self.seen >= self.highwater - 1
        read = max(self.position, self.seen + 1)
        assert self.db.values == _reference(self.log, read), (
            f"after an assignment at end {self.highwater}, read through {read}: "
            f"persisted {self.db.persisted}")
        self.checked += 1

    # -- one run

    def run(self, steps: int) -> None:
        for _ in range(steps):
            try:
                self.step()
            except Crash:
                self.kill()

    def step(self) -> None:
        moves: list[Callable[[], None]] = [self.append]
        if self.phase == "down":
            moves.append(self.start)
        elif self.phase == "loading":
            moves += [self.load_step, self.load_step, self.kill]
        else:
            moves += [self.stop, self.kill]
            moves += ([self.recover_step, self.recover_step, self.revoke]
                      if self.recovering else [self.assign, self.assign])
        self.rng.choice(moves)()


def _run(seed: int, **variant: Any) -> Model:
    model = Model(random.Random(seed), **variant)
    model.run(400)
    return model


class HighWatermarkLoad(PartitionLoad):
    """Control: persists the span's end (the high watermark) once its last record is read,
    instead of that record's offset."""

    def take(self, records: Any, get: Any) -> Chunk | None:
        got = super().take(records, get)
        if got is not None and self.done():
            return Chunk(got.writes, self.span.end)
        return got


class SkipLastLoad(PartitionLoad):
    """Control: never applies the span's last offset, yet persists it when it is read."""

    def take(self, records: Any, get: Any) -> Chunk | None:
        last = self.span.end - 1
        got = super().take([r for r in records if r[0] != last], get)
        if any(r[0] == last for r in records):
            self.through = last
            return Chunk({} if got is None else got.writes, last)
        return got


def test_every_record_below_the_end_at_assignment_is_applied() -> None:
    """300 seeded runs of 400 random steps: every completed recovery holds exactly the
    reference merge. Not vacuous: the runs complete hundreds of recoveries and kill
    the load after it applied something more than a hundred times."""
    checked = records = load_kills = 0
    for seed in SEEDS:
        model = _run(seed)
        checked += model.checked
        records += len(model.log)
        load_kills += model.load_kills
    assert checked > 500
    assert records > 10_000
    assert load_kills > 100, load_kills


def test_the_model_catches_a_wrong_persisted_offset() -> None:
    """Controls: each broken load fails the check on some of the seeds (today 44, 92
    and 58 of the 300)."""
    for variant in ({"load_class": HighWatermarkLoad}, {"load_class": SkipLastLoad},
                    {"offset_first": True}):
        failed = 0
        for seed in SEEDS:
            try:
                _run(seed, **variant)
            except AssertionError:
                failed += 1
        assert failed > 0, variant


def test_load_span_starts_after_the_persisted_offset_and_within_the_log() -> None:
    """The span: after the persisted offset, never below the first offset the brokers hold,
    nothing when the database is through the end."""
    assert load_span(3, None, 5, 9) == LoadSpan(3, 5, 9)
    assert load_span(3, 6, 5, 9) == LoadSpan(3, 7, 9)
    assert load_span(3, 2, 5, 9) == LoadSpan(3, 5, 9)
    assert load_span(3, 8, 5, 9) is None
    assert load_span(3, None, 0, 0) is None


def test_a_chunk_persists_its_last_record_in_the_span_only() -> None:
    """A chunk persists the offset of its last record inside the span: one without a key
    counts (nothing to apply, but read), one at or past the span's end does not (Faust's
    recovery reads it), a run of records wholly outside is no chunk. Control: the merge
    keeps the newer value of a key read twice and reports the older one stale."""
    load = PartitionLoad(LoadSpan(0, 10, 14))
    held: dict[bytes, bytes] = {b"a": _value(b"a", 7)}
    assert load.take([(8, b"a", _value(b"a", 1)), (9, b"b", _value(b"b", 1))], held.get) is None
    got = load.take([(10, b"a", _value(b"a", 5)), (11, None, None)], held.get)
    assert got == Chunk({}, 11) and load.stale == {b"a"} and not load.done()
    got = load.take([(12, b"a", _value(b"a", 9)), (13, b"b", None), (14, b"c", _value(b"c", 1))],
                    held.get)
    assert got == Chunk({b"a": _value(b"a", 9), b"b": None}, 13)
    assert load.stale == set() and load.done()
