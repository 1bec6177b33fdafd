"""The worker's own timers (processor/stream/worker/timers.py): a round every interval
after the last one returned, none once the app is stopping, and a round that returns
True stops its timer (the ready line). No broker, no wall-clock sleeps: the timer's
sleeps are recorded and return at once."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from processor.stream.model.config import Settings, with_overrides
from processor.stream.worker.timers import periodic


class FakeApp:
    """What `periodic` uses of a Faust app: `should_stop` and `task`."""

    def __init__(self) -> None:
        self.should_stop = False
        self.tasks: list[Callable[[], Coroutine[Any, Any, None]]] = []

    def task(self, fun: Callable[[], Coroutine[Any, Any, None]]
             ) -> Callable[[], Coroutine[Any, Any, None]]:
        self.tasks.append(fun)
        return fun


def run_timer(monkeypatch: pytest.MonkeyPatch, interval: float,
              round_: Callable[[], Awaitable[bool | None]]) -> tuple[FakeApp, list[Any]]:
    """Register a timer on a FakeApp and run its task to its end; returns the app and
    the timeline of sleeps ("sleep", s) and rounds ("round",)."""
    app = FakeApp()
    events: list[Any] = []

    async def fake_sleep(s: float) -> None:
        events.append(("sleep", s))

    async def recorded() -> bool | None:
        events.append(("round",))
        return await round_()

    monkeypatch.setattr(asyncio, "sleep", fake_sleep)
    periodic(app, interval, recorded, "t")  # type: ignore[arg-type]
    assert len(app.tasks) == 1 and app.tasks[0].__name__ == "t"
    asyncio.run(asyncio.wait_for(app.tasks[0](), 5))
    return app, events


def test_a_round_follows_each_interval_until_the_app_stops(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Sleep, round, sleep, round, ...: the first round one interval after the start, each
    next one an interval after the last returned; the app stopping during a sleep means
    no further round (control: the rounds before it ran)."""
    holder: dict[str, FakeApp] = {}
    rounds = 0

    async def round_() -> None:
        nonlocal rounds
        rounds += 1

    def on_sleep(_s: float) -> None:
        if rounds == 3:
            holder["app"].should_stop = True

    app = FakeApp()
    holder["app"] = app
    events: list[Any] = []

    async def fake_sleep(s: float) -> None:
        events.append(("sleep", s))
        on_sleep(s)

    async def recorded() -> None:
        events.append(("round",))
        await round_()

    monkeypatch.setattr(asyncio, "sleep", fake_sleep)
    periodic(app, 0.1, recorded)  # type: ignore[arg-type]
    asyncio.run(asyncio.wait_for(app.tasks[0](), 5))
    assert events == [("sleep", 0.1), ("round",)] * 3 + [("sleep", 0.1)]
    assert rounds == 3


def test_a_round_that_returns_true_stops_its_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The third round returns True: no fourth. Control: False and None go on."""
    answers = iter([None, False, True, None])

    async def round_() -> bool | None:
        return next(answers)

    _app, events = run_timer(monkeypatch, 0.5, round_)
    assert events == [("sleep", 0.5), ("round",)] * 3


def test_an_app_stopping_before_the_first_round_runs_none(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def round_() -> None:
        raise AssertionError("no round once the app is stopping")

    app = FakeApp()
    app.should_stop = True
    periodic(app, 1.0, round_)  # type: ignore[arg-type]
    asyncio.run(app.tasks[0]())


def test_an_interval_must_be_positive() -> None:
    async def round_() -> None:
        return None

    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError):
            periodic(FakeApp(), bad, round_)  # type: ignore[arg-type]


def test_the_marker_interval_is_a_quarter_tick_within_bounds() -> None:
    from processor.stream.worker.app import marker_interval_s

    def at(tick_ms: int) -> float:
        return marker_interval_s(with_overrides(Settings(), counters={"a": 0}, tick_ms=tick_ms))

    assert at(100) == 0.1 and at(1000) == 0.25 and at(60_000) == 0.5 and at(10) == 0.1


def test_the_ready_timer_stops_once_the_line_is_written(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """`Worker.announce_ready` (no broker: nothing connects before run()) answers False
    while the worker is not ready (control: its timer goes on), True once it wrote its
    ready line, and True again after (the timer stopped; nothing is written twice)."""
    from processor.core.rng import NoiseKey
    from processor.stream.worker.app import Worker

    s = with_overrides(Settings(), counters={"a": 0}, state_dir=str(tmp_path), metrics_port=0,
                       app_id="timers-ready")
    worker = Worker(s, NoiseKey.from_seed(1))
    ready = [(False, "no partitions"), (True, "marker age 0.1 s")]
    monkeypatch.setattr(worker.surface, "readiness", lambda: ready[0])
    lines: list[str] = []
    monkeypatch.setattr("processor.stream.worker.app.lifecycle.info",
                        lambda fmt, *a: lines.append(fmt % a))
    assert asyncio.run(worker.announce_ready()) is False and lines == []
    ready.pop(0)
    assert asyncio.run(worker.announce_ready()) is True and len(lines) == 1
    assert asyncio.run(worker.announce_ready()) is True and len(lines) == 1
