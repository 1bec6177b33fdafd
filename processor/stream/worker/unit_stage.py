"""The bounding stage on Faust (privacy_unit = "user"): a second agent of the worker, over
the units topic, with its own monotone state table and changelog, batched and
checkpointed exactly as the operator (app.Worker.operate), through the worker's producer.
The pure rules are in bounding.py; this is the shell around them.

Per units message: records Faust skipped are re-read first (GapGuard), applied in memory
(BoundCommit.apply), and acknowledged to the group only by the next checkpoint (every
checkpoint interval or checkpoint_records, at a revocation and at a clean stop): forwards
acknowledged, unit values written, changelog acknowledged, then the acks. Its kept events
are held back for `hold_s` and handed to the producer together with those of the units
messages applied meanwhile (ingest writes a units record per units partition at once:
their forwards then share timeline records, whose number the operator's cost grows
with), or sooner by a checkpoint.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

import faust

from processor.errors import RefusedError
from processor.stream.kafka import kafka_io
from processor.stream.kafka.producer import AsyncProducer
from processor.stream.kafka.topics import (
    UNITS_TABLE,
    topic_name,
    units_changelog_topic,
    units_topic,
)
from processor.stream.model.bounding import (
    UNIT_PREFIX,
    BoundCommit,
    Bounder,
    BoundOutput,
    BoundsWatch,
)
from processor.stream.model.config import Settings
from processor.stream.model.state import PARTITION_PREFIX
from processor.stream.worker.acks import GapGuard, PendingAcks
from processor.stream.worker.table import (
    ROCKSDB_OPTIONS,
    ChangelogTracker,
    MonotoneTable,
    WorkerStores,
)
from processor.stream.worker.transport import raw_topic

if TYPE_CHECKING:
    from processor.stream.worker.app import Worker

log = logging.getLogger("processor.stream.unit_stage")

#: The longest the stage holds kept events back (`hold_s`).
HOLD_MAX_S: Final = 0.05


def hold_s(settings: Settings) -> float:
    """How long kept events are held back: HOLD_MAX_S, at most a quarter of the lateness
    (as ingest's fill window: an event stamped now still reaches the timeline long before
    the marker that seals its tick)."""
    return min(HOLD_MAX_S, settings.lateness_ms / 4000.0)


class KafkaForwarder:
    """bounding.Forwarder on the worker's producer: kept events to the timeline (their
    partition by counter), bound-exceeding events to the dead-letter topic."""

    def __init__(self, producer: AsyncProducer, timeline: str, deadletter: str,
                 add_metric: Callable[[str, int], None]) -> None:
        self._producer = producer
        self._timeline = timeline
        self._deadletter = deadletter
        self._add = add_metric

    def send(self, out: BoundOutput) -> None:
        produce = self._producer.produce
        for tp, data in out.timeline:
            produce(self._timeline, data, partition=tp)
        self._producer.produce_many(self._deadletter, [(None, d) for d in out.deadletters])
        self._add("unit_forward_batches", len(out.timeline))

    async def flush(self) -> None:
        await self._producer.flush()


class UnitStage:
    """The bounding agent, its table and its checkpoints, inside one `Worker`."""

    def __init__(self, worker: Worker, crash_point: Callable[[str], None] | None) -> None:
        s = worker.settings
        self.worker = worker
        self.topic_name = units_topic(s)
        topic = raw_topic(worker.app, self.topic_name, s.partitions)
        self.table = MonotoneTable(worker.app, name=UNITS_TABLE, default=None,
                                   beacon=worker.app.tables.beacon, partitions=s.partitions,
                                   key_type=bytes, value_type=bytes,
                                   options=dict(ROCKSDB_OPTIONS))
        worker.app.tables.add(self.table)
        self.changelog = units_changelog_topic(s)
        self.tracker = ChangelogTracker()
        self.stores = WorkerStores(self.table, worker.producer, self.changelog, self.tracker,
                                   (UNIT_PREFIX, PARTITION_PREFIX))
        self.commit = BoundCommit(
            Bounder(s), self.stores,
            KafkaForwarder(worker.producer, topic_name(s, "timeline"),
                           topic_name(s, "deadletter"), worker.metrics.add),
            crash_point=crash_point, fence=worker.fence.check)
        self.watch = BoundsWatch(self.commit.bounder)
        self.gaps = GapGuard(kafka_io.base_config(s), s.app_id, self.topic_name,
                             worker.metrics)
        self._lock = asyncio.Lock()
        self._pending = PendingAcks(s)
        self._hold_s = hold_s(s)
        #: The scheduled send of the held kept events (None: none held) and its task.
        self._hold_timer: asyncio.TimerHandle | None = None
        self._hold_task: asyncio.Future[None] | None = None
        worker.app.agent(topic, name=f"{s.app_id}-bounding")(self.bound)
        worker.app.timer(interval=s.checkpoint_interval_ms() / 2000,
                         name=f"{s.app_id}-bounding-checkpoint")(self.checkpoint_timer)

    async def bound(self, stream: faust.StreamT[bytes]) -> None:
        """Each units message: applied in memory (its forwards sent within `hold_s`),
        acknowledged to the group by the next checkpoint."""
        async for event in stream.noack().events():  # type: ignore[attr-defined]
            msg = event.message
            async with self._lock:
                gap = await self.gaps.missing(msg.partition, msg.offset)
                records = [(r.offset, r.value or b"") for r in gap]
                records.append((msg.offset,
                                msg.value if isinstance(msg.value, bytes) else b""))
                try:
                    out = await self.commit.apply(msg.partition, records,
                                                  forward=self._hold_s <= 0)
                except RefusedError as exc:
                    # Restored state decided under other bounds (BoundsChangeError):
                    # held, with the lock, so that nothing is applied or acknowledged
                    # past it; the next timer round halts the worker (BoundsWatch: never
                    # at this record's time).
                    self.watch.held(exc)
                    await asyncio.Event().wait()
                except Exception as exc:
                    self.worker.operator_failed(exc)
                # Under their own names (bounding.METRICS, the dead letters' reason): the
                # surface exports them as dpc_unit_* and dpc_dead_letters{reason}.
                self.worker.metrics.add_all(out.metrics)
                self._pending.add(msg, gap)
                if self._pending.due(self.commit.dirty_since):
                    await self._checkpoint()
                elif self.commit.bounder.pending_events and self._hold_timer is None:
                    self._hold_timer = asyncio.get_running_loop().call_later(
                        self._hold_s, self._send_held_soon)

    def _send_held_soon(self) -> None:
        self._hold_task = asyncio.ensure_future(self._send_held())

    async def _send_held(self) -> None:
        async with self._lock:
            self._hold_timer = None
            try:
                self.commit.forward_held()
            except Exception as exc:
                self.worker.operator_failed(exc)

    async def checkpoint(self) -> None:
        async with self._lock:
            await self._checkpoint()

    async def checkpoint_timer(self) -> None:
        try:
            self.watch.round(self.stores.read)
        except RefusedError as exc:
            self.worker.refused(exc)
        if self._lock.locked() or not self._pending.timer_due(self.commit.dirty_since):
            return
        async with self._lock:
            await self._checkpoint()

    async def _checkpoint(self) -> None:
        try:
            await self.commit.checkpoint()
        except Exception as exc:
            self.worker.operator_failed(exc)
        self._pending.ack(self.worker.app.consumer)
        self.worker.metrics.add("unit_checkpoints")

    async def on_revoked(self) -> None:
        """Checkpoint and acknowledge, then drop every decoded value (another owner may
        write the partitions before they come back: they are read again from the table)."""
        self.watch.assigned(())
        async with self._lock:
            await self._checkpoint()
            self.commit.forget()
            self.stores.release()

    async def on_assigned(self, assigned: Any) -> None:
        mine = {tp.partition for tp in assigned if tp.topic == self.topic_name}
        self.watch.assigned(mine)
        await self.gaps.reseed(mine)

    def delivered(self, topic: str, partition: int, offset: int) -> None:
        if topic == self.changelog:
            self.tracker.delivered(partition, offset)
