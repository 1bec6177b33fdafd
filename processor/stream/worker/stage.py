"""The agent shell every stage of the worker is declared through (the operator:
`app.OperatorStage`; the bounding stage: `unit_stage.UnitStage`).

A stage reads one topic with one Faust agent and keeps its state in its own monotone
table (changelogged), applied through a `commit.CheckpointLoop`. The shell does what
every stage does alike. Per message, under the stage's lock: the records Faust skipped
are re-read first (`acks.GapGuard`) and applied in the same batch; the message is
acknowledged to the group only after the checkpoint that covers it (`acks.PendingAcks`),
which runs when due after a message, on the stage's checkpoint timer, at a clean stop and
at a revocation (which then drops every decoded value). A failed apply or checkpoint
stops the worker (`Worker.operator_failed`), a refusal does what the stage says.

A stage declares what differs: its commit (`make_commit`), how it applies one batch and
folds what the batch returned (`apply`, `fold`), which errors are refusals and what a
refusal does (`refusals`, `refuse`), how a checkpoint writes (`write`), and what runs
after a message that did not checkpoint (`after_message`), before the timer's lock check
(`before_timer`), at an assignment (`assigned`) and after a revocation (`forgotten`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, NoReturn, Protocol, TypeVar

import faust
from faust.types import TP, Message

from processor.errors import RefusedError
from processor.stream.kafka import kafka_io
from processor.stream.model.restore import ChangelogTracker
from processor.stream.worker.acks import GapGuard, PendingAcks
from processor.stream.worker.table import (
    ROCKSDB_OPTIONS,
    MonotoneTable,
    WorkerStores,
)
from processor.stream.worker.timers import periodic
from processor.stream.worker.transport import raw_topic

if TYPE_CHECKING:
    from processor.stream.worker.app import Worker

# The worker's logger: these lines were the worker's before this module existed.
log = logging.getLogger("processor.stream.app")


class Commit(Protocol):
    """What the shell needs of a stage's `commit.CheckpointLoop`."""

    dirty_since: float | None

    def changed(self, partition: int) -> bool: ...

    def forget(self) -> None: ...


C = TypeVar("C", bound=Commit)
Out = TypeVar("Out")


class StageShell(ABC, Generic[C, Out]):
    """One stage's agent, table, checkpoints and acks inside one `Worker` (see the module
    doc); a subclass declares the hooks."""

    #: The metric counted at each checkpoint.
    checkpoint_metric: ClassVar[str]
    #: The errors of `apply` that are refusals (`refuse`); any other stops the worker.
    refusals: ClassVar[tuple[type[Exception], ...]] = (RefusedError,)

    def __init__(self, worker: Worker, *, topic: str, table: str, changelog: str,
                 prefixes: tuple[str, ...], agent: str, timer: str) -> None:
        s = worker.settings
        self.worker = worker
        self.topic_name = topic
        faust_topic = raw_topic(worker.app, topic, s.partitions)
        # Raw bytes: the state codecs own their (versioned) encoding. A partition's state
        # lives in the changelog partition of its input partition (table.PartitionStore).
        self.table = MonotoneTable(worker.app, name=table, default=None,
                                   beacon=worker.app.tables.beacon, partitions=s.partitions,
                                   key_type=bytes, value_type=bytes,
                                   options=dict(ROCKSDB_OPTIONS))
        worker.app.tables.add(self.table)
        self.changelog = changelog
        self.tracker = ChangelogTracker()
        self.stores = WorkerStores(self.table, worker.producer, changelog, self.tracker,
                                   prefixes)
        self.commit: C = self.make_commit(self.stores)
        self.gaps = GapGuard(kafka_io.base_config(s), s.app_id, topic, worker.metrics)
        # One applier at a time: the agent, the checkpoint timer, the revocation handler.
        self.lock = asyncio.Lock()
        # Applied since the last checkpoint, acknowledged to the group by the next one.
        self._pending = PendingAcks(s)
        # Set by the clean stop's last checkpoint (`close`): nothing is applied after it.
        self._closed = False
        worker.app.agent(faust_topic, name=agent)(self.agent)
        periodic(worker.app, s.checkpoint_interval_ms() / 2000, self.checkpoint_timer,
                 name=timer)

    # -- the hooks a stage declares

    @abstractmethod
    def make_commit(self, stores: WorkerStores) -> C:
        """The stage's commit protocol over its stores."""

    @abstractmethod
    async def apply(self, msg: Message, gap: Sequence[kafka_io.KafkaRecord],
                    records: list[tuple[int, bytes]]) -> Out | None:
        """Apply one batch (the re-read `gap`, then `msg`; `records` their offsets and
        values) in memory; None when there was nothing to apply."""

    def fold(self, partition: int, out: Out, elapsed_s: float) -> None:
        """Count what an applied batch returned (its metrics, the stage's watches)."""

    async def refuse(self, exc: Exception) -> NoReturn:
        """A refusal of `apply` (one of `refusals`): by default the worker exits (code 2)."""
        self.worker.refused(exc)

    @abstractmethod
    async def write(self, full: bool) -> None:
        """The checkpoint's write (`full`: at a clean stop or a revocation)."""

    def after_message(self) -> None:
        """After a message whose batch did not checkpoint."""

    def before_timer(self) -> None:
        """Each checkpoint timer round, before it looks at the lock."""

    def assigned(self, partitions: set[int]) -> None:
        """At an assignment: the partitions of the stage's topic this worker now holds."""

    def forgotten(self) -> None:
        """After a revocation dropped the decoded values, under the lock."""

    # -- the shell

    async def agent(self, stream: faust.StreamT[bytes]) -> None:
        """Each message: applied in memory, acknowledged to the group by the next
        checkpoint (`_checkpoint`)."""
        async for event in stream.noack().events():  # type: ignore[attr-defined]
            msg = event.message
            # No message of a revoked assignment is applied after its revocation's
            # checkpoint: Faust's stream hands over a message only while its flow is
            # active and the message is of the current generation, and nothing awaits
            # between that check and this acquire. A revocation suspends the flow before
            # `on_revoked` queues on the lock, and the lock serves in order, so a message
            # handed over earlier is applied before that checkpoint, never after it.
            async with self.lock:
                if self._closed:
                    continue  # unapplied and unacknowledged: the next start reads it
                # Records Faust skipped are applied first, in order, in the same batch:
                # their state belongs to the same partition.
                gap = await self.gaps.missing(msg.partition, msg.offset)
                records = [(r.offset, r.value or b"") for r in gap]
                records.append((msg.offset,
                                msg.value if isinstance(msg.value, bytes) else b""))
                started = time.perf_counter()
                try:
                    out = await self.apply(msg, gap, records)
                except self.refusals as exc:
                    self._refused_at(msg.partition, msg.offset)
                    await self.refuse(exc)
                except Exception as exc:
                    self.worker.operator_failed(exc)
                if out is not None:
                    self.fold(msg.partition, out, time.perf_counter() - started)
                self._pending.add(msg, gap, self.commit.changed(msg.partition))
                if self._pending.due(self.commit.dirty_since):
                    await self._checkpoint(full=False)
                else:
                    self.after_message()

    def _refused_at(self, partition: int, offset: int) -> None:
        """Where a refusal struck, for the operator who must find out why the state was
        what it was (a counter announced but missing: docs/privacy-notes.md,
        "Refusal"): the record and the restore's persisted offset of its partition."""
        persisted: object
        try:
            persisted = self.table.persisted_offset(TP(self.changelog, partition))
        except Exception as exc:  # the refusal is what matters: its context is a bonus
            persisted = f"unreadable ({type(exc).__name__})"
        log.error("refused at %s partition %d offset %d; its state partition's database "
                  "has applied changelog %s through offset %s", self.topic_name, partition,
                  offset, self.changelog, persisted)

    async def close(self) -> None:
        """The clean stop's last checkpoint; the stage applies nothing after it. Faust
        stops its tables (and lets their databases go) before its agents, and the
        agent's stream may still hold messages it fetched: applied then, one would
        reopen a database whose lock the old handle still holds, and the worker would
        fail its clean stop. A message left so is neither applied nor acknowledged: the
        next start reads it again."""
        async with self.lock:
            await self._checkpoint()
            self._closed = True

    async def checkpoint_timer(self) -> None:
        """A checkpoint when applied state has waited the checkpoint interval (a quiet
        stream)."""
        self.before_timer()
        if self.lock.locked() or not self._pending.timer_due(self.commit.dirty_since):
            return
        async with self.lock:
            await self._checkpoint(full=False)

    async def _checkpoint(self, full: bool = True) -> None:
        """Make what was applied durable (`write`), then acknowledge its records, and only
        them, to the consumer group. Called holding the lock."""
        try:
            await self.write(full)
        except Exception as exc:
            self.worker.operator_failed(exc)
        self._pending.ack(self.worker.app.consumer)
        self.worker.metrics.add(self.checkpoint_metric)

    async def on_revoked(self) -> None:
        """Checkpoint and acknowledge, then drop every decoded value: the partitions this
        worker gets back are read again from their databases, restored by Faust from the
        changelog meanwhile (table.MonotoneTable): another owner may have written them."""
        async with self.lock:
            await self._checkpoint()
            self.commit.forget()
            self.stores.release()
            self.forgotten()

    def expect(self, assigned: Iterable[Any]) -> set[int]:
        """Faust's assignment (its TPs), before anything awaits: the stage's partitions
        whose first change is checkpointed at once (PendingAcks), and the `assigned`
        hook; returns them. Synchronous, so that no record of the assignment is applied
        before it (Worker.on_assigned calls it for every stage first)."""
        mine = {tp.partition for tp in assigned if tp.topic == self.topic_name}
        self._pending.assigned(mine, self.commit.changed)
        self.assigned(mine)
        return mine

    async def on_assigned(self, mine: set[int]) -> None:
        """After `expect`: expect the stage's partitions anew from the group's committed
        offsets (GapGuard)."""
        await self.gaps.reseed(mine)

    def delivered(self, topic: str, partition: int, offset: int) -> None:
        """In the producer's thread: where this stage's changelog writes landed."""
        if topic == self.changelog:
            self.tracker.delivered(partition, offset)
