"""The bounding stage on Faust (privacy_unit = "user"): a second agent of the worker, over
the units topic, with its own monotone state table and changelog, declared on the stage
shell (stage.py) as the operator is (app.OperatorStage), through the worker's producer.
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
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final, NoReturn

from faust.types import Message

from processor.errors import RefusedError
from processor.stream.kafka import kafka_io
from processor.stream.kafka.producer import KafkaSink
from processor.stream.kafka.topics import UNITS_TABLE, units_changelog_topic, units_topic
from processor.stream.model.bounding import UNIT_PREFIX, BoundCommit, Bounder, BoundsWatch
from processor.stream.model.config import Settings
from processor.stream.model.outputs import Output
from processor.stream.model.state import PARTITION_PREFIX
from processor.stream.worker.stage import StageShell
from processor.stream.worker.table import WorkerStores

if TYPE_CHECKING:
    from processor.stream.worker.app import Worker


#: The longest the stage holds kept events back (`hold_s`).
HOLD_MAX_S: Final = 0.05


def hold_s(settings: Settings) -> float:
    """How long kept events are held back: HOLD_MAX_S, at most a quarter of the lateness
    (as ingest's fill window: an event stamped now still reaches the timeline long before
    the marker that seals its tick)."""
    return min(HOLD_MAX_S, settings.lateness_ms / 4000.0)


class UnitStage(StageShell[BoundCommit, Output]):
    """The bounding agent, its table and its checkpoints, inside one `Worker`: a
    declaration on the stage shell (stage.py), with the hold timer and BoundsWatch."""

    checkpoint_metric = "unit_checkpoints"

    def __init__(self, worker: Worker, crash_point: Callable[[str], None] | None) -> None:
        s = worker.settings
        self._crash_point = crash_point
        self._hold_s = hold_s(s)
        #: The scheduled send of the held kept events (None: none held) and its task.
        self._hold_timer: asyncio.TimerHandle | None = None
        self._hold_task: asyncio.Future[None] | None = None
        super().__init__(worker, topic=units_topic(s), table=UNITS_TABLE,
                         changelog=units_changelog_topic(s),
                         prefixes=(UNIT_PREFIX, PARTITION_PREFIX),
                         agent=f"{s.app_id}-bounding", timer=f"{s.app_id}-bounding-checkpoint")
        self.watch = BoundsWatch(self.commit.bounder)

    def make_commit(self, stores: WorkerStores) -> BoundCommit:
        w = self.worker
        s = w.settings
        return BoundCommit(
            Bounder(s), stores,
            KafkaSink(w.producer, s, w.metrics.add, (("timeline", "unit_forward_batches"),)),
            crash_point=self._crash_point, fence=w.fence.check)

    async def apply(self, msg: Message, gap: Sequence[kafka_io.KafkaRecord],
                    records: list[tuple[int, bytes]]) -> Output:
        """Each units message: applied in memory (its forwards sent within `hold_s`)."""
        return await self.commit.apply(msg.partition, records, forward=self._hold_s <= 0)

    async def refuse(self, exc: Exception) -> NoReturn:
        # Restored state decided under other bounds (BoundsChangeError): held, with the
        # lock, so that nothing is applied or acknowledged past it; the next timer round
        # halts the worker (BoundsWatch: never at this record's time).
        assert isinstance(exc, RefusedError)  # `refusals`: RefusedError only
        self.watch.held(exc)
        while True:
            await asyncio.Event().wait()

    def fold(self, partition: int, out: Output, elapsed_s: float) -> None:
        # Under their own names (bounding.METRICS, the dead letters' reason): the surface
        # exports them as dpc_unit_* and dpc_dead_letters{reason}.
        self.worker.metrics.add_all(out.metrics)

    def after_message(self) -> None:
        if self.commit.bounder.pending_events and self._hold_timer is None:
            self._hold_timer = asyncio.get_running_loop().call_later(
                self._hold_s, self._send_held_soon)

    def _send_held_soon(self) -> None:
        self._hold_task = asyncio.ensure_future(self._send_held())

    async def _send_held(self) -> None:
        async with self.lock:
            self._hold_timer = None
            try:
                self.commit.forward_held()
            except Exception as exc:
                self.worker.operator_failed(exc)

    def before_timer(self) -> None:
        try:
            self.watch.round(self.stores.read)
        except RefusedError as exc:
            self.worker.refused(exc)

    async def write(self, full: bool) -> None:
        await self.commit.checkpoint()

    async def on_revoked(self) -> None:
        """The shell's revocation, after the watch forgets the partitions."""
        self.watch.assigned(())
        await super().on_revoked()

    def assigned(self, partitions: set[int]) -> None:
        self.watch.assigned(partitions)
