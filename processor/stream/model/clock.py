"""Time: the local wall clock cross-checked against the brokers' (docs/time.md).

The wall clock decides two things: which ticks the leader seals (the marker through
`records.sealed_through(now)`) and which events ingest rejects as too far in the future.
Trusted alone, a fault of that one clock would publish the future (a +120 s step seals
117 ticks ahead at once) or drop the present (a -120 s step dead-letters most valid
events). So the local clock is checked against the brokers' own time, learned from the
log-append timestamps of the timeline records this process writes (the timeline topic is
created with message.timestamp.type = LogAppendTime), extrapolated with the monotonic
clock, which no wall-clock step moves. While the two disagree, each decision takes the side
that loses nothing:

- a tick is sealed only once BOTH clocks say its end plus the lateness has passed
  (`Reading.seal_ms`, the earlier of the two): a clock that runs ahead publishes
  nothing of the future; one that runs behind delays the seal (never drops anything);
- an event is too far in the future only if BOTH clocks say so (`Reading.future_ms`,
  the later of the two): a clock that runs behind rejects nothing of the present;
- a disagreement beyond `TOLERANCE_MS` is an alarm: one log line when it starts and one
  when it ends, an episode count and the estimated skew (`ClockGuard.counts`, exported as
  metrics).

Pure: no Kafka, no Faust, no sleeps. The worker's clock is a `SystemClock` (shifted only
by the test hook DPC_TEST_CLOCK_OFFSET_MS: `faults.FaultPlan.clock`); tests inject a
`ManualClock`. Only the wall clock is ever shifted: the operator and replay decide from
the timeline alone, never from a clock.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Final, Protocol

from processor.stream.model.config import Settings
from processor.stream.model.records import encode_batch, sealed_through

log = logging.getLogger("processor.stream.clock")

#: Disagreement between the local wall clock and the brokers' beyond which the clocks are
#: in alarm. NTP keeps clocks within milliseconds; the estimate of the brokers' time is
#: uncertain by one produce round trip, which is accounted separately (`Stamp`).
TOLERANCE_MS: Final = 1000
#: The record a worker appends to timeline partition 0 to learn the brokers' time: an
#: empty event batch, which changes nothing in the operator or in replay (the worker does
#: not even commit it: `app.OperatorStage.apply`).
PROBE_RECORD: Final = encode_batch([])


class Clock(Protocol):
    """A wall clock and a monotonic clock, in milliseconds."""

    def wall_ms(self) -> int:
        """Milliseconds since the epoch (may step)."""

    def mono_ms(self) -> int:
        """A monotonic clock (never steps; its origin is arbitrary)."""


class SystemClock:
    """The process's clocks; `offset_ms` shifts the wall clock (the test hook: faults.py)."""

    def __init__(self, offset_ms: int = 0) -> None:
        self.offset_ms = offset_ms

    def wall_ms(self) -> int:
        return int(time.time() * 1000) + self.offset_ms

    def mono_ms(self) -> int:
        return int(time.monotonic() * 1000)


class ManualClock:
    """A clock that moves only when told (tests): `advance` moves both clocks, as time
    passing does; `step` moves the wall clock alone, as a clock fault or a manual reset."""

    def __init__(self, wall_ms: int, mono_ms: int = 0) -> None:
        self.wall = wall_ms
        self.mono = mono_ms

    def wall_ms(self) -> int:
        return self.wall

    def mono_ms(self) -> int:
        return self.mono

    def advance(self, ms: int) -> None:
        self.wall += ms
        self.mono += ms

    def step(self, ms: int) -> None:
        self.wall += ms


@dataclass(frozen=True, slots=True)
class Stamp:
    """A broker's log-append time of one record this process wrote, and the monotonic
    times around it: the broker stamped the record after it was sent and before its
    acknowledgement arrived, so at monotonic time m the broker's clock reads between
    broker_ms + m - acked_mono_ms and broker_ms + m - sent_mono_ms."""

    broker_ms: int
    sent_mono_ms: int
    acked_mono_ms: int


@dataclass(frozen=True, slots=True)
class Reading:
    """The two clocks at one moment: the local wall clock, and the interval the brokers'
    clock lies in (None: no broker time known yet)."""

    wall_ms: int
    broker_lo_ms: int | None = None
    broker_hi_ms: int | None = None

    @property
    def seal_ms(self) -> int:
        """The time the leader seals by: the earlier clock, the brokers' taken at the
        earliest it can read (an accurate local clock is held back by one round trip at
        most: milliseconds)."""
        if self.broker_lo_ms is None:
            return self.wall_ms
        return min(self.wall_ms, self.broker_lo_ms)

    @property
    def future_ms(self) -> int:
        """The time ingest's future check uses: the later clock, the brokers' taken at the
        latest it can read."""
        if self.broker_hi_ms is None:
            return self.wall_ms
        return max(self.wall_ms, self.broker_hi_ms)

    @property
    def skew_ms(self) -> int | None:
        """The local wall clock minus the brokers' clock: 0 inside the estimate's
        uncertainty, None when no broker time is known."""
        if self.broker_lo_ms is None or self.broker_hi_ms is None:
            return None
        if self.wall_ms > self.broker_hi_ms:
            return self.wall_ms - self.broker_hi_ms
        if self.wall_ms < self.broker_lo_ms:
            return self.wall_ms - self.broker_lo_ms
        return 0


class ClockGuard:
    """The one place where the local clock meets the brokers' (shared by the leader's
    marker timer and the ingest thread of a worker; thread-safe).

    `observe` records a broker stamp (the newest one is the reference); `read` returns
    the current Reading and keeps the alarm state: an episode starts when |skew| exceeds
    the tolerance (a WARNING line) and ends when it is back within (an INFO line).
    """

    def __init__(self, clock: Clock, tolerance_ms: int = TOLERANCE_MS) -> None:
        self.clock = clock
        self.tolerance_ms = tolerance_ms
        self._lock = threading.Lock()
        self._stamp: Stamp | None = None
        self._skew: int | None = None
        self._alarm = False
        #: Episodes of disagreement beyond the tolerance so far.
        self.alarms = 0

    def mono_ms(self) -> int:
        return self.clock.mono_ms()

    @property
    def has_reference(self) -> bool:
        return self._stamp is not None

    def observe(self, stamp: Stamp) -> None:
        """A record this process wrote was stamped by a broker (log-append time)."""
        with self._lock:
            self._stamp = stamp

    def read(self) -> Reading:
        """The clocks now, with the alarm state updated (logs at its transitions)."""
        wall, mono = self.clock.wall_ms(), self.clock.mono_ms()
        with self._lock:
            s = self._stamp
            if s is None:
                return Reading(wall)
            reading = Reading(wall, s.broker_ms + mono - s.acked_mono_ms,
                              s.broker_ms + mono - s.sent_mono_ms)
            skew = reading.skew_ms
            self._skew = skew
            alarm = skew is not None and abs(skew) > self.tolerance_ms
            if alarm and not self._alarm:
                self.alarms += 1
                log.warning(
                    "clock alarm: the local wall clock is %.1f s %s the brokers' clock "
                    "(log-append time of the timeline); until they agree, ticks are sealed "
                    "by the earlier clock and events checked against the later one "
                    "(docs/time.md)", abs(skew or 0) / 1000.0,
                    "ahead of" if (skew or 0) > 0 else "behind")
            elif self._alarm and not alarm:
                log.info("clock alarm over: the local wall clock agrees with the brokers' "
                         "again (within %d ms)", self.tolerance_ms)
            self._alarm = alarm
        return reading

    def counts(self) -> dict[str, int]:
        """For the metrics: alarm episodes, and the last estimated skew in ms (absent
        while no broker time is known)."""
        out = {"clock_alarms": self.alarms}
        if self._skew is not None:
            out["clock_skew_ms"] = self._skew
        return out


def next_marker(reading: Reading, last: int, settings: Settings) -> int | None:
    """The tick the leader's next marker seals through, or None when there is nothing new
    to seal: tick n is sealed once its end plus the lateness has passed on the earlier of
    the two clocks (`records.sealed_through` at `reading.seal_ms`), and never at or below
    `last`, the last marker the timeline has."""
    n = sealed_through(reading.seal_ms, settings)
    return n if n > last else None
