"""Records GapGuard re-reads are acked to Faust once applied, so that Faust's offset commit
for the partition goes on (processor/stream/worker: `acks.ack_refetched`,
`stage.StageShell.agent`).

The fault campaign's drain once waited forever: a restarted worker's Faust skipped four
timeline records without acking them, GapGuard re-read and applied them, and Faust (which
commits a partition only while its acked offsets start right at its committed offset)
never committed that partition again. These tests drive Faust's own consumer bookkeeping
(its consumer object, never started) the way its stream and `perform_seek` do, the agent
tests with GapGuard reading a real timeline topic, and fail if that bookkeeping changes
shape in a faust-streaming upgrade.

Every check is exact (false-alarm rate 0). Controls: without the acks the same flows
stall (Faust's next commit offset is None while acked records wait behind the gap).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import faust
import pytest
from faust.types import TP, Message

from processor.core.rng import NoiseKey
from processor.stream.model.commit import BatchCommit
from processor.stream.model.config import Settings
from processor.stream.model.operator import Operator
from processor.stream.model.outputs import CollectingSink
from processor.stream.model.state import DictStore
from processor.stream.worker import acks
from processor.stream.worker.acks import ack_refetched
from processor.stream.worker.app import Worker
from tests.stream.agent_harness import (
    SkippingStream,
    faust_consumer,
    message,
    next_commit,
    timeline_with_markers,
)

TOPIC = "timeline-under-test"


def test_faust_commits_past_re_read_records_only_once_they_are_acked() -> None:
    """Committed 10; Faust delivered and acked 10, 11, 16, 17 and skipped 12..15 without
    an ack. Its commit runs to 12 and then stalls. With 12..15 acked by `ack_refetched`
    it commits through 17. Control: the same flow without those acks stalls."""
    stalled = faust_consumer(faust.App(f"gap-acks-{uuid.uuid4().hex}", web_enabled=False),
                        TOPIC, committed=10)
    fixed = faust_consumer(faust.App(f"gap-acks-{uuid.uuid4().hex}", web_enabled=False),
                      TOPIC, committed=10)
    for consumer in (stalled, fixed):
        for offset in (10, 11, 16, 17):
            assert consumer.ack(message(TOPIC, offset))
    ack_refetched(fixed, TP(TOPIC, 0), range(12, 16))
    assert next_commit(fixed, TOPIC) == 18
    assert next_commit(stalled, TOPIC) == 12
    stalled._committed_offset[TP(TOPIC, 0)] = 12  # what committing 12 records
    assert next_commit(stalled, TOPIC) is None  # and so on forever


def test_ack_refetched_never_acks_below_the_committed_offset() -> None:
    """Records re-read below what the group already committed (a kept partition) change
    nothing in Faust's bookkeeping: nothing to commit, nothing past an unacked offset."""
    consumer = faust_consumer(faust.App(f"gap-acks-{uuid.uuid4().hex}", web_enabled=False),
                         TOPIC, committed=10)
    ack_refetched(consumer, TP(TOPIC, 0), range(4, 10))
    assert next_commit(consumer, TOPIC) is None


def _run_agent(settings: Settings, records: list[Any], before: Sequence[int],
               after: Sequence[int]) -> tuple[Worker, Any]:
    """The operator agent over `before` (a previous assignment: acked, then dropped from
    Faust's bookkeeping with the revocation), then, reassigned with the group at 2
    (GapGuard reseeded, Faust's committed offset 2), over `after`."""
    key = NoiseKey.from_seed(5)
    worker = Worker(settings, key)
    worker.operator.commit = BatchCommit(Operator(settings, key), DictStore(),
                                      CollectingSink())
    topic = settings.topics.timeline
    consumer = faust_consumer(worker.app, topic, committed=0)

    async def run() -> None:
        await worker.operator.gaps.reseed({0})
        await worker.operator.agent(SkippingStream(consumer, records, before))  # type: ignore[arg-type]
        await worker.operator.on_revoked()
        for bookkeeping in (consumer._acked, consumer._acked_index, consumer._gap):
            bookkeeping.pop(TP(topic, 0), None)  # what Faust's revocation does
        consumer._committed_offset[TP(topic, 0)] = 2  # and its seek at the assignment
        await worker.operator.gaps.reseed({0})
        await worker.operator.agent(SkippingStream(consumer, records, after))  # type: ignore[arg-type]
        await worker.close_stages()

    asyncio.run(run())
    return worker, consumer


@pytest.mark.kafka
@pytest.mark.parametrize("with_acks", [True, False], ids=["acked", "control"])
def test_operator_agent_acks_what_gapguard_re_read(
        kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        with_acks: bool) -> None:
    """A real timeline partition of 12 markers, the group committed at 2; Faust delivers
    2, 3 and then 8..11 (it skipped 4..7). The agent applies 4..7 from GapGuard's re-read
    and acks them: Faust's next commit covers all 12. Control: `ack_refetched` disabled,
    the commit stops at 4 and then stalls."""
    settings, records = timeline_with_markers(kafka_bootstrap, tmp_path)
    if not with_acks:
        monkeypatch.setattr(acks, "ack_refetched", lambda *a: None)
    worker, consumer = _run_agent(settings, records, before=[], after=[2, 3, 8, 9, 10, 11])
    topic = settings.topics.timeline
    assert worker.metrics.counts[f"gap_records_refetched_{topic}"] == 4
    # 2..11 applied, the re-read ones included.
    assert worker.metrics.counts["operator_markers_applied"] == 10
    if with_acks:
        assert next_commit(consumer, topic) == 12
    else:
        assert next_commit(consumer, topic) == 4
        consumer._committed_offset[TP(topic, 0)] = 4
        assert next_commit(consumer, topic) is None


@pytest.mark.kafka
def test_a_kept_partition_is_expected_from_the_committed_offset(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    """The agent applied 0..9 under one assignment, Faust committed only up to 2 before
    the rebalance dropped its acks, and after it Faust delivers 10 and 11 only (it skipped
    2..9, which this worker had applied). GapGuard expects the partition from the group's
    committed offset, so it re-reads 2..9 (applied again: no-ops) and they are acked:
    Faust commits all 12. Expecting it from where the worker got to (10) would see no
    gap, and Faust's commit would stay at 2 (the control in
    test_operator_agent_acks_what_gapguard_re_read shows that stall)."""
    settings, records = timeline_with_markers(kafka_bootstrap, tmp_path)
    worker, consumer = _run_agent(settings, records, before=list(range(10)),
                                  after=[10, 11])
    topic = settings.topics.timeline
    assert worker.metrics.counts[f"gap_records_refetched_{topic}"] == 8
    assert worker.metrics.counts["operator_markers_applied"] == 12  # re-reads: no-ops
    assert next_commit(consumer, topic) == 12


def test_pending_acks_hold_until_the_checkpoint_and_say_when_one_is_due() -> None:
    """PendingAcks, the one rule of both agents: due after checkpoint_records messages or
    once applied state is a checkpoint interval old; on the timer, due with messages held
    and no younger state; `ack` acknowledges the messages and the re-read offsets, then
    holds nothing. Controls: fewer messages and fresh state are not due."""
    import time

    from faust.types import TP, Message

    from processor.stream.kafka.kafka_io import KafkaRecord
    from processor.stream.model.config import Settings
    from processor.stream.worker.acks import PendingAcks

    class Acks:
        def __init__(self) -> None:
            self.got: list[tuple[int, int]] = []

        def ack(self, msg: Message) -> bool:
            self.got.append((msg.partition, msg.offset))
            return True

    tp = TP("tl", 1)
    pending = PendingAcks(Settings(checkpoint_records=3, checkpoint_ms=1000))
    assert not pending and not pending.timer_due(None)
    for offset in (5, 6):
        gap = ([KafkaRecord("tl", 1, o, None, b"x", (), 0) for o in (3, 4)]
               if offset == 5 else [])
        pending.add(Message("tl", 1, offset, 0.0, 0, None, None, None, None, tp=tp), gap,
                    True)
    now = time.monotonic()
    assert not pending.due(now) and not pending.due(None)  # controls
    assert pending.due(now - 1.0) and pending.timer_due(None)
    assert not pending.timer_due(now) and pending.timer_due(now - 1.0)
    pending.add(Message("tl", 1, 7, 0.0, 0, None, None, None, None, tp=tp), [], True)
    assert pending.due(None)
    consumer = Acks()
    pending.ack(consumer)  # type: ignore[arg-type]
    assert sorted(consumer.got) == [(1, o) for o in (3, 4, 5, 6, 7)]
    assert not pending and not pending.timer_due(None)


def test_pending_acks_due_at_once_at_each_partition_s_first_change_after_assigned() -> None:
    """After `assigned({0, 1})` a checkpoint is due at the first message that gives an
    assigned partition its first change to write (not after the interval), once per
    partition: after the checkpoint's `ack` the interval rules again until the other
    partition's first change. A message that changed nothing (a clock probe, a marker
    through a tick already sealed: `CheckpointLoop.changed` False) does not count, and a
    partition that had a change when the assignment came makes the next message due.
    Controls: a second change of the same partition, a partition not assigned, a message
    that changed nothing, and an assignment without partitions of the topic are not
    due."""
    import time

    from faust.types import TP, Message

    from processor.stream.model.config import Settings
    from processor.stream.worker.acks import PendingAcks

    class Acks:
        def ack(self, msg: Message) -> bool:
            return True

    def msg(partition: int, offset: int) -> Message:
        return Message("tl", partition, offset, 0.0, 0, None, None, None, None,
                       tp=TP("tl", partition))

    def nothing(_p: int) -> bool:
        return False

    pending = PendingAcks(Settings(checkpoint_records=100, checkpoint_ms=60_000))
    now = time.monotonic()
    pending.assigned({0, 1}, nothing)
    pending.add(msg(1, 1), [], False)
    assert not pending.due(now)  # control: partition 1's message changed nothing
    pending.add(msg(0, 1), [], True)
    assert pending.due(now) and pending.due(None)  # partition 0's first change
    pending.ack(Acks())  # type: ignore[arg-type]
    pending.add(msg(0, 2), [], True)
    pending.add(msg(2, 1), [], True)
    assert not pending.due(now)  # controls: partition 0 again, partition 2 not assigned
    pending.add(msg(1, 2), [], True)
    assert pending.due(now)  # partition 1's first change
    pending.ack(Acks())  # type: ignore[arg-type]
    pending.add(msg(1, 3), [], True)
    assert not pending.due(now)  # both had theirs: the interval rules
    pending.assigned(set(), nothing)
    pending.add(msg(0, 3), [], True)
    assert not pending.due(now)  # an assignment without partitions of the topic
    # Partition 0 applied a change before the assignment's handler ran: it counts.
    pending.assigned({0, 1}, lambda p: p == 0)
    pending.add(msg(1, 4), [], False)
    assert pending.due(now)


def test_an_assignment_sets_every_stage_s_expectations_before_it_awaits() -> None:
    """`Worker.on_assigned` calls each stage's `expect` (the takeover checkpoint's
    partitions, synchronous) before its first await, the ledger read: Faust's recovery
    can resume the partitions as soon as the handler yields, and a record applied before
    `expect` made the first checkpoint wait for a later record of its partition. Then
    the ledger read, then each stage's `on_assigned` with its partitions. Control: the
    order recorded is checked entry by entry."""
    from processor.stream.worker.app import Worker

    order: list[str] = []

    class Stage:
        def __init__(self, name: str, topic: str) -> None:
            self.name, self.topic = name, topic

        def expect(self, assigned: set[TP]) -> set[int]:
            order.append(f"expect {self.name}")
            return {tp.partition for tp in assigned if tp.topic == self.topic}

        async def on_assigned(self, mine: set[int]) -> None:
            order.append(f"assigned {self.name} {sorted(mine)}")

    class Shell:
        def __init__(self) -> None:
            self.stages = [Stage("operator", "tl"), Stage("bounding", "units")]

        async def _learn_ledger(self) -> None:
            order.append("ledger")
            await asyncio.sleep(0)  # yields: the agents may run from here on

    tps = {TP("tl", 0), TP("tl", 1), TP("units", 1), TP("changelog", 0)}
    asyncio.run(Worker.on_assigned(Shell(), None, tps, signal=None))  # type: ignore[arg-type]
    assert order == ["expect operator", "expect bounding", "ledger",
                     "assigned operator [0, 1]", "assigned bounding [1]"]
