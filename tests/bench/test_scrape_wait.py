"""bench/stream_counted.scrape_wait: how the throughput phase looks for the processor's end.

Each reading is a scrape of the worker's /metrics page, CPU the worker pays and no peer
does, so the bench reads as rarely as it can while still seeing the end promptly. On a
simulated clock (deterministic, no sleeps): a steady stage is read a dozen times, not
once per POLL_S near its end, and its end is seen within POLL_S; a stage whose rate jumps,
or stalls, is still read at most about once a second and never ended early. Control: the
rule before (the next reading `remaining / SCRAPE_RATE` s later) reads the same steady
stage more than 60 times, so the bound on readings does reject a bench that scrapes that
often.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import stream_counted  # noqa: E402
from stream_counted import POLL_S, SCRAPE_RATE, scrape_wait  # noqa: E402


class SimClock:
    """A clock that moves only when the code under test sleeps."""

    def __init__(self) -> None:
        self.t = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        assert s > 0
        self.sleeps.append(s)
        self.t += s


def steady(clock: SimClock, rate: float, delay: float = 0.2) -> Callable[[], float]:
    """Events stepped: none for `delay` s, then `rate` a second."""
    return lambda: max(0.0, (clock.t - delay) * rate)


def _end_time(target: float, rate: float, delay: float) -> float:
    return delay + target / rate


def test_steady_stage_is_read_a_few_times_and_its_end_seen_within_poll() -> None:
    clock = SimClock()
    n = scrape_wait(steady(clock, 2000.0), 20_000, 900, "steady", clock, clock.sleep)
    end = _end_time(20_000, 2000.0, 0.2)
    assert n <= 20, n
    assert end <= clock.t <= end + POLL_S + 1e-9, (clock.t, end)
    assert max(clock.sleeps) <= 1.0 and min(clock.sleeps) >= POLL_S


def test_control_the_fixed_rate_rule_reads_the_same_stage_far_more_often() -> None:
    clock = SimClock()
    read = steady(clock, 2000.0)
    reads = 0
    while (left := 20_000 - read()) > 0:  # the rule before: remaining / SCRAPE_RATE
        reads += 1
        clock.sleep(min(1.0, max(POLL_S, left / SCRAPE_RATE)))
    assert reads > 60, reads


@pytest.mark.parametrize("rate", [500.0, 20_000.0, 200_000.0])
def test_any_steady_rate_ends_within_poll_after_the_end(rate: float) -> None:
    clock = SimClock()
    n = scrape_wait(steady(clock, rate), 20_000, 900, "steady", clock, clock.sleep)
    end = _end_time(20_000, rate, 0.2)
    assert end <= clock.t <= end + POLL_S + 1e-9, (rate, clock.t, end)
    # About once a second over the stage, and a handful of readings at its end.
    assert n <= (end + 1) + 10, (rate, n)


def test_steps_in_bursts_and_a_stall_are_read_at_most_about_once_a_second() -> None:
    """Markers step the sparse load in bursts (400 events every 100 ms), with a 3 s stall
    (a large checkpoint) after the first 8,000: never ended early, and the stall costs a
    few readings, not one per POLL_S."""
    clock = SimClock()

    def read() -> float:
        t = clock.t
        if t < 2.0:
            return 400.0 * int(t / 0.1)
        if t < 5.0:
            return 8_000.0
        return min(20_000.0, 8_000.0 + 400.0 * int((t - 5.0) / 0.1))

    n = scrape_wait(read, 20_000, 900, "bursts", clock, clock.sleep)
    end = 5.0 + 3.0  # 12,000 more at 4,000 a second after the stall
    assert read() >= 20_000 and clock.t >= end
    assert clock.t <= end + 1.0, clock.t
    stall = [s for s, at in zip(clock.sleeps, _times(clock.sleeps), strict=True)
             if 2.0 <= at < 5.0]
    assert len(stall) <= 5, stall
    assert n <= 30, n


def _times(sleeps: list[float]) -> list[float]:
    """The clock reading at the start of each sleep."""
    out, t = [], 0.0
    for s in sleeps:
        out.append(t)
        t += s
    return out


def test_a_stage_that_never_ends_times_out_naming_it() -> None:
    clock = SimClock()
    with pytest.raises(TimeoutError, match="stuck"):
        scrape_wait(lambda: 10.0, 20_000, 30, "stuck", clock, clock.sleep)
    # Nothing grew: read every SCRAPE_AHEAD x 20,000 / SCRAPE_RATE s (well under a second).
    assert len(clock.sleeps) <= 30 / (stream_counted.SCRAPE_AHEAD * 19_990 / SCRAPE_RATE) + 2
