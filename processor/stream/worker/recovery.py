"""Faust's table recovery with a changelog loop that takes the records in batches:
`BatchedRecovery`, installed by `BatchedTableManager` (`faust.App(TableManager=...)`),
fed by Faust's changelog queue. The worker's standby copies are not Faust's: the manager
takes them out of each assignment (`BatchedRecovery.take_standbys`) for the standby
reader (standby.py), which it stops before each rebalance reaches the tables and starts
after it. An app that names no reader settings (`standby_conf`) keeps Faust's standby
copies, through this loop.

Faust's loop (`Recovery._slurp_changelogs`) takes one changelog record per turn of the
event loop: a `wait_for` on its queue (a task, a timer and a future per record), debug
strings formatted per record, the recovery-end and standby-ready checks per record. A
standby copy reads every changelog record its peers write, so with standby replicas that
per-record cost grew with the number of workers. This loop waits once (and, when that
record came alone, a moment more: `LINGER_S`), then takes every record queued and
handles them in order, as Faust's does one by one:

- a record of an active partition counts toward that partition's active offset, one of a
  standby partition toward its standby offset; only a record past the offset already
  seen for its partition is buffered (the same record read again is not), and of an
  active partition only while its recovery runs (below);
- a table's buffer goes to `apply_changelog_batch` (table.MonotoneTable: every record
  through the monotone merge) as soon as it holds the table's recovery or standby buffer
  size, and whatever is left when an active recovery catches up, at a rebalance and at
  stop (Faust's `flush_buffers`);
- the end of an active recovery (every active partition read through its highwater:
  buffers flushed, `signal_recovery_end` set, the operator may start) and the standbys'
  readiness are checked after each batch instead of after each record: the records of
  a batch are all taken first, so nothing is signalled earlier than Faust would (at
  most `LINGER_S` and one batch later);
- the persisted offsets are the table's business (`apply_changelog_batch` sets them over
  what it applied), unchanged.

Two differences on purpose: Faust handles a record of a partition that is neither active
nor standby here (it logs a warning) with whatever table and offsets the record before
it used; this loop skips it after the same warning. And a record of an active partition
taken while no recovery runs (queued by a fetch under way when the recovery ended and
paused the partition) is not applied, nor counted as seen: the operator writes that
database now, and a foreign record applied under it could be taken back by its next
write while the persisted offset has passed it (`restore.recovery_takes`); left alone,
the next restore reads it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable
from time import monotonic
from typing import Any

from faust.tables.manager import TableManager
from faust.tables.recovery import Recovery
from faust.types import TP, EventT
from faust.utils.tracing import finish_span
from mode import Service

from processor.stream.model.restore import recovery_takes
from processor.stream.worker.standby import StandbyPartition, StandbyReader
from processor.stream.worker.table import STANDBY_BUFFER

log = logging.getLogger("processor.stream.recovery")

#: Seconds the loop waits for a record before it checks again whether an idle active
#: recovery is complete (Faust's figure).
IDLE_CHECK_S = 5.0
#: Seconds the loop lets records gather after the first of a batch when no other was
#: queued yet: a standby applies its buffer thousands of records later anyway, and an
#: active recovery ends at most this much later.
LINGER_S = 0.02


class BatchedRecovery(Recovery):
    """faust.tables.recovery.Recovery whose changelog loop takes the queued records in
    batches (see the module doc); everything else is Faust's."""

    #: Faust names a service's logger after its module: kept as it was before the
    #: worker package, so that log lines keep their logger names.
    logger = logging.getLogger("processor.stream.recovery")

    @Service.task
    async def _slurp_changelogs(self) -> None:
        queue = self.tables.changelog_queue
        idle_checks = 0
        while not self.should_stop:
            self.signal_recovery_end.clear()
            try:
                first = await asyncio.wait_for(queue.get(), timeout=IDLE_CHECK_S)
            except TimeoutError:
                idle_checks += 1
                if self.should_stop:
                    return
                await self._checked(self._end_if_caught_up(idle_checks))
                continue
            except Exception as exc:
                log.warning("Error in recovery %s", exc)
                continue
            idle_checks = 0
            if queue.empty():
                # The consumer hands records over one per turn of the event loop: a
                # moment's wait lets the rest of what it fetched join this batch. A
                # rebalance meanwhile finds `first` where Faust's loop finds the records
                # still queued then: taken next, in order, under the new assignment.
                await asyncio.sleep(LINGER_S)
            batch = self._drain(queue, first)
            now = monotonic()
            taken = {"restore": 0, "standby": 0}
            for event in batch:
                try:
                    copy = await self._take(event, now)
                except Exception as exc:  # Faust's loop logs it and takes the next record
                    log.warning("Error in recovery %s", exc)
                else:
                    if copy is not None:
                        taken[copy] += 1
            counted = getattr(self.app, "changelog_taken", None)
            if counted is not None:
                for copy, records in taken.items():
                    if records:
                        counted(copy, records)
            await self._checked(self._end_if_caught_up(0))
            await self._checked(self._standbys_if_caught_up())

    @staticmethod
    def _drain(queue: Any, first: EventT[Any]) -> list[EventT[Any]]:
        """`first` and every record already in `queue`, in queue order."""
        batch = [first]
        get = queue.get_nowait
        while True:
            try:
                batch.append(get())
            except asyncio.QueueEmpty:
                return batch
            except Exception as exc:  # an error thrown into the queue: Faust logs it
                log.warning("Error in recovery %s", exc)
                return batch

    @staticmethod
    async def _checked(step: Awaitable[None]) -> None:
        """Await one step; an error is logged and the loop goes on (as Faust's does, per
        record; a buffer whose apply failed is kept, and applied again when full)."""
        try:
            await step
        except Exception as exc:
            log.warning("Error in recovery %s", exc)

    async def _take(self, event: EventT[Any], now: float) -> str | None:
        """One changelog record from Faust's queue, as Faust's loop takes it: counted
        toward its partition's active or standby offset if past it, buffered, the
        table's buffer applied when full. `now`: when its batch was taken (the time
        Faust's loop notes per record). Returns the copy it went to ("restore",
        "standby"), None if it was not taken."""
        tp: TP = event.message.tp
        offset: int = event.message.offset
        table = self.tp_to_table.get(tp)
        if tp in self.active_tps and table is not None:
            active, offsets = True, self.active_offsets
            size = self._buffer_size(tp, table.recovery_buffer_size)
            self._active_events_received_at[tp] = now
        elif tp in self.standby_tps and table is not None:
            active, offsets = False, self.standby_offsets
            size = self._buffer_size(tp, table.standby_buffer_size)
            self._standby_events_received_at[tp] = now
        else:
            log.warning("recovery unknown topic %s offset %s", tp, offset)
            return None
        buf = self.buffers[table]
        if not recovery_takes(active, self.in_recovery, offset, offsets.get(tp)):
            return None
        offsets[tp] = offset
        buf.append(event)
        await table.on_changelog_event(event)
        if len(buf) >= size:
            table.apply_changelog_batch(buf)
            buf.clear()
            self._last_flush_at = now
        if active:
            self._sample_active(monotonic())
            return "restore"
        return "standby"

    def take_standbys(self) -> set[TP]:
        """The standby partitions of the assignment just made, taken out of this
        recovery (which then neither seeks, resumes nor reads them: their changelog
        partitions stay paused) for the standby reader (standby.py)."""
        tps = set(self.standby_tps)
        self.standby_tps.clear()  # the same set Faust's recovery task reads
        self.standbys_for_table.clear()
        for tp in tps:
            self.standby_offsets.pop(tp, None)
            self.standby_highwaters.pop(tp, None)
        return tps

    def _buffer_size(self, tp: TP, size: int) -> int:
        cached = self.buffer_sizes.get(tp)
        if cached is None:
            cached = self.buffer_sizes[tp] = size
        return cached

    def _sample_active(self, now: float) -> None:
        """Time between active records (the restore's estimate of time remaining)."""
        last = self._last_active_event_processed_at
        if last is not None:
            times: deque[float] = self._processing_times
            times.append(now - last)
            if len(times) > self.num_samples_required_for_estimate:
                times.popleft()
        self._last_active_event_processed_at = now

    async def _end_if_caught_up(self, idle_checks: int) -> None:
        """An active recovery that read every active partition through its highwater:
        apply what the buffers hold, mark the recovery ended and signal it.
        `idle_checks`: consecutive waits that found no record (0 after a batch); from the
        second on, under transactions, aborted transactions at the end of a partition
        count as read."""
        if idle_checks > 1 and self.app.in_transaction:
            await self._skip_aborted_tails()
        if self.in_recovery and not self.need_recovery():
            self.flush_buffers()
            self._set_recovery_ended()
            if self._actives_span is not None:
                self._actives_span.set_tag("Actives-Ready", True)
            self.signal_recovery_end.set()

    async def _skip_aborted_tails(self) -> None:
        """Under transactions a partition's highwater may be past its last readable
        record (an aborted transaction's markers): the consumer's position at the
        highwater means the partition is read through."""
        offsets = self.active_offsets
        for tp, highwater in self.active_highwaters.items():
            if highwater is None or offsets[tp] is None or offsets[tp] >= highwater:
                continue
            position = await self.app.consumer.position(tp)
            if position is not None and position >= highwater:
                log.info("Aborted tx until highwater for %s", tp)
                offsets[tp] = highwater

    async def _standbys_if_caught_up(self) -> None:
        """The standbys read through their highwaters: tell the table manager once."""
        if self._standbys_span is None and self.tables.standbys_ready:
            return
        if not self.standby_remaining_total():
            if self._standbys_span is not None:
                finish_span(self._standbys_span)
                self._standbys_span = None
            self.tables.on_standbys_ready()


class BatchedTableManager(TableManager):
    """faust's TableManager with `BatchedRecovery` as its recovery service, and the
    standby copies read by a `StandbyReader` (standby.py) when the app names the
    reader's Kafka settings (`standby_conf`): stopped before each rebalance reaches the
    tables, started after it on the new standby set, stopped before the tables stop."""

    #: Faust names a service's logger after its module: kept as it was before the
    #: worker package, so that log lines keep their logger names.
    logger = logging.getLogger("processor.stream.recovery")

    @property
    def recovery(self) -> Recovery:
        if self._recovery is None:
            self._recovery = BatchedRecovery(self.app, self, beacon=self.beacon,
                                             loop=self.loop)
        return self._recovery

    standby_reader: StandbyReader | None = None

    def _reader(self) -> StandbyReader | None:
        """The standby reader (made at the first rebalance, in the event loop); None
        when the app names no reader settings."""
        reader = self.standby_reader
        if reader is None:
            conf = getattr(self.app, "standby_conf", None)
            if conf is None:
                return None  # Faust's own standby copies
            taken = getattr(self.app, "changelog_taken", None)
            loop = asyncio.get_running_loop()

            def counted(n: int) -> None:
                # The metrics belong to the event loop: counted there, not in the thread.
                if taken is not None:
                    loop.call_soon_threadsafe(taken, "standby", n)

            reader = self.standby_reader = StandbyReader(conf, STANDBY_BUFFER, counted)
        return reader

    async def on_rebalance(self, assigned: set[TP], revoked: set[TP],
                           newly_assigned: set[TP], generation_id: int = 0) -> None:
        """Faust's rebalance of the tables, with the standby reader stopped before it and
        started after it on the assignment's standby partitions (standby.py)."""
        reader = self._reader()
        if reader is not None and reader.running:
            # Its last buffers written before any database is closed, opened or read.
            await asyncio.to_thread(reader.stop)
        await super().on_rebalance(assigned, revoked, newly_assigned, generation_id)
        if reader is None:
            return
        recovery = self.recovery
        assert isinstance(recovery, BatchedRecovery)
        parts: dict[tuple[str, int], StandbyPartition] = {}
        for tp in recovery.take_standbys():
            table: Any = self._changelogs.get(tp.topic)
            if table is None:
                continue
            parts[(tp.topic, tp.partition)] = StandbyPartition(
                table.data._db_for_partition(tp.partition), table.persisted_offset(tp),
                table.stale[tp.partition])
        reader.start(parts)

    async def on_stop(self) -> None:
        reader = self.standby_reader
        if reader is not None and reader.running:
            await asyncio.to_thread(reader.stop)
        await super().on_stop()
