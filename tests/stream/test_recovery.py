"""recovery.BatchedRecovery against Faust's own Recovery: the same changelog records
(active and standby partitions, records read again, a buffer filled several times, an
active recovery that catches up), queued at once, in bursts or one by one, give the same
applied records in the same order, buffers applied when full as Faust's are, the same
active and standby offsets, the same end of recovery and standby readiness. Faust's
services run on fakes of the app, the table manager and the table."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

from faust.tables.recovery import Recovery
from faust.types import TP

from processor.stream.worker.recovery import BatchedRecovery

ACTIVE = TP("app-state-changelog", 0)
STANDBY = TP("app-state-changelog", 1)
OTHER = TP("app-state-changelog", 2)  # assigned neither way


class _Table:
    recovery_buffer_size = 2
    standby_buffer_size = 5

    def __init__(self) -> None:
        self.applied: list[list[tuple[TP, int]]] = []
        self.seen: list[tuple[TP, int]] = []

    def apply_changelog_batch(self, batch: Iterable[Any]) -> None:
        if batch:
            self.applied.append([(e.message.tp, e.message.offset) for e in batch])

    async def on_changelog_event(self, event: Any) -> None:
        self.seen.append((event.message.tp, event.message.offset))


class _Tables:
    def __init__(self) -> None:
        self.changelog_queue: asyncio.Queue[Any] = asyncio.Queue()
        self.standbys_ready = False
        self.standbys_ready_calls = 0

    def on_standbys_ready(self) -> None:
        self.standbys_ready = True
        self.standbys_ready_calls += 1


class _CountingEvent(asyncio.Event):
    """Counts its sets (the loop clears the event again at its next turn)."""

    sets = 0

    def set(self) -> None:
        self.sets += 1
        super().set()


def _event(tp: TP, offset: int) -> Any:
    return SimpleNamespace(message=SimpleNamespace(tp=tp, offset=offset))


def _recovery(cls: type[Recovery], active_offset: int, standby_offset: int,
              **app_fields: Any) -> tuple[Recovery, _Tables, _Table]:
    """A recovery loop of `cls` over one table with an active partition (highwater 6)
    and a standby one (highwater 9), at the offsets given as already taken."""
    app = SimpleNamespace(conf=SimpleNamespace(stream_recovery_delay=0.0),
                          in_transaction=False, in_recovery=False, **app_fields)
    tables = _Tables()
    table = _Table()
    rec = cls(app, tables)  # type: ignore[arg-type]
    rec.active_tps.add(ACTIVE)
    rec.standby_tps.add(STANDBY)
    rec.tp_to_table[ACTIVE] = rec.tp_to_table[STANDBY] = table  # type: ignore[assignment]
    rec.active_offsets[ACTIVE] = active_offset
    rec.standby_offsets[STANDBY] = standby_offset
    rec.active_highwaters[ACTIVE] = 6
    rec.standby_highwaters[STANDBY] = 9
    return rec, tables, table


async def _run(cls: type[Recovery], records: list[tuple[TP, int]], chunk: int
               ) -> dict[str, Any]:
    taken: dict[str, int] = {}

    def changelog_taken(copy: str, n: int) -> None:
        taken[copy] = taken.get(copy, 0) + n

    # persisted: records 0 and 1 of the active partition are in the database
    rec, tables, table = _recovery(cls, 1, -1, changelog_taken=changelog_taken)
    rec._set_recovery_started()  # as Faust's recovery does before it reads
    ends = _CountingEvent()
    rec._signal_recovery_end = ends
    # ensure_future: mode types a task body as returning any Awaitable, not a coroutine.
    loop = asyncio.ensure_future(type(rec)._slurp_changelogs.fun(rec))
    for i in range(0, len(records), chunk):  # the consumer hands them over in bursts
        for tp, offset in records[i:i + chunk]:
            tables.changelog_queue.put_nowait(_event(tp, offset))
        await asyncio.sleep(0.05)
    for _ in range(200):
        await asyncio.sleep(0.01)
        if tables.changelog_queue.empty() and tables.standbys_ready:
            break
    loop.cancel()
    await asyncio.gather(loop, return_exceptions=True)
    applied_before_stop = [list(b) for b in table.applied]
    rec.flush_buffers()
    return {
        "ended": ends.sets,
        "in_recovery": rec.in_recovery,
        "applied": [r for b in table.applied for r in b],
        "applied_before_stop": [r for b in applied_before_stop for r in b],
        "batches": [len(b) for b in applied_before_stop],
        "seen": table.seen,
        "active": dict(rec.active_offsets),
        "standby": dict(rec.standby_offsets),
        "standbys_ready_calls": tables.standbys_ready_calls,
        "taken": taken,
    }


def _records() -> list[tuple[TP, int]]:
    out: list[tuple[TP, int]] = []
    for offset in range(10):
        out.append((STANDBY, offset))
        if offset <= 6:
            out.append((ACTIVE, offset))
        if offset == 4:
            out += [(STANDBY, 2), (ACTIVE, 3)]  # read again: neither counts twice
    return out


def test_batched_recovery_takes_the_records_as_faust_does() -> None:
    """Every record past its partition's offset applied once, in order, through the
    table's apply; offsets, the end of the active recovery (buffers applied then) and
    the standbys' readiness as with Faust's loop; a record of a partition assigned
    neither way is skipped."""
    records = _records()
    faust_run = asyncio.run(_run(Recovery, records, len(records)))
    for chunk in (len(records) + 1, 5, 1):
        _same(faust_run, asyncio.run(_run(BatchedRecovery, [*records, (OTHER, 0)], chunk)),
              records)


def _same(faust_run: dict[str, Any], ours: dict[str, Any],
          records: list[tuple[TP, int]]) -> None:
    faust_run = dict(faust_run)
    # The end of the active recovery applies what the buffers hold: Faust's right after
    # the record that caught up, this loop after the batch that record came in.
    faust_before = faust_run.pop("applied_before_stop")
    before = ours.pop("applied_before_stop")
    assert before[:len(faust_before)] == faust_before
    assert ours["applied"][:len(before)] == before
    assert faust_run.pop("taken") == {}  # Faust's loop counts nothing
    faust_run["taken"] = ours["taken"]  # checked below
    faust_batches = faust_run.pop("batches")  # a buffer is applied when full, as Faust's
    assert ours.pop("batches")[:len(faust_batches)] == faust_batches
    assert ours == faust_run
    assert ours["ended"] == 1 and not ours["in_recovery"] and ours["standbys_ready_calls"] == 1
    expected = [(tp, o) for tp, o in records if o > (1 if tp == ACTIVE else -1)]
    expected = list(dict.fromkeys(expected))  # the records read again are dropped
    assert ours["applied"] == expected
    assert ours["active"] == {ACTIVE: 6} and ours["standby"] == {STANDBY: 9}
    # The records taken, counted per copy (dpc_changelog_records_read_total).
    assert ours["taken"] == {"restore": sum(tp == ACTIVE for tp, _ in expected),
                             "standby": sum(tp == STANDBY for tp, _ in expected)}


async def _after_the_end(cls: type[Recovery]) -> tuple[list[tuple[TP, int]], dict[str, Any]]:
    """Records queued after the active recovery ended (a fetch under way when Recovery
    paused the partition): one of the active partition, one of the standby."""
    rec, tables, table = _recovery(cls, 6, 3)
    rec._set_recovery_ended()
    loop = asyncio.ensure_future(type(rec)._slurp_changelogs.fun(rec))
    for event in (_event(ACTIVE, 7), _event(STANDBY, 4)):
        tables.changelog_queue.put_nowait(event)
    for _ in range(100):
        await asyncio.sleep(0.01)
        if tables.changelog_queue.empty():
            break
    await asyncio.sleep(0.05)
    loop.cancel()
    await asyncio.gather(loop, return_exceptions=True)
    rec.flush_buffers()
    return ([r for b in table.applied for r in b],
            {"active": dict(rec.active_offsets), "standby": dict(rec.standby_offsets)})


def test_an_active_record_after_the_recovery_is_left_to_the_next_restore() -> None:
    """The one difference from Faust's loop that matters (restore.recovery_takes): an
    active partition's record taken after its recovery ended is neither applied nor
    counted as seen (Faust's applies it at the next flush of its buffers); a standby's
    is taken as before."""
    faust_applied, faust_offsets = asyncio.run(_after_the_end(Recovery))
    ours_applied, ours_offsets = asyncio.run(_after_the_end(BatchedRecovery))
    assert faust_applied == [(ACTIVE, 7), (STANDBY, 4)]
    assert faust_offsets == {"active": {ACTIVE: 7}, "standby": {STANDBY: 4}}
    assert ours_applied == [(STANDBY, 4)]
    assert ours_offsets == {"active": {ACTIVE: 6}, "standby": {STANDBY: 4}}
