"""Fencing after a suspension (processor/stream/worker/fencing.py, commit.BatchCommit's `fence`):
a process stopped for longer than the limit neither publishes nor writes state afterwards,
and a real SIGSTOPped process exits when it runs again. Controls: the same commit without
a fence publishes and writes, and a stop shorter than the limit leaves the process running.

The campaign's phase B (reliability/campaign.py) is where the failure was seen: a worker
SIGSTOPped past the session timeout resumed, republished ticks from its outdated state and
wrote stale values to the changelog after the new owner's."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import pytest

from processor.stream.model.commit import BatchCommit
from processor.stream.model.operator import Operator
from processor.stream.model.outputs import Output
from processor.stream.model.records import Event, encode_batch, encode_marker
from processor.stream.model.state import DictStore
from processor.stream.worker.fencing import SuspensionFence
from tests.stream.test_operator import KEY, StepFactory, settings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Fenced(Exception):
    """Stands for the worker's exit (Worker.fenced): nothing after it runs."""


def raise_fenced(gap: float) -> None:
    raise Fenced(f"{gap:.1f}")


def test_check_fires_once_after_a_gap_longer_than_the_limit() -> None:
    clock = FakeClock()
    fired: list[float] = []
    fence = SuspensionFence(5.0, fired.append, interval_s=0.2, clock=clock)
    clock.now += 4.9
    fence.check()
    assert fired == []  # control: within the limit
    fence.beat()
    clock.now += 12.0
    fence.check()
    fence.check()
    assert fired == [pytest.approx(12.0)]  # once, however often it is checked
    fence.beat()  # the beat thread waking to the same gap does not fire again
    assert len(fired) == 1


def test_a_beat_after_a_gap_fires_before_it_renews() -> None:
    clock = FakeClock()
    fired: list[float] = []
    fence = SuspensionFence(5.0, fired.append, interval_s=0.2, clock=clock)
    for _ in range(50):  # regular beats: never
        clock.now += 0.2
        fence.beat()
    assert fired == []
    clock.now += 15.0
    fence.beat()
    assert fired == [pytest.approx(15.0)]


def test_a_second_caller_waits_while_the_first_handles_it() -> None:
    """The beat thread fires first and is still exiting: the main thread's check (its
    SIGCONT handler) must not return to the event loop meanwhile. Control: once the
    handling is done, a check returns at once."""
    clock = FakeClock()
    entered, release = threading.Event(), threading.Event()

    def slow_exit(_gap: float) -> None:
        entered.set()
        release.wait(10.0)

    fence = SuspensionFence(5.0, slow_exit, interval_s=0.2, clock=clock)
    clock.now += 12.0
    first = threading.Thread(target=fence.check)
    first.start()
    assert entered.wait(10.0)
    returned = threading.Event()

    def check_then_mark() -> None:
        fence.check()
        returned.set()

    second = threading.Thread(target=check_then_mark)
    second.start()
    assert not returned.wait(0.3)  # blocked while the first one handles it
    release.set()
    first.join(10.0)
    assert returned.wait(10.0)
    second.join(10.0)
    started = time.monotonic()
    fence.check()
    assert time.monotonic() - started < 1.0


def test_interval_must_be_below_the_limit() -> None:
    with pytest.raises(ValueError):
        SuspensionFence(1.0, raise_fenced, interval_s=1.0)


class Recorder(DictStore):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def set(self, key: str, value: bytes) -> None:
        self.writes += 1
        super().set(key, value)


class SlowSink:
    """Publishes, and the clock jumps while it waits for the acks (a SIGSTOP then)."""

    def __init__(self, clock: FakeClock, jump_s: float) -> None:
        self.clock = clock
        self.jump_s = jump_s
        self.releases: list[Any] = []

    def send(self, out: Output) -> None:
        self.releases.extend(out.releases)

    async def flush(self) -> None:
        self.clock.now += self.jump_s


BATCH = [(1, encode_marker(2)), (0, encode_batch([Event("a", 0, 1)]))]


def commit(fenced: bool, jump_before: float, jump_in_publish: float
           ) -> tuple[Recorder, SlowSink, bool]:
    clock = FakeClock()
    fence = SuspensionFence(5.0, raise_fenced, interval_s=0.2, clock=clock)
    store = Recorder()
    pub = SlowSink(clock, jump_in_publish)
    s = settings({"a": 0}, heartbeat_ticks=1)
    bc = BatchCommit(Operator(s, KEY, factory=StepFactory()), store, pub,
                     fence=fence.check if fenced else None)
    clock.now += jump_before
    try:
        asyncio.run(bc.commit(0, BATCH))
    except Fenced:
        return store, pub, True
    return store, pub, False


def test_a_suspension_before_the_publish_stops_the_commit_before_anything() -> None:
    store, pub, stopped = commit(True, jump_before=12.0, jump_in_publish=0.0)
    assert stopped and pub.releases == [] and store.writes == 0
    # Control: the same commit without the fence publishes and writes.
    store, pub, stopped = commit(False, jump_before=12.0, jump_in_publish=0.0)
    assert not stopped and pub.releases and store.writes > 0


def test_a_suspension_while_awaiting_the_acks_stops_the_state_writes() -> None:
    store, pub, stopped = commit(True, jump_before=0.0, jump_in_publish=12.0)
    assert stopped and pub.releases and store.writes == 0
    store, pub, stopped = commit(False, jump_before=0.0, jump_in_publish=12.0)
    assert not stopped and store.writes > 0
    # No suspension: the fenced commit goes through.
    store, pub, stopped = commit(True, jump_before=0.0, jump_in_publish=0.1)
    assert not stopped and store.writes > 0


#: A process that prints a count every 50 ms under a fence of limit 1 s: with the beat
#: thread ("thread"), or with only the SIGCONT handler and its main loop renewing the beat
#: ("sigcont"), the two ways the worker's fence notices a suspension.
CHILD = textwrap.dedent("""
    import os, sys, time
    from processor.stream.worker.fencing import SuspensionFence
    fence = SuspensionFence(1.0, lambda gap: os._exit(3), interval_s=0.05)
    if sys.argv[1] == "thread":
        fence.start()
    else:
        fence.install_sigcont()
    n = 0
    while True:
        n += 1
        if sys.argv[1] == "sigcont":
            # Renew without checking (beat() checks first): only the handler may fire.
            fence._last_beat = time.monotonic()
        print(n, flush=True)
        time.sleep(0.05)
""")


def next_line(proc: subprocess.Popen[str]) -> int | None:
    """The next counter line the child prints (it prints every 50 ms while it runs), or
    None once it exited."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    return int(line) if line else None


@pytest.mark.parametrize("mode", ["thread", "sigcont"])
@pytest.mark.parametrize("stop_s, exits", [(2.5, True), (0.3, False)])
def test_a_sigstopped_process_exits_when_it_runs_again(mode: str, stop_s: float,
                                                       exits: bool) -> None:
    proc = subprocess.Popen([sys.executable, "-c", CHILD, mode], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": ROOT})
    try:
        assert next_line(proc) is not None  # running
        proc.send_signal(signal.SIGSTOP)
        time.sleep(stop_s)  # the fault itself (how long it is stopped), not a wait
        proc.send_signal(signal.SIGCONT)
        # Drain what it printed before the stop; then it either exits or keeps counting.
        seen_after = 0
        while seen_after < 40 and next_line(proc) is not None:
            seen_after += 1
        if exits:
            assert proc.wait(timeout=20.0) == 3
            assert seen_after < 40
        else:
            assert proc.poll() is None and seen_after == 40  # control: still running
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
