"""Standby copies kept off the event loop: `StandbyReader` reads the changelog partitions
this worker keeps a standby copy of in a thread of its own, with one confluent-kafka
consumer, and applies them as the bulk load does.

Faust keeps a standby copy through its own consumer: every changelog record of a peer's
partition becomes a Faust message and event, goes through the conductor into the
recovery's queue and its loop, all on the event loop (21-32 us each; bench/README, "Phase
scaleout"). With standby replicas on, every record one worker writes is read so by
another, work a lone worker never does: most of why CPU per counted event grew with the
number of workers. Here the records come in batches of up to `BATCH` from librdkafka and
cost a merge and a share of one write batch each, in a thread that leaves the event loop
free between them.

The rules kept (docs/state.md, "Standby copies"):

- Faust's assignor still decides which partitions a worker keeps a standby copy of;
  Faust's recovery is handed none of them (`BatchedRecovery.take_standbys`), so its
  consumer keeps their changelog partitions paused, as it pauses every changelog
  partition at an assignment.
- The reader runs only between rebalances. It is stopped, its buffers applied, before
  Faust's tables see the next assignment (`BatchedTableManager.on_rebalance`): before
  any database is closed, opened, restored or read for its persisted offset. It starts
  anew after, on the new standby set, each partition from just after its database's
  persisted offset. A partition it kept that becomes active here is restored by Faust's
  recovery from that offset: every record at or below it is in the database.
- Records are merged by the monotone rule (`restore.merge_changelog`,
  `state.supersedes`) and written with the persisted offset of the last record they
  cover in ONE write batch: a crash at any point leaves a database whose persisted
  offset says exactly what it applied, and the next restore or standby read goes on from
  there. A partition's records are held until `table.STANDBY_BUFFER` of them (a key's
  records repeat across checkpoints: one write each per batch), or until the reader
  stops.
- Keys whose last record read was refused (older than the value held) join the table's
  `stale` set of their partition, and leave it when a later record is written: the owner
  writes them again once the partition is its own (table.WorkerStores.flush).

Nothing here logs a key or a value: only partitions, offsets, counts and error types.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from processor.stream.kafka import kafka_io
from processor.stream.model.restore import merge_changelog
from processor.stream.worker.table import merged_batch

log = logging.getLogger("processor.stream.standby")

#: Records asked of librdkafka per call.
BATCH: Final = 10_000
#: Seconds one call waits for records: how long a stop waits for the reader at most,
#: beside the last batches' writes.
POLL_S: Final = 0.25
#: librdkafka's fetch settings of the reader: large fetches, and a fetch of partitions
#: with nothing new waits at most this long at the broker (in C, off the event loop).
_FETCH: Final = {"fetch.max.bytes": str(32 << 20), "max.partition.fetch.bytes": str(8 << 20),
                 "fetch.wait.max.ms": "200"}


@dataclass
class StandbyPartition:
    """One partition kept: its database, the offset of the last record applied (None:
    none yet), the records read since, and the table's stale-key set of the partition."""

    db: Any
    through: int | None
    stale: set[bytes]
    pending: list[tuple[int, bytes | None, bytes | None]] = field(default_factory=list)

    def apply(self) -> None:
        """Merge the pending records into the database and persist the offset of the
        last of them, in one write batch."""
        recs = self.pending
        if not recs:
            return
        writes, stale = merge_changelog(
            ((k, v) for _o, k, v in recs if k is not None), self.db.get)
        through = recs[-1][0]
        self.db.write(merged_batch(writes, through))
        self.stale.difference_update(writes)
        self.stale.update(stale)
        self.through = through
        self.pending = []


class StandbyReader:
    """The standby copies of one assignment: `start` them (databases opened by the
    caller, on the event loop), `stop` (blocking: the thread's last buffers applied,
    then it ends). `taken(n)` is told of every n records taken into a copy (from the
    thread), as Faust's recovery counts them: when read, before their write."""

    def __init__(self, conf: Mapping[str, str], buffer: int,
                 taken: Callable[[int], None] | None = None) -> None:
        self._conf = {**conf, **_FETCH}
        self._buffer = buffer
        self._taken = taken
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        #: (topic, partition) -> what is kept of it; the thread's while it runs.
        self._parts: dict[tuple[str, int], StandbyPartition] = {}
        #: The error type that ended the last thread early (None: none).
        self.failure: str | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self, parts: Mapping[tuple[str, int], StandbyPartition]) -> None:
        """Read each (topic, partition) of `parts` from just after its `through`, until
        `stop`. Nothing to keep: no thread."""
        if self._thread is not None:
            raise RuntimeError("the standby reader is already running")
        if not parts:
            return
        self._parts = dict(parts)
        self._stopping.clear()
        self.failure = None
        self._thread = threading.Thread(target=self._run, name="dpc-standby", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread once its last buffers are applied, and forget every database
        (Faust may close and reopen them next)."""
        thread = self._thread
        if thread is None:
            return
        self._stopping.set()
        thread.join()
        self._thread = None
        self._parts = {}

    def _run(self) -> None:
        parts = self._parts
        consumer = kafka_io.reader_consumer(self._conf)
        try:
            consumer.assign([
                TopicPartition(topic, p, OFFSET_BEGINNING if part.through is None
                               else part.through + 1)
                for (topic, p), part in sorted(parts.items())])
            while not self._stopping.is_set():
                batch: list[Any] = consumer.consume(num_messages=BATCH, timeout=POLL_S)
                taken = self._take(batch)
                if taken and self._taken is not None:
                    self._taken(taken)
                for part in parts.values():
                    if len(part.pending) >= self._buffer:
                        part.apply()
        except Exception as exc:  # the database or the client: the copy stops here
            self.failure = type(exc).__name__
            log.error("standby copies stopped (%s): the next restore reads the rest",
                      self.failure)
        finally:
            try:
                for part in parts.values():
                    part.apply()
            except Exception as exc:
                self.failure = type(exc).__name__
                log.error("standby copies' last write failed (%s): the next restore "
                          "reads the rest", self.failure)
            consumer.close()

    def _take(self, batch: list[Any]) -> int:
        """Queue each record of `batch` past what its partition holds; returns how many."""
        parts = self._parts
        n = 0
        for msg in batch:
            err = msg.error()
            if err is not None:  # no end-of-partition events: the reader asks for none
                log.warning("standby copy read error %s on partition %s", err.name(),
                            msg.partition())
                continue
            part = parts.get((msg.topic(), msg.partition()))
            offset = msg.offset()
            if part is None or (part.through is not None and offset <= part.through):
                continue
            if part.pending and offset <= part.pending[-1][0]:
                continue  # read again after a fetch retry: taken already
            # A record without a key has nothing to apply, but the persisted offset
            # covers it all the same.
            part.pending.append((offset, msg.key(), msg.value()))
            n += 1
        return n
