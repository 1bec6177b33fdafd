"""The test fault hooks (faults.py): the DPC_TEST_* environment parsed in one place.

Unset, the plan is inert (no crash hook, the system's clock unshifted); a crash hook
fires at exactly the k-th call of its point, by SIGKILL (in a child process here) or by
InjectedFault; the clock offset shifts the wall clock only; every malformed value is a
ConfigError naming its variable; a worker shares one hook among its stages; and no
deployment file sets any of the variables.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from processor.stream.model.config import ConfigError
from processor.stream.model.faults import (
    CLOCK_OFFSET_ENV,
    CRASH_ENV,
    ENV_NAMES,
    NO_FAULTS,
    CrashAt,
    FaultPlan,
    InjectedFault,
)


def test_the_default_plan_is_inert() -> None:
    for plan in (NO_FAULTS, FaultPlan(), FaultPlan.from_env({}),
                 FaultPlan.from_env({CRASH_ENV: " ", CLOCK_OFFSET_ENV: ""}),
                 FaultPlan.from_env({"DPC_TEST_OTHER": "x", "DPC_TICK_MS": "10"})):
        assert plan == NO_FAULTS
        assert plan.crash_point() is None
        clock = plan.clock()
        assert clock.offset_ms == 0
        assert abs(clock.wall_ms() - int(time.time() * 1000)) < 1_000
    assert ENV_NAMES == ("DPC_TEST_CRASH_AT", "DPC_TEST_CLOCK_OFFSET_MS")


def test_crash_at_parsing() -> None:
    assert FaultPlan.from_env({CRASH_ENV: "after_acks:3"}).crash_at == CrashAt("after_acks", 3)
    assert (FaultPlan.from_env({CRASH_ENV: " ingest_delivered:12:raise "}).crash_at
            == CrashAt("ingest_delivered", 12, "raise"))
    assert (FaultPlan.from_env({CRASH_ENV: "bulk_chunk_written:1:term"}).crash_at
            == CrashAt("bulk_chunk_written", 1, "term"))
    assert FaultPlan.from_env({CRASH_ENV: "after_acks:3"}) != NO_FAULTS
    for bad in ("after_acks", "after_acks:0", ":2", "after_acks:x", "after_acks:1:boom",
                "after_acks:-1", "after_acks:1:raise:raise", "a:b:c", "after_acks:1:kill",
                "after_acks:1:term:raise"):
        with pytest.raises(ConfigError, match=CRASH_ENV) as err:
            FaultPlan.from_env({CRASH_ENV: bad})
        assert err.value.field == CRASH_ENV
        assert "<point>:<k>[:raise|:term] with k >= 1" in str(err.value)


def test_the_term_hook_sends_sigterm_at_the_kth_call_of_its_point_only() -> None:
    """`:term`: a stop request at that point. The process's own SIGTERM handler runs
    (here a recording one, in place of the worker's, which raises Terminated) at the
    k-th call and at no other."""
    import signal

    hook = FaultPlan.from_env({CRASH_ENV: "bulk_chunk_written:2:term"}).crash_point()
    assert hook is not None
    got: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: got.append(signum))
    try:
        hook("bulk_chunk_written")
        hook("after_acks")
        assert got == []
        hook("bulk_chunk_written")
        assert got == [signal.SIGTERM]
        hook("bulk_chunk_written")  # once only
        assert got == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_the_raising_hook_fires_at_the_kth_call_of_its_point_only() -> None:
    plan = FaultPlan.from_env({CRASH_ENV: "after_acks:3:raise"})
    hook = plan.crash_point()
    assert hook is not None
    for name in ("after_acks", "after_state", "after_acks", "after_state", "after_state"):
        hook(name)  # the 1st and 2nd calls, and other points, do not fail
    with pytest.raises(InjectedFault, match=r"after_acks \(call 3\)"):
        hook("after_acks")
    hook("after_acks")  # once only
    # Each hook counts its own calls: a process builds one and shares it.
    fresh = plan.crash_point()
    assert fresh is not None
    fresh("after_acks")
    fresh("after_acks")


def test_the_killing_hook_sigkills_the_process() -> None:
    code = ("import sys\n"
            "from processor.stream.model.faults import FaultPlan\n"
            "hook = FaultPlan.from_env().crash_point()\n"
            "for _ in range(2):\n"
            "    hook('between_state_writes')\n"
            "    print('survived', flush=True)\n")
    env = {**os.environ, CRASH_ENV: "between_state_writes:2",
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == -signal.SIGKILL
    assert done.stdout == "survived\n"
    assert "test crash point between_state_writes reached (call 2): SIGKILL" in done.stderr


def test_the_clock_offset_hook(caplog: pytest.LogCaptureFixture) -> None:
    """DPC_TEST_CLOCK_OFFSET_MS shifts the worker's wall clock only (never the monotonic
    clock), is off unless set, warns when set, and a malformed value stops the start
    naming the variable."""
    plan = FaultPlan.from_env({CLOCK_OFFSET_ENV: "-60000"})
    assert plan.clock_offset_ms == -60_000 and plan.crash_point() is None
    with caplog.at_level("WARNING", logger="processor.stream.faults"):
        shifted = plan.clock()
    assert shifted.offset_ms == -60_000
    assert abs(shifted.wall_ms() + 60_000 - int(time.time() * 1000)) < 1_000
    assert abs(shifted.mono_ms() - int(time.monotonic() * 1000)) < 1_000
    assert f"test hook {CLOCK_OFFSET_ENV} is set" in caplog.text and "-60000 ms" in caplog.text
    for bad in ("soon", "1.5", "60s"):
        with pytest.raises(ConfigError, match=CLOCK_OFFSET_ENV) as err:
            FaultPlan.from_env({CLOCK_OFFSET_ENV: bad})
        assert err.value.field == CLOCK_OFFSET_ENV


def test_no_deployment_file_sets_a_test_hook() -> None:
    """The image, compose file, manifests and example configuration set none."""
    root = Path(__file__).resolve().parents[2] / "deploy"
    files = [p for p in root.rglob("*") if p.is_file() and p.stat().st_size < 1 << 20
             and p.suffix in (".toml", ".yaml", ".yml", ".sh", ".py", ".env", "")]
    assert len(files) > 5
    assert [p for p in files for name in ENV_NAMES
            if name in p.read_text(errors="replace")] == []


def test_the_worker_shares_one_hook_between_its_stages_and_shifts_its_clock(
        tmp_path: Path) -> None:
    """A worker builds ONE crash hook from its plan (the k-th call counts the calls of
    every stage) and its clock from the plan's offset; without a plan it has neither."""
    from processor.core.rng import NoiseKey
    from processor.stream.model.config import Settings, with_overrides
    from processor.stream.worker.app import Worker

    s = with_overrides(Settings(), counters={"a": 0}, state_dir=str(tmp_path),
                       metrics_port=0, app_id="faults-wiring")
    plan = FaultPlan(crash_at=CrashAt("after_acks", 2, "raise"),
                     clock_offset_ms=-60_000)
    worker = Worker(s, NoiseKey.from_seed(1), faults=plan)
    hook = worker.operator.commit.crash_point
    assert hook is not None and worker.ingest._crash_point is hook
    assert abs(worker.clock.clock.wall_ms() + 60_000 - int(time.time() * 1000)) < 1_000
    hook("after_acks")
    with pytest.raises(InjectedFault):
        worker.ingest._crash_point("after_acks")
    plain = Worker(with_overrides(s, app_id="faults-none"), NoiseKey.from_seed(1))
    assert plain.operator.commit.crash_point is None and plain.ingest._crash_point is None
    assert abs(plain.clock.clock.wall_ms() - int(time.time() * 1000)) < 1_000
