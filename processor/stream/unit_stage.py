"""The bounding stage on Faust (privacy_unit = "user"): a second agent of the worker, over
the units topic, with its own monotone state table and changelog, batched and
checkpointed exactly as the operator (app.Worker.operate), through the worker's producer.
The pure rules are in bounding.py; this is the shell around them.

Per units message: records Faust skipped are re-read first (GapGuard), applied in memory
(BoundCommit.apply), and acknowledged to the group only by the next checkpoint. Its kept
events are handed to the producer once no further units message is waiting in the
agent's queue (so that the forwards of the units records of one fetch share timeline
records: the operator's cost grows with their number), and at the latest by the next
checkpoint (every checkpoint interval or checkpoint_records, at a
revocation and at a clean stop): forwards acknowledged, unit values written, changelog
acknowledged, then the acks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import faust
from faust.types import ChannelT

from processor.stream import kafka_io
from processor.stream.bounding import (
    UNIT_PREFIX,
    UNITS_TABLE,
    BoundCommit,
    Bounder,
    BoundOutput,
    units_changelog_topic,
    units_topic,
)
from processor.stream.producer import AsyncProducer
from processor.stream.state import PARTITION_PREFIX
from processor.stream.table import ChangelogTracker, MonotoneTable, WorkerStores

if TYPE_CHECKING:
    from processor.stream.app import Worker

log = logging.getLogger("processor.stream.unit_stage")


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
        from processor.stream.app import ROCKSDB_OPTIONS, GapGuard, PendingAcks, raw_topic

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
            KafkaForwarder(worker.producer, kafka_io.topic_name(s, "timeline"),
                           kafka_io.topic_name(s, "deadletter"), worker.metrics.add),
            crash_point=crash_point, fence=worker.fence.check)
        self.gaps = GapGuard(kafka_io.base_config(s), s.app_id, self.topic_name,
                             worker.metrics)
        self._lock = asyncio.Lock()
        self._pending = PendingAcks(s)
        #: Whether no units message waits in the agent's queue (the stream's, once the
        #: agent runs).
        self._queue_empty: Callable[[], bool] = lambda: True
        worker.app.agent(topic, name=f"{s.app_id}-bounding")(self.bound)
        worker.app.timer(interval=s.checkpoint_interval_ms() / 2000,
                         name=f"{s.app_id}-bounding-checkpoint")(self.checkpoint_timer)

    async def bound(self, stream: faust.StreamT[bytes]) -> None:
        """Each units message: applied in memory (its forwards sent at once), acknowledged
        to the group by the next checkpoint."""
        channel = stream.channel
        if isinstance(channel, ChannelT):
            self._queue_empty = channel.empty
        async for event in stream.noack().events():  # type: ignore[attr-defined]
            msg = event.message
            async with self._lock:
                gap = await self.gaps.missing(msg.partition, msg.offset)
                records = [(r.offset, r.value or b"") for r in gap]
                records.append((msg.offset,
                                msg.value if isinstance(msg.value, bytes) else b""))
                try:
                    out = await self.commit.apply(msg.partition, records,
                                                  forward=self._queue_empty())
                except Exception as exc:
                    self.worker.operator_failed(exc)
                self.worker.metrics.add_operator(out.metrics)
                self._pending.add(msg, gap)
                if self._pending.due(self.commit.dirty_since):
                    await self._checkpoint()

    async def checkpoint(self) -> None:
        async with self._lock:
            await self._checkpoint()

    async def checkpoint_timer(self) -> None:
        if self._lock.locked():
            return
        if not self._pending.timer_due(self.commit.dirty_since):
            if self.commit.bounder.pending_events and self._queue_empty():
                # Held back for messages Faust then did not deliver (a rebalance).
                async with self._lock:
                    self._forward_held()
            return
        async with self._lock:
            await self._checkpoint()

    def _forward_held(self) -> None:
        try:
            self.commit.forward_held()
        except Exception as exc:
            self.worker.operator_failed(exc)

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
        async with self._lock:
            await self._checkpoint()
            self.commit.forget()
            self.stores.release()

    async def on_assigned(self, assigned: Any) -> None:
        await self.gaps.reseed({tp.partition for tp in assigned
                                if tp.topic == self.topic_name})

    def delivered(self, topic: str, partition: int, offset: int) -> None:
        if topic == self.changelog:
            self.tracker.delivered(partition, offset)
