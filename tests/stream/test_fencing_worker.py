"""A real worker process SIGSTOPped past the fence's limit (half the session timeout)
exits with code 3 when it runs again, with one CRITICAL line and no traceback. Control: a
stop well under the limit leaves it running and publishing. Restarting after an exit is
the crash tests' subject (test_crash.py); the fence itself is tested in test_fencing.py."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import pytest

from processor.stream.worker.fencing import FENCED_EXIT
from tests.stream.test_app_e2e import (
    Live,
    live_factory,  # noqa: F401  (the fixture, re-exported for this module)
    now_ms,
)

pytestmark = pytest.mark.kafka


def _stop_for(live: Live, seconds: float) -> None:
    proc = live.worker.proc
    assert proc is not None
    proc.send_signal(signal.SIGSTOP)
    try:
        time.sleep(seconds)  # the fault itself (how long it is stopped), not a wait
    finally:
        proc.send_signal(signal.SIGCONT)


def test_a_worker_stopped_past_the_limit_exits_and_restarts(
        live_factory: Callable[..., Live]) -> None:  # noqa: F811
    tick = 100
    live = live_factory({"a": (now_ms() // tick) * tick}, name="fence", epsilon=500.0,
                        lateness_ms=400)
    live.worker.start()
    live.wait_releases(lambda rs: len(rs) > 0, timeout_s=90)
    _stop_for(live, 0.5)  # control: well under the limit
    seen = len(live.wait_releases(lambda rs: len(rs) > 0))
    live.wait_releases(lambda rs: len(rs) > seen + 3)
    assert live.worker.alive()
    _stop_for(live, 5.8)
    code, log = live.worker.wait_exit(timeout_s=30.0, tail=400)
    assert code == FENCED_EXIT, log
    assert "long enough to lose its partitions" in log and "Traceback" not in log, log
