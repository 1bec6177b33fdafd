"""A marker that seals beyond what the clocks allow is refused with an
alarm, whoever wrote it (the check is the operator's, on the record's log-append time,
so replay makes the same decision); and a worker that is not the group's leader seals
when the leader stalls (`app.backup_due`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from processor.stream.kafka import kafka_io
from processor.stream.model.clock import TOLERANCE_MS
from processor.stream.model.operator import Operator
from processor.stream.model.records import encode_marker
from processor.stream.model.state import DictStore
from processor.stream.worker.app import backup_due
from tests.stream.helpers import apply_now
from tests.stream.test_operator import KEY, TICK, StepFactory, settings


def test_a_marker_ahead_of_its_log_append_time_is_refused() -> None:
    """Tick n may be sealed once (n + 1) * tick + lateness has passed. A marker through
    n appended at exactly that time (+ the tolerance) applies; one appended earlier
    than that minus the tolerance is refused and changes nothing. Control: the same
    refused record without a timestamp applies (tests and records read without one)."""
    s = settings({"a": 0}, heartbeat_ticks=1, lateness_ms=500)
    op = Operator(s, KEY, factory=StepFactory())
    store = DictStore()
    n = 40
    due = (n + 1) * TICK + s.lateness_ms
    out = apply_now(op, store, 0, 0, encode_marker(n), stamp_ms=due - TOLERANCE_MS - 1)
    assert out.metrics["markers_refused"] == 1 and out.releases == [] and not store.data
    out = apply_now(op, store, 0, 1, encode_marker(n), stamp_ms=due - TOLERANCE_MS)
    assert out.metrics["markers_refused"] == 0 and out.sealed_through == n
    assert len(out.releases) == n + 1
    control = Operator(s, KEY, factory=StepFactory())
    out = apply_now(control, DictStore(), 0, 0, encode_marker(n))
    assert out.sealed_through == n


def test_backup_sealing_waits_for_a_stalled_leader() -> None:
    """A non-leader appends only when every partition it holds is sealed more than
    BACKUP_SEAL_S behind what the clocks allow; never with no partition or no marker."""
    s = settings({"a": 0}, tick_ms=100)
    assert not backup_due({}, 1000, s)
    assert not backup_due({0: 990, 1: 985}, 1000, s)  # 1.5 s behind: the leader is alive
    assert backup_due({0: 990, 1: 970}, 1000, s)  # one partition 3 s behind
    assert not backup_due({0: 980}, 1000, s)  # exactly 2 s: not yet
    assert backup_due({0: 979}, 1000, s)


@pytest.mark.kafka
def test_a_forged_future_marker_is_refused_with_an_alarm_and_replay_agrees(
        deployment_factory: Callable[..., Any]) -> None:
    """Anyone with write access appends "sealed through now + 10 minutes" to every
    timeline partition while the worker runs: it is refused (an ALARM line, no release
    of a future tick), the worker publishes on, and replay (which reads the
    log-append times) finds the published stream identical. Control: without the check
    the same record would seal 3,000 ticks at once (see the pure test)."""
    from processor.stream.replay import replay

    tick = 200
    start = (int(time.time() * 1000) // tick) * tick
    dep = deployment_factory({"a": start, "b": start}, name="forged", partitions=2,
                             tick_ms=tick, lateness_ms=200, heartbeat_ticks=5, epsilon=500.0)
    dep.worker.start()
    dep.wait_releases(lambda rs: len(rs) >= 4, timeout_s=120)
    future = (int(time.time() * 1000) + 600_000) // tick
    for p in range(2):
        kafka_io.produce_all(dep.conf, dep.settings.topics.timeline,
                             [(None, encode_marker(future))], partition=p)
    seen = len(dep.releases())
    dep.wait_releases(lambda rs: len(rs) >= seen + 10, timeout_s=60)
    assert dep.worker.alive(), dep.worker.log_tail()
    now_ms = int(time.time() * 1000)
    assert max(r["tick_start_ms"] for r in dep.releases()) < now_ms + 5_000
    assert dep.worker.stop() == 0, dep.worker.log_tail()
    assert "ALARM: refused" in dep.worker.log_tail(400)
    report = replay(dep.settings, dep.key)
    assert report.identical, report.summary()


def test_a_start_far_in_the_past_is_warned_with_its_bound() -> None:
    """Counters declared 100 days back get one line with the ticks, days and the error
    bound at the present tick next to a day-old counter's; a start an hour back none.
    Control: the bound quoted is the core's (larger for the older start)."""
    from processor.core.bounds import ecc_bound
    from processor.core.cc import DEFAULT_BASE
    from processor.stream.worker.app import far_starts

    now = 1_800_000_000_000
    s = settings({"old": now - 100 * 86_400_000, "new": now - 3_600_000}, tick_ms=1000,
                 mechanism="ecc", epsilon=1.0, delta=1e-6)
    [line] = far_starts(s, now)
    assert line.startswith("counter(s) old start 8,640,000 ticks (100.0 days)"), line
    b = ecc_bound(1.0, 1e-6, s.beta, 8_640_000, DEFAULT_BASE, s.calibration)
    assert f"+/-{b:,.1f} events" in line
    assert b > ecc_bound(1.0, 1e-6, s.beta, 86_400, DEFAULT_BASE, s.calibration)
    assert far_starts(settings({"new": now - 3_600_000}, tick_ms=1000), now) == []
