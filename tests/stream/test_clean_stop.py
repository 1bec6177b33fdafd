"""A clean stop applies nothing after its last checkpoint (`stage.StageShell.close`,
`Worker.close_stages`, the app's `before_stop`).

Faust's App awaits `before_stop` first when it stops, then stops its tables (dropping
their databases) before its agents; the agent's stream still hands over the messages it
had fetched. A worker of 200,000 counters stopped by SIGTERM right after their creation
applied such a marker: the operator reopened a partition's database whose lock the
dropped handle still held ("IO error: lock hold by current process") and the clean stop
ended with exit code 1, the running flag left, so the next start rebuilt every counter
from the changelog. Here a stream calls the production hook part-way through (as the
stop's task runs between two messages) and then hands over the rest.

Every check is exact (false-alarm rate 0). Controls: the same stream without a stop
applies and acknowledges every record; with the stage's close reduced to a checkpoint
(the code before), the records after the stop are applied.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from processor.core.rng import NoiseKey
from processor.stream.model.commit import BatchCommit
from processor.stream.model.config import Settings
from processor.stream.model.operator import Operator
from processor.stream.model.outputs import CollectingSink
from processor.stream.model.state import DictStore
from processor.stream.worker.app import Worker
from processor.stream.worker.stage import StageShell
from tests.stream.agent_harness import (
    Event,
    SkippingStream,
    faust_consumer,
    next_commit,
    timeline_with_markers,
)


class _StoppedStream(SkippingStream):
    """The timeline as the agent's stream hands it over when the worker is stopped after
    `stop_after` of its messages (None: never): the app's stop hook runs, then the
    stream hands over the messages it had fetched."""

    def __init__(self, worker: Worker, consumer: Any, records: Sequence[Any],
                 offsets: Sequence[int], stop_after: int | None) -> None:
        super().__init__(consumer, records, offsets, acks=False)
        self._worker = worker
        self._stop_after = stop_after

    def noack(self) -> _StoppedStream:
        return self

    async def events(self) -> AsyncIterator[Event]:
        for i, m in enumerate(self._messages):
            if i == self._stop_after:
                hook = self._worker.app.before_stop
                assert hook is not None
                await hook()
            yield Event(m)


def _run(settings: Settings, records: list[Any], stop_after: int | None) -> tuple[Worker, Any]:
    key = NoiseKey.from_seed(5)
    worker = Worker(settings, key)
    worker.operator.commit = BatchCommit(Operator(settings, key), DictStore(),
                                         CollectingSink())
    consumer = faust_consumer(worker.app, settings.topics.timeline, committed=2)

    async def run() -> None:
        await worker.operator.gaps.reseed({0})
        stream = _StoppedStream(worker, consumer, records, list(range(2, 12)), stop_after)
        await worker.operator.agent(stream)  # type: ignore[arg-type]
        if stop_after is None:
            await worker.close_stages()

    asyncio.run(run())
    return worker, consumer


@pytest.mark.kafka
@pytest.mark.parametrize("stop_after", [0, 4, None], ids=["at-once", "after-4", "no-stop"])
def test_a_clean_stop_applies_nothing_after_its_last_checkpoint(
        kafka_bootstrap: str, tmp_path: Path, stop_after: int | None) -> None:
    """A timeline partition of 12 markers, the group committed at 2; the agent gets 2..11
    and the worker is stopped after `stop_after` of them: exactly those are applied and
    acknowledged (Faust's next commit just past them), the rest neither."""
    settings, records = timeline_with_markers(kafka_bootstrap, tmp_path)
    worker, consumer = _run(settings, records, stop_after)
    applied = 10 if stop_after is None else stop_after
    assert worker.metrics.counts["operator_markers_applied"] == applied
    assert worker.metrics.counts["checkpoints"] >= 1
    # Nothing acknowledged past the committed offset: Faust has no new commit to make.
    assert next_commit(consumer, settings.topics.timeline) == (2 + applied if applied
                                                                 else None)


@pytest.mark.kafka
def test_control_a_stop_that_only_checkpoints_goes_on_applying(
        kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Control: with `close` reduced to a checkpoint, the 6 markers handed over after the
    stop are applied as well (what failed the 200,000-counter stop)."""
    async def checkpoint_only(self: StageShell[Any, Any]) -> None:
        async with self.lock:
            await self._checkpoint()

    monkeypatch.setattr(StageShell, "close", checkpoint_only)
    settings, records = timeline_with_markers(kafka_bootstrap, tmp_path)
    worker, _ = _run(settings, records, stop_after=4)
    assert worker.metrics.counts["operator_markers_applied"] == 10
