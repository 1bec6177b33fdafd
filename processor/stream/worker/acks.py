"""The worker's acknowledgements to the consumer group: what an agent applied is acked
to Faust only after the checkpoint that covers it (`PendingAcks`), and the records Faust
skipped around a rebalance are re-read and acked too (`GapGuard`, `ack_refetched`).

Works around faust-streaming 0.15.3's consumer, which around a rebalance drops messages
it fetched under the old generation or while flow control was suspended, without
seeking back, and commits a partition only up to the end of the run of acked offsets
(`Consumer._new_offset`): see `ack_refetched`. The skip is the one reported upstream as
faust-streaming/faust#216 (a rebalance resumes a partition past offsets it never
delivered), whose fix (#217) covers applications without tables; this worker, which has
tables, still meets it on 0.15.3 (tests/stream/test_gap_acks.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from faust.types import TP, ConsumerT, Message

from processor.stream.kafka import kafka_io
from processor.stream.model.config import Settings
from processor.stream.worker.metrics import WorkerMetrics

# The worker's logger: these lines were the worker's before this module existed.
log = logging.getLogger("processor.stream.app")


class GapGuard:
    """Records of one topic that Faust never handed to our agent, fetched directly.

    Around a rebalance Faust skips messages it fetched under the old consumer generation
    or while flow control was suspended; when it does not seek back, those offsets would
    never be processed, and at-least-once would lose them. The guard keeps, per
    partition, the next offset this process expects (from the group's committed offset at
    each assignment) and returns the records of any forward gap, read with a plain
    consumer, so the agent processes them first, in order, and then acks them to Faust
    (`ack_refetched`). Re-processing is always safe: the operator is idempotent per
    timeline offset.
    """

    def __init__(self, conf: Mapping[str, str], group_id: str, topic: str,
                 metrics: WorkerMetrics) -> None:
        self._conf = dict(conf)
        self._group = group_id
        self._topic = topic
        self._metrics = metrics
        self._next: dict[int, int] = {}

    @property
    def topic(self) -> str:
        return self._topic

    async def reseed(self, partitions: set[int]) -> None:
        """At a (re)assignment, before anything is fetched under it: expect each assigned
        partition from the group's committed offset as it is now, and forget the others.

        Faust seeks every assigned partition back to that offset, and it can commit only
        once every offset from there on is acked (`ack_refetched`). With the expectation
        fixed here, the first message it does deliver reveals whatever it skipped, which
        `missing` then re-reads, even on a partition this worker keeps and had applied
        further: those records are applied again (no-ops) so that Faust sees them acked.
        """
        loop = asyncio.get_running_loop()
        committed: dict[int, int] = {}
        for p in sorted(partitions):
            committed[p] = await loop.run_in_executor(
                None, kafka_io.committed_offset, self._conf, self._group, self._topic, p)
        # Replaced in one step, after every await. Where the agent got to on a partition
        # it had before does not count: its acks there died with the old assignment, and
        # a worker paused past the session timeout had it "before" while another worker
        # owned it, whose changelog writes then replaced this worker's state.
        self._next = committed

    async def missing(self, partition: int, offset: int) -> list[kafka_io.KafkaRecord]:
        loop = asyncio.get_running_loop()
        expected = self._next.get(partition)
        if expected is None:
            expected = await loop.run_in_executor(
                None, kafka_io.committed_offset, self._conf, self._group, self._topic,
                partition)
        gap: list[kafka_io.KafkaRecord] = []
        if offset > expected:
            gap = await loop.run_in_executor(
                None, kafka_io.read_range, self._conf, self._topic, partition, expected,
                offset)
            if gap:
                self._metrics.add(f"gap_records_refetched_{self._topic}", len(gap))
                # INFO, not a warning: Faust skips records around every assignment,
                # a fresh start's included, and re-reading them is this defence working
                # (nothing is lost); the metric above counts each.
                log.info("re-read %d record(s) of %s partition %d that the consumer "
                         "skipped", len(gap), self._topic, partition)
        self._next[partition] = max(expected, offset + 1)
        return gap


def ack_refetched(consumer: ConsumerT, tp: TP, offsets: Iterable[int]) -> None:
    """Ack to Faust's consumer the records of `tp` at `offsets` that GapGuard re-read and
    the agent then applied (call it only after they are applied: an acked offset may be
    committed).

    faust-streaming 0.15.3 commits a partition up to the end of the run of acked offsets
    that starts at its committed offset, and commits nothing while the smallest acked
    offset is more than one past that (`Consumer._new_offset`). The records it skips
    around a rebalance are never acked (its Cython stream iterator, the one in use,
    returns a skipped event before the ack), so without these acks the partition's commit
    stalls at the first of them until the next rebalance while the agent goes on.
    `Consumer.ack` is the call Faust's own stream makes for each event it handled; a
    `Message` carrying the consumer's own `tp` object is all it reads.
    tests/stream/test_gap_acks.py fails if that bookkeeping changes shape.
    """
    for offset in offsets:
        consumer.ack(Message(tp.topic, tp.partition, offset, 0.0, 0, None, None, None, None,
                             tp=tp))


class PendingAcks:
    """What an agent applied since its last checkpoint and acknowledges to the group only
    after the checkpoint that covers it: its messages, and the offsets of the records
    GapGuard re-read for them. Holds the one rule of when a checkpoint is due (the
    operator's agent and the bounding stage alike): `checkpoint_records` messages, or
    applied state older than the checkpoint interval, or a partition's first change
    after an assignment (`assigned`)."""

    def __init__(self, settings: Settings) -> None:
        self.max_records = settings.checkpoint_records
        self.interval_s = settings.checkpoint_interval_ms() / 1000
        self._messages: list[Message] = []
        self._gaps: dict[TP, list[int]] = {}
        # The partitions of the last assignment without a change to write since, and
        # whether one just got its first (`assigned`).
        self._unchanged: set[int] = set()
        self._first_change = False

    def assigned(self, partitions: Iterable[int], changed: Callable[[int], bool]) -> None:
        """An assignment gave the agent `partitions`: when one of them gets its first
        change for a checkpoint to write (`add`'s `changed`, the commit's: a message that
        changed nothing, as a clock probe or a marker through a tick already sealed, does
        not count), a checkpoint is due at once, not after the interval, so that a
        takeover (a standby's, a fresh worker's) is durable and acknowledged partition by
        partition as soon as each has applied its first marker (the slow one: it builds
        the partition's due wheel), none waiting for the others'. A partition that has a
        change already (`changed(p)`) makes the next message due. Any checkpoint keeps
        the protocol (commit.py); its time decides no public record."""
        given = set(partitions)
        self._unchanged = {p for p in given if not changed(p)}
        self._first_change = len(self._unchanged) < len(given)

    def __bool__(self) -> bool:
        return bool(self._messages)

    def add(self, msg: Message, gap: Sequence[kafka_io.KafkaRecord], changed: bool) -> None:
        """A message applied; `changed`: its partition now has a change to write."""
        self._messages.append(msg)
        if gap:
            self._gaps.setdefault(msg.tp, []).extend(r.offset for r in gap)
        if changed and msg.tp.partition in self._unchanged:
            self._unchanged.discard(msg.tp.partition)
            self._first_change = True

    def due(self, dirty_since: float | None) -> bool:
        """After a message: whether to checkpoint now."""
        return self._first_change or len(self._messages) >= self.max_records or (
            dirty_since is not None and time.monotonic() - dirty_since >= self.interval_s)

    def timer_due(self, dirty_since: float | None) -> bool:
        """On the checkpoint timer: something to make durable or acknowledge, and no
        applied state younger than the interval (a quiet stream)."""
        if dirty_since is None:
            return bool(self._messages)
        return time.monotonic() - dirty_since >= self.interval_s

    def ack(self, consumer: ConsumerT) -> None:
        """Acknowledge everything held (after the checkpoint that covers it)."""
        for msg in self._messages:
            consumer.ack(msg)
        for tp, offsets in self._gaps.items():
            ack_refetched(consumer, tp, offsets)
        self._messages.clear()
        self._gaps.clear()
        self._first_change = False
