"""The restore's bookkeeping: which changelog records a local partition database takes,
and which offset it then says it has applied through. No Kafka, no RocksDB.

Two readers fill a partition's database from its changelog, both through
`merge_changelog` (THE monotone rule, `state.supersedes`, record by record):

- the bulk load (worker/bulkload.py), before the worker joins its group: each changelog
  partition from `load_span(...).first` up to the end it had when the load began
  (`PartitionLoad`);
- Faust's recovery (worker/recovery.py, worker/table.py), at each assignment: from the
  persisted offset up to the end the partition had at that assignment.

The persisted offset is "every record at or below it is applied" and nothing more: the
bulk load writes it in the same database write batch as the values of the records it
covers, and only ever the offset of the last record applied (`Chunk.through`), so a crash
at any point leaves it true, and the next reader (the load again, or Faust) starts right
after it. Applying a record twice changes nothing (the merge is idempotent and, for
values whose offsets say how new they are, order-insensitive), so overlap costs time
only. The argument in full: docs/state.md, "Restore".

The worker's own checkpoints move the persisted offset too, over its own acknowledged
writes, only while they land one right after the other since the partition was loaded
(`ChangelogTracker`, `persist_after`; worker/table.py calls them): a foreign write
between them (a zombie's late one, a new owner's) is a record the database may lack.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from processor.stream.model.state import supersedes


def merge_changelog(records: Iterable[tuple[bytes, bytes | None]],
                    get: Callable[[bytes], Any],
                    ) -> tuple[dict[bytes, bytes | None], set[bytes]]:
    """One partition's changelog records (key, value; None: a deletion), in offset order,
    merged into a store by `state.supersedes` as if applied one by one: returns the value
    to write for each key that takes one (its last accepted record) and the keys whose
    last record was refused (older than what the store, or an earlier record of the
    batch, holds). `get` reads a key's stored value (None: absent), once per key: a
    key's records repeat within a batch (one per checkpoint that changed it), and its
    database write is one."""
    current: dict[bytes, bytes | None] = {}
    writes: dict[bytes, bytes | None] = {}
    stale: set[bytes] = set()
    for key, value in records:
        held = current[key] if key in current else get(key)
        if supersedes(value, held):
            current[key] = writes[key] = value
            stale.discard(key)
        else:
            current[key] = held
            stale.add(key)
    return writes, stale


@dataclass(frozen=True)
class LoadSpan:
    """What the bulk load reads of one changelog partition: offsets `first` <= o < `end`
    (`end`: the partition's high watermark when the load began)."""

    partition: int
    first: int
    end: int


def load_span(partition: int, persisted: int | None, low: int, high: int) -> LoadSpan | None:
    """The span a database that applied through `persisted` (None: nothing) reads of a
    partition holding offsets `low` <= o < `high` (None: nothing to read). Records below
    `low` are gone from the brokers (compacted or deleted): reading starts at the
    first one there is, as Faust's recovery does."""
    first = low if persisted is None else max(persisted + 1, low)
    return LoadSpan(partition, first, high) if first < high else None


@dataclass(frozen=True)
class Chunk:
    """One database write batch: the values to write (None: delete) and the offset to
    persist with them, the last record they cover."""

    writes: dict[bytes, bytes | None]
    through: int


@dataclass
class PartitionLoad:
    """The bulk load of one span: `take` turns each run of records read into a `Chunk`;
    `stale` collects the keys whose last record read was older than the value held (the
    owner writes them again, table.MonotoneTable.stale)."""

    span: LoadSpan
    stale: set[bytes] = field(default_factory=set)
    #: The offset of the last record taken (None: none yet).
    through: int | None = None

    def take(self, records: Sequence[tuple[int, bytes | None, bytes | None]],
             get: Callable[[bytes], Any]) -> Chunk | None:
        """(offset, key, value) records read next, in offset order, merged against the
        database (`get`); None when none of them is in the span. Records at or past the
        span's end are left to Faust's recovery; a record without a key has nothing to
        apply but is covered by the offset all the same."""
        inside = [r for r in records if self.span.first <= r[0] < self.span.end]
        if not inside:
            return None
        writes, stale = merge_changelog(
            ((key, value) for _o, key, value in inside if key is not None), get)
        self.stale.difference_update(writes)
        self.stale.update(stale)
        self.through = inside[-1][0]
        return Chunk(writes, self.through)

    def done(self) -> bool:
        """Whether the last record of the span was taken."""
        return self.through is not None and self.through >= self.span.end - 1


class ChangelogTracker:
    """Per changelog partition this process owns: where its own next write lands if
    nothing else writes in between (`expected`), whether that held since the partition
    was loaded (`clean`: only then may the persisted offset move over its writes), and
    the partitions where something else wrote since the last `take_gaps`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._expected: dict[int, int] = {}
        self._clean: dict[int, bool] = {}
        self._gaps: set[int] = set()

    def begin(self, partition: int, read_through: int | None) -> None:
        """The partition's database reflects every changelog record <= `read_through`
        (None: none): this process's next write should land right after it."""
        with self._lock:
            self._expected[partition] = (read_through if read_through is not None else -1) + 1
            self._clean[partition] = True

    def delivered(self, partition: int, offset: int) -> None:
        """A write of this process landed at `offset` (called in the producer's thread,
        in offset order per partition)."""
        with self._lock:
            want = self._expected.get(partition)
            if want is None:
                return
            if want != offset:
                self._gaps.add(partition)
                self._clean[partition] = False
            self._expected[partition] = offset + 1

    def take_gaps(self) -> set[int]:
        """The partitions where something else wrote between this process's writes since
        the last call."""
        with self._lock:
            gaps, self._gaps = self._gaps, set()
            return gaps

    def read_through(self, partition: int) -> int | None:
        """The offset through which the changelog holds nothing but what the database
        holds (None: unknown, after a gap since the partition was loaded)."""
        with self._lock:
            want = self._expected.get(partition)
            if want is None or not self._clean.get(partition, False):
                return None
            return want - 1

    def end(self, partition: int) -> None:
        with self._lock:
            self._expected.pop(partition, None)
            self._clean.pop(partition, None)
            self._gaps.discard(partition)


def persist_after(read_through: int | None, persisted: int | None) -> int | None:
    """The persisted offset a checkpoint's flush sets once its own writes are
    acknowledged (worker/table.py, `WorkerStores.flush`): the tracker's `read_through`
    where it is known and past what is persisted, else None (leave it). Only ever
    forward: a lower offset would be true too, but costs a longer restore."""
    if read_through is None or read_through < 0:
        return None
    return read_through if persisted is None or read_through > persisted else None


def recovery_takes(active: bool, in_recovery: bool, offset: int, seen: int | None) -> bool:
    """Whether Faust's changelog loop (worker/recovery.py) buffers a record at `offset`
    of a partition held active (`active`) or as a standby copy, `seen` the offset it
    already took of that partition (None: none): only a record past it, as Faust's loop,
    and of an active partition only while a recovery runs (`in_recovery`).

    After an active partition's recovery ended, the operator writes its database
    itself, computing from the state the recovery left; a record read later (a fetch
    under way when the partition was paused, queued) is a foreign write that landed past
    the assignment's highwater (a zombie's late write). Applied, it can put a newer value
    under the operator, whose next plain write of that key takes it back, while the
    persisted offset has moved past the newer record. Left alone, it sits between the
    recovery's end and the owner's own writes: the tracker sees the gap, the persisted
    offset stays, and the next restore reads it (docs/state.md, "Restore")."""
    if active and not in_recovery:
        return False
    return seen is None or offset > seen
