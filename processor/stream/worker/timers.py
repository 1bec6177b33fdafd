"""The worker's own periodic timers (the markers, the checkpoints, the ready line, the
garbage collector's full collections, the metrics line): `periodic`, on the app's
tasks, a plain `asyncio.sleep` between two rounds.

Faust's `App.timer` sleeps through mode's `Service.sleep`, an `asyncio.wait_for` on the
service's stopped event: each round creates a task for the event's wait, arms a timeout,
and cancels the task when the timeout fires, about five event-loop callbacks where one
sleep needs two. The marker timer of 100 ms ticks runs ten rounds a second and each
stage's checkpoint timer four; on an idle dense worker these sleeps (with the fetch
loop's, transport.py) were 14% of its event loops' callbacks (bench/README.md, "What a
marker round costs").

What a round does, and when, is what Faust's timer did: the first round one interval
after the app started its tasks, the next one interval after the previous round
returned (mode's `Timer` with an interval of at most `max_drift_correction`, 0.1 s,
sleeps exactly that; above it mode corrects a drift of at most 0.1 s, which here is
not done: a round never comes earlier than one interval after the last), no round once
the app is stopping (checked after each sleep, as mode's `itertimer` does), and the task
is cancelled with the app's other tasks at its stop. A round that returns True stops
its timer (the ready line, once written). An exception ends the timer's task and is
logged by mode as Faust's timer's would be. mode's drift and overlap lines ("Timer ...
is overlapping", a WARNING whenever a marker round took longer than its 100 ms) are
not written: the markers' own metrics and /readyz's marker age say when rounds lag.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import faust

#: A round: awaited each interval; True stops the timer.
Round = Callable[[], Awaitable[bool | None]]


def periodic(app: faust.App, interval_s: float, round_: Round, name: str = "") -> None:
    """Run `round_` every `interval_s` seconds on `app`'s tasks (see the module doc);
    `name` names its task (default: the round's)."""
    if not interval_s > 0:
        raise ValueError("a timer's interval must be positive")

    async def timer() -> None:
        sleep = asyncio.sleep
        while not app.should_stop:
            await sleep(interval_s)
            if app.should_stop:
                return
            if await round_():
                return

    timer.__qualname__ = timer.__name__ = name or getattr(round_, "__name__", "timer")
    app.task(timer)
