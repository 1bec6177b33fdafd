"""bench/bench_operator.py counts stepped events: its dense workload leaves no event in a
queue, so the events it reports per second all went through a mechanism. Deterministic
(fixed seed, no statistics). Control: the old dense workload (5 arrivals per counter at
every tick) leaves 4 of 5 events queued, which the stepped count shows."""

from __future__ import annotations

import asyncio
import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import bench_operator  # noqa: E402

from processor.core.grid import UNIT  # noqa: E402
from processor.stream.model.config import Settings, with_overrides  # noqa: E402
from processor.stream.model.records import Event  # noqa: E402


def _settings(counters: int) -> Settings:
    return with_overrides(Settings(), counters={f"k{c:05d}": 0 for c in range(counters)},
                          partitions=1, mechanism="ecc", epsilon=1.0, delta=1e-6,
                          heartbeat_ticks=10**6)


def test_dense_steps_every_queued_event() -> None:
    s = _settings(20)
    w = bench_operator.dense(s, 20, 20, 5, random.Random(0))
    _dt, _cpu, _rel, _touched, markers, stepped, queued = asyncio.run(
        bench_operator.run_workload(w, 1024, None))
    # At most one step per counter per tick: 20 counters x 20 ticks stepped means every
    # counter stepped at every tick (its queue never ran dry) and none is left queued.
    assert markers == 20
    assert w.events == queued == stepped == 20 * 20


def test_control_arrivals_every_tick_leave_events_queued() -> None:
    s = _settings(20)
    rng = random.Random(0)
    per_tick = [[Event(f"k{c:05d}", n * bench_operator.TICK + rng.randrange(
        bench_operator.TICK), UNIT, 0, (n * 20 + c) * 5 + i)
        for c in range(20) for i in range(5)] for n in range(1, 21)]
    warm, off = bench_operator.timeline_batches(range(0, 1), None, 0)
    timed, _ = bench_operator.timeline_batches(range(1, 21), per_tick, off)
    w = bench_operator.Workload("old dense", s, warm, timed, 20 * 20 * 5)
    _dt, _cpu, _rel, _touched, _markers, stepped, queued = asyncio.run(
        bench_operator.run_workload(w, 1024, None))
    assert queued == w.events
    assert stepped == 20 * 20 < queued


def test_checkpoint_ticks_encode_once_per_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--checkpoint-ticks K`: the same events stepped and released, and each changed
    counter encoded once per checkpoint (20 ticks: 20 checkpoints with K = 1, 4 with K = 5),
    not once per step. Deterministic; the control is K = 1, which encodes every counter
    at every tick."""
    from processor.stream.model.state import CounterState

    encoded: list[int] = []
    real = CounterState.to_bytes

    def counting(self: CounterState) -> bytes:
        encoded.append(1)
        return real(self)

    monkeypatch.setattr(CounterState, "to_bytes", counting)
    got = {}
    for k in (1, 5):
        encoded.clear()
        w = bench_operator.dense(_settings(20), 20, 20, 5, random.Random(0))
        _dt, _cpu, releases, _touched, markers, stepped, queued = asyncio.run(
            bench_operator.run_workload(w, 1024, None, k))
        got[k] = (releases, markers, stepped, queued, len(encoded))
    assert got[1][:4] == got[5][:4] == (got[1][0], 20, 400, 400)
    # The warm-up's commit (the marker creating the 20 counters) encodes each once too.
    assert got[1][4] == 20 + 20 * 20
    assert got[5][4] == 20 + 20 * 4
