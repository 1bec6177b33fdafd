"""The ingest stage's fill window (pure): while records keep coming, one batch fills up to
FILL_PER_PARTITION events per timeline partition, for at most its window (never more than
a quarter of the lateness, never less than one poll); a poll that brings nothing ends the
batch at once. The consumer here is a script of poll results on a fake clock, so the
window is checked exactly, without waiting."""

from __future__ import annotations

import time
from typing import Any

import pytest

from processor.stream.kafka.ingest import FILL_MAX_S, FILL_PER_PARTITION, Ingest, fill_window_s
from processor.stream.model.config import Settings, with_overrides

POLL_S = 0.2
BASE = with_overrides(Settings(), counters={"a": 0}, tick_ms=100)


class _ScriptedConsumer:
    """consume() returns the next scripted batch (its length, capped by num_messages) and
    advances the fake clock by `cost_s` per call."""

    def __init__(self, sizes: list[int], clock: list[float], cost_s: float) -> None:
        self.sizes = list(sizes)
        self.clock = clock
        self.cost_s = cost_s
        self.calls = 0

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        assert timeout > 0
        self.calls += 1
        self.clock[0] += self.cost_s
        n = min(self.sizes.pop(0), num_messages) if self.sizes else 0
        return [object()] * n


def _ingest(monkeypatch: pytest.MonkeyPatch, clock: list[float], **kw: Any) -> Ingest:
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    settings = with_overrides(BASE, **{"partitions": 2, "lateness_ms": 10_000, **kw})
    return Ingest(settings, poll_s=POLL_S)


def test_the_window_is_a_quarter_of_the_lateness_within_one_poll_and_its_maximum() -> None:
    s = BASE
    assert fill_window_s(with_overrides(s, lateness_ms=400), POLL_S) == POLL_S
    assert fill_window_s(with_overrides(s, lateness_ms=1_200), POLL_S) == pytest.approx(0.3)
    assert fill_window_s(with_overrides(s, lateness_ms=60_000), POLL_S) == FILL_MAX_S


def test_a_steady_flow_fills_the_batch_to_its_target(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    consumer = _ScriptedConsumer([30] * 20, clock, cost_s=0.01)
    got = _ingest(monkeypatch, clock)._consume(consumer)  # type: ignore[arg-type]
    assert len(got) == 2 * FILL_PER_PARTITION  # the target, not one poll's 30
    # Control: a window of one poll (lateness 0.8 s) takes what the first poll brought.
    clock[0] = 0.0
    consumer = _ScriptedConsumer([30] * 20, clock, cost_s=POLL_S)
    got = _ingest(monkeypatch, clock, lateness_ms=800)._consume(consumer)  # type: ignore[arg-type]
    assert len(got) == 30 and consumer.calls == 1


def test_an_empty_poll_ends_the_batch_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    consumer = _ScriptedConsumer([30, 0, 30, 30], clock, cost_s=0.01)
    got = _ingest(monkeypatch, clock)._consume(consumer)  # type: ignore[arg-type]
    assert len(got) == 30 and consumer.calls == 2


def test_a_slow_trickle_stops_at_the_end_of_the_window(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    consumer = _ScriptedConsumer([1] * 100, clock, cost_s=0.1)
    got = _ingest(monkeypatch, clock)._consume(consumer)  # type: ignore[arg-type]
    assert consumer.calls == 5 and len(got) == 5  # 0.5 s of 0.1 s polls
    assert clock[0] <= FILL_MAX_S + 1e-9
