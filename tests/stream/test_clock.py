"""Wall-clock faults: the policy of clock.py.

Pure tests with a controllable clock (no sleeps): a simulated leader appends markers the
way `app.Worker.append_markers` does (probe, read, decide, append, learn the brokers'
log-append time from the acknowledgement), against a broker whose clock is right, while
the local wall clock jumps forward and backward; a leader change between workers whose
clocks disagree; ingest's future check under a clock that runs behind. Every run checks
that no marker ever sealed a tick whose sealing time had not passed on the broker's clock
when it was appended. Controls: the old policy (the local wall clock alone) publishes the
future after a forward jump and dead-letters the present after a backward one.

With the broker: a worker whose clock runs 60 s ahead leads, then one whose clock runs
60 s behind takes over; no marker on the timeline seals the future (checked against each
marker's own log-append time), valid events stamped with the true time are not
dead-lettered, and both workers raise the clock alarm in their logs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from processor.stream.kafka import kafka_io
from processor.stream.kafka.ingest import InputRecord, route
from processor.stream.model.clock import (
    ClockGuard,
    ManualClock,
    Reading,
    Stamp,
    next_marker,
)
from processor.stream.model.config import Settings, with_overrides
from processor.stream.model.faults import CLOCK_OFFSET_ENV
from processor.stream.model.records import TimelineMarker, decode_timeline, sealed_through

T0 = 1_800_000_000_000  # true epoch ms at the start of every simulation
S = with_overrides(Settings(), counters={"a": 0}, tick_ms=100, lateness_ms=200,
                   max_future_ms=60_000)


@dataclass
class Timeline:
    """The markers appended so far, each with the broker's (true) time of its append."""

    markers: list[tuple[int, int]] = field(default_factory=list)

    @property
    def last(self) -> int:
        return self.markers[-1][0] if self.markers else -(1 << 62)

    def future_markers(self) -> list[tuple[int, int]]:
        """Markers through a tick whose sealing time had not passed at their append."""
        return [(n, at) for n, at in self.markers if n > sealed_through(at, S)]


class Leader:
    """One worker's marker timer: `app.Worker.append_markers` without Kafka. `broker` is
    the true clock (the brokers' log-append time); `rtt` the produce round trip."""

    def __init__(self, local: ManualClock, broker: ManualClock, timeline: Timeline,
                 rtt: int = 4, cross_check: bool = True) -> None:
        self.guard = ClockGuard(local)
        self.broker = broker
        self.timeline = timeline
        self.rtt = rtt
        self.cross_check = cross_check  # False: the old policy, the wall clock alone
        self.last: int | None = None

    def _append(self) -> None:
        sent = self.guard.mono_ms()
        if self.cross_check:
            self.guard.observe(Stamp(self.broker.wall + self.rtt // 2, sent, sent + self.rtt))

    def fire(self) -> None:
        if self.last is None:  # first firing as leader: the timeline's last marker, a probe
            self.last = self.timeline.last
            if not self.guard.has_reference:
                self._append()
        n = next_marker(self.guard.read(), self.last, S)
        if n is None:
            return
        self.timeline.markers.append((n, self.broker.wall))
        self._append()
        self.last = n


def run(leader: Leader, clocks: list[ManualClock], steps: int, every: int = 50) -> None:
    """`steps` timer firings, `every` ms apart (all clocks advance together)."""
    for _ in range(steps):
        for c in clocks:
            c.advance(every)
        leader.fire()


def test_agreeing_clocks_seal_as_before() -> None:
    broker, local = ManualClock(T0, 0), ManualClock(T0, 5_000)
    tl = Timeline()
    leader = Leader(local, broker, tl)
    run(leader, [broker, local], 100)
    assert tl.markers and not tl.future_markers()
    # Each tick sealed within one firing of its sealing time: nothing held back.
    assert tl.last >= sealed_through(broker.wall, S) - 1
    assert [n for n, _ in tl.markers] == sorted({n for n, _ in tl.markers})
    assert leader.guard.alarms == 0 and leader.guard.counts()["clock_skew_ms"] == 0


def test_a_forward_jump_publishes_nothing_of_the_future(
        caplog: pytest.LogCaptureFixture) -> None:
    """+120 s on the leader's wall clock: markers keep following the brokers' clock (the
    issue's run sealed 117 ticks ahead at once); one alarm line when it starts, one when
    the clock is set right again. Control: the wall clock alone seals ~1200 ticks ahead."""
    caplog.set_level(logging.INFO, logger="processor.stream.clock")
    for cross_check in (True, False):
        broker, local = ManualClock(T0, 0), ManualClock(T0, 0)
        tl = Timeline()
        leader = Leader(local, broker, tl, cross_check=cross_check)
        run(leader, [broker, local], 20)
        local.step(120_000)
        run(leader, [broker, local], 40)
        if not cross_check:
            assert tl.last - sealed_through(broker.wall, S) >= 1190  # the reported fault
            assert len(tl.future_markers()) >= 20  # and every one after it
            continue
        assert not tl.future_markers()
        assert tl.last >= sealed_through(broker.wall, S) - 1  # the present still sealed
        assert leader.guard.alarms == 1
        assert leader.guard.counts()["clock_skew_ms"] > 119_000
        local.step(-120_000)
        run(leader, [broker, local], 10)
        assert not tl.future_markers() and leader.guard.alarms == 1
    lines = [r.getMessage() for r in caplog.records]
    assert len([m for m in lines if m.startswith("clock alarm: ")]) == 1, lines
    assert any("120.0 s ahead of the brokers' clock" in m for m in lines), lines
    assert len([m for m in lines if m.startswith("clock alarm over")]) == 1, lines


def test_a_backward_jump_is_an_alarm_not_a_flood_of_dead_letters(
        caplog: pytest.LogCaptureFixture) -> None:
    """-120 s on the wall clock: the leader seals nothing new until both clocks agree the
    time has come (a delay, never the future), raises the alarm, and ingest still accepts
    events stamped with the true time (the issue's run dead-lettered 49 of 63). Once the
    clock is set right the markers catch up with the present, not beyond. Control: the
    wall clock alone rejects them as too far in the future."""
    caplog.set_level(logging.WARNING, logger="processor.stream.clock")
    broker, local = ManualClock(T0, 0), ManualClock(T0, 0)
    tl = Timeline()
    leader = Leader(local, broker, tl)
    run(leader, [broker, local], 20)
    before = tl.last
    local.step(-120_000)
    run(leader, [broker, local], 40)
    assert tl.last == before and not tl.future_markers()
    assert leader.guard.alarms == 1 and leader.guard.counts()["clock_skew_ms"] < -119_000
    assert any("120.0 s behind the brokers' clock" in r.getMessage() for r in caplog.records)

    events = [InputRecord(0, i, orjson.dumps({"counter": "a", "ts": broker.wall + i}))
              for i in range(63)]
    ok = route(events, S, leader.guard.read().future_ms)
    assert ok.deadletters == [] and ok.metrics["ingested"] == 63
    naive = route(events, S, local.wall)  # control: the local clock alone
    assert naive.metrics["deadletter_timestamp_too_far_in_future"] == 63

    local.step(120_000)
    run(leader, [broker, local], 2)
    assert tl.last >= sealed_through(broker.wall, S) - 1 and not tl.future_markers()


def test_a_leader_change_between_disagreeing_clocks() -> None:
    """Two workers, one 90 s ahead and one 90 s behind, take turns as leader (each new
    leader reads the timeline's last marker and probes the brokers' time first): markers
    strictly increase and none seals the future; the one ahead keeps sealing, the one
    behind holds the seal (both alarmed). Control: agreeing clocks raise no alarm."""
    broker = ManualClock(T0, 0)
    ahead, behind = ManualClock(T0 + 90_000, 1_000), ManualClock(T0 - 90_000, 7_000)
    tl = Timeline()
    clocks = [broker, ahead, behind]
    workers = [Leader(ahead, broker, tl), Leader(behind, broker, tl)]
    progress = []
    for turn in range(6):
        leader = workers[turn % 2]
        leader.last = None  # leadership moved here: it starts from the timeline
        start = tl.last
        run(leader, clocks, 30)
        progress.append(tl.last - start)
    marks = [n for n, _ in tl.markers]
    assert marks == sorted(set(marks)) and not tl.future_markers()
    assert all(p > 0 for p in progress[0::2]) and all(p == 0 for p in progress[1::2])
    assert [w.guard.alarms for w in workers] == [1, 1]
    control = Leader(ManualClock(T0 + 300, 0), ManualClock(T0, 0), Timeline())
    run(control, [control.guard.clock, control.broker], 30)  # type: ignore[list-item]
    assert control.guard.alarms == 0


def test_the_estimate_of_broker_time_and_its_uncertainty() -> None:
    """A stamp taken 40 ms into a 40 ms round trip: the broker's clock lies in an interval
    of that width; a wall clock inside it (widened by the tolerance) is no alarm, and the
    seal never uses more than the interval's end. No stamp: the wall clock alone."""
    clock = ManualClock(T0, 100)
    guard = ClockGuard(clock, tolerance_ms=1000)
    assert guard.read() == Reading(T0) and guard.counts() == {"clock_alarms": 0}
    guard.observe(Stamp(T0 - 20, 60, 100))
    r = guard.read()
    assert (r.broker_lo_ms, r.broker_hi_ms, r.skew_ms) == (T0 - 20, T0 + 20, 0)
    assert r.seal_ms == T0 - 20 and r.future_ms == T0 + 20
    clock.step(1_020)
    assert guard.read().skew_ms == 1_000 and guard.alarms == 0  # at the tolerance
    clock.step(1)
    assert guard.read().skew_ms == 1_001 and guard.alarms == 1
    assert guard.read().seal_ms == T0 - 20


# --------------------------------------------------------------------------- the broker


@pytest.mark.kafka
def test_leader_change_between_workers_whose_clocks_disagree(
        deployment_factory: Callable[..., Any]) -> None:
    tick = 200
    now = int(time.time() * 1000)
    dep = deployment_factory({"a": (now // tick) * tick - 10 * tick}, name="clock",
                             partitions=1, tick_ms=tick, lateness_ms=400,
                             heartbeat_ticks=5, max_future_ms=30_000)
    ahead = dep.worker
    ahead.env[CLOCK_OFFSET_ENV] = "60000"
    behind = dep.add_worker("behind", env={**ahead.env, CLOCK_OFFSET_ENV: "-60000"})
    ahead.start()
    dep.wait_releases(lambda rs: len(rs) >= 3, timeout_s=120)
    behind.start()
    assert ahead.stop() == 0, ahead.log_tail()  # the leadership moves to `behind`
    # Valid events stamped with the true time reach the worker that runs behind.
    produced = [orjson.dumps({"counter": "a", "ts": int(time.time() * 1000) + i})
                for i in range(20)]
    dep.produce(produced)

    def ingested(recs: list[kafka_io.KafkaRecord]) -> bool:
        rows = [row for r in recs if r.value
                and not isinstance(rec := decode_timeline(r.value), TimelineMarker)
                for row in rec.events]
        return len(rows) >= len(produced)

    try:
        kafka_io.wait_for(dep.conf, dep.topics.timeline, ingested, timeout_s=90)
    except TimeoutError:
        pytest.fail("the events never reached the timeline:\n" + behind.log_tail())
    assert behind.alive(), behind.log_tail()
    assert list(kafka_io.iter_topic(dep.conf, dep.topics.deadletter)) == []
    behind_log = behind.log_tail(400)
    assert behind.stop() == 0, behind_log
    ahead_log = ahead.log_tail(400)
    assert "s ahead of the brokers' clock" in ahead_log, ahead_log
    assert "s behind the brokers' clock" in behind_log, behind_log
    # No marker sealed a tick whose sealing time had not passed on the broker's clock.
    timeline = list(kafka_io.iter_topic(dep.conf, dep.topics.timeline))
    marks = [(m.sealed_through, r.timestamp_ms) for r in timeline if r.value
             and isinstance(m := decode_timeline(r.value), TimelineMarker)]
    assert marks, "no marker appended"
    assert all(n <= sealed_through(at, dep.settings) for n, at in marks), marks
    assert [n for n, _ in marks] == sorted({n for n, _ in marks})


@dataclass
class Meta:
    """What aiokafka's RecordMetadata says of an appended record's time."""

    timestamp: int
    timestamp_type: int  # 1: the broker's log-append time, 0: the producer's create time


def test_the_leader_learns_broker_time_only_from_log_append_times(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """`app.Worker._observe` (no broker: nothing connects before run()): a create-time
    acknowledgement (a timeline topic made elsewhere without LogAppendTime) is no broker
    time: the wall clock alone decides, and the worker says so once. A log-append time
    becomes the reference."""
    from processor.core.rng import NoiseKey
    from processor.stream.worker.app import Worker

    clock = ManualClock(T0, 0)
    guard = ClockGuard(clock)
    s = with_overrides(S, state_dir=str(tmp_path), metrics_port=0, app_id="clock-unit")
    worker = Worker(s, NoiseKey.from_seed(1), clock=guard)
    caplog.set_level(logging.WARNING, logger="processor.stream.app")
    for _ in range(2):
        worker._observe([Meta(T0 + 120_000, 0)], 0)
    assert not guard.has_reference and guard.read() == Reading(T0)
    assert len([r for r in caplog.records if "create time" in r.getMessage()]) == 1
    clock.advance(10)
    worker._observe([Meta(T0 + 3, 1), Meta(T0 + 5, 1), None], 0)
    r = guard.read()
    assert (r.broker_lo_ms, r.broker_hi_ms) == (T0 + 5, T0 + 15)


def test_a_marker_round_before_the_producer_started_appends_nothing(tmp_path: Path) -> None:
    """The timer can fire while Faust still starts its producer (a start rebuilding the
    table from the changelog): that round sends nothing, raises nothing (it crashed the
    worker), and leaves the probe and the last marker for the next round. Control: the
    producer of a worker that was never run really refuses to send (NotReady)."""
    from faust.exceptions import NotReady

    from processor.core.rng import NoiseKey
    from processor.stream.model.clock import next_marker
    from processor.stream.worker.app import Worker

    clock = ManualClock(T0, 0)
    guard = ClockGuard(clock)
    s = with_overrides(S, state_dir=str(tmp_path), metrics_port=0, app_id="clock-notready")
    worker = Worker(s, NoiseKey.from_seed(1), clock=guard)
    worker._last_marker = 0
    assert next_marker(guard.read(), 0, s) is not None  # a marker is due this round
    with pytest.raises(NotReady):
        asyncio.run(worker.app.producer.send(worker.timeline_name, None, b"x", 0, None, None))
    asyncio.run(worker.append_markers())  # the probe round
    assert not worker._probed
    worker._probed = True
    asyncio.run(worker.append_markers())  # the marker round
    assert worker._last_marker == 0 and worker.metrics.counts["markers_appended"] == 0
