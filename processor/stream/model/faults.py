"""Fault injection for tests: the one place the DPC_TEST_* environment is read.

The kill -9 tests, the clock tests and the reliability campaign
(processor/devtools/campaign.py) start real worker processes with:

- `DPC_TEST_CRASH_AT=<point>:<k>[:raise|:term]`: at the k-th call of crash point <point>
  the process kills itself with SIGKILL, so no cleanup runs, exactly like a machine
  crash; with `:raise` it raises InjectedFault there instead, the failure path a bug or a
  broker error takes; with `:term` it sends itself SIGTERM, an operator's stop request
  arriving at that point. The points are named by the stages that call the hook:
  `commit.CRASH_POINTS`, `bounding.CRASH_POINTS`, INGEST_DELIVERED and the bulk load's
  `bulk_chunk_written` (worker/bulkload.py).
- `DPC_TEST_CLOCK_OFFSET_MS=<ms>`: shifts the worker's wall clock (a clock that runs
  ahead or behind), never the process's own time (Faust, the Kafka clients). Should it
  be set in production, the brokers' clock still bounds what is sealed and the clock
  alarm fires (clock.py).

`FaultPlan.from_env()` parses them once, when a process starts; the stages receive the
plan's callables and values, never the environment. The default plan does nothing.
"""

from __future__ import annotations

import collections
import logging
import os
import signal
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from processor.stream.model.clock import SystemClock
from processor.stream.model.config import ConfigError

log = logging.getLogger("processor.stream.faults")

CRASH_ENV: Final = "DPC_TEST_CRASH_AT"
CLOCK_OFFSET_ENV: Final = "DPC_TEST_CLOCK_OFFSET_MS"
#: Every DPC_TEST_* variable this module reads.
ENV_NAMES: Final = (CRASH_ENV, CLOCK_OFFSET_ENV)
#: The crash point ingest calls once per batch, after the broker acknowledged every
#: record of it and before the input offsets are committed.
INGEST_DELIVERED: Final = "ingest_delivered"

#: A crash hook: the stages call it with the name of the point they reached.
CrashPoint = Callable[[str], None]


class InjectedFault(RuntimeError):
    """The failure DPC_TEST_CRASH_AT=<point>:<k>:raise injects (tests only). Outside the
    ProcessorError hierarchy on purpose: it stands for a bug or an unexpected library
    error, so every handler must treat it as one, never as an error raised on purpose."""


#: What a crash point does when it is hit: SIGKILL, raise InjectedFault, or SIGTERM.
CRASH_ACTIONS: Final = ("kill", "raise", "term")


@dataclass(frozen=True, slots=True)
class CrashAt:
    """Fail at the `call`-th call of crash point `point`: `action` one of CRASH_ACTIONS
    (SIGKILL, InjectedFault, SIGTERM)."""

    point: str
    call: int
    action: str = "kill"

    @classmethod
    def parse(cls, spec: str) -> CrashAt:
        """`<point>:<k>[:raise|:term]` with k >= 1; ConfigError naming DPC_TEST_CRASH_AT if
        not."""
        parts = spec.split(":")
        action = "kill"
        if len(parts) == 3 and parts[2] in CRASH_ACTIONS[1:]:
            action = parts.pop()
        if (len(parts) != 2 or not parts[0] or not parts[1].isdigit()
                or int(parts[1]) < 1):
            raise ConfigError(CRASH_ENV,
                              "must look like <point>:<k>[:raise|:term] with k >= 1")
        return cls(parts[0], int(parts[1]), action)

    def hook(self) -> CrashPoint:
        """A fresh hook (its own call counts, thread-safe: ingest calls it from its
        thread, the operator from the event loop)."""
        calls: collections.Counter[str] = collections.Counter()
        lock = threading.Lock()

        def crash_point(name: str) -> None:
            with lock:
                calls[name] += 1
                hit = name == self.point and calls[name] == self.call
            if not hit:
                return
            if self.action == "raise":
                raise InjectedFault(f"test fault at {name} (call {self.call})")
            sig = signal.SIGTERM if self.action == "term" else signal.SIGKILL
            log.warning("test crash point %s reached (call %d): %s", name, self.call,
                        sig.name)
            if sig is signal.SIGKILL:
                logging.shutdown()  # nothing runs after it: flush the line above
            os.kill(os.getpid(), sig)  # SIGTERM returns: its handler runs next

        return crash_point


def parse_clock_offset(spec: str) -> int:
    """DPC_TEST_CLOCK_OFFSET_MS's value in milliseconds; ConfigError naming it if the value
    is not an integer."""
    try:
        return int(spec)
    except ValueError:
        raise ConfigError(CLOCK_OFFSET_ENV, "must be an integer (milliseconds)") from None


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """The faults a process injects into itself; `FaultPlan()` injects none."""

    crash_at: CrashAt | None = None
    #: None: the wall clock is the system's (an explicit 0 still logs the warning).
    clock_offset_ms: int | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> FaultPlan:
        """The plan the DPC_TEST_* variables of `env` describe (unset or blank: none).
        ConfigError, naming the variable, for a malformed value."""
        crash = env.get(CRASH_ENV, "").strip()
        offset = env.get(CLOCK_OFFSET_ENV, "").strip()
        return cls(crash_at=CrashAt.parse(crash) if crash else None,
                   clock_offset_ms=parse_clock_offset(offset) if offset else None)

    def crash_point(self) -> CrashPoint | None:
        """A fresh crash hook for the stages of one process, or None without DPC_TEST_CRASH_AT
        (the stages then skip the calls)."""
        return self.crash_at.hook() if self.crash_at is not None else None

    def clock(self) -> SystemClock:
        """The process's clock, shifted by DPC_TEST_CLOCK_OFFSET_MS (a warning is logged
        when it is shifted)."""
        if self.clock_offset_ms is None:
            return SystemClock()
        log.warning("test hook %s is set: this worker's wall clock is shifted by %+d ms "
                    "(never set it in production)", CLOCK_OFFSET_ENV, self.clock_offset_ms)
        return SystemClock(self.clock_offset_ms)


#: The plan of production: no faults.
NO_FAULTS: Final = FaultPlan()
