"""Fencing a worker that was suspended: it must not publish or write state afterwards.

A worker process stopped for longer than the consumer group's session timeout (SIGSTOP,
a frozen VM, a swap storm) loses its partitions to another worker while it cannot
notice. When it runs again it goes on with the batch in hand, and the batches it had
fetched, until its consumer learns it was removed: it publishes from state the new owner
has moved past, and its changelog writes land after the new owner's, so the changelog's
last value of a key goes back in time. Faust's recovery then makes it worse: a worker
that gets such a partition back reads the changelog only from the offset of its own last
write, so it skips everything the other owner wrote in between (seen in the fault
campaign's phase B: counters republished ticks with lower values, events lost).

The defence is to notice the suspension and stop before anything is written. A daemon
thread beats every `interval_s` on the monotonic clock, which keeps running while the
process is stopped. `check()`, called by the commit before it publishes and before it
writes state, compares the clock with the last beat: after a suspension the gap shows
at once, even before the beat thread runs again. The thread itself also fires when it
wakes to a gap, so writes already queued before the suspension get as little time as
possible to be sent; so does a SIGCONT handler (`install_sigcont`): Python runs it in the
main thread, the event loop's, before that thread runs any other Python code, so before
the loop can hand a queued write to the socket. Either way `on_suspended` runs once; the
worker exits at once
(`Worker.fenced`): a restart is crash-safe by design, and it discards the local state
files and rebuilds them from the changelog.

`limit_s` must stay below the session timeout minus a heartbeat interval: a gap shorter
than that cannot have cost the membership. A gap longer than it that did not (the
process only starved for CPU) costs a restart, nothing else.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import Final

#: The exit code of a worker that fenced itself after a suspension (app.Worker.fenced).
FENCED_EXIT: Final = 3
#: How long a second caller waits while the first one handles the suspension.
HANDLING_WAIT_S: Final = 2.0


class SuspensionFence:
    """Raises the alarm when the process was not running for more than `limit_s`."""

    def __init__(self, limit_s: float, on_suspended: Callable[[float], None], *,
                 interval_s: float = 0.2,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not 0 < interval_s < limit_s:
            raise ValueError("the beat interval must be positive and below the limit")
        self.limit_s = limit_s
        self.interval_s = interval_s
        self._on_suspended = on_suspended
        self._clock = clock
        self._last_beat = clock()
        self._fired = False
        self._handled = threading.Event()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the beat thread (a daemon: it never keeps the process alive)."""
        if self._thread is not None:
            return
        self._last_beat = self._clock()
        self._thread = threading.Thread(target=self._run, name="suspension-fence",
                                        daemon=True)
        self._thread.start()

    def install_sigcont(self) -> None:
        """Check at SIGCONT (a stopped process continued), in the main thread; call it
        from the main thread. A stop shorter than the limit passes the check."""
        signal.signal(signal.SIGCONT, lambda _signum, _frame: self.check())

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None

    def gap(self) -> float:
        """Seconds since the last beat."""
        return self._clock() - self._last_beat

    def check(self) -> None:
        """Call `on_suspended` if the last beat is older than the limit (see the module
        docstring); does nothing otherwise."""
        gap = self.gap()
        if gap > self.limit_s:
            self._fire(gap)

    def beat(self) -> None:
        """One beat: fires first if the previous one is too old."""
        self.check()
        self._last_beat = self._clock()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.beat()

    def _fire(self, gap: float) -> None:
        with self._lock:
            first = not self._fired
            self._fired = True
        if not first:
            # The other thread is handling it (the worker: exiting). The main thread must
            # not go on to the event loop meanwhile; the timeout keeps a lock it holds
            # (a logging handler's, say) from blocking the exit for good.
            self._handled.wait(HANDLING_WAIT_S)
            return
        try:
            self._on_suspended(gap)
        finally:
            self._handled.set()
